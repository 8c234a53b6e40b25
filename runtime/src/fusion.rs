//! Gradient fusion: tensors added to a [`Bucket`] are reduced together by one allreduce over a
//! packed staging buffer, instead of one allreduce each (as Horovod's tensor fusion and
//! PyTorch DDP's gradient buckets). What a flush does, in stream order: copy every pending tensor
//! into the staging buffer, allreduce it in place, copy the results back. The copies run on the
//! stream as well, so a tensor is read when the stream reaches the flush, not when it was added.
//!
//! Whether an add flushes depends only on the capacity and the sequence of counts, so ranks that
//! add the same counts launch the same collectives.

use crate::sync::Locked;
use std::sync::{Arc, Mutex};

use crate::collectives::check;
use crate::collectives::{Op, Ptr};
use crate::comm::Communicator;
use crate::error::{Error, ErrorKind, Result};
use crate::mem::SharedBuf;
use crate::stream::{Job, Stream};
use crate::types::{DataType, ReduceOp};

/// Staging buffers kept for reuse: allocating (and page-faulting) up to the capacity at every
/// flush would cost more than a fused small allreduce.
const SPARE_BUFFERS: usize = 2;

type Spares = Arc<Mutex<Vec<Block>>>;

/// Memory for packed tensors: shareable, so that same-host peers read it in place rather than
/// with a system call per transfer (see mem.rs), or the heap where a memfd cannot be had.
enum Block {
    Shared(SharedBuf),
    /// From `Box::into_raw`, so that moving the block never retags the memory the jobs reach
    /// by address; freed on drop.
    Heap(*mut [u64]),
}

// SAFETY: the heap block is owned by this value alone (as a Box would be).
unsafe impl Send for Block {}

