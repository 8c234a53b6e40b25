//! A team: the members of one communicator and how to reach them, what the collectives run
//! on. It knows who failed, left or cannot reach whom, which operations other ranks abandoned,
//! and turns that into the error a wait ends with. The communicator (comm/) owns one and adds
//! what only it needs: sequence numbers, groups, agreement, the store.

use crate::sync::Locked;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::board::BoardCell;
use crate::error::{Error, ErrorKind};
use crate::transport::{departure, news, Fault, Health, Net};
use crate::tuning::{AlgoChoice, TransportKind, Tuning};
use crate::wire::{FrameHeader, FrameKind};

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

/// Host indices of `members` from the net's host ids (see [`Team::hosts`]).
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

pub(crate) struct Team {
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
    /// Host index of each member (see [`Team::hosts`]).
    hosts: Option<Vec<u32>>,
    /// The shared-memory board of the smallest allreduces, when all members share a host.
    pub board: BoardCell,
    pub aborted: AtomicBool,
    /// The first error an operation met (`hccn_comm_get_async_error`).
    pub async_error: Mutex<Option<Error>>,
    /// The first operation of this rank that failed because members failed: every later one
    /// fails with it, though this rank's own view may not name them yet (it may have heard only
    /// that a member left knowing of a failure), as its next call would pair with calls the
    /// other ranks never make.
    failed_here: OnceLock<Error>,
}

impl Team {
    /// What a communicator made from this one inherits.
    pub(crate) fn setup(&self) -> Setup {
        Setup { timeout: self.timeout, chunk_bytes: self.chunk_bytes, tuning: self.tuning }
    }

    pub fn new(net: Arc<Net>, id: u64, epoch: u64, rank: u32, members: Vec<u32>, setup: Setup) -> Self {
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
        Team {
            net,
            id,
            epoch,
            rank,
            members,
            timeout,
            chunk_bytes,
            tuning,
            hosts,
            board,
            aborted: AtomicBool::new(false),
            async_error: Mutex::new(None),
            failed_here: OnceLock::new(),
        }
    }

    /// The host of every member, as indices 0, 1, ... in order of first appearance (member 0 is
    /// on host 0), so that every member computes the same layout; `None` when the host of some
    /// member is unknown here (ranks admitted by a rebuild), in which case every member sees
    /// `None` too. Algorithms and the cost model may rely on this being identical everywhere.
    pub fn hosts(&self) -> Option<&[u32]> {
        self.hosts.as_deref()
    }

    /// The host index of communicator rank `rank` (see [`Team::hosts`]).
    pub fn host_of(&self, rank: u32) -> Option<u32> {
        self.hosts.as_ref().and_then(|h| h.get(rank as usize).copied())
    }

    /// How many hosts the members span (1 when unknown).
    pub fn host_count(&self) -> usize {
        self.hosts.as_ref().and_then(|h| h.iter().max()).map_or(1, |m| *m as usize + 1)
    }

