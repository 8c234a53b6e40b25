//! Communicators: a set of ranks over a shared [`Net`], with their own id, sequence numbers
//! and failure state. Groups and splits are new communicators over the parent's connections.

pub(crate) mod agree;
pub mod agree_sim;
mod group;
mod init;
pub(crate) mod join;
mod linkcost;
mod membership;
mod precheck;
mod shrink;
mod typed;
pub(crate) mod view;
// What the algorithm selection would do, for tools.
mod plan;

use std::collections::{BTreeMap, HashMap};

use crate::transport::{news, Fault, Health};
use crate::tuning::{AlgoChoice, TransportKind, Tuning};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

pub use init::new_unique_id;
pub use typed::Element;

use crate::collectives::board::BoardCell;
use crate::collectives::check::{self, Shape};
use crate::collectives::{self, Ctx, Op, Work};
use crate::error::{Error, ErrorKind, Result};
use crate::stream::Stream;
use crate::transport::Net;
use crate::wire::{FrameHeader, FrameKind};

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

/// What a communicator inherits from its world: deadlines, pipeline chunks, tuning.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Setup {
    pub timeout: Duration,
    pub chunk_bytes: usize,
    pub tuning: Tuning,
}

impl Setup {
    /// A world's, from the configuration and the link costs it agreed on.
    pub fn of(cfg: &crate::config::Config, costs: crate::tuning::LinkCosts) -> Setup {
        let intra = match cfg.transport {
            crate::config::Transport::Tcp => TransportKind::Tcp,
            crate::config::Transport::Auto | crate::config::Transport::Shm => TransportKind::Shm,
        };
        let tuning = Tuning { algo: cfg.algo, board_bytes: cfg.board_bytes, intra, costs };
        Setup { timeout: cfg.timeout, chunk_bytes: cfg.chunk_bytes, tuning }
    }
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
    /// The world's tuning (algorithm, board, link costs), alike on every member.
    pub tuning: Tuning,
    coll_seq: AtomicU64,
    /// Next sequence number of messages to (`.0`) and from (`.1`) each peer.
    p2p_seq: Mutex<(Vec<u64>, Vec<u64>)>,
    group_seq: Mutex<HashMap<Vec<u32>, u64>>,
    split_seq: AtomicU64,
    /// The agreement on the next epoch, kept across calls: a shrink that ran out of time
    /// continues where it stopped when called again.
    agreement: Mutex<Option<agree::Agreement>>,
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
    /// Set while a thread is in a blocking call on this communicator.
    in_use: AtomicBool,
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

/// Marks a mismatch's message when the ranks went separate ways (one to the shared-memory
/// board, another to messages): no later operation of the communicator can work.
pub(crate) const BROKEN_MARK: &str = "the communicator is broken";

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
    /// What a communicator made from this one inherits.
    pub(crate) fn setup(&self) -> Setup {
        Setup { timeout: self.timeout, chunk_bytes: self.chunk_bytes, tuning: self.tuning }
    }

