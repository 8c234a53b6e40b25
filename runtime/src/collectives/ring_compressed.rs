//! Compressed allreduce: the ring allreduce of `ring.rs` over an f32 working buffer whose chunks
//! travel as FP16 or BF16. Each reduce-scatter step widens the incoming chunk to f32 and
//! accumulates in f32; the owner of each fully reduced segment rounds it through the wire type
//! before the allgather phase, so that every rank ends with the same bits (a wire value widens
//! and narrows back exactly). Half the bytes of the plain ring; error bound in docs/algorithms.md.

use std::borrow::Cow;

use super::ring::{self, Codec};
use super::{Algorithm, CompressedArgs, Ctx};
use crate::error::Result;
use crate::reduce::narrow;
use crate::types::{DataType, ReduceOp};

pub(crate) struct CompressedRing;

/// f32 in memory, `0` (FP16 or BF16) on the wire.
struct Narrow(DataType);

impl Codec for Narrow {
    fn esize(&self) -> usize {
        4
    }
    fn wire_len(&self, len: usize) -> usize {
        len / 2
    }
    fn encode<'a>(&self, chunk: &'a [u8]) -> Cow<'a, [u8]> {
        Cow::Owned(narrow::narrow(chunk, self.0))
    }
    fn decode(&self, dst: &mut [u8], wire: &[u8], op: Option<ReduceOp>) {
        match op {
            Some(op) => narrow::widen_reduce(dst, wire, self.0, op),
            None => narrow::widen(wire, self.0, dst),
        }
    }
    fn round_like_wire(&self, segment: &mut [u8]) {
        narrow::round_through(segment, self.0);
    }
}

impl Algorithm for CompressedRing {
    fn name(&self) -> &'static str {
        "ring_compressed"
    }

    fn allreduce_compressed(&self, ctx: &Ctx<'_>, w: &mut CompressedArgs<'_>) -> Result<()> {
        ring::allreduce(ctx, w.acc, None, &Narrow(w.wire), w.op)
    }
}
