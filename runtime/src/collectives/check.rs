//! The one validating entry path (NCCL's `ncclEnqueueCheck`): every operation is checked here
//! against the communicator's state and its own rules before anything is enqueued, and leaves
//! as a [`Work`] in bytes. Nothing is touched when a check fails.

use super::{Block, Blocks, Op, Ptr, Work};
use crate::error::{Error, ErrorKind, Result};
use crate::reduce::narrow;
use crate::types::DataType;

/// What validation needs to know of the communicator.
pub(crate) struct Shape {
    pub rank: u32,
    pub size: u32,
}

fn need(p: Ptr, bytes: usize, name: &str, op: &str) -> Result<()> {
    if bytes > 0 && p.is_null() {
        return Err(Error::null(format!("{op}: {name} is NULL but {bytes} bytes are to be accessed")));
    }
    Ok(())
}

fn rank_arg(value: u32, what: &str, op: &str, size: u32) -> Result<()> {
    if value >= size {
        return Err(Error::invalid(format!("{op}: {what} {value} is out of range for a communicator of {size} ranks")));
    }
    Ok(())
}

fn times(bytes: usize, n: u32, op: &str) -> Result<usize> {
    bytes
        .checked_mul(n as usize)
        .filter(|b| *b <= isize::MAX as usize)
        .ok_or_else(|| Error::invalid(format!("{op}: {bytes} bytes times {n} ranks overflows the address space")))
}

/// `[p, p+len)` as addresses, or an error when it wraps.
fn range(p: Ptr, len: usize, name: &str, op: &str) -> Result<Block> {
    let start = p.addr();
    let end = start
        .checked_add(len)
        .ok_or_else(|| Error::invalid(format!("{op}: {name} + {len} bytes wraps around memory")))?;
    Ok(start..end)
}

fn overlap(a: &Block, b: &Block) -> bool {
    !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end
}

/// Refuses overlapping `a` and `b` unless `a` starts exactly at `allowed` (the in-place form).
fn disjoint_or_in_place(a: &Block, b: &Block, allowed: Option<usize>, what: &str, op: &str) -> Result<()> {
    if overlap(a, b) && allowed != Some(a.start) {
        return Err(Error::invalid(format!(
            "{op}: {what} overlap in a way this operation does not allow{}",
            if allowed.is_some() { " (only the exact in-place position is allowed)" } else { " (no in-place form)" }
        )));
    }
    Ok(())
}

/// Byte blocks for per-rank `counts` at element `displs`, checked for overflow and mutual overlap.
fn blocks(counts: &[u64], displs: &[u64], dt: DataType, size: u32, name: &str, op: &str) -> Result<Blocks> {
    if counts.len() != size as usize || displs.len() != size as usize {
        return Err(Error::invalid(format!("{op}: {name} counts/displacements must have {size} entries")));
    }
    let es = dt.size() as u64;
    let mut out = Blocks::with_capacity(size as usize);
    for (i, (&c, &d)) in counts.iter().zip(displs).enumerate() {
        let start = d.checked_mul(es);
        let end = d.checked_add(c).and_then(|e| e.checked_mul(es));
        match (start, end) {
            (Some(s), Some(e)) if e <= isize::MAX as u64 => out.push(s as usize..e as usize),
            _ => {
                return Err(Error::invalid(format!(
                    "{op}: {name} block {i} (count {c} at {d}) overflows the address space"
                )))
            }
        }
    }
    let mut sorted: Blocks = out.iter().filter(|b| !b.is_empty()).cloned().collect();
    sorted.sort_unstable_by_key(|b| b.start);
    if sorted.windows(2).any(|w| w[0].end > w[1].start) {
        return Err(Error::invalid(format!("{op}: {name} blocks overlap each other")));
    }
    Ok(out)
}

fn uniform(bytes: usize, size: u32) -> Blocks {
    (0..size as usize).map(|i| i * bytes..(i + 1) * bytes).collect()
}

fn span(b: &[Block]) -> usize {
    b.iter().map(|b| b.end).max().unwrap_or(0)
}

