//! Shareable host memory (after NCCL's `ncclMemAlloc`): buffers that ranks of one host read from
//! each other with plain loads rather than a `process_vm_readv` per transfer. Conventions:
//! docs/c-api.md, "Shareable buffers".

use std::ffi::c_void;

use hccn_runtime::{mem, Error};

use crate::ffi::{guard, ok, out_ptr, write};
use crate::types::hccn_result;

/// Allocates `size` zeroed bytes of shareable memory into `*ptr`; free with `hccn_mem_free`.
#[no_mangle]
pub unsafe extern "C" fn hccn_mem_alloc(ptr: *mut *mut c_void, size: u64) -> hccn_result {
    guard(|| {
        let out = out_ptr(ptr, "ptr")?;
        let len = usize::try_from(size).map_err(|_| Error::invalid(format!("size {size} does not fit in memory")))?;
        write(out, mem::alloc(len)?.as_ptr().cast());
        ok()
    })
}

/// Frees what `hccn_mem_alloc` returned; NULL is a no-op. No operation may still use it.
#[no_mangle]
pub unsafe extern "C" fn hccn_mem_free(ptr: *mut c_void) -> hccn_result {
    guard(|| {
        if ptr.is_null() {
            return ok();
        }
        // SAFETY: the caller promises no operation still uses the memory (API contract);
        // anything that is not a live allocation is refused without touching it.
        unsafe { mem::free(ptr.cast()) }?;
        ok()
    })
}
