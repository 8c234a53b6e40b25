//! Collective operations. [`Op`] is what a caller asks for (counts in elements, raw buffers);
//! [`check::validate`] turns it into a [`Work`] (byte ranges, every argument checked) on the one
//! entry path; [`select::select`] picks an [`Algorithm`]; [`execute`] runs it through a [`Ctx`].

pub(crate) mod board;
pub(crate) mod check;
mod ctx;
mod dissemination;
pub(crate) mod fingerprint;
mod hier;
mod linear;
mod p2p;
mod pairwise;
mod rhd;
mod ring;
mod ring_compressed;
pub mod select;
pub(crate) mod team;
mod traced;
mod tree;
pub(crate) mod verify;

use std::ops::Range;

pub(crate) use ctx::Ctx;

use crate::error::{Error, ErrorKind, Result};
use crate::reduce;
use crate::types::{DataType, ReduceOp};

/// A caller's buffer address. Whoever builds an [`Op`] from one promises, through the `unsafe`
/// of [`Communicator::submit`](crate::Communicator::submit), that it stays valid until the
/// operation completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ptr(pub *mut u8);

// SAFETY: a Ptr is an address handed over by the caller together with the promise above; the
// runtime only dereferences it while executing the operation it belongs to.
unsafe impl Send for Ptr {}
// SAFETY: as above; shared references never dereference it concurrently with a writer.
unsafe impl Sync for Ptr {}

impl Ptr {
    pub fn null() -> Ptr {
        Ptr(std::ptr::null_mut())
    }
    pub fn from_const<T>(p: *const T) -> Ptr {
        Ptr(p as *mut u8)
    }
    pub fn from_mut<T>(p: *mut T) -> Ptr {
        Ptr(p.cast())
    }
    pub fn is_null(self) -> bool {
        self.0.is_null()
    }
    fn addr(self) -> usize {
        self.0 as usize
    }
}

/// What a caller asks for, with the API's argument names. Counts are elements.
#[derive(Debug, Clone)]
pub enum Op {
    AllReduce {
        send: Ptr,
        recv: Ptr,
        count: u64,
        dt: DataType,
        op: ReduceOp,
    },
    /// Allreduce of `dt` data that travels on the wire as `wire` (FP32 over FP16 or BF16).
    AllReduceCompressed {
        send: Ptr,
        recv: Ptr,
        count: u64,
        dt: DataType,
        wire: DataType,
        op: ReduceOp,
    },
    Broadcast {
        buf: Ptr,
        count: u64,
        dt: DataType,
        root: u32,
    },
    Reduce {
        send: Ptr,
        recv: Ptr,
        count: u64,
        dt: DataType,
        op: ReduceOp,
        root: u32,
    },
    AllGather {
        send: Ptr,
        recv: Ptr,
        send_count: u64,
        dt: DataType,
    },
    AllGatherV {
        send: Ptr,
        send_count: u64,
        recv: Ptr,
        recv_counts: Vec<u64>,
        displs: Vec<u64>,
        dt: DataType,
    },
    ReduceScatter {
        send: Ptr,
        recv: Ptr,
        recv_count: u64,
        dt: DataType,
        op: ReduceOp,
    },
    Gather {
        send: Ptr,
        recv: Ptr,
        send_count: u64,
        dt: DataType,
        root: u32,
    },
    Scatter {
        send: Ptr,
        recv: Ptr,
        recv_count: u64,
        dt: DataType,
        root: u32,
    },
    AllToAll {
        send: Ptr,
        recv: Ptr,
        count_per_rank: u64,
        dt: DataType,
    },
    AllToAllV {
        send: Ptr,
        send_counts: Vec<u64>,
        send_displs: Vec<u64>,
        recv: Ptr,
        recv_counts: Vec<u64>,
        recv_displs: Vec<u64>,
        dt: DataType,
    },
    Send {
        buf: Ptr,
        count: u64,
        dt: DataType,
        peer: u32,
    },
    Recv {
        buf: Ptr,
        count: u64,
        dt: DataType,
        peer: u32,
    },
    Barrier,
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::AllReduce { .. } => "allreduce",
            Op::AllReduceCompressed { .. } => "allreduce_compressed",
            Op::Broadcast { .. } => "broadcast",
            Op::Reduce { .. } => "reduce",
            Op::AllGather { .. } => "allgather",
            Op::AllGatherV { .. } => "allgatherv",
            Op::ReduceScatter { .. } => "reduce_scatter",
            Op::Gather { .. } => "gather",
            Op::Scatter { .. } => "scatter",
            Op::AllToAll { .. } => "alltoall",
            Op::AllToAllV { .. } => "alltoallv",
            Op::Send { .. } => "send",
            Op::Recv { .. } => "recv",
            Op::Barrier => "barrier",
        }
    }
}