/// The byte size of an allreduce's buffers, which must be non-NULL and disjoint or identical.
fn allreduce_buffers(send: Ptr, recv: Ptr, count: u64, dt: DataType, op: &str) -> Result<usize> {
    let bytes = dt.bytes(count)?;
    need(send, bytes, "sendbuf", op)?;
    need(recv, bytes, "recvbuf", op)?;
    let (s, r) = (range(send, bytes, "sendbuf", op)?, range(recv, bytes, "recvbuf", op)?);
    disjoint_or_in_place(&s, &r, Some(r.start), "sendbuf and recvbuf", op)?;
    Ok(bytes)
}

/// Compression moves `dt` data as `wire`: FP32 over FP16 or BF16. Other narrowing float pairs
/// make sense but are not implemented; anything else is a mistake.
fn compression(dt: DataType, wire: DataType, op: &str) -> Result<()> {
    let supported = "supported: dt fp32 with wire_dt fp16 or bf16";
    if dt == DataType::Fp32 && narrow::is_wire(wire) {
        Ok(())
    } else if dt.is_float() && wire.is_float() && wire.size() < dt.size() {
        Err(Error::new(
            ErrorKind::NotSupported,
            format!("{op}: {} data over a {} wire is not implemented ({supported})", dt.name(), wire.name()),
        ))
    } else {
        Err(Error::invalid(format!(
            "{op}: wire_dt {} cannot carry dt {}: compression needs a floating-point dt and a narrower floating-point wire_dt ({supported})",
            wire.name(),
            dt.name()
        )))
    }
}

/// Checks one caller buffer of `count` elements outside a collective (a tensor added to a
/// fusion bucket): its byte size must fit in memory and it must be non-NULL unless empty.
/// Returns its address range.
pub(crate) fn buffer(p: Ptr, count: u64, dt: DataType, name: &str, op: &str) -> Result<Block> {
    let bytes = dt.bytes(count).map_err(|e| e.context(op))?;
    need(p, bytes, name, op)?;
    range(p, bytes, name, op)
}

