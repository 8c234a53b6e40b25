//! The one place that chooses an algorithm for an operation, by a cost model.
//!
//! Each collective that has a choice lists its [`Candidate`]s, each with a cost function of the
//! [`Model`] (world size, latency α and inverse bandwidth β of the links the algorithm crosses,
//! the reduction's cost γ per byte, the host layout) and the buffer size. The cheapest applicable
//! candidate runs, unless `HCCN_ALGO` forces one; the model also picks the pipeline chunk.
//!
//! α and β per transport kind are the world's `LinkCosts`: measured once by world rank 0 when
//! the world forms and sent to every rank (`comm::linkcost`), or set by `HCCN_LINK_COST`,
//! so that every rank builds the same model; sub-communicators, shrinks and rebuilds keep their
//! world's figures (`tuning.rs`). A new transport adds a `TransportKind` with its built-in `LinkCost`; a
//! new algorithm adds a candidate whose cost function returns `None` where it cannot run.

use super::dissemination::Dissemination;
use super::linear::Linear;
use super::pairwise::Pairwise;
use super::rhd::{RD, RHD};
use super::ring::Ring;
use super::ring_compressed::CompressedRing;
use super::tree::BinomialTree;
use super::{Algorithm, Ctx, Ptr, Work};
use crate::error::{Error, Result};
use crate::transport::shm::CMA_MIN;
use crate::tuning::{AlgoChoice, LinkCost, LinkCosts, TransportKind};
use crate::types::{DataType, ReduceOp};

/// What the cost functions know about a communicator.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// Ranks.
    pub n: u32,
    /// The slowest link between ranks of one host, if the communicator has two on one host.
    pub intra: Option<LinkCost>,
    /// The slowest link between hosts, if the communicator spans hosts.
    pub inter: Option<LinkCost>,
    /// Hosts the ranks are on (1 when unknown: every link then counts as inter-host).
    pub hosts: u32,
    /// Ranks on the host with the fewest (the hierarchical algorithm's segments).
    pub min_per_host: u32,
    /// The hierarchical algorithm can run: several hosts, more ranks than hosts.
    pub hier: bool,
    /// Every link is shared memory (one host, HCCN_TRANSPORT allows it): see [`chunk_for`].
    pub shm_only: bool,
    /// Seconds per byte to combine a received buffer into the accumulator.
    pub gamma: f64,
    /// HCCN_CHUNK_BYTES.
    pub max_chunk: usize,
    /// The figures `set_layout` takes its links from.
    pub costs: LinkCosts,
}

/// The link figures of the communicator `ctx` runs on: its world's agreed ones when every
/// member's host is known. A world that admitted joiners has no layout anywhere, and its
/// joiners never took part in the agreement, so every member falls back to the built-in
/// figures there, which all processes share.
pub(crate) fn costs_of(ctx: &Ctx<'_>) -> LinkCosts {
    match ctx.hosts() {
        Some(_) => ctx.link_costs(),
        None => LinkCosts::builtin(),
    }
}

impl Model {
    /// A communicator of `n` ranks whose links are all of `kind`, on one host, with the link
    /// figures `costs`.
    pub fn uniform(n: u32, kind: TransportKind, costs: &LinkCosts, max_chunk: usize) -> Model {
        Model {
            n,
            intra: None,
            inter: (n > 1).then(|| costs.get(kind)),
            hosts: 1,
            min_per_host: n,
            hier: false,
            shm_only: false,
            gamma: 1.0 / (crate::tuning::REDUCE_GBPS * 1e9),
            max_chunk,
            costs: *costs,
        }
    }

