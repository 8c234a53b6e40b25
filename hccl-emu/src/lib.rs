//! **hccl-emu, a test double.** It exports the `Hccl*` and `acl*` functions that hccn's HCCL
//! backend uses, with their public C signatures, and implements them on hccn's native runtime:
//! host memory stands for device memory, an `aclrtStream` is a host queue (a native
//! `hccn_runtime::Stream`), `aclrtMemcpy` copies, and an `HcclRootInfo` carries a native unique
//! id. It checks arguments the way HCCL's headers document (data types per operation, NULL
//! pointers, ranks, a stream for every operation, a device bound on the calling thread), so
//! that the backend's own mapping is exercised. It is selected only by pointing
//! `HCCN_HCCL_LIB`/`HCCN_ACL_LIB` at it; it proves nothing about real HCCL performance or
//! device memory (docs/hccl.md).

#![allow(non_snake_case, non_camel_case_types, clippy::missing_safety_doc)]

mod acl;
mod hccl;
mod table;

pub use acl::*;
pub use hccl::*;
