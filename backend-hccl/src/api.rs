//! The HCCL and ACL symbols hccn uses, with their public C declarations (research notes:
//! `hccl-mindspore-tf-torch.md` §1), resolved at run time with `libloading`. Required symbols
//! missing make loading fail with `Unavailable`, naming library and symbol; newer ones are
//! optional and the callers fall back.

use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};

use hccn_runtime::{Config, Error, ErrorKind, Result};
use libloading::Library;

/// `HcclResult` (an int enum; 0 is `HCCL_SUCCESS`).
pub type HcclResult = i32;
/// `aclError` (0 is `ACL_SUCCESS`).
pub type AclError = i32;
/// `HcclComm`, `aclrtStream`: opaque pointers.
pub type HcclComm = *mut c_void;
pub type AclStream = *mut c_void;

/// `HCCL_ROOT_INFO_BYTES`.
pub const ROOT_INFO_BYTES: usize = 4108;

/// `HcclRootInfo`: what rank 0 makes and every rank passes to `HcclCommInitRootInfo`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HcclRootInfo {
    pub internal: [u8; ROOT_INFO_BYTES],
}

impl std::fmt::Debug for HcclRootInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HcclRootInfo({} bytes)", ROOT_INFO_BYTES)
    }
}

/// The version-2 prefix of `HcclCommConfig` (the struct grows at its tail; the first 24 bytes
/// say size, magic word and version, as `HcclCommConfigInit` writes them).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HcclCommConfig {
    pub size: usize,
    pub magic_word: u32,
    pub version: u32,
    pub reserved: u64,
    pub hccl_buffer_size: u32,
    pub hccl_deterministic: u32,
    pub hccl_comm_name: [u8; 128],
}

impl std::fmt::Debug for HcclCommConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HcclCommConfig").field("version", &self.version).finish()
    }
}

pub const COMM_CONFIG_MAGIC: u32 = 0xf0f0_f0f0;
/// "Not set": HCCL then takes the environment's value (HCCL_BUFFSIZE, HCCL_DETERMINISTIC).
pub const CONFIG_UNSET: u32 = 0xffff_ffff;

impl HcclCommConfig {
    /// A version-2 config that sets only the communicator's name.
    pub fn named(name: &str) -> Self {
        let mut c = HcclCommConfig {
            size: std::mem::size_of::<HcclCommConfig>(),
            magic_word: COMM_CONFIG_MAGIC,
            version: 2,
            reserved: 0,
            hccl_buffer_size: CONFIG_UNSET,
            hccl_deterministic: CONFIG_UNSET,
            hccl_comm_name: [0; 128],
        };
        let n = name.len().min(127);
        c.hccl_comm_name[..n].copy_from_slice(&name.as_bytes()[..n]);
        c
    }
}

/// `aclrtMemcpyKind`.
pub const ACL_MEMCPY_HOST_TO_DEVICE: i32 = 1;
pub const ACL_MEMCPY_DEVICE_TO_HOST: i32 = 2;
pub const ACL_MEMCPY_DEVICE_TO_DEVICE: i32 = 3;
/// `aclrtStreamStatus` (`hicann/runtime:docs/api_docs/aclrtStreamStatus.md`).
pub const ACL_STREAM_STATUS_COMPLETE: i32 = 0;
/// `aclInit` on an initialised process: `ACL_ERROR_REPEAT_INITIALIZE`.
pub const ACL_ERROR_REPEAT_INITIALIZE: AclError = 100002;

/// One declared function: library, name, whether loading requires it, and its C declaration.
#[derive(Debug, Clone, Copy)]
pub struct Signature {
    pub lib: &'static str,
    pub name: &'static str,
    pub required: bool,
    pub ret: &'static str,
    pub params: &'static [(&'static str, &'static str)],
}

