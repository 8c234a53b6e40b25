//! Heartbeats and silence detection. Socket EOF catches processes that die; this catches those
//! that stop (SIGSTOP, a hung host) and links that are cut without a reset: a peer from which
//! nothing arrived for `dead_after` is declared failed and its connection closed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{Inbox, Link};

/// A thread per world of processes; stops (promptly) when dropped.
pub(crate) struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// `None` when heartbeats are off or there is no peer.
    pub fn start(
        peers: Vec<(u32, Arc<dyn Link>)>,
        inbox: Arc<Inbox>,
        every: Duration,
        dead_after: Duration,
    ) -> Option<Self> {
        if every.is_zero() || peers.is_empty() {
            return None;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("hccn-heartbeat".into())
            .spawn(move || watch(&peers, &inbox, every, dead_after, &stop2))
            .map_err(|e| tracing::error!("no heartbeat thread, silent peers will only time out: {e}"))
            .ok()?;
        Some(Watchdog { stop, thread: Some(thread) })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

fn watch(peers: &[(u32, Arc<dyn Link>)], inbox: &Inbox, every: Duration, dead_after: Duration, stop: &AtomicBool) {
    let mut declared = vec![false; peers.len()];
    while !stop.load(Ordering::SeqCst) {
        let failed = inbox.failed();
        for (i, (rank, link)) in peers.iter().enumerate() {
            if declared[i] || failed.contains_key(rank) {
                continue;
            }
            link.heartbeat();
            let silent = link.silent_for();
            // Bytes waiting in the socket mean the peer spoke and our reader is merely behind
            // (a starved thread on a loaded machine), not that the peer is gone.
            if silent > dead_after && !link.has_unread() {
                declared[i] = true;
                inbox.mark_failed(
                    *rank,
                    format!("silent for {} ms: frozen, hung or cut off (HCCN_DEAD_AFTER_MS)", silent.as_millis()),
                );
                link.close(false);
            }
        }
        std::thread::park_timeout(every);
    }
}
