//! Communicators: a set of ranks over a shared [`Net`], with their own id, sequence numbers
//! and failure state. Groups and splits are new communicators over the parent's connections.

pub(crate) mod agree;
#[cfg(any(test, feature = "test-support"))]
pub mod agree_sim;
mod group;
mod group_intents;
mod init;
pub(crate) mod join;
mod linkcost;
mod membership;
mod precheck;
mod refuse;
mod shrink;
#[cfg(any(test, feature = "test-support"))]
pub mod sim;
mod typed;
pub(crate) mod view;
// What the algorithm selection would do, for tools.
mod plan;

use crate::sync::Locked;
use std::collections::HashMap;

pub(crate) use crate::collectives::team::{Setup, Team, BROKEN_MARK};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

pub use init::new_unique_id;
pub use typed::Element;

use crate::collectives::check::{self, Shape};
use crate::collectives::{self, Ctx, Op, Work};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::Stream;
use crate::transport::Net;
use crate::wire::FrameKind;

/// Where a world communicator was formed, so that it can admit replacement ranks later.
pub(crate) struct Origin {
    pub store: crate::rendezvous::StoreAddr,
    /// The store outlives the ranks (hccnrun's or etcd), unlike a unique id's, which lives in
    /// one rank's process: membership decisions are recorded there.
    pub durable: bool,
    pub token: Vec<u8>,
    /// The world's key prefix in the store.
    pub prefix: String,
    pub cfg: crate::config::Config,
    /// What lives exactly as long as the world's communicators in this process (init.rs): the
    /// embedded store of a unique id made here, the process's presence in an etcd job's run.
    pub keep: Mutex<Vec<Box<dyn Send>>>,
}

/// A communicator's own state: its team (what the collectives run on) and what only the
/// communicator needs.
pub(crate) struct CommInner {
    team: Team,
    coll_seq: AtomicU64,
    /// Next sequence number of messages to (`.0`) and from (`.1`) each peer.
    p2p_seq: Mutex<(Vec<u64>, Vec<u64>)>,
    group_seq: Mutex<HashMap<Vec<u32>, u64>>,
    /// The lists other members passed to group creations (group_intents.rs).
    group_intents: Mutex<group_intents::Known>,
    group_mailbox: std::sync::OnceLock<Arc<CommInner>>,
    split_seq: AtomicU64,
    /// The agreement on the next epoch, kept across calls: a shrink that ran out of time
    /// continues where it stopped when called again.
    agreement: Mutex<Option<agree::Agreement>>,
    /// Set on world communicators (and what shrink and rebuild make of them).
    pub origin: Option<Arc<Origin>>,
    /// This communicator's membership key, on stores with leases.
    member: membership::MemberSlot,
    /// Set while a thread is in a blocking call on this communicator.
    in_use: AtomicBool,
}

impl std::ops::Deref for CommInner {
    type Target = Team;

    fn deref(&self) -> &Team {
        &self.team
    }
}

/// A communicator. Clones share it; it lives until the last clone and the last queued
/// operation are gone.
#[derive(Clone)]
pub struct Communicator {
    inner: Arc<CommInner>,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("id", &format_args!("{:016x}", self.inner.id))
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.members.len())
            .finish()
    }
}

