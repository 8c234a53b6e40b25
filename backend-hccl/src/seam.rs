//! The HCCL backend behind the runtime's one seam ([`hccn_runtime::backend`]): communicators,
//! ACL streams as the device side of hccn streams, device memory from `aclrtMalloc`.

use std::any::Any;
use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use hccn_runtime::backend::{AnyStream, Backend, BackendComm, DeviceMemory, DeviceStream, FusedBucket};
use hccn_runtime::{
    BackendKind, Communicator, Config, DataType, Error, ErrorKind, LaunchEnv, Op, Ptr, ReduceOp, Result, Stream,
    UniqueId,
};

use crate::api::{need, ACL_MEMCPY_DEVICE_TO_HOST, ACL_MEMCPY_HOST_TO_DEVICE};
use crate::{AclStream, HcclBucket, HcclCommunicator, HcclLibrary};

/// `HCCN_BACKEND=hccl`.
#[derive(Debug)]
pub struct Hccl;

/// Registers the HCCL backend with the runtime (idempotent): a program that links this crate
/// calls it before its first communicator.
pub fn install() {
    hccn_runtime::backend::register(&Hccl);
}

impl Backend for Hccl {
    fn kind(&self) -> BackendKind {
        BackendKind::Hccl
    }
    fn init_rank(&self, id: &UniqueId, nranks: u32, rank: u32, cfg: &Config) -> Result<Box<dyn BackendComm>> {
        Ok(Box::new(HcclCommunicator::init_rank(id, nranks, rank, cfg)?))
    }
    fn init_from_env(&self, env: &LaunchEnv, cfg: &Config) -> Result<Box<dyn BackendComm>> {
        Ok(Box::new(HcclCommunicator::init_from_env(env, cfg)?))
    }
    fn new_device_stream(&self, cfg: &Config) -> Result<Option<Arc<dyn DeviceStream>>> {
        Ok(Some(Arc::new(AclStream::create(HcclLibrary::get(cfg)?)?)))
    }
    unsafe fn wrap_device_stream(&self, cfg: &Config, raw: *mut c_void) -> Result<Arc<dyn DeviceStream>> {
        if raw.is_null() {
            return Err(Error::null("acl_stream is NULL"));
        }
        Ok(Arc::new(AclStream::wrap(HcclLibrary::get(cfg)?, raw)?))
    }
    fn memory(&self, cfg: &Config) -> Result<Arc<dyn DeviceMemory>> {
        Ok(Arc::new(AclMemory(HcclLibrary::get(cfg)?)))
    }
}

