//! The one seam between the callers (the C ABI, the tools) and a data path (`HCCN_BACKEND`).
//!
//! A [`Backend`] makes communicators, the device side of streams and device memory; a
//! [`BackendComm`] runs operations and changes membership. hccn's own runtime is the `native`
//! backend ([`native`]); `hccn-backend-hccl` registers `hccl` with [`register`] when the program
//! links it (as `hccn-recovery` registers etcd), so this crate knows nothing of HCCL or ACL.
//! Every communicator of any backend carries a native [`Communicator`] for its control plane
//! (ranks, epochs, failures, agreement): [`BackendComm::control`].

mod native;

use std::any::Any;
use std::ffi::c_void;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::collectives::{Op, Ptr};
use crate::comm::Communicator;
use crate::config::{BackendKind, Config, LaunchEnv};
use crate::error::{Error, ErrorKind, Result};
use crate::rendezvous::UniqueId;
use crate::stream::Stream;
use crate::types::{DataType, ReduceOp};

pub use native::Native;

/// A data path: how communicators, device queues and device memory are made.
pub trait Backend: Send + Sync {
    fn kind(&self) -> BackendKind;
    fn init_rank(&self, id: &UniqueId, nranks: u32, rank: u32, cfg: &Config) -> Result<Box<dyn BackendComm>>;
    fn init_from_env(&self, env: &LaunchEnv, cfg: &Config) -> Result<Box<dyn BackendComm>>;
    /// The device queue of a new stream; `None` where streams are host queues only.
    fn new_device_stream(&self, cfg: &Config) -> Result<Option<Arc<dyn DeviceStream>>>;
    /// Wraps a device stream that the caller made (an `aclrtStream`).
    ///
    /// # Safety
    /// `raw` is a live device stream of this backend, outliving the wrapper.
    unsafe fn wrap_device_stream(&self, cfg: &Config, raw: *mut c_void) -> Result<Arc<dyn DeviceStream>>;
    /// Memory that this backend's operations take as buffers.
    fn memory(&self, cfg: &Config) -> Result<Arc<dyn DeviceMemory>>;
}

/// A communicator of some backend.
pub trait BackendComm: Send + Sync {
    /// The native communicator beside it: ranks, epochs, failures (the control plane).
    fn control(&self) -> &Communicator;
    /// Checks and runs `op`, now (no stream) or queued on `stream`.
    ///
    /// # Safety
    /// The buffers of `op` are memory of this backend, valid until the operation completes
    /// (docs/c-api.md).
    unsafe fn submit(&self, op: Op, stream: Option<&AnyStream>) -> Result<()>;
    /// Keeps the place of a call of `kind` (an `Op::name`; `peer` for a send or receive) that
    /// this rank refused before its arguments could be read, so that the other ranks' calls do
    /// not pair with its next one (see comm/refuse.rs); returns the refusal.
    fn refuse_unread(&self, kind: &str, peer: Option<u32>, refusal: Error, stream: Option<&AnyStream>) -> Error {
        let _ = (kind, peer, stream);
        refusal
    }
    fn new_group(&self, ranks: &[u32]) -> Result<Box<dyn BackendComm>>;
    fn split(&self, color: i32, key: i32) -> Result<Option<Box<dyn BackendComm>>>;
    fn shrink(&self) -> Result<Box<dyn BackendComm>>;
    fn rebuild(&self, timeout: Duration) -> Result<Box<dyn BackendComm>>;
    fn abort(&self);
    fn async_error(&self) -> Result<()>;
    /// A fusion bucket of allreduces of `dt` with `op` over this communicator.
    fn bucket(&self, capacity_bytes: u64, dt: DataType, op: ReduceOp) -> Result<Box<dyn FusedBucket>>;
}

/// A fusion bucket of some backend (see [`crate::fusion`]).
pub trait FusedBucket: Send {
    /// # Safety
    /// `buf` holds `count` elements of this backend's memory, valid until the flush that
    /// covers it completes.
    unsafe fn add(&mut self, buf: Ptr, count: u64, stream: Option<&AnyStream>) -> Result<()>;
    fn flush(&mut self, stream: Option<&AnyStream>) -> Result<()>;
}

/// The device side of a stream (an ACL stream): the backend that made it finds its own type
/// again through [`DeviceStream::as_any`].
pub trait DeviceStream: Send + Sync + Any {
    /// Waits for the work queued on the device so far.
    fn wait(&self) -> Result<()>;
    /// Whether the work queued on the device so far is done.
    fn query(&self) -> Result<bool>;
    fn as_any(&self) -> &dyn Any;
}

/// Buffers of a backend's operations (host memory natively, device memory on HCCL).
pub trait DeviceMemory: Send + Sync {
    fn alloc(&self, bytes: usize) -> Result<Ptr>;
    /// # Safety
    /// `p` came from this memory's `alloc` and no operation still uses it.
    unsafe fn free(&self, p: Ptr) -> Result<()>;
    /// # Safety
    /// `dst` holds at least `src.len()` bytes of this memory.
    unsafe fn upload(&self, dst: Ptr, src: &[u8]) -> Result<()>;
    /// # Safety
    /// `src` holds at least `dst.len()` bytes of this memory.
    unsafe fn download(&self, dst: &mut [u8], src: Ptr) -> Result<()>;
}

