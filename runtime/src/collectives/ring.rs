//! Pipelined ring: allreduce as reduce-scatter then allgather around the ring, reduce-scatter,
//! and allgather(v). Each step moves one block to the next rank in chunks, so the reduction of
//! chunk k overlaps the transfer of chunk k+1. Bytes on the wire per rank: 2(n-1)/n * size for
//! allreduce, (n-1)/n * size for the others. A [`Codec`] says how a chunk of the working buffer
//! travels: as it is here, converted to a narrower type in `ring_compressed.rs`.

use std::borrow::Cow;
use std::ops::Range;

use super::ctx::Sends;
use super::{Algorithm, Ctx, GatherArgs, ReduceArgs, ReduceScatterArgs};
use crate::error::{Error, Result};
use crate::reduce;
use crate::transport::Flow;
use crate::types::{DataType, ReduceOp};

pub(crate) struct Ring;

/// How ring steps carry chunks of the working buffer. Chunks are cut from the working buffer
/// at element boundaries, so a codec always sees whole elements.
pub(super) trait Codec {
    /// Element size of the working buffer.
    fn esize(&self) -> usize;
    /// True when chunks travel as they are (received ones are stored without decoding).
    fn raw(&self) -> bool {
        false
    }
    /// Bytes on the wire for `len` bytes of the working buffer.
    fn wire_len(&self, len: usize) -> usize;
    /// What is sent for `chunk` of the working buffer.
    fn encode<'a>(&self, chunk: &'a [u8]) -> Cow<'a, [u8]>;
    /// Stores the received `wire` bytes into `dst`, or combines them into it (`op = Some`).
    fn decode(&self, dst: &mut [u8], wire: &[u8], op: Option<ReduceOp>);
    /// `dst = base op wire`: combines the received bytes with `base` (this rank's input, of
    /// `dst`'s length) into `dst`, whatever `dst` held.
    fn decode_onto(&self, dst: &mut [u8], base: &[u8], wire: &[u8], op: ReduceOp) {
        dst.copy_from_slice(base);
        self.decode(dst, wire, Some(op));
    }
    /// `dst = base op dst` for a chunk that travelled raw (see `raw`) and landed in `dst`.
    fn combine_landed(&self, dst: &mut [u8], base: &[u8], op: ReduceOp) {
        let landed = dst.to_vec();
        self.decode_onto(dst, base, &landed, op);
    }
    /// Brings a segment that is fully reduced on its owner to what the other ranks will receive
    /// for it, so that all ranks end with the same bits.
    fn round_like_wire(&self, _segment: &mut [u8]) {}
}

/// Data travels as it is.
struct Plain(DataType);

impl Codec for Plain {
    fn esize(&self) -> usize {
        self.0.size()
    }
    fn raw(&self) -> bool {
        true
    }
    fn wire_len(&self, len: usize) -> usize {
        len
    }
    fn encode<'a>(&self, chunk: &'a [u8]) -> Cow<'a, [u8]> {
        Cow::Borrowed(chunk)
    }
    fn decode(&self, dst: &mut [u8], wire: &[u8], op: Option<ReduceOp>) {
        match op {
            Some(op) => reduce::reduce_into(dst, wire, self.0, op),
            None => dst.copy_from_slice(wire),
        }
    }
    fn decode_onto(&self, dst: &mut [u8], base: &[u8], wire: &[u8], op: ReduceOp) {
        reduce::reduce_from(dst, base, wire, self.0, op);
    }
    fn combine_landed(&self, dst: &mut [u8], base: &[u8], op: ReduceOp) {
        reduce::reduce_onto(dst, base, self.0, op);
    }
}

/// Segment `i` of `bytes` split into `n` element-aligned segments, differing by at most one
/// element (computed, not collected: this runs for every operation).
pub(super) fn segment(bytes: usize, esize: usize, n: u32, i: u32) -> Range<usize> {
    let (count, n, i) = (bytes / esize, n as usize, i as usize);
    (i * count / n) * esize..((i + 1) * count / n) * esize
}

