//! How every waiter of the transport waits (shared-memory rings, the board, TCP readers
//! standing aside): spin, then yield, then sleep on a futex in shared memory, woken by the other
//! side or after a nap to look at health again. One policy for all.
//!
//! The policy follows what the waits meet. Spinning pays while the rank waited for is running:
//! its write lands within the spin. On a host busy with other work it is not (it waits for a
//! core), the spin runs out, the waiter sleeps, and its wake-up outlasts the other side's spin in
//! turn: two ranks of a loop of small collectives keep putting each other to sleep, 30-60 µs a
//! call instead of a few (the "slow mode" of bindings/python/csrc/README.md), and the spin itself
//! holds a core that the awaited rank, or the framework's compute, needs. So each process
//! remembers whether its recent waits for small collectives' rounds (the board's) outlasted the
//! spin ([`Outlasted`]); while some did, those waiters yield instead of spinning (which runs
//! whoever else wants the core, and keeps the waiter runnable, so it sees the write without a
//! wake-up). Every 16th of those waits spins all the same, and one that ends within the spin
//! clears the record: the host is quiet again, and there a yield costs more than the spin it
//! replaces.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a futex sleep lasts before the sleeper looks at health and the inbox again.
pub(crate) const NAP: Duration = Duration::from_millis(1);
/// How long a waiter spins before it yields, when every local rank has a core.
const SPIN: Duration = Duration::from_micros(20);
/// How often a waiter yields before it sleeps, when the host's ranks outnumber its cores.
const OVERSUBSCRIBED_YIELDS: u32 = 100;
/// How often, and for how long at most, a waiter yields before it sleeps where spinning has been
/// failing (see the module comment). A wait longer than that is for a rank that is not close
/// (still computing, say), and a waiter that stays runnable takes turns from the compute on its
/// core at every scheduler tick: it sleeps.
const CONTENDED_YIELDS: u32 = 100;
const CONTENDED_YIELD_FOR: Duration = Duration::from_micros(500);

/// Whether this process's recent waits outlasted the spin: one bit per wait, the newest lowest,
/// over the last [`OUTLASTED_WINDOW`] waits. Shared by the process's waiters, updated without a
/// lock (an update lost to a race only delays the switch by a wait).
static OUTLASTED: AtomicU32 = AtomicU32::new(0);
const OUTLASTED_WINDOW: u32 = 16;
/// Waits of the window that outlasted the spin from which waiters yield instead of spinning.
const CONTENDED_FROM: u32 = 2;
/// One in this many waits of a contended process spins all the same ([`Outlasted::probe_due`]).
const PROBE_EVERY: u32 = 16;
static CONTENDED_WAITS: AtomicU32 = AtomicU32::new(0);

/// A record of recent waits (the process's is [`OUTLASTED`]).
struct Outlasted<'a>(&'a AtomicU32);

impl Outlasted<'_> {
    fn contended(&self) -> bool {
        self.0.load(Ordering::Relaxed).count_ones() >= CONTENDED_FROM
    }

    /// Whether a wait of a contended process should spin all the same, to see whether spinning
    /// works again: every [`PROBE_EVERY`]th. Yielding cannot tell: where a yield costs more than
    /// a spin (a few µs each in a virtual machine) yielding waits outlast the spin themselves.
    fn probe_due(&self) -> bool {
        CONTENDED_WAITS.fetch_add(1, Ordering::Relaxed).is_multiple_of(PROBE_EVERY)
    }

    /// Notes how a wait ended (`probe`: a wait that spun although the record said to yield; if
    /// it ended within the spin, the record is cleared). A quick wait with a clean record writes
    /// nothing: the steady state of a quiet host costs a load.
    fn note(&self, long: bool, probe: bool) {
        let seen = self.0.load(Ordering::Relaxed);
        if probe && !long {
            self.0.store(0, Ordering::Relaxed);
        } else if long || seen != 0 {
            let window = (1u32 << OUTLASTED_WINDOW) - 1;
            self.0.store(((seen << 1) | u32::from(long)) & window, Ordering::Relaxed);
        }
    }
}

