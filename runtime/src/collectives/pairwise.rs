//! Pairwise exchange for alltoall(v): in step s (1..n) rank r sends its block for r+s and
//! receives the block from r-s, so every pair talks exactly once and no rank is a hot spot.
//! Bytes on the wire per rank: the sum of its blocks for other ranks. On one host the receiver
//! reads large chunks straight from the sender's buffer (one copy instead of two through a
//! ring); a step ends once its own receives are done and its sends have been read.

use std::borrow::Cow;

use super::ctx::Sends;
use super::{Algorithm, AllToAllArgs, Ctx};
use crate::error::Result;
use crate::transport::Flow;

pub(crate) struct Pairwise;

impl Algorithm for Pairwise {
    fn name(&self) -> &'static str {
        "pairwise"
    }

    fn all_to_all(&self, ctx: &Ctx<'_>, w: &mut AllToAllArgs<'_>) -> Result<()> {
        let (n, r) = (ctx.size(), ctx.rank());
        let own_in = w.send_blocks[r as usize].clone();
        w.recv[w.recv_blocks[r as usize].clone()].copy_from_slice(&w.send[own_in]);
        // Sends are waited for once, at the end: a step then ends when its receives do, and a
        // rank whose partner of the step reads late goes on to its next partner meanwhile.
        let mut sends = Sends::default();
        for s in 1..n {
            let to = (r + s) % n;
            let from = (r + n - s) % n;
            let out = w.send_blocks[to as usize].clone();
            let in_ = w.recv_blocks[from as usize].clone();
            let (k_out, k_in) = (ctx.nchunks(out.len()), ctx.nchunks(in_.len()));
            for c in 0..k_out.max(k_in) {
                if c < k_out {
                    let cr = ctx.chunk_range(out.len(), c);
                    let chunk = &w.send[out.start + cr.start..out.start + cr.end];
                    ctx.send_start(&mut sends, (to, s), Cow::Borrowed(chunk), Flow::Stored)?;
                }
                if c < k_in {
                    let cr = ctx.chunk_range(in_.len(), c);
                    ctx.recv_into(from, s, &mut w.recv[in_.start + cr.start..in_.start + cr.end])?;
                }
            }
        }
        ctx.wait_sends(&mut sends)
    }
}
