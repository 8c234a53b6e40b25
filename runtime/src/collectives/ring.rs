//! Pipelined ring: allreduce as reduce-scatter then allgather around the ring, reduce-scatter,
//! and allgather(v). Each step moves one block to the next rank in chunks, so the reduction of
//! chunk k overlaps the transfer of chunk k+1. Bytes on the wire per rank: 2(n-1)/n * size for
//! allreduce, (n-1)/n * size for the others.

use std::ops::Range;

use super::{Algorithm, Ctx, GatherArgs, ReduceArgs, ReduceScatterArgs};
use crate::error::Result;
use crate::types::{DataType, ReduceOp};

pub(crate) struct Ring;

/// Splits `bytes` into `n` element-aligned segments, differing by at most one element.
fn segments(bytes: usize, esize: usize, n: u32) -> Vec<Range<usize>> {
    let count = bytes / esize;
    let n = n as usize;
    (0..n).map(|i| (i * count / n) * esize..((i + 1) * count / n) * esize).collect()
}

/// One ring step: send `buf[out]` to `next` and receive `in_` from `prev`, chunk by chunk;
/// received chunks are reduced into `buf` (`reduce = Some`) or stored.
fn step(
    ctx: &Ctx<'_>,
    tag: u32,
    buf: &mut [u8],
    out: Range<usize>,
    in_: Range<usize>,
    reduce: Option<(DataType, ReduceOp)>,
) -> Result<()> {
    let n = ctx.size();
    let (next, prev) = ((ctx.rank() + 1) % n, (ctx.rank() + n - 1) % n);
    let (k_out, k_in) = (ctx.nchunks(out.len()), ctx.nchunks(in_.len()));
    for c in 0..k_out.max(k_in) {
        if c < k_out {
            let r = ctx.chunk_range(out.len(), c);
            ctx.send(next, tag, &buf[out.start + r.start..out.start + r.end])?;
        }
        if c < k_in {
            let r = ctx.chunk_range(in_.len(), c);
            let dst = &mut buf[in_.start + r.start..in_.start + r.end];
            match reduce {
                Some((dt, op)) => ctx.recv_reduce(prev, tag, dst, dt, op)?,
                None => ctx.recv_into(prev, tag, dst)?,
            }
        }
    }
    Ok(())
}

/// Reduce-scatter phase over `buf` split into `segs`: afterwards this rank holds the fully
/// reduced segment `(rank + 1 - shift) % n`. Returns the next free tag.
fn reduce_scatter_phase(
    ctx: &Ctx<'_>,
    buf: &mut [u8],
    segs: &[Range<usize>],
    shift: u32,
    dt: DataType,
    op: ReduceOp,
) -> Result<u32> {
    let n = ctx.size();
    let r = ctx.rank() + n - shift % n;
    for s in 0..n - 1 {
        let out = segs[((r + 2 * n - s) % n) as usize].clone();
        let in_ = segs[((r + 2 * n - s - 1) % n) as usize].clone();
        step(ctx, s, buf, out, in_, Some((dt, op)))?;
    }
    Ok(n - 1)
}

impl Algorithm for Ring {
    fn name(&self) -> &'static str {
        "ring"
    }

    fn reduce(&self, ctx: &Ctx<'_>, w: &mut ReduceArgs<'_>) -> Result<()> {
        let n = ctx.size();
        if n == 1 {
            return Ok(());
        }
        let segs = segments(w.acc.len(), w.dt.size(), n);
        let first = reduce_scatter_phase(ctx, w.acc, &segs, 0, w.dt, w.op)?;
        // Allgather phase: circulate the reduced segments.
        let r = ctx.rank();
        for s in 0..n - 1 {
            let out = segs[((r + 1 + n - s) % n) as usize].clone();
            let in_ = segs[((r + n - s) % n) as usize].clone();
            step(ctx, first + s, w.acc, out, in_, None)?;
        }
        Ok(())
    }

    fn reduce_scatter(&self, ctx: &Ctx<'_>, w: &mut ReduceScatterArgs<'_>) -> Result<()> {
        let n = ctx.size();
        let mut work = w.input.to_vec();
        let segs: Vec<Range<usize>> = (0..n as usize).map(|i| i * w.block_bytes..(i + 1) * w.block_bytes).collect();
        if n > 1 {
            // Shift by one so that the segment this rank ends with is its own.
            reduce_scatter_phase(ctx, &mut work, &segs, 1, w.dt, w.op)?;
        }
        w.out.copy_from_slice(&work[segs[ctx.rank() as usize].clone()]);
        Ok(())
    }

    fn gather(&self, ctx: &Ctx<'_>, w: &mut GatherArgs<'_>) -> Result<()> {
        let n = ctx.size();
        let r = ctx.rank();
        for s in 0..n - 1 {
            let out = w.blocks[((r + n - s) % n) as usize].clone();
            let in_ = w.blocks[((r + 2 * n - s - 1) % n) as usize].clone();
            step(ctx, s, w.recv, out, in_, None)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_and_align() {
        for (bytes, esize, n) in [(0usize, 4usize, 3u32), (4 * 7, 4, 3), (2 * 5, 2, 8), (8 * 1000, 8, 5)] {
            let segs = segments(bytes, esize, n);
            assert_eq!(segs.len(), n as usize);
            assert_eq!(segs[0].start, 0);
            assert_eq!(segs.last().map(|s| s.end), Some(bytes));
            assert!(segs.windows(2).all(|w| w[0].end == w[1].start));
            assert!(segs.iter().all(|s| s.start % esize == 0 && s.end % esize == 0));
        }
    }
}
