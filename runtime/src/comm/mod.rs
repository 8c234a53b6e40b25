//! Communicators: a set of ranks over a shared [`Net`], with their own id, sequence numbers
//! and failure state. Groups and splits are new communicators over the parent's connections.

pub(crate) mod agree;
pub mod agree_sim;
mod group;
mod init;
pub(crate) mod join;
mod membership;
mod precheck;
mod shrink;
mod typed;
// What the algorithm selection would do, for tools.
mod plan;

use std::collections::{BTreeMap, HashMap};

use crate::transport::Health;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

pub use init::new_unique_id;
pub use typed::Element;

use crate::collectives::board::BoardCell;
use crate::collectives::check::{self, Shape};
use crate::collectives::runahead::RunAhead;
use crate::collectives::{self, Ctx, Op, Work};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::Stream;
use crate::transport::Net;
use crate::wire::FrameKind;

/// Where a world communicator was formed, so that it can admit replacement ranks later.
pub(crate) struct Origin {
    pub store: crate::rendezvous::StoreAddr,
    pub token: Vec<u8>,
    /// The world's key prefix in the store.
    pub prefix: String,
    pub cfg: crate::config::Config,
    /// What lives exactly as long as the world's communicators in this process (init.rs): the
    /// embedded store of a unique id made here, the process's presence in an etcd job's run.
    pub keep: Mutex<Vec<Box<dyn Send>>>,
}

