//! The watchdog of a world: it tells every peer at once of a peer this rank lost (a `Suspect`
//! frame), so that bystanders stop waiting for an operation that cannot complete; and, with
//! heartbeats on, it keeps the links alive and declares a peer silent for `dead_after` failed:
//! socket EOF catches processes that die, silence catches those that stop (SIGSTOP, a hung
//! host) and links that are cut without a reset. A silent peer is told so (`Evict`) before its
//! connection closes, so that if it was only frozen it learns on waking that it was left behind.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use super::{news, Fault, Inbox, LinkTable};
use crate::wire::{FrameHeader, FrameKind};

/// A thread per world of processes; stops (promptly) when dropped.
pub(crate) struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// How often a notice that a busy link could not take is tried again.
const RETRY: Duration = Duration::from_millis(5);

impl Watchdog {
    /// `every` zero turns heartbeats and silence detection off (losses are still told).
    pub fn start(peers: Arc<LinkTable>, inbox: Arc<Inbox>, every: Duration, dead_after: Duration) -> Option<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let inbox2 = inbox.clone();
        let thread = std::thread::Builder::new()
            .name("hccn-watchdog".into())
            .spawn(move || watch(&peers, &inbox2, every, dead_after, &stop2))
            .map_err(|e| tracing::error!("no watchdog thread: silent peers will only time out: {e}"))
            .ok()?;
        inbox.set_announcer(thread.thread().clone());
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

fn header(kind: FrameKind, len: usize) -> FrameHeader {
    FrameHeader::control(kind, 0, 0, 0, len)
}

fn watch(peers: &LinkTable, inbox: &Inbox, every: Duration, dead_after: Duration, stop: &AtomicBool) {
    let mut declared = HashSet::new();
    // Suspect notices each link still has to take.
    let mut pending: Vec<(u32, Vec<u8>)> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        let lost = inbox.announcements();
        let failed = inbox.failed();
        if !lost.is_empty() {
            let payload = news::encode(&lost);
            let live = peers.all().into_iter().filter(|(r, _)| !failed.contains_key(r));
            pending.extend(live.map(|(r, _)| (r, payload.clone())));
        }
        pending.retain(|(rank, payload)| match peers.get(*rank) {
            Some(link) if !failed.contains_key(rank) => {
                !link.control(&header(FrameKind::Suspect, payload.len()), payload)
            }
            _ => false,
        });
        if !every.is_zero() {
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
                    let why =
                        format!("silent for {} ms: frozen, hung or cut off (HCCN_DEAD_AFTER_MS)", silent.as_millis());
                    let evict = news::encode_reason(&why);
                    link.control(&header(FrameKind::Evict, evict.len()), &evict);
                    inbox.mark_failed(rank, Fault::cut(why));
                    link.close(None);
                }
            }
        }
        let nap = match (pending.is_empty(), every.is_zero()) {
            (false, _) => RETRY,
            (true, false) => every,
            // Only news wakes a watchdog without heartbeats (it unparks this thread).
            (true, true) => Duration::from_secs(3600),
        };
        std::thread::park_timeout(nap);
    }
}