pub(crate) fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as _ };
    // SAFETY: a shared (not private) futex wait on a live 4-byte word with a relative timeout.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, seen, &ts as *const libc::timespec) };
}

pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: a shared futex wake on a live word.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

/// Spin (for `spin`), then yield (`yields` times), then sleep. With a core per local rank the
/// waiter spins and then sleeps: yielding on a machine loaded by other work can give a whole time
/// slice away. With more local ranks than cores it does not spin but yields, which runs the rank
/// it waits for when that one shares its core.
pub(crate) struct Backoff<'a> {
    n: u32,
    start: Option<Instant>,
    spin: Duration,
    yields: u32,
    spinning: bool,
    /// Whether this wait adds to the process's record (see [`Outlasted`]): not where the host's
    /// ranks outnumber its cores (they never spin).
    learns: bool,
    /// Whether this wait has outlasted [`SPIN`] (spinning or yielding): the record's bit.
    outlasted: bool,
    /// Whether this wait yields because spinning has been failing ([`CONTENDED_YIELDS`]).
    contended: bool,
    /// Whether this wait spins to see whether spinning works again (see [`Outlasted::probe_due`]).
    probing: bool,
    /// Called after each yield (the rings' waiters say where they run and keep the ranks
    /// spread: `Shm::after_yield`).
    after_yield: Option<&'a dyn Yielded>,
}

/// What a waiter does after each yield (see [`Backoff::with_after_yield`]).
pub(crate) trait Yielded {
    fn yielded(&self);
}

impl Backoff<'static> {
    /// A wait that neither adds to the process's record nor follows it: the rings' waits for
    /// the pieces of a large frame last as long as its copy, whatever the host is doing.
    pub(crate) fn new(w: Wait) -> Self {
        Backoff {
            n: 0,
            start: None,
            spin: w.spin,
            yields: w.yields,
            spinning: !w.spin.is_zero(),
            learns: false,
            outlasted: false,
            contended: false,
            probing: false,
            after_yield: None,
        }
    }

    /// A wait for a small collective's round (the board's), which should end within the spin
    /// when both ranks run: it adds to the process's record and follows it (see the module
    /// comment).
    pub(crate) fn learning(w: Wait) -> Self {
        let learns = !w.shares_cores();
        let record = Outlasted(&OUTLASTED);
        let (contended, probing) = match learns && record.contended() {
            true => match record.probe_due() {
                true => (false, true),
                false => (true, false),
            },
            false => (false, false),
        };
        let (spin, yields) = match contended {
            true => (Duration::ZERO, CONTENDED_YIELDS),
            false => (w.spin, w.yields),
        };
        Backoff { spin, yields, spinning: !spin.is_zero(), learns, contended, probing, ..Backoff::new(w) }
    }
}

impl<'a> Backoff<'a> {
    /// A backoff that calls `after_yield` after each yield.
    pub(crate) fn with_after_yield(w: Wait, after_yield: &'a dyn Yielded) -> Self {
        Backoff { after_yield: Some(after_yield), ..Backoff::new(w) }
    }
}

impl Drop for Backoff<'_> {
    fn drop(&mut self) {
        if self.learns {
            // A yielding wait reads the clock at its first yield; it outlasted the spin if it
            // is still going a spin later.
            let yielded_long = !self.outlasted && self.start.is_some_and(|s| s.elapsed() >= SPIN);
            Outlasted(&OUTLASTED).note(self.outlasted || yielded_long, self.probing);
        }
    }
}