    fn new(net: Arc<Net>, id: u64, epoch: u64, rank: u32, members: Vec<u32>, setup: Setup) -> Self {
        let n = members.len();
        let hosts = host_layout(&net, &members);
        let shared_host = hosts.as_ref().is_some_and(|h| h.iter().all(|&x| x == 0));
        let Setup { timeout, chunk_bytes, tuning } = setup;
        let board = BoardCell::new(
            n as u32,
            shared_host,
            tuning.intra == TransportKind::Shm,
            tuning.algo == AlgoChoice::Auto,
            tuning.board_bytes,
        );
        CommInner {
            net,
            id,
            epoch,
            rank,
            members,
            timeout,
            chunk_bytes,
            tuning,
            coll_seq: AtomicU64::new(0),
            p2p_seq: Mutex::new((vec![0; n], vec![0; n])),
            group_seq: Mutex::new(HashMap::new()),
            split_seq: AtomicU64::new(0),
            agreement: Mutex::new(None),
            aborted: AtomicBool::new(false),
            async_error: Mutex::new(None),
            origin: None,
            member: membership::MemberSlot::default(),
            hosts,
            board,
            in_use: AtomicBool::new(false),
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

    /// The communicator rank of world rank `world`, if it is a member.
    fn rank_of(&self, world: u32) -> Option<u32> {
        self.members.iter().position(|&w| w == world).map(|r| r as u32)
    }

    /// Members this rank lost, in communicator ranks, with why.
    fn failed_members(&self, failed: &BTreeMap<u32, Fault>) -> Vec<(u32, String)> {
        self.members
            .iter()
            .enumerate()
            .filter_map(|(r, w)| failed.get(w).map(|f| (r as u32, f.reason.clone())))
            .collect()
    }

    /// Links between members that other ranks lost: (reporter, lost member) in communicator
    /// ranks, with the reporter's reason.
    fn cut_members(&self, health: &Health<'_>) -> Vec<(u32, u32, String)> {
        health
            .cuts
            .iter()
            .filter_map(|((a, b), why)| Some((self.rank_of(*a)?, self.rank_of(*b)?, why.clone())))
            .collect()
    }

    /// The error of every wait of the communicator, if any: aborted, revoked, a member failed or
    /// lost its link to another member. A member that left ends only the waits for it (see
    /// `Inbox::ended`): what it sent before its goodbye is still delivered, and a rank that
    /// needed more from it abandons its operation, which tells the others.
    pub fn status(&self, health: &Health<'_>) -> Option<Error> {
        self.status_of(health, false)
    }

    /// The error of a wait of operation `seq` (of `kind`), if any: the communicator's, or the
    /// error of a rank that abandoned this operation (or broke the communicator), in this
    /// communicator's ranks.
    pub fn op_status(&self, health: &Health<'_>, kind: FrameKind, seq: u64) -> Option<Error> {
        self.status(health).or_else(|| self.abandoned(health, kind, seq))
    }

    /// The error of a rank that abandoned operation `seq`, or broke the communicator.
    fn abandoned(&self, health: &Health<'_>, kind: FrameKind, seq: u64) -> Option<Error> {
        if health.abandoned.is_empty() {
            return None;
        }
        let own = (kind == FrameKind::Collective).then(|| health.abandoned.get(&(self.id, seq))).flatten();
        let why = own.or_else(|| self.broken_by(health))?;
        let ranks: Vec<u32> = why.ranks.iter().filter_map(|w| self.rank_of(*w)).collect();
        Some(Error::new(why.kind, why.message.clone()).with_failed(ranks))
    }

    /// Why no operation of this communicator can work any more (its ranks went separate ways,
    /// or two threads used it at once), if that happened.
    fn broken_by<'h>(&self, health: &'h Health<'_>) -> Option<&'h news::Abandoned> {
        health.abandoned.iter().find(|(k, a)| k.0 == self.id && a.broken).map(|(_, a)| a)
    }

    /// Tells every member that this rank left operation `seq` with `e`, unless another rank
    /// did first or every member learns of it anyway (a failed member, a revoke, an abort):
    /// their waits for this rank end at once with the same error, not at their deadlines.
    pub fn abandon(&self, seq: u64, e: &Error) {
        if matches!(e.kind(), ErrorKind::RankFailed | ErrorKind::Revoked | ErrorKind::Aborted) {
            return;
        }
        let broken = matches!(e.kind(), ErrorKind::Mismatch | ErrorKind::Busy) && e.message().contains(BROKEN_MARK);
        self.tell_abandoned(seq, e, broken);
    }

    fn tell_abandoned(&self, seq: u64, e: &Error, broken: bool) {
        let ranks: Vec<u32> = e.failed_ranks().iter().filter_map(|r| self.members.get(*r as usize).copied()).collect();
        let message = match e.message().starts_with("rank ") && e.message().contains(" left this operation: ") {
            true => e.message().to_owned(),
            false => format!("rank {} left this operation: {}", self.rank, e.message()),
        };
        let why = news::Abandoned { kind: e.kind(), broken, ranks, message };
        if !self.net.inbox.mark_abandoned(self.id, seq, why.clone()) {
            return;
        }
        let payload = news::encode_abandon(&why, &|r| self.net.inbox.id_of(r));
        let hdr = FrameHeader::control(FrameKind::Abandon, self.id, self.epoch, seq, payload.len());
        for (r, &w) in self.members.iter().enumerate() {
            if r as u32 != self.rank {
                let _ = self.net.send(w, &hdr, &payload);
            }
        }
    }

    /// As [`CommInner::status`]; `departures`: count members that left (the communicator's
    /// state as `async_error` reports it). A departure names the failures the leaver knew of
    /// among the members when there are some: they are why it left.
    fn status_of(&self, health: &Health<'_>, departures: bool) -> Option<Error> {
        if self.aborted.load(Ordering::SeqCst) {
            return Some(Error::new(ErrorKind::Aborted, "the communicator was aborted"));
        }
        if health.revoked.contains(&self.id) {
            return Some(Error::new(ErrorKind::Revoked, "the communicator was revoked; shrink or destroy it"));
        }
        if let Some(why) = self.broken_by(health) {
            return Some(Error::new(why.kind, why.message.clone()));
        }
        let dead = self.failed_members(health.failed);
        if !dead.is_empty() {
            let ranks: Vec<u32> = dead.iter().map(|(r, _)| *r).collect();
            let detail: Vec<String> = dead.iter().map(|(r, why)| format!("rank {r}: {why}")).collect();
            return Some(Error::rank_failed(ranks, format!("communicator member failed ({})", detail.join("; "))));
        }
        let cuts = self.cut_members(health);
        if !cuts.is_empty() {
            let mut ranks: Vec<u32> = cuts.iter().map(|c| c.1).collect();
            ranks.sort_unstable();
            ranks.dedup();
            let detail: Vec<String> = cuts.iter().map(|(a, b, why)| format!("rank {a} lost rank {b}: {why}")).collect();
            return Some(Error::rank_failed(ranks, format!("members cannot reach each other ({})", detail.join("; "))));
        }
        for (r, w) in self.members.iter().enumerate().filter(|_| departures) {
            let Some(news) = health.departed.get(w) else { continue };
            let known: Vec<(u32, String)> =
                news.iter().filter_map(|(x, f)| Some((self.rank_of(*x)?, f.reason.clone()))).collect();
            if known.is_empty() {
                return Some(
                    crate::transport::departure(*w, news).context(format!("rank {r}")).with_failed(vec![r as u32]),
                );
            }
            let ranks: Vec<u32> = known.iter().map(|k| k.0).collect();
            let detail: Vec<String> = known.iter().map(|(x, why)| format!("rank {x}: {why}")).collect();
            return Some(Error::rank_failed(
                ranks,
                format!("communicator member failed ({}; told by rank {r}, which left)", detail.join("; ")),
            ));
        }
        None
    }

    /// Members that failed, lost a link to another member, or left, in communicator ranks (what
    /// `hccn_comm_failed_ranks` reports). A member that left knowing of such failures among the
    /// members left because of them: they are named, not it, so the blame stays on the cause.
    pub(crate) fn unhealthy(&self) -> Vec<u32> {
        self.net.inbox.health(|h| {
            let mut out: Vec<u32> = self.failed_members(h.failed).into_iter().map(|(r, _)| r).collect();
            out.extend(self.cut_members(h).into_iter().map(|c| c.1));
            for (r, w) in self.members.iter().enumerate() {
                let Some(news) = h.departed.get(w) else { continue };
                let causes: Vec<u32> = news.iter().filter_map(|(x, _)| self.rank_of(*x)).collect();
                if causes.is_empty() {
                    out.push(r as u32);
                }
                out.extend(causes);
            }
            out.sort_unstable();
            out.dedup();
            out
        })
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
        // The common case costs two loads: nothing failed, left or was revoked anywhere.
        if self.net.inbox.troubles() == 0 && !self.aborted.load(Ordering::Relaxed) {
            return Ok(());
        }
        match self.net.inbox.health(|h| self.status_of(h, departures)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Rewrites transport errors in this communicator's terms and remembers the first one.
    pub fn translate(&self, e: Error) -> Error {
        // Transport errors name world ranks; the communicator's own view names its ranks.
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

    /// Members whose process died, left, or became unreachable (from this rank or from another
    /// member), in this communicator's ranks.
    pub fn failed_ranks(&self) -> Vec<u32> {
        self.inner.unhealthy()
    }

    /// The communicator's error state: a failed member, an abort, or the first error an
    /// operation met; `Ok` when healthy.
    pub fn async_error(&self) -> Result<()> {
        self.inner.check(true)?;
        match self.inner.async_error.lock().unwrap_or_else(|p| p.into_inner()).clone() {
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
    ///
    /// # Safety
    /// Every buffer in `op` must be valid for the bytes the operation reads or writes (as in
    /// docs/c-api.md) until it completes: until return without a stream, or until the stream has
    /// run it.
    pub unsafe fn submit(&self, op: Op, stream: Option<&Stream>) -> Result<()> {
        let _alone = if stream.is_none() { Some(self.inner.enter()?) } else { None };
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
        let work = check::validate(&op, &shape, &mut |is_send, peer| self.inner.next_p2p(is_send, peer))?;
        // Every collective takes its number, count 0 too: it still checks that the other ranks
        // made the same call.
        let (kind, seq) = match work {
            Work::Send { seq, .. } | Work::Recv { seq, .. } => (FrameKind::P2p, seq),
            _ => (FrameKind::Collective, self.inner.coll_seq.fetch_add(1, Ordering::SeqCst)),
        };
        let empty_allreduce = matches!((&work, &op), (Work::Nothing, Op::AllReduce { .. }));
        let turn = self.inner.board.turn_for(&work, empty_allreduce);
        let job = Job { kind, seq, turn, fp, work };
        match stream {
            // SAFETY: the caller's promise covers the buffers until we return.
            None => unsafe { job.run(&self.inner) },
            Some(s) => {
                let inner = self.inner.clone();
                // SAFETY: the caller's promise covers the buffers until the stream runs the job.
                s.enqueue(Box::new(move || unsafe { job.run(&inner) }))
            }
        }
    }
}

/// A checked operation with everything decided at submit time, alike on every rank.
struct Job {
    kind: FrameKind,
    seq: u64,
    /// Its board turn (see collectives/board.rs).
    turn: Option<u64>,
    fp: crate::wire::Fingerprint,
    work: Work,
}

impl Job {
    /// Runs it; when it fails on this rank, tells the other members (see
    /// [`CommInner::abandon`]).
    ///
    /// # Safety
    /// As [`collectives::execute`].
    unsafe fn run(&self, inner: &CommInner) -> Result<()> {
        let ctx = Ctx::new(inner, self.kind, self.seq).with_turn(self.turn).with_fingerprint(self.fp);
        // SAFETY: the caller's promise, passed on.
        let mut r = unsafe { collectives::execute(&ctx, &self.work) };
        if r.is_ok() && inner.net.inbox.troubles() != 0 {
            // Done here, but another rank (or thread) gave it up meanwhile: its result is not
            // to be trusted.
            if let Some(e) = inner.net.inbox.health(|h| inner.abandoned(h, self.kind, self.seq)) {
                r = Err(e);
            }
        }
        if let (Err(e), FrameKind::Collective) = (&r, self.kind) {
            inner.abandon(self.seq, e);
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
