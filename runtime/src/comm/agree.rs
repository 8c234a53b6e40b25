//! Agreement on who goes on after a failure, in band over the existing connections (no store),
//! as ULFM's agree, but safe when the network rather than a process fails.
//!
//! Every rank knows which members are surely dead and which links between members are lost
//! (its own, and those other ranks reported: `view::Knowledge`). From that knowledge alone it
//! computes the ranks that go on (`view::kept`: the largest set that all reach each other) and
//! takes the lowest of them for coordinator. Members send their knowledge to their coordinator;
//! the coordinator runs Paxos over the kept ranks: PREPARE with a ballot (round, coordinator)
//! above any seen, PROMISE from every kept rank (with the value it accepted, if any), ACCEPT of
//! the failed set (the latest accepted value if there is one, else the ranks not kept), ACCEPTED
//! from every kept rank, then COMMIT to every rank it reaches, relayed along a binary tree over
//! the live ranks and to each rank's live successor. Knowledge that changes the kept set makes
//! the coordinator prepare again with a higher round. A value is chosen only once every kept
//! rank accepted it, and kept sets must hold a quorum of the members not surely dead
//! (`view::may_go_on`), so any later coordinator hears of it and adopts it: the decided set is
//! the same everywhere, and two sides of a partition never both go on. A rank that no quorum
//! can include (cut from the majority, or woken from a freeze after the others left it) knows
//! it at once and ends with "lost quorum".
//!
//! The state machine does no I/O (events in, messages out, quinn-style), so the protocol is
//! simulated at thousands of ranks in tests and benches (`agree_sim.rs`).

use crate::sync::Locked;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::view::{self, Knowledge};
use super::CommInner;
use crate::error::{Error, ErrorKind, Result};
use crate::wire::{FrameHeader, FrameKind};

/// Proposal number: (round, coordinator), ordered as a pair.
pub(crate) type Ballot = (u32, u32);

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Msg {
    /// A member's knowledge, to the rank it takes for coordinator.
    Know(Knowledge),
    Prepare {
        ballot: Ballot,
        know: Knowledge,
    },
    Promise {
        ballot: Ballot,
        accepted: Option<(Ballot, Vec<u32>)>,
        know: Knowledge,
    },
    /// The ballot was below one already promised.
    Reject {
        promised: Ballot,
        know: Knowledge,
    },
    Accept {
        ballot: Ballot,
        failed: Vec<u32>,
    },
    Accepted {
        ballot: Ballot,
    },
    Commit {
        failed: Vec<u32>,
    },
    /// The coordinator's side holds no quorum: nobody there goes on.
    Lost {
        know: Knowledge,
    },
}

/// How an agreement ended for this rank.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The failed set (communicator ranks, ascending), identical on every rank that learns it.
    Decided(Vec<u32>),
    /// This rank's side cannot go on; why.
    LostQuorum(String),
}

/// A message to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Out {
    pub to: u32,
    pub msg: Msg,
}

/// What a coordinator tracks for its current ballot.
#[derive(Debug)]
struct Lead {
    ballot: Ballot,
    keep: Vec<u32>,
    promises: BTreeMap<u32, Option<(Ballot, Vec<u32>)>>,
    proposal: Option<Vec<u32>>,
    acks: BTreeSet<u32>,
}

/// One member's side of one agreement, without I/O.
#[derive(Debug)]
pub(crate) struct Agreement {
    n: u32,
    me: u32,
    /// A store records the decision (the first side to record wins a tie).
    store_decides: bool,
    know: Knowledge,
    promised: Option<Ballot>,
    accepted: Option<(Ballot, Vec<u32>)>,
    max_round: u32,
    /// The coordinator last told our knowledge, and how much we knew then.
    told: Option<(u32, usize)>,
    lead: Option<Lead>,
    outcome: Option<Outcome>,
}

impl Agreement {
    pub fn new(n: u32, me: u32, store_decides: bool) -> Self {
        Agreement {
            n,
            me,
            store_decides,
            know: Knowledge::default(),
            promised: None,
            accepted: None,
            max_round: 0,
            told: None,
            lead: None,
            outcome: None,
        }
    }

    pub fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    /// What this rank's own links say (lost peers, reports of others' lost links); returns
    /// what to send.
    pub fn learn(&mut self, k: &Knowledge) -> Vec<Out> {
        self.know.merge(k);
        self.step()
    }

