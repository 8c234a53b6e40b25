//! The trace event of an operation: what [`Work`] says about it, in the API's terms. Work is the
//! checked, byte-level form, so the v-variants (allgatherv, alltoallv) are reported under their
//! base names and data types are known only for reductions ("byte" otherwise).

use super::{span, Ctx, Work};
use crate::error::Result;
use crate::trace::{self, OpInfo, Start};

/// Records `work`, run by `algorithm` since `t`; a failed operation is recorded as such and
/// writes the trace file at once, since the process may not live to exit normally.
pub(super) fn record(t: Start, ctx: &Ctx<'_>, work: &Work, algorithm: &'static str, r: &Result<()>) {
    let Some((name, dtype, count, bytes)) = describe(work, ctx.size()) else { return };
    let algorithm = if matches!(work, Work::Send { .. } | Work::Recv { .. }) { "p2p" } else { algorithm };
    let (comm, epoch) = ctx.comm_id();
    let info = OpInfo {
        name,
        dtype,
        count,
        bytes,
        algorithm,
        comm,
        epoch,
        rank: ctx.rank(),
        size: ctx.size(),
        failed: r.is_err(),
    };
    trace::op(t, ctx.world_rank(), info);
    if r.is_err() {
        trace::flush();
    }
}

/// Name, data type, element count (as the API counts it) and bytes of the operation's data;
/// `None` for an operation with nothing to move.
fn describe(work: &Work, n: u32) -> Option<(&'static str, &'static str, u64, u64)> {
    let plain = |name, bytes: usize| Some((name, "byte", bytes as u64, bytes as u64));
    match work {
        Work::Reduce { bytes, dt, root, .. } => {
            let name = if root.is_some() { "reduce" } else { "allreduce" };
            Some((name, dt.name(), (bytes / dt.size()) as u64, *bytes as u64))
        }
        Work::ReduceCompressed { bytes, .. } => {
            Some(("allreduce_compressed", "fp32", (*bytes / 4) as u64, *bytes as u64))
        }
        Work::ReduceScatter { block_bytes, dt, .. } => {
            Some(("reduce_scatter", dt.name(), (block_bytes / dt.size()) as u64, (block_bytes * n as usize) as u64))
        }
        Work::Broadcast { bytes, .. } => plain("broadcast", *bytes),
        Work::Gather { blocks, root, .. } => plain(if root.is_some() { "gather" } else { "allgather" }, span(blocks)),
        Work::Scatter { blocks, .. } => plain("scatter", span(blocks)),
        Work::AllToAll { send_blocks, .. } => plain("alltoall", span(send_blocks)),
        Work::Send { bytes, .. } => plain("send", *bytes),
        Work::Recv { bytes, .. } => plain("recv", *bytes),
        Work::Barrier => plain("barrier", 0),
        Work::Nothing => None,
    }
}