pub(crate) struct CommInner {
    pub net: Arc<Net>,
    pub id: u64,
    pub epoch: u64,
    pub rank: u32,
    /// World rank of each communicator rank.
    pub members: Vec<u32>,
    pub timeout: Duration,
    pub chunk_bytes: usize,
    coll_seq: AtomicU64,
    /// Next sequence number of messages to (`.0`) and from (`.1`) each peer.
    p2p_seq: Mutex<(Vec<u64>, Vec<u64>)>,
    group_seq: Mutex<HashMap<Vec<u32>, u64>>,
    split_seq: AtomicU64,
    shrink_seq: AtomicU64,
    aborted: AtomicBool,
    async_error: Mutex<Option<Error>>,
    /// Set on world communicators (and what shrink and rebuild make of them).
    pub origin: Option<Arc<Origin>>,
    /// This communicator's membership key, on stores with leases.
    member: membership::MemberSlot,
    /// Host index of each member (see [`CommInner::hosts`]).
    hosts: Option<Vec<u32>>,
    /// The shared-memory board of the smallest allreduces, when all members share a host.
    pub board: BoardCell,
    /// Which rooted operations end with a barrier.
    runahead: RunAhead,
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

/// Host indices of `members` from the net's host ids (see [`CommInner::hosts`]).
fn host_layout(net: &Net, members: &[u32]) -> Option<Vec<u32>> {
    let mut seen: Vec<crate::transport::shm::HostId> = Vec::new();
    members
        .iter()
        .map(|w| {
            let id = net.hosts.get(*w as usize).copied().flatten()?;
            Some(match seen.iter().position(|s| *s == id) {
                Some(i) => i as u32,
                None => {
                    seen.push(id);
                    seen.len() as u32 - 1
                }
            })
        })
        .collect()
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
    fn new(
        net: Arc<Net>,
        id: u64,
        epoch: u64,
        rank: u32,
        members: Vec<u32>,
        timeout: Duration,
        chunk_bytes: usize,
    ) -> Self {
        let n = members.len();
        let hosts = host_layout(&net, &members);
        let shared_host = hosts.as_ref().is_some_and(|h| h.iter().all(|&x| x == 0));
        let board = BoardCell::new(
            n as u32,
            shared_host,
            net.transport != crate::config::Transport::Tcp,
            net.algo == crate::collectives::select::AlgoChoice::Auto,
            net.board_bytes,
        );
        CommInner {
            net,
            id,
            epoch,
            rank,
            members,
            timeout,
            chunk_bytes,
            coll_seq: AtomicU64::new(0),
            p2p_seq: Mutex::new((vec![0; n], vec![0; n])),
            group_seq: Mutex::new(HashMap::new()),
            split_seq: AtomicU64::new(0),
            shrink_seq: AtomicU64::new(0),
            aborted: AtomicBool::new(false),
            async_error: Mutex::new(None),
            origin: None,
            member: membership::MemberSlot::default(),
            hosts,
            board,
            runahead: RunAhead::default(),
        }
    }

    /// The host of every member, as indices 0, 1, ... in order of first appearance (member 0 is
    /// on host 0), so that every member computes the same layout; `None` when the host of some
    /// member is unknown here (ranks admitted by a rebuild), in which case every member sees
    /// `None` too. Algorithms and the cost model may rely on this being identical everywhere.
    pub fn hosts(&self) -> Option<&[u32]> {
        self.hosts.as_deref()
    }

    /// The host index of communicator rank `rank` (see [`CommInner::hosts`]).
    pub fn host_of(&self, rank: u32) -> Option<u32> {
        self.hosts.as_ref().and_then(|h| h.get(rank as usize).copied())
    }

    /// How many hosts the members span (1 when unknown).
    pub fn host_count(&self) -> usize {
        self.hosts.as_ref().and_then(|h| h.iter().max()).map_or(1, |m| *m as usize + 1)
    }

    pub fn with_origin(mut self, origin: Option<Arc<Origin>>) -> Self {
        self.origin = origin;
        self
    }

    /// Failed members, in communicator ranks, from the net's failed world ranks.
    fn failed_members(&self, failed: &BTreeMap<u32, String>) -> Vec<(u32, String)> {
        self.members.iter().enumerate().filter_map(|(r, w)| failed.get(w).map(|why| (r as u32, why.clone()))).collect()
    }

    /// The error every operation gets now, if any (aborted, revoked, or a member failed).
    pub fn status(&self, health: &Health<'_>) -> Option<Error> {
        if self.aborted.load(Ordering::SeqCst) {
            return Some(Error::new(ErrorKind::Aborted, "the communicator was aborted"));
        }
        if health.revoked.contains(&self.id) {
            return Some(Error::new(ErrorKind::Revoked, "the communicator was revoked; shrink or destroy it"));
        }
        let dead = self.failed_members(health.failed);
        if dead.is_empty() {
            return None;
        }
        let ranks: Vec<u32> = dead.iter().map(|(r, _)| *r).collect();
        let detail: Vec<String> = dead.iter().map(|(r, why)| format!("rank {r}: {why}")).collect();
        Some(Error::rank_failed(ranks, format!("communicator member failed ({})", detail.join("; "))))
    }

    /// Members that failed or left (destroyed their side), in communicator ranks: neither will
    /// take part in an agreement.
    pub(crate) fn gone_now(&self) -> Vec<u32> {
        let gone = self.net.inbox.gone();
        self.members.iter().enumerate().filter(|(_, w)| gone.contains(w)).map(|(r, _)| r as u32).collect()
    }

    fn check_state(&self) -> Result<()> {
        // The common case costs two loads: nothing failed, left or was revoked anywhere.
        if self.net.inbox.troubles() == 0 && !self.aborted.load(Ordering::Relaxed) {
            return Ok(());
        }
        match self.net.inbox.health(|h| self.status(h)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Rewrites transport errors in this communicator's terms and remembers the first one.
    pub fn translate(&self, e: Error) -> Error {
        let e = match e.kind() {
            ErrorKind::RankFailed => self.net.inbox.health(|h| self.status(h)).unwrap_or(e),
            _ => e,
        };
        let mut slot = self.async_error.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() && e.kind() != ErrorKind::Timeout {
            *slot = Some(e.clone());
        }
        e
    }

    fn next_p2p(&self, is_send: bool, peer: u32) -> u64 {
        let mut s = self.p2p_seq.lock().unwrap_or_else(|p| p.into_inner());
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

    /// Members whose process died or became unreachable, in this communicator's ranks.
    pub fn failed_ranks(&self) -> Vec<u32> {
        self.inner.failed_members(&self.net_failed()).into_iter().map(|(r, _)| r).collect()
    }

    fn net_failed(&self) -> BTreeMap<u32, String> {
        self.inner.net.inbox.failed()
    }

    /// The communicator's error state: a failed member, an abort, or the first error an
    /// operation met; `Ok` when healthy.
    pub fn async_error(&self) -> Result<()> {
        self.inner.check_state()?;
        match self.inner.async_error.lock().unwrap_or_else(|p| p.into_inner()).clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Tells the peers that this process is exiting on purpose (it will not send again), so
    /// that they finish what they can instead of seeing a failed rank. For exit hooks.
    pub fn farewell(&self) {
        self.inner.net.farewell();
    }

    /// Fails every pending and later operation on this communicator with `Aborted`; when the
    /// last communicator over these connections goes, peers see this rank as failed.
    pub fn abort(&self) {
        self.inner.aborted.store(true, Ordering::SeqCst);
        self.inner.net.close_abruptly();
        self.inner.net.inbox.wake_all();
    }

    /// Checks `op` on the one validating path, then runs it now (`stream == None`) or queues it
    /// on `stream` and returns at once.
    ///
    /// # Safety
    /// Every buffer in `op` must be valid for the bytes the operation reads or writes (as in
    /// API.md) until it completes: until return without a stream, or until the stream has run it.
    pub unsafe fn submit(&self, op: Op, stream: Option<&Stream>) -> Result<()> {
        self.inner.check_state()?;
        let shape = Shape { rank: self.rank(), size: self.size() };
        let work = check::validate(&op, &shape, &mut |is_send, peer| self.inner.next_p2p(is_send, peer))?;
        let (kind, seq) = match work {
            Work::Send { seq, .. } | Work::Recv { seq, .. } => (FrameKind::P2p, seq),
            Work::Nothing => (FrameKind::Collective, 0),
            _ => (FrameKind::Collective, self.inner.coll_seq.fetch_add(1, Ordering::SeqCst)),
        };
        let turn = self.inner.board.turn_for(&work);
        let settle =
            self.inner.runahead.settles(&work, self.size()).then(|| self.inner.coll_seq.fetch_add(1, Ordering::SeqCst));
        match stream {
            // SAFETY: the caller's promise covers the buffers until we return.
            None => unsafe { run_settled(&self.inner, kind, seq, turn, &work, settle) },
            Some(s) => {
                let inner = self.inner.clone();
                // SAFETY: the caller's promise covers the buffers until the stream runs the job.
                s.enqueue(Box::new(move || unsafe { run_settled(&inner, kind, seq, turn, &work, settle) }))
            }
        }
    }
}

/// Runs `work`, then the barrier with sequence number `settle` if it has one (see runahead.rs).
///
/// # Safety
/// As [`collectives::execute`].
unsafe fn run_settled(
    inner: &CommInner,
    kind: FrameKind,
    seq: u64,
    turn: Option<u64>,
    work: &Work,
    settle: Option<u64>,
) -> Result<()> {
    // SAFETY: the caller's promise, passed on.
    unsafe { collectives::execute(&Ctx::new(inner, kind, seq).with_turn(turn), work) }?;
    match settle {
        // SAFETY: a barrier touches no buffer.
        Some(seq) => unsafe { collectives::execute(&Ctx::new(inner, FrameKind::Collective, seq), &Work::Barrier) },
        None => Ok(()),
    }
}
