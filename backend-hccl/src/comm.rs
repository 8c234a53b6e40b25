//! An HCCL communicator paired with the native communicator that carries hccn's control plane.

use hccn_runtime::sync::Locked;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hccn_runtime::{Communicator, Config, DataType, Error, ErrorKind, LaunchEnv, Op, Ptr, ReduceOp, Result, UniqueId};

use crate::api::{self, need, HcclComm, HcclCommConfig, HcclRootInfo, ROOT_INFO_BYTES};
use crate::stream::AclStream;
use crate::HcclLibrary;

/// State shared by the clones of a communicator and by the streams that carry its operations.
pub(crate) struct Shared {
    pub backend: Arc<HcclLibrary>,
    pub native: Communicator,
    /// The `HcclComm`; 0 once torn down.
    raw: Mutex<usize>,
    /// The stream of operations called with a NULL stream (each is waited for).
    pub internal: AclStream,
    pub abort_timeout_ms: u32,
}

impl Shared {
    /// The HCCL communicator, or the reason it is gone.
    fn raw(&self) -> Result<HcclComm> {
        let raw = *self.raw.locked();
        if raw == 0 {
            self.native.async_error()?;
            return Err(Error::new(ErrorKind::Aborted, "the HCCL communicator was torn down after a failure"));
        }
        Ok(raw as HcclComm)
    }

    /// After a detected failure: stop the device's tasks (`aclrtDeviceTaskAbort`), then
    /// `HcclCommDestroy`. Idempotent; later operations fail with the native side's error.
    pub fn teardown(&self) {
        let raw = std::mem::take(&mut *self.raw.locked());
        if raw == 0 {
            return;
        }
        let api = &self.backend.api;
        if let Some(abort) = api.aclrtDeviceTaskAbort {
            // SAFETY: public signature.
            let rc = unsafe { abort(self.backend.device, self.abort_timeout_ms) };
            if let Err(e) = api.acl("aclrtDeviceTaskAbort", rc) {
                tracing::warn!("{e}");
            }
        }
        if let Some(destroy) = api.HcclCommDestroy {
            // SAFETY: public signature; `raw` came from HcclCommInitRootInfo and is destroyed once.
            let rc = unsafe { destroy(raw as HcclComm) };
            if let Err(e) = api.hccl("HcclCommDestroy", rc) {
                tracing::warn!("{e}");
            }
        }
        tracing::info!(rank = self.native.rank(), "HCCL communicator torn down");
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let raw = std::mem::take(&mut *self.raw.locked());
        if raw == 0 {
            return;
        }
        // Work queued on the internal stream finishes before the communicator goes.
        let _ = self.internal.wait_quiet();
        if let Some(destroy) = self.backend.api.HcclCommDestroy {
            // SAFETY: as in `teardown`.
            unsafe { destroy(raw as HcclComm) };
        }
    }
}

/// A communicator on the HCCL backend. Clones share it.
#[derive(Clone)]
pub struct HcclCommunicator {
    pub(crate) s: Arc<Shared>,
}

impl std::fmt::Debug for HcclCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HcclCommunicator").field("native", &self.s.native).finish()
    }
}

/// The root info with a leading status byte (1: rank 0 made it), as exchanged between ranks.
const EXCHANGED: usize = ROOT_INFO_BYTES + 1;

fn make_root(backend: &HcclLibrary) -> Vec<u8> {
    let mut out = vec![0u8; EXCHANGED];
    let mut root = HcclRootInfo { internal: [0; ROOT_INFO_BYTES] };
    let made = need(backend.api.HcclGetRootInfo, "HcclGetRootInfo").and_then(|f| {
        // SAFETY: public signature; `root` is a writable HcclRootInfo.
        backend.api.hccl("HcclGetRootInfo", unsafe { f(&mut root) })
    });
    match made {
        Ok(()) => {
            out[0] = 1;
            out[1..].copy_from_slice(&root.internal);
        }
        Err(e) => tracing::warn!("{e}"),
    }
    out
}

fn parse_root(bytes: &[u8]) -> Result<HcclRootInfo> {
    if bytes.len() != EXCHANGED || bytes[0] != 1 {
        return Err(Error::new(
            ErrorKind::Backend,
            "rank 0 could not make an HCCL root info (HcclGetRootInfo failed there; see its log)",
        ));
    }
    let mut root = HcclRootInfo { internal: [0; ROOT_INFO_BYTES] };
    root.internal.copy_from_slice(&bytes[1..]);
    Ok(root)
}

