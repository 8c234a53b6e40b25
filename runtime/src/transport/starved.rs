//! How late this process's own watchdog wakes: a measure of how starved of CPU the host is.
//! Where ranks far outnumber the cores (256 on two, say), every thread waits its turn behind
//! hundreds of others, and a peer on this host can be silent for longer than
//! HCCN_DEAD_AFTER_MS while alive. A watchdog that itself woke that late has the evidence: it
//! extends the silence it takes for death by twice its recent lateness (the peer's watchdog
//! was as late in sending as this one was in looking). On a host with cores to spare, lateness
//! is a few milliseconds and detection keeps its speed.

use std::time::{Duration, Instant};

/// How long a lateness counts: a starved moment long past says nothing about now.
const MEMORY: Duration = Duration::from_secs(3);

#[derive(Debug, Default)]
pub(crate) struct Lateness {
    /// The worst lateness seen, and when it was seen.
    worst: Option<(Instant, Duration)>,
}

impl Lateness {
    /// Notes a wake-up at `woke` that was planned for `planned`.
    pub fn woke(&mut self, planned: Instant, woke: Instant) {
        let late = woke.saturating_duration_since(planned);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_recent_lateness_counts_twice_and_is_forgotten_after_a_while() {
        let t0 = Instant::now();
        let mut l = Lateness::default();
        assert_eq!(l.allowance(t0), Duration::ZERO);
        l.woke(t0, t0 + Duration::from_millis(2));
        l.woke(t0 + Duration::from_millis(100), t0 + Duration::from_millis(700));
        l.woke(t0 + Duration::from_millis(800), t0 + Duration::from_millis(810));
        let at = t0 + Duration::from_secs(1);
        assert_eq!(l.allowance(at), Duration::from_millis(1200), "600 ms late, twice");
        // Long after: only what was seen since counts.
        let later = t0 + Duration::from_secs(5);
        l.woke(later, later + Duration::from_millis(3));
        assert_eq!(l.allowance(later + Duration::from_millis(3)), Duration::from_millis(6));
        assert_eq!(l.allowance(later + Duration::from_secs(10)), Duration::ZERO);
    }
}
