//! What the algorithm selection would do on this communicator, for tools (hccn-perf).

use super::Communicator;
use crate::collectives::{select, Ctx};
use crate::error::Result;
use crate::wire::FrameKind;

impl Communicator {
    /// The algorithm and pipeline chunk that collective `op` (an `Op::name`) over `bytes` (the
    /// whole buffer) would run with on this communicator, HCCN_ALGO included; `Ok(None)` for an
    /// unknown op, `Err` when the forced algorithm cannot run it.
    pub fn plan(&self, op: &str, bytes: usize) -> Result<Option<(&'static str, usize)>> {
        // A context is only a view of the communicator: building one sends nothing.
        let ctx = Ctx::new(&self.inner, FrameKind::Collective, 0);
        let plan = select::plan_for(&ctx, op, bytes)?;
        let board = &self.inner.board;
        if op == "allreduce" && board.takes(bytes) && board.is_on() {
            return Ok(plan.map(|(_, chunk)| ("board", chunk)));
        }
        Ok(plan)
    }
}