impl DeviceStream for AclStream {
    fn wait(&self) -> Result<()> {
        AclStream::wait(self)
    }
    fn query(&self) -> Result<bool> {
        AclStream::query(self)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The ACL stream and host queue of `stream` for an HCCL operation.
fn queues(stream: Option<&AnyStream>) -> Result<(Option<&AclStream>, Option<&Stream>)> {
    let Some(s) = stream else { return Ok((None, None)) };
    let acl =
        match &s.device {
            Some(d) => Some(d.as_any().downcast_ref::<AclStream>().ok_or_else(|| {
                Error::invalid("stream's device queue is not an ACL stream (made by another backend)")
            })?),
            None => {
                return Err(Error::invalid(
                    "stream is a host stream of the native backend but comm is an HCCL communicator",
                ))
            }
        };
    Ok((acl, Some(&s.host)))
}

impl BackendComm for HcclCommunicator {
    fn control(&self) -> &Communicator {
        self.native()
    }
    unsafe fn submit(&self, op: Op, stream: Option<&AnyStream>) -> Result<()> {
        let (acl, host) = queues(stream)?;
        // SAFETY: the caller's promise (device buffers), passed on.
        unsafe { HcclCommunicator::submit(self, op, acl, host) }
    }
    fn new_group(&self, ranks: &[u32]) -> Result<Box<dyn BackendComm>> {
        Ok(Box::new(HcclCommunicator::new_group(self, ranks)?))
    }
    fn split(&self, color: i32, key: i32) -> Result<Option<Box<dyn BackendComm>>> {
        Ok(HcclCommunicator::split(self, color, key)?.map(|c| Box::new(c) as Box<dyn BackendComm>))
    }
    fn shrink(&self) -> Result<Box<dyn BackendComm>> {
        Ok(Box::new(HcclCommunicator::shrink(self)?))
    }
    fn rebuild(&self, timeout: Duration) -> Result<Box<dyn BackendComm>> {
        Ok(Box::new(HcclCommunicator::rebuild(self, timeout)?))
    }
    fn abort(&self) {
        HcclCommunicator::abort(self)
    }
    fn async_error(&self) -> Result<()> {
        HcclCommunicator::async_error(self)
    }
    fn bucket(&self, capacity_bytes: u64, dt: DataType, op: ReduceOp) -> Result<Box<dyn FusedBucket>> {
        Ok(Box::new(HcclBucket::new(self.clone(), capacity_bytes, dt, op)?))
    }
}

impl FusedBucket for HcclBucket {
    unsafe fn add(&mut self, buf: Ptr, count: u64, stream: Option<&AnyStream>) -> Result<()> {
        let (acl, host) = queues(stream)?;
        // SAFETY: the caller's promise (device memory), passed on.
        unsafe { HcclBucket::add(self, buf, count, acl, host) }
    }
    fn flush(&mut self, stream: Option<&AnyStream>) -> Result<()> {
        let (acl, host) = queues(stream)?;
        HcclBucket::flush(self, acl, host)
    }
}

/// Device memory: `aclrtMalloc`, `aclrtFree` and `aclrtMemcpy`.
struct AclMemory(Arc<HcclLibrary>);

impl AclMemory {
    fn copy(&self, dst: *mut c_void, src: *const c_void, len: usize, kind: i32, what: &str) -> Result<()> {
        let memcpy = need(self.0.api.aclrtMemcpy, "aclrtMemcpy")?;
        self.0.bind()?;
        // SAFETY: public signature; the callers' promises cover both ranges.
        self.0.api.acl(what, unsafe { memcpy(dst, len, src, len, kind) })
    }
}

impl DeviceMemory for AclMemory {
    fn alloc(&self, bytes: usize) -> Result<Ptr> {
        let malloc = self.0.api.aclrtMalloc.ok_or_else(|| {
            Error::new(ErrorKind::NotSupported, "this ACL library has no aclrtMalloc: device buffers cannot be made")
        })?;
        self.0.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: public signature; valid out pointer.
        self.0.api.acl("aclrtMalloc", unsafe { malloc(&mut p, bytes, 0) })?;
        if p.is_null() {
            return Err(Error::new(ErrorKind::OutOfMemory, "aclrtMalloc returned no memory"));
        }
        Ok(Ptr::from_mut(p))
    }
    unsafe fn free(&self, p: Ptr) -> Result<()> {
        let free = need(self.0.api.aclrtFree, "aclrtFree")?;
        // SAFETY: public signature; the caller promises `p` came from aclrtMalloc, unused now.
        self.0.api.acl("aclrtFree", unsafe { free(p.0.cast()) })
    }
    unsafe fn upload(&self, dst: Ptr, src: &[u8]) -> Result<()> {
        let kind = ACL_MEMCPY_HOST_TO_DEVICE;
        self.copy(dst.0.cast(), src.as_ptr().cast(), src.len(), kind, "aclrtMemcpy (host to device)")
    }
    unsafe fn download(&self, dst: &mut [u8], src: Ptr) -> Result<()> {
        let kind = ACL_MEMCPY_DEVICE_TO_HOST;
        self.copy(dst.as_mut_ptr().cast(), src.0 as *const c_void, dst.len(), kind, "aclrtMemcpy (device to host)")
    }
}
