//! Heartbeats and silence detection. Socket EOF catches processes that die; this catches those
//! that stop (SIGSTOP, a hung host) and links that are cut without a reset: a peer from which
//! nothing arrived for `dead_after` is declared failed and its connection closed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use std::collections::HashSet;

use super::{Inbox, LinkTable};

/// A thread per world of processes; stops (promptly) when dropped.
pub(crate) struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// `None` when heartbeats are off.
    pub fn start(peers: Arc<LinkTable>, inbox: Arc<Inbox>, every: Duration, dead_after: Duration) -> Option<Self> {
        if every.is_zero() {
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

fn watch(peers: &LinkTable, inbox: &Inbox, every: Duration, dead_after: Duration, stop: &AtomicBool) {
    let mut declared = HashSet::new();
    while !stop.load(Ordering::SeqCst) {
        let failed = inbox.failed();
        for (rank, link) in peers.all() {
            if declared.contains(&rank) || failed.contains_key(&rank) {
                continue;
            }
            link.heartbeat();
            let silent = link.silent_for();
            // Bytes waiting in the socket mean the peer spoke and our reader is merely behind
            // (a starved thread on a loaded machine), not that the peer is gone.
            if silent > dead_after && !link.has_unread() {
                declared.insert(rank);
                inbox.mark_failed(
                    rank,
                    format!("silent for {} ms: frozen, hung or cut off (HCCN_DEAD_AFTER_MS)", silent.as_millis()),
                );
                link.close(false);
            }
        }
        std::thread::park_timeout(every);
    }
}