/// A stable 64-bit id from labelled parts.
pub(crate) fn derive_id(parts: &[&[u8]]) -> u64 {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    let d = h.finalize();
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

impl CommInner {
    fn new(net: Arc<Net>, id: u64, epoch: u64, rank: u32, members: Vec<u32>, setup: Setup) -> Self {
        let n = members.len();
        CommInner {
            team: Team::new(net, id, epoch, rank, members, setup),
            coll_seq: AtomicU64::new(0),
            p2p_seq: Mutex::new((vec![0; n], vec![0; n])),
            group_seq: Mutex::new(HashMap::new()),
            group_intents: Mutex::new(group_intents::Known::default()),
            group_mailbox: std::sync::OnceLock::new(),
            split_seq: AtomicU64::new(0),
            agreement: Mutex::new(None),
            origin: None,
            member: membership::MemberSlot::default(),
            in_use: AtomicBool::new(false),
        }
    }

    pub fn with_origin(mut self, origin: Option<Arc<Origin>>) -> Self {
        self.origin = origin;
        self
    }

    /// Whether this communicator's membership decisions are recorded in a store that outlives
    /// its ranks (then the first side of an even split to record its decision goes on).
    pub(crate) fn store_decides(&self) -> bool {
        self.origin.as_ref().is_some_and(|o| o.durable)
    }

    /// What this rank knows of who reaches whom among the members: the ones it lost (surely
    /// dead, or only cut off from it), the ones that left, and the links others reported lost.
    pub(crate) fn knowledge(&self) -> view::Knowledge {
        let mut k = view::Knowledge::default();
        self.net.inbox.health(|h| {
            for (r, w) in self.members.iter().enumerate() {
                let r = r as u32;
                match h.failed.get(w) {
                    Some(f) if f.sure => {
                        k.dead.insert(r);
                    }
                    Some(_) => k.cut(self.rank, r),
                    None if h.departed.contains_key(w) => {
                        k.dead.insert(r);
                    }
                    None => {}
                }
            }
            for ((a, b), _) in h.cuts.iter() {
                if let (Some(a), Some(b)) = (self.rank_of(*a), self.rank_of(*b)) {
                    k.cut(a, b);
                }
            }
        });
        k
    }

    /// Holds the communicator for this thread's blocking call, or fails with `Busy` when another
    /// thread is in one: one atomic exchange, no lock.
    pub(crate) fn enter(&self) -> Result<Alone<'_>> {
        if !self.in_use.swap(true, Ordering::Acquire) {
            return Ok(Alone(&self.in_use));
        }
        // The call in progress may already be paired with another thread's call on another rank:
        // it fails too, and so does every later one, on every rank, rather than risk a quiet
        // wrong result (the communicator can still be shrunk).
        let e = Error::new(
            ErrorKind::Busy,
            format!(
                "two threads made blocking calls on this communicator at once (rank {}): calls of two threads pair up \
                 with the wrong calls of the other ranks; {BROKEN_MARK} (one communicator, one thread at a time)",
                self.rank
            ),
        );
        self.tell_abandoned(self.coll_seq.load(Ordering::SeqCst), &e, true);
        Err(e)
    }

    /// Whether an operation may start (see [`CommInner::status_of`]).
    fn check_state(&self) -> Result<()> {
        self.check(false)
    }

    fn check(&self, departures: bool) -> Result<()> {
        // The common case costs three loads: nothing failed, left or was revoked anywhere, and
        // no operation of this rank met a failure.
        let calm = self.net.inbox.health_changes() == 0 && !self.aborted.load(Ordering::Relaxed);
        if calm && self.failed_here().is_none() {
            return Ok(());
        }
        match self.net.inbox.health(|h| self.status_of(h, departures)) {
            Some(e) => Err(e),
            None => self.failed_here().map_or(Ok(()), |e| Err(e.clone())),
        }
    }

    fn next_p2p(&self, is_send: bool, peer: u32) -> u64 {
        let mut s = self.p2p_seq.locked();
        let v = if is_send { &mut s.0 } else { &mut s.1 };
        let seq = v[peer as usize];
        v[peer as usize] += 1;
        seq
    }
}

impl Drop for CommInner {
    fn drop(&mut self) {
        // Frames that arrive later for this id stay until the connections close; that is
        // bounded by what peers send before they notice.
        self.net.inbox.purge(self.id);
        // Destroying a communicator is a natural point to have the trace on disk (HCCN_TRACE).
        crate::trace::flush();
    }
}

impl Communicator {
    fn from_inner(inner: CommInner) -> Self {
        Communicator { inner: Arc::new(inner) }
    }

    pub fn rank(&self) -> u32 {
        self.inner.rank
    }

    pub fn size(&self) -> u32 {
        self.inner.members.len() as u32
    }

    pub fn epoch(&self) -> u64 {
        self.inner.epoch
    }

    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The host of every rank, as indices 0, 1, ... in order of first appearance; `None` when
    /// some member's host is unknown (ranks admitted by a rebuild).
    pub fn hosts(&self) -> Option<Vec<u32>> {
        self.inner.hosts().map(<[u32]>::to_vec)
    }

    /// The host index of `rank` (see [`Communicator::hosts`]).
    pub fn host_of(&self, rank: u32) -> Option<u32> {
        self.inner.host_of(rank)
    }

    /// How many hosts the ranks span (1 when unknown).
    pub fn host_count(&self) -> usize {
        self.inner.host_count()
    }

