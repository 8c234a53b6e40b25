//! Recursive halving-doubling allreduce (Rabenseifner), and plain recursive doubling for small
//! buffers.
//!
//! With n ranks, let n' = 2^⌊log2 n⌋ and r = n − n'. Pre-step: of the first 2r ranks, each
//! even one sends its whole buffer to the odd one after it, which reduces it, and sits out;
//! the n' remaining ranks get virtual ranks 0..n'. Then:
//! - halving ([`RHD`]): log2 n' steps of recursive halving (the buffer is cut into n' element-
//!   aligned segments; in step k a rank exchanges half of its current window with the partner
//!   whose virtual rank differs in bit log2 n' − 1 − k, keeps and reduces the other half), after
//!   which virtual rank v holds segment v fully reduced; then log2 n' steps of recursive doubling
//!   retrace the windows, each rank sending what it holds and receiving the partner's.
//! - doubling ([`RD`]): log2 n' steps, in step k the partner differs in bit k and both exchange
//!   and reduce the whole buffer (fewest messages, most bytes).
//!
//! Post-step: each odd rank of the first 2r sends the result to the even rank that sat out.
//! Every exchange is pipelined in chunks. The same bits end on every rank: with halving each
//! reduced segment is computed once and then copied; with doubling both partners combine in the
//! same order (the lower virtual rank's operand first).

use std::ops::Range;

use super::{Algorithm, Ctx, ReduceArgs};
use crate::error::{Error, Result};
use crate::reduce;
use crate::types::{DataType, ReduceOp};

pub(crate) struct Rhd {
    halving: bool,
}

/// Rabenseifner: 2·log2 n' messages per rank, 2(n'−1)/n'·S bytes (plus S out and back for the
/// ranks of the non-power-of-two fold).
pub(crate) static RHD: Rhd = Rhd { halving: true };
/// Recursive doubling: log2 n' messages, log2 n'·S bytes (plus the fold).
pub(crate) static RD: Rhd = Rhd { halving: false };

const TAG_PRE: u32 = 0;
const TAG_POST: u32 = 1;
const TAG_STEPS: u32 = 2;

/// Splits `bytes` into `n` element-aligned segments, differing by at most one element.
fn segments(bytes: usize, esize: usize, n: usize) -> Vec<Range<usize>> {
    let count = bytes / esize;
    (0..n).map(|i| (i * count / n) * esize..((i + 1) * count / n) * esize).collect()
}

/// How received data lands in the buffer.
#[derive(Clone, Copy)]
enum Land {
    Store,
    /// `mine op theirs`.
    Reduce(DataType, ReduceOp),
    /// `theirs op mine`: the higher partner of a doubling step, so that both compute the same
    /// operand order and end with the same bits (the sign of a zero from MAX, a NaN's payload).
    ReduceTheirsFirst(DataType, ReduceOp),
}

/// Sends `buf[out]` to `peer` and receives its data for `in_`, chunk by chunk so that both
/// directions flow at once.
fn exchange(
    ctx: &Ctx<'_>,
    peer: u32,
    tag: u32,
    buf: &mut [u8],
    out: Range<usize>,
    in_: Range<usize>,
    into: Land,
) -> Result<()> {
    let (k_out, k_in) = (ctx.nchunks(out.len()), ctx.nchunks(in_.len()));
    for c in 0..k_out.max(k_in) {
        if c < k_out {
            let r = ctx.chunk_range(out.len(), c);
            ctx.send(peer, tag, &buf[out.start + r.start..out.start + r.end])?;
        }
        if c < k_in {
            let r = ctx.chunk_range(in_.len(), c);
            let dst = &mut buf[in_.start + r.start..in_.start + r.end];
            // Each piece is combined where it lies (a ring slot, the pooled frame): no copy of
            // the chunk, no allocation.
            match into {
                Land::Reduce(dt, op) => ctx.recv_reduce(peer, tag, dst, dt, op)?,
                Land::ReduceTheirsFirst(dt, op) => ctx.recv_with(peer, tag, dst.len(), &mut |off, piece| {
                    reduce::reduce_onto(&mut dst[off..off + piece.len()], piece, dt, op)
                })?,
                Land::Store => ctx.recv_into(peer, tag, dst)?,
            }
        }
    }
    Ok(())
}

