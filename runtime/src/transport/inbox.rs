//! The inbox of a world: frames that have arrived but not yet been received, and what this rank
//! knows of its peers' health (lost, departed, lost links others reported, revoked and abandoned
//! operations), which ends the waits that cannot complete.

use crate::sync::{Locked, Waits};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{news, waker, Fault, Frame, Key, TCP_POLL};
use crate::error::{Error, ErrorKind, Result};
use crate::wire::{FrameHeader, FrameKind};

#[derive(Default)]
struct InboxState {
    queues: HashMap<Key, VecDeque<Frame>>,
    /// Emptied queues kept for the next keys: every operation has keys of its own, and a fresh
    /// queue allocates at its first frame.
    spare: Vec<VecDeque<Frame>>,
    /// World ranks this rank lost, with why.
    failed: BTreeMap<u32, Fault>,
    /// World ranks that closed their side on purpose, with the failures they knew of then.
    departed: BTreeMap<u32, Vec<(u32, Fault)>>,
    /// Links other ranks lost: (reporter, lost peer) in world ranks, with the reporter's reason.
    cuts: BTreeMap<(u32, u32), String>,
    /// This rank's own losses not yet told to the peers (see `Inbox::announcements`).
    unannounced: Vec<(u32, Fault)>,
    /// News of other ranks to pass on (see `Inbox::relays`).
    unrelayed: Vec<Relay>,
    /// Revokes and abandoned operations to pass on (see `Inbox::forwards`).
    unforwarded: Vec<Forward>,
    /// Where each peer listens for pulses (see pulse.rs).
    pulse_addrs: BTreeMap<u32, std::net::SocketAddr>,
    /// The world rank of each incarnation this world knows (see [`incarnation`]).
    ranks_of: HashMap<u64, u32>,
    /// Communicators revoked here or by a peer.
    revoked: HashSet<u64>,
    /// Collectives (communicator id, sequence number) that some rank left, with the error it got.
    abandoned: HashMap<(u64, u64), news::Abandoned>,
    /// Frames whose sender withdrew one of them (its operation failed): the rest of them is
    /// dropped, so that no receive takes a later frame for the withdrawn one.
    given_up: HashSet<Key>,
}

/// News that world rank `reporter` lost `faults` (world ranks), to pass on to every link but
/// the one it came on (`via`) and the reporter's.
pub(crate) struct Relay {
    pub reporter: u32,
    pub via: u32,
    pub faults: Vec<(u32, Fault)>,
}

/// A revoke or an abandoned operation another rank told, to pass on to every link but the one
/// it came on (`via`), in a world that connects on demand: their senders tell only the ranks
/// they have links to.
pub(crate) struct Forward {
    pub hdr: FrameHeader,
    pub payload: Vec<u8>,
    pub via: u32,
}

/// Emptied queues kept at most.
const SPARE_QUEUES: usize = 64;

impl InboxState {
    fn push(&mut self, key: Key, frame: Frame) {
        let spare = &mut self.spare;
        self.queues.entry(key).or_insert_with(|| spare.pop().unwrap_or_default()).push_back(frame);
    }

    /// The next frame under `key`; an emptied queue goes back to the spares.
    fn pop(&mut self, key: &Key) -> Option<Frame> {
        let q = self.queues.get_mut(key)?;
        let f = q.pop_front();
        if q.is_empty() {
            if let Some(q) = self.queues.remove(key) {
                if self.spare.len() < SPARE_QUEUES {
                    self.spare.push(q);
                }
            }
        }
        f
    }
}

/// What a waiter may consult to decide that its wait is over.
pub(crate) struct Health<'a> {
    pub failed: &'a BTreeMap<u32, Fault>,
    pub departed: &'a BTreeMap<u32, Vec<(u32, Fault)>>,
    pub cuts: &'a BTreeMap<(u32, u32), String>,
    pub revoked: &'a HashSet<u64>,
    pub abandoned: &'a HashMap<(u64, u64), news::Abandoned>,
    /// Frames waiting for their receives (a wait may look for frames of its own operation from
    /// other senders: see `Ctx::status`).
    pub queues: &'a HashMap<Key, VecDeque<Frame>>,
}

