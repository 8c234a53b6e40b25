//! Keeping a host's ranks evenly spread over its cores when they outnumber them. Linux's balancer
//! can leave 4 ranks on 2 cores 3:1 (even 4:0) for hundreds of milliseconds: a `perf record -e
//! sched:sched_switch,sched:sched_migrate_task` trace of slow runs showed it for 71-89 % of the
//! run, and every operation then costs the crowded core two more context switches (a 4-byte
//! allreduce 3.3-5.6 us instead of 2-2.7, a 256 KiB one 60 us instead of 42). Waiters say in
//! shared memory which core they run on (the board's lines, the rings' control blocks); now and
//! then one looks, and the highest rank on a core that holds two ranks more than another core it
//! may use moves there: it pins itself to that core for the move and gives its affinity mask back
//! at once, so nothing stays bound, and a rank its launcher bound to one core never moves.

use std::sync::atomic::{AtomicU32, Ordering};

/// Yields between a waiter's looks (a look reads every local rank's core word), and after a move
/// (the others' words must catch up). Counted, not timed: a clock read per yield cost a 4-byte
/// allreduce 0.05-0.1 us. A rank of a 4-byte allreduce on 4 ranks and 2 cores yields about once
/// per operation, every 2 us: a look every half millisecond or so.
const EVERY: u32 = 256;
const SETTLE: u32 = 4096;

/// The core this thread runs on now (u32::MAX when unknown).
pub(super) fn here() -> u32 {
    // SAFETY: no arguments; reads the current CPU (vDSO or rseq, no system call on Linux).
    u32::try_from(unsafe { libc::sched_getcpu() }).unwrap_or(u32::MAX)
}

/// When a waiter looks next.
#[derive(Default)]
pub(super) struct Countdown(AtomicU32);

impl Countdown {
    /// Counts one yield; true when it is time to look (the first time, then every EVERY).
    pub(super) fn due(&self) -> bool {
        // Not a read-modify-write: threads of one rank that race here merely look twice.
        let left = self.0.load(Ordering::Relaxed);
        if left > 0 {
            self.0.store(left - 1, Ordering::Relaxed);
            return false;
        }
        self.0.store(EVERY, Ordering::Relaxed);
        true
    }
    /// After a move: the next look waits longer.
    pub(super) fn after_move(&self) {
        self.0.store(SETTLE, Ordering::Relaxed);
    }
}

/// What the host's ranks said: calls its argument with (rank, core it last said) for every rank
/// on the host, this one included.
pub(super) type Said<'a> = &'a dyn Fn(&mut dyn FnMut(u32, u32));

/// Moves this thread off core `mine` if the highest rank there is `me` and `mine` holds two
/// more of the ranks than another core this thread may use. Returns the core moved to.
pub(super) fn spread(me: u32, mine: u32, cores: Said<'_>) -> Option<u32> {
    if mine == u32::MAX {
        return None;
    }
    let on = |cpu: u32| {
        let mut k = 0;
        cores(&mut |_, c| k += usize::from(c == cpu));
        k
    };
    let mut above_me = false;
    cores(&mut |r, c| above_me |= r > me && c == mine);
    let crowd = on(mine);
    if crowd < 2 || above_me {
        return None;
    }
    let allowed = CpuSet::of_this_thread()?;
    let (to, there) = allowed.cpus().filter(|&c| c != mine).map(|c| (c, on(c))).min_by_key(|&(_, k)| k)?;
    if there + 2 > crowd || !CpuSet::just(to).apply() {
        return None;
    }
    if !allowed.apply() {
        tracing::warn!(cpu = to, "could not give this thread its CPU affinity back after moving it");
    }
    Some(to)
}

/// A thread's CPU affinity mask.
pub(super) struct CpuSet(libc::cpu_set_t);

impl CpuSet {
    pub(super) fn of_this_thread() -> Option<CpuSet> {
        // SAFETY: a zeroed cpu_set_t is an empty set; the kernel fills it (size given).
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is a writable cpu_set_t of the size given.
        let ok = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } == 0;
        ok.then_some(CpuSet(set))
    }
    fn just(cpu: u32) -> CpuSet {
        // SAFETY: as above.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: sets one bit of `set`; `cpu` comes from another set, so it is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu as usize, &mut set) };
        CpuSet(set)
    }
    pub(super) fn cpus(&self) -> impl Iterator<Item = u32> + '_ {
        // SAFETY: reads one bit of the set, below CPU_SETSIZE.
        (0..libc::CPU_SETSIZE as u32).filter(|&c| unsafe { libc::CPU_ISSET(c as usize, &self.0) })
    }
    /// Sets this thread's affinity (the kernel moves it at once when it runs elsewhere).
    fn apply(&self) -> bool {
        // SAFETY: a valid cpu_set_t of the size given, read by the kernel.
        unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &self.0) == 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mask() -> Vec<u32> {
        CpuSet::of_this_thread().expect("affinity").cpus().collect()
    }

    /// Confines this test's thread to two of its CPUs (None with one): the one the ranks' words
    /// will say it runs on, and the other. `spread` trusts the words, not `here()`.
    fn two_cpus() -> Option<(u32, u32)> {
        let cpus = mask();
        let (&mine, &other) = (cpus.first()?, cpus.get(1)?);
        let mut set = CpuSet::just(mine);
        // SAFETY: sets one bit, below CPU_SETSIZE.
        unsafe { libc::CPU_SET(other as usize, &mut set.0) };
        assert!(set.apply());
        Some((mine, other))
    }

    fn words(said: [u32; 4]) -> impl Fn(&mut dyn FnMut(u32, u32)) {
        move |f: &mut dyn FnMut(u32, u32)| (0..4).for_each(|r| f(r, said[r as usize]))
    }

    #[test]
    fn the_highest_rank_on_a_crowded_core_moves_to_an_emptier_one_and_stays_unbound() {
        let Some((mine, other)) = two_cpus() else {
            eprintln!("one CPU only: nothing to spread over");
            return;
        };
        let allowed = mask();
        // 3:1 as rank 3 sees it: ranks 0, 1 and 3 here, rank 2 elsewhere.
        assert_eq!(spread(3, mine, &words([mine, mine, other, mine])), Some(other), "rank 3 moves");
        assert_eq!(mask(), allowed, "the thread's affinity is given back");
        // 4:0: the highest moves too.
        assert_eq!(spread(3, mine, &words([mine; 4])), Some(other));
    }

    #[test]
    fn a_rank_stays_when_a_higher_rank_shares_its_core_or_the_cores_are_even() {
        let Some((mine, other)) = two_cpus() else {
            eprintln!("one CPU only: nothing to spread over");
            return;
        };
        let allowed = mask();
        // 3:1, but rank 3 (on the crowded core too) is the one to move.
        assert_eq!(spread(1, mine, &words([mine, mine, other, mine])), None);
        // 2:2: nobody moves.
        assert_eq!(spread(3, mine, &words([mine, other, other, mine])), None);
        // Ranks that have not said where they run do not count.
        assert_eq!(spread(3, mine, &words([u32::MAX, u32::MAX, u32::MAX, mine])), None);
        assert_eq!(mask(), allowed);
    }

    #[test]
    fn a_waiter_looks_first_at_once_then_every_256_yields_and_later_after_a_move() {
        let c = Countdown::default();
        assert!(c.due());
        assert_eq!((0..EVERY).filter(|_| c.due()).count(), 0);
        assert!(c.due());
        c.after_move();
        assert_eq!((0..SETTLE).filter(|_| c.due()).count(), 0);
        assert!(c.due());
    }
}