// C type of each parameter kind, as the public headers spell it.
macro_rules! cty {
    (ptr) => {
        "void *"
    };
    (cptr) => {
        "const void *"
    };
    (ptr_p) => {
        "void **"
    };
    (u64) => {
        "uint64_t"
    };
    (u32) => {
        "uint32_t"
    };
    (i32) => {
        "int32_t"
    };
    (usize) => {
        "size_t"
    };
    (u32_p) => {
        "uint32_t *"
    };
    (cstr) => {
        "const char *"
    };
    (HcclResult) => {
        "HcclResult"
    };
    (HcclResult_p) => {
        "HcclResult *"
    };
    (HcclDataType) => {
        "HcclDataType"
    };
    (HcclReduceOp) => {
        "HcclReduceOp"
    };
    (HcclComm) => {
        "HcclComm"
    };
    (HcclComm_p) => {
        "HcclComm *"
    };
    (HcclRootInfo_p) => {
        "HcclRootInfo *"
    };
    (cHcclRootInfo_p) => {
        "const HcclRootInfo *"
    };
    (HcclCommConfig_p) => {
        "HcclCommConfig *"
    };
    (cHcclCommConfig_p) => {
        "const HcclCommConfig *"
    };
    (aclError) => {
        "aclError"
    };
    (aclrtStream) => {
        "aclrtStream"
    };
    (aclrtStream_p) => {
        "aclrtStream *"
    };
    (aclrtMemcpyKind) => {
        "aclrtMemcpyKind"
    };
    (aclrtMemMallocPolicy) => {
        "aclrtMemMallocPolicy"
    };
    (aclrtStreamStatus_p) => {
        "aclrtStreamStatus *"
    };
}

// The Rust type of each parameter kind (C enums are int-sized).
macro_rules! rty {
    (ptr) => { *mut c_void };
    (cptr) => { *const c_void };
    (ptr_p) => { *mut *mut c_void };
    (u64) => { u64 };
    (u32) => { u32 };
    (i32) => { i32 };
    (usize) => { usize };
    (u32_p) => { *mut u32 };
    (cstr) => { *const c_char };
    (HcclResult) => { HcclResult };
    (HcclResult_p) => { *mut HcclResult };
    (HcclDataType) => { i32 };
    (HcclReduceOp) => { i32 };
    (HcclComm) => { HcclComm };
    (HcclComm_p) => { *mut HcclComm };
    (HcclRootInfo_p) => { *mut HcclRootInfo };
    (cHcclRootInfo_p) => { *const HcclRootInfo };
    (HcclCommConfig_p) => { *mut HcclCommConfig };
    (cHcclCommConfig_p) => { *const HcclCommConfig };
    (aclError) => { AclError };
    (aclrtStream) => { AclStream };
    (aclrtStream_p) => { *mut AclStream };
    (aclrtMemcpyKind) => { i32 };
    (aclrtMemMallocPolicy) => { i32 };
    (aclrtStreamStatus_p) => { *mut i32 };
}

macro_rules! req {
    (required) => {
        true
    };
    (optional) => {
        false
    };
}

macro_rules! symbols {
    ($( $lib:ident $req:ident fn $name:ident ( $( $arg:ident : $ty:ident ),* ) -> $ret:ident ; )*) => {
        /// The loaded libraries and every symbol hccn uses (`None`: an optional one is absent).
        #[allow(non_snake_case)]
        pub struct Api {
            pub hccl_path: String,
            pub acl_path: String,
            _hccl: Library,
            _acl: Library,
            $( pub $name: Option<unsafe extern "C" fn( $( rty!($ty) ),* ) -> rty!($ret)>, )*
        }

        /// Every declaration, for the signature test and docs/hccl.md.
        pub const SIGNATURES: &[Signature] = &[
            $( Signature {
                lib: stringify!($lib),
                name: stringify!($name),
                required: req!($req),
                ret: cty!($ret),
                params: &[ $( (stringify!($arg), cty!($ty)) ),* ],
            }, )*
        ];

        impl Api {
            #[allow(non_snake_case)]
            fn resolve(hccl: Library, hccl_path: String, acl: Library, acl_path: String) -> Result<Api> {
                $(
                    let $name = {
                        let (lib, path) = if stringify!($lib) == "hccl" { (&hccl, &hccl_path) } else { (&acl, &acl_path) };
                        // SAFETY: the type is the public declaration of this symbol (checked
                        // against the research notes by tests/tests/hccl.rs).
                        let sym = unsafe {
                            lib.get::<unsafe extern "C" fn( $( rty!($ty) ),* ) -> rty!($ret)>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                        };
                        match sym {
                            Ok(s) => Some(*s),
                            Err(_) if !req!($req) => None,
                            Err(e) => {
                                return Err(Error::new(
                                    ErrorKind::Unavailable,
                                    format!(
                                        "the HCCL backend needs symbol {} from {} ({}): {e}",
                                        stringify!($name), path, stringify!($lib)
                                    ),
                                ))
                            }
                        }
                    };
                )*
                Ok(Api { hccl_path, acl_path, _hccl: hccl, _acl: acl, $( $name, )* })
            }

            /// The optional symbols the loaded libraries lack (their fallbacks are in use).
            pub fn absent(&self) -> Vec<&'static str> {
                let mut out = Vec::new();
                $( if self.$name.is_none() { out.push(stringify!($name)); } )*
                out
            }
        }
    };
}

