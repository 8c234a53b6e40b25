//! Moving frames between ranks. A [`Net`] joins the processes of one world: one [`Link`] per peer
//! and one [`Inbox`] where every arriving frame waits until the receive that matches it. Groups
//! and splits share their parent's `Net`; frames carry the communicator id that separates them.
//!
//! A peer's connection ending without a goodbye marks it failed, and every wait of a
//! communicator that contains it returns `RankFailed` at once.

mod heartbeat;
pub(crate) mod tcp;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::wire::{FrameHeader, FrameKind};

/// One direction of traffic to a peer.
pub(crate) trait Link: Send + Sync {
    /// Writes one frame; an error means the peer is unreachable.
    fn send(&self, hdr: &FrameHeader, payload: &[u8]) -> std::io::Result<()>;
    /// Closes the connection; `graceful` says goodbye first so the peer does not see a failure.
    fn close(&self, graceful: bool);
    /// Says goodbye without closing (the process is exiting); skipped if a send is in progress.
    fn farewell(&self);
    /// Sends a heartbeat unless that would wait (a busy link proves life by itself).
    fn heartbeat(&self);
    /// Time since the last frame arrived from the peer.
    fn silent_for(&self) -> Duration;
    /// True when bytes from the peer are waiting to be read (it spoke; we did not listen yet).
    fn has_unread(&self) -> bool;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub src: u32,
    pub kind: FrameKind,
    pub comm_id: u64,
    pub seq: u64,
}

#[derive(Debug)]
pub(crate) struct Frame {
    pub hdr: FrameHeader,
    pub payload: Vec<u8>,
}

#[derive(Default)]
struct InboxState {
    queues: HashMap<Key, VecDeque<Frame>>,
    /// World ranks whose connection broke, with the reason.
    failed: BTreeMap<u32, String>,
    /// World ranks that closed their side on purpose.
    departed: BTreeSet<u32>,
    /// Communicators revoked here or by a peer.
    revoked: HashSet<u64>,
}

/// What a waiter may consult to decide that its wait is over.
pub(crate) struct Health<'a> {
    pub failed: &'a BTreeMap<u32, String>,
    pub revoked: &'a HashSet<u64>,
}

/// Frames that have arrived but not yet been received, and what is known of peers' health.
#[derive(Default)]
pub(crate) struct Inbox {
    state: Mutex<InboxState>,
    changed: Condvar,
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, InboxState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn push(&self, src: u32, frame: Frame) {
        let key = Key { src, kind: frame.hdr.kind, comm_id: frame.hdr.comm_id, seq: frame.hdr.seq };
        self.lock().queues.entry(key).or_default().push_back(frame);
        self.changed.notify_all();
    }

    pub fn mark_failed(&self, rank: u32, reason: String) {
        let mut st = self.lock();
        if !st.departed.contains(&rank) && !st.failed.contains_key(&rank) {
            tracing::warn!(rank, "peer failed: {reason}");
            st.failed.insert(rank, reason);
        }
        drop(st);
        self.changed.notify_all();
    }

    pub fn revoke(&self, comm_id: u64) {
        self.lock().revoked.insert(comm_id);
        self.changed.notify_all();
    }

    pub fn mark_departed(&self, rank: u32) {
        self.lock().departed.insert(rank);
        self.changed.notify_all();
    }

    /// Drops frames queued for a communicator that no longer exists here.
    pub fn purge(&self, comm_id: u64) {
        self.lock().queues.retain(|k, _| k.comm_id != comm_id);
    }

    /// Wakes every waiter so it re-checks its communicator's state (abort, revoke).
    pub fn wake_all(&self) {
        let _guard = self.lock();
        self.changed.notify_all();
    }

    pub fn failed(&self) -> BTreeMap<u32, String> {
        self.lock().failed.clone()
    }

    /// How many peers have failed or left so far (the agreement re-plans when this grows).
    pub fn gone_count(&self) -> usize {
        let st = self.lock();
        st.failed.len() + st.departed.len()
    }

    /// World ranks that failed or left on purpose: gone, as far as an agreement is concerned.
    pub fn gone(&self) -> BTreeSet<u32> {
        let st = self.lock();
        st.failed.keys().chain(st.departed.iter()).copied().collect()
    }