/// A byte range of a caller's buffer.
pub(crate) type Block = Range<usize>;
/// One block per rank; inline up to 8 ranks, so that validating a collective allocates nothing
/// there.
pub(crate) type Blocks = smallvec::SmallVec<[Block; 8]>;

/// A checked operation in bytes, ready to run.
#[derive(Debug, Clone)]
pub(crate) enum Work {
    /// Allreduce, or reduce to `root` (`recv` is then used on the root only).
    Reduce {
        send: Ptr,
        recv: Ptr,
        bytes: usize,
        dt: DataType,
        op: ReduceOp,
        root: Option<u32>,
    },
    /// Allreduce of f32 data carried on the wire as `wire`.
    ReduceCompressed {
        send: Ptr,
        recv: Ptr,
        bytes: usize,
        wire: DataType,
        op: ReduceOp,
    },
    Broadcast {
        buf: Ptr,
        bytes: usize,
        root: u32,
    },
    /// Allgather(v), or gather to `root`: rank i's `send_bytes` land at `blocks[i]` of `recv`.
    Gather {
        send: Ptr,
        send_bytes: usize,
        recv: Ptr,
        blocks: Blocks,
        root: Option<u32>,
    },
    ReduceScatter {
        send: Ptr,
        recv: Ptr,
        block_bytes: usize,
        dt: DataType,
        op: ReduceOp,
    },
    Scatter {
        send: Ptr,
        blocks: Blocks,
        recv: Ptr,
        recv_bytes: usize,
        root: u32,
    },
    AllToAll {
        send: Ptr,
        send_blocks: Blocks,
        recv: Ptr,
        recv_blocks: Blocks,
    },
    Send {
        buf: Ptr,
        bytes: usize,
        peer: u32,
        seq: u64,
    },
    Recv {
        buf: Ptr,
        bytes: usize,
        peer: u32,
        seq: u64,
    },
    Barrier,
    /// Nothing to move (count 0).
    Nothing,
}

/// The collectives an algorithm may implement. Each defaults to "not this algorithm's".
pub(crate) trait Algorithm: Sync {
    fn name(&self) -> &'static str;

    fn reduce(&self, _ctx: &Ctx<'_>, _w: &mut ReduceArgs<'_>) -> Result<()> {
        Err(unsupported(self.name(), "reduce"))
    }
    /// Allreduce (`w.root` is `None`) of `input` into `w.acc`, whose content on entry does not
    /// matter (out of place). Algorithms that can combine the input as it arrives skip the copy
    /// into `acc`, a whole pass over memory for large buffers.
    fn allreduce_from(&self, ctx: &Ctx<'_>, input: &[u8], w: &mut ReduceArgs<'_>) -> Result<()> {
        w.acc.copy_from_slice(input);
        self.reduce(ctx, w)
    }
    /// Reduce of `input` to `root`, whose result lands in `out` (given on the root, disjoint
    /// from `input`; elsewhere, given, it is working space whose content ends undefined). By default through a working copy of the input, which `reduce`
    /// combines in place; algorithms that can combine the input as it goes skip the copy (and,
    /// on the other ranks, a buffer of the input's size).
    fn reduce_from(
        &self,
        ctx: &Ctx<'_>,
        input: &[u8],
        out: Option<&mut [u8]>,
        dt: DataType,
        op: ReduceOp,
        root: u32,
    ) -> Result<()> {
        let mut scratch = Vec::new();
        let acc = match out {
            Some(out) => {
                out.copy_from_slice(input);
                out
            }
            None => {
                scratch.extend_from_slice(input);
                &mut scratch[..]
            }
        };
        self.reduce(ctx, &mut ReduceArgs { acc, dt, op, root: Some(root) })
    }
    fn allreduce_compressed(&self, _ctx: &Ctx<'_>, _w: &mut CompressedArgs<'_>) -> Result<()> {
        Err(unsupported(self.name(), "allreduce_compressed"))
    }
    fn broadcast(&self, _ctx: &Ctx<'_>, _buf: &mut [u8], _root: u32) -> Result<()> {
        Err(unsupported(self.name(), "broadcast"))
    }
    fn gather(&self, _ctx: &Ctx<'_>, _w: &mut GatherArgs<'_>) -> Result<()> {
        Err(unsupported(self.name(), "gather"))
    }
    /// Whether `gather` itself copies the own block of a rank that keeps the result when it is
    /// out of place (`GatherArgs::own` not empty), rather than finding it in `recv` already.
    fn gather_copies_own_block(&self) -> bool {
        false
    }
    fn reduce_scatter(&self, _ctx: &Ctx<'_>, _w: &mut ReduceScatterArgs<'_>) -> Result<()> {
        Err(unsupported(self.name(), "reduce_scatter"))
    }
    fn scatter(&self, _ctx: &Ctx<'_>, _w: &mut ScatterArgs<'_>) -> Result<()> {
        Err(unsupported(self.name(), "scatter"))
    }
    fn all_to_all(&self, _ctx: &Ctx<'_>, _w: &mut AllToAllArgs<'_>) -> Result<()> {
        Err(unsupported(self.name(), "alltoall"))
    }
    fn barrier(&self, _ctx: &Ctx<'_>) -> Result<()> {
        Err(unsupported(self.name(), "barrier"))
    }
}

