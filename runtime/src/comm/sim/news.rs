//! Detection and the news of it: a watcher that loses a peer tells the others, and a rank that
//! learns of a failure enters the agreement.

use std::collections::BTreeSet;
use std::rc::Rc;

use super::clock::Tree;
use super::route;
use super::world::{Sim, Wire};
use super::Spread;
use crate::comm::view::Knowledge;

/// Watcher `w`'s own link to `p` is lost: by EOF (`sure`: the process is gone) or by silence
/// (cut off: it may be alive behind a partition, and is told so by `Evict`). Like the
/// runtime's watchdog, `w` stops watching it, watches the next live rank instead, and tells
/// the others.
pub(super) fn lose(sim: &mut Sim, w: u32, p: u32, sure: bool) {
    if !sim.alive(w) || sim.ranks[w as usize].lost.contains(&p) {
        return;
    }
    sim.ranks[w as usize].lost.push(p);
    sim.rewatch(w);
    if p == sim.cfg.victim && sim.detected.is_none() {
        sim.detected = Some(sim.now);
    }
    let mut own = Knowledge::default();
    if sure {
        own.dead.insert(p);
    } else {
        own.cut(w, p);
        sim.send(w, p, Wire::Evict);
    }
    announce(sim, w, p);
    merge(sim, w, &own);
}

/// `w` tells the members it does not believe failed that it lost `p` (as the runtime's
/// `Inbox::losses`: its own losses, and the ranks others reported lost).
fn announce(sim: &mut Sim, w: u32, p: u32) {
    let rank = &sim.ranks[w as usize];
    let mut failed: BTreeSet<u32> = rank.reported.iter().chain(&rank.lost).chain(&rank.know.dead).copied().collect();
    failed.remove(&w);
    let live: Vec<u32> = (0..sim.cfg.ranks).filter(|r| !failed.contains(r)).collect();
    match sim.cfg.protocol.spread {
        Spread::All => {
            for r in live.into_iter().filter(|&r| r != w) {
                sim.send(w, r, Wire::Suspect { reporter: w, lost: p, tree: None });
            }
        }
        Spread::Tree => {
            if let Some(tree) = Tree::new(live, w) {
                forward(sim, w, &Rc::new(tree), w, p);
            }
        }
    }
}

/// Sends a notice on to `at`'s children in its tree.
fn forward(sim: &mut Sim, at: u32, tree: &Rc<Tree>, reporter: u32, lost: u32) {
    let Some(pos) = tree.position(at) else { return };
    let children: Vec<u32> = tree.children(pos).collect();
    for c in children {
        sim.send(at, c, Wire::Suspect { reporter, lost, tree: Some(tree.clone()) });
    }
}

/// A `Suspect` notice reached `r`: as `Inbox::note_suspects`, the link between reporter and
/// lost is known lost. Along a tree it is forwarded first (by the transport, whether or not
/// the rank is in the agreement yet).
pub(super) fn suspect(sim: &mut Sim, r: u32, reporter: u32, lost: u32, tree: Option<Rc<Tree>>) {
    if let Some(tree) = tree {
        forward(sim, r, &tree, reporter, lost);
    }
    if lost != r && reporter != r {
        sim.ranks[r as usize].reported.insert(lost);
        let mut k = Knowledge::default();
        k.cut(reporter, lost);
        merge(sim, r, &k);
    }
}

/// `r` learns `k`: if anything is new, it notes which failures it now knows of, and its
/// `agree()` loop will wake to read it.
pub(super) fn merge(sim: &mut Sim, r: u32, k: &Knowledge) {
    if !sim.ranks[r as usize].know.merge(k) {
        return;
    }
    let now = sim.now;
    let failed: Vec<u32> = sim.failures.iter().map(|f| f.0).collect();
    let rank = &mut sim.ranks[r as usize];
    for f in failed {
        let mentioned = rank.know.dead.contains(&f) || rank.know.cuts.iter().any(|&(a, b)| a == f || b == f);
        if mentioned && !rank.learnt.iter().any(|e| e.0 == f) {
            rank.learnt.push((f, now));
        }
    }
    sim.schedule_wake(r);
}

/// `r`'s `agree()` loop wakes: on the first news it enters the agreement (its blocked call
/// failed and it shrinks), then it gives the state machine all it knows, and the messages that
/// came before it entered.
pub(super) fn wake(sim: &mut Sim, r: u32) {
    let rank = &mut sim.ranks[r as usize];
    rank.wake_pending = false;
    if !rank.entered && rank.know.size() == 0 {
        return;
    }
    rank.entered = true;
    let k = rank.know.clone();
    let held = std::mem::take(&mut rank.held);
    let outs = sim.step(r, true, |a| a.learn(&k));
    route::send_outs(sim, r, outs, false);
    for h in held {
        if !sim.alive(r) {
            return;
        }
        route::deliver_held(sim, r, h);
    }
}