/// `buf[out]` to read and `buf[in_]` to write at the same time (the ranges must not overlap).
pub(super) fn split(buf: &mut [u8], out: Range<usize>, in_: Range<usize>) -> Result<(&[u8], &mut [u8])> {
    if out.is_empty() {
        return Ok((&[], &mut buf[in_]));
    }
    if in_.is_empty() {
        let buf: &[u8] = buf;
        return Ok((&buf[out], &mut []));
    }
    if out.end <= in_.start {
        let (lo, hi) = buf.split_at_mut(in_.start);
        return Ok((&lo[out], &mut hi[..in_.len()]));
    }
    if in_.end <= out.start {
        let (lo, hi) = buf.split_at_mut(out.start);
        return Ok((&hi[..out.len()], &mut lo[in_]));
    }
    Err(Error::internal(format!("ring step sends {out:?} while it receives {in_:?}")))
}

/// What a ring step does with the chunks it receives.
#[derive(Clone, Copy)]
enum OnArrival<'a> {
    /// Stored as they arrive (allgather).
    Store,
    /// Combined into the destination: `dst op= chunk`.
    Reduce(ReduceOp),
    /// Combined with this rank's input for the block, `base` (of the destination's length):
    /// `dst = base op chunk`, whatever `dst` held. Out of place, the working buffer never
    /// receives a copy of the input.
    ReduceOnto { op: ReduceOp, base: &'a [u8] },
}

/// One ring step: send `src` to `next` and receive into `dst` from `prev`, chunk by chunk;
/// received chunks land as `land` says. Chunks go out as sends that complete later (the peer
/// may read them straight from `src`), all finished before the step returns: `src` does not
/// change during its own step, and no peer reads it after.
fn step(ctx: &Ctx<'_>, tag: u32, src: &[u8], dst_all: &mut [u8], codec: &dyn Codec, land: OnArrival<'_>) -> Result<()> {
    let n = ctx.size();
    let (next, prev) = ((ctx.rank() + 1) % n, (ctx.rank() + n - 1) % n);
    let (k_out, k_in) = (ctx.nchunks(src.len()), ctx.nchunks(dst_all.len()));
    let base_all = match land {
        OnArrival::ReduceOnto { base, .. } => base,
        _ => &[],
    };
    let flow = match land {
        OnArrival::Store => Flow::Stored,
        _ => Flow::Combined,
    };
    let mut sends = Sends::default();
    for c in 0..k_out.max(k_in) {
        if c < k_out {
            let r = ctx.chunk_range(src.len(), c);
            ctx.send_start(&mut sends, (next, tag), codec.encode(&src[r]), flow)?;
        }
        if c < k_in {
            let r = ctx.chunk_range(dst_all.len(), c);
            let base = base_all.get(r.clone()).unwrap_or(&[]);
            let dst = &mut dst_all[r];
            match land {
                OnArrival::Store if codec.raw() => {
                    // Stored as it arrives: a single-copy read lands in `dst` itself.
                    ctx.recv_into(prev, tag, dst)?;
                    continue;
                }
                OnArrival::ReduceOnto { op, .. } if codec.raw() => {
                    // Combined with the input where the chunk lies (a ring slot, the sender's
                    // mapped buffer) or, after a single-copy read, where it landed in `dst`,
                    // piece by piece in cache: `dst` is written once and never read first.
                    ctx.recv_into_then(prev, tag, dst, &mut |dst, wire, off| {
                        let base = &base[off..off + dst.len()];
                        match wire {
                            Some(wire) => codec.decode_onto(dst, base, wire, op),
                            None => codec.combine_landed(dst, base, op),
                        }
                    })?;
                    continue;
                }
                _ => {}
            }
            let wire = codec.wire_len(dst.len());
            // Decode each piece where it lies (in shared memory, for a local peer): a piece
            // at wire offset `o` covers the working bytes from `o * len / wire`.
            let len = dst.len();
            ctx.recv_with(prev, tag, wire, &mut |o, piece| {
                if piece.is_empty() {
                    return;
                }
                let (a, b) = (o * len / wire, (o + piece.len()) * len / wire);
                match land {
                    OnArrival::Store => codec.decode(&mut dst[a..b], piece, None),
                    OnArrival::Reduce(op) => codec.decode(&mut dst[a..b], piece, Some(op)),
                    OnArrival::ReduceOnto { op, .. } => codec.decode_onto(&mut dst[a..b], &base[a..b], piece, op),
                }
            })?;
        }
    }
    ctx.wait_sends(&mut sends)
}

