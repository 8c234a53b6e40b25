//! Linear gather and scatter: the root exchanges one block directly with every other rank.
//! Bytes on the wire: the root moves (n-1) blocks, every other rank one. On one host the
//! receiver reads large blocks straight from the sender's buffer where such a read pays (one
//! copy, not two through a ring, `Shm::single_copy`): the sender of each block waits until it
//! is read, and the receiver is reading it.
//! The root of a scatter offers the blocks before it waits, copying its own beside them, so
//! that its receivers read at once, also where ranks share cores (they only store). The root of
//! a gather reads every block itself, one sender after another: there the senders' copies into
//! the rings, running beside its own, win from mid sizes (`Flow::Collected`; 4 ranks on 2 cores, 16 MiB each: 11–12 ms
//! against 16–17 ms by single copy; 2 ranks bound to a core each: 3.0–3.9 against 5.2–6.8).

use std::borrow::Cow;

use super::ctx::Sends;
use super::{Algorithm, Ctx, GatherArgs, ScatterArgs};
use crate::error::{Error, Result};
use crate::transport::Flow;

pub(crate) struct Linear;

impl Algorithm for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn gather(&self, ctx: &Ctx<'_>, w: &mut GatherArgs<'_>) -> Result<()> {
        let root = w.root.unwrap_or(0);
        if ctx.rank() != root {
            let mut sends = Sends::default();
            ctx.send_chunked_start(&mut sends, (root, 0), w.own, Flow::Collected)?;
            return ctx.wait_sends(&mut sends);
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
        // The root copies its own block a chunk after each chunk it offers: `Sends` holds only a
        // few offers, so a copy left for the end would wait for the readers of the first ones.
        // In place (`recv` empty) the root's block is where it belongs already.
        let own = if w.recv.is_empty() { &[][..] } else { &w.send[w.blocks[w.root as usize].clone()] };
        if own.len() != w.recv.len() {
            return Err(Error::internal("scatter root's block and output differ in length"));
        }
        let mut own_chunks = ctx.chunks(own.len());
        let mut sends = Sends::default();
        for p in (0..ctx.size()).filter(|&p| p != w.root) {
            let block = &w.send[w.blocks[p as usize].clone()];
            for r in ctx.chunks(block.len()) {
                ctx.send_start(&mut sends, (p, 0), Cow::Borrowed(&block[r]), Flow::Stored)?;
                if let Some(r) = own_chunks.next() {
                    w.recv[r.clone()].copy_from_slice(&own[r]);
                }
            }
        }
        own_chunks.for_each(|r| w.recv[r.clone()].copy_from_slice(&own[r]));
        ctx.wait_sends(&mut sends)
    }
}
