//! Communicator functions of docs/c-api.md: creation, queries, groups, destruction and failures.

use hccn_runtime::{backend, BackendComm, Error, LaunchEnv, UniqueId};

use crate::ffi::{self, guard, ok, out_ptr, write, Table};
use crate::types::{hccn_comm, hccn_result, hccn_unique_id, HCCN_SUCCESS};

pub(crate) static COMMS: Table<Box<dyn BackendComm>> = Table::new("communicator");

/// A program that exits without destroying its communicators is a failure to its peers, as a
/// crash is: they learn it from the closed connections at once (docs/c-api.md: destroy to leave).
fn register(out: *mut *mut hccn_comm, comm: Box<dyn BackendComm>) {
    write(out, COMMS.insert(comm));
}

/// Creates an id on this rank (and the store it leads to); share its bytes out of band.
#[no_mangle]
pub unsafe extern "C" fn hccn_get_unique_id(id: *mut hccn_unique_id) -> hccn_result {
    guard(|| {
        let out = out_ptr(id, "id")?;
        let uid = hccn_runtime::new_unique_id(&crate::config()?)?;
        write(out, hccn_unique_id { internal: uid.to_bytes() });
        ok()
    })
}

/// Joins the communicator of `nranks` that `id` describes, as `rank`.
#[no_mangle]
pub unsafe extern "C" fn hccn_comm_init_rank(
    comm: *mut *mut hccn_comm,
    nranks: u32,
    id: *const hccn_unique_id,
    rank: u32,
) -> hccn_result {
    guard(|| {
        let out = out_ptr(comm, "comm")?;
        if id.is_null() {
            return Err(Error::null("id is NULL"));
        }
        // SAFETY: non-NULL; the caller passes a hccn_unique_id (docs/c-api.md).
        let bytes = unsafe { (*id).internal };
        let uid = UniqueId::from_bytes(&bytes)?;
        let c = backend::init_rank(&uid, nranks, rank, &crate::config()?)?;
        register(out, c);
        ok()
    })
}

/// Joins the world described by HCCN_RANK, HCCN_WORLD_SIZE, HCCN_STORE, ... (as set by hccnrun).
#[no_mangle]
pub unsafe extern "C" fn hccn_init_from_env(comm: *mut *mut hccn_comm) -> hccn_result {
    guard(|| {
        let out = out_ptr(comm, "comm")?;
        let cfg = crate::config()?;
        let c = backend::init_from_env(&LaunchEnv::from_env()?, &cfg)?;
        register(out, c);
        ok()
    })
}

/// Frees a communicator once its queued operations are done; NULL is a no-op.
#[no_mangle]
pub unsafe extern "C" fn hccn_comm_destroy(comm: *mut hccn_comm) -> hccn_result {
    guard(|| {
        if comm.is_null() {
            return ok();
        }
        COMMS.remove(comm, "comm")?;
        ok()
    })
}