/// Checks `op` for a communicator of `shape`; `p2p_seq` yields the next point-to-point sequence
/// number toward (send) or from (recv) a peer, consumed only when the op is valid.
pub(crate) fn validate(op: &Op, shape: &Shape, p2p_seq: &mut dyn FnMut(bool, u32) -> u64) -> Result<Work> {
    let Shape { rank, size } = *shape;
    let name = op.name();
    let work = match op {
        Op::AllReduce { send, recv, count, dt, op } => {
            let bytes = allreduce_buffers(*send, *recv, *count, *dt, name)?;
            Work::Reduce { send: *send, recv: *recv, bytes, dt: *dt, op: *op, root: None }
        }
        Op::AllReduceCompressed { send, recv, count, dt, wire, op } => {
            compression(*dt, *wire, name)?;
            let bytes = allreduce_buffers(*send, *recv, *count, *dt, name)?;
            Work::ReduceCompressed { send: *send, recv: *recv, bytes, wire: *wire, op: *op }
        }
        Op::Reduce { send, recv, count, dt, op, root } => {
            rank_arg(*root, "root", name, size)?;
            let bytes = dt.bytes(*count)?;
            need(*send, bytes, "sendbuf", name)?;
            // Checked on every rank although only the root's is used: a verdict that differed
            // between ranks would start the collective on some of them only.
            need(*recv, bytes, "recvbuf", name)?;
            if rank == *root {
                let (s, r) = (range(*send, bytes, "sendbuf", name)?, range(*recv, bytes, "recvbuf", name)?);
                disjoint_or_in_place(&s, &r, Some(r.start), "sendbuf and recvbuf", name)?;
            }
            Work::Reduce { send: *send, recv: *recv, bytes, dt: *dt, op: *op, root: Some(*root) }
        }
        Op::Broadcast { buf, count, dt, root } => {
            rank_arg(*root, "root", name, size)?;
            let bytes = dt.bytes(*count)?;
            need(*buf, bytes, "buf", name)?;
            Work::Broadcast { buf: *buf, bytes, root: *root }
        }
        Op::AllGather { send, recv, send_count, dt } => {
            let bytes = dt.bytes(*send_count)?;
            let total = times(bytes, size, name)?;
            need(*send, bytes, "sendbuf", name)?;
            need(*recv, total, "recvbuf", name)?;
            let (s, r) = (range(*send, bytes, "sendbuf", name)?, range(*recv, total, "recvbuf", name)?);
            disjoint_or_in_place(&s, &r, Some(r.start + rank as usize * bytes), "sendbuf and recvbuf", name)?;
            Work::Gather { send: *send, send_bytes: bytes, recv: *recv, blocks: uniform(bytes, size), root: None }
        }
        Op::AllGatherV { send, send_count, recv, recv_counts, displs, dt } => {
            let blocks = blocks(recv_counts, displs, *dt, size, "recv", name)?;
            let bytes = dt.bytes(*send_count)?;
            if recv_counts[rank as usize] != *send_count {
                return Err(Error::invalid(format!(
                    "{name}: sendcount {send_count} differs from recvcounts[{rank}] = {}",
                    recv_counts[rank as usize]
                )));
            }
            need(*send, bytes, "sendbuf", name)?;
            need(*recv, span(&blocks), "recvbuf", name)?;
            let (s, r) = (range(*send, bytes, "sendbuf", name)?, range(*recv, span(&blocks), "recvbuf", name)?);
            disjoint_or_in_place(&s, &r, Some(r.start + blocks[rank as usize].start), "sendbuf and recvbuf", name)?;
            Work::Gather { send: *send, send_bytes: bytes, recv: *recv, blocks, root: None }
        }
        Op::ReduceScatter { send, recv, recv_count, dt, op } => {
            let bytes = dt.bytes(*recv_count)?;
            let total = times(bytes, size, name)?;
            need(*send, total, "sendbuf", name)?;
            need(*recv, bytes, "recvbuf", name)?;
            let (s, r) = (range(*send, total, "sendbuf", name)?, range(*recv, bytes, "recvbuf", name)?);
            disjoint_or_in_place(&r, &s, Some(s.start + rank as usize * bytes), "recvbuf and sendbuf", name)?;
            Work::ReduceScatter { send: *send, recv: *recv, block_bytes: bytes, dt: *dt, op: *op }
        }
        Op::Gather { send, recv, send_count, dt, root } => {
            rank_arg(*root, "root", name, size)?;
            let bytes = dt.bytes(*send_count)?;
            let total = times(bytes, size, name)?;
            need(*send, bytes, "sendbuf", name)?;
            need(*recv, total, "recvbuf", name)?;
            if rank == *root {
                let (s, r) = (range(*send, bytes, "sendbuf", name)?, range(*recv, total, "recvbuf", name)?);
                disjoint_or_in_place(&s, &r, Some(r.start + rank as usize * bytes), "sendbuf and recvbuf", name)?;
            }
            Work::Gather {
                send: *send,
                send_bytes: bytes,
                recv: *recv,
                blocks: uniform(bytes, size),
                root: Some(*root),
            }
        }
        Op::Scatter { send, recv, recv_count, dt, root } => {
            rank_arg(*root, "root", name, size)?;
            let bytes = dt.bytes(*recv_count)?;
            let total = times(bytes, size, name)?;
            need(*recv, bytes, "recvbuf", name)?;
            need(*send, total, "sendbuf", name)?;
            if rank == *root {
                let (s, r) = (range(*send, total, "sendbuf", name)?, range(*recv, bytes, "recvbuf", name)?);
                disjoint_or_in_place(&r, &s, Some(s.start + rank as usize * bytes), "recvbuf and sendbuf", name)?;
            }
            Work::Scatter { send: *send, blocks: uniform(bytes, size), recv: *recv, recv_bytes: bytes, root: *root }
        }
        Op::AllToAll { send, recv, count_per_rank, dt } => {
            let bytes = dt.bytes(*count_per_rank)?;
            let total = times(bytes, size, name)?;
            need(*send, total, "sendbuf", name)?;
            need(*recv, total, "recvbuf", name)?;
            let (s, r) = (range(*send, total, "sendbuf", name)?, range(*recv, total, "recvbuf", name)?);
            disjoint_or_in_place(&s, &r, None, "sendbuf and recvbuf", name)?;
            let b = uniform(bytes, size);
            Work::AllToAll { send: *send, send_blocks: b.clone(), recv: *recv, recv_blocks: b }
        }
        Op::AllToAllV { send, send_counts, send_displs, recv, recv_counts, recv_displs, dt } => {
            let sb = blocks(send_counts, send_displs, *dt, size, "send", name)?;
            let rb = blocks(recv_counts, recv_displs, *dt, size, "recv", name)?;
            // A rank's block to itself is copied locally: the two counts must agree here, since
            // no peer's length check will catch it (found by fuzz/fuzz_targets/capi.rs).
            let me = rank as usize;
            if send_counts[me] != recv_counts[me] {
                return Err(Error::invalid(format!(
                    "{name}: sendcounts[{rank}] = {} differs from recvcounts[{rank}] = {} (this rank's block to itself)",
                    send_counts[me], recv_counts[me]
                )));
            }
            need(*send, span(&sb), "sendbuf", name)?;
            need(*recv, span(&rb), "recvbuf", name)?;
            let (s, r) = (range(*send, span(&sb), "sendbuf", name)?, range(*recv, span(&rb), "recvbuf", name)?);
            disjoint_or_in_place(&s, &r, None, "sendbuf and recvbuf", name)?;
            Work::AllToAll { send: *send, send_blocks: sb, recv: *recv, recv_blocks: rb }
        }
        Op::Send { buf, count, dt, peer } | Op::Recv { buf, count, dt, peer } => {
            rank_arg(*peer, "peer", name, size)?;
            let bytes = dt.bytes(*count)?;
            need(*buf, bytes, "buf", name)?;
            // An empty message still takes its number and goes as an empty frame: its receive
            // checks it, and the pair's later messages keep their pairing.
            let is_send = matches!(op, Op::Send { .. });
            let seq = p2p_seq(is_send, *peer);
            if is_send {
                Work::Send { buf: *buf, bytes, peer: *peer, seq }
            } else {
                Work::Recv { buf: *buf, bytes, peer: *peer, seq }
            }
        }
        Op::Barrier => Work::Barrier,
    };
    Ok(if moves_nothing(&work) { Work::Nothing } else { work })
}

