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

use std::borrow::Cow;
use std::ops::Range;

use super::ctx::Sends;
use super::ring::{segment, split};
use super::{Algorithm, Ctx, ReduceArgs};
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::Flow;
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

/// How received data lands in the buffer.
#[derive(Clone, Copy)]
enum OnArrival {
    Store,
    /// `mine op theirs`.
    Reduce(DataType, ReduceOp),
    /// `theirs op mine`: the higher partner of a doubling step, so that both compute the same
    /// operand order and end with the same bits (the sign of a zero from MAX, a NaN's payload).
    ReduceTheirsFirst(DataType, ReduceOp),
}

/// Sends `buf[out]` to `peer` and receives its data for `in_`, chunk by chunk so that both
/// directions flow at once. Given `input` (the first step of an out-of-place allreduce, where
/// `buf` holds nothing yet), the data sent and the operand combined with what arrives come from
/// `input` instead of `buf`: no copy of the input into the output first.
///
/// When `out` and `in_` are apart (halving, doubling, the fold), chunks go out as sends that
/// complete later, as the ring's do: a same-host peer reads them straight from this rank's
/// memory, once, and the exchange returns when it has. Recursive doubling sends and receives
/// the whole buffer: each chunk leaves (copied) before the one received over it is combined.
#[allow(clippy::too_many_arguments)]
fn exchange(
    ctx: &Ctx<'_>,
    peer: u32,
    tag: u32,
    buf: &mut [u8],
    input: Option<&[u8]>,
    out: Range<usize>,
    in_: Range<usize>,
    into: OnArrival,
) -> Result<()> {
    let (k_out, k_in) = (ctx.nchunks(out.len()), ctx.nchunks(in_.len()));
    let apart = out.is_empty() || in_.is_empty() || out.end <= in_.start || in_.end <= out.start;
    if !apart {
        for c in 0..k_out.max(k_in) {
            if c < k_out {
                let r = ctx.chunk_range(out.len(), c);
                let piece = out.start + r.start..out.start + r.end;
                ctx.send(peer, tag, input.map_or(&buf[piece.clone()], |i| &i[piece]))?;
            }
            if c < k_in {
                let r = ctx.chunk_range(in_.len(), c);
                let at = in_.start + r.start..in_.start + r.end;
                receive(ctx, peer, tag, &mut buf[at.clone()], input.map(|i| &i[at]), into)?;
            }
        }
        return Ok(());
    }
    let (held, dst) = split(buf, out.clone(), in_.clone())?;
    let src = input.map_or(held, |i| &i[out]);
    let base = input.map(|i| &i[in_]);
    let mut sends = Sends::default();
    for c in 0..k_out.max(k_in) {
        if c < k_out {
            let chunk = Cow::Borrowed(&src[ctx.chunk_range(src.len(), c)]);
            ctx.send_start(&mut sends, (peer, tag), chunk, Flow::Combined)?;
        }
        if c < k_in {
            let r = ctx.chunk_range(dst.len(), c);
            receive(ctx, peer, tag, &mut dst[r.clone()], base.map(|b| &b[r]), into)?;
        }
    }
    ctx.wait_sends(&mut sends)
}

/// Receives one chunk from `peer` into `dst` as `into` says, `base` being this rank's operand
/// when it is not `dst` itself (out of place). Each piece is combined where it lies (a ring
/// slot, the pooled frame, the sender's memory): no copy of the chunk, no allocation.
fn receive(ctx: &Ctx<'_>, peer: u32, tag: u32, dst: &mut [u8], base: Option<&[u8]>, into: OnArrival) -> Result<()> {
    match (into, base) {
        (OnArrival::Reduce(dt, op), None) => ctx.recv_reduce(peer, tag, dst, dt, op),
        (OnArrival::Reduce(dt, op), Some(base)) => ctx.recv_reduce_onto(peer, tag, dst, base, dt, op),
        (OnArrival::ReduceTheirsFirst(dt, op), base) => ctx.recv_with(peer, tag, dst.len(), &mut |off, piece| {
            let d = &mut dst[off..off + piece.len()];
            match base {
                None => reduce::reduce_onto(d, piece, dt, op),
                Some(b) => reduce::reduce_from(d, piece, &b[off..off + piece.len()], dt, op),
            }
        }),
        (OnArrival::Store, _) => ctx.recv_into(peer, tag, dst),
    }
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
        self.allreduce(ctx, w, None)
    }

    fn allreduce_from(&self, ctx: &Ctx<'_>, input: &[u8], w: &mut ReduceArgs<'_>) -> Result<()> {
        self.allreduce(ctx, w, Some(input))
    }
}

