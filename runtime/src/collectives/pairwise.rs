//! Pairwise exchange for alltoall(v), and allgather(v) on one host: in step s (1..n) rank r
//! sends its block for r+s and receives the block from r-s, so every pair talks exactly once
//! and no rank is a hot spot. Bytes on the wire per rank: the sum of its blocks for other
//! ranks. On one host the receiver reads large chunks straight from the sender's buffer where
//! such a read pays (one copy instead of two through a ring, `Shm::single_copy`); a step ends
//! once its own receives are done and its sends have been read.
//!
//! An allgather sends its own block to every peer this way. Each block is read where its owner
//! put it, so no step waits for an earlier one, where the ring forwards what it received and a
//! rank that its crowded core delays holds up every later step of the others (4 ranks on 2
//! cores: 64 KiB 44-70 us against 54-82 by the ring, 256 KiB 189-273 against 262-297, 1 MiB
//! 793-1,095 against 989-1,455; 4-64 MiB level; 8 ranks 1 MiB 3.4-4.0 ms against 4.5-5.6). Over
//! TCP the ring stays: it puts each block on every link once, in a chain a network carries well.
//! Out of place, peers read the own block from the input, and its copy into the output is made
//! a chunk at a time between the offers, not before them: the peers start reading at once (2
//! ranks, 16 MiB: 6.8-8.4 ms against 7.1-10.4, median of 6 alternations 7.6 against 8.8).

use std::borrow::Cow;
use std::ops::Range;

use super::ctx::Sends;
use super::{Algorithm, AllToAllArgs, Ctx, GatherArgs};
use crate::error::{Error, Result};
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
        // Sends are waited for at the end (the oldest earlier once `Sends` is full): a step then
        // ends when its receives do, and a rank whose partner of the step reads late goes on to
        // its next partner meanwhile.
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

    fn gather(&self, ctx: &Ctx<'_>, w: &mut GatherArgs<'_>) -> Result<()> {
        if w.root.is_some() {
            return Err(super::unsupported(self.name(), "gather"));
        }
        let (n, r) = (ctx.size(), ctx.rank());
        let mine = w.blocks[r as usize].clone();
        if mine.end > w.recv.len() {
            return Err(Error::internal("allgather block out of range"));
        }
        let (below, rest) = w.recv.split_at_mut(mine.start);
        let (own_copy, above) = rest.split_at_mut(mine.len());
        // Out of place, peers read the input and this rank copies it into its own block a chunk
        // after each chunk it offers (see `gather_copies_own_block`), so that a peer starts
        // reading before the copy is done.
        let (own, mut own_out): (&[u8], Option<&mut [u8]>) =
            if w.own.is_empty() { (own_copy, None) } else { (w.own, Some(own_copy)) };
        if own_out.as_ref().is_some_and(|out| out.len() != own.len()) {
            return Err(Error::internal("allgather input and own block differ in length"));
        }
        let mut own_chunks = ctx.chunks(if own_out.is_some() { own.len() } else { 0 });
        // Sends waited for as in `all_to_all`.
        let mut sends = Sends::default();
        for s in 1..n {
            let (to, from) = ((r + s) % n, (r + n - s) % n);
            let dst = block_beside(&mut *below, &mut *above, &mine, w.blocks[from as usize].clone())?;
            let (k_out, k_in) = (ctx.nchunks(own.len()), ctx.nchunks(dst.len()));
            for c in 0..k_out.max(k_in) {
                if c < k_out {
                    let chunk = &own[ctx.chunk_range(own.len(), c)];
                    ctx.send_start(&mut sends, (to, s), Cow::Borrowed(chunk), Flow::Stored)?;
                    if let (Some(out), Some(cr)) = (own_out.as_deref_mut(), own_chunks.next()) {
                        out[cr.clone()].copy_from_slice(&own[cr]);
                    }
                }
                if c < k_in {
                    let cr = ctx.chunk_range(dst.len(), c);
                    ctx.recv_into(from, s, &mut dst[cr])?;
                }
            }
        }
        if let Some(out) = own_out {
            own_chunks.for_each(|cr| out[cr.clone()].copy_from_slice(&own[cr]));
        }
        ctx.wait_sends(&mut sends)
    }

    fn gather_copies_own_block(&self) -> bool {
        true
    }
}

/// Block `b` of an output split around this rank's own block `mine` into the parts `below`
/// and `above` it.
fn block_beside<'b>(
    below: &'b mut [u8],
    above: &'b mut [u8],
    mine: &Range<usize>,
    b: Range<usize>,
) -> Result<&'b mut [u8]> {
    let part = if b.end <= mine.start {
        below.get_mut(b)
    } else if b.start >= mine.end {
        above.get_mut(b.start - mine.end..b.end - mine.end)
    } else {
        None
    };
    part.ok_or_else(|| Error::internal("allgather blocks overlap or lie out of range"))
}
