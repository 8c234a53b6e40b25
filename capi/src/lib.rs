//! hccn's C ABI (docs/c-api.md). Every exported body runs inside [`ffi::guard`]; pointers become Rust
//! values only through `ffi`; the runtime does the work. `include/hccn.h` is generated from this
//! crate by cbindgen (see `tests/header.rs`).

#![allow(clippy::missing_safety_doc)] // The safety contract of every function is docs/c-api.md.

mod collectives;
mod comm;
mod error;
mod ffi;
mod fusion;
mod mem;
mod stream;
pub mod types;

use std::ffi::c_char;

pub use collectives::*;
pub use comm::*;
pub use fusion::*;
pub use mem::*;
pub use stream::*;
pub use types::*;

use hccn_runtime::{Config, Result};

/// Reads the configuration and starts logging (HCCN_LOG) on first use.
pub(crate) fn config() -> Result<Config> {
    let cfg = Config::from_env()?;
    hccn_runtime::log::init(&cfg);
    #[cfg(feature = "etcd")]
    hccn_recovery::install();
    hccn_backend_hccl::install();
    Ok(cfg)
}

/// A static description of `code`; never NULL.
#[no_mangle]
pub extern "C" fn hccn_get_error_string(code: hccn_result) -> *const c_char {
    error::describe(code).as_ptr()
}

/// This thread's message for its last failing call; never NULL, "" when none.
#[no_mangle]
pub extern "C" fn hccn_get_last_error() -> *const c_char {
    error::last_ptr()
}

/// MAJOR*10000 + MINOR*100 + PATCH.
#[no_mangle]
pub unsafe extern "C" fn hccn_get_version(version: *mut i32) -> hccn_result {
    ffi::guard(|| {
        let out = ffi::out_ptr(version, "version")?;
        ffi::write(out, hccn_runtime::version());
        ffi::ok()
    })
}
