//! How the agreement's messages travel: point to point as the state machine addresses them, or
//! (`Gather::Tree`) the coordinator's fan-out down a tree over its destinations and the votes
//! back up it, one per subtree. The state machine is the runtime's own, unchanged: the tree
//! gathers votes on the way up and hands the coordinator the same PROMISE, REJECT and ACCEPTED
//! messages it would have read one by one (one CPU charge per aggregate).

use std::collections::BTreeSet;
use std::rc::Rc;

use super::clock::Tree;
use super::news;
use super::world::{Sim, Wire};
use super::Gather;
use crate::comm::agree::{Ballot, Msg, Out};
use crate::comm::view::Knowledge;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Phase {
    Promise,
    Accepted,
}

/// Votes are gathered per ballot and phase.
pub(super) type Key = (Ballot, Phase);

/// An agreement message that reached a rank before it entered the agreement.
pub(super) enum Held {
    Direct(u32, Msg),
    Down(Rc<Tree>, Msg),
}

/// The votes of a subtree, merged: what the coordinator needs of them.
#[derive(Debug, Clone, Default)]
pub(super) struct Summary {
    /// The refusal with the highest promised ballot: (rank, ballot, its knowledge).
    refused: Option<(u32, Ballot, Knowledge)>,
    /// The value accepted under the highest ballot: (rank, ballot, failed set).
    accepted: Option<(u32, Ballot, Vec<u32>)>,
    know: Knowledge,
}

impl Summary {
    /// Rank `r`'s own replies to the coordinator.
    fn of(r: u32, replies: Vec<Out>) -> Summary {
        let mut s = Summary::default();
        for o in replies {
            match o.msg {
                Msg::Promise { accepted, know, .. } => {
                    s.accepted = accepted.map(|(b, f)| (r, b, f));
                    s.know.merge(&know);
                }
                Msg::Reject { promised, know } => s.refused = Some((r, promised, know)),
                _ => {}
            }
        }
        s
    }

    fn merge(&mut self, o: Summary) {
        if o.refused.as_ref().map(|x| x.1) > self.refused.as_ref().map(|x| x.1) {
            self.refused = o.refused;
        }
        if o.accepted.as_ref().map(|x| x.1) > self.accepted.as_ref().map(|x| x.1) {
            self.accepted = o.accepted;
        }
        self.know.merge(&o.know);
    }
}

/// A rank's gathering of one phase's votes: its own and its children's.
pub(super) struct Pending {
    need: usize,
    got: usize,
    sum: Summary,
}

fn is_reply(m: &Msg) -> bool {
    matches!(m, Msg::Promise { .. } | Msg::Reject { .. } | Msg::Accepted { .. })
}

/// What the coordinator sends to all of its kept (or reachable) ranks at once.
fn is_fan_out(m: &Msg) -> bool {
    matches!(m, Msg::Prepare { .. } | Msg::Accept { .. } | Msg::Lost { .. } | Msg::Commit { .. })
}

/// A point-to-point agreement message reached `r`.
pub(super) fn direct(sim: &mut Sim, r: u32, from: u32, msg: Msg) {
    if !sim.ranks[r as usize].entered {
        revoke(sim, r, &msg);
        sim.ranks[r as usize].held.push(Held::Direct(from, msg));
        return;
    }
    let relay = matches!(msg, Msg::Commit { .. });
    let outs = sim.step(r, true, |a| a.receive(from, msg));
    send_outs(sim, r, outs, relay);
}

/// The coordinator's fan-out reached `r` down `tree`: forwarded at once, read when `r` is in
/// the agreement.
pub(super) fn down(sim: &mut Sim, r: u32, tree: Rc<Tree>, msg: Msg) {
    let Some(pos) = tree.position(r) else { return };
    let children: Vec<u32> = tree.children(pos).collect();
    for c in children {
        sim.send(r, c, Wire::Down { tree: tree.clone(), msg: msg.clone() });
    }
    if sim.ranks[r as usize].entered {
        deliver_down(sim, r, tree, msg);
    } else {
        revoke(sim, r, &msg);
        sim.ranks[r as usize].held.push(Held::Down(tree, msg));
    }
}