/// Rank 0 of `native` makes a fresh root info and broadcasts it over `native`.
fn root_over(backend: &HcclLibrary, native: &Communicator) -> Result<HcclRootInfo> {
    let mut buf = if native.rank() == 0 { make_root(backend) } else { vec![0u8; EXCHANGED] };
    let op =
        Op::Broadcast { buf: Ptr::from_mut(buf.as_mut_ptr()), count: EXCHANGED as u64, dt: DataType::Uint8, root: 0 };
    // SAFETY: `buf` lives on this frame until the blocking call returns.
    unsafe { native.submit(op, None) }.map_err(|e| e.context("exchanging the HCCL root info"))?;
    parse_root(&buf)
}

fn backend_for(cfg: &Config, local_rank: Option<u32>) -> Result<Arc<HcclLibrary>> {
    let mut cfg = cfg.clone();
    if cfg.device_id.is_none() {
        cfg.device_id = local_rank.map(|r| r as i32);
    }
    HcclLibrary::get(&cfg)
}

impl HcclCommunicator {
    /// `hccn_init_from_env` on this backend. Rank 0's root info goes over the native side,
    /// formed by then: no key in the job's store to outlive the job or be read by its next run.
    pub fn init_from_env(env: &LaunchEnv, cfg: &Config) -> Result<Self> {
        let backend = backend_for(cfg, Some(env.local_rank))?;
        let native = Communicator::init_from_env(env, cfg)?;
        let root = root_over(&backend, &native)?;
        Self::with_root(backend, native, &root, cfg)
    }

    /// `hccn_comm_init_rank` on this backend: the root info goes over the native side, as in
    /// [`HcclCommunicator::init_from_env`] (the id's store is released once the world formed).
    pub fn init_rank(id: &UniqueId, nranks: u32, rank: u32, cfg: &Config) -> Result<Self> {
        let backend = backend_for(cfg, None)?;
        let native = Communicator::init_rank(id, nranks, rank, cfg)?;
        let root = root_over(&backend, &native)?;
        Self::with_root(backend, native, &root, cfg)
    }

    fn with_root(backend: Arc<HcclLibrary>, native: Communicator, root: &HcclRootInfo, cfg: &Config) -> Result<Self> {
        let api = &backend.api;
        let (n, r) = (native.size(), native.rank());
        let mut raw: HcclComm = std::ptr::null_mut();
        if let Some(f) = api.HcclCommInitRootInfoConfig {
            let config = HcclCommConfig::named(&format!("hccn-{:016x}", native.id()));
            // SAFETY: public signature; every pointer is valid for the call.
            api.hccl("HcclCommInitRootInfoConfig", unsafe { f(n, root, r, &config, &mut raw) })?;
        } else {
            let f = need(api.HcclCommInitRootInfo, "HcclCommInitRootInfo")?;
            // SAFETY: as above.
            api.hccl("HcclCommInitRootInfo", unsafe { f(n, root, r, &mut raw) })?;
        }
        Self::adopt(backend, native, raw, cfg.timeout)
    }

    fn adopt(backend: Arc<HcclLibrary>, native: Communicator, raw: HcclComm, timeout: Duration) -> Result<Self> {
        if raw.is_null() {
            return Err(Error::new(ErrorKind::Backend, "HCCL returned success but no communicator"));
        }
        let internal = AclStream::create(backend.clone())?;
        let s = Arc::new(Shared {
            backend,
            native,
            raw: Mutex::new(raw as usize),
            internal,
            abort_timeout_ms: timeout.as_millis().min(u32::MAX as u128) as u32,
        });
        let c = HcclCommunicator { s };
        c.check_shape()?;
        Ok(c)
    }

    /// HCCL must see the same rank and size as hccn.
    fn check_shape(&self) -> Result<()> {
        let api = &self.s.backend.api;
        let raw = self.s.raw()?;
        let (mut n, mut r) = (0u32, 0u32);
        // SAFETY: public signatures; valid out pointers.
        api.hccl("HcclGetRankSize", unsafe { need(api.HcclGetRankSize, "HcclGetRankSize")?(raw, &mut n) })?;
        // SAFETY: as above.
        api.hccl("HcclGetRankId", unsafe { need(api.HcclGetRankId, "HcclGetRankId")?(raw, &mut r) })?;
        if (n, r) != (self.s.native.size(), self.s.native.rank()) {
            return Err(Error::internal(format!(
                "HCCL sees rank {r} of {n}, hccn rank {} of {}",
                self.s.native.rank(),
                self.s.native.size()
            )));
        }
        Ok(())
    }

    /// The native communicator beside this one (control plane: ranks, failures, epochs).
    pub fn native(&self) -> &Communicator {
        &self.s.native
    }

