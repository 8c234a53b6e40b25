//! Agreement among survivors on the failed set, in band over the existing connections (no
//! store), as ULFM's agree. Crash failures are detected by the transport (EOF, reset), so every
//! survivor eventually suspects exactly the dead.
//!
//! The coordinator is the lowest rank a survivor believes alive. It collects every live
//! member's STATE (suspects, and any value it already accepted), proposes a failed set with
//! ACCEPT (the latest accepted value if there is one, else the union of suspects), waits for
//! every live member's ACK, then sends COMMIT in ascending rank order. A member that receives
//! COMMIT relays it (along a binary tree over the live ranks, and to its live successor) before
//! returning, so if a coordinator dies part-way through its commits (whose recipients are then
//! the lowest ranks), the decision still reaches everyone, in about log n steps. A coordinator commits only after every live member accepted, so any later
//! coordinator finds that value and adopts it: the decided set is the same everywhere.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use super::CommInner;
use crate::error::{Error, Result};
use crate::wire::{FrameHeader, FrameKind};

const STATE: u8 = 1;
const ACCEPT: u8 = 2;
const ACK: u8 = 3;
const COMMIT: u8 = 4;

/// A value accepted from the coordinator of rank `.0` (later coordinators have higher ranks).
type Accepted = Option<(u32, Vec<u32>)>;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Msg {
    State { suspects: Vec<u32>, accepted: Accepted },
    Accept(Vec<u32>),
    Ack(Vec<u32>),
    Commit(Vec<u32>),
}

fn put_ranks(out: &mut Vec<u8>, ranks: &[u32]) {
    out.extend_from_slice(&(ranks.len() as u32).to_le_bytes());
    ranks.iter().for_each(|r| out.extend_from_slice(&r.to_le_bytes()));
}

pub(crate) fn encode(m: &Msg) -> Vec<u8> {
    let mut out = Vec::new();
    match m {
        Msg::State { suspects, accepted } => {
            out.push(STATE);
            put_ranks(&mut out, suspects);
            match accepted {
                Some((coord, f)) => {
                    out.push(1);
                    out.extend_from_slice(&coord.to_le_bytes());
                    put_ranks(&mut out, f);
                }
                None => out.push(0),
            }
        }
        Msg::Accept(f) | Msg::Ack(f) | Msg::Commit(f) => {
            out.push(match m {
                Msg::Accept(_) => ACCEPT,
                Msg::Ack(_) => ACK,
                _ => COMMIT,
            });
            put_ranks(&mut out, f);
        }
    }
    out
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u32(&mut self) -> Option<u32> {
        let b = self.0.get(..4)?;
        self.0 = &self.0[4..];
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn ranks(&mut self, n: u32) -> Option<Vec<u32>> {
        let len = self.u32()?;
        // A list longer than the communicator is malformed, not a reason to allocate.
        if len > n {
            return None;
        }
        (0..len).map(|_| self.u32().filter(|&r| r < n)).collect()
    }
}

/// Parses a message of a communicator of `n` ranks; `None` for anything malformed.
pub(crate) fn decode(b: &[u8], n: u32) -> Option<Msg> {
    let mut r = Reader(b);
    let m = match r.u8()? {
        STATE => {
            let suspects = r.ranks(n)?;
            let accepted = match r.u8()? {
                0 => None,
                1 => Some((r.u32().filter(|&c| c < n)?, r.ranks(n)?)),
                _ => return None,
            };
            Msg::State { suspects, accepted }
        }
        ACCEPT => Msg::Accept(r.ranks(n)?),
        ACK => Msg::Ack(r.ranks(n)?),
        COMMIT => Msg::Commit(r.ranks(n)?),
        _ => return None,
    };
    r.0.is_empty().then_some(m)
}

/// A message to send: to whom, tagged with the coordinator it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Out {
    pub to: u32,
    pub tag: u32,
    pub msg: Msg,
}