    /// The model of the communicator `ctx` runs on. Every rank must build the same model
    /// (sender and receiver cut the same chunks and run the same algorithm), so it comes from
    /// what all members share: the host layout, the process-wide HCCN_TRANSPORT and the link
    /// figures the world agreed on at creation, never from this rank's own links. Without a
    /// layout (a world that admitted joiners) every link counts as TCP.
    fn of(ctx: &Ctx<'_>) -> Model {
        let costs = costs_of(ctx);
        let mut m = Model::uniform(ctx.size(), TransportKind::Tcp, &costs, ctx.max_chunk());
        if let Some(hosts) = ctx.hosts() {
            m.set_layout(hosts, ctx.intra_kind());
        }
        m
    }

    /// Fills in the host layout: `hosts[r]` is rank r's host index; ranks of one host talk
    /// over `intra`, hosts over TCP, at the model's link figures.
    pub fn set_layout(&mut self, hosts: &[u32], intra: TransportKind) {
        let count = hosts.iter().max().map_or(1, |h| h + 1);
        // Counted per host without a vector: this runs for every operation.
        let per_host = |h: u32| hosts.iter().filter(|&&x| x == h).count() as u32;
        self.hosts = count;
        self.min_per_host = (0..count).map(per_host).min().unwrap_or(1).max(1);
        self.intra = (0..count).any(|h| per_host(h) > 1).then(|| self.costs.get(intra));
        self.inter = (count > 1).then_some(self.costs.tcp);
        self.hier = super::hier::applies(Some(hosts));
        self.shm_only = count == 1 && self.intra.is_some() && intra == TransportKind::Shm;
    }

