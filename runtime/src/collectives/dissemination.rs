//! Dissemination barrier: in round k rank r signals r+2^k and waits for r-2^k; after
//! ceil(log2 n) rounds every rank has heard, transitively, from every other. Zero-byte frames.

use super::{Algorithm, Ctx};
use crate::error::Result;

pub(crate) struct Dissemination;

impl Algorithm for Dissemination {
    fn name(&self) -> &'static str {
        "dissemination"
    }

    fn barrier(&self, ctx: &Ctx<'_>) -> Result<()> {
        let (n, r) = (ctx.size(), ctx.rank());
        let (mut dist, mut round) = (1u32, 0u32);
        while dist < n {
            ctx.send((r + dist) % n, round, &[])?;
            ctx.recv((r + n - dist) % n, round, 0)?;
            dist *= 2;
            round += 1;
        }
        Ok(())
    }
}
