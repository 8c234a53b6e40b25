//! Hierarchical allreduce, for communicators that span several hosts with several ranks on some
//! of them: the slow links between hosts carry each byte once per host instead of once per rank.
//!
//! With `m_h` ranks on host `h` and `S = min_h m_h` segments of the buffer:
//! 1. intra-host reduce-scatter (over shared memory): local rank `i < S` becomes the owner of
//!    segment `i` and receives it from every other rank of its host, reducing as it arrives;
//! 2. inter-host allreduce (over TCP): the owners of segment `i`, one per host, run a pipelined
//!    ring allreduce of it;
//! 3. intra-host allgather (over shared memory): each owner sends its reduced segment to every
//!    other rank of its host.
//!
//! Steps 1 and 3 are pairwise exchanges (step k: send to local rank i+k, receive from i-k), chunk
//! by chunk, so that sends and receives interleave and never wait on a full ring. Bytes per rank:
//! step 1 sends `(m_h-1)/S * size` at most (`(m-1)/m * size` when hosts are even), step 2
//! `2(H-1)/H * size/S` between hosts, step 3 the same as step 1.

use std::ops::Range;

use smallvec::SmallVec;

use super::ring::{segment, split, Ring};
use super::{Algorithm, Ctx, ReduceArgs};
use crate::error::{Error, Result};
use crate::types::{DataType, ReduceOp};

pub(crate) struct Hier;

/// Tags of the three steps (each step's pairwise round adds its round number).
const TAG_LOCAL_REDUCE: u32 = 0;
const TAG_ACROSS: u32 = 1 << 16;
const TAG_LOCAL_GATHER: u32 = 2 << 16;

/// True when hierarchy pays: more than one host, and more ranks than hosts.
pub(crate) fn applies(hosts: Option<&[u32]>) -> bool {
    hosts.is_some_and(|h| {
        let count = h.iter().max().map_or(1, |m| *m as usize + 1);
        count > 1 && count < h.len()
    })
}

/// What an exchange does with the chunks it receives.
#[derive(Clone, Copy)]
enum OnArrival<'a> {
    Store,
    /// `dst op= chunk`.
    Reduce(DataType, ReduceOp),
    /// `dst = base op chunk`, `base` covering the whole received range: the first contribution
    /// to an out-of-place allreduce's segment, whose output never holds a copy of the input.
    ReduceOnto(&'a [u8], DataType, ReduceOp),
}

/// Sends `out.1` to `out.0` and receives `in_.1` from `in_.0`, chunk by chunk, direct what
/// arrives as `land` says.
fn exchange(
    ctx: &Ctx<'_>,
    tag: u32,
    out: Option<(u32, &[u8])>,
    in_: Option<(u32, &mut [u8])>,
    land: OnArrival<'_>,
) -> Result<()> {
    let k_out = out.as_ref().map_or(0, |(_, b)| ctx.nchunks(b.len()));
    let (from, dst) = match in_ {
        Some((from, dst)) => (from, dst),
        None => (0, &mut [][..]),
    };
    let k_in = ctx.nchunks(dst.len());
    for c in 0..k_out.max(k_in) {
        if let Some((to, b)) = out.as_ref().filter(|_| c < k_out) {
            ctx.send(*to, tag, &b[ctx.chunk_range(b.len(), c)])?;
        }
        if c < k_in {
            let part = ctx.chunk_range(dst.len(), c);
            match land {
                OnArrival::Store => ctx.recv_into(from, tag, &mut dst[part])?,
                OnArrival::Reduce(dt, op) => ctx.recv_reduce(from, tag, &mut dst[part], dt, op)?,
                OnArrival::ReduceOnto(base, dt, op) => {
                    ctx.recv_reduce_onto(from, tag, &mut dst[part.clone()], &base[part], dt, op)?
                }
            }
        }
    }
    Ok(())
}

/// [`exchange`] within one buffer: sends `buf[out.1]`, receives into `buf[in_.1]` (ranges that
/// do not overlap).
fn exchange_within(
    ctx: &Ctx<'_>,
    tag: u32,
    buf: &mut [u8],
    out: Option<(u32, Range<usize>)>,
    in_: Option<(u32, Range<usize>)>,
    land: OnArrival<'_>,
) -> Result<()> {
    let (src, dst) =
        split(buf, out.as_ref().map_or(0..0, |o| o.1.clone()), in_.as_ref().map_or(0..0, |i| i.1.clone()))?;
    exchange(ctx, tag, out.map(|(to, _)| (to, src)), in_.map(|(from, _)| (from, dst)), land)
}

/// Ring allreduce of `buf` among `peers` (communicator ranks; this rank is `peers[pos]`).
fn ring_among(ctx: &Ctx<'_>, peers: &[u32], pos: usize, buf: &mut [u8], dt: DataType, op: ReduceOp) -> Result<()> {
    let n = peers.len();
    if n < 2 {
        return Ok(());
    }
    let (next, prev) = (peers[(pos + 1) % n], peers[(pos + n - 1) % n]);
    let (len, esize) = (buf.len(), dt.size());
    let seg = |j: usize| segment(len, esize, n as u32, j as u32);
    for s in 0..n - 1 {
        let out = seg((pos + n - s) % n);
        let in_ = seg((pos + 2 * n - s - 1) % n);
        exchange_within(
            ctx,
            TAG_ACROSS + s as u32,
            buf,
            Some((next, out)),
            Some((prev, in_)),
            OnArrival::Reduce(dt, op),
        )?;
    }
    for s in 0..n - 1 {
        let out = seg((pos + 1 + n - s) % n);
        let in_ = seg((pos + n - s) % n);
        exchange_within(ctx, TAG_ACROSS + (n + s) as u32, buf, Some((next, out)), Some((prev, in_)), OnArrival::Store)?;
    }
    Ok(())
}