    fn others<'a>(&self, ranks: &'a [u32]) -> impl Iterator<Item = u32> + 'a {
        let me = self.me;
        ranks.iter().copied().filter(move |&r| r != me)
    }

    fn lost(&mut self, why: String) {
        tracing::warn!(rank = self.me, "agreement: {why}");
        self.outcome = Some(Outcome::LostQuorum(why));
    }

    /// Acts on what is known: as coordinator, prepare, propose or commit; otherwise tell the
    /// coordinator what we know.
    fn step(&mut self) -> Vec<Out> {
        if self.outcome.is_some() {
            return Vec::new();
        }
        let (n, me, sd) = (self.n, self.me, self.store_decides);
        if !view::could_go_on(n, &self.know, me, sd) {
            let reach: Vec<u32> = (0..n).filter(|&r| r == me || self.know.reach(me, r)).collect();
            self.lost(format!(
                "lost quorum: this rank reaches only ranks {reach:?} of {n}, too few to go on (the others go on \
                 without it if they can)"
            ));
            return Vec::new();
        }
        let keep = view::kept(n, &self.know);
        let Some(&coord) = keep.first() else { return Vec::new() };
        if coord != me {
            self.lead = None;
            let now = (coord, self.know.size());
            if self.told == Some(now) {
                return Vec::new();
            }
            self.told = Some(now);
            return vec![Out { to: coord, msg: Msg::Know(self.know.clone()) }];
        }
        if !view::may_go_on(n, &self.know, &keep, sd) {
            let outs = self.others(&keep).map(|to| Out { to, msg: Msg::Lost { know: self.know.clone() } }).collect();
            self.lost(format!("lost quorum: only ranks {keep:?} of {n} reach each other, too few to go on"));
            return outs;
        }
        let mut outs = Vec::new();
        if self.lead.as_ref().is_none_or(|l| l.keep != keep) {
            self.max_round = self.max_round.max(self.promised.map_or(0, |p| p.0)) + 1;
            let ballot = (self.max_round, me);
            self.promised = Some(ballot);
            let promises = BTreeMap::from([(me, self.accepted.clone())]);
            let prepare = Msg::Prepare { ballot, know: self.know.clone() };
            outs.extend(self.others(&keep).map(|to| Out { to, msg: prepare.clone() }));
            self.lead = Some(Lead { ballot, keep: keep.clone(), promises, proposal: None, acks: BTreeSet::new() });
        }
        let Some(lead) = self.lead.as_mut() else { return outs };
        if lead.proposal.is_none() && keep.iter().all(|r| lead.promises.contains_key(r)) {
            let latest = lead.promises.values().flatten().max_by_key(|(b, _)| *b).map(|(_, f)| f.clone());
            let failed = latest.unwrap_or_else(|| (0..n).filter(|r| !keep.contains(r)).collect());
            self.accepted = Some((lead.ballot, failed.clone()));
            lead.acks = BTreeSet::from([me]);
            lead.proposal = Some(failed.clone());
            let accept = Msg::Accept { ballot: lead.ballot, failed };
            outs.extend(keep.iter().filter(|&&r| r != me).map(|&to| Out { to, msg: accept.clone() }));
        }
        let done = lead.proposal.clone().filter(|_| keep.iter().all(|r| lead.acks.contains(r)));
        if let Some(failed) = done {
            let commit = Msg::Commit { failed: failed.clone() };
            outs.extend(
                (0..n).filter(|&r| r != me && self.know.reach(me, r)).map(|to| Out { to, msg: commit.clone() }),
            );
            self.outcome = Some(Outcome::Decided(failed));
        }
        outs
    }

    /// Where a received COMMIT goes next: our children in a binary tree over the ranks we reach
    /// (the decision spreads in log n steps), our reachable successor (so it still reaches
    /// everyone when a coordinator dies part-way through its commits), and the ranks we reach
    /// that the sender does not (a rank cut off from the coordinator learns from a bystander).
    fn relay_targets(&self, src: u32) -> Vec<u32> {
        let me = self.me;
        let alive: Vec<u32> = (0..self.n).filter(|&r| r == me || self.know.reach(me, r)).collect();
        let Some(i) = alive.iter().position(|&r| r == me) else { return Vec::new() };
        let mut to: Vec<u32> = [i + 1, 2 * i + 1, 2 * i + 2].iter().filter_map(|&j| alive.get(j).copied()).collect();
        to.extend(alive.iter().filter(|&&r| r != src && !self.know.reach(src, r)));
        to.sort_unstable();
        to.dedup();
        to.retain(|&r| r != src && r != me);
        to
    }

    fn may_accept(&self, ballot: Ballot) -> bool {
        self.promised.is_none_or(|p| ballot >= p)
    }

    fn reject(&self, to: u32) -> Out {
        Out { to, msg: Msg::Reject { promised: self.promised.unwrap_or((0, 0)), know: self.know.clone() } }
    }

    /// A message from member `src`; returns what to send.
    pub fn receive(&mut self, src: u32, msg: Msg) -> Vec<Out> {
        if self.outcome.is_some() || src >= self.n || src == self.me {
            return Vec::new();
        }
        let mut out = Vec::new();
        match msg {
            Msg::Know(k) => {
                self.know.merge(&k);
            }
            Msg::Prepare { ballot, know } => {
                self.know.merge(&know);
                self.max_round = self.max_round.max(ballot.0);
                if self.may_accept(ballot) {
                    self.promised = Some(ballot);
                    let accepted = self.accepted.clone();
                    out.push(Out { to: src, msg: Msg::Promise { ballot, accepted, know: self.know.clone() } });
                } else {
                    out.push(self.reject(src));
                }
            }
            Msg::Promise { ballot, accepted, know } => {
                self.know.merge(&know);
                if let Some(lead) = self.lead.as_mut().filter(|l| l.ballot == ballot) {
                    lead.promises.insert(src, accepted);
                }
            }
            Msg::Reject { promised, know } => {
                self.know.merge(&know);
                self.max_round = self.max_round.max(promised.0);
                if self.lead.as_ref().is_some_and(|l| l.ballot < promised) {
                    self.lead = None;
                }
            }
            Msg::Accept { ballot, failed } => {
                if self.may_accept(ballot) {
                    self.promised = Some(ballot);
                    self.accepted = Some((ballot, failed));
                    out.push(Out { to: src, msg: Msg::Accepted { ballot } });
                } else {
                    out.push(self.reject(src));
                }
            }
            Msg::Accepted { ballot } => {
                if let Some(lead) = self.lead.as_mut().filter(|l| l.ballot == ballot && l.proposal.is_some()) {
                    lead.acks.insert(src);
                }
            }
            Msg::Commit { failed } => {
                let relay = Msg::Commit { failed: failed.clone() };
                out.extend(self.relay_targets(src).into_iter().map(|to| Out { to, msg: relay.clone() }));
                self.outcome = Some(Outcome::Decided(failed));
                return out;
            }
            Msg::Lost { know } => {
                self.know.merge(&know);
                self.lost(format!("lost quorum: rank {src} found that too few ranks reach each other to go on"));
                return out;
            }
        }
        out.extend(self.step());
        out
    }
}

