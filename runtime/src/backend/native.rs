//! hccn's own runtime as a [`Backend`]: communicators over shared memory and TCP, host streams,
//! buffers in host memory (shareable, so same-host peers read them directly).

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use super::{AnyStream, Backend, BackendComm, DeviceMemory, DeviceStream, FusedBucket};
use crate::collectives::{Op, Ptr};
use crate::comm::Communicator;
use crate::config::{BackendKind, Config, LaunchEnv};
use crate::error::{Error, ErrorKind, Result};
use crate::fusion::Bucket;
use crate::mem;
use crate::rendezvous::UniqueId;
use crate::stream::Stream;
use crate::types::{DataType, ReduceOp};

/// The native backend.
#[derive(Debug)]
pub struct Native;

impl Backend for Native {
    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }
    fn init_rank(&self, id: &UniqueId, nranks: u32, rank: u32, cfg: &Config) -> Result<Box<dyn BackendComm>> {
        Ok(Box::new(Communicator::init_rank(id, nranks, rank, cfg)?))
    }
    fn init_from_env(&self, env: &LaunchEnv, cfg: &Config) -> Result<Box<dyn BackendComm>> {
        Ok(Box::new(Communicator::init_from_env(env, cfg)?))
    }
    fn new_device_stream(&self, _cfg: &Config) -> Result<Option<Arc<dyn DeviceStream>>> {
        Ok(None)
    }
    unsafe fn wrap_device_stream(&self, _cfg: &Config, _raw: *mut c_void) -> Result<Arc<dyn DeviceStream>> {
        Err(Error::new(
            ErrorKind::NotSupported,
            "hccn_stream_wrap_acl needs the HCCL backend (HCCN_BACKEND=hccl); this process runs the native backend, whose streams come from hccn_stream_create",
        ))
    }
    fn memory(&self, _cfg: &Config) -> Result<Arc<dyn DeviceMemory>> {
        Ok(Arc::new(HostMemory))
    }
}

/// The host queue of a native operation: a stream with a device side belongs to another
/// backend's communicators.
fn host_queue(stream: Option<&AnyStream>) -> Result<Option<&Stream>> {
    match stream {
        Some(s) if s.device.is_some() => {
            Err(Error::invalid("stream wraps an aclrtStream (HCCL backend) but comm is a native communicator"))
        }
        s => Ok(s.map(|s| &s.host)),
    }
}

impl BackendComm for Communicator {
    fn control(&self) -> &Communicator {
        self
    }
    unsafe fn submit(&self, op: Op, stream: Option<&AnyStream>) -> Result<()> {
        let host = host_queue(stream).map_err(|e| self.refuse_call(&op, e))?;
        // SAFETY: the caller's promise, passed on.
        unsafe { Communicator::submit(self, op, host) }
    }
    fn refuse_unread(&self, kind: &str, peer: Option<u32>, refusal: Error, stream: Option<&AnyStream>) -> Error {
        let host = host_queue(stream).ok().flatten();
        Communicator::refuse_unread(self, kind, peer, refusal, host)
    }
    fn new_group(&self, ranks: &[u32]) -> Result<Box<dyn BackendComm>> {
        Ok(Box::new(Communicator::new_group(self, ranks)?))
    }
    fn split(&self, color: i32, key: i32) -> Result<Option<Box<dyn BackendComm>>> {
        Ok(Communicator::split(self, color, key)?.map(|c| Box::new(c) as Box<dyn BackendComm>))
    }
    fn shrink(&self) -> Result<Box<dyn BackendComm>> {
        Ok(Box::new(Communicator::shrink(self)?))
    }
    fn rebuild(&self, timeout: Duration) -> Result<Box<dyn BackendComm>> {
        Ok(Box::new(Communicator::rebuild(self, timeout)?))
    }
    fn abort(&self) {
        Communicator::abort(self)
    }
    fn async_error(&self) -> Result<()> {
        Communicator::async_error(self)
    }
    fn bucket(&self, capacity_bytes: u64, dt: DataType, op: ReduceOp) -> Result<Box<dyn FusedBucket>> {
        Ok(Box::new(Bucket::new(self.clone(), capacity_bytes, dt, op)?))
    }
}

impl FusedBucket for Bucket {
    unsafe fn add(&mut self, buf: Ptr, count: u64, stream: Option<&AnyStream>) -> Result<()> {
        let host = host_queue(stream)?;
        // SAFETY: the caller's promise, passed on.
        unsafe { Bucket::add(self, buf, count, host) }
    }
    fn flush(&mut self, stream: Option<&AnyStream>) -> Result<()> {
        Bucket::flush(self, host_queue(stream)?)
    }
}

/// Host memory from [`mem::alloc`]: shareable, so same-host peers read it without a copy.
struct HostMemory;

impl DeviceMemory for HostMemory {
    fn alloc(&self, bytes: usize) -> Result<Ptr> {
        Ok(Ptr::from_mut(mem::alloc(bytes)?.as_ptr()))
    }
    unsafe fn free(&self, p: Ptr) -> Result<()> {
        // SAFETY: the caller's promise, passed on.
        unsafe { mem::free(p.0) }
    }
    unsafe fn upload(&self, dst: Ptr, src: &[u8]) -> Result<()> {
        let dst = NonNull::new(dst.0).ok_or_else(|| Error::null("upload to NULL"))?;
        // SAFETY: the caller promises `dst` holds `src.len()` bytes; distinct allocations.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_ptr(), src.len()) };
        Ok(())
    }
    unsafe fn download(&self, dst: &mut [u8], src: Ptr) -> Result<()> {
        let src = NonNull::new(src.0).ok_or_else(|| Error::null("download from NULL"))?;
        // SAFETY: the caller promises `src` holds `dst.len()` bytes; distinct allocations.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }
}
