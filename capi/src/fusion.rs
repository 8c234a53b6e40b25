//! Fusion buckets of docs/c-api.md: handles over the runtime's [`Bucket`]. Conventions (same counts on
//! every rank, buffer lifetimes, destroy does not flush): docs/c-api.md.

use hccn_runtime::sync::Locked;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use hccn_runtime::backend::FusedBucket;
use hccn_runtime::{AnyStream, DataType, Error, Ptr, ReduceOp, Result};

use crate::comm::COMMS;
use crate::ffi::{guard, ok, out_ptr, write, Table};
use crate::stream::STREAMS;
use crate::types::{hccn_bucket, hccn_comm, hccn_datatype, hccn_reduce_op, hccn_result, hccn_stream};

/// A bucket and the handle of the communicator it was made on.
struct CBucket {
    bucket: Box<dyn FusedBucket>,
    comm: usize,
}

static BUCKETS: Table<Mutex<CBucket>> = Table::new("bucket");

/// Runs `f` on the live bucket behind `bucket` with the optional stream, once its communicator
/// is known to be live: a bucket must not outlive the communicator handle it was made on.
fn with_bucket(
    bucket: *mut hccn_bucket,
    stream: *mut hccn_stream,
    f: impl FnOnce(&mut dyn FusedBucket, Option<&AnyStream>) -> Result<()>,
) -> hccn_result {
    guard(|| {
        let b: Arc<Mutex<CBucket>> = BUCKETS.get(bucket, "bucket")?;
        let s = if stream.is_null() { None } else { Some(STREAMS.get(stream, "stream")?) };
        let mut b = b.locked();
        COMMS
            .get(b.comm as *const hccn_comm, "the bucket's communicator")
            .map_err(|e| Error::invalid(format!("{} (destroy buckets before their communicator)", e.message())))?;
        f(b.bucket.as_mut(), s.as_deref())?;
        ok()
    })
}

/// A bucket that fuses allreduces of `dt` with `op` over `comm`, packing up to `capacity_bytes`.
#[no_mangle]
pub unsafe extern "C" fn hccn_bucket_create(
    comm: *mut hccn_comm,
    capacity_bytes: u64,
    dt: hccn_datatype,
    op: hccn_reduce_op,
    bucket: *mut *mut hccn_bucket,
) -> hccn_result {
    guard(|| {
        let out = out_ptr(bucket, "bucket")?;
        let c = COMMS.get(comm, "comm")?;
        let (dt, op) = (DataType::from_raw(dt)?, ReduceOp::from_raw(op)?);
        let b = c.bucket(capacity_bytes, dt, op)?;
        write(out, BUCKETS.insert(Mutex::new(CBucket { bucket: b, comm: comm as usize })));
        ok()
    })
}

/// Adds `count` elements at `buf`; may flush. `buf` belongs to the library until the flush that
/// covers it has completed.
#[no_mangle]
pub unsafe extern "C" fn hccn_bucket_add(
    bucket: *mut hccn_bucket,
    buf: *mut c_void,
    count: u64,
    stream: *mut hccn_stream,
) -> hccn_result {
    // SAFETY: the C caller promises `buf` as docs/c-api.md describes (valid until the flush
    // that covers it completes; device memory on the HCCL backend).
    with_bucket(bucket, stream, |b, s| unsafe { b.add(Ptr::from_mut(buf), count, s) })
}

/// Allreduces what is pending (nothing pending: success, no communication).
#[no_mangle]
pub unsafe extern "C" fn hccn_bucket_flush(bucket: *mut hccn_bucket, stream: *mut hccn_stream) -> hccn_result {
    with_bucket(bucket, stream, |b, s| b.flush(s))
}

/// Frees a bucket; NULL is a no-op. Local, so it does not flush: pending tensors are dropped
/// (flushes already queued on a stream still run).
#[no_mangle]
pub unsafe extern "C" fn hccn_bucket_destroy(bucket: *mut hccn_bucket) -> hccn_result {
    guard(|| {
        if !bucket.is_null() {
            BUCKETS.remove(bucket, "bucket")?;
        }
        ok()
    })
}