impl InboxState {
    fn health(&self) -> Health<'_> {
        Health {
            failed: &self.failed,
            departed: &self.departed,
            cuts: &self.cuts,
            revoked: &self.revoked,
            abandoned: &self.abandoned,
            queues: &self.queues,
        }
    }
}

/// Frames that have arrived but not yet been received, and what is known of peers' health.
#[derive(Default)]
pub(crate) struct Inbox {
    state: Mutex<InboxState>,
    changed: Condvar,
    /// Bumped on every change (a frame queued, a peer failed or left, a revoke, a wake-up), so
    /// that shared-memory waiters can poll it without taking the lock.
    generation: AtomicU64,
    /// Frames queued now.
    queued: std::sync::atomic::AtomicUsize,
    /// Bumped on every failure, departure, revoke and wake-up: zero while all is well.
    health_changes: AtomicU64,
    /// Threads asleep on `changed`, counted under the lock before they sleep: a push wakes
    /// them only when there are some (a notify is a system call even when nobody waits, and a
    /// receive usually polls for its frame instead of sleeping).
    sleepers: std::sync::atomic::AtomicU32,
    /// Woken when this rank loses a peer, to tell the others (see `heartbeat.rs`).
    announcer: Mutex<Option<Arc<waker::Waker>>>,
    /// News of other ranks is passed on (a world that connects on demand).
    relaying: std::sync::atomic::AtomicBool,
}