impl Rhd {
    /// Allreduce into `w.acc`, which holds this rank's contribution, or, given `input`, holds
    /// nothing yet: the first message this rank sends and the first it combines then read the
    /// input, and every byte of `acc` is written by a later step.
    fn allreduce(&self, ctx: &Ctx<'_>, w: &mut ReduceArgs<'_>, input: Option<&[u8]>) -> Result<()> {
        let (n, me) = (ctx.size(), ctx.rank());
        if n == 1 {
            if let Some(input) = input {
                w.acc.copy_from_slice(input);
            }
            return Ok(());
        }
        let p2 = 1u32 << (31 - n.leading_zeros());
        let r = n - p2;
        let all = 0..w.acc.len();
        let red = OnArrival::Reduce(w.dt, w.op);
        // Pre-step: fold the first 2r ranks pairwise. After it the input has been read.
        let (vrank, mut input) = if me < 2 * r {
            if me % 2 == 0 {
                exchange(ctx, me + 1, TAG_PRE, w.acc, input, all.clone(), 0..0, red)?;
                (None, None)
            } else {
                exchange(ctx, me - 1, TAG_PRE, w.acc, input, 0..0, all.clone(), red)?;
                (Some(me / 2), None)
            }
        } else {
            (Some(me - r), input)
        };
        if let Some(v) = vrank {
            let real = |v: u32| if v < r { 2 * v + 1 } else { v + r };
            if self.halving {
                halving_doubling(ctx, w, input, v, p2, &real)?;
            } else {
                let mut tag = TAG_STEPS;
                let mut mask = 1;
                while mask < p2 {
                    let into = if v & mask == 0 { red } else { OnArrival::ReduceTheirsFirst(w.dt, w.op) };
                    exchange(ctx, real(v ^ mask), tag, w.acc, input.take(), all.clone(), all.clone(), into)?;
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
                exchange(ctx, me - 1, TAG_POST, w.acc, None, all.clone(), 0..0, OnArrival::Store)?;
            }
        }
        Ok(())
    }
}

/// The halving and doubling phases among the `p2` virtual ranks; `v` is this rank's.
/// Given `input` (out of place), the first halving step reads it; the doubling steps write
/// every window that step gave away.
fn halving_doubling(
    ctx: &Ctx<'_>,
    w: &mut ReduceArgs<'_>,
    mut input: Option<&[u8]>,
    v: u32,
    p2: u32,
    real: &dyn Fn(u32) -> u32,
) -> Result<()> {
    let (len, esize) = (w.acc.len(), w.dt.size());
    let bytes =
        |lo: usize, hi: usize| segment(len, esize, p2, lo as u32).start..segment(len, esize, p2, hi as u32 - 1).end;
    let red = OnArrival::Reduce(w.dt, w.op);
    // Windows of segment indices, [lo, hi), halved from the top bit down.
    let (mut lo, mut hi) = (0usize, p2 as usize);
    let mut tag = TAG_STEPS;
    // One entry per bit of p2: never more than 32, kept inline.
    let mut steps = smallvec::SmallVec::<[_; 32]>::new();
    let mut mask = p2 >> 1;
    while mask > 0 {
        let mid = (lo + hi) / 2;
        let (keep, give) = if v & mask == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
        exchange(ctx, real(v ^ mask), tag, w.acc, input.take(), bytes(give.0, give.1), bytes(keep.0, keep.1), red)?;
        steps.push((mask, keep, give));
        (lo, hi) = keep;
        mask >>= 1;
        tag += 1;
    }
    // Doubling: retrace the steps, sending the window held and receiving the partner's.
    for (mask, keep, give) in steps.into_iter().rev() {
        exchange(
            ctx,
            real(v ^ mask),
            tag,
            w.acc,
            None,
            bytes(keep.0, keep.1),
            bytes(give.0, give.1),
            OnArrival::Store,
        )?;
        tag += 1;
    }
    Ok(())
}
