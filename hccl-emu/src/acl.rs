//! The ACL runtime calls of the double.

use hccn_runtime::sync::Locked;
use std::cell::{Cell, RefCell};
use std::ffi::{c_char, c_void, CString};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hccn_runtime::{Config, Stream};

use crate::table::Table;

pub type aclError = i32;
pub type aclrtStream = *mut c_void;

pub const ACL_SUCCESS: aclError = 0;
pub const ACL_ERROR_INVALID_PARAM: aclError = 100000;
pub const ACL_ERROR_REPEAT_INITIALIZE: aclError = 100002;
/// The double's code for "no device bound on this thread" and for a failed task on a stream.
pub const ACL_ERROR_RT_CONTEXT_NULL: aclError = 107002;
pub const ACL_ERROR_RT_INTERNAL_ERROR: aclError = 507000;

pub(crate) static STREAMS: Table<Stream> = Table::new();
static INIT: AtomicBool = AtomicBool::new(false);
/// Number of aclrtDeviceTaskAbort calls so far.
static ABORTS: AtomicU64 = AtomicU64::new(0);
/// Streams whose task met a dead peer: (stream, when first seen).
static HUNG: Mutex<Vec<(usize, Instant)>> = Mutex::new(Vec::new());
/// ABORTS when each stream was last given a task: an abort after that stopped the task.
static LAUNCHED: Mutex<Vec<(usize, u64)>> = Mutex::new(Vec::new());

/// Notes that `stream` is given a task now (see [`hung`]).
pub(crate) fn launched(stream: aclrtStream) {
    let aborts = ABORTS.load(Ordering::SeqCst);
    let mut l = LAUNCHED.locked();
    match l.iter_mut().find(|(k, _)| *k == stream as usize) {
        Some(entry) => entry.1 = aborts,
        None => l.push((stream as usize, aborts)),
    }
}

/// Forgets a destroyed stream.
fn forget(stream: aclrtStream) {
    let key = stream as usize;
    HUNG.locked().retain(|(k, _)| *k != key);
    LAUNCHED.locked().retain(|(k, _)| *k != key);
}

/// Like real HCCL, a task whose peer died does not fail: it hangs until the device's tasks are
/// aborted (aclrtDeviceTaskAbort, which stops every task given before it, whenever its hang is
/// first seen) or HCCL_EXEC_TIMEOUT (seconds, default 1836) passes. The native runtime under
/// the double does notice the peer; this keeps that knowledge from the caller until one of the
/// two happens. `true` while the stream counts as hung.
fn hung(stream: aclrtStream, e: &hccn_runtime::Error) -> bool {
    use hccn_runtime::ErrorKind::*;
    if !matches!(e.kind(), RankFailed | Remote | Transfer | Connect) {
        return false;
    }
    let key = stream as usize;
    let launched_at = LAUNCHED.locked().iter().find(|(k, _)| *k == key).map(|e| e.1);
    if launched_at.is_some_and(|a| a != ABORTS.load(Ordering::SeqCst)) {
        return false;
    }
    let mut h = HUNG.locked();
    let since = match h.iter().find(|(k, _)| *k == key) {
        Some(x) => x.1,
        None => {
            h.push((key, Instant::now()));
            Instant::now()
        }
    };
    let limit = std::env::var("HCCL_EXEC_TIMEOUT").ok().and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(1836);
    limit == 0 || since.elapsed() < Duration::from_secs(limit)
}

