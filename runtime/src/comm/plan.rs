//! What the algorithm selection would do on this communicator, for tools (hccn-perf).

use super::Communicator;
use crate::collectives::select;
use crate::collectives::Ctx;
use crate::error::Result;
use crate::tuning::LinkCosts;
use crate::wire::FrameKind;

impl Communicator {
    /// The algorithm and pipeline chunk that collective `op` (an `Op::name`) over `bytes` (the
    /// whole buffer) would run with on this communicator, HCCN_ALGO included; `Ok(None)` for an
    /// unknown op, `Err` when the forced algorithm cannot run it.
    pub fn plan(&self, op: &str, bytes: usize) -> Result<Option<(&'static str, usize)>> {
        // A context is only a view of the communicator: building one sends nothing.
        let ctx = Ctx::new(&self.inner, FrameKind::Collective, 0);
        let plan = select::plan_for(&ctx, op, bytes)?;
        if self.inner.board.would_take(op, bytes) {
            return Ok(plan.map(|(_, chunk)| ("board", chunk)));
        }
        Ok(plan)
    }

    /// The link figures (α, β per transport kind) the cost model uses on this communicator:
    /// its world's, agreed at creation (measured by world rank 0, or HCCN_LINK_COST).
    pub fn link_costs(&self) -> LinkCosts {
        select::costs_of(&Ctx::new(&self.inner, FrameKind::Collective, 0))
    }
}