/// True when every rank would move zero bytes (count 0), so no message is needed.
fn moves_nothing(w: &Work) -> bool {
    match w {
        Work::Reduce { bytes, .. } | Work::ReduceCompressed { bytes, .. } | Work::Broadcast { bytes, .. } => {
            *bytes == 0
        }
        Work::ReduceScatter { block_bytes, .. } => *block_bytes == 0,
        Work::Gather { blocks, .. } | Work::Scatter { blocks, .. } => blocks.iter().all(|b| b.is_empty()),
        Work::AllToAll { send_blocks, recv_blocks, .. } => {
            send_blocks.iter().all(|b| b.is_empty()) && recv_blocks.iter().all(|b| b.is_empty())
        }
        Work::Send { .. } | Work::Recv { .. } | Work::Barrier | Work::Nothing => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::types::ReduceOp;

    fn p(addr: usize) -> Ptr {
        Ptr(addr as *mut u8)
    }

    fn compressed(dt: DataType, wire: DataType, send: Ptr, recv: Ptr) -> Op {
        Op::AllReduceCompressed { send, recv, count: 4, dt, wire, op: ReduceOp::Sum }
    }

    fn check(op: Op, rank: u32, size: u32) -> std::result::Result<Work, ErrorKind> {
        validate(&op, &Shape { rank, size }, &mut |_, _| 0).map_err(|e| e.kind())
    }

    #[test]
    fn table_of_refusals() {
        use ErrorKind::*;
        let dt = DataType::Fp32;
        let cases: Vec<(Op, u32, ErrorKind)> = vec![
            (Op::AllReduce { send: Ptr::null(), recv: p(4096), count: 4, dt, op: ReduceOp::Sum }, 0, NullPointer),
            (Op::AllReduce { send: p(4096), recv: p(4100), count: 4, dt, op: ReduceOp::Sum }, 0, InvalidArgument),
            (
                Op::AllReduce { send: p(4096), recv: p(8192), count: u64::MAX / 2, dt, op: ReduceOp::Sum },
                0,
                InvalidArgument,
            ),
            (Op::Broadcast { buf: p(4096), count: 1, dt, root: 4 }, 0, InvalidArgument),
            (compressed(DataType::Fp32, DataType::Fp32, p(4096), p(8192)), 0, InvalidArgument),
            (compressed(DataType::Int32, DataType::Int16, p(4096), p(8192)), 0, InvalidArgument),
            (compressed(DataType::Fp16, DataType::Fp32, p(4096), p(8192)), 0, InvalidArgument),
            (compressed(DataType::Fp64, DataType::Bf16, p(4096), p(8192)), 0, NotSupported),
            (compressed(dt, DataType::Bf16, Ptr::null(), p(8192)), 0, NullPointer),
            (compressed(dt, DataType::Fp16, p(4096), p(4098)), 0, InvalidArgument),
            (Op::Reduce { send: p(4096), recv: Ptr::null(), count: 1, dt, op: ReduceOp::Max, root: 0 }, 0, NullPointer),
            (Op::Reduce { send: p(4096), recv: Ptr::null(), count: 1, dt, op: ReduceOp::Max, root: 0 }, 1, NullPointer),
            (Op::Scatter { send: Ptr::null(), recv: p(4096), recv_count: 1, dt, root: 0 }, 2, NullPointer),
            (Op::AllGather { send: p(4100), recv: p(4096), send_count: 1, dt }, 0, InvalidArgument),
            (Op::AllToAll { send: p(4096), recv: p(4096), count_per_rank: 1, dt }, 0, InvalidArgument),
            (Op::Send { buf: p(4096), count: 1, dt, peer: 9 }, 0, InvalidArgument),
            (
                Op::AllGatherV {
                    send: p(4096),
                    send_count: 2,
                    recv: p(8192),
                    recv_counts: vec![1; 4],
                    displs: vec![0, 1, 2, 3],
                    dt,
                },
                0,
                InvalidArgument,
            ),
            (
                Op::AllGatherV {
                    send: p(4096),
                    send_count: 2,
                    recv: p(8192),
                    recv_counts: vec![2; 4],
                    displs: vec![0, 1, 4, 6],
                    dt,
                },
                0,
                InvalidArgument,
            ),
        ];
        for (i, (op, rank, want)) in cases.into_iter().enumerate() {
            assert_eq!(check(op.clone(), rank, 4).err(), Some(want), "case {i}: {op:?}");
        }
    }

    #[test]
    fn alltoallv_block_to_self_must_match() {
        // Regression (fuzzing): a mismatch here made the local copy panic.
        let op = |sc: u64, rc: u64| Op::AllToAllV {
            send: p(4096),
            send_counts: vec![sc, 1],
            send_displs: vec![0, 64],
            recv: p(1 << 20),
            recv_counts: vec![rc, 1],
            recv_displs: vec![0, 64],
            dt: DataType::Fp32,
        };
        assert_eq!(check(op(5, 3), 0, 2).err(), Some(ErrorKind::InvalidArgument));
        assert_eq!(check(op(0, 1), 0, 2).err(), Some(ErrorKind::InvalidArgument));
        assert!(check(op(5, 5), 0, 2).is_ok());
    }

    #[test]
    fn in_place_forms_and_count_zero_are_accepted() {
        let dt = DataType::Int32;
        assert!(check(Op::AllReduce { send: p(4096), recv: p(4096), count: 8, dt, op: ReduceOp::Sum }, 0, 4).is_ok());
        assert!(check(Op::AllGather { send: p(4096 + 2 * 8), recv: p(4096), send_count: 2, dt }, 2, 4).is_ok());
        assert!(check(
            Op::ReduceScatter { send: p(4096), recv: p(4096 + 3 * 8), recv_count: 2, dt, op: ReduceOp::Sum },
            3,
            4
        )
        .is_ok());
        let w = check(Op::AllReduce { send: Ptr::null(), recv: Ptr::null(), count: 0, dt, op: ReduceOp::Sum }, 0, 4);
        assert!(matches!(w, Ok(Work::Nothing)));
        assert!(check(compressed(DataType::Fp32, DataType::Bf16, p(4096), p(4096)), 1, 4).is_ok());
        let empty = Op::AllReduceCompressed {
            send: Ptr::null(),
            recv: Ptr::null(),
            count: 0,
            dt: DataType::Fp32,
            wire: DataType::Fp16,
            op: ReduceOp::Avg,
        };
        let w = check(empty, 0, 4);
        assert!(matches!(w, Ok(Work::Nothing)));
    }
}
