//! Linear gather and scatter: the root exchanges one block directly with every other rank.
//! Bytes on the wire: the root moves (n-1) blocks, every other rank one. On one host the
//! receiver reads large blocks straight from the sender's buffer (one copy, not two through a
//! ring): the sender of each block waits until it is read, and the receiver is reading it.

use super::{Algorithm, Ctx, GatherArgs, ScatterArgs};
use crate::error::Result;

pub(crate) struct Linear;

impl Algorithm for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn gather(&self, ctx: &Ctx<'_>, w: &mut GatherArgs<'_>) -> Result<()> {
        let root = w.root.unwrap_or(0);
        if ctx.rank() != root {
            return ctx.send_chunked_read_by_peer(root, 0, w.own);
        }
        for p in (0..ctx.size()).filter(|&p| p != root) {
            ctx.recv_chunked_into(p, 0, &mut w.recv[w.blocks[p as usize].clone()])?;
        }
        Ok(())
    }

    fn scatter(&self, ctx: &Ctx<'_>, w: &mut ScatterArgs<'_>) -> Result<()> {
        if ctx.rank() != w.root {
            return ctx.recv_chunked_into(w.root, 0, w.recv);
        }
        for p in (0..ctx.size()).filter(|&p| p != w.root) {
            ctx.send_chunked_read_by_peer(p, 0, &w.send[w.blocks[p as usize].clone()])?;
        }
        w.recv.copy_from_slice(&w.send[w.blocks[w.root as usize].clone()]);
        Ok(())
    }
}
