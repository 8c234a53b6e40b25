//! Argument checks without running anything, for other data paths (the HCCL backend) that must
//! refuse exactly what the native path refuses, with the same messages.

use super::Communicator;
use crate::collectives::check::{self, Shape};
use crate::collectives::{Op, Work};
use crate::error::Result;

impl Communicator {
    /// Checks `op` as [`Communicator::submit`] would (state, enums, ranks, counts, buffer
    /// pairs) and says whether it moves any data (`false`: nothing to do, e.g. count 0).
    /// Sequence numbers are not consumed.
    pub fn precheck(&self, op: &Op) -> Result<bool> {
        self.inner.check_state()?;
        let shape = Shape { rank: self.rank(), size: self.size() };
        let work = check::validate(op, &shape, &mut |_, _| 0)?;
        Ok(!matches!(work, Work::Nothing))
    }
}

impl Communicator {
    /// Members that left on purpose (destroyed their side or exited after a goodbye) and did
    /// not fail, in this communicator's ranks: an operation that still needs them cannot end.
    pub fn departed_ranks(&self) -> Vec<u32> {
        let c = &self.inner;
        c.net.inbox.health(|h| {
            c.members.iter().enumerate().filter(|(_, w)| h.departed.contains_key(w)).map(|(r, _)| r as u32).collect()
        })
    }
}