/// Allreduce into `buf` of this rank's contribution, which is `input` or, without it, `buf` itself
/// on entry. With `input`, `buf` is never copied into: the first contribution an owner receives
/// for its segment is combined with the input, and every other segment arrives in step 3.
fn allreduce(
    ctx: &Ctx<'_>,
    hosts: &[u32],
    input: Option<&[u8]>,
    buf: &mut [u8],
    dt: DataType,
    op: ReduceOp,
) -> Result<()> {
    let me = ctx.rank();
    let nhosts = hosts.iter().max().map_or(1, |m| *m as usize + 1);
    // Ranks in order, inline up to 16 per host and 16 hosts: nothing allocated per operation.
    let on = |h: u32| -> SmallVec<[u32; 16]> { (0..hosts.len() as u32).filter(|r| hosts[*r as usize] == h).collect() };
    let local = on(hosts[me as usize]);
    let m = local.len();
    let i = local.iter().position(|r| *r == me).unwrap_or(0);
    let owners = (0..nhosts as u32).map(|h| on(h).len()).min().unwrap_or(1).max(1);
    let segs: SmallVec<[Range<usize>; 16]> =
        (0..owners as u32).map(|j| segment(buf.len(), dt.size(), owners as u32, j)).collect();
    // 1. Intra-host reduce-scatter: every local rank sends segment j to local owner j.
    for k in 1..m {
        let (to, from) = ((i + k) % m, (i + m - k) % m);
        let out = (to < owners).then(|| (local[to], segs[to].clone()));
        let in_ = (i < owners).then(|| (local[from], segs[i].clone()));
        let tag = TAG_LOCAL_REDUCE + k as u32;
        match input {
            Some(input) => {
                // Only an owner receives (segs[i] exists); its first receive meets the input.
                let land = match segs.get(i) {
                    Some(r) if k == 1 => OnArrival::ReduceOnto(&input[r.clone()], dt, op),
                    _ => OnArrival::Reduce(dt, op),
                };
                let out = out.map(|(to, r)| (to, &input[r]));
                let in_ = in_.map(|(from, r)| (from, &mut buf[r]));
                exchange(ctx, tag, out, in_, land)?;
            }
            None => exchange_within(ctx, tag, buf, out, in_, OnArrival::Reduce(dt, op))?,
        }
    }
    if let Some(input) = input.filter(|_| m == 1 && i < owners) {
        // Alone on its host: nothing arrived to combine the input with.
        buf[segs[i].clone()].copy_from_slice(&input[segs[i].clone()]);
    }
    // 2. Inter-host allreduce of segment i among its owners, one per host.
    if i < owners {
        let peers: SmallVec<[u32; 16]> = (0..nhosts as u32).map(|h| on(h)[i]).collect();
        let pos = hosts[me as usize] as usize;
        ring_among(ctx, &peers, pos, &mut buf[segs[i].clone()], dt, op)?;
    }
    // 3. Intra-host allgather from the owners.
    for k in 1..m {
        let (to, from) = ((i + k) % m, (i + m - k) % m);
        let out = (i < owners).then(|| (local[to], segs[i].clone()));
        let in_ = (from < owners).then(|| (local[from], segs[from].clone()));
        exchange_within(ctx, TAG_LOCAL_GATHER + k as u32, buf, out, in_, OnArrival::Store)?;
    }
    Ok(())
}

impl Algorithm for Hier {
    fn name(&self) -> &'static str {
        "hier"
    }

    fn reduce(&self, ctx: &Ctx<'_>, w: &mut ReduceArgs<'_>) -> Result<()> {
        match ctx.hosts() {
            Some(hosts) if w.root.is_none() && applies(Some(hosts)) => allreduce(ctx, hosts, None, w.acc, w.dt, w.op),
            // Not a layout (or an operation) hierarchy is for: the flat ring does it.
            _ => Ring.reduce(ctx, w),
        }
    }

    fn allreduce_from(&self, ctx: &Ctx<'_>, input: &[u8], w: &mut ReduceArgs<'_>) -> Result<()> {
        if input.len() != w.acc.len() {
            return Err(Error::internal(format!("hier allreduce of {} input bytes into {}", input.len(), w.acc.len())));
        }
        match ctx.hosts() {
            Some(hosts) if w.root.is_none() && applies(Some(hosts)) => {
                allreduce(ctx, hosts, Some(input), w.acc, w.dt, w.op)
            }
            _ => Ring.allreduce_from(ctx, input, w),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applies_only_to_several_hosts_with_shared_ones() {
        assert!(!applies(None));
        assert!(!applies(Some(&[0, 0, 0])), "one host");
        assert!(!applies(Some(&[0, 1, 2])), "one rank per host");
        assert!(applies(Some(&[0, 0, 1, 1])));
        assert!(applies(Some(&[0, 1, 0])), "uneven hosts");
    }
}
