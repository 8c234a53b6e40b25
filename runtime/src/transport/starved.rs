//! How late this process's own watchdog wakes: a measure of how starved of CPU the host is.
//! Where ranks far outnumber the cores (256 on two, say), every thread waits its turn behind
//! hundreds of others, and a peer on this host can be silent for longer than
//! HCCN_DEAD_AFTER_MS while alive. A watchdog that itself woke that late has the evidence: it
//! extends the silence it takes for death by twice its recent lateness (the peer's watchdog
//! was as late in sending as this one was in looking). A peer on this host can also be starved
//! while this watchdog is lucky: the run queue says how long a thread may wait its turn (the
//! runnable threads beyond the cores, a few milliseconds of slice each). On a host with cores to
//! spare, both are a few milliseconds and detection keeps its speed.

use std::time::{Duration, Instant};

/// How long a lateness counts: about the silence being judged (HCCN_DEAD_AFTER_MS, 800 ms, and
/// a beat). Starvation before it did not cause it; remembered for 3 s, the start of 64 ranks on
/// two cores still added 300 ms to the detection of a freeze a second later.
const MEMORY: Duration = Duration::from_secs(1);

/// What a runnable thread beyond the cores costs the others in waiting: about one scheduler
/// slice (Linux's minimum granularity is 3 ms on small machines).
const SLICE: Duration = Duration::from_millis(4);

#[derive(Debug, Default)]
pub(crate) struct Lateness {
    /// The worst lateness seen, and when it was seen.
    worst: Option<(Instant, Duration)>,
}

impl Lateness {
    /// Notes a wake-up at `woke` that was planned for `planned`, and how long a thread may wait
    /// for a core now (`queue`, see [`queue_wait`]); both count alike.
    pub fn woke(&mut self, planned: Instant, woke: Instant, queue: Duration) {
        let late = woke.saturating_duration_since(planned).max(queue / 2);
        let keep = self.worst.filter(|(at, d)| woke.saturating_duration_since(*at) < MEMORY && *d >= late);
        self.worst = Some(keep.unwrap_or((woke, late)));
    }

    /// Extra silence to allow a peer before it counts as dead, at `now`.
    pub fn allowance(&self, now: Instant) -> Duration {
        match self.worst {
            Some((at, late)) if now.saturating_duration_since(at) < MEMORY => 2 * late,
            _ => Duration::ZERO,
        }
    }
}

/// How long a thread that becomes runnable now may wait for a core: the runnable threads beyond
/// the cores (/proc/loadavg's fourth field), a slice each, shared among the cores.
pub(crate) fn queue_wait() -> Duration {
    std::fs::read_to_string("/proc/loadavg").map_or(Duration::ZERO, |text| queue_wait_in(&text, host_cores()))
}

/// The host's online cores, read once. The run queue is the host's, so this is not the process's
/// affinity (a rank bound to one core still shares a queue that every core serves).
pub(crate) fn host_cores() -> u32 {
    static CORES: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| {
        // SAFETY: sysconf takes no pointers.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
        u32::try_from(online).ok().filter(|&n| n > 0).unwrap_or(1)
    })
}

fn queue_wait_in(loadavg: &str, cores: u32) -> Duration {
    let beyond = runnable(loadavg).unwrap_or(0).saturating_sub(cores);
    SLICE * beyond / cores.max(1)
}

/// How many times over the host's cores are asked for now: the runnable threads per core,
/// rounded down; 1 when /proc/loadavg cannot be read.
pub(crate) fn overload() -> u32 {
    let runnable = std::fs::read_to_string("/proc/loadavg").ok().and_then(|t| runnable(&t));
    runnable.map_or(1, |r| (r / host_cores()).max(1))
}

/// The runnable threads, from a /proc/loadavg line ("0.52 0.58 0.59 3/1043 12345").
fn runnable(loadavg: &str) -> Option<u32> {
    loadavg.split_whitespace().nth(3)?.split('/').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_recent_lateness_counts_twice_and_is_forgotten_after_a_while() {
        let t0 = Instant::now();
        let mut l = Lateness::default();
        assert_eq!(l.allowance(t0), Duration::ZERO);
        l.woke(t0, t0 + Duration::from_millis(2), Duration::ZERO);
        l.woke(t0 + Duration::from_millis(100), t0 + Duration::from_millis(700), Duration::ZERO);
        l.woke(t0 + Duration::from_millis(800), t0 + Duration::from_millis(810), Duration::ZERO);
        let at = t0 + Duration::from_secs(1);
        assert_eq!(l.allowance(at), Duration::from_millis(1200), "600 ms late, twice");
        // Long after: only what was seen since counts.
        let later = t0 + Duration::from_secs(5);
        l.woke(later, later + Duration::from_millis(3), Duration::ZERO);
        assert_eq!(l.allowance(later + Duration::from_millis(3)), Duration::from_millis(6));
        assert_eq!(l.allowance(later + Duration::from_secs(10)), Duration::ZERO);
    }

    #[test]
    fn a_crowded_run_queue_counts_as_lateness() {
        // 5 runnable of 139 on 2 cores: 3 beyond, 4 ms each, over 2 cores.
        assert_eq!(queue_wait_in("26.83 14.23 7.34 5/139 16522", 2), Duration::from_millis(6));
        assert_eq!(queue_wait_in("0.1 0.1 0.1 1/90 1", 2), Duration::ZERO);
        assert_eq!(queue_wait_in("garbage", 2), Duration::ZERO);
        assert_eq!(runnable("0.52 0.58 0.59 1043 12345"), Some(1043));
        assert!(overload() >= 1);
        let t0 = Instant::now();
        let mut l = Lateness::default();
        l.woke(t0, t0 + Duration::from_millis(1), Duration::from_millis(1000));
        assert_eq!(l.allowance(t0 + Duration::from_millis(2)), Duration::from_millis(1000));
    }
}