impl Drop for Block {
    fn drop(&mut self) {
        if let Block::Heap(p) = *self {
            // SAFETY: `p` came from `Box::into_raw` in `new` and is given back exactly once.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

impl Block {
    /// At least `bytes`, 8-byte aligned (the reduction kernels' fast path).
    fn new(bytes: usize) -> Result<Block> {
        match SharedBuf::new(bytes.max(8)) {
            Ok(b) => return Ok(Block::Shared(b)),
            Err(e) if e.kind() == ErrorKind::OutOfMemory => return Err(e.context("bucket flush")),
            Err(e) => tracing::debug!("bucket staging from the heap: {e}"),
        }
        let words = bytes.div_ceil(8);
        let mut v: Vec<u64> = Vec::new();
        v.try_reserve_exact(words).map_err(|_| {
            Error::new(ErrorKind::OutOfMemory, format!("bucket flush: cannot allocate {bytes} staging bytes"))
        })?;
        v.resize(words, 0);
        Ok(Block::Heap(Box::into_raw(v.into_boxed_slice())))
    }

    fn len(&self) -> usize {
        match self {
            Block::Shared(b) => b.len(),
            Block::Heap(b) => b.len() * 8,
        }
    }

    fn ptr(&mut self) -> *mut u8 {
        match self {
            Block::Shared(b) => b.as_mut_ptr(),
            Block::Heap(b) => b.cast(),
        }
    }
}

/// A pending tensor: `bytes` at `buf`, packed at byte `at` of the staging buffer.
#[derive(Debug, Clone, Copy)]
struct Tensor {
    buf: Ptr,
    at: usize,
    bytes: usize,
}

/// Allreduces many buffers of one data type and op together. Not thread-safe: one thread at a
/// time, as a communicator.
pub struct Bucket {
    comm: Communicator,
    capacity: usize,
    dt: DataType,
    op: ReduceOp,
    pending: Vec<Tensor>,
    used: usize,
    spares: Spares,
    collectives: u64,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("comm", &self.comm)
            .field("capacity", &self.capacity)
            .field("dt", &self.dt)
            .field("op", &self.op)
            .field("pending", &self.pending.len())
            .field("used", &self.used)
            .finish()
    }
}

/// Runs `job` now (`stream == None`) or queues it on `stream`.
fn run_on(stream: Option<&Stream>, job: Job) -> Result<()> {
    match stream {
        None => job(),
        Some(s) => s.enqueue(job),
    }
}

impl Bucket {
    /// A bucket packing up to `capacity_bytes` of `dt` elements per fused allreduce with `op`.
    pub fn new(comm: Communicator, capacity_bytes: u64, dt: DataType, op: ReduceOp) -> Result<Bucket> {
        if capacity_bytes < dt.size() as u64 {
            return Err(Error::invalid(format!(
                "bucket_create: capacity_bytes {capacity_bytes} cannot hold one {} element",
                dt.name()
            )));
        }
        let capacity = usize::try_from(capacity_bytes).ok().filter(|c| *c <= isize::MAX as usize).ok_or_else(|| {
            Error::invalid(format!("bucket_create: capacity_bytes {capacity_bytes} overflows the address space"))
        })?;
        Ok(Bucket { comm, capacity, dt, op, pending: Vec::new(), used: 0, spares: Arc::default(), collectives: 0 })
    }

    /// Allreduces launched so far (fused flushes and tensors too large to pack).
    pub fn collectives(&self) -> u64 {
        self.collectives
    }

    /// Adds `count` elements at `buf`: flushes the pending tensors first when they and this one
    /// exceed the capacity, allreduces a tensor larger than the whole bucket on its own, and
    /// flushes when the bucket is exactly full. Count 0 does nothing. On an error the argument
    /// checks fail before anything changes; a failed flush drops the tensors it covered.
    ///
    /// # Safety
    /// `buf` must be valid for reads and writes of `count` elements, and not used by the caller,
    /// until the flush that covers it has completed (returned without a stream, or been run by
    /// the stream).
    pub unsafe fn add(&mut self, buf: Ptr, count: u64, stream: Option<&Stream>) -> Result<()> {
        let what = "bucket_add";
        let block = check::buffer(buf, count, self.dt, "buf", what)?;
        let bytes = block.len();
        if bytes == 0 {
            return Ok(());
        }
        if self.pending.iter().any(|t| (t.buf.0 as usize) < block.end && block.start < t.buf.0 as usize + t.bytes) {
            return Err(Error::invalid(format!("{what}: buf overlaps a tensor already pending in this bucket")));
        }
        if bytes > self.capacity - self.used {
            self.flush(stream)?;
        }
        if bytes > self.capacity {
            // Too large to pack: reduce it where it is, after what was pending (flushed above).
            let op = Op::AllReduce { send: buf, recv: buf, count, dt: self.dt, op: self.op };
            // SAFETY: the caller's promise covers `buf` until this allreduce completes.
            unsafe { self.comm.submit(op, stream)? };
            self.collectives += 1;
            return Ok(());
        }
        self.pending.push(Tensor { buf, at: self.used, bytes });
        self.used += bytes;
        if self.used == self.capacity {
            self.flush(stream)?;
        }
        Ok(())
    }

    /// Packs, allreduces and unpacks the pending tensors; nothing pending is a no-op. These are
    /// three jobs rather than one that submits the allreduce when the stream runs it, because
    /// `Communicator::submit` fixes the collective's place in the communicator's order when it
    /// is called: that must be the caller's program order on every rank.
    pub fn flush(&mut self, stream: Option<&Stream>) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let tensors: Arc<[Tensor]> = std::mem::take(&mut self.pending).into();
        let bytes = std::mem::replace(&mut self.used, 0);
        let staging = Arc::new(Staging::take(&self.spares, bytes)?);
        let (st, ts) = (staging.clone(), tensors.clone());
        run_on(
            stream,
            Box::new(move || {
                st.pack(&ts);
                Ok(())
            }),
        )?;
        let (data, count) = (staging.ptr(), (bytes / self.dt.size()) as u64);
        let op = Op::AllReduce { send: data, recv: data, count, dt: self.dt, op: self.op };
        // SAFETY: the staging buffer outlives the allreduce: the unpack job queued after it (or
        // run after it, without a stream) holds it, and if that job cannot be queued we wait
        // for the stream below before letting go of it.
        unsafe { self.comm.submit(op, stream)? };
        self.collectives += 1;
        let keep = staging.clone();
        let queued = run_on(
            stream,
            Box::new(move || {
                staging.unpack(&tensors);
                Ok(())
            }),
        );
        if let (Err(_), Some(s)) = (&queued, stream) {
            // The stream failed in between, so it runs nothing more of ours; wait until it has
            // stopped touching the staging buffer.
            let _ = s.synchronize();
        }
        drop(keep);
        queued
    }
}

/// The packed buffer of one flush, reached by address from its three jobs (pack, allreduce,
/// unpack), which run one after another; it returns to the spares when the last one is done.
struct Staging {
    block: Option<Block>,
    /// The block's address, taken once: the jobs reach it through this only.
    at: *mut u8,
    spares: Spares,
}

// SAFETY: the buffer is owned and only reached through `ptr()` by the jobs of one flush, which
// never run at the same time (in order on one stream, or inline on the caller's thread).
unsafe impl Send for Staging {}
// SAFETY: as above; shared references never touch the buffer concurrently.
unsafe impl Sync for Staging {}

impl Staging {
    /// A buffer of at least `bytes`, reused from `spares` when one is large enough.
    fn take(spares: &Spares, bytes: usize) -> Result<Staging> {
        let reused = {
            let mut s = spares.locked();
            s.iter().position(|b| b.len() >= bytes).map(|i| s.swap_remove(i))
        };
        let mut block = match reused {
            Some(b) => b,
            None => Block::new(bytes)?,
        };
        let at = block.ptr();
        Ok(Staging { block: Some(block), at, spares: spares.clone() })
    }

    fn ptr(&self) -> Ptr {
        Ptr(self.at)
    }

    fn pack(&self, tensors: &[Tensor]) {
        for t in tensors {
            // SAFETY: `t` was checked by `add`, whose caller keeps it valid until this flush
            // completes; `at + bytes` fits in the buffer, which is ours alone.
            unsafe { std::ptr::copy_nonoverlapping(t.buf.0, self.ptr().0.add(t.at), t.bytes) };
        }
    }

    fn unpack(&self, tensors: &[Tensor]) {
        for t in tensors {
            // SAFETY: as in `pack`, in the other direction.
            unsafe { std::ptr::copy_nonoverlapping(self.ptr().0.add(t.at), t.buf.0, t.bytes) };
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let Some(block) = self.block.take() else { return };
        let mut s = self.spares.locked();
        s.push(block);
        if s.len() > SPARE_BUFFERS {
            // Keep the largest: they serve every smaller flush too.
            if let Some(i) = (0..s.len()).min_by_key(|&i| s[i].len()) {
                s.swap_remove(i);
            }
        }
    }
}