impl Backoff<'_> {
    /// One step of the wait: a spin or a yield; true once both are over and the caller should
    /// sleep (and drain).
    pub(crate) fn step(&mut self) -> bool {
        if self.spinning {
            // One pause per look (~25 ns on current x86): the awaited write is noticed within
            // a cache-line transfer. More pauses per look delayed a 4-byte allreduce by
            // ~0.1 µs on average.
            std::hint::spin_loop();
            // The clock only every 64th look (reading it costs ~45 ns in a VM, two looks), and
            // never on the first: most waits end within a few looks.
            self.n = self.n.wrapping_add(1);
            if !self.n.is_multiple_of(64) {
                return false;
            }
            let start = *self.start.get_or_insert_with(Instant::now);
            if start.elapsed() < self.spin {
                return false;
            }
            self.spinning = false;
            self.outlasted = true;
            self.n = 0;
        }
        self.n = self.n.saturating_add(1);
        if self.n <= self.yields {
            if self.learns && self.start.is_none() {
                self.start = Some(Instant::now());
            }
            if self.contended && self.start.is_some_and(|s| s.elapsed() >= CONTENDED_YIELD_FOR) {
                self.n = self.yields + 1;
                return true;
            }
            std::thread::yield_now();
            if let Some(y) = self.after_yield {
                y.yielded();
            }
            false
        } else {
            true
        }
    }
    pub(crate) fn reset(&mut self) {
        if self.learns && !self.outlasted {
            self.outlasted = self.start.is_some_and(|s| s.elapsed() >= SPIN);
        }
        self.n = 0;
        self.start = None;
        self.spinning = !self.spin.is_zero();
    }
    pub(crate) fn sleeping(&self) -> bool {
        self.n > self.yields
    }
}

/// How a waiter waits (see [`Backoff`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Wait {
    spin: Duration,
    yields: u32,
}

impl Wait {
    /// How the waiters of a host with `local` ranks wait: spinning only pays when every local
    /// rank has a core of its own. The host's cores count, not this process's affinity: a
    /// launcher that binds each rank to a core of its own (hccnrun or mpirun --bind-to core)
    /// leaves it one, yet no rank waits for another on its core.
    pub(crate) fn for_local_ranks(local: usize) -> Wait {
        match local <= super::starved::host_cores() as usize {
            true => Wait { spin: SPIN, yields: 0 },
            false => Wait { spin: Duration::ZERO, yields: OVERSUBSCRIBED_YIELDS },
        }
    }

    /// The host's ranks outnumber its cores: waiters yield rather than spin.
    pub(crate) fn shares_cores(&self) -> bool {
        self.spin.is_zero()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_yield_while_waits_outlast_the_spin_and_spin_again_once_they_do_not() {
        let word = AtomicU32::new(0);
        let record = Outlasted(&word);
        assert!(!record.contended());
        record.note(true, false);
        assert!(!record.contended(), "one long wait (a preemption) changes nothing");
        record.note(false, false);
        record.note(true, false);
        assert!(record.contended(), "two in the window: yield");
        for _ in 0..OUTLASTED_WINDOW - 3 {
            record.note(false, false);
        }
        assert!(record.contended(), "still within the window");
        record.note(false, false);
        assert!(!record.contended(), "a window of quick waits: spin again");
        for _ in 0..3 {
            record.note(false, false);
        }
        assert_eq!(word.load(Ordering::Relaxed), 0, "the record is clean again");
        // Yielding waits that outlast the spin by themselves: a probe that spins and ends
        // quickly clears the record at once; one that outlasts the spin too keeps it.
        record.note(true, false);
        record.note(true, false);
        record.note(true, true);
        assert!(record.contended(), "the probe outlasted the spin too");
        record.note(false, true);
        assert!(!record.contended() && word.load(Ordering::Relaxed) == 0, "a quick probe clears the record");
    }

    #[test]
    fn ranks_that_outnumber_the_cores_keep_their_own_policy() {
        let shared = Wait { spin: Duration::ZERO, yields: OVERSUBSCRIBED_YIELDS };
        let b = Backoff::learning(shared);
        assert!(!b.learns && b.yields == OVERSUBSCRIBED_YIELDS && !b.spinning);
        let own = Wait { spin: SPIN, yields: 0 };
        assert!(Backoff::learning(own).learns);
        assert!(!Backoff::new(own).learns, "the rings' waits for large frames do not learn");
    }
}