const KNOW: u8 = 1;
const PREPARE: u8 = 2;
const PROMISE: u8 = 3;
const REJECT: u8 = 4;
const ACCEPT: u8 = 5;
const ACCEPTED: u8 = 6;
const COMMIT: u8 = 7;
const LOST: u8 = 8;

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_ranks(out: &mut Vec<u8>, ranks: &[u32]) {
    put_u32(out, ranks.len() as u32);
    ranks.iter().for_each(|&r| put_u32(out, r));
}

fn put_ballot(out: &mut Vec<u8>, b: Ballot) {
    put_u32(out, b.0);
    put_u32(out, b.1);
}

fn put_know(out: &mut Vec<u8>, k: &Knowledge) {
    put_ranks(out, &k.dead.iter().copied().collect::<Vec<_>>());
    put_u32(out, k.cuts.len() as u32);
    for &(a, b) in &k.cuts {
        put_u32(out, a);
        put_u32(out, b);
    }
}

pub(crate) fn encode(m: &Msg) -> Vec<u8> {
    let mut out = Vec::new();
    match m {
        Msg::Know(k) => {
            out.push(KNOW);
            put_know(&mut out, k);
        }
        Msg::Prepare { ballot, know } => {
            out.push(PREPARE);
            put_ballot(&mut out, *ballot);
            put_know(&mut out, know);
        }
        Msg::Promise { ballot, accepted, know } => {
            out.push(PROMISE);
            put_ballot(&mut out, *ballot);
            match accepted {
                Some((b, f)) => {
                    out.push(1);
                    put_ballot(&mut out, *b);
                    put_ranks(&mut out, f);
                }
                None => out.push(0),
            }
            put_know(&mut out, know);
        }
        Msg::Reject { promised, know } => {
            out.push(REJECT);
            put_ballot(&mut out, *promised);
            put_know(&mut out, know);
        }
        Msg::Accept { ballot, failed } => {
            out.push(ACCEPT);
            put_ballot(&mut out, *ballot);
            put_ranks(&mut out, failed);
        }
        Msg::Accepted { ballot } => {
            out.push(ACCEPTED);
            put_ballot(&mut out, *ballot);
        }
        Msg::Commit { failed } => {
            out.push(COMMIT);
            put_ranks(&mut out, failed);
        }
        Msg::Lost { know } => {
            out.push(LOST);
            put_know(&mut out, know);
        }
    }
    out
}