    /// A sub-communicator of this one whose native side is `child` and whose members have the
    /// ranks `parent_ranks` here: `HcclCreateSubCommConfig` when the library has it, else a
    /// fresh root info from the child's rank 0.
    fn sub(&self, child: Communicator, parent_ranks: Vec<u32>) -> Result<Self> {
        let backend = self.s.backend.clone();
        let timeout = Duration::from_millis(self.s.abort_timeout_ms as u64);
        if let Some(f) = backend.api.HcclCreateSubCommConfig {
            let mut parent = self.s.raw()?;
            let mut ranks = parent_ranks;
            let mut config = HcclCommConfig::named(&format!("hccn-{:016x}", child.id()));
            let mut raw: HcclComm = std::ptr::null_mut();
            // SAFETY: public signature; every pointer is valid for the call.
            let rc = unsafe {
                f(&mut parent, ranks.len() as u32, ranks.as_mut_ptr(), child.id(), child.rank(), &mut config, &mut raw)
            };
            backend.api.hccl("HcclCreateSubCommConfig", rc)?;
            return Self::adopt(backend, child, raw, timeout);
        }
        let root = root_over(&backend, &child)?;
        let cfg = Config { timeout, ..Config::default() };
        Self::with_root(backend, child, &root, &cfg)
    }

    /// `hccn_new_group`.
    pub fn new_group(&self, ranks: &[u32]) -> Result<Self> {
        let child = self.s.native.new_group(ranks)?;
        self.sub(child, ranks.to_vec())
    }

    /// `hccn_comm_split`.
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Self>> {
        let Some(child) = self.s.native.split(color, key)? else {
            return Ok(None);
        };
        // The members' ranks here, in the child's order.
        let me = self.s.native.rank();
        let mut all = vec![0u32; child.size() as usize];
        let op = Op::AllGather {
            send: Ptr::from_const(&me as *const u32),
            recv: Ptr::from_mut(all.as_mut_ptr()),
            send_count: 1,
            dt: DataType::Uint32,
        };
        // SAFETY: both buffers live on this frame until the blocking call returns.
        unsafe { child.submit(op, None)? };
        self.sub(child, all).map(Some)
    }

    /// `hccn_comm_shrink`: the HCCL communicator cannot finish with a dead member, so it is torn
    /// down (task abort, destroy); hccn's agreement runs on the native side, and the survivors
    /// build a new HCCL communicator from a fresh root info (as MindCluster's ARF re-initialises).
    pub fn shrink(&self) -> Result<Self> {
        self.s.teardown();
        let small = self.s.native.shrink()?;
        self.renew(small)
    }

    /// `hccn_comm_rebuild`: shrink, admit joiners on the native side, then a fresh root info.
    pub fn rebuild(&self, timeout: Duration) -> Result<Self> {
        self.s.teardown();
        let next = self.s.native.rebuild(timeout)?;
        self.renew(next)
    }

    fn renew(&self, native: Communicator) -> Result<Self> {
        let backend = self.s.backend.clone();
        let root = root_over(&backend, &native)?;
        let cfg = Config { timeout: Duration::from_millis(self.s.abort_timeout_ms as u64), ..Config::default() };
        Self::with_root(backend, native, &root, &cfg)
    }

    /// `hccn_comm_abort`: tear the HCCL side down and abort the native side.
    pub fn abort(&self) {
        self.s.teardown();
        self.s.native.abort();
    }

    /// HCCL's asynchronous error for this communicator (`HcclGetCommAsyncError`), if the
    /// library reports one; hccn's own state comes first.
    pub fn async_error(&self) -> Result<()> {
        self.s.native.async_error()?;
        let api = &self.s.backend.api;
        if let (Some(f), Ok(raw)) = (api.HcclGetCommAsyncError, self.s.raw()) {
            let mut e = 0;
            // SAFETY: public signature; valid out pointer.
            api.hccl("HcclGetCommAsyncError", unsafe { f(raw, &mut e) })?;
            api.hccl("an earlier operation (HcclGetCommAsyncError)", e)?;
        }
        Ok(())
    }

    /// Checks `op` as the native path does, then issues it to HCCL on `stream` (NULL: the
    /// internal stream, waited for before returning), or stages it through host memory when
    /// HCCL has no such operation or data type (after the stream's earlier work is done).
    ///
    /// # Safety
    /// The buffers of `op` are device memory valid until the operation completes (docs/c-api.md).
    pub unsafe fn submit(&self, op: Op, stream: Option<&AclStream>, host: Option<&hccn_runtime::Stream>) -> Result<()> {
        self.s.backend.bind()?;
        let work = match self.s.native.precheck(&op) {
            Ok(w) => w,
            Err(e) => {
                if matches!(e.kind(), ErrorKind::RankFailed | ErrorKind::Revoked | ErrorKind::Aborted) {
                    self.s.teardown();
                }
                return Err(e);
            }
        };
        if !work {
            return Ok(());
        }
        let acl = stream.unwrap_or(&self.s.internal);
        acl.usable()?;
        let raw = self.s.raw()?;
        // SAFETY: the caller's promise covers the buffers.
        match unsafe { self.issue(&op, raw, acl.raw()) } {
            Some(r) => {
                r?;
                acl.watch(&self.s);
                if stream.is_none() {
                    acl.wait()?;
                }
                Ok(())
            }
            None => {
                acl.wait()?;
                if let Some(h) = host {
                    h.synchronize()?;
                }
                // SAFETY: as above; the staged copy is complete before return.
                unsafe { crate::stage::run(&self.s, op) }
            }
        }
    }

