//! Failure detection and the shrink agreement together, in simulated time, at up to tens of
//! thousands of ranks: deterministic by seed, no sockets, no threads.
//!
//! The model. Every rank heartbeats (a frame and a pulse) the peers the runtime's own
//! [`watched_in_ring`] picks, every `heartbeat`. One rank, the victim, crashes or freezes at
//! `fail_at`. Only its watchers find out (at 16,384 ranks with connections on demand most ranks
//! hold no link to it): on a crash the kernel closes its sockets and each watcher sees EOF one
//! link latency later; on a freeze a watcher finds at its next tick that it heard nothing for
//! `dead_after`. A watcher that loses a peer tells the others (`Suspect`): to every member, as the
//! runtime does today, or along a binary tree rooted at itself ([`Spread`]). A rank that hears
//! of a failure enters the agreement (its blocked call fails and it shrinks) and runs the real
//! [`Agreement`] state machine, whose messages go point to point as today or, for the
//! coordinator's fan-out and its votes, down and up a tree over the kept ranks ([`Gather`]).
//! Optionally the coordinator fails too, half-way through sending its ACCEPTs.
//!
//! Costs. A message takes `latency` ± `jitter` on the wire, FIFO per link as TCP; each rank has
//! one CPU: reading or sending a message takes `overhead`, and each step of the agreement state
//! machine takes [`StepCost`] (today's machine is O(n) per call). Heartbeats take no CPU. News
//! wakes a rank's `agree()` thread after `wakeup`, and what came meanwhile is read in one turn:
//! without it each of a crash's six notices would cost a rank a step of its own.
//!
//! [`watched_in_ring`]: crate::transport::heartbeat::watched_in_ring
//! [`Agreement`]: super::agree::Agreement

mod clock;
mod news;
mod route;
mod world;

use std::time::Duration;

/// How the victim fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The process dies: its watchers see EOF.
    Crash,
    /// The process (or its host) stops: its watchers find it silent for `dead_after`.
    Freeze,
}

/// How a watcher tells the others of a peer it lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spread {
    /// A `Suspect` frame to every other member (the runtime today): O(n) sends for each watcher.
    All,
    /// Along a binary tree over the live ring rooted at the watcher; each rank forwards to at
    /// most two: O(1) per rank and per watcher, log2(n) hops.
    Tree,
}

/// How the agreement's messages travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gather {
    /// Point to point, as the state machine addresses them (the runtime today): every rank
    /// tells the coordinator, which sends to and hears from every kept rank.
    Direct,
    /// The coordinator's PREPARE, ACCEPT and COMMIT go down a binary tree over the kept ranks;
    /// the PROMISEs and ACCEPTEDs come back up it, each rank sending one vote for its subtree
    /// (the latest accepted value, refusals and knowledge merged); knowledge for the
    /// coordinator goes up the same tree, each rank forwarding only what is new to it.
    Tree,
}

/// Simulated CPU time of one call into the agreement state machine: `fixed + per_rank * n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepCost {
    pub fixed: Duration,
    pub per_rank: Duration,
}

impl StepCost {
    /// Today's state machine: every step recomputes the kept set and the quorum over all n
    /// ranks, measured at about 9 ns per rank on the 2-core development machine (148 µs a
    /// call at 16,384 ranks).
    pub const LINEAR: StepCost = StepCost { fixed: Duration::from_micros(2), per_rank: Duration::from_nanos(9) };
    /// A step that works on what changed (kept set and vote counts kept up to date).
    pub const CONSTANT: StepCost = StepCost { fixed: Duration::from_micros(5), per_rank: Duration::ZERO };
}

/// Which protocol runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protocol {
    pub spread: Spread,
    pub gather: Gather,
    pub step: StepCost,
}

impl Protocol {
    /// What the runtime does today.
    pub const TODAY: Protocol = Protocol { spread: Spread::All, gather: Gather::Direct, step: StepCost::LINEAR };
    /// Today's messages with a state machine whose step does not grow with n: what the
    /// message pattern alone costs.
    pub const TODAY_CONSTANT_STEP: Protocol =
        Protocol { spread: Spread::All, gather: Gather::Direct, step: StepCost::CONSTANT };
    /// Trees for notices and votes, and a state machine whose step does not grow with n.
    pub const SCALABLE: Protocol = Protocol { spread: Spread::Tree, gather: Gather::Tree, step: StepCost::CONSTANT };
    /// Trees for notices and votes with today's state machine: what the trees alone buy, since
    /// every rank still pays an O(n) step for each thing it learns or reads.
    pub const TREES_LINEAR_STEP: Protocol =
        Protocol { spread: Spread::Tree, gather: Gather::Tree, step: StepCost::LINEAR };
}