struct Reader<'a> {
    b: &'a [u8],
    n: u32,
}

impl Reader<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&v, rest) = self.b.split_first()?;
        self.b = rest;
        Some(v)
    }
    fn u32(&mut self) -> Option<u32> {
        let (v, rest) = self.b.split_first_chunk::<4>()?;
        self.b = rest;
        Some(u32::from_le_bytes(*v))
    }
    fn rank(&mut self) -> Option<u32> {
        self.u32().filter(|&r| r < self.n)
    }
    /// A set of ranks, strictly ascending as `encode` writes it: a repeat or disorder is a
    /// malformed message, not a different spelling of the same set.
    fn ranks(&mut self) -> Option<Vec<u32>> {
        let len = self.u32()?;
        // A list longer than the communicator is malformed, not a reason to allocate.
        if len > self.n {
            return None;
        }
        let ranks = (0..len).map(|_| self.rank()).collect::<Option<Vec<u32>>>()?;
        ranks.windows(2).all(|w| w[0] < w[1]).then_some(ranks)
    }
    fn ballot(&mut self) -> Option<Ballot> {
        Some((self.u32()?, self.rank()?))
    }
    fn know(&mut self) -> Option<Knowledge> {
        let dead = self.ranks()?.into_iter().collect();
        let cuts = self.u32()?;
        if u64::from(cuts) > u64::from(self.n) * u64::from(self.n) {
            return None;
        }
        let mut k = Knowledge { dead, ..Knowledge::default() };
        let mut last = None;
        for _ in 0..cuts {
            // Each link once, as (lower, higher), in ascending order: the canonical spelling.
            let cut = (self.rank()?, self.rank()?);
            if cut.0 >= cut.1 || last >= Some(cut) {
                return None;
            }
            last = Some(cut);
            k.cut(cut.0, cut.1);
        }
        Some(k)
    }
}

/// Parses a message of a communicator of `n` ranks; `None` for anything malformed.
pub(crate) fn decode(b: &[u8], n: u32) -> Option<Msg> {
    let mut r = Reader { b, n };
    let m = match r.u8()? {
        KNOW => Msg::Know(r.know()?),
        PREPARE => Msg::Prepare { ballot: r.ballot()?, know: r.know()? },
        PROMISE => {
            let ballot = r.ballot()?;
            let accepted = match r.u8()? {
                0 => None,
                1 => Some((r.ballot()?, r.ranks()?)),
                _ => return None,
            };
            Msg::Promise { ballot, accepted, know: r.know()? }
        }
        REJECT => Msg::Reject { promised: r.ballot()?, know: r.know()? },
        ACCEPT => Msg::Accept { ballot: r.ballot()?, failed: r.ranks()? },
        ACCEPTED => Msg::Accepted { ballot: r.ballot()? },
        COMMIT => Msg::Commit { failed: r.ranks()? },
        LOST => Msg::Lost { know: r.know()? },
        _ => return None,
    };
    r.b.is_empty().then_some(m)
}

fn send_all(c: &CommInner, instance: u64, outs: Vec<Out>) {
    for Out { to, msg } in outs {
        tracing::debug!(instance, to, ?msg, "agreement: send");
        let payload = encode(&msg);
        let hdr = FrameHeader::control(FrameKind::Agree, c.id, c.epoch, instance, payload.len());
        // A member that cannot be reached is found failed by the transport and drops out of the
        // live set on the next turn.
        let _ = c.net.send(c.members[to as usize], &hdr, &payload);
    }
}

