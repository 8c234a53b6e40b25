//! The one place that chooses an algorithm for an operation.

use super::dissemination::Dissemination;
use super::linear::Linear;
use super::pairwise::Pairwise;
use super::ring::Ring;
use super::ring_compressed::CompressedRing;
use super::tree::BinomialTree;
use super::{Algorithm, Ctx, Ptr, Work};
use crate::types::{DataType, ReduceOp};

pub(crate) fn select(work: &Work, ctx: &Ctx<'_>) -> &'static dyn Algorithm {
    // Several hosts, several ranks on some: hierarchical allreduce (shm inside, TCP between).
    if matches!(work, Work::Reduce { root: None, .. }) && super::hier::applies(ctx.hosts()) {
        return &super::hier::Hier;
    }
    choose(work)
}

fn choose(work: &Work) -> &'static dyn Algorithm {
    match work {
        Work::Reduce { root: None, .. } | Work::ReduceScatter { .. } | Work::Gather { root: None, .. } => &Ring,
        Work::ReduceCompressed { .. } => &CompressedRing,
        Work::Reduce { root: Some(_), .. } | Work::Broadcast { .. } => &BinomialTree,
        Work::Gather { root: Some(_), .. } | Work::Scatter { .. } => &Linear,
        Work::AllToAll { .. } => &Pairwise,
        Work::Barrier | Work::Send { .. } | Work::Recv { .. } | Work::Nothing => &Dissemination,
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
/// (the whole buffer) on `size` ranks; `None` for a name not in [`OPS`]. For tools that show the
/// choice (hccn-info): it asks the same decision with a stand-in operation.
pub fn algorithm_name(op: &str, bytes: usize, size: u32) -> Option<&'static str> {
    let n = size.max(1) as usize;
    let block = bytes / n;
    let blocks: Vec<_> = (0..n).map(|i| i * block..(i + 1) * block).collect();
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
        _ => return None,
    };
    Some(choose(&work).name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_op_has_an_algorithm() {
        for op in OPS {
            assert!(algorithm_name(op, 1 << 20, 4).is_some(), "{op}");
        }
        assert_eq!(algorithm_name("allreduce", 1024, 3), Some("ring"));
        assert_eq!(algorithm_name("broadcast", 1024, 3), Some("tree"));
        assert_eq!(algorithm_name("nonsense", 1024, 3), None);
    }
}
