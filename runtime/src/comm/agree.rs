//! Agreement among survivors on the failed set, in band over the existing connections (no
//! store), as ULFM's agree. Crash failures are detected by the transport (EOF, reset), so every
//! survivor eventually suspects exactly the dead.
//!
//! The coordinator is the lowest rank a survivor believes alive. It collects every live
//! member's STATE (suspects, and any value it already accepted), proposes a failed set with
//! ACCEPT (the latest accepted value if there is one, else the union of suspects), waits for
//! every live member's ACK, then sends COMMIT. A member that receives COMMIT relays it to all
//! before returning, so if a coordinator dies after committing to one survivor, all learn the
//! decision. A coordinator commits only after every live member accepted, so any later
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
enum Msg {
    State { suspects: Vec<u32>, accepted: Accepted },
    Accept(Vec<u32>),
    Ack(Vec<u32>),
    Commit(Vec<u32>),
}

fn put_ranks(out: &mut Vec<u8>, ranks: &[u32]) {
    out.extend_from_slice(&(ranks.len() as u32).to_le_bytes());
    ranks.iter().for_each(|r| out.extend_from_slice(&r.to_le_bytes()));
}

fn encode(m: &Msg) -> Vec<u8> {
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
fn decode(b: &[u8], n: u32) -> Option<Msg> {
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

fn send(c: &CommInner, instance: u64, to: u32, coord: u32, m: &Msg) {
    let payload = encode(m);
    let hdr = FrameHeader {
        kind: FrameKind::Agree,
        comm_id: c.id,
        epoch: c.epoch,
        seq: instance,
        tag: coord,
        len: payload.len() as u64,
    };
    // A member that cannot be reached is found failed by the transport and drops out of the
    // live set on the next turn of the loop.
    let _ = c.net.send(c.members[to as usize], &hdr, &payload);
}

/// Runs agreement instance `instance` of communicator `c`; returns the decided failed set
/// (communicator ranks, ascending), identical on every survivor.
pub(crate) fn agree(c: &CommInner, instance: u64) -> Result<Vec<u32>> {
    let n = c.members.len() as u32;
    let me = c.rank;
    let deadline = Instant::now() + c.timeout;
    let mut suspects: BTreeSet<u32> = BTreeSet::new();
    let mut accepted: Accepted = None;
    // Collected as coordinator: each member's STATE, then its ACK of our proposal.
    let mut states: HashMap<u32, (Vec<u32>, Accepted)> = HashMap::new();
    let mut proposal: Option<Vec<u32>> = None;
    let mut acks: BTreeSet<u32> = BTreeSet::new();
    let mut stated_to: Option<u32> = None;
    loop {
        // Counted before the failures are read: one that lands in between ends the wait below.
        let planned_with = c.net.inbox.failed_count();
        suspects.extend(c.failed_now().into_iter().filter(|&r| r != me));
        let alive: Vec<u32> = (0..n).filter(|r| !suspects.contains(r)).collect();
        let coord = alive.first().copied().unwrap_or(me);
        let others: Vec<u32> = alive.iter().copied().filter(|&r| r != me).collect();
        if coord == me {
            match &proposal {
                None if others.iter().all(|r| states.contains_key(r)) => {
                    let latest =
                        others.iter().filter_map(|r| states.get(r).and_then(|s| s.1.clone())).chain(accepted.clone());
                    let f: Vec<u32> = match latest.max_by_key(|(coord, _)| *coord) {
                        Some((_, f)) => f,
                        None => {
                            let mut all = suspects.clone();
                            others.iter().filter_map(|r| states.get(r)).for_each(|s| all.extend(&s.0));
                            all.remove(&me);
                            all.into_iter().collect()
                        }
                    };
                    others.iter().for_each(|&r| send(c, instance, r, me, &Msg::Accept(f.clone())));
                    accepted = Some((me, f.clone()));
                    proposal = Some(f);
                }
                Some(f) if others.iter().all(|r| acks.contains(r)) => {
                    others.iter().for_each(|&r| send(c, instance, r, me, &Msg::Commit(f.clone())));
                    return Ok(f.clone());
                }
                _ => {}
            }
        } else if stated_to != Some(coord) {
            let state = Msg::State { suspects: suspects.iter().copied().collect(), accepted: accepted.clone() };
            send(c, instance, coord, coord, &state);
            stated_to = Some(coord);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(Error::timeout(format!(
                "shrink: no agreement within {} ms (live members seen: {alive:?})",
                c.timeout.as_millis()
            )));
        }
        let Some((src_world, frame)) =
            c.net.inbox.take_any(FrameKind::Agree, c.id, instance, planned_with, deadline - now)
        else {
            continue;
        };
        let Some(src) = c.members.iter().position(|&w| w == src_world).map(|r| r as u32) else { continue };
        let tag = frame.hdr.tag;
        let Some(msg) = decode(&frame.payload, n) else {
            tracing::warn!(src, "shrink: ignored a malformed agreement message");
            continue;
        };
        match msg {
            Msg::State { suspects: s, accepted: a } if tag == me => {
                // A member that turns to us after we proposed gets the proposal again.
                if let Some(f) = &proposal {
                    send(c, instance, src, me, &Msg::Accept(f.clone()));
                }
                states.insert(src, (s, a));
            }
            Msg::Accept(f) if tag == coord && src == coord => {
                send(c, instance, coord, coord, &Msg::Ack(f.clone()));
                accepted = Some((coord, f));
            }
            Msg::Ack(f) if tag == me && proposal.as_ref() == Some(&f) => {
                acks.insert(src);
            }
            Msg::Commit(f) => {
                alive
                    .iter()
                    .filter(|&&r| r != me && r != src)
                    .for_each(|&r| send(c, instance, r, tag, &Msg::Commit(f.clone())));
                return Ok(f);
            }
            _ => {} // addressed to an earlier coordinator: stale
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