symbols! {
    acl required fn aclInit(configPath: cstr) -> aclError;
    acl required fn aclrtSetDevice(deviceId: i32) -> aclError;
    acl required fn aclrtCreateStream(stream: aclrtStream_p) -> aclError;
    acl required fn aclrtDestroyStream(stream: aclrtStream) -> aclError;
    acl required fn aclrtSynchronizeStream(stream: aclrtStream) -> aclError;
    acl required fn aclrtMemcpy(dst: ptr, destMax: usize, src: cptr, count: usize, kind: aclrtMemcpyKind) -> aclError;
    acl optional fn aclrtMalloc(devPtr: ptr_p, size: usize, policy: aclrtMemMallocPolicy) -> aclError;
    acl optional fn aclrtFree(devPtr: ptr) -> aclError;
    acl optional fn aclrtStreamQuery(stream: aclrtStream, status: aclrtStreamStatus_p) -> aclError;
    acl optional fn aclrtDeviceTaskAbort(deviceId: i32, timeout: u32) -> aclError;
    acl optional fn aclGetRecentErrMsg() -> cstr;
    hccl required fn HcclGetRootInfo(rootInfo: HcclRootInfo_p) -> HcclResult;
    hccl required fn HcclCommInitRootInfo(nRanks: u32, rootInfo: cHcclRootInfo_p, rank: u32, comm: HcclComm_p) -> HcclResult;
    hccl optional fn HcclCommInitRootInfoConfig(nRanks: u32, rootInfo: cHcclRootInfo_p, rank: u32, config: cHcclCommConfig_p, comm: HcclComm_p) -> HcclResult;
    hccl optional fn HcclCreateSubCommConfig(comm: HcclComm_p, rankNum: u32, rankIds: u32_p, subCommId: u64, subCommRankId: u32, config: HcclCommConfig_p, subComm: HcclComm_p) -> HcclResult;
    hccl required fn HcclCommDestroy(comm: HcclComm) -> HcclResult;
    hccl required fn HcclGetRankSize(comm: HcclComm, rankSize: u32_p) -> HcclResult;
    hccl required fn HcclGetRankId(comm: HcclComm, rank: u32_p) -> HcclResult;
    hccl optional fn HcclGetErrorString(code: HcclResult) -> cstr;
    hccl optional fn HcclGetCommAsyncError(comm: HcclComm, asyncError: HcclResult_p) -> HcclResult;
    hccl required fn HcclAllReduce(sendBuf: ptr, recvBuf: ptr, count: u64, dataType: HcclDataType, op: HcclReduceOp, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    hccl required fn HcclBroadcast(buf: ptr, count: u64, dataType: HcclDataType, root: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    hccl required fn HcclReduceScatter(sendBuf: ptr, recvBuf: ptr, recvCount: u64, dataType: HcclDataType, op: HcclReduceOp, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    hccl optional fn HcclScatter(sendBuf: ptr, recvBuf: ptr, recvCount: u64, dataType: HcclDataType, root: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    hccl required fn HcclAllGather(sendBuf: ptr, recvBuf: ptr, sendCount: u64, dataType: HcclDataType, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    hccl optional fn HcclAllGatherV(sendBuf: ptr, sendCount: u64, recvBuf: ptr, recvCounts: cptr, recvDispls: cptr, dataType: HcclDataType, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    hccl required fn HcclSend(sendBuf: ptr, count: u64, dataType: HcclDataType, destRank: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    hccl required fn HcclRecv(recvBuf: ptr, count: u64, dataType: HcclDataType, srcRank: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    hccl optional fn HcclAlltoAll(sendBuf: cptr, sendCount: u64, sendType: HcclDataType, recvBuf: cptr, recvCount: u64, recvType: HcclDataType, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    hccl required fn HcclAlltoAllV(sendBuf: cptr, sendCounts: cptr, sdispls: cptr, sendType: HcclDataType, recvBuf: cptr, recvCounts: cptr, rdispls: cptr, recvType: HcclDataType, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    hccl required fn HcclReduce(sendBuf: ptr, recvBuf: ptr, count: u64, dataType: HcclDataType, op: HcclReduceOp, root: u32, comm: HcclComm, stream: aclrtStream) -> HcclResult;
    hccl required fn HcclBarrier(comm: HcclComm, stream: aclrtStream) -> HcclResult;
}

impl std::fmt::Debug for Api {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Api").field("hccl", &self.hccl_path).field("acl", &self.acl_path).finish()
    }
}

/// Where a library is looked for: the explicit path, else the CANN lib64 directories named by
/// ASCEND_HOME_PATH / ASCEND_TOOLKIT_HOME, else the bare name (the loader's search path).
pub fn candidates(explicit: Option<&Path>, file: &str) -> Vec<PathBuf> {
    if let Some(p) = explicit {
        return vec![p.to_path_buf()];
    }
    let mut out = Vec::new();
    for var in ["ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"] {
        if let Some(dir) = std::env::var_os(var).filter(|d| !d.is_empty()) {
            let p = PathBuf::from(dir).join("lib64").join(file);
            if p.exists() {
                out.push(p);
            }
        }
    }
    out.push(PathBuf::from(file));
    out
}

fn open(what: &str, explicit: Option<&Path>, file: &str, var: &str) -> Result<(Library, String)> {
    let mut errors = Vec::new();
    for p in candidates(explicit, file) {
        // SAFETY: loading runs the library's initialisers; the libraries named here are the
        // vendor's HCCL/ACL (or the hccl-emu test double), which the user chose.
        match unsafe { Library::new(&p) } {
            Ok(lib) => return Ok((lib, p.display().to_string())),
            Err(e) => errors.push(format!("{}: {e}", p.display())),
        }
    }
    Err(Error::new(
        ErrorKind::Unavailable,
        format!(
            "the HCCL backend cannot load {what} ({}); set {var} to its path or ASCEND_HOME_PATH to the CANN install",
            errors.join("; ")
        ),
    ))
}

impl Api {
    /// Loads both libraries as `cfg` says and resolves every symbol.
    pub fn load(cfg: &Config) -> Result<Api> {
        let (hccl, hccl_path) = open("libhccl.so", cfg.hccl_lib.as_deref(), "libhccl.so", "HCCN_HCCL_LIB")?;
        let (acl, acl_path) = open("libascendcl.so", cfg.acl_lib.as_deref(), "libascendcl.so", "HCCN_ACL_LIB")?;
        Api::resolve(hccl, hccl_path, acl, acl_path)
    }

    /// HcclGetErrorString's text for `code`, or the enum name when the library lacks it.
    pub fn hccl_error_text(&self, code: HcclResult) -> String {
        if let Some(f) = self.HcclGetErrorString {
            // SAFETY: public signature; the result is a static string or NULL.
            let p = unsafe { f(code) };
            if !p.is_null() {
                // SAFETY: non-NULL, NUL-terminated (HCCL returns static strings).
                return unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            }
        }
        format!("HcclResult {code}")
    }

    /// ACL's most recent error message on this thread, when the library has the call.
    pub fn acl_error_text(&self) -> String {
        if let Some(f) = self.aclGetRecentErrMsg {
            // SAFETY: public signature; the result is a thread-local string or NULL.
            let p = unsafe { f() };
            if !p.is_null() {
                // SAFETY: non-NULL, NUL-terminated.
                return unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
            }
        }
        String::new()
    }

    /// Maps an HCCL return code to an hccn error (Ok for HCCL_SUCCESS).
    pub fn hccl(&self, what: &str, code: HcclResult) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        let kind = match code {
            1 => ErrorKind::InvalidArgument,
            2 => ErrorKind::NullPointer,
            3 | 24 => ErrorKind::OutOfMemory,
            4 => ErrorKind::Internal,
            5 => ErrorKind::NotSupported,
            6 => ErrorKind::NotFound,
            7 | 20 | 22 => ErrorKind::Unavailable,
            8 => ErrorKind::System,
            9 => ErrorKind::Timeout,
            11 | 12 => ErrorKind::Connect,
            13 | 14 => ErrorKind::Transfer,
            21 => ErrorKind::Remote,
            _ => ErrorKind::Backend,
        };
        Err(Error::new(kind, format!("{what} failed with HCCL error {code}: {}", self.hccl_error_text(code))))
    }

    /// Maps an ACL return code to an hccn error (Ok for ACL_SUCCESS).
    pub fn acl(&self, what: &str, code: AclError) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        let detail = self.acl_error_text();
        let detail = if detail.is_empty() { String::new() } else { format!(": {detail}") };
        Err(Error::new(ErrorKind::Backend, format!("{what} failed with ACL error {code}{detail}")))
    }
}

/// A required symbol, or an error naming it (loading already checked, so this cannot fail
/// unless the table is misused).
pub fn need<T: Copy>(f: Option<T>, name: &str) -> Result<T> {
    f.ok_or_else(|| Error::new(ErrorKind::Unavailable, format!("the HCCL library lacks {name}")))
}