impl Algorithm for Rhd {
    fn name(&self) -> &'static str {
        if self.halving {
            "rhd"
        } else {
            "rd"
        }
    }

    fn reduce(&self, ctx: &Ctx<'_>, w: &mut ReduceArgs<'_>) -> Result<()> {
        if w.root.is_some() {
            return Err(Error::internal("recursive halving-doubling runs allreduce only"));
        }
        let (n, me) = (ctx.size(), ctx.rank());
        if n == 1 {
            return Ok(());
        }
        let p2 = 1u32 << (31 - n.leading_zeros());
        let r = n - p2;
        let all = 0..w.acc.len();
        let red = Land::Reduce(w.dt, w.op);
        // Pre-step: fold the first 2r ranks pairwise.
        let vrank = if me < 2 * r {
            if me % 2 == 0 {
                ctx.send_chunked(me + 1, TAG_PRE, w.acc)?;
                None
            } else {
                exchange(ctx, me - 1, TAG_PRE, w.acc, 0..0, all.clone(), red)?;
                Some(me / 2)
            }
        } else {
            Some(me - r)
        };
        if let Some(v) = vrank {
            let real = |v: u32| if v < r { 2 * v + 1 } else { v + r };
            if self.halving {
                halving_doubling(ctx, w, v, p2, &real)?;
            } else {
                let mut tag = TAG_STEPS;
                let mut mask = 1;
                while mask < p2 {
                    let into = if v & mask == 0 { red } else { Land::ReduceTheirsFirst(w.dt, w.op) };
                    exchange(ctx, real(v ^ mask), tag, w.acc, all.clone(), all.clone(), into)?;
                    mask <<= 1;
                    tag += 1;
                }
            }
        }
        // Post-step: hand the result back to the ranks that sat out.
        if me < 2 * r {
            if me % 2 == 0 {
                ctx.recv_chunked_into(me + 1, TAG_POST, w.acc)?;
            } else {
                ctx.send_chunked(me - 1, TAG_POST, w.acc)?;
            }
        }
        Ok(())
    }
}

/// The halving and doubling phases among the `p2` virtual ranks; `v` is this rank's.
fn halving_doubling(ctx: &Ctx<'_>, w: &mut ReduceArgs<'_>, v: u32, p2: u32, real: &dyn Fn(u32) -> u32) -> Result<()> {
    let segs = segments(w.acc.len(), w.dt.size(), p2 as usize);
    let bytes = |lo: usize, hi: usize| segs[lo].start..segs[hi - 1].end;
    let red = Land::Reduce(w.dt, w.op);
    // Windows of segment indices, [lo, hi), halved from the top bit down.
    let (mut lo, mut hi) = (0usize, p2 as usize);
    let mut tag = TAG_STEPS;
    let mut steps = Vec::new();
    let mut mask = p2 >> 1;
    while mask > 0 {
        let mid = (lo + hi) / 2;
        let (keep, give) = if v & mask == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
        exchange(ctx, real(v ^ mask), tag, w.acc, bytes(give.0, give.1), bytes(keep.0, keep.1), red)?;
        steps.push((mask, keep, give));
        (lo, hi) = keep;
        mask >>= 1;
        tag += 1;
    }
    // Doubling: retrace the steps, sending the window held and receiving the partner's.
    for (mask, keep, give) in steps.into_iter().rev() {
        exchange(ctx, real(v ^ mask), tag, w.acc, bytes(keep.0, keep.1), bytes(give.0, give.1), Land::Store)?;
        tag += 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_and_align() {
        for (bytes, esize, n) in [(0usize, 4usize, 4usize), (4 * 3, 4, 8), (2 * 1023, 2, 4), (8 * 4099, 8, 2)] {
            let segs = segments(bytes, esize, n);
            assert_eq!(segs.len(), n);
            assert_eq!((segs[0].start, segs[n - 1].end), (0, bytes));
            assert!(segs.windows(2).all(|w| w[0].end == w[1].start));
            assert!(segs.iter().all(|s| s.start % esize == 0));
        }
    }
}
