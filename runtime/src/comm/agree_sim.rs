//! A deterministic simulation of the agreement protocol with thousands of virtual ranks: every
//! message goes through per-link FIFO queues delivered in random order, failures are noticed by
//! each survivor at a random moment, and a coordinator may crash part-way through its sends.
//! Used by tests (safety at many seeds); `comm::sim` runs the same state machine together with
//! failure detection, in simulated time, for the cost at scale (`hccn-agree-sim`).

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::agree::{Agreement, Out, Outcome};
use super::view::Knowledge;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub ranks: u32,
    /// Ranks dead before the agreement starts.
    pub failed: Vec<u32>,
    /// If set, the first coordinator crashes after sending this many messages.
    pub coordinator_crash_after: Option<usize>,
    pub seed: u64,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimReport {
    /// The set every surviving rank decided, if they all decided the same one.
    pub agreed: Option<Vec<u32>>,
    /// Survivors that never decided (a liveness failure).
    pub undecided: usize,
    pub messages: u64,
    /// Longest causal chain of messages (the protocol's rounds, in message delays).
    pub depth: u64,
    pub elapsed: Duration,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*: deterministic and dependency-free.
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

struct Node {
    a: Agreement,
    alive: bool,
    depth: u64,
    sent: usize,
}

/// Runs one simulated agreement.
pub fn simulate(cfg: &SimConfig) -> SimReport {
    let start = Instant::now();
    let n = cfg.ranks;
    let mut rng = Rng(cfg.seed.max(1));
    let mut nodes: Vec<Node> =
        (0..n).map(|r| Node { a: Agreement::new(n, r, false), alive: true, depth: 0, sent: 0 }).collect();
    let mut crashed: BTreeSet<u32> = cfg.failed.iter().copied().filter(|&r| r < n).collect();
    for &r in &crashed {
        nodes[r as usize].alive = false;
    }
    // Links with pending messages, FIFO each: (from, to) -> (msg, depth).
    let mut links: HashMap<(u32, u32), VecDeque<Out>> = HashMap::new();
    let mut depths: HashMap<(u32, u32), VecDeque<u64>> = HashMap::new();
    let mut busy: Vec<(u32, u32)> = Vec::new();
    // Failure notices not yet delivered: (survivor, failed rank).
    let mut notices: Vec<(u32, u32)> = Vec::new();
    for r in 0..n {
        for &f in &crashed {
            if r != f {
                notices.push((r, f));
            }
        }
    }
    let coordinator = (0..n).find(|r| !crashed.contains(r)).unwrap_or(0);
    let mut messages = 0u64;

    let emit = |from: u32,
                outs: Vec<Out>,
                nodes: &mut Vec<Node>,
                crashed: &mut BTreeSet<u32>,
                notices: &mut Vec<(u32, u32)>,
                links: &mut HashMap<(u32, u32), VecDeque<Out>>,
                depths: &mut HashMap<(u32, u32), VecDeque<u64>>,
                busy: &mut Vec<(u32, u32)>| {
        for out in outs {
            if !nodes[from as usize].alive {
                return;
            }
            if from == coordinator && cfg.coordinator_crash_after == Some(nodes[from as usize].sent) {
                nodes[from as usize].alive = false;
                crashed.insert(from);
                (0..n).filter(|&r| r != from).for_each(|r| notices.push((r, from)));
                return;
            }
            nodes[from as usize].sent += 1;
            let key = (from, out.to);
            let q = links.entry(key).or_default();
            if q.is_empty() {
                busy.push(key);
            }
            q.push_back(out);
            depths.entry(key).or_default().push_back(nodes[from as usize].depth + 1);
        }
    };

    // Every survivor starts with the failures it already knows of (none yet) and speaks.
    for r in 0..n {
        if nodes[r as usize].alive {
            let outs = nodes[r as usize].a.learn(&Knowledge::default());
            emit(r, outs, &mut nodes, &mut crashed, &mut notices, &mut links, &mut depths, &mut busy);
        }
    }
    loop {
        let pending = busy.len() + notices.len();
        if pending == 0 {
            break;
        }
        let pick = rng.below(pending);
        if pick < busy.len() {
            let key = busy[pick];
            let q = links.get_mut(&key).map(|q| (q.pop_front(), q.is_empty()));
            let d = depths.get_mut(&key).and_then(|q| q.pop_front()).unwrap_or(0);
            let Some((Some(out), empty)) = q else { continue };
            if empty {
                busy.swap_remove(pick);
            }
            let (from, to) = key;
            if !nodes[to as usize].alive {
                continue;
            }
            messages += 1;
            let node = &mut nodes[to as usize];
            node.depth = node.depth.max(d);
            let outs = node.a.receive(from, out.msg);
            emit(to, outs, &mut nodes, &mut crashed, &mut notices, &mut links, &mut depths, &mut busy);
        } else {
            let (r, f) = notices.swap_remove(pick - busy.len());
            if nodes[r as usize].alive {
                let outs = nodes[r as usize].a.learn(&Knowledge { dead: [f].into(), ..Knowledge::default() });
                emit(r, outs, &mut nodes, &mut crashed, &mut notices, &mut links, &mut depths, &mut busy);
            }
        }
    }
    let survivors: Vec<&Node> = nodes.iter().filter(|x| x.alive).collect();
    let decided_of = |x: &Node| match x.a.outcome() {
        Some(Outcome::Decided(f)) => Some(f.clone()),
        _ => None,
    };
    let decided: BTreeSet<Vec<u32>> = survivors.iter().filter_map(|x| decided_of(x)).collect();
    let undecided = survivors.iter().filter(|x| decided_of(x).is_none()).count();
    SimReport {
        agreed: if decided.len() == 1 { decided.into_iter().next() } else { None },
        undecided,
        messages,
        depth: nodes.iter().map(|x| x.depth).max().unwrap_or(0),
        elapsed: start.elapsed(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survivors_agree_on_exactly_the_dead() {
        for seed in 1..200u64 {
            let n = 3 + (seed % 14) as u32;
            let failed: Vec<u32> =
                (0..n).filter(|r| (r * 7 + seed as u32).is_multiple_of(5)).take(n as usize - 1).collect();
            let rep = simulate(&SimConfig { ranks: n, failed: failed.clone(), coordinator_crash_after: None, seed });
            assert_eq!(rep.undecided, 0, "seed {seed}: {rep:?}");
            assert_eq!(rep.agreed, Some(failed), "seed {seed}");
        }
    }

    #[test]
    fn a_coordinator_crashing_at_any_point_never_splits_the_survivors() {
        for seed in 1..400u64 {
            let n = 4 + (seed % 9) as u32;
            let crash_after = (seed / 3) as usize % (4 * n as usize);
            let cfg = SimConfig { ranks: n, failed: vec![n - 1], coordinator_crash_after: Some(crash_after), seed };
            let rep = simulate(&cfg);
            assert_eq!(rep.undecided, 0, "seed {seed} crash after {crash_after}: {rep:?}");
            let agreed = rep.agreed.unwrap_or_else(|| panic!("seed {seed}: survivors decided differently"));
            assert!(agreed.contains(&(n - 1)), "seed {seed}: the dead rank must be in {agreed:?}");
            assert!(agreed.iter().all(|&r| r == 0 || r == n - 1), "seed {seed}: a live rank was excluded: {agreed:?}");
        }
    }

    #[test]
    fn thousands_of_ranks_need_few_rounds() {
        let rep = simulate(&SimConfig { ranks: 1024, failed: vec![3, 700], coordinator_crash_after: None, seed: 9 });
        assert_eq!(rep.agreed, Some(vec![3, 700]));
        // KNOW, PREPARE, PROMISE, ACCEPT, ACCEPTED, COMMIT (a PREPARE round again when the
        // coordinator learns of a failure it had not seen), plus relays racing the direct
        // commits: a few message delays, whatever the size; each rank sends a constant number.
        assert!(rep.depth <= 16, "rounds grew with the size: {rep:?}");
        assert!(rep.messages <= 16 * 1024, "messages grew faster than the size: {rep:?}");
    }
}