/// Runs the agreement that decides communicator `c`'s next epoch (frames of the agreement carry
/// that epoch, so that ranks that enter or retry at different times meet); returns the failed
/// set (communicator ranks, ascending), identical on every rank that goes on. A rank that cannot
/// go on gets `StaleEpoch` ("lost quorum"); a call that runs out of time keeps its state, so a
/// retry continues where it stopped.
pub(crate) fn agree(c: &CommInner) -> Result<Vec<u32>> {
    let instance = c.epoch + 1;
    let _span = tracing::debug_span!("agree", instance, rank = c.rank).entered();
    let n = c.members.len() as u32;
    let deadline = Instant::now() + c.timeout;
    let mut slot = c.agreement.locked();
    let a = slot.get_or_insert_with(|| Agreement::new(n, c.rank, c.store_decides()));
    loop {
        // Counted before the failures are read: one that lands in between ends the wait below.
        let planned_with = c.net.inbox.gone_count();
        send_all(c, instance, a.learn(&c.knowledge()));
        match a.outcome() {
            Some(Outcome::Decided(f)) => return Ok(f.clone()),
            Some(Outcome::LostQuorum(why)) => return Err(Error::new(ErrorKind::StaleEpoch, format!("shrink: {why}"))),
            None => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::timeout(format!("shrink: no agreement within {} ms", c.timeout.as_millis())));
        }
        let Some((src_world, frame)) = next_message(c, instance, planned_with, deadline) else {
            continue;
        };
        let Some(src) = c.members.iter().position(|&w| w == src_world).map(|r| r as u32) else {
            tracing::debug!(src_world, "agreement: message from a non-member ignored");
            continue;
        };
        match decode(&frame.payload, n) {
            Some(msg) => {
                tracing::debug!(instance, src, ?msg, "agreement: received");
                send_all(c, instance, a.receive(src, msg));
            }
            None => tracing::warn!(src, "shrink: ignored a malformed agreement message"),
        }
    }
}

/// How long the agreement waits for a message between two turns of the progress hook.
const SLICE: Duration = Duration::from_millis(2);