/// Reduce-scatter phase over `buf` split into `segs`: afterwards this rank holds the fully
/// reduced segment `(rank + 1) % n`. Returns the next free tag. With `input`, `buf`
/// need not hold the contribution (see [`OnArrival::ReduceOnto`]): every segment is received once,
/// and every one sent after the first step is one received in the step before.
fn reduce_scatter_phase(
    ctx: &Ctx<'_>,
    buf: &mut [u8],
    input: Option<&[u8]>,
    seg: &dyn Fn(u32) -> Range<usize>,
    codec: &dyn Codec,
    op: ReduceOp,
) -> Result<u32> {
    let n = ctx.size();
    let r = ctx.rank() + n;
    for s in 0..n - 1 {
        let out = seg((r + 2 * n - s) % n);
        let in_ = seg((r + 2 * n - s - 1) % n);
        match input {
            // The first step sends this rank's own contribution, from the input.
            Some(input) if s == 0 => step(
                ctx,
                s,
                &input[out],
                &mut buf[in_.clone()],
                codec,
                OnArrival::ReduceOnto { op, base: &input[in_] },
            )?,
            Some(input) => {
                let (src, dst) = split(buf, out, in_.clone())?;
                step(ctx, s, src, dst, codec, OnArrival::ReduceOnto { op, base: &input[in_] })?
            }
            None => {
                let (src, dst) = split(buf, out, in_)?;
                step(ctx, s, src, dst, codec, OnArrival::Reduce(op))?
            }
        }
    }
    Ok(n - 1)
}

/// Allreduce into `buf` of this rank's contribution, which is `input` or, without it, `buf`
/// itself on entry: reduce-scatter, then the owner of each segment rounds it as the wire will and the segments
/// circulate. With `input`, the reduce-scatter writes every segment but this rank's first one
/// (sent from `input`) before reading it, and the allgather writes that one, so `buf` is never
/// copied into first.
pub(super) fn allreduce(
    ctx: &Ctx<'_>,
    buf: &mut [u8],
    input: Option<&[u8]>,
    codec: &dyn Codec,
    op: ReduceOp,
) -> Result<()> {
    let n = ctx.size();
    let r = ctx.rank();
    if let Some(i) = input {
        if i.len() != buf.len() {
            return Err(Error::internal(format!("ring allreduce of {} input bytes into {}", i.len(), buf.len())));
        }
        if n == 1 {
            buf.copy_from_slice(i);
        }
    }
    let input = input.filter(|_| n > 1);
    let (bytes, esize) = (buf.len(), codec.esize());
    let seg = |i: u32| segment(bytes, esize, n, i);
    let first = reduce_scatter_phase(ctx, buf, input, &seg, codec, op)?;
    codec.round_like_wire(&mut buf[seg((r + 1) % n)]);
    for s in 0..n - 1 {
        let out = seg((r + 1 + n - s) % n);
        let in_ = seg((r + n - s) % n);
        let (src, dst) = split(buf, out, in_)?;
        step(ctx, first + s, src, dst, codec, OnArrival::Store)?;
    }
    Ok(())
}

