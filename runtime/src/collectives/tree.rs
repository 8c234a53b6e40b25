//! Binomial tree rooted anywhere, for broadcast and reduce, and allreduce as a reduce to rank 0
//! followed by a broadcast from it. Ranks are renumbered relative to the root; a rank's parent
//! clears its lowest set bit. Chunks flow down (broadcast) or up (reduce) the tree one after
//! another, so depth costs latency once, not per chunk.
//! Bytes on the wire: each non-root receives (broadcast) or sends (reduce) the buffer once;
//! allreduce does both.

use smallvec::SmallVec;

use super::{Algorithm, Ctx, ReduceArgs};
use crate::error::Result;
use crate::transport::pool;
use crate::types::{DataType, ReduceOp};

pub(crate) struct BinomialTree;

/// Children of one rank: at most one per bit of a rank, kept inline.
type Children = SmallVec<[u32; 32]>;

/// Parent and children (in communicator ranks) of `rank` in the tree rooted at `root`.
pub(super) fn family(rank: u32, root: u32, n: u32) -> (Option<u32>, Children) {
    let vr = (rank + n - root) % n;
    let real = |v: u32| (v + root) % n;
    let parent = (vr != 0).then(|| real(vr & (vr - 1)));
    let low = if vr == 0 { n.next_power_of_two() } else { vr & vr.wrapping_neg() };
    let mut children = Children::new();
    let mut mask = 1;
    while mask < low && vr + mask < n {
        children.push(real(vr + mask));
        mask <<= 1;
    }
    (parent, children)
}

impl Algorithm for BinomialTree {
    fn name(&self) -> &'static str {
        "tree"
    }

    fn broadcast(&self, ctx: &Ctx<'_>, buf: &mut [u8], root: u32) -> Result<()> {
        broadcast(ctx, buf, root, 0)
    }

    /// Reduce to `w.root`, or (allreduce) reduce to rank 0 and broadcast the result.
    fn reduce(&self, ctx: &Ctx<'_>, w: &mut ReduceArgs<'_>) -> Result<()> {
        let root = w.root.unwrap_or(0);
        let (parent, children) = family(ctx.rank(), root, ctx.size());
        for r in ctx.chunks(w.acc.len()) {
            for &c in &children {
                ctx.recv_reduce(c, 0, &mut w.acc[r.clone()], w.dt, w.op)?;
            }
            if let Some(p) = parent {
                ctx.send(p, 0, &w.acc[r.clone()])?;
            }
        }
        if w.root.is_none() {
            broadcast(ctx, w.acc, root, 1)?;
        }
        Ok(())
    }

    /// Out of place: the reduce combines the input into the output as it goes (see
    /// `reduce_from`) and the broadcast writes every byte of it, so the input is never copied.
    fn allreduce_from(&self, ctx: &Ctx<'_>, input: &[u8], w: &mut ReduceArgs<'_>) -> Result<()> {
        self.reduce_from(ctx, input, Some(&mut *w.acc), w.dt, w.op, 0)?;
        broadcast(ctx, w.acc, 0, 1)
    }

    /// Reduce straight from the input, chunk by chunk: a leaf sends its input as it is; a rank
    /// with children combines the first child's chunk with its input's (`dst = input op
    /// child`, the operand order of `reduce`) into its output when it has one (the root's, or
    /// any rank's in an allreduce), or into one chunk-sized buffer, then the other children's,
    /// and sends it on.
    fn reduce_from(
        &self,
        ctx: &Ctx<'_>,
        input: &[u8],
        mut out: Option<&mut [u8]>,
        dt: DataType,
        op: ReduceOp,
        root: u32,
    ) -> Result<()> {
        let (parent, children) = family(ctx.rank(), root, ctx.size());
        let mut work = Vec::new();
        if out.is_none() && !children.is_empty() {
            let len = ctx.chunk().min(input.len());
            work = pool::take(len);
            work.resize(len, 0);
        }
        for r in ctx.chunks(input.len()) {
            let chunk = &input[r.clone()];
            let Some((&first, rest)) = children.split_first() else {
                match (parent, out.as_deref_mut()) {
                    (Some(p), _) => ctx.send(p, 0, chunk)?,
                    // The root alone (one rank).
                    (None, Some(out)) => out[r].copy_from_slice(chunk),
                    (None, None) => {}
                }
                continue;
            };
            let acc = match out.as_deref_mut() {
                Some(out) => &mut out[r],
                None => &mut work[..chunk.len()],
            };
            ctx.recv_reduce_onto(first, 0, acc, chunk, dt, op)?;
            for &c in rest {
                ctx.recv_reduce(c, 0, acc, dt, op)?;
            }
            if let Some(p) = parent {
                ctx.send(p, 0, acc)?;
            }
        }
        pool::give(work);
        Ok(())
    }
}

fn broadcast(ctx: &Ctx<'_>, buf: &mut [u8], root: u32, tag: u32) -> Result<()> {
    let (parent, children) = family(ctx.rank(), root, ctx.size());
    for r in ctx.chunks(buf.len()) {
        if let Some(p) = parent {
            ctx.recv_into(p, tag, &mut buf[r.clone()])?;
        }
        // Farthest subtree first: it has the most forwarding left to do.
        for &c in children.iter().rev() {
            ctx.send(c, tag, &buf[r.clone()])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_has_one_parent_and_the_tree_spans_all() {
        for n in 1..=9u32 {
            for root in 0..n {
                let mut seen_as_child = vec![0; n as usize];
                for r in 0..n {
                    let (parent, children) = family(r, root, n);
                    assert_eq!(parent.is_none(), r == root, "n={n} root={root} r={r}");
                    for c in children {
                        assert_eq!(family(c, root, n).0, Some(r), "n={n} root={root} child {c} of {r}");
                        seen_as_child[c as usize] += 1;
                    }
                }
                for r in 0..n {
                    assert_eq!(seen_as_child[r as usize], u32::from(r != root), "n={n} root={root} r={r}");
                }
            }
        }
    }
}