/// Fails everything pending on `comm` now, then frees it.
#[no_mangle]
pub unsafe extern "C" fn hccn_comm_abort(comm: *mut hccn_comm) -> hccn_result {
    guard(|| {
        // In a forked child the parent's communicator is let go of, never aborted.
        if let Some(c) = COMMS.remove(comm, "comm")? {
            c.abort();
        }
        ok()
    })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_comm_rank(comm: *const hccn_comm, rank: *mut u32) -> hccn_result {
    guard(|| {
        let out = out_ptr(rank, "rank")?;
        write(out, COMMS.get(comm, "comm")?.control().rank());
        ok()
    })
}

#[no_mangle]
pub unsafe extern "C" fn hccn_comm_size(comm: *const hccn_comm, size: *mut u32) -> hccn_result {
    guard(|| {
        let out = out_ptr(size, "size")?;
        write(out, COMMS.get(comm, "comm")?.control().size());
        ok()
    })
}

/// Called by every rank listed in `ranks` (and only by them), with the same list; the new rank is
/// the index in `ranks`. The members meet as the group is made: a list in another order on some
/// member fails on every member with HCCN_ERROR_MISMATCH naming the ranks; so do lists whose
/// members differ, naming both lists, once the members have waited 0.1 s for each other. A rank
/// that lists ranks which all leave it out fails at the deadline (HCCN_ERROR_TIMEOUT), saying that
/// the lists may differ.
#[no_mangle]
pub unsafe extern "C" fn hccn_new_group(
    comm: *mut hccn_comm,
    ranks: *const u32,
    nranks: u32,
    group: *mut *mut hccn_comm,
) -> hccn_result {
    guard(|| {
        let out = out_ptr(group, "group")?;
        let parent = COMMS.get(comm, "comm")?;
        if nranks == 0 {
            return Err(Error::invalid("nranks is 0: a group needs at least the calling rank"));
        }
        let list = ffi::array(ranks, nranks as usize, "ranks")?;
        register(out, parent.new_group(&list)?);
        ok()
    })
}

/// Collective over `comm`: ranks with the same color form a communicator ordered by (key, old
/// rank); a negative color gives `*out = NULL`.
#[no_mangle]
pub unsafe extern "C" fn hccn_comm_split(
    comm: *mut hccn_comm,
    color: i32,
    key: i32,
    out: *mut *mut hccn_comm,
) -> hccn_result {
    guard(|| {
        let out = out_ptr(out, "out")?;
        let parent = COMMS.get(comm, "comm")?;
        match parent.split(color, key)? {
            Some(c) => register(out, c),
            None => write(out, std::ptr::null_mut()),
        }
        ok()
    })
}

/// `*error` is HCCN_SUCCESS while the communicator is healthy, else the error that broke it.
#[no_mangle]
pub unsafe extern "C" fn hccn_comm_get_async_error(comm: *mut hccn_comm, error: *mut hccn_result) -> hccn_result {
    guard(|| {
        let out = out_ptr(error, "error")?;
        let code = match COMMS.get(comm, "comm")?.async_error() {
            Ok(()) => HCCN_SUCCESS,
            Err(e) => crate::types::result_of(e.kind()),
        };
        write(out, code);
        ok()
    })
}

/// Writes up to `capacity` failed ranks (this communicator's numbering, ascending) and their
/// total number in `*count`.
#[no_mangle]
pub unsafe extern "C" fn hccn_comm_failed_ranks(
    comm: *const hccn_comm,
    ranks: *mut u32,
    capacity: u32,
    count: *mut u32,
) -> hccn_result {
    guard(|| {
        let count = out_ptr(count, "count")?;
        if capacity > 0 && ranks.is_null() {
            return Err(Error::null("ranks is NULL but capacity is not 0"));
        }
        let failed = COMMS.get(comm, "comm")?.control().failed_ranks();
        for (i, r) in failed.iter().take(capacity as usize).enumerate() {
            // SAFETY: i < capacity, and the caller promises `capacity` writable elements.
            write(unsafe { ranks.add(i) }, *r);
        }
        write(count, failed.len() as u32);
        ok()
    })
}

/// Every member's pending and later operations on `comm` fail with HCCN_ERROR_REVOKED.
#[no_mangle]
pub unsafe extern "C" fn hccn_comm_revoke(comm: *mut hccn_comm) -> hccn_result {
    guard(|| {
        COMMS.get(comm, "comm")?.control().revoke();
        ok()
    })
}

/// The communicator's epoch: 0 when created, +1 for each shrink.
#[no_mangle]
pub unsafe extern "C" fn hccn_comm_epoch(comm: *const hccn_comm, epoch: *mut u64) -> hccn_result {
    guard(|| {
        let out = out_ptr(epoch, "epoch")?;
        write(out, COMMS.get(comm, "comm")?.control().epoch());
        ok()
    })
}

/// Called by every survivor: agrees on the failed set in band and returns a communicator of the
/// survivors at the next epoch (dense ranks in old-rank order). `comm` stays valid (destroy it).
#[no_mangle]
pub unsafe extern "C" fn hccn_comm_shrink(comm: *mut hccn_comm, newcomm: *mut *mut hccn_comm) -> hccn_result {
    guard(|| {
        let out = out_ptr(newcomm, "newcomm")?;
        let c = COMMS.get(comm, "comm")?;
        register(out, c.shrink()?);
        ok()
    })
}

/// Called by every survivor: shrink, then admit the ranks waiting to join (processes that called
/// `hccn_init_from_env` for this job after it formed), waiting up to `timeout_ms` for a first one
/// when none is queued. Joiners get the ranks after the survivors, at the next epoch.
#[no_mangle]
pub unsafe extern "C" fn hccn_comm_rebuild(
    comm: *mut hccn_comm,
    timeout_ms: u32,
    newcomm: *mut *mut hccn_comm,
) -> hccn_result {
    guard(|| {
        let out = out_ptr(newcomm, "newcomm")?;
        let c = COMMS.get(comm, "comm")?;
        register(out, c.rebuild(std::time::Duration::from_millis(timeout_ms as u64))?);
        ok()
    })
}