    /// The link a flat algorithm (one that ignores hosts) is limited by.
    fn flat(&self) -> LinkCost {
        match (self.intra, self.inter) {
            (Some(a), Some(b)) => a.worst(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => self.costs.local,
        }
    }

    fn log2_floor(&self) -> u32 {
        31 - self.n.max(1).leading_zeros()
    }

    fn log2_ceil(&self) -> u32 {
        self.n.max(1).next_power_of_two().trailing_zeros()
    }
}

/// Cost in seconds of running a candidate over `bytes`, or `None` where it cannot run.
type CostFn = fn(&Model, f64) -> Option<f64>;

/// One algorithm able to run a collective.
struct Candidate {
    /// The HCCN_ALGO value that forces it; `Auto` for a variant only the model picks.
    choice: AlgoChoice,
    algo: &'static dyn Algorithm,
    cost: CostFn,
}

/// Ring allreduce: 2(n-1) steps, each moving S/n; n-1 of them reduce it.
fn ring_allreduce(m: &Model, s: f64) -> Option<f64> {
    let n = f64::from(m.n);
    let step = s / n;
    Some(2.0 * (n - 1.0) * m.flat().msg(step) + (n - 1.0) * step * m.gamma)
}

/// The non-power-of-two pre- and post-step of the recursive algorithms (the whole buffer out
/// and back, one reduction), for n' = 2^⌊log2 n⌋.
fn fold(m: &Model, s: f64) -> f64 {
    if m.n.is_power_of_two() {
        0.0
    } else {
        2.0 * m.flat().msg(s) + s * m.gamma
    }
}

/// Rabenseifner: log2 n' halving steps (S/2, S/4, ...) then log2 n' doubling steps back.
fn rhd_allreduce(m: &Model, s: f64) -> Option<f64> {
    let k = m.log2_floor();
    let p = f64::from(1u32 << k);
    let l = m.flat();
    Some(fold(m, s) + 2.0 * f64::from(k) * l.alpha + 2.0 * (p - 1.0) / p * s * l.beta + (p - 1.0) / p * s * m.gamma)
}

/// Recursive doubling: log2 n' steps, each exchanging and reducing the whole buffer.
fn rd_allreduce(m: &Model, s: f64) -> Option<f64> {
    let k = f64::from(m.log2_floor());
    Some(fold(m, s) + k * (m.flat().msg(s) + s * m.gamma))
}

/// Binomial reduce to rank 0 then broadcast: ⌈log2 n⌉ levels each way, pipelined by chunks.
fn tree_allreduce(m: &Model, s: f64) -> Option<f64> {
    let levels = f64::from(m.log2_ceil());
    let c = (m.max_chunk as f64).min(s).max(1.0);
    let chunks = (s / c).ceil().max(1.0);
    // The root waits for every child's chunk: a level costs (children) messages per chunk.
    Some(2.0 * (levels + chunks - 1.0) * m.flat().msg(c) * levels.max(1.0) + levels * s * m.gamma)
}

/// Hierarchical: with L = the fewest ranks on a host and H hosts, a reduce-scatter and an
/// allgather inside each host (L-1 exchanges of S/L each, over `intra`) around a ring allreduce
/// of each S/L segment among the hosts (2(H-1) steps of S/(L·H) over `inter`).
fn hier_allreduce(m: &Model, s: f64) -> Option<f64> {
    if !m.hier {
        return None;
    }
    let (intra, inter) = (m.intra?, m.inter?);
    let (l, h) = (f64::from(m.min_per_host), f64::from(m.hosts));
    let seg = s / l;
    let local = 2.0 * (l - 1.0) * intra.msg(seg) + (l - 1.0) * seg * m.gamma;
    let across = 2.0 * (h - 1.0) * inter.msg(seg / h) + (h - 1.0) * seg / h * m.gamma;
    Some(local + across)
}

static ALLREDUCE: [Candidate; 5] = [
    Candidate { choice: AlgoChoice::Ring, algo: &Ring, cost: ring_allreduce },
    Candidate { choice: AlgoChoice::Rhd, algo: &RHD, cost: rhd_allreduce },
    Candidate { choice: AlgoChoice::Auto, algo: &RD, cost: rd_allreduce },
    Candidate { choice: AlgoChoice::Tree, algo: &BinomialTree, cost: tree_allreduce },
    Candidate { choice: AlgoChoice::Hier, algo: &super::hier::Hier, cost: hier_allreduce },
];

/// The algorithm and pipeline chunk of one operation.
pub(crate) struct Plan {
    pub algo: &'static dyn Algorithm,
    pub chunk: usize,
}

/// Chunk that balances per-message latency against pipeline fill for a step of `step` bytes:
/// √(α·step/γ) (the classic pipeline optimum), between 4 KiB and HCCN_CHUNK_BYTES.
///
/// Over shared memory alone the chunk is HCCN_CHUNK_BYTES: a frame already streams through the
/// ring's 64 KiB slots, the receiver taking each as it lands, so smaller messages add only their
/// handshakes; and a single-copy read needs one pinning of the sender's pages per message. With
/// `hccnrun -n 2 hccn-perf -b 256K -e 64M -f 4 -n 20 -w 3` (HCCN_ALGO=ring, 3 runs each) the
/// largest chunk gave 5.9-6.8 GB/s against 5.2-5.4 at 256 KiB, 4.0-5.9 against 1.5-2.8 at 1 MiB,
/// 3.2-6.6 against 3.1-3.3 at 4 MiB, and a little more at 16 and 64 MiB; with HCCN_CMA=off and
/// with 4 ranks on 2 cores as much or more.
fn chunk_for(m: &Model, step: f64) -> usize {
    if m.shm_only {
        return m.max_chunk;
    }
    let c = (m.flat().alpha * step / m.gamma).sqrt();
    let c = (c as usize).clamp(4 << 10, m.max_chunk.max(4 << 10));
    c.min(m.max_chunk)
}

#[inline]
pub(crate) fn select(work: &Work, ctx: &Ctx<'_>) -> Result<Plan> {
    // Decided at submit time, with the board made (see board.rs).
    if ctx.turn().is_some() {
        return Ok(Plan { algo: &super::board::BoardCollectives, chunk: ctx.max_chunk() });
    }
    plan(work, &Model::of(ctx), ctx.forced_algo())
}

fn plan(work: &Work, m: &Model, forced: AlgoChoice) -> Result<Plan> {
    let fixed = |algo: &'static dyn Algorithm| Plan { algo, chunk: m.max_chunk };
    match work {
        Work::Reduce { root: None, bytes, .. } => {
            let s = *bytes as f64;
            let costed = ALLREDUCE.iter().filter_map(|c| (c.cost)(m, s).map(|t| (c, t)));
            let best = costed
                .filter(|(c, _)| forced == AlgoChoice::Auto || c.choice == forced)
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map(|(c, _)| c.algo);
            let algo = best.ok_or_else(|| {
                Error::invalid(format!(
                    "HCCN_ALGO={}: that algorithm cannot run an allreduce on this communicator of {} ranks{}",
                    forced.name(),
                    m.n,
                    if forced == AlgoChoice::Hier {
                        " (it needs ranks on more than one host, with shared memory between the ranks of a host)"
                    } else {
                        ""
                    }
                ))
            })?;
            let step = if algo.name() == "ring" { s / f64::from(m.n.max(1)) } else { s / 2.0 };
            Ok(Plan { algo, chunk: chunk_for(m, step) })
        }
        Work::ReduceScatter { block_bytes, .. } => Ok(Plan { algo: &Ring, chunk: chunk_for(m, *block_bytes as f64) }),
        Work::Gather { root: None, blocks, .. } => {
            // From the largest block, which every rank knows: in an allgatherv the ranks' own
            // blocks differ, and sender and receiver must cut a block into the same chunks.
            let step = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
            // See pairwise.rs; measured up to 8 ranks, and it links every pair of them.
            if m.shm_only && m.n <= 8 && step >= CMA_MIN && forced == AlgoChoice::Auto {
                return Ok(fixed(&Pairwise));
            }
            Ok(Plan { algo: &Ring, chunk: chunk_for(m, step as f64) })
        }
        Work::ReduceCompressed { .. } => Ok(fixed(&CompressedRing)),
        Work::Reduce { root: Some(_), .. } | Work::Broadcast { .. } => Ok(fixed(&BinomialTree)),
        Work::Gather { root: Some(_), .. } | Work::Scatter { .. } => Ok(fixed(&Linear)),
        Work::AllToAll { .. } => Ok(fixed(&Pairwise)),
        Work::Barrier | Work::Send { .. } | Work::Recv { .. } | Work::Nothing => Ok(fixed(&Dissemination)),
    }
}

/// The collectives [`algorithm_name`] knows, by `Op::name`.
pub const OPS: &[&str] = &[
    "allreduce",
    "allreduce_compressed",
    "reduce",
    "broadcast",
    "allgather",
    "gather",
    "reduce_scatter",
    "scatter",
    "alltoall",
    "barrier",
];

/// The algorithm that [`select`] would run for collective `op` (an `Op::name`) over `bytes`
/// (the whole buffer) on `size` ranks connected by TCP at the built-in link figures (no world
/// measured them), with the default chunk; `None` for a name not in [`OPS`]. For tools that
/// show the choice without a communicator (hccn-info).
pub fn algorithm_name(op: &str, bytes: usize, size: u32) -> Option<&'static str> {
    let chunk = crate::config::Config::default().chunk_bytes;
    let m = Model::uniform(size.max(1), TransportKind::Tcp, &LinkCosts::builtin(), chunk);
    plan_name(op, bytes, &m, AlgoChoice::Auto).ok().flatten().map(|(a, _)| a)
}

