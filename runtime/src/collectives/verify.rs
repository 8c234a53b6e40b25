//! The barrier that opens a call whose data does not flow from every rank to every rank (rooted
//! collectives, count 0, alltoallv, whose counts only the pair they concern can check), so that
//! every rank of a mismatched call hears of it before any data moves: its frames carry
//! the call's fingerprint like any other, and in a dissemination barrier every rank hears,
//! through a chain of frames, from every other. A rank whose call differs refuses the first
//! frame that shows it and tells the others (`Abandon`); everyone else waits in the barrier for
//! a frame that can only come through that rank, and gets the same error. Ranks that disagree
//! on where the data goes (each takes itself for the root) all send here first, so none waits
//! for data nobody sends. It also keeps the senders of a rooted loop from running ahead of
//! its receivers by more than one call.
//!
//! Collectives in which every rank's result depends on every rank's input (allreduce, allgather,
//! reduce-scatter, alltoall, barrier) need none: such a result is reached only through a chain
//! of frames from every rank, and a chain from a rank with a different call passes a receiver
//! that refuses it.

use super::{fingerprint, Ctx, Work};
use crate::error::Result;
use crate::wire::Fingerprint;

/// Tags of the verification frames, far from the algorithms' own.
const TAG: u32 = 0x5000_0000;

/// When a call verifies with a barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum When {
    Never,
    /// Before its data: the fingerprints tell everything that may differ.
    Before,
    /// After its data: what may differ (alltoallv's counts) shows only to the rank that
    /// receives a block, which then leaves the barrier to the others and tells them.
    After,
}

/// When `work` (with its board turn, of the call `fp`) verifies with a barrier.
pub(crate) fn needed(work: &Work, turn: Option<u64>, fp: &Fingerprint) -> When {
    if turn.is_some() {
        // On the board every rank reads every rank's fingerprint.
        return When::Never;
    }
    match work {
        Work::Reduce { root: Some(_), .. }
        | Work::Broadcast { .. }
        | Work::Gather { root: Some(_), .. }
        | Work::Scatter { .. }
        | Work::Nothing => When::Before,
        Work::AllToAll { .. } if fingerprint::varies(fp) => When::After,
        _ => When::Never,
    }
}

/// A dissemination barrier (see dissemination.rs) on the call's own frames.
pub(crate) fn barrier(ctx: &Ctx<'_>) -> Result<()> {
    let (n, r) = (ctx.size(), ctx.rank());
    let (mut dist, mut round) = (1u32, 0u32);
    while dist < n {
        ctx.send((r + dist) % n, TAG + round, &[])?;
        ctx.recv((r + n - dist) % n, TAG + round, 0)?;
        dist *= 2;
        round += 1;
    }
    Ok(())
}