/// The next agreement message of `instance`, or None once the failures known differ from
/// `planned_with` or the deadline passes. Meanwhile this rank's shared-memory rings keep moving:
/// a peer still inside the operation this rank gave up may be blocked writing to it (a full
/// ring), and would otherwise reach the agreement only at its deadline.
fn next_message(
    c: &CommInner,
    instance: u64,
    planned_with: usize,
    deadline: Instant,
) -> Option<(u32, crate::transport::Frame)> {
    loop {
        c.net.keep_moving();
        let left = deadline.saturating_duration_since(Instant::now());
        let got = c.net.inbox.take_any(FrameKind::Agree, c.id, instance, planned_with, left.min(SLICE));
        if got.is_some() || left <= SLICE || c.net.inbox.gone_count() != planned_with {
            return got;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::view::know;

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let k = know(&[3], &[(0, 1)]);
        let msgs = [
            Msg::Know(k.clone()),
            Msg::Prepare { ballot: (2, 1), know: k.clone() },
            Msg::Promise { ballot: (2, 1), accepted: None, know: k.clone() },
            Msg::Promise { ballot: (2, 1), accepted: Some(((1, 0), vec![3])), know: Knowledge::default() },
            Msg::Reject { promised: (5, 2), know: k.clone() },
            Msg::Accept { ballot: (2, 1), failed: vec![1, 3] },
            Msg::Accepted { ballot: (2, 1) },
            Msg::Commit { failed: vec![0, 2] },
            Msg::Lost { know: k },
        ];
        for m in msgs {
            let b = encode(&m);
            assert_eq!(decode(&b, 4), Some(m.clone()));
            assert_eq!(decode(&b[..b.len() - 1], 4), None, "truncated {m:?}");
        }
        assert_eq!(decode(&encode(&Msg::Commit { failed: vec![9] }), 4), None, "rank out of range");
        // A set spelled with a repeat or out of order is malformed (found by the bootstrap fuzzer).
        assert_eq!(decode(&encode(&Msg::Commit { failed: vec![2, 2] }), 4), None, "repeated rank");
        assert_eq!(decode(&encode(&Msg::Commit { failed: vec![2, 1] }), 4), None, "disorder");
        let reject = [4, 3, 1, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(decode(&reject, 37), None, "dead set with repeats");
        let mut cut_backwards = vec![KNOW, 0, 0, 0, 0, 1, 0, 0, 0];
        cut_backwards.extend([2, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(decode(&cut_backwards, 4), None, "cut spelled (higher, lower)");
        assert_eq!(decode(&[COMMIT, 0xff, 0xff, 0xff, 0xff], 4), None, "absurd length");
        assert_eq!(decode(&[42], 4), None);
    }

    /// Delivers every message at once until nothing moves; ranks in `down` neither send nor
    /// receive, and `links_cut` pairs drop what they send each other.
    fn run(n: u32, knows: &[Knowledge], down: &[u32], links_cut: &[(u32, u32)], sd: bool) -> Vec<Option<Outcome>> {
        let mut ranks: Vec<Agreement> = (0..n).map(|r| Agreement::new(n, r, sd)).collect();
        let mut queue: Vec<(u32, Out)> = Vec::new();
        for r in (0..n).filter(|r| !down.contains(r)) {
            let outs = ranks[r as usize].learn(&knows[r as usize]);
            queue.extend(outs.into_iter().map(|o| (r, o)));
        }
        let cut = |a: u32, b: u32| links_cut.contains(&(a.min(b), a.max(b)));
        while let Some((from, out)) = queue.pop() {
            if down.contains(&out.to) || cut(from, out.to) {
                continue;
            }
            let outs = ranks[out.to as usize].receive(from, out.msg);
            queue.extend(outs.into_iter().map(|o| (out.to, o)));
        }
        ranks.iter().map(|a| a.outcome().cloned()).collect()
    }

    #[test]
    fn a_crash_is_agreed_by_every_survivor() {
        let k = know(&[2], &[]);
        let got = run(4, &[k.clone(), k.clone(), k.clone(), k], &[2], &[], false);
        for r in [0, 1, 3] {
            assert_eq!(got[r], Some(Outcome::Decided(vec![2])), "rank {r}");
        }
    }

    #[test]
    fn one_cut_link_of_three_keeps_the_lowest_pair_and_tells_the_third() {
        // Ranks 0 and 1 lost each other; 2 reaches both and learnt of the cut.
        let c = know(&[], &[(0, 1)]);
        let got = run(3, &[c.clone(), c.clone(), c], &[], &[(0, 1)], false);
        assert_eq!(got, vec![Some(Outcome::Decided(vec![1])); 3]);
    }

    #[test]
    fn the_minority_side_of_a_partition_loses_and_the_majority_goes_on() {
        let side = |r: u32| if r < 3 { know(&[], &[(r, 3), (r, 4)]) } else { know(&[], &[(r, 0), (r, 1), (r, 2)]) };
        let knows: Vec<Knowledge> = (0..5).map(side).collect();
        let cuts: Vec<(u32, u32)> = [0, 1, 2].iter().flat_map(|&a| [(a, 3), (a, 4)]).collect();
        let got = run(5, &knows, &[], &cuts, true);
        for (r, got) in got.iter().enumerate() {
            match r {
                0..3 => assert_eq!(got, &Some(Outcome::Decided(vec![3, 4])), "rank {r}"),
                _ => assert!(matches!(got, Some(Outcome::LostQuorum(_))), "rank {r}: {got:?}"),
            }
        }
    }

    #[test]
    fn a_lone_survivor_and_a_lone_member_decide_at_once() {
        let mut a = Agreement::new(2, 0, false);
        a.learn(&know(&[1], &[]));
        assert_eq!(a.outcome(), Some(&Outcome::Decided(vec![1])));
        let mut a = Agreement::new(1, 0, false);
        a.learn(&Knowledge::default());
        assert_eq!(a.outcome(), Some(&Outcome::Decided(vec![])));
    }

    #[test]
    fn a_value_accepted_by_every_kept_rank_survives_its_coordinators_death() {
        // Rank 0 proposed {3} and every kept rank accepted it, then 0 died before committing:
        // the next coordinator must adopt {3}, not propose its own view ({0, 3}).
        let mut ranks: Vec<Agreement> = (0..4).map(|r| Agreement::new(4, r, false)).collect();
        for a in &mut ranks[1..3] {
            a.receive(0, Msg::Prepare { ballot: (1, 0), know: know(&[3], &[]) });
            a.receive(0, Msg::Accept { ballot: (1, 0), failed: vec![3] });
        }
        let k = know(&[0, 3], &[]);
        let mut queue: Vec<(u32, Out)> = Vec::new();
        for r in 1..3u32 {
            queue.extend(ranks[r as usize].learn(&k).into_iter().map(|o| (r, o)));
        }
        while let Some((from, out)) = queue.pop() {
            if matches!(out.to, 0 | 3) {
                continue;
            }
            let outs = ranks[out.to as usize].receive(from, out.msg);
            queue.extend(outs.into_iter().map(|o| (out.to, o)));
        }
        assert_eq!(ranks[1].outcome(), Some(&Outcome::Decided(vec![3])));
        assert_eq!(ranks[2].outcome(), Some(&Outcome::Decided(vec![3])));
    }
}
