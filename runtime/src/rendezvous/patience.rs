//! How long the ranks of a forming world wait for each other: until nobody new has arrived for
//! the timeout (`HCCN_TIMEOUT_MS`), counted from the last arrival, not from a rank's own start.
//! A large job whose processes are started slowly (1,024 ranks on one host take longer than
//! 30 s to start) still meets, while a job where a rank never comes fails one timeout after the
//! last rank that did.
//!
//! Each rank counts itself in under the world's arrivals key when it publishes its address;
//! a waiting rank blocks in the store on the key it waits for (the store wakes it when the key
//! appears: no polling), in slices, and between slices reads the count: a larger count is an
//! arrival and restarts its clock. The clock is this rank's own, so hosts need not agree on the
//! time. The decision is [`deadline`], a pure function tested with a simulated clock.

use std::time::{Duration, Instant};

use super::Store;
use crate::error::{ErrorKind, Result};

/// What a waiting rank does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Wait (in the store) at most this long, then look at the arrivals again.
    Wait(Duration),
    /// Nobody arrived for the timeout: the world will not meet.
    GiveUp,
}

/// The longest a waiting rank blocks between looks at the arrivals: an eighth of the timeout,
/// within 50 ms and 2 s (a rank gives up at most this late, and 1,024 waiting ranks ask the
/// store about twice a second each at most).
pub(crate) fn slice(timeout: Duration) -> Duration {
    (timeout / 8).clamp(Duration::from_millis(50), Duration::from_secs(2))
}

/// The decision: at `now`, with the set of ranks last seen growing at `last_growth`, wait (at
/// most a [`slice`], never past `last_growth + timeout`) or give up.
pub(crate) fn deadline(now: Instant, last_growth: Instant, timeout: Duration) -> Next {
    let end = last_growth.checked_add(timeout);
    match end.map(|end| end.saturating_duration_since(now)) {
        Some(left) if left.is_zero() => Next::GiveUp,
        Some(left) => Next::Wait(left.min(slice(timeout))),
        None => Next::Wait(slice(timeout)),
    }
}

/// One rank's view of the arrivals: the largest count seen and when it was first seen.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Patience {
    timeout: Duration,
    last_growth: Instant,
    seen: i64,
}

impl Patience {
    /// Starts waiting at `now` (this rank's own arrival) with `arrived` ranks counted in.
    pub fn new(now: Instant, timeout: Duration, arrived: i64) -> Patience {
        Patience { timeout, last_growth: now, seen: arrived }
    }

    /// Notes the count read at `now`: more than seen before restarts the clock.
    pub fn saw(&mut self, now: Instant, arrived: i64) {
        if arrived > self.seen {
            self.seen = arrived;
            self.last_growth = now;
        }
    }

    /// Notes progress of another kind (a peer connected) at `now`: restarts the clock.
    pub fn grew(&mut self, now: Instant) {
        self.last_growth = self.last_growth.max(now);
    }

    pub fn next(&self, now: Instant) -> Next {
        deadline(now, self.last_growth, self.timeout)
    }
}

/// The store key under which the ranks of the world at `prefix` count themselves in.
pub(crate) fn arrivals_key(prefix: &str) -> String {
    format!("{prefix}/arrived")
}

/// The counter at `key`, read without writing (an `add` of 0 would write on etcd, and wake
/// every waiting request in the embedded store): both stores keep counters as 8 bytes, little
/// endian; another store's value is read through `add`.
fn count(store: &dyn Store, key: &str) -> Result<i64> {
    match store.get(key, Duration::ZERO) {
        Ok(v) => match <[u8; 8]>::try_from(v.as_slice()) {
            Ok(b) => Ok(i64::from_le_bytes(b)),
            Err(_) => store.add(key, 0),
        },
        Err(e) if e.kind() == ErrorKind::Timeout => Ok(0),
        Err(e) => Err(e),
    }
}

/// A rank's waits for keys of its forming world, sharing one clock: the world at `prefix`
/// stops waiting once nobody arrived for `timeout`.
pub(crate) struct Arrivals<'a> {
    store: &'a dyn Store,
    key: String,
    patience: Patience,
}