/// The error of a wait that needed world rank `rank`, which left on purpose knowing of `news`.
pub(crate) fn departure(rank: u32, news: &[(u32, Fault)]) -> Error {
    let mut msg = format!("world rank {rank} left (it destroyed its communicator) while this rank still needed it");
    if !news.is_empty() {
        let known: Vec<String> = news.iter().map(|(r, f)| format!("world rank {r}: {}", f.reason)).collect();
        msg.push_str(&format!("; it had lost {}", known.join("; ")));
    }
    Error::new(ErrorKind::Remote, msg).with_failed(vec![rank])
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, InboxState> {
        self.state.locked()
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    fn trouble(&self) {
        self.health_changes.fetch_add(1, Ordering::SeqCst);
        self.bump();
    }

    /// Zero as long as no peer failed or left and nothing was revoked or woken: waiters may skip
    /// the health checks that take the lock.
    pub fn health_changes(&self) -> u64 {
        self.health_changes.load(Ordering::SeqCst)
    }

    /// Frames waiting for their receive.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Changes whenever anything in the inbox changes.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    pub fn push(&self, src: u32, frame: Frame) {
        let key = Key { src, kind: frame.hdr.kind, comm_id: frame.hdr.comm_id, seq: frame.hdr.seq };
        let mut st = self.lock();
        if st.given_up.contains(&key) {
            return;
        }
        st.push(key, frame);
        drop(st);
        self.queued.fetch_add(1, Ordering::SeqCst);
        self.bump();
        // A sleeper counted itself under the lock, which this push took after it: the count is
        // seen here. One that counts itself later looked at the queues first, under the lock.
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            self.changed.notify_all();
        }
    }

    /// Sleeps on `changed` for at most `wait`, counted in `sleepers` meanwhile.
    fn sleep<'a>(&self, st: MutexGuard<'a, InboxState>, wait: Duration) -> MutexGuard<'a, InboxState> {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        let st = self.changed.wait_locked_for(st, wait);
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        st
    }

    /// The next frame under `key`, if one is queued.
    pub fn try_take(&self, key: Key) -> Option<Frame> {
        let f = self.lock().pop(&key);
        self.taken(f)
    }

    /// Counts a frame out of the queues.
    fn taken<T>(&self, f: Option<T>) -> Option<T> {
        if f.is_some() {
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
        f
    }

    /// Why a send to `dst` can never complete, if it cannot.
    pub fn peer_gone(&self, dst: u32) -> Option<Error> {
        let st = self.lock();
        if let Some(f) = st.failed.get(&dst) {
            return Some(Error::rank_failed(vec![dst], format!("world rank {dst} failed: {}", f.reason)));
        }
        st.departed.get(&dst).map(|news| departure(dst, news))
    }

    /// Why a wait for a frame from `src` is over without it (the communicator's error, or `src`
    /// left), if it is.
    pub fn ended(&self, src: u32, status: &dyn Fn(&Health<'_>) -> Option<Error>) -> Option<Error> {
        let st = self.lock();
        if let Some(e) = status(&st.health()) {
            return Some(e);
        }
        st.departed.get(&src).map(|news| departure(src, news))
    }

    /// Records that this rank lost world rank `rank`, to be told to every peer (see
    /// [`Inbox::announcements`]). The first fault recorded for a rank stays.
    pub fn mark_failed(&self, rank: u32, fault: Fault) {
        self.record_failure(rank, fault, true);
    }

    /// Records that world rank `rank`'s process exited without destroying its communicator (it
    /// said so: tcp/rx.rs): a failure to whatever needs it, but no crash to warn of.
    pub fn mark_exited(&self, rank: u32) {
        let fault = Fault::sure("its process exited without destroying its communicator");
        self.record_failure(rank, fault, false);
    }

    fn record_failure(&self, rank: u32, fault: Fault, warn: bool) {
        let mut st = self.lock();
        if !st.departed.contains_key(&rank) && !st.failed.contains_key(&rank) {
            match warn {
                true => tracing::warn!(rank, sure = fault.sure, "peer failed: {}", fault.reason),
                false => tracing::info!(rank, "peer left: {}", fault.reason),
            }
            st.failed.insert(rank, fault.clone());
            st.unannounced.push((rank, fault));
        }
        drop(st);
        self.trouble();
        self.changed.notify_all();
        self.wake_announcer();
    }

    /// Records what world rank `reporter` told of its own losses (on the link from `via`): each
    /// lost peer's link to it is cut. In a world that connects on demand, what is new here is
    /// passed on.
    pub fn note_suspects(&self, reporter: u32, faults: Vec<(u64, Fault)>, via: u32) {
        let faults = self.by_rank(faults);
        let relaying = self.relaying.load(Ordering::Relaxed);
        let mut st = self.lock();
        let mut new = Vec::new();
        for (lost, f) in faults {
            if lost != reporter && !st.cuts.contains_key(&(reporter, lost)) {
                st.cuts.insert((reporter, lost), f.reason.clone());
                new.push((lost, f));
            }
        }
        let relay = relaying && !new.is_empty();
        if relay {
            st.unrelayed.push(Relay { reporter, via, faults: new });
        }
        drop(st);
        self.trouble();
        self.changed.notify_all();
        if relay {
            self.wake_announcer();
        }
    }

    /// News of the process `reporter` (an incarnation) that a peer passed on; ignored when this
    /// world does not know it, or it is this rank's own.
    pub fn note_relayed(&self, reporter: u64, faults: Vec<(u64, Fault)>, via: u32) {
        let st = self.lock();
        let Some(&from) = st.ranks_of.get(&reporter) else { return };
        let mine = st.ranks_of.get(&super::incarnation()) == Some(&from);
        drop(st);
        if !mine {
            self.note_suspects(from, faults, via);
        }
    }

    /// Why world rank `rank` is lost to this rank or, as news told, to any other; `None` while
    /// nobody reported it. A rank that leaves right after it lost a peer may say so only in its
    /// goodbye (its watchdog had no turn to send the `Suspect` notice yet): that counts too, or
    /// a dial to a frozen peer would wait for news that has already come.
    pub fn lost_anywhere(&self, rank: u32) -> Option<String> {
        let st = self.lock();
        if let Some(f) = st.failed.get(&rank) {
            return Some(f.reason.clone());
        }
        let cut = st.cuts.iter().find(|((_, lost), _)| *lost == rank);
        if let Some(((by, _), why)) = cut {
            return Some(format!("world rank {by} lost it: {why}"));
        }
        let told = st.departed.iter().find_map(|(by, news)| Some((by, news.iter().find(|(lost, _)| *lost == rank)?)));
        told.map(|(by, (_, f))| format!("world rank {by} left knowing it lost: {}", f.reason))
    }

    /// Passes news of other ranks on from now (see [`Relay`]).
    pub fn set_relaying(&self) {
        self.relaying.store(true, Ordering::Relaxed);
    }

    /// News of other ranks not yet passed on; each is returned once.
    pub fn relays(&self) -> Vec<Relay> {
        std::mem::take(&mut self.lock().unrelayed)
    }

    /// This rank's losses not yet told to the peers; each is returned once.
    pub fn announcements(&self) -> Vec<(u32, Fault)> {
        std::mem::take(&mut self.lock().unannounced)
    }

    /// Every loss known here: this rank's own, the peers others reported lost, and those the
    /// ranks that left named (what a goodbye carries, so that the ranks still waiting learn why
    /// this one leaves, though it learnt of the failure only from another's goodbye).
    pub fn losses(&self) -> Vec<(u32, Fault)> {
        let st = self.lock();
        let mut out: Vec<(u32, Fault)> = st.failed.iter().map(|(r, f)| (*r, f.clone())).collect();
        for ((by, lost), why) in &st.cuts {
            if !st.failed.contains_key(lost) && !out.iter().any(|(r, _)| r == lost) {
                out.push((*lost, Fault::cut(format!("world rank {by} lost it: {why}"))));
            }
        }
        for (lost, f) in st.departed.values().flatten() {
            if !out.iter().any(|(r, _)| r == lost) {
                out.push((*lost, f.clone()));
            }
        }
        out
    }

    /// What wakes the thread that tells peers of this rank's losses (see `heartbeat.rs`).
    pub fn set_announcer(&self, waker: Arc<waker::Waker>) {
        *self.announcer.locked() = Some(waker);
    }

    fn wake_announcer(&self) {
        if let Some(w) = self.announcer.locked().as_ref() {
            w.wake();
        }
    }

    /// Records who world rank `peer` is (its incarnation) and where it listens for pulses.
    pub fn note_intro(&self, peer: u32, id: u64, pulse: Option<std::net::SocketAddr>) {
        let mut st = self.lock();
        st.ranks_of.insert(id, peer);
        if let Some(addr) = pulse {
            st.pulse_addrs.insert(peer, addr);
        }
    }

    /// The world rank of incarnation `id`, if known here.
    pub fn rank_of(&self, id: u64) -> Option<u32> {
        self.lock().ranks_of.get(&id).copied()
    }

    /// The incarnation of world rank `rank`, if known here.
    pub fn id_of(&self, rank: u32) -> Option<u64> {
        self.lock().ranks_of.iter().find(|(_, r)| **r == rank).map(|(id, _)| *id)
    }

    /// `faults` with their processes named by incarnation (for news to peers).
    pub fn by_id(&self, faults: Vec<(u32, Fault)>) -> Vec<(u64, Fault)> {
        let st = self.lock();
        faults
            .into_iter()
            .filter_map(|(r, f)| st.ranks_of.iter().find(|(_, w)| **w == r).map(|(id, _)| (*id, f)))
            .collect()
    }

    /// `faults` from a peer's news with their processes named by world rank here (those this
    /// world does not know are left out).
    pub fn by_rank(&self, faults: Vec<(u64, Fault)>) -> Vec<(u32, Fault)> {
        let st = self.lock();
        faults.into_iter().filter_map(|(id, f)| Some((*st.ranks_of.get(&id)?, f))).collect()
    }

    /// Where each peer's pulses come from, by world rank.
    pub fn pulse_ranks(&self) -> Vec<(u32, std::net::SocketAddr)> {
        self.lock().pulse_addrs.iter().map(|(r, a)| (*r, *a)).collect()
    }

    pub fn revoke(&self, comm_id: u64) {
        self.lock().revoked.insert(comm_id);
        self.trouble();
        self.changed.notify_all();
    }

    /// A `Revoke` frame from world rank `via`.
    pub fn note_revoke(&self, via: u32, hdr: FrameHeader) {
        let fresh = self.lock().revoked.insert(hdr.comm_id);
        self.trouble();
        self.changed.notify_all();
        if fresh {
            self.forward(Forward { hdr, payload: Vec::new(), via });
        }
    }

    /// Queues `f` to be passed on, in a world that connects on demand.
    fn forward(&self, f: Forward) {
        if self.relaying.load(Ordering::Relaxed) {
            self.lock().unforwarded.push(f);
            self.wake_announcer();
        }
    }

    /// Revokes and abandoned operations not yet passed on; each is returned once.
    pub fn forwards(&self) -> Vec<Forward> {
        std::mem::take(&mut self.lock().unforwarded)
    }

    /// Records that collective `seq` of communicator `comm_id` was left by some rank (this one
    /// or, told by an `Abandon` frame, another): every wait of it ends with that error. False
    /// when it was known already.
    pub fn mark_abandoned(&self, comm_id: u64, seq: u64, why: news::Abandoned) -> bool {
        let fresh = match self.lock().abandoned.entry((comm_id, seq)) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(why);
                true
            }
        };
        if fresh {
            self.trouble();
            self.changed.notify_all();
        }
        fresh
    }

    /// An `Abandon` frame from world rank `peer` (see `wire::FrameKind::Abandon`).
    pub fn note_abandon(&self, peer: u32, hdr: FrameHeader, payload: &[u8]) {
        match news::decode_abandon(payload, &|id| self.rank_of(id)) {
            Some(why) => {
                tracing::debug!(peer, comm = hdr.comm_id, seq = hdr.seq, "operation abandoned: {}", why.message);
                if self.mark_abandoned(hdr.comm_id, hdr.seq, why) {
                    self.forward(Forward { hdr, payload: payload.to_vec(), via: peer });
                }
            }
            None => tracing::warn!(peer, "ignored a malformed abandon frame"),
        }
    }

    /// Forgets the abandoned operations of a communicator that no longer exists here.
    fn forget_abandoned(st: &mut InboxState, comm_id: u64) {
        st.abandoned.retain(|k, _| k.0 != comm_id);
    }

    /// Records that world rank `rank` closed its side on purpose, knowing of `news`.
    pub fn mark_departed(&self, rank: u32, news: Vec<(u64, Fault)>) {
        let news = self.by_rank(news);
        let mut st = self.lock();
        if !st.failed.contains_key(&rank) {
            st.departed.insert(rank, news);
        }
        drop(st);
        self.trouble();
        self.changed.notify_all();
    }

    /// Records that the sender of `key`'s frames withdrew one of them: its operation failed.
    /// What is queued under `key` and whatever arrives later is dropped, and waiters look.
    pub fn give_up(&self, key: Key) {
        let mut st = self.lock();
        if !st.given_up.insert(key) {
            return;
        }
        let dropped = st.queues.remove(&key).map_or(0, |q| q.len());
        drop(st);
        self.queued.fetch_sub(dropped, Ordering::SeqCst);
        self.trouble();
        self.changed.notify_all();
    }

    /// True once [`Inbox::give_up`] was called for `key`.
    pub fn given_up(&self, key: Key) -> bool {
        self.lock().given_up.contains(&key)
    }

    /// Drops frames queued for a communicator that no longer exists here.
    pub fn purge(&self, comm_id: u64) {
        let mut st = self.lock();
        st.given_up.retain(|k| k.comm_id != comm_id);
        Inbox::forget_abandoned(&mut st, comm_id);
        let mut dropped = 0;
        st.queues.retain(|k, q| {
            let keep = k.comm_id != comm_id;
            if !keep {
                dropped += q.len();
            }
            keep
        });
        self.queued.fetch_sub(dropped, Ordering::SeqCst);
    }

    /// Wakes every waiter so it re-checks its communicator's state (abort, revoke).
    pub fn wake_all(&self) {
        let _guard = self.lock();
        self.trouble();
        self.changed.notify_all();
    }

    /// True when world rank `rank` closed its side on purpose.
    pub fn has_departed(&self, rank: u32) -> bool {
        self.lock().departed.contains_key(&rank)
    }

    /// Why world rank `rank` failed, if it did.
    pub fn failed_reason(&self, rank: u32) -> Option<String> {
        self.lock().failed.get(&rank).map(|f| f.reason.clone())
    }

    /// The sender and header of a frame of `kind` for (`comm_id`, `seq`) waiting in the inbox,
    /// from any sender, if one does.
    pub fn any_frame(&self, kind: FrameKind, comm_id: u64, seq: u64) -> Option<(u32, FrameHeader)> {
        if self.queued() == 0 {
            return None;
        }
        let st = self.lock();
        st.queues.iter().find_map(|(k, q)| {
            (k.kind == kind && k.comm_id == comm_id && k.seq == seq)
                .then(|| q.front().map(|f| (k.src, f.hdr)))
                .flatten()
        })
    }

    /// Whether a frame of `kind` from world rank `src` for `comm_id` waits in the inbox.
    pub fn holds_from(&self, src: u32, kind: FrameKind, comm_id: u64) -> bool {
        self.queued() > 0
            && self
                .lock()
                .queues
                .iter()
                .any(|(k, q)| k.src == src && k.kind == kind && k.comm_id == comm_id && !q.is_empty())
    }

    /// Whether a frame under `key` waits in the inbox.
    pub fn has_queued(&self, key: &Key) -> bool {
        self.lock().queues.get(key).is_some_and(|q| !q.is_empty())
    }

    /// What `status` says of the inbox's health now (see [`Inbox::take`]).
    pub fn status(&self, status: &dyn Fn(&Health<'_>) -> Option<Error>) -> Option<Error> {
        let st = self.lock();
        status(&st.health())
    }

    pub fn failed(&self) -> BTreeMap<u32, Fault> {
        self.lock().failed.clone()
    }

    /// How many peers have failed or left so far, and links other ranks lost (the agreement
    /// re-plans when this grows).
    pub fn gone_count(&self) -> usize {
        let st = self.lock();
        st.failed.len() + st.departed.len() + st.cuts.len()
    }

    /// Runs `f` on the current health (failed peers, revoked communicators).
    pub fn health<R>(&self, f: impl FnOnce(&Health<'_>) -> R) -> R {
        let st = self.lock();
        f(&st.health())
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
                let f = st.pop(&key);
                return self.taken(f).map(|f| (key.src, f));
            }
            let now = Instant::now();
            if now >= deadline || st.failed.len() + st.departed.len() + st.cuts.len() != planned_with {
                return None;
            }
            st = self.sleep(st, deadline - now);
        }
    }

    /// Waits for the next frame under `key`. Before each sleep `status` may end the wait with the
    /// communicator's error (aborted, a member failed); the wait never outlasts `timeout`.
    /// It first polls for up to TCP_POLL through `poll` (a budget and the test of a change in
    /// the inbox; see [`Link::poll`]).
    pub fn take(
        &self,
        key: Key,
        timeout: Duration,
        status: &dyn Fn(&Health<'_>) -> Option<Error>,
        poll: &dyn Fn(Duration, &dyn Fn() -> bool) -> bool,
    ) -> Result<Frame> {
        let deadline = Instant::now() + timeout;
        let poll_end = Instant::now() + TCP_POLL.min(timeout);
        let mut looked_last = false;
        let mut st = self.lock();
        loop {
            if let Some(f) = st.pop(&key) {
                self.queued.fetch_sub(1, Ordering::SeqCst);
                return Ok(f);
            }
            if let Some(e) = status(&st.health()) {
                return Err(e);
            }
            // A peer's goodbye comes after every frame it sent on this connection: none is left.
            if let Some(news) = st.departed.get(&key.src) {
                return Err(departure(key.src, news));
            }
            let now = Instant::now();
            if now < poll_end {
                // Without the lock (the reader threads push under it): any change in the inbox
                // sends us back to look.
                let seen = self.generation();
                drop(st);
                poll(poll_end - now, &|| self.generation() != seen);
                st = self.lock();
                continue;
            }
            // One more look before sleeping: a link's reader thread may stand aside while
            // receives poll (TcpLink::poll), and only a poll that ends without a frame wakes it.
            // After a last poll that did see a change (another frame), the reader would sleep on
            // until its nap ends while this receive waits for it: 16 ms stalls in a 4-rank TCP
            // allreduce of 256 KiB. The loop then looks at the inbox again under the lock before
            // it sleeps.
            if !looked_last {
                let seen = self.generation();
                drop(st);
                looked_last = !poll(Duration::ZERO, &|| self.generation() != seen);
                st = self.lock();
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::timeout(format!(
                    "no message from world rank {} within {} ms (HCCN_TIMEOUT_MS)",
                    key.src,
                    timeout.as_millis()
                )));
            }
            let wait = deadline.saturating_duration_since(now).max(Duration::from_millis(1));
            st = self.sleep(st, wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_goodbye_names_the_failures_the_departed_told_of() {
        // World rank 5 left knowing that rank 7 was killed; this rank never heard of it
        // directly. Its own goodbye must still name rank 7: ranks waiting for it learn the
        // cause, not "rank 3 left".
        let inbox = Inbox::default();
        inbox.note_intro(5, 0x55, None);
        inbox.note_intro(7, 0x77, None);
        inbox.mark_departed(5, vec![(0x77, Fault::sure("connection closed without a goodbye"))]);
        let losses = inbox.losses();
        assert_eq!(losses.len(), 1, "{losses:?}");
        assert_eq!(losses[0].0, 7);
        assert!(losses[0].1.sure);
        // A failure this rank saw itself is told once, in its own words.
        inbox.mark_failed(7, Fault::cut("silent for 900 ms"));
        let losses = inbox.losses();
        assert_eq!(losses.len(), 1, "{losses:?}");
        assert_eq!(losses[0].1.reason, "silent for 900 ms");
    }

    #[test]
    fn a_loss_named_only_in_a_goodbye_is_known_lost() {
        // Rank 0 lost rank 5 and left at once, before its watchdog sent the notice: only its
        // goodbye said so. A dial to rank 5 (frozen: its kernel takes the connection, nobody
        // answers) gives up on this, not at its own timeout.
        let inbox = Inbox::default();
        inbox.note_intro(0, 0x10, None);
        inbox.note_intro(5, 0x55, None);
        assert_eq!(inbox.lost_anywhere(5), None);
        inbox.mark_departed(0, vec![(0x55, Fault::cut("silent for 830 ms"))]);
        let why = inbox.lost_anywhere(5).unwrap_or_default();
        assert!(why.contains("world rank 0") && why.contains("silent for 830 ms"), "{why}");
        assert_eq!(inbox.lost_anywhere(0), None, "a rank that left is not lost");
    }
}
