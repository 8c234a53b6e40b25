//! How every waiter of the transport waits (shared-memory rings, the board, TCP readers
//! standing aside): spin, then yield, then sleep on a futex in shared memory, woken by the other
//! side or after a nap to look at health again. One policy for all.

use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

/// How long a futex sleep lasts before the sleeper looks at health and the inbox again.
pub(crate) const NAP: Duration = Duration::from_millis(1);
/// How long a waiter spins before it yields, when every local rank has a core.
const SPIN: Duration = Duration::from_micros(20);
/// How often a waiter yields before it sleeps, when the host's ranks outnumber its cores.
const OVERSUBSCRIBED_YIELDS: u32 = 100;

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
    /// Called after each yield (the rings' waiters say where they run and keep the ranks
    /// spread: `Shm::after_yield`).
    after_yield: Option<&'a dyn Yielded>,
}

/// What a waiter does after each yield (see [`Backoff::with_after_yield`]).
pub(crate) trait Yielded {
    fn yielded(&self);
}

impl Backoff<'static> {
    pub(crate) fn new(w: Wait) -> Self {
        Backoff { n: 0, start: None, spin: w.spin, yields: w.yields, spinning: !w.spin.is_zero(), after_yield: None }
    }
}

impl<'a> Backoff<'a> {
    /// A backoff that calls `after_yield` after each yield.
    pub(crate) fn with_after_yield(w: Wait, after_yield: &'a dyn Yielded) -> Self {
        Backoff { after_yield: Some(after_yield), ..Backoff::new(w) }
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
            self.n = 0;
        }
        self.n = self.n.saturating_add(1);
        if self.n <= self.yields {
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
    /// rank has a core of its own.
    pub(crate) fn for_local_ranks(local: usize) -> Wait {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        match local <= cores {
            true => Wait { spin: SPIN, yields: 0 },
            false => Wait { spin: Duration::ZERO, yields: OVERSUBSCRIBED_YIELDS },
        }
    }

    /// The host's ranks outnumber its cores: waiters yield rather than spin.
    pub(crate) fn shares_cores(&self) -> bool {
        self.spin.is_zero()
    }
}