impl<'a> Arrivals<'a> {
    /// Starts the clock now (call it after counting this rank in).
    pub fn watch(store: &'a dyn Store, prefix: &str, timeout: Duration) -> Result<Arrivals<'a>> {
        let key = arrivals_key(prefix);
        let patience = Patience::new(Instant::now(), timeout, count(store, &key)?);
        Ok(Arrivals { store, key, patience })
    }

    /// Counts this rank in (once, after publishing its address).
    pub fn count_in(store: &dyn Store, prefix: &str) -> Result<()> {
        store.add(&arrivals_key(prefix), 1).map(drop)
    }

    /// The value of `key`, waited for while ranks keep arriving; `None` once nobody arrived
    /// for the timeout.
    pub fn get(&mut self, key: &str) -> Result<Option<Vec<u8>>> {
        loop {
            let wait = match self.patience.next(Instant::now()) {
                Next::GiveUp => return Ok(None),
                Next::Wait(d) => d,
            };
            match self.store.get(key, wait) {
                Ok(v) => return Ok(Some(v)),
                Err(e) if e.kind() == ErrorKind::Timeout => {}
                Err(e) => return Err(e),
            }
            let arrived = count(self.store, &self.key)?;
            self.patience.saw(Instant::now(), arrived);
        }
    }

    pub fn store(&self) -> &'a dyn Store {
        self.store
    }

    /// What to do now, without asking the store (between retries of something else).
    pub fn next(&self) -> Next {
        self.patience.next(Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn a_rank_waits_while_ranks_keep_arriving_past_its_own_timeout() {
        let t0 = Instant::now();
        let timeout = 2 * S;
        let mut p = Patience::new(t0, timeout, 1);
        // One rank arrives every second for 10 s: five timeouts after this rank's start.
        for k in 1..=10u32 {
            let now = t0 + k * S;
            p.saw(now, 1 + i64::from(k));
            assert!(matches!(p.next(now), Next::Wait(_)), "gave up at {k} s although ranks keep arriving");
            assert!(matches!(p.next(now + S + S / 2), Next::Wait(_)));
        }
        // Then nobody: it gives up exactly one timeout after the last arrival.
        let last = t0 + 10 * S;
        assert_eq!(p.next(last + timeout - Duration::from_millis(1)), Next::Wait(Duration::from_millis(1)));
        assert_eq!(p.next(last + timeout), Next::GiveUp);
    }

    #[test]
    fn a_rank_alone_gives_up_one_timeout_after_its_own_arrival() {
        let t0 = Instant::now();
        let mut p = Patience::new(t0, 3 * S, 5);
        // The same count, or a smaller one (a store that was reset), is no arrival.
        p.saw(t0 + S, 5);
        p.saw(t0 + 2 * S, 4);
        assert!(matches!(p.next(t0 + 2 * S), Next::Wait(_)));
        assert_eq!(p.next(t0 + 3 * S), Next::GiveUp);
    }

    #[test]
    fn waits_come_in_slices_that_never_pass_the_deadline() {
        let t0 = Instant::now();
        let timeout = 30 * S;
        assert_eq!(deadline(t0, t0, timeout), Next::Wait(2 * S), "a slice is at most 2 s");
        assert_eq!(deadline(t0 + 29 * S, t0, timeout), Next::Wait(S), "the last wait ends at the deadline");
        assert_eq!(deadline(t0, t0, Duration::from_millis(200)), Next::Wait(Duration::from_millis(50)));
        assert_eq!(deadline(t0, t0, Duration::from_millis(2000)), Next::Wait(Duration::from_millis(250)));
        // A clock that reads earlier than the last growth (another thread's reading) waits.
        assert_eq!(deadline(t0, t0 + S, 2 * S), Next::Wait(Duration::from_millis(250)));
    }

    #[test]
    fn other_progress_restarts_the_clock_but_never_moves_it_back() {
        let t0 = Instant::now();
        let mut p = Patience::new(t0, 2 * S, 1);
        p.grew(t0 + 3 * S / 2);
        assert!(matches!(p.next(t0 + 3 * S), Next::Wait(_)));
        p.grew(t0);
        assert_eq!(p.next(t0 + 7 * S / 2), Next::GiveUp);
    }
}