pub(super) fn unsupported(algo: &str, op: &str) -> Error {
    Error::new(ErrorKind::Internal, format!("algorithm {algo} does not implement {op}"))
}

/// Reduce or allreduce over `acc`, which already holds this rank's contribution; the result
/// must end in `acc` on every rank (`root == None`) or on the root.
pub(crate) struct ReduceArgs<'a> {
    pub acc: &'a mut [u8],
    pub dt: DataType,
    pub op: ReduceOp,
    pub root: Option<u32>,
}

/// Compressed allreduce over the f32 elements of `acc`, which holds this rank's contribution on
/// entry and the result on return.
pub(crate) struct CompressedArgs<'a> {
    pub acc: &'a mut [u8],
    pub wire: DataType,
    pub op: ReduceOp,
}

/// Allgather(v) or gather into `recv` (whose own block is already filled); `recv` is empty on
/// non-roots of a gather, which send `own` instead.
pub(crate) struct GatherArgs<'a> {
    /// This rank's block: the input of a non-root; of a rank that keeps the result, its input
    /// when that is not in place (its copy is in `recv` already unless the algorithm
    /// [copies it itself](Algorithm::gather_copies_own_block)), else empty.
    pub own: &'a [u8],
    pub recv: &'a mut [u8],
    pub blocks: &'a [Block],
    pub root: Option<u32>,
}

/// Reduce-scatter: `input` holds every rank's block of `block_bytes`; the reduced own block goes
/// to `out`.
pub(crate) struct ReduceScatterArgs<'a> {
    pub input: &'a [u8],
    pub out: &'a mut [u8],
    pub block_bytes: usize,
    pub dt: DataType,
    pub op: ReduceOp,
}

pub(crate) struct ScatterArgs<'a> {
    pub send: &'a [u8],
    pub blocks: &'a [Block],
    /// This rank's block; empty on a root whose block already lies in `send` (in place).
    pub recv: &'a mut [u8],
    pub root: u32,
}

pub(crate) struct AllToAllArgs<'a> {
    pub send: &'a [u8],
    pub send_blocks: &'a [Block],
    pub recv: &'a mut [u8],
    pub recv_blocks: &'a [Block],
}

/// Bytes `[0, len)` at `p` as a shared slice (empty for len 0, whatever `p`).
///
/// # Safety
/// `p` must be valid for reads of `len` bytes for `'a`, with no writer through another alias.
unsafe fn view<'a>(p: Ptr, len: usize) -> &'a [u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts(p.0, len) }
}

/// # Safety
/// `p` must be valid for reads and writes of `len` bytes for `'a`, and not otherwise aliased.
unsafe fn view_mut<'a>(p: Ptr, len: usize) -> &'a mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts_mut(p.0, len) }
}

/// Copies `len` bytes from `src` to `dst`, which may overlap (memmove), or nothing if equal.
///
/// # Safety
/// Both must be valid for `len` bytes.
unsafe fn copy(src: Ptr, dst: Ptr, len: usize) {
    if len > 0 && src != dst {
        // SAFETY: guaranteed by the caller; `copy` tolerates overlap.
        unsafe { std::ptr::copy(src.0, dst.0, len) }
    }
}

fn span(blocks: &[Block]) -> usize {
    blocks.iter().map(|b| b.end).max().unwrap_or(0)
}