    /// The communicator rank of world rank `world`, if it is a member.
    pub fn rank_of(&self, world: u32) -> Option<u32> {
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
    pub fn abandoned(&self, health: &Health<'_>, kind: FrameKind, seq: u64) -> Option<Error> {
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
    pub fn broken_by<'h>(&self, health: &'h Health<'_>) -> Option<&'h news::Abandoned> {
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

    pub(crate) fn tell_abandoned(&self, seq: u64, e: &Error, broken: bool) {
        self.tell_abandoned_to(seq, e, broken, &[]);
    }

    /// As [`Team::tell_abandoned`] (not broken), but not to the world ranks in `skip`.
    pub(crate) fn tell_abandoned_except(&self, seq: u64, e: &Error, skip: &[u32]) {
        self.tell_abandoned_to(seq, e, false, skip);
    }

    fn tell_abandoned_to(&self, seq: u64, e: &Error, broken: bool, skip: &[u32]) {
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
            if r as u32 != self.rank && !skip.contains(&w) {
                let _ = self.net.send(w, &hdr, &payload);
            }
        }
    }

    /// As [`Team::status`]; `departures`: count members that left (the communicator's
    /// state as `async_error` reports it). A departure names the failures the leaver knew of
    /// among the members when there are some: they are why it left.
    pub fn status_of(&self, health: &Health<'_>, departures: bool) -> Option<Error> {
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
        // A member that left knowing of a failure names it, whichever member left first: one
        // that left without news (its listener closed to a dial) must not hide the cause.
        let mut first = None;
        for (r, w) in self.members.iter().enumerate().filter(|_| departures) {
            let Some(news) = health.departed.get(w) else { continue };
            let e = self.departed(r as u32, news);
            if e.kind() == ErrorKind::RankFailed {
                return Some(e);
            }
            first.get_or_insert(e);
        }
        first
    }

    /// The error for member `r`, which left knowing of `news`. A member that left after losing
    /// members of this communicator most likely left because of that loss (its call failed and
    /// it gave up): the loss is the error, so that every survivor names the same failed ranks,
    /// whether it heard of the failure first or of the departure.
    pub fn departed(&self, r: u32, news: &[(u32, Fault)]) -> Error {
        let w = self.members.get(r as usize).copied().unwrap_or(r);
        let known: Vec<(u32, String)> =
            news.iter().filter_map(|(x, f)| Some((self.rank_of(*x)?, f.reason.clone()))).collect();
        if known.is_empty() {
            return departure(w, news).context(format!("rank {r}")).with_failed(vec![r]);
        }
        let ranks: Vec<u32> = known.iter().map(|k| k.0).collect();
        let detail: Vec<String> = known.iter().map(|(x, why)| format!("rank {x}: {why}")).collect();
        Error::rank_failed(
            ranks,
            format!("communicator member failed ({}; told by rank {r}, which left)", detail.join("; ")),
        )
    }

    /// Members that failed, lost a link to another member, or left, in communicator ranks (what
    /// `hccn_comm_failed_ranks` reports). A member that left knowing of such failures among the
    /// members left because of them: they are named, not it, so the blame stays on the cause.
    pub(crate) fn unhealthy(&self) -> Vec<u32> {
        self.net.inbox.health(|h| {
            let mut out: Vec<u32> = self.failed_members(h.failed).into_iter().map(|(r, _)| r).collect();
            out.extend(self.cut_members(h).into_iter().map(|c| c.1));
            let mut unexplained = Vec::new();
            for (r, w) in self.members.iter().enumerate() {
                let Some(news) = h.departed.get(w) else { continue };
                let causes: Vec<u32> = news.iter().filter_map(|(x, _)| self.rank_of(*x)).collect();
                if causes.is_empty() {
                    unexplained.push(r as u32);
                }
                out.extend(causes);
            }
            // A member that left without saying why (its goodbye came before the news, or only
            // its closed listener told) while members failed left because of them: it is named
            // only when nothing else explains the trouble.
            if out.is_empty() {
                out = unexplained;
            }
            out.sort_unstable();
            out.dedup();
            out
        })
    }

    /// Rewrites transport errors in this communicator's terms and remembers the first one.
    pub fn translate(&self, e: Error) -> Error {
        // Transport errors name world ranks; the communicator's own view names its ranks.
        let e = match e.kind() {
            ErrorKind::RankFailed => self.net.inbox.health(|h| self.status(h)).unwrap_or(e),
            // A peer that left (or gave up on this operation) after a member failed: the
            // failure is the error, as every survivor that heard of it first reports.
            ErrorKind::Remote => self
                .net
                .inbox
                .health(|h| self.status_of(h, true))
                .filter(|s| s.kind() == ErrorKind::RankFailed)
                .unwrap_or(e),
            _ => e,
        };
        self.remember(&e);
        e
    }

    /// Keeps `e`, an error an operation of this rank met, as the communicator's state.
    pub fn remember(&self, e: &Error) {
        if e.kind() == ErrorKind::RankFailed {
            let _ = self.failed_here.set(e.clone());
        }
        let mut slot = self.async_error.locked();
        if slot.is_none() && e.kind() != ErrorKind::Timeout {
            *slot = Some(e.clone());
        }
    }

    /// The failure an operation of this rank already met, if any (see `failed_here`).
    pub fn failed_here(&self) -> Option<&Error> {
        self.failed_here.get()
    }
}