/// One member's side of one agreement, without I/O: events in, messages out (quinn-style), so
/// the protocol is simulated at thousands of ranks in tests and benches.
#[derive(Debug)]
pub(crate) struct Agreement {
    n: u32,
    me: u32,
    suspects: BTreeSet<u32>,
    accepted: Accepted,
    /// As coordinator: each member's STATE, then its ACK of our proposal.
    states: HashMap<u32, (Vec<u32>, Accepted)>,
    proposal: Option<Vec<u32>>,
    acks: BTreeSet<u32>,
    stated_to: Option<u32>,
    decided: Option<Vec<u32>>,
}

impl Agreement {
    pub fn new(n: u32, me: u32) -> Self {
        Agreement {
            n,
            me,
            suspects: BTreeSet::new(),
            accepted: None,
            states: HashMap::new(),
            proposal: None,
            acks: BTreeSet::new(),
            stated_to: None,
            decided: None,
        }
    }

    /// The decided failed set, once known.
    pub fn decided(&self) -> Option<&[u32]> {
        self.decided.as_deref()
    }

    fn alive(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.n).filter(|r| !self.suspects.contains(r))
    }

    fn coordinator(&self) -> u32 {
        self.alive().next().unwrap_or(self.me)
    }

    /// Members seen failed (by the transport); returns what to send.
    pub fn suspect(&mut self, failed: impl IntoIterator<Item = u32>) -> Vec<Out> {
        let me = self.me;
        self.suspects.extend(failed.into_iter().filter(|&r| r != me && r < self.n));
        self.step()
    }

    /// Acts on what is known: as coordinator, propose or commit; otherwise tell the coordinator.
    fn step(&mut self) -> Vec<Out> {
        if self.decided.is_some() {
            return Vec::new();
        }
        let (me, coord) = (self.me, self.coordinator());
        let others: Vec<u32> = self.alive().filter(|&r| r != me).collect();
        if coord != me {
            if self.stated_to == Some(coord) {
                return Vec::new();
            }
            self.stated_to = Some(coord);
            let msg = Msg::State { suspects: self.suspects.iter().copied().collect(), accepted: self.accepted.clone() };
            return vec![Out { to: coord, tag: coord, msg }];
        }
        match self.proposal.clone() {
            None if others.iter().all(|r| self.states.contains_key(r)) => {
                let latest = others.iter().filter_map(|r| self.states.get(r).and_then(|s| s.1.clone()));
                let f = match latest.chain(self.accepted.clone()).max_by_key(|(c, _)| *c) {
                    Some((_, f)) => f,
                    None => {
                        let mut all = self.suspects.clone();
                        others.iter().filter_map(|r| self.states.get(r)).for_each(|s| all.extend(&s.0));
                        all.remove(&me);
                        all.into_iter().collect()
                    }
                };
                self.accepted = Some((me, f.clone()));
                self.proposal = Some(f.clone());
                others.iter().map(|&to| Out { to, tag: me, msg: Msg::Accept(f.clone()) }).collect()
            }
            // Ascending order: if we die part-way, the members that have the decision are the
            // lowest ranks, and each relays it upward (see `receive`).
            Some(f) if others.iter().all(|r| self.acks.contains(r)) => {
                self.decided = Some(f.clone());
                others.iter().map(|&to| Out { to, tag: me, msg: Msg::Commit(f.clone()) }).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Where a received COMMIT goes next: our children in a binary tree over the live ranks (the
    /// decision spreads in log n steps) and our live successor (so it still reaches everyone
    /// when some recipients of the coordinator's commits die or never got them).
    fn relay_targets(&self, src: u32) -> Vec<u32> {
        let alive: Vec<u32> = self.alive().collect();
        let Some(i) = alive.iter().position(|&r| r == self.me) else { return Vec::new() };
        let mut to: Vec<u32> = [i + 1, 2 * i + 1, 2 * i + 2].iter().filter_map(|&j| alive.get(j).copied()).collect();
        to.sort_unstable();
        to.dedup();
        to.retain(|&r| r != src && r != self.me);
        to
    }

    /// A message from member `src` tagged with coordinator `tag`; returns what to send.
    pub fn receive(&mut self, src: u32, tag: u32, msg: Msg) -> Vec<Out> {
        if self.decided.is_some() || src >= self.n {
            return Vec::new();
        }
        let me = self.me;
        let mut out = Vec::new();
        match msg {
            Msg::State { suspects, accepted } if tag == me => {
                // A member that turns to us after we proposed gets the proposal again.
                if let Some(f) = &self.proposal {
                    out.push(Out { to: src, tag: me, msg: Msg::Accept(f.clone()) });
                }
                self.states.insert(src, (suspects, accepted));
            }
            Msg::Accept(f) if tag == self.coordinator() && src == tag => {
                out.push(Out { to: tag, tag, msg: Msg::Ack(f.clone()) });
                self.accepted = Some((tag, f));
            }
            Msg::Ack(f) if tag == me && self.proposal.as_ref() == Some(&f) => {
                self.acks.insert(src);
            }
            Msg::Commit(f) => {
                out.extend(self.relay_targets(src).into_iter().map(|to| Out { to, tag, msg: Msg::Commit(f.clone()) }));
                self.decided = Some(f);
                return out;
            }
            _ => {} // addressed to an earlier coordinator: stale
        }
        out.extend(self.step());
        out
    }
}

fn send_all(c: &CommInner, instance: u64, outs: Vec<Out>) {
    for Out { to, tag, msg } in outs {
        tracing::debug!(instance, to, tag, ?msg, "agreement: send");
        let payload = encode(&msg);
        let hdr = FrameHeader {
            kind: FrameKind::Agree,
            comm_id: c.id,
            epoch: c.epoch,
            seq: instance,
            tag,
            len: payload.len() as u64,
        };
        // A member that cannot be reached is found failed by the transport and drops out of the
        // live set on the next turn.
        let _ = c.net.send(c.members[to as usize], &hdr, &payload);
    }
}

/// Runs agreement instance `instance` of communicator `c`; returns the decided failed set
/// (communicator ranks, ascending), identical on every survivor.
pub(crate) fn agree(c: &CommInner, instance: u64) -> Result<Vec<u32>> {
    let _span = tracing::debug_span!("agree", instance, rank = c.rank).entered();
    let n = c.members.len() as u32;
    let deadline = Instant::now() + c.timeout;
    let mut a = Agreement::new(n, c.rank);
    loop {
        // Counted before the failures are read: one that lands in between ends the wait below.
        let planned_with = c.net.inbox.gone_count();
        send_all(c, instance, a.suspect(c.gone_now()));
        if let Some(f) = a.decided() {
            return Ok(f.to_vec());
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::timeout(format!("shrink: no agreement within {} ms", c.timeout.as_millis())));
        }
        let Some((src_world, frame)) =
            c.net.inbox.take_any(FrameKind::Agree, c.id, instance, planned_with, deadline - now)
        else {
            continue;
        };
        let Some(src) = c.members.iter().position(|&w| w == src_world).map(|r| r as u32) else {
            tracing::debug!(src_world, "agreement: message from a non-member ignored");
            continue;
        };
        tracing::debug!(instance, src, tag = frame.hdr.tag, "agreement: received");
        match decode(&frame.payload, n) {
            Some(msg) => send_all(c, instance, a.receive(src, frame.hdr.tag, msg)),
            None => tracing::warn!(src, "shrink: ignored a malformed agreement message"),
        }
        if let Some(f) = a.decided() {
            return Ok(f.to_vec());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let msgs = [
            Msg::State { suspects: vec![1, 3], accepted: None },
            Msg::State { suspects: vec![], accepted: Some((2, vec![0, 1])) },
            Msg::Accept(vec![3]),
            Msg::Ack(vec![]),
            Msg::Commit(vec![0, 2]),
        ];
        for m in msgs {
            assert_eq!(decode(&encode(&m), 4), Some(m.clone()));
            let b = encode(&m);
            assert_eq!(decode(&b[..b.len() - 1], 4), None, "truncated {m:?}");
        }
        assert_eq!(decode(&encode(&Msg::Accept(vec![9])), 4), None, "rank out of range");
        assert_eq!(decode(&[ACCEPT, 0xff, 0xff, 0xff, 0xff], 4), None, "absurd length");
        assert_eq!(decode(&[42], 4), None);
    }
}
