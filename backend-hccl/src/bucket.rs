//! Fusion buckets on the HCCL backend: tensors in device memory are packed into one device
//! buffer (`aclrtMalloc`, device-to-device `aclrtMemcpy`), reduced with one operation and
//! unpacked, mirroring the native bucket's rules (same adds on every rank, overflow flushes,
//! a tensor larger than the bucket is reduced on its own, destroy does not flush). A flush
//! completes before it returns; without `aclrtMalloc` each tensor is reduced on its own.

use std::ffi::c_void;

use hccn_runtime::{DataType, Error, ErrorKind, Op, Ptr, ReduceOp, Result, Stream};

use crate::api::{need, ACL_MEMCPY_DEVICE_TO_DEVICE};
use crate::{AclStream, HcclCommunicator};

#[derive(Debug, Clone, Copy)]
struct Tensor {
    buf: usize,
    at: usize,
    bytes: usize,
}

#[derive(Debug)]
pub struct HcclBucket {
    comm: HcclCommunicator,
    capacity: usize,
    dt: DataType,
    op: ReduceOp,
    pending: Vec<Tensor>,
    used: usize,
    /// Device staging buffer (address, bytes), kept for later flushes.
    staging: Option<(usize, usize)>,
}

impl HcclBucket {
    pub fn new(comm: HcclCommunicator, capacity_bytes: u64, dt: DataType, op: ReduceOp) -> Result<Self> {
        if capacity_bytes < dt.size() as u64 {
            return Err(Error::invalid(format!(
                "bucket_create: capacity_bytes {capacity_bytes} cannot hold one {} element",
                dt.name()
            )));
        }
        let capacity = usize::try_from(capacity_bytes).ok().filter(|c| *c <= isize::MAX as usize).ok_or_else(|| {
            Error::invalid(format!("bucket_create: capacity_bytes {capacity_bytes} overflows the address space"))
        })?;
        Ok(HcclBucket { comm, capacity, dt, op, pending: Vec::new(), used: 0, staging: None })
    }

    /// Adds `count` elements at device address `buf`; may flush.
    ///
    /// # Safety
    /// `buf` is device memory of `count` elements, valid until the flush that covers it returns.
    pub unsafe fn add(&mut self, buf: Ptr, count: u64, acl: Option<&AclStream>, host: Option<&Stream>) -> Result<()> {
        let bytes = self.dt.bytes(count).map_err(|e| e.context("bucket_add"))?;
        if bytes == 0 {
            return Ok(());
        }
        if buf.is_null() {
            return Err(Error::null("bucket_add: buf is NULL"));
        }
        let start = buf.0 as usize;
        if self.pending.iter().any(|t| t.buf < start + bytes && start < t.buf + t.bytes) {
            return Err(Error::invalid("bucket_add: buf overlaps a tensor already pending in this bucket"));
        }
        if bytes > self.capacity - self.used {
            self.flush(acl, host)?;
        }
        if bytes > self.capacity {
            let op = Op::AllReduce { send: buf, recv: buf, count, dt: self.dt, op: self.op };
            // SAFETY: the caller's promise for `buf`.
            return unsafe { self.comm.submit(op, None, None) };
        }
        self.pending.push(Tensor { buf: start, at: self.used, bytes });
        self.used += bytes;
        if self.used == self.capacity {
            self.flush(acl, host)?;
        }
        Ok(())
    }

    /// Reduces everything pending; complete on return.
    pub fn flush(&mut self, acl: Option<&AclStream>, host: Option<&Stream>) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        // The tensors may be written by work queued earlier on the stream.
        if let Some(h) = host {
            h.synchronize()?;
        }
        if let Some(a) = acl {
            a.wait()?;
        }
        let tensors = std::mem::take(&mut self.pending);
        let bytes = std::mem::replace(&mut self.used, 0);
        let backend = self.comm.s.backend.clone();
        let api = &backend.api;
        let (Some(malloc), Some(_)) = (api.aclrtMalloc, api.aclrtFree) else {
            for t in &tensors {
                let count = (t.bytes / self.dt.size()) as u64;
                let p = Ptr(t.buf as *mut u8);
                // SAFETY: the caller's promise for each tensor.
                unsafe {
                    self.comm.submit(Op::AllReduce { send: p, recv: p, count, dt: self.dt, op: self.op }, None, None)?
                };
            }
            return Ok(());
        };
        let memcpy = need(api.aclrtMemcpy, "aclrtMemcpy")?;
        if self.staging.is_none_or(|(_, len)| len < bytes) {
            self.release();
            let mut p: *mut c_void = std::ptr::null_mut();
            // SAFETY: public signature; valid out pointer. Policy 0: ACL_MEM_MALLOC_HUGE_FIRST.
            api.acl("aclrtMalloc", unsafe { malloc(&mut p, self.capacity, 0) })?;
            if p.is_null() {
                return Err(Error::new(ErrorKind::OutOfMemory, "aclrtMalloc returned no memory"));
            }
            self.staging = Some((p as usize, self.capacity));
        }
        let (base, len) = self.staging.unwrap_or((0, 0));
        let copy = |dst: usize, dst_max: usize, src: usize, n: usize| {
            // SAFETY: public signature; both ranges are device memory of `n` bytes.
            let rc =
                unsafe { memcpy(dst as *mut c_void, dst_max, src as *const c_void, n, ACL_MEMCPY_DEVICE_TO_DEVICE) };
            api.acl("aclrtMemcpy (device to device)", rc)
        };
        for t in &tensors {
            copy(base + t.at, len - t.at, t.buf, t.bytes)?;
        }
        let data = Ptr(base as *mut u8);
        let op =
            Op::AllReduce { send: data, recv: data, count: (bytes / self.dt.size()) as u64, dt: self.dt, op: self.op };
        // SAFETY: the staging buffer is ours and holds `bytes`.
        unsafe { self.comm.submit(op, None, None)? };
        for t in &tensors {
            copy(t.buf, t.bytes, base + t.at, t.bytes)?;
        }
        Ok(())
    }

    fn release(&mut self) {
        if let (Some((p, _)), Some(free)) = (self.staging.take(), self.comm.s.backend.api.aclrtFree) {
            // SAFETY: public signature; `p` came from aclrtMalloc and is freed once.
            unsafe { free(p as *mut c_void) };
        }
    }
}

impl Drop for HcclBucket {
    fn drop(&mut self) {
        self.release();
    }
}