/// [`plan_name`] with the model and HCCN_ALGO of the communicator `ctx` runs on.
pub(crate) fn plan_for(ctx: &Ctx<'_>, op: &str, bytes: usize) -> Result<Option<(&'static str, usize)>> {
    plan_name(op, bytes, &Model::of(ctx), ctx.forced_algo())
}

/// The algorithm and chunk of collective `op` over `bytes` under model `m` with `forced`;
/// `Ok(None)` for an unknown op, `Err` when `forced` cannot run it.
pub fn plan_name(op: &str, bytes: usize, m: &Model, forced: AlgoChoice) -> Result<Option<(&'static str, usize)>> {
    let n = m.n.max(1) as usize;
    let block = bytes / n;
    let blocks: super::Blocks = (0..n).map(|i| i * block..(i + 1) * block).collect();
    let p = Ptr::null();
    let (dt, rop) = (DataType::Fp32, ReduceOp::Sum);
    let work = match op {
        "allreduce" => Work::Reduce { send: p, recv: p, bytes, dt, op: rop, root: None },
        "allreduce_compressed" => Work::ReduceCompressed { send: p, recv: p, bytes, wire: DataType::Bf16, op: rop },
        "reduce" => Work::Reduce { send: p, recv: p, bytes, dt, op: rop, root: Some(0) },
        "broadcast" => Work::Broadcast { buf: p, bytes, root: 0 },
        "allgather" => Work::Gather { send: p, send_bytes: block, recv: p, blocks, root: None },
        "gather" => Work::Gather { send: p, send_bytes: block, recv: p, blocks, root: Some(0) },
        "reduce_scatter" => Work::ReduceScatter { send: p, recv: p, block_bytes: block, dt, op: rop },
        "scatter" => Work::Scatter { send: p, blocks, recv: p, recv_bytes: block, root: 0 },
        "alltoall" => Work::AllToAll { send: p, send_blocks: blocks.clone(), recv: p, recv_blocks: blocks },
        "barrier" => Work::Barrier,
        _ => return Ok(None),
    };
    let plan = plan(&work, m, forced)?;
    Ok(Some((plan.algo.name(), plan.chunk)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(n: u32) -> Model {
        Model::uniform(n, TransportKind::Tcp, &LinkCosts::builtin(), 512 << 10)
    }

    fn pick(m: &Model, bytes: usize) -> (&'static str, usize) {
        plan_name("allreduce", bytes, m, AlgoChoice::Auto).ok().flatten().unwrap_or(("error", 0))
    }

    #[test]
    fn every_listed_op_has_an_algorithm() {
        for op in OPS {
            assert!(algorithm_name(op, 1 << 20, 4).is_some(), "{op}");
        }
        assert_eq!(algorithm_name("broadcast", 1024, 3), Some("tree"));
        assert_eq!(algorithm_name("nonsense", 1024, 3), None);
    }

    #[test]
    fn small_allreduce_uses_recursive_doubling_large_a_bandwidth_optimal_one() {
        for n in [2, 3, 4, 5, 8] {
            assert_eq!(pick(&tcp(n), 4).0, "rd", "4 bytes on {n} ranks: fewest messages");
            let big = pick(&tcp(n), 64 << 20).0;
            assert!(big == "ring" || big == "rhd", "64 MiB on {n} ranks: {big}");
        }
        // Power of two: Rabenseifner's 2·log2 n messages beat the ring's 2(n-1) at equal bytes.
        assert_eq!(pick(&tcp(8), 64 << 20).0, "rhd");
        // Two ranks: ring and rhd are the same exchange; the ring is listed first.
        assert_eq!(pick(&tcp(2), 64 << 20).0, "ring");
    }

    #[test]
    fn non_powers_of_two_pay_the_fold_so_large_buffers_take_the_ring() {
        // 5 ranks: rhd sends the whole buffer twice more (pre/post step), the ring does not.
        assert_eq!(pick(&tcp(5), 64 << 20).0, "ring");
        assert_eq!(pick(&tcp(3), 64 << 20).0, "ring");
    }

    #[test]
    fn crossover_moves_with_latency() {
        let slow = tcp(2);
        let mut fast = tcp(2);
        fast.inter = Some(LinkCost { alpha: 0.5e-6, beta: 1.0 / 8e9 });
        // 64 KiB: on TCP (tens of µs per message) one exchange wins; with 0.5 µs messages the
        // reduction of half the bytes (ring, rhd) wins.
        assert_eq!(pick(&slow, 64 << 10).0, "rd");
        assert_eq!(pick(&fast, 64 << 10).0, "ring");
    }

    #[test]
    fn chunks_grow_with_the_step_and_stay_within_the_limit() {
        let m = tcp(2);
        let (_, small) = pick(&m, 256 << 10);
        let (_, large) = pick(&m, 256 << 20);
        assert!(small <= large, "{small} {large}");
        assert_eq!(large, 512 << 10, "capped by HCCN_CHUNK_BYTES");
        let capped = Model { max_chunk: 4096, ..m };
        assert_eq!(pick(&capped, 256 << 20).1, 4096, "a small HCCN_CHUNK_BYTES is kept (the tests rely on it)");
        assert!(small >= 4 << 10);
    }

    #[test]
    fn forcing_picks_within_the_family_and_refuses_what_cannot_run() {
        let m = tcp(4);
        let forced = |a, bytes| plan_name("allreduce", bytes, &m, a).map(|p| p.map(|(n, _)| n));
        assert_eq!(forced(AlgoChoice::Ring, 4).ok().flatten(), Some("ring"));
        assert_eq!(forced(AlgoChoice::Tree, 64 << 20).ok().flatten(), Some("tree"));
        assert_eq!(forced(AlgoChoice::Rhd, 4).ok().flatten(), Some("rhd"));
        assert_eq!(forced(AlgoChoice::Rhd, 64 << 20).ok().flatten(), Some("rhd"));
        let e = forced(AlgoChoice::Hier, 1024).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("HCCN_ALGO=hier") && e.contains("more than one host"), "{e}");
        // Collectives without a choice keep their algorithm whatever is forced.
        let b = plan_name("broadcast", 1024, &m, AlgoChoice::Ring).ok().flatten().map(|p| p.0);
        assert_eq!(b, Some("tree"));
    }

    #[test]
    fn every_rank_of_an_allgatherv_cuts_the_same_chunks() {
        let m = tcp(3);
        let blocks: super::super::Blocks =
            smallvec::smallvec![0..(40 << 20), (40 << 20)..(41 << 20), (41 << 20)..(41 << 20) + 8];
        let chunk = |own: usize| {
            let w = Work::Gather {
                send: Ptr::null(),
                send_bytes: own,
                recv: Ptr::null(),
                blocks: blocks.clone(),
                root: None,
            };
            plan(&w, &m, AlgoChoice::Auto).map(|p| p.chunk).ok()
        };
        assert_eq!(chunk(40 << 20), chunk(8));
        assert_eq!(chunk(1 << 20), chunk(8));
    }

    #[test]
    fn names_round_trip() {
        for a in AlgoChoice::ALL {
            assert_eq!(AlgoChoice::from_name(a.name()), Some(a));
        }
        assert_eq!(AlgoChoice::from_name(" Ring "), Some(AlgoChoice::Ring));
        assert_eq!(AlgoChoice::from_name("nccl"), None);
    }

    #[test]
    fn across_hosts_large_allreduces_go_hierarchical_and_one_host_never_does() {
        let mut two_by_two = tcp(4);
        two_by_two.set_layout(&[0, 0, 1, 1], TransportKind::Shm);
        assert_eq!(pick(&two_by_two, 64 << 20).0, "hier");
        assert_eq!(pick(&two_by_two, 4 << 20).0, "hier");
        assert_ne!(pick(&two_by_two, 4).0, "hier", "one element: fewer messages across hosts win");
        let mut one_host = tcp(4);
        one_host.set_layout(&[0, 0, 0, 0], TransportKind::Shm);
        assert!(!one_host.hier && one_host.inter.is_none());
        assert_ne!(pick(&one_host, 64 << 20).0, "hier");
        // One rank per host: nothing to gain inside a host.
        let mut spread = tcp(3);
        spread.set_layout(&[0, 1, 2], TransportKind::Shm);
        assert!(!spread.hier && spread.intra.is_none());
        // Uneven hosts still qualify, with as many segments as the smallest host has ranks.
        let mut uneven = tcp(3);
        uneven.set_layout(&[0, 0, 1], TransportKind::Shm);
        assert!(uneven.hier);
        assert_eq!(uneven.min_per_host, 1);
        let forced = plan_name("allreduce", 1024, &uneven, AlgoChoice::Hier).ok().flatten().map(|p| p.0);
        assert_eq!(forced, Some("hier"));
    }

    /// One host of `n` ranks over shared memory, at the figures `costs`.
    fn one_host(n: u32, costs: &LinkCosts) -> Model {
        let mut m = Model::uniform(n, TransportKind::Tcp, costs, 512 << 10);
        m.set_layout(&vec![0; n as usize], TransportKind::Shm);
        m
    }

    #[test]
    fn the_agreed_link_costs_move_the_choice() {
        let builtin = LinkCosts::builtin();
        let mut slow_shm = builtin;
        slow_shm.set(TransportKind::Shm, LinkCost::new(5000.0, 8.0));
        // 1 MiB on 4 ranks: at µs latency Rabenseifner (its 4 messages cost little next to the
        // bytes); at 5 ms per message the fewest messages win: recursive doubling's 2.
        assert_eq!(pick(&one_host(4, &builtin), 1 << 20).0, "rhd");
        assert_eq!(pick(&one_host(4, &slow_shm), 1 << 20).0, "rd");
        assert_eq!(one_host(4, &slow_shm).intra, Some(slow_shm.shm), "the layout takes the given figures");
        // 3 ranks: the ring gives way to the log-step algorithm the same way.
        assert_eq!(pick(&one_host(3, &builtin), 1 << 20).0, "ring");
        assert_eq!(pick(&one_host(3, &slow_shm), 1 << 20).0, "rd");
        // Only the kinds a communicator's links use count: TCP does not matter on one host...
        let mut slow_tcp = builtin;
        slow_tcp.set(TransportKind::Tcp, LinkCost::new(5000.0, 0.1));
        assert_eq!(pick(&one_host(4, &slow_tcp), 1 << 20).0, "rhd");
        // ...but across hosts it does.
        let mut two_by_two = Model::uniform(4, TransportKind::Tcp, &slow_tcp, 512 << 10);
        two_by_two.set_layout(&[0, 0, 1, 1], TransportKind::Shm);
        assert_eq!(two_by_two.inter, Some(slow_tcp.tcp));
        // And the pipeline chunk grows with α (√(α·step/γ))...
        let mut quick = Model::uniform(4, TransportKind::Tcp, &builtin, 512 << 10);
        quick.set_layout(&[0, 0, 1, 1], TransportKind::Shm);
        let small = chunk_for(&quick, f64::from(64 << 10));
        assert!(chunk_for(&two_by_two, f64::from(64 << 10)) > small, "{small}");
        // ...except over shared memory alone, where it is HCCN_CHUNK_BYTES (4 KiB in the tests).
        assert!(one_host(2, &builtin).shm_only && !two_by_two.shm_only);
        assert_eq!(chunk_for(&one_host(2, &builtin), 64.0), 512 << 10);
        assert_eq!(chunk_for(&Model { max_chunk: 4096, ..one_host(2, &builtin) }, 1e6), 4096);
        let mut tcp_only = Model::uniform(2, TransportKind::Tcp, &builtin, 512 << 10);
        tcp_only.set_layout(&[0, 0], TransportKind::Tcp);
        assert!(!tcp_only.shm_only);
    }

    #[test]
    fn link_costs_print_in_the_variables_syntax() {
        let s = LinkCosts::builtin().to_string();
        assert_eq!(s, "local=0.500us:10.000GB/s,shm=1.000us:8.000GB/s,tcp=50.000us:2.500GB/s");
    }
}
