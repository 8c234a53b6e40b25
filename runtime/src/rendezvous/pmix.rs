//! The launcher's PMIx server (Open MPI 4/5, `srun --mpi=pmix`) as a side channel for one
//! string: rank 0 puts its store's address, everyone fences and gets it. `libpmix.so.2` is
//! loaded at run time (as the HCCL backend loads HCCL), so hccn neither links nor needs it.
//! Declarations from PMIx's public `pmix.h` and `pmix_common.h` (4.x); tests/tests/launchers.rs
//! compiles the real header and checks the layouts below against it.

use std::ffi::{c_char, c_int, CStr, CString};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use libloading::Library;

use crate::error::{Error, ErrorKind, Result};
use crate::sync::Locked;

const PMIX_SUCCESS: c_int = 0;
/// `PMIX_GLOBAL`: visible to every process of the namespace, on any host.
const PMIX_GLOBAL: u8 = 3;
const PMIX_STRING: u16 = 3;
const PMIX_INT: u16 = 6;
const PMIX_MAX_NSLEN: usize = 255;
const PMIX_MAX_KEYLEN: usize = 511;
/// `PMIX_TIMEOUT`: seconds before a fence or get gives up.
const PMIX_TIMEOUT: &str = "pmix.timeout";

/// `pmix_proc_t`.
#[repr(C)]
struct Proc {
    nspace: [c_char; PMIX_MAX_NSLEN + 1],
    rank: u32,
}

/// `pmix_value_t`: a type tag and a 24-byte union (pointers, integers, small structs).
#[repr(C)]
struct Value {
    kind: u16,
    data: [u64; 3],
}

/// `pmix_info_t`.
#[repr(C)]
struct Info {
    key: [c_char; PMIX_MAX_KEYLEN + 1],
    flags: u32,
    value: Value,
}

/// The sizes of `pmix_proc_t`, `pmix_value_t` and `pmix_info_t` as declared here (checked
/// against the C header by the tests).
pub const LAYOUT: [usize; 3] = [size_of::<Proc>(), size_of::<Value>(), size_of::<Info>()];

type InitFn = unsafe extern "C" fn(*mut Proc, *const Info, usize) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*const Info, usize) -> c_int;
type PutFn = unsafe extern "C" fn(u8, *const c_char, *const Value) -> c_int;
type CommitFn = unsafe extern "C" fn() -> c_int;
type FenceFn = unsafe extern "C" fn(*const Proc, usize, *const Info, usize) -> c_int;
type GetFn = unsafe extern "C" fn(*const Proc, *const c_char, *const Info, usize, *mut *mut Value) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;
type ValueDestructFn = unsafe extern "C" fn(*mut Value);

/// The PMIx client library and the functions hccn calls.
pub struct Pmix {
    init: InitFn,
    finalize: FinalizeFn,
    put: PutFn,
    commit: CommitFn,
    fence: FenceFn,
    get: GetFn,
    error_string: ErrorStringFn,
    value_destruct: Option<ValueDestructFn>,
    path: String,
    // Last: the functions above point into it.
    _lib: Library,
}

impl std::fmt::Debug for Pmix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pmix").field("path", &self.path).finish()
    }
}

const SONAME: &str = "libpmix.so.2";