    /// The transport that carries this rank's data to `rank`: `"shm"`, `"tcp"` or `"self"`.
    pub fn transport_to(&self, rank: u32) -> &'static str {
        match self.inner.members.get(rank as usize) {
            Some(w) => self.inner.net.transport(*w),
            None => "none",
        }
    }

    /// What this rank's process holds and sends (see [`crate::Usage`]).
    pub fn usage(&self) -> crate::Usage {
        self.inner.net.usage()
    }

    /// Members whose process died, left, or became unreachable (from this rank or from another
    /// member), in this communicator's ranks.
    pub fn failed_ranks(&self) -> Vec<u32> {
        self.inner.unhealthy()
    }

    /// The communicator's error state: a failed member, an abort, or the first error an
    /// operation met; `Ok` when healthy.
    pub fn async_error(&self) -> Result<()> {
        self.inner.check(true)?;
        match self.inner.async_error.locked().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Fails every pending and later operation on this communicator with `Aborted`; when the
    /// last communicator over these connections goes, peers see this rank as failed.
    pub fn abort(&self) {
        self.inner.aborted.store(true, Ordering::SeqCst);
        self.inner.net.close_abruptly();
        self.inner.net.inbox.wake_all();
    }

    /// Checks `op` on the one validating path, then runs it now (`stream == None`) or queues it
    /// on `stream` and returns at once. A blocking call made while another thread is in one on
    /// this communicator fails at once with `Busy` (calls would pair up across threads).
    /// Send and Recv are exempt: they pair by peer and per-peer sequence, taken under a lock, so
    /// a blocking receive in a stream callback may run while a stream's collective does (as MPI
    /// point-to-point under `MPI_THREAD_MULTIPLE`).
    ///
    /// # Safety
    /// Every buffer in `op` must be valid for the bytes the operation reads or writes (as in
    /// docs/c-api.md) until it completes: until return without a stream, or until the stream has
    /// run it.
    pub unsafe fn submit(&self, op: Op, stream: Option<&Stream>) -> Result<()> {
        let point_to_point = matches!(op, Op::Send { .. } | Op::Recv { .. });
        let _alone = if stream.is_none() && !point_to_point { Some(self.inner.enter()?) } else { None };
        // SAFETY: the caller's promise, passed on.
        unsafe { self.submit_entered(op, stream) }
    }

    /// [`Communicator::submit`] for a caller that already holds the communicator (a shrink or
    /// split that runs collectives of its own).
    ///
    /// # Safety
    /// As [`Communicator::submit`].
    pub(crate) unsafe fn submit_entered(&self, op: Op, stream: Option<&Stream>) -> Result<()> {
        self.inner.check_state()?;
        let shape = Shape { rank: self.rank(), size: self.size() };
        let fp = collectives::fingerprint::of(&op);
        let work = match check::validate(&op, &shape, &mut |is_send, peer| self.inner.next_p2p(is_send, peer)) {
            Ok(work) => work,
            Err(refusal) => return Err(self.refuse(&op, fp, refusal, stream)),
        };
        // Every collective takes its number, count 0 too: it still checks that the other ranks
        // made the same call.
        let (kind, seq) = match work {
            Work::Send { seq, .. } | Work::Recv { seq, .. } => (FrameKind::P2p, seq),
            _ => (FrameKind::Collective, self.inner.coll_seq.fetch_add(1, Ordering::SeqCst)),
        };
        let turn = if kind == FrameKind::Collective { self.inner.board.turn_for(&fp) } else { None };
        let plan = Planned { kind, seq, turn, fp };
        match stream {
            // SAFETY: the caller's promise covers the buffers until we return.
            None => unsafe { plan.run(&self.inner, &work) },
            Some(s) => {
                let inner = self.inner.clone();
                // SAFETY: the caller's promise covers the buffers until the stream runs the job.
                s.enqueue(Box::new(move || unsafe { plan.run(&inner, &work) }))
            }
        }
    }
}

/// What was decided for a checked operation at submit time, alike on every rank (the operation
/// itself stays where it was checked: a blocking call moves nothing).
#[derive(Clone, Copy)]
struct Planned {
    kind: FrameKind,
    seq: u64,
    /// Its board turn (see collectives/board.rs).
    turn: Option<u64>,
    fp: crate::wire::Fingerprint,
}

impl Planned {
    /// Runs `work` as planned; when it fails on this rank, tells the other members (see
    /// [`CommInner::abandon`]).
    ///
    /// # Safety
    /// As [`collectives::execute`].
    unsafe fn run(&self, inner: &CommInner, work: &Work) -> Result<()> {
        let ctx = Ctx::new(inner, self.kind, self.seq).with_turn(self.turn).with_fingerprint(&self.fp);
        // SAFETY: the caller's promise, passed on.
        let mut r = unsafe { collectives::execute(&ctx, work) };
        if r.is_ok() && inner.net.inbox.health_changes() != 0 {
            // Done here, but another rank (or thread) gave it up meanwhile: its result is not
            // to be trusted.
            if let Some(e) = inner.net.inbox.health(|h| inner.abandoned(h, self.kind, self.seq)) {
                r = Err(e);
            }
        }
        if let (Err(e), FrameKind::Collective) = (&r, self.kind) {
            inner.abandon(self.seq, e);
            if e.kind() == ErrorKind::RankFailed {
                // Not every wait meets its failure through `translate` (the board's do not).
                inner.remember(e);
            }
        }
        r
    }
}

/// Holds a communicator for one thread's blocking call (see [`CommInner::enter`]).
pub(crate) struct Alone<'a>(&'a AtomicBool);

impl Drop for Alone<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}