/// Runs a checked operation on this thread, recording it when tracing is on.
///
/// # Safety
/// Every pointer in `work` must be valid as described by the `Op` it came from, until return.
pub(crate) unsafe fn execute(ctx: &Ctx<'_>, work: &Work) -> Result<()> {
    // Settled once the board is made: every later call keeps its context (no copy).
    let settled;
    let ctx = match board::unsettled(ctx) {
        true => {
            settled = board::settle(ctx)?;
            &settled
        }
        false => ctx,
    };
    let plan = select::select(work, ctx)?;
    let (algo, ctx) = (plan.algo, &ctx.with_chunk(plan.chunk));
    // Checked here first: making a disabled span still costs a call and a copy per operation.
    let _span = tracing::enabled!(tracing::Level::DEBUG).then(|| ctx.span(algo.name()).entered());
    let t = crate::trace::start();
    let when = verify::needed(work, ctx.turn(), ctx.fingerprint(), ctx.size(), ctx.rank());
    // Before any data moves: ranks whose calls differ in where the data goes (the root, say)
    // could otherwise all wait for data that nobody sends.
    let mut r = verify::open(ctx, when);
    if r.is_ok() {
        // SAFETY: the caller's promise, passed on.
        r = unsafe { run(ctx, work, algo) };
    }
    if r.is_ok() {
        r = verify::close(ctx, when);
    }
    if t.is_on() {
        traced::record(t, ctx, work, algo.name(), &r);
    }
    r
}