/// A buffer of some backend's memory, freed on drop.
pub struct DeviceBuffer {
    memory: Arc<dyn DeviceMemory>,
    ptr: Ptr,
    len: usize,
}

impl DeviceBuffer {
    pub fn new(memory: Arc<dyn DeviceMemory>, len: usize) -> Result<DeviceBuffer> {
        let ptr = memory.alloc(len.max(1))?;
        Ok(DeviceBuffer { memory, ptr, len })
    }
    pub fn ptr(&self) -> Ptr {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn upload(&mut self, src: &[u8]) -> Result<()> {
        self.fits(src.len())?;
        // SAFETY: the buffer holds `len` bytes and `src` is no longer.
        unsafe { self.memory.upload(self.ptr, src) }
    }
    pub fn download(&self, dst: &mut [u8]) -> Result<()> {
        self.fits(dst.len())?;
        // SAFETY: as in `upload`.
        unsafe { self.memory.download(dst, self.ptr) }
    }
    fn fits(&self, n: usize) -> Result<()> {
        match n <= self.len {
            true => Ok(()),
            false => Err(Error::invalid(format!("{n} bytes do not fit a buffer of {}", self.len))),
        }
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:?}, {} bytes)", self.ptr, self.len)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated by this memory; the owner's operations have completed.
        let _ = unsafe { self.memory.free(self.ptr) };
    }
}

/// A stream of any backend: the host queue, and the device queue when the backend has one (the
/// host queue then orders events, callbacks and the operations staged through host memory).
pub struct AnyStream {
    pub host: Stream,
    pub device: Option<Arc<dyn DeviceStream>>,
}

impl std::fmt::Debug for AnyStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AnyStream(device: {})", self.device.is_some())
    }
}

impl AnyStream {
    /// A new stream of the configured backend.
    pub fn new(cfg: &Config) -> Result<AnyStream> {
        Ok(AnyStream { host: Stream::new()?, device: get(cfg)?.new_device_stream(cfg)? })
    }

    /// Wraps the caller's device stream (`hccn_stream_wrap_acl`).
    ///
    /// # Safety
    /// As [`Backend::wrap_device_stream`].
    pub unsafe fn wrap(cfg: &Config, raw: *mut c_void) -> Result<AnyStream> {
        // SAFETY: the caller's promise, passed on.
        let device = unsafe { get(cfg)?.wrap_device_stream(cfg, raw)? };
        Ok(AnyStream { host: Stream::new()?, device: Some(device) })
    }

    pub fn synchronize(&self) -> Result<()> {
        self.host.synchronize()?;
        self.device.as_ref().map_or(Ok(()), |d| d.wait())
    }

    pub fn query(&self) -> Result<bool> {
        if !self.host.query()? {
            return Ok(false);
        }
        self.device.as_ref().map_or(Ok(true), |d| d.query())
    }

    /// Queues on the host queue a wait for the device work queued so far, so that what the
    /// host queue runs next (an event, a callback) comes after it.
    pub fn host_after_device(&self) -> Result<()> {
        match self.device.clone() {
            Some(d) => self.host.enqueue(Box::new(move || d.wait())),
            None => Ok(()),
        }
    }
}

static HCCL: OnceLock<&'static dyn Backend> = OnceLock::new();

/// Makes a backend other than the native one available (called by `hccn-backend-hccl`'s
/// `install`); the first registration of a kind stays.
pub fn register(backend: &'static dyn Backend) {
    if backend.kind() == BackendKind::Hccl {
        let _ = HCCL.set(backend);
    }
}

/// The backend `cfg` names (`HCCN_BACKEND`).
pub fn get(cfg: &Config) -> Result<&'static dyn Backend> {
    match cfg.backend {
        BackendKind::Native => Ok(&Native),
        BackendKind::Hccl => HCCL.get().copied().ok_or_else(|| {
            Error::new(
                ErrorKind::NotSupported,
                "HCCN_BACKEND=hccl, but this program was built without hccn's HCCL backend (hccn-backend-hccl)",
            )
        }),
    }
}

/// Joins the job its launcher describes (config/launcher.rs), on the configured backend; the
/// launcher's NPU for this rank (the rank table's) where `HCCN_DEVICE_ID` names none.
pub fn init_from_env(env: &LaunchEnv, cfg: &Config) -> Result<Box<dyn BackendComm>> {
    let mut cfg = cfg.clone();
    cfg.device_id = cfg.device_id.or(env.device_id);
    get(&cfg)?.init_from_env(env, &cfg)
}

/// Joins the communicator `id` describes, on the configured backend.
pub fn init_rank(id: &UniqueId, nranks: u32, rank: u32, cfg: &Config) -> Result<Box<dyn BackendComm>> {
    get(cfg)?.init_rank(id, nranks, rank, cfg)
}