    /// The HCCL call for `op`, or `None` when HCCL has no such operation or data type.
    unsafe fn issue(&self, op: &Op, comm: HcclComm, st: *mut c_void) -> Option<Result<()>> {
        let api = &self.s.backend.api;
        let v = |p: &Ptr| p.0.cast::<c_void>();
        let t = |d: &DataType| *d as i32;
        let call = |name: &str, rc: api::HcclResult| Some(api.hccl(name, rc));
        // SAFETY: every call below has its public signature; the buffers are the caller's
        // device memory, checked by `precheck` like the native path's.
        unsafe {
            match op {
                Op::AllReduce { send, recv, count, dt, op } if reducible(*dt, *op) => {
                    call("HcclAllReduce", api.HcclAllReduce?(v(send), v(recv), *count, t(dt), *op as i32, comm, st))
                }
                Op::Reduce { send, recv, count, dt, op, root } if reducible(*dt, *op) => {
                    call("HcclReduce", api.HcclReduce?(v(send), v(recv), *count, t(dt), *op as i32, *root, comm, st))
                }
                Op::ReduceScatter { send, recv, recv_count, dt, op } if reducible(*dt, *op) => call(
                    "HcclReduceScatter",
                    api.HcclReduceScatter?(v(send), v(recv), *recv_count, t(dt), *op as i32, comm, st),
                ),
                Op::Broadcast { buf, count, dt, root } => {
                    call("HcclBroadcast", api.HcclBroadcast?(v(buf), *count, t(dt), *root, comm, st))
                }
                Op::AllGather { send, recv, send_count, dt } => {
                    call("HcclAllGather", api.HcclAllGather?(v(send), v(recv), *send_count, t(dt), comm, st))
                }
                Op::AllGatherV { send, send_count, recv, recv_counts, displs, dt } => call(
                    "HcclAllGatherV",
                    api.HcclAllGatherV?(
                        v(send),
                        *send_count,
                        v(recv),
                        recv_counts.as_ptr().cast(),
                        displs.as_ptr().cast(),
                        t(dt),
                        comm,
                        st,
                    ),
                ),
                Op::Scatter { send, recv, recv_count, dt, root } => {
                    call("HcclScatter", api.HcclScatter?(v(send), v(recv), *recv_count, t(dt), *root, comm, st))
                }
                Op::AllToAll { send, recv, count_per_rank, dt } => call(
                    "HcclAlltoAll",
                    api.HcclAlltoAll?(v(send), *count_per_rank, t(dt), v(recv), *count_per_rank, t(dt), comm, st),
                ),
                Op::AllToAllV { send, send_counts, send_displs, recv, recv_counts, recv_displs, dt } => call(
                    "HcclAlltoAllV",
                    api.HcclAlltoAllV?(
                        v(send),
                        send_counts.as_ptr().cast(),
                        send_displs.as_ptr().cast(),
                        t(dt),
                        v(recv),
                        recv_counts.as_ptr().cast(),
                        recv_displs.as_ptr().cast(),
                        t(dt),
                        comm,
                        st,
                    ),
                ),
                Op::Send { buf, count, dt, peer } => {
                    call("HcclSend", api.HcclSend?(v(buf), *count, t(dt), *peer, comm, st))
                }
                Op::Recv { buf, count, dt, peer } => {
                    call("HcclRecv", api.HcclRecv?(v(buf), *count, t(dt), *peer, comm, st))
                }
                Op::Barrier => call("HcclBarrier", api.HcclBarrier?(comm, st)),
                // Gather, AVG, compressed allreduce, and data types HCCL does not reduce.
                _ => None,
            }
        }
    }
}

/// What HCCL's reducing operations accept (the header comments: int8, int16, int32, fp16,
/// fp32, bf16; sum, prod, max, min).
pub fn reducible(dt: DataType, op: ReduceOp) -> bool {
    use DataType::*;
    matches!(dt, Int8 | Int16 | Int32 | Fp16 | Fp32 | Bf16) && !matches!(op, ReduceOp::Avg)
}