/// # Safety
/// As [`execute`].
unsafe fn run(ctx: &Ctx<'_>, work: &Work, algo: &dyn Algorithm) -> Result<()> {
    let n = ctx.size();
    let me = ctx.rank();
    // SAFETY (all blocks below): the caller guarantees the buffers; validation guaranteed that
    // the send and receive ranges we slice simultaneously do not overlap, and in-place forms are
    // handled by copying first and then using a single mutable view.
    match work {
        // A call of nothing on the board still posts its fingerprint, to be checked.
        Work::Nothing if ctx.turn().is_some() => {
            algo.reduce(ctx, &mut ReduceArgs { acc: &mut [], dt: DataType::Uint8, op: ReduceOp::Sum, root: None })
        }
        Work::Nothing => Ok(()),
        Work::Reduce { send, recv, bytes, dt, op, root } => {
            let owns_result = root.is_none_or(|r| r == me);
            if root.is_none() && send != recv {
                // Out of place: validation found the buffers disjoint.
                // SAFETY: buffers per the contract stated above the match.
                let (input, acc) = unsafe { (view(*send, *bytes), view_mut(*recv, *bytes)) };
                let mut args = ReduceArgs { acc, dt: *dt, op: *op, root: None };
                algo.allreduce_from(ctx, input, &mut args)?;
                if *op == ReduceOp::Avg {
                    reduce::finish_avg(args.acc, *dt, n);
                }
                return Ok(());
            }
            if let Some(root) = root.filter(|_| send != recv || !owns_result) {
                // A rooted reduce, not in place: a rank that is not the root has no output
                // (its `recv` is not touched).
                // SAFETY: buffers per the contract stated above the match; validation found
                // them disjoint on the root.
                let input = unsafe { view(*send, *bytes) };
                // SAFETY: as above.
                let mut out = owns_result.then(|| unsafe { view_mut(*recv, *bytes) });
                algo.reduce_from(ctx, input, out.as_deref_mut(), *dt, *op, root)?;
                if let Some(out) = out.filter(|_| *op == ReduceOp::Avg) {
                    reduce::finish_avg(out, *dt, n);
                }
                return Ok(());
            }
            // In place, on a rank that keeps the result: `recv` is the input.
            // SAFETY: buffers per the contract stated above the match.
            let acc = unsafe { view_mut(*recv, *bytes) };
            let mut args = ReduceArgs { acc, dt: *dt, op: *op, root: *root };
            algo.reduce(ctx, &mut args)?;
            if *op == ReduceOp::Avg {
                reduce::finish_avg(args.acc, *dt, n);
            }
            Ok(())
        }
        Work::ReduceCompressed { send, recv, bytes, wire, op } => {
            // SAFETY: buffers per the contract stated above the match.
            unsafe { copy(*send, *recv, *bytes) };
            // SAFETY: buffers per the contract stated above the match.
            let acc = unsafe { view_mut(*recv, *bytes) };
            let mut args = CompressedArgs { acc, wire: *wire, op: *op };
            algo.allreduce_compressed(ctx, &mut args)?;
            if *op == ReduceOp::Avg {
                reduce::finish_avg(args.acc, DataType::Fp32, n);
            }
            Ok(())
        }
        // SAFETY: buffers per the contract stated above the match.
        Work::Broadcast { buf, bytes, root } => algo.broadcast(ctx, unsafe { view_mut(*buf, *bytes) }, *root),
        Work::Gather { send, send_bytes, recv, blocks, root } => {
            let owns_result = root.is_none_or(|r| r == me);
            let (own, recv): (&[u8], &mut [u8]) = if owns_result {
                let own_at = Ptr(recv.0.wrapping_add(blocks[me as usize].start));
                if !algo.gather_copies_own_block() {
                    // SAFETY: buffers per the contract stated above the match.
                    unsafe { copy(*send, own_at, *send_bytes) };
                }
                // SAFETY: buffers per the contract stated above the match.
                let recv = unsafe { view_mut(*recv, span(blocks)) };
                // Out of place the input goes on as well: peers read it from there rather than
                // from the block just written (lines another core must hand over: a 64 KiB
                // allgather of 2 ranks took 19.7 us read from the output, 9 from the input).
                // SAFETY: out of place the input overlaps no output (validated); in place it
                // is the own block, and no view of it is made.
                let own = if *send == own_at { &[][..] } else { unsafe { view(*send, *send_bytes) } };
                (own, recv)
            } else {
                // SAFETY: buffers per the contract stated above the match.
                (unsafe { view(*send, *send_bytes) }, &mut [])
            };
            algo.gather(ctx, &mut GatherArgs { own, recv, blocks, root: *root })
        }
        Work::ReduceScatter { send, recv, block_bytes, dt, op } => {
            let total = block_bytes * n as usize;
            // In place, the output is this rank's block of the input (validation allows no
            // other overlap): the result is made in a private block and copied there after.
            let in_place = (send.0 as usize..send.0 as usize + total).contains(&(recv.0 as usize));
            let mut private = if in_place { crate::transport::pool::take(*block_bytes) } else { Vec::new() };
            {
                // SAFETY: buffers per the contract stated above the match; out of place they
                // are disjoint, in place only `input` views the caller's memory.
                let input = unsafe { view(*send, total) };
                let out = if in_place {
                    private.resize(*block_bytes, 0);
                    &mut private[..]
                } else {
                    // SAFETY: as above.
                    unsafe { view_mut(*recv, *block_bytes) }
                };
                let mut args = ReduceScatterArgs { input, out, block_bytes: *block_bytes, dt: *dt, op: *op };
                algo.reduce_scatter(ctx, &mut args)?;
                if *op == ReduceOp::Avg {
                    reduce::finish_avg(args.out, *dt, n);
                }
            }
            if in_place {
                // SAFETY: as above; `private` holds `block_bytes` bytes.
                unsafe { copy(Ptr(private.as_mut_ptr()), *recv, *block_bytes) };
                crate::transport::pool::give(private);
            }
            Ok(())
        }
        Work::Scatter { send, blocks, recv, recv_bytes, root } => {
            let is_root = *root == me;
            // In place the root's output is its own block of the input (validation allows no
            // other overlap): no view of it is made beside the input's.
            let in_place = is_root && recv.0 == send.0.wrapping_add(blocks[me as usize].start);
            // SAFETY: buffers per the contract stated above the match.
            let send = if is_root { unsafe { view(*send, span(blocks)) } } else { &[] };
            // SAFETY: buffers per the contract stated above the match.
            let recv = if in_place { &mut [][..] } else { unsafe { view_mut(*recv, *recv_bytes) } };
            algo.scatter(ctx, &mut ScatterArgs { send, blocks, recv, root: *root })
        }
        Work::AllToAll { send, send_blocks, recv, recv_blocks } => {
            // SAFETY: buffers per the contract stated above the match.
            let send = unsafe { view(*send, span(send_blocks)) };
            // SAFETY: buffers per the contract stated above the match.
            let recv = unsafe { view_mut(*recv, span(recv_blocks)) };
            algo.all_to_all(ctx, &mut AllToAllArgs { send, send_blocks, recv, recv_blocks })
        }
        // SAFETY: buffers per the contract stated above the match.
        Work::Send { buf, bytes, peer, .. } => p2p::send(ctx, unsafe { view(*buf, *bytes) }, *peer),
        // SAFETY: buffers per the contract stated above the match.
        Work::Recv { buf, bytes, peer, .. } => p2p::recv(ctx, unsafe { view_mut(*buf, *bytes) }, *peer),
        Work::Barrier => algo.barrier(ctx),
    }
}