/// Agreement traffic reached `r` before any news did. Today it waits in the inbox until `r`
/// hears of a failure. With the tree protocol it revokes: `r` enters the agreement at once
/// (its pending call fails, as ULFM's revoke), taking the knowledge it carries as news, so
/// that a rank a notice missed (its tree crossed a rank that died since) neither stalls its
/// subtree's votes nor misses the decision.
fn revoke(sim: &mut Sim, r: u32, msg: &Msg) {
    if sim.cfg.protocol.gather != Gather::Tree {
        return;
    }
    if let Msg::Know(k) | Msg::Prepare { know: k, .. } | Msg::Lost { know: k } = msg {
        news::merge(sim, r, k);
    }
    sim.ranks[r as usize].entered = true;
    sim.schedule_wake(r);
}

pub(super) fn deliver_held(sim: &mut Sim, r: u32, h: Held) {
    match h {
        Held::Direct(from, msg) => direct(sim, r, from, msg),
        Held::Down(tree, msg) => deliver_down(sim, r, tree, msg),
    }
}

/// `r` reads a fan-out message; its reply joins its subtree's vote.
fn deliver_down(sim: &mut Sim, r: u32, tree: Rc<Tree>, msg: Msg) {
    let coord = tree.root();
    let key = match &msg {
        Msg::Prepare { ballot, .. } => Some((*ballot, Phase::Promise)),
        Msg::Accept { ballot, .. } => Some((*ballot, Phase::Accepted)),
        _ => None,
    };
    let relay = matches!(msg, Msg::Commit { .. });
    let outs = sim.step(r, true, |a| a.receive(coord, msg));
    let (replies, rest): (Vec<Out>, Vec<Out>) = outs.into_iter().partition(|o| o.to == coord && is_reply(&o.msg));
    send_outs(sim, r, rest, relay);
    if let Some(key) = key.filter(|_| !replies.is_empty() && sim.alive(r)) {
        gather(sim, r, key, &tree, Summary::of(r, replies));
    }
}

/// Adds a vote (`r`'s own or a child's) to `r`'s gathering; when its own and all its
/// children's are in, one vote goes to its parent.
fn gather(sim: &mut Sim, r: u32, key: Key, tree: &Rc<Tree>, part: Summary) {
    let Some(pos) = tree.position(r) else { return };
    let need = 1 + tree.children(pos).count();
    let rank = &mut sim.ranks[r as usize];
    let p = rank.gather.entry(key).or_insert_with(|| Pending { need, got: 0, sum: Summary::default() });
    p.sum.merge(part);
    p.got += 1;
    if p.got < p.need {
        return;
    }
    let Some(done) = rank.gather.remove(&key) else { return };
    if let Some(parent) = tree.parent(pos) {
        sim.send(r, parent, Wire::Up { key, tree: tree.clone(), sum: done.sum });
    }
}

/// A subtree's vote reached `r`: gathered on, or, at the coordinator, read.
pub(super) fn up(sim: &mut Sim, r: u32, from: u32, key: Key, tree: Rc<Tree>, sum: Summary) {
    if tree.root() != r {
        gather(sim, r, key, &tree, sum);
        return;
    }
    let Some(pos) = tree.position(from) else { return };
    // One call into a state machine that took a subtree's vote whole: the aggregate costs one
    // step, whatever the number of ranks it speaks for.
    sim.charge(r, sim.step_cost());
    let (ballot, phase) = key;
    if let Some((who, promised, know)) = sum.refused {
        let outs = sim.step(r, false, |a| a.receive(who, Msg::Reject { promised, know }));
        send_outs(sim, r, outs, false);
        return;
    }
    // Highest rank first: the state machine's "every kept rank voted?" test then stops at
    // once until the last vote.
    let members = tree.subtree(pos);
    let mut know = Some(sum.know);
    for m in members.into_iter().rev() {
        let msg = match phase {
            Phase::Promise => Msg::Promise {
                ballot,
                accepted: sum.accepted.as_ref().filter(|a| a.0 == m).map(|a| (a.1, a.2.clone())),
                know: know.take().unwrap_or_default(),
            },
            Phase::Accepted => Msg::Accepted { ballot },
        };
        let outs = sim.step(r, false, |a| a.receive(m, msg));
        send_outs(sim, r, outs, false);
        if !sim.alive(r) {
            return;
        }
    }
}

/// Sends what `r`'s state machine returned. `relay`: it read a COMMIT, and its COMMITs are the
/// relays the state machine makes (point to point in both modes).
pub(super) fn send_outs(sim: &mut Sim, r: u32, outs: Vec<Out>, relay: bool) {
    match sim.cfg.protocol.gather {
        Gather::Direct => {
            let accepts = outs.iter().filter(|o| matches!(o.msg, Msg::Accept { .. })).count();
            let budget = sim.accepts_before_failing(accepts);
            let wires = outs.into_iter().map(|o| (o.to, Wire::Agree(o.msg))).collect();
            send_wires(sim, r, wires, budget);
        }
        Gather::Tree => send_by_tree(sim, r, outs, relay),
    }
}