    /// Runs `f` on the current health (failed peers, revoked communicators).
    pub fn health<R>(&self, f: impl FnOnce(&Health<'_>) -> R) -> R {
        let st = self.lock();
        f(&Health { failed: &st.failed, revoked: &st.revoked })
    }

    /// The next frame of `kind` for (`comm_id`, `seq`) from any sender. Returns `None` after
    /// `wait`, or as soon as more than `planned_with` peers are gone (the count the caller
    /// planned with, see `gone_count`), so the caller can re-plan.
    pub fn take_any(
        &self,
        kind: FrameKind,
        comm_id: u64,
        seq: u64,
        planned_with: usize,
        wait: Duration,
    ) -> Option<(u32, Frame)> {
        let deadline = Instant::now() + wait;
        let mut st = self.lock();
        loop {
            let key = st.queues.keys().find(|k| k.kind == kind && k.comm_id == comm_id && k.seq == seq).copied();
            if let Some(key) = key {
                let q = st.queues.get_mut(&key)?;
                let f = q.pop_front();
                if q.is_empty() {
                    st.queues.remove(&key);
                }
                return f.map(|f| (key.src, f));
            }
            let now = Instant::now();
            if now >= deadline || st.failed.len() + st.departed.len() != planned_with {
                return None;
            }
            st = self.changed.wait_timeout(st, deadline - now).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Waits for the next frame under `key`. Before each sleep `status` may end the wait with the
    /// communicator's error (aborted, a member failed); the wait never outlasts `timeout`.
    pub fn take(&self, key: Key, timeout: Duration, status: &dyn Fn(&Health<'_>) -> Option<Error>) -> Result<Frame> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if let Some(q) = st.queues.get_mut(&key) {
                if let Some(f) = q.pop_front() {
                    if q.is_empty() {
                        st.queues.remove(&key);
                    }
                    return Ok(f);
                }
            }
            if let Some(e) = status(&Health { failed: &st.failed, revoked: &st.revoked }) {
                return Err(e);
            }
            if st.departed.contains(&key.src) {
                return Err(Error::new(
                    ErrorKind::Remote,
                    format!("world rank {} closed its connection while this rank still expected data", key.src),
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::timeout(format!(
                    "no message from world rank {} within {} ms (HCCN_TIMEOUT_MS)",
                    key.src,
                    timeout.as_millis()
                )));
            }
            st = self.changed.wait_timeout(st, deadline - now).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
        }
    }
}

/// The links of one world, indexed by world rank (this process's own numbering of its peers);
/// it grows when replacement ranks are admitted.
#[derive(Default)]
pub(crate) struct LinkTable {
    links: std::sync::RwLock<Vec<Option<Arc<dyn Link>>>>,
}

impl LinkTable {
    pub fn new(links: Vec<Option<Arc<dyn Link>>>) -> Self {
        LinkTable { links: std::sync::RwLock::new(links) }
    }

    pub fn get(&self, rank: u32) -> Option<Arc<dyn Link>> {
        self.links.read().unwrap_or_else(|p| p.into_inner()).get(rank as usize).cloned().flatten()
    }

    /// Every live link with its world rank.
    pub fn all(&self) -> Vec<(u32, Arc<dyn Link>)> {
        let links = self.links.read().unwrap_or_else(|p| p.into_inner());
        links.iter().enumerate().filter_map(|(r, l)| l.clone().map(|l| (r as u32, l))).collect()
    }

    /// Adds the link that `make` builds for the next world rank, and returns that rank.
    pub fn add(&self, make: impl FnOnce(u32) -> Result<Arc<dyn Link>>) -> Result<u32> {
        let mut links = self.links.write().unwrap_or_else(|p| p.into_inner());
        let rank = links.len() as u32;
        links.push(Some(make(rank)?));
        Ok(rank)
    }
}

/// The links of one world of processes.
pub(crate) struct Net {
    pub rank: u32,
    pub links: Arc<LinkTable>,
    pub inbox: Arc<Inbox>,
    graceful: std::sync::atomic::AtomicBool,
    watchdog: Option<heartbeat::Watchdog>,
    /// `HCCN_ALGO` of the process, for every communicator over these links.
    pub algo: crate::collectives::select::AlgoChoice,
}

impl Net {
    /// Joins the links; with a heartbeat interval, a watchdog thread keeps them alive and
    /// declares silent peers failed.
    pub fn new(rank: u32, links: Vec<Option<Arc<dyn Link>>>, inbox: Arc<Inbox>, cfg: &crate::config::Config) -> Net {
        let links = Arc::new(LinkTable::new(links));
        let watchdog = heartbeat::Watchdog::start(links.clone(), inbox.clone(), cfg.heartbeat, cfg.dead_after);
        let graceful = std::sync::atomic::AtomicBool::new(true);
        Net { rank, links, inbox, graceful, watchdog, algo: cfg.algo }
    }

    /// Sends one frame to world rank `dst` (to itself through the inbox).
    pub fn send(&self, dst: u32, hdr: &FrameHeader, payload: &[u8]) -> Result<()> {
        if dst == self.rank {
            self.inbox.push(dst, Frame { hdr: *hdr, payload: payload.to_vec() });
            return Ok(());
        }
        let link = self.links.get(dst).ok_or_else(|| Error::internal(format!("no link to world rank {dst}")))?;
        if let Some(reason) = self.inbox.failed().get(&dst) {
            return Err(Error::rank_failed(vec![dst], format!("world rank {dst} failed earlier: {reason}")));
        }
        link.send(hdr, payload).map_err(|e| {
            if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
                return Error::timeout(format!("sending to world rank {dst} made no progress (HCCN_TIMEOUT_MS)"));
            }
            self.inbox.mark_failed(dst, format!("send failed: {e}"));
            Error::rank_failed(vec![dst], format!("world rank {dst} is unreachable: {e}"))
        })
    }

    /// Closes the connection to world rank `peer` after it sent something this rank refuses.
    pub fn refuse(&self, peer: u32, reason: &str) {
        self.inbox.mark_failed(peer, format!("refused: {reason}"));
        if let Some(link) = self.links.get(peer) {
            link.close(false);
        }
    }

    /// Tells every peer this process is leaving on purpose, so they do not see a failure.
    pub fn farewell(&self) {
        if self.graceful.load(std::sync::atomic::Ordering::SeqCst) {
            self.links.all().iter().for_each(|(_, l)| l.farewell());
        }
    }

    /// Makes the coming close look like a failure to peers (used by abort).
    pub fn close_abruptly(&self) {
        self.graceful.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Stop watching before the links close, or their closing would look like failures.
        drop(self.watchdog.take());
        let graceful = self.graceful.load(std::sync::atomic::Ordering::SeqCst);
        for (_, link) in self.links.all() {
            link.close(graceful);
        }
    }
}
