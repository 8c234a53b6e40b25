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
//! Between two ranks, a broadcast, a rooted reduce, a gather and a scatter need no round of
//! their own: the data is one half of it ([`When::Crossing`]). The rank that receives the data
//! sends its frame first and then checks the data frames, which carry the sender's fingerprint;
//! the rank that sends the data checks the receiver's frame after its sends. Every mismatch
//! still meets a frame that shows it: two ranks that both send (each takes itself for the root,
//! or one reduces where the other broadcasts) each read the other's data where they expect its
//! frame; two that both receive each read the other's frame where they expect data. A send that
//! waits for its receiver (a gather's or scatter's block read in place, or a frame larger than
//! the room in a ring) cannot wait for a rank that only sends: every wait of an operation
//! watches for a frame of the same operation from another call (`Ctx::status`), and finds the
//! other sender's data there. A sender still runs at most one call ahead: it ends a call on the
//! receiver's frame of that call.
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
    /// Two ranks, data one way: the barrier's round crosses the data (see the
    /// module comment); `sends_data` for the rank the data leaves.
    Crossing {
        sends_data: bool,
    },
    /// After its data: what may differ (alltoallv's counts) shows only to the rank that
    /// receives a block, which then leaves the barrier to the others and tells them.
    After,
}

/// When `work` (with its board turn, of the call `fp`, run by rank `me` of `n`) verifies with
/// a barrier.
pub(crate) fn needed(work: &Work, turn: Option<u64>, fp: &Fingerprint, n: u32, me: u32) -> When {
    if turn.is_some() {
        // On the board every rank reads every rank's fingerprint.
        return When::Never;
    }
    match work {
        // Ranks whose blocks differ have different fingerprints and meet a frame that shows
        // it, whichever way each opens.
        Work::Broadcast { root, .. } if n == 2 => When::Crossing { sends_data: *root == me },
        Work::Reduce { root: Some(root), .. } if n == 2 => When::Crossing { sends_data: *root != me },
        Work::Gather { root: Some(root), .. } if n == 2 => When::Crossing { sends_data: *root != me },
        Work::Scatter { root, .. } if n == 2 => When::Crossing { sends_data: *root == me },
        Work::Reduce { root: Some(_), .. }
        | Work::Broadcast { .. }
        | Work::Gather { root: Some(_), .. }
        | Work::Scatter { .. }
        | Work::Nothing => When::Before,
        Work::AllToAll { .. } if fingerprint::varies(fp) => When::After,
        _ => When::Never,
    }
}

/// What opens a call that verifies (`when`): the barrier, or a receiver's half of a crossing.
pub(crate) fn open(ctx: &Ctx<'_>, when: When) -> Result<()> {
    match when {
        When::Before => barrier(ctx),
        When::Crossing { sends_data: false } => ctx.send(1 - ctx.rank(), TAG, &[]),
        When::Never | When::After | When::Crossing { .. } => Ok(()),
    }
}

/// What closes a call whose data moved: the barrier, or a sender's half of a crossing.
pub(crate) fn close(ctx: &Ctx<'_>, when: When) -> Result<()> {
    match when {
        When::After => barrier(ctx),
        When::Crossing { sends_data: true } => ctx.recv(1 - ctx.rank(), TAG, 0).map(drop),
        When::Never | When::Before | When::Crossing { .. } => Ok(()),
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