impl Pmix {
    /// Loads `path`, else `libpmix.so.2` from the loader's search path.
    fn load(path: Option<&Path>) -> Result<Pmix> {
        let name = path.map_or_else(|| SONAME.to_owned(), |p| p.display().to_string());
        let unavailable = |why: String| Error::new(ErrorKind::Unavailable, format!("PMIx: {name}: {why}"));
        // SAFETY: loading a shared library runs its initialisers; libpmix's are those of an
        // ordinary client library, which MPI libraries load the same way.
        let lib = unsafe { Library::new(&name) }.map_err(|e| unavailable(e.to_string()))?;
        macro_rules! sym {
            ($t:ty, $name:literal) => {
                // SAFETY: the symbol is PMIx's public function of that name, declared as `$t`.
                *unsafe { lib.get::<$t>($name) }.map_err(|e| unavailable(e.to_string()))?
            };
        }
        Ok(Pmix {
            init: sym!(InitFn, b"PMIx_Init\0"),
            finalize: sym!(FinalizeFn, b"PMIx_Finalize\0"),
            put: sym!(PutFn, b"PMIx_Put\0"),
            commit: sym!(CommitFn, b"PMIx_Commit\0"),
            fence: sym!(FenceFn, b"PMIx_Fence\0"),
            get: sym!(GetFn, b"PMIx_Get\0"),
            error_string: sym!(ErrorStringFn, b"PMIx_Error_string\0"),
            // SAFETY: as above; older libraries lack it, and a returned value then leaks.
            value_destruct: unsafe { lib.get::<ValueDestructFn>(b"PMIx_Value_destruct\0") }.ok().map(|s| *s),
            path: name,
            _lib: lib,
        })
    }

    fn check(&self, what: &str, rc: c_int) -> Result<()> {
        if rc == PMIX_SUCCESS {
            return Ok(());
        }
        // SAFETY: PMIx_Error_string returns a static string for any status.
        let text = unsafe { (self.error_string)(rc) };
        let text = if text.is_null() {
            format!("status {rc}")
        } else {
            // SAFETY: non-null, NUL-terminated, static.
            unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
        };
        let kind = if rc == -24 { ErrorKind::Timeout } else { ErrorKind::Store };
        Err(Error::new(kind, format!("PMIx ({}): {what} failed: {text}", self.path)))
    }
}

/// The process's one connection to the launcher's PMIx server, made on first use and closed at
/// exit, never before: Open MPI's MPI_Init, and PMIx_Init itself, fail in a process that
/// connected and disconnected once, and mpirun counts a process that connected and never
/// finalized as failed. PMIx counts inits, so an MPI library in the same process shares the
/// connection whichever comes first, and the last finalize (MPI's or this) disconnects.
pub struct Session {
    pmix: Pmix,
    me: Proc,
}

static SESSION: Mutex<Option<Arc<Session>>> = Mutex::new(None);

/// The process's PMIx session, connecting through `lib` (else `libpmix.so.2`) the first time.
pub fn session(lib: Option<&Path>) -> Result<Arc<Session>> {
    let mut shared = SESSION.locked();
    if let Some(s) = shared.as_ref() {
        return Ok(s.clone());
    }
    let pmix = Pmix::load(lib)?;
    let mut me = Proc { nspace: [0; PMIX_MAX_NSLEN + 1], rank: 0 };
    // SAFETY: `me` is a writable pmix_proc_t; no info.
    pmix.check("PMIx_Init", unsafe { (pmix.init)(&mut me, std::ptr::null(), 0) })?;
    // SAFETY: registers a function with no captured state; a failure only loses the finalize.
    if unsafe { libc::atexit(finalize_at_exit) } != 0 {
        tracing::warn!("PMIx: no exit hook; the launcher may count this process as failed at its end");
    }
    let s = Arc::new(Session { pmix, me });
    *shared = Some(s.clone());
    Ok(s)
}

extern "C" fn finalize_at_exit() {
    // A lock poisoned by a panic still holds the session.
    let session = SESSION.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(s) = session {
        // SAFETY: paired with the one PMIx_Init of `session`.
        let rc = unsafe { (s.pmix.finalize)(std::ptr::null(), 0) };
        if let Err(e) = s.pmix.check("PMIx_Finalize", rc) {
            tracing::warn!("{e}");
        }
    }
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("rank", &self.me.rank).finish()
    }
}

fn key(k: &str) -> Result<CString> {
    CString::new(k).map_err(|_| Error::invalid("a PMIx key holds a NUL"))
}