/// Sends `wires`; a coordinator doomed to fail does after `budget` of its ACCEPTs.
fn send_wires(sim: &mut Sim, r: u32, wires: Vec<(u32, Wire)>, mut budget: Option<usize>) {
    for (to, wire) in wires {
        let accept = matches!(&wire, Wire::Agree(Msg::Accept { .. }) | Wire::Down { msg: Msg::Accept { .. }, .. });
        if accept {
            if budget == Some(0) {
                sim.fail(r);
                return;
            }
            budget = budget.map(|b| b - 1);
        }
        sim.send(r, to, wire);
    }
}

fn send_by_tree(sim: &mut Sim, r: u32, outs: Vec<Out>, relay: bool) {
    let mut fans: Vec<(Msg, Vec<u32>)> = Vec::new();
    let mut wires: Vec<(u32, Wire)> = Vec::new();
    for o in outs {
        if is_fan_out(&o.msg) && !relay {
            match fans.iter_mut().find(|f| std::mem::discriminant(&f.0) == std::mem::discriminant(&o.msg)) {
                Some(f) => f.1.push(o.to),
                None => fans.push((o.msg, vec![o.to])),
            }
        } else if let Msg::Know(k) = o.msg {
            wires.push(know_up(sim, r, o.to, k));
        } else {
            wires.push((o.to, Wire::Agree(o.msg)));
        }
    }
    let mut accepts = 0;
    for (msg, mut to) in fans {
        to.push(r);
        to.sort_unstable();
        to.dedup();
        let Some(tree) = Tree::new(to, r).map(Rc::new) else { continue };
        let children: Vec<u32> = tree.children(0).collect();
        accepts += if matches!(msg, Msg::Accept { .. }) { children.len() } else { 0 };
        wires.extend(children.into_iter().map(|c| (c, Wire::Down { tree: tree.clone(), msg: msg.clone() })));
    }
    let budget = sim.accepts_before_failing(accepts);
    send_wires(sim, r, wires, budget);
}

/// Where `r`'s knowledge for coordinator `coord` goes: to its parent in the tree rooted at the
/// coordinator over the ranks its knowledge names in no failure (found in O(failures), as a
/// runtime would), or, for a rank it names, straight to the coordinator.
fn know_up(sim: &Sim, r: u32, coord: u32, k: Knowledge) -> (u32, Wire) {
    let mut named: BTreeSet<u32> = k.dead.clone();
    named.extend(k.cuts.iter().flat_map(|&(a, b)| [a, b]));
    named.remove(&coord);
    match ring_parent(sim.cfg.ranks, &named, coord, r) {
        Some(parent) => (parent, Wire::KnowUp(k)),
        None => (coord, Wire::Agree(Msg::Know(k))),
    }
}

/// `r`'s parent in the [`Tree`] rooted at `root` over the ranks below `n` not in `skip`
/// (`None` for the root and for skipped ranks), without listing those ranks.
fn ring_parent(n: u32, skip: &BTreeSet<u32>, root: u32, r: u32) -> Option<u32> {
    if skip.contains(&r) || skip.contains(&root) || r == root {
        return None;
    }
    let index = |x: u32| u64::from(x) - skip.range(..x).count() as u64;
    let len = u64::from(n) - skip.len() as u64;
    let pos = (index(r) + len - index(root)) % len;
    let mut parent = ((index(root) + (pos - 1) / 2) % len) as u32;
    // The rank at that index: step over the skipped ranks at or below it.
    for &x in skip {
        if x <= parent {
            parent += 1;
        }
    }
    Some(parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_over_a_ring_with_holes_is_the_trees() {
        let n = 40;
        let skip: BTreeSet<u32> = [0, 3, 4, 17, 39].into();
        let live: Vec<u32> = (0..n).filter(|r| !skip.contains(r)).collect();
        for &root in &live {
            let tree = Tree::new(live.clone(), root).expect("member");
            for &r in &live {
                let want = tree.parent(tree.position(r).expect("member"));
                assert_eq!(ring_parent(n, &skip, root, r), want, "root {root}, rank {r}");
            }
            assert_eq!(ring_parent(n, &skip, root, 3), None);
        }
    }
}