thread_local! {
    static DEVICE: Cell<Option<i32>> = const { Cell::new(None) };
    static RECENT: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn config() -> Config {
    Config::from_env().unwrap_or_default()
}

pub(crate) fn recent(msg: &str) {
    tracing::warn!("hccl-emu: {msg}");
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    RECENT.with(|r| *r.borrow_mut() = c);
}

/// True when the calling thread has a device (as ACL needs a context for stream work).
pub(crate) fn bound() -> bool {
    DEVICE.with(|d| d.get().is_some())
}

#[no_mangle]
pub unsafe extern "C" fn aclInit(_config_path: *const c_char) -> aclError {
    if INIT.swap(true, Ordering::SeqCst) {
        return ACL_ERROR_REPEAT_INITIALIZE;
    }
    hccn_runtime::log::init(&config());
    ACL_SUCCESS
}

#[no_mangle]
pub extern "C" fn aclFinalize() -> aclError {
    ACL_SUCCESS
}

#[no_mangle]
pub extern "C" fn aclrtSetDevice(device_id: i32) -> aclError {
    if !INIT.load(Ordering::SeqCst) {
        recent("aclrtSetDevice before aclInit");
        return ACL_ERROR_INVALID_PARAM;
    }
    if !(0..64).contains(&device_id) {
        recent(&format!("aclrtSetDevice: no device {device_id}"));
        return ACL_ERROR_INVALID_PARAM;
    }
    DEVICE.with(|d| d.set(Some(device_id)));
    ACL_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn aclrtGetDevice(device_id: *mut i32) -> aclError {
    match (DEVICE.with(|d| d.get()), device_id.is_null()) {
        (Some(d), false) => {
            // SAFETY: non-NULL out pointer from the caller.
            unsafe { device_id.write(d) };
            ACL_SUCCESS
        }
        (None, _) => ACL_ERROR_RT_CONTEXT_NULL,
        (_, true) => ACL_ERROR_INVALID_PARAM,
    }
}

#[no_mangle]
pub extern "C" fn aclrtResetDevice(_device_id: i32) -> aclError {
    DEVICE.with(|d| d.set(None));
    ACL_SUCCESS
}

// Optional in hccn's backend: hccl-emu-minimal does not export it.
#[cfg_attr(not(hccl_emu_minimal), no_mangle)]
pub extern "C" fn aclGetRecentErrMsg() -> *const c_char {
    RECENT.with(|r| r.borrow().as_ptr())
}

#[no_mangle]
pub unsafe extern "C" fn aclrtCreateStream(stream: *mut aclrtStream) -> aclError {
    if stream.is_null() {
        return ACL_ERROR_INVALID_PARAM;
    }
    if !bound() {
        recent("aclrtCreateStream: no device bound on this thread (aclrtSetDevice)");
        return ACL_ERROR_RT_CONTEXT_NULL;
    }
    match Stream::new() {
        // SAFETY: non-NULL out pointer from the caller.
        Ok(s) => unsafe { stream.write(STREAMS.insert(s)) },
        Err(e) => {
            recent(&format!("aclrtCreateStream: {e}"));
            return ACL_ERROR_RT_INTERNAL_ERROR;
        }
    }
    ACL_SUCCESS
}

#[no_mangle]
pub extern "C" fn aclrtDestroyStream(stream: aclrtStream) -> aclError {
    forget(stream);
    match STREAMS.remove(stream) {
        Some(s) => {
            let _ = s.synchronize();
            ACL_SUCCESS
        }
        None => ACL_ERROR_INVALID_PARAM,
    }
}

#[no_mangle]
pub extern "C" fn aclrtSynchronizeStream(stream: aclrtStream) -> aclError {
    if !bound() {
        recent("aclrtSynchronizeStream: no device bound on this thread (aclrtSetDevice)");
        return ACL_ERROR_RT_CONTEXT_NULL;
    }
    let Some(s) = STREAMS.get(stream) else {
        recent("aclrtSynchronizeStream: not a live stream");
        return ACL_ERROR_INVALID_PARAM;
    };
    loop {
        match s.synchronize() {
            Ok(()) => return ACL_SUCCESS,
            Err(e) if hung(stream, &e) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                recent(&format!("a task on the stream failed: {e}"));
                return ACL_ERROR_RT_INTERNAL_ERROR;
            }
        }
    }
}

/// `aclrtStreamStatus`: COMPLETE = 0, NOT_READY = 1. A failed stream is complete (its error
/// comes from aclrtSynchronizeStream).
// Optional in hccn's backend: hccl-emu-minimal does not export it.
#[cfg_attr(not(hccl_emu_minimal), no_mangle)]
pub unsafe extern "C" fn aclrtStreamQuery(stream: aclrtStream, status: *mut i32) -> aclError {
    let Some(s) = STREAMS.get(stream) else {
        return ACL_ERROR_INVALID_PARAM;
    };
    if status.is_null() {
        return ACL_ERROR_INVALID_PARAM;
    }
    let st = match s.query() {
        Ok(false) => 1,
        Err(e) if hung(stream, &e) => 1,
        _ => 0,
    };
    // SAFETY: non-NULL out pointer from the caller.
    unsafe { status.write(st) };
    ACL_SUCCESS
}

/// Stops the work of every communicator of this process (the double has one device): their
/// pending and later operations fail, as tasks do after a real task abort.
// Optional in hccn's backend: hccl-emu-minimal does not export it.
#[cfg_attr(not(hccl_emu_minimal), no_mangle)]
pub extern "C" fn aclrtDeviceTaskAbort(_device_id: i32, _timeout: u32) -> aclError {
    ABORTS.fetch_add(1, Ordering::SeqCst);
    for c in crate::hccl::COMMS.all() {
        c.abort();
    }
    tracing::info!("hccl-emu: aclrtDeviceTaskAbort");
    ACL_SUCCESS
}

// Optional in hccn's backend: hccl-emu-minimal does not export it.
#[cfg_attr(not(hccl_emu_minimal), no_mangle)]
pub unsafe extern "C" fn aclrtMalloc(dev_ptr: *mut *mut c_void, size: usize, _policy: i32) -> aclError {
    if dev_ptr.is_null() || size == 0 {
        return ACL_ERROR_INVALID_PARAM;
    }
    // SAFETY: plain allocation; freed by aclrtFree.
    let p = unsafe { libc::malloc(size) };
    if p.is_null() {
        return ACL_ERROR_RT_INTERNAL_ERROR;
    }
    // SAFETY: non-NULL out pointer from the caller.
    unsafe { dev_ptr.write(p) };
    ACL_SUCCESS
}

// Optional in hccn's backend: hccl-emu-minimal does not export it.
#[cfg_attr(not(hccl_emu_minimal), no_mangle)]
pub unsafe extern "C" fn aclrtFree(dev_ptr: *mut c_void) -> aclError {
    // SAFETY: the pointer came from aclrtMalloc (the caller's promise, as with ACL).
    unsafe { libc::free(dev_ptr) };
    ACL_SUCCESS
}

/// Kinds 0..=4 (host-to-host .. default) are all plain copies here.
#[no_mangle]
pub unsafe extern "C" fn aclrtMemcpy(
    dst: *mut c_void,
    dest_max: usize,
    src: *const c_void,
    count: usize,
    kind: i32,
) -> aclError {
    if !(0..=4).contains(&kind) || count > dest_max || (count > 0 && (dst.is_null() || src.is_null())) {
        recent(&format!("aclrtMemcpy: bad arguments (count {count}, destMax {dest_max}, kind {kind})"));
        return ACL_ERROR_INVALID_PARAM;
    }
    if count > 0 {
        // SAFETY: the caller promises `count` bytes at both ends (ACL's contract); `copy`
        // tolerates overlap.
        unsafe { std::ptr::copy(src.cast::<u8>(), dst.cast::<u8>(), count) };
    }
    ACL_SUCCESS
}
