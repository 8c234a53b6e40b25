//! The one place that chooses an algorithm for an operation.

use super::dissemination::Dissemination;
use super::linear::Linear;
use super::pairwise::Pairwise;
use super::ring::Ring;
use super::ring_compressed::CompressedRing;
use super::tree::BinomialTree;
use super::{Algorithm, Ctx, Work};

pub(crate) fn select(work: &Work, _ctx: &Ctx<'_>) -> &'static dyn Algorithm {
    match work {
        Work::Reduce { root: None, .. } | Work::ReduceScatter { .. } | Work::Gather { root: None, .. } => &Ring,
        Work::ReduceCompressed { .. } => &CompressedRing,
        Work::Reduce { root: Some(_), .. } | Work::Broadcast { .. } => &BinomialTree,
        Work::Gather { root: Some(_), .. } | Work::Scatter { .. } => &Linear,
        Work::AllToAll { .. } => &Pairwise,
        Work::Barrier | Work::Send { .. } | Work::Recv { .. } | Work::Nothing => &Dissemination,
    }
}