impl Algorithm for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn reduce(&self, ctx: &Ctx<'_>, w: &mut ReduceArgs<'_>) -> Result<()> {
        allreduce(ctx, w.acc, None, &Plain(w.dt), w.op)
    }

    fn allreduce_from(&self, ctx: &Ctx<'_>, input: &[u8], w: &mut ReduceArgs<'_>) -> Result<()> {
        allreduce(ctx, w.acc, Some(input), &Plain(w.dt), w.op)
    }

    /// Reduce-scatter straight from the input: each step combines the block it receives with
    /// the input's (`OnArrival::ReduceOnto`) and sends it on in the next step, so partial blocks
    /// need two block buffers, used in turn: the output, which the last step fills, and (from
    /// 3 ranks) one pooled scratch block. Nothing is copied first.
    fn reduce_scatter(&self, ctx: &Ctx<'_>, w: &mut ReduceScatterArgs<'_>) -> Result<()> {
        let (n, block) = (ctx.size(), w.block_bytes);
        let seg = |i: u32| i as usize * block..(i as usize + 1) * block;
        if n == 1 {
            w.out.copy_from_slice(&w.input[seg(0)]);
            return Ok(());
        }
        let plain = Plain(w.dt);
        let mut scratch = if n > 2 { crate::transport::pool::take(block) } else { Vec::new() };
        scratch.resize(if n > 2 { block } else { 0 }, 0);
        // Step s sends block rank - 1 - s and receives block rank - 2 - s (mod n): the last
        // step receives this rank's own block.
        let r = ctx.rank() + n - 1;
        let mut result = Ok(());
        for s in 0..n - 1 {
            let (out, in_) = (seg((r + 2 * n - s) % n), seg((r + 2 * n - s - 1) % n));
            let land = OnArrival::ReduceOnto { op: w.op, base: &w.input[in_] };
            // The step that fills the output is the last, or an even number of steps before it.
            let into_out = (n - 2 - s) % 2 == 0;
            result = match (s, into_out) {
                (0, true) => step(ctx, s, &w.input[out], w.out, &plain, land),
                (0, false) => step(ctx, s, &w.input[out], &mut scratch, &plain, land),
                (_, true) => step(ctx, s, &scratch, w.out, &plain, land),
                (_, false) => step(ctx, s, w.out, &mut scratch, &plain, land),
            };
            if result.is_err() {
                break;
            }
        }
        crate::transport::pool::give(scratch);
        result
    }

    fn gather(&self, ctx: &Ctx<'_>, w: &mut GatherArgs<'_>) -> Result<()> {
        let n = ctx.size();
        let r = ctx.rank();
        // Bytes are moved, never combined: any element size will do.
        let plain = Plain(DataType::Uint8);
        for s in 0..n - 1 {
            let out = w.blocks[((r + n - s) % n) as usize].clone();
            let in_ = w.blocks[((r + 2 * n - s - 1) % n) as usize].clone();
            // The first step sends this rank's own block: from the input when there is one.
            if s == 0 && !w.own.is_empty() && w.own.len() == out.len() {
                let dst = w.recv.get_mut(in_).ok_or_else(|| Error::internal("allgather block out of range"))?;
                step(ctx, s, w.own, dst, &plain, OnArrival::Store)?;
                continue;
            }
            let (src, dst) = split(w.recv, out, in_)?;
            step(ctx, s, src, dst, &plain, OnArrival::Store)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_gives_both_ranges_or_refuses_an_overlap() {
        let mut buf: Vec<u8> = (0..10).collect();
        for (out, in_) in [(0..3, 5..9), (6..10, 0..6), (0..0, 2..4), (3..7, 0..0), (0..0, 0..0), (2..5, 5..5)] {
            let (o, i) = split(&mut buf, out.clone(), in_.clone()).unwrap_or_else(|e| panic!("{out:?} {in_:?}: {e}"));
            assert_eq!(o, &(out.start as u8..out.end as u8).collect::<Vec<u8>>()[..], "{out:?} {in_:?}");
            assert_eq!(i, &mut (in_.start as u8..in_.end as u8).collect::<Vec<u8>>()[..], "{out:?} {in_:?}");
        }
        assert!(split(&mut buf, 0..5, 4..8).is_err());
        assert!(split(&mut buf, 4..8, 0..5).is_err());
    }

    #[test]
    fn segments_cover_and_align() {
        for (bytes, esize, n) in [(0usize, 4usize, 3u32), (4 * 7, 4, 3), (2 * 5, 2, 8), (8 * 1000, 8, 5)] {
            let segs: Vec<Range<usize>> = (0..n).map(|i| segment(bytes, esize, n, i)).collect();
            assert_eq!(segs.len(), n as usize);
            assert_eq!(segs[0].start, 0);
            assert_eq!(segs.last().map(|s| s.end), Some(bytes));
            assert!(segs.windows(2).all(|w| w[0].end == w[1].start));
            assert!(segs.iter().all(|s| s.start % esize == 0 && s.end % esize == 0));
        }
    }
}