/// The network and CPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetModel {
    /// One-way link latency.
    pub latency: Duration,
    /// Each message's latency is moved by a uniform amount up to this, either way.
    pub jitter: Duration,
    /// CPU time to send or to read one message.
    pub overhead: Duration,
    /// From news reaching a rank to its `agree()` thread running (a condition variable's
    /// wake-up): news that comes meanwhile is read in the same turn.
    pub wakeup: Duration,
}

impl Default for NetModel {
    fn default() -> Self {
        NetModel {
            latency: Duration::from_micros(50),
            jitter: Duration::from_micros(10),
            overhead: Duration::from_micros(2),
            wakeup: Duration::from_micros(50),
        }
    }
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Config {
    pub ranks: u32,
    pub fault: FaultKind,
    pub victim: u32,
    /// The coordinator fails too (the same way), half-way through sending its first ACCEPTs.
    pub coordinator_fails: bool,
    pub protocol: Protocol,
    pub net: NetModel,
    /// `HCCN_HEARTBEAT_MS`, `HCCN_DEAD_AFTER_MS`, `HCCN_WATCHED_PEERS`.
    pub heartbeat: Duration,
    pub dead_after: Duration,
    pub watched: usize,
    /// When the victim fails; heartbeats before it are the steady state.
    pub fail_at: Duration,
    /// Simulated time after `fail_at` at which a run that has not ended is stopped.
    pub give_up_after: Duration,
    pub seed: u64,
}

impl Config {
    /// `ranks` ranks with the runtime's defaults; the victim is rank `ranks / 3`.
    pub fn new(ranks: u32, fault: FaultKind, protocol: Protocol) -> Config {
        let d = crate::config::Config::default();
        Config {
            ranks,
            fault,
            victim: ranks / 3,
            coordinator_fails: false,
            protocol,
            net: NetModel::default(),
            heartbeat: d.heartbeat,
            dead_after: d.dead_after,
            watched: d.watched_peers,
            fail_at: Duration::from_secs(1),
            give_up_after: Duration::from_secs(20),
            seed: 1,
        }
    }
}

/// Messages one rank sent or read: the most (and which rank), and the mean over all ranks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    pub max: u64,
    pub busiest: u32,
    pub mean: f64,
}

/// What happened. Times count from the victim's failure.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// The first watcher found the victim failed.
    pub detected: Option<Duration>,
    /// Every survivor knew of every failed rank (by a notice, or by its own link).
    pub all_know: Option<Duration>,
    /// Every survivor had decided.
    pub all_decided: Option<Duration>,
    /// The failed ranks, in the order they failed.
    pub failed: Vec<u32>,
    /// The set every survivor decided, if they all decided the same one.
    pub agreed: Option<Vec<u32>>,
    /// Survivors that did not decide (a liveness failure, or "lost quorum").
    pub undecided: usize,
    /// Survivors in the agreed set (a safety failure).
    pub wrongly_excluded: Vec<u32>,
    /// Failure notices (`Suspect`, `Evict`) and agreement messages, all ranks together.
    pub news_messages: u64,
    pub agreement_messages: u64,
    /// Per rank, from the failure on (heartbeats apart): sent, read, and both together.
    pub sent: Load,
    pub received: Load,
    pub load: Load,
    /// Heartbeat frames and pulses each rank sent per second before the failure.
    pub beats_per_second: Load,
    /// Calls into the agreement state machines, all ranks together.
    pub steps: u64,
    /// Wall time of the whole simulation.
    pub wall: Duration,
}

/// Runs one simulation.
pub fn run(cfg: &Config) -> Report {
    world::Sim::new(cfg).run()
}

/// Wall time of one step of today's state machine on this machine, for a member of a
/// communicator of `ranks` that learns of a rank lost by its six watchers: what
/// [`StepCost::LINEAR`] models.
pub fn measure_step(ranks: u32) -> Duration {
    use super::agree::Agreement;
    use super::view::Knowledge;
    let ranks = ranks.max(16);
    let victim = ranks / 2;
    let mut k = Knowledge::default();
    for w in [victim - 3, victim - 2, victim - 1, victim + 1, victim + 2, victim + 3] {
        k.cut(w, victim);
    }
    let calls = 64;
    let mut members: Vec<Agreement> = (1..=calls).map(|r| Agreement::new(ranks, r, false)).collect();
    let start = std::time::Instant::now();
    for a in &mut members {
        std::hint::black_box(a.learn(&k));
    }
    start.elapsed() / calls
}

#[cfg(test)]
mod tests;