fn timeout_info(timeout: Duration) -> Info {
    let mut info = Info { key: [0; PMIX_MAX_KEYLEN + 1], flags: 0, value: Value { kind: PMIX_INT, data: [0; 3] } };
    for (d, s) in info.key.iter_mut().zip(PMIX_TIMEOUT.bytes()) {
        *d = s as c_char;
    }
    let secs = timeout.as_secs().clamp(1, i32::MAX as u64) as i32;
    // The union's `int` member: its first four bytes.
    info.value.data[0] = u64::from(secs as u32);
    info
}

impl Session {
    /// This process's rank in its PMIx namespace.
    pub fn rank(&self) -> u32 {
        self.me.rank
    }

    /// Publishes `key` = `value` to every process of the namespace (after the next fence).
    pub fn put(&self, k: &str, value: &str) -> Result<()> {
        let (k, v) = (key(k)?, CString::new(value).map_err(|_| Error::invalid("a PMIx value holds a NUL"))?);
        let val = Value { kind: PMIX_STRING, data: [v.as_ptr() as u64, 0, 0] };
        // SAFETY: a string value whose pointer lives through the call (PMIx copies it).
        self.pmix.check("PMIx_Put", unsafe { (self.pmix.put)(PMIX_GLOBAL, k.as_ptr(), &val) })?;
        // SAFETY: no arguments.
        self.pmix.check("PMIx_Commit", unsafe { (self.pmix.commit)() })
    }

    /// Waits until every process of the namespace has fenced (or `timeout` passed).
    pub fn fence(&self, timeout: Duration) -> Result<()> {
        let info = timeout_info(timeout);
        // SAFETY: NULL procs means the whole namespace; one valid info.
        self.pmix.check("PMIx_Fence", unsafe { (self.pmix.fence)(std::ptr::null(), 0, &info, 1) })
    }

    /// The string `rank` put under `key`.
    pub fn get(&self, rank: u32, k: &str, timeout: Duration) -> Result<String> {
        let k = key(k)?;
        let whom = Proc { nspace: self.me.nspace, rank };
        let info = timeout_info(timeout);
        let mut out: *mut Value = std::ptr::null_mut();
        // SAFETY: valid proc, key and info; `out` receives a value PMIx allocated.
        self.pmix.check("PMIx_Get", unsafe { (self.pmix.get)(&whom, k.as_ptr(), &info, 1, &mut out) })?;
        if out.is_null() {
            return Err(Error::new(ErrorKind::Store, "PMIx_Get returned no value"));
        }
        // SAFETY: PMIx returned a valid pmix_value_t.
        let (kind, ptr) = unsafe { ((*out).kind, (*out).data[0] as *const c_char) };
        let text = if kind == PMIX_STRING && !ptr.is_null() {
            // SAFETY: a PMIX_STRING value holds a NUL-terminated string.
            Ok(unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned())
        } else {
            Err(Error::new(ErrorKind::Store, format!("PMIx_Get: the value of {k:?} is of type {kind}, not a string")))
        };
        if let Some(destruct) = self.pmix.value_destruct {
            // SAFETY: `out` came from PMIx_Get, which allocates it with malloc (PMIX_VALUE_RELEASE).
            unsafe {
                destruct(out);
                libc::free(out.cast());
            }
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_pmix_4() {
        // sizeof(pmix_proc_t), sizeof(pmix_value_t), sizeof(pmix_info_t) on x86_64 and aarch64.
        assert_eq!(LAYOUT, [260, 32, 552]);
        assert_eq!(std::mem::offset_of!(Info, value), 520);
        assert_eq!(std::mem::offset_of!(Value, data), 8);
    }

    #[test]
    fn a_missing_library_is_named() {
        let e = session(Some(Path::new("/nonexistent/libpmix.so.2"))).err().map(|e| e.to_string());
        assert!(e.is_some_and(|m| m.contains("/nonexistent/libpmix.so.2")));
    }
}
