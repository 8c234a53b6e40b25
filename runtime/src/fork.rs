//! Forked children. A child gets a copy of its parent's memory but none of its threads, and
//! shares its parent's sockets and shared memory: a communicator, stream or link made before the
//! fork is the parent's. Used from the child it would send on the parent's connections (the peer
//! takes the child's data as the parent's) and wait for progress threads that do not exist there;
//! torn down it would close the parent's links under it. So everything records the fork
//! generation it was made in, and the child refuses to use what it inherited and lets go of it
//! without touching it (as NCCL and CUDA refuse a context across fork). A child may start a job
//! of its own: process-wide state keyed by the generation (the progress engine, this process's
//! incarnation) starts afresh there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use crate::error::{Error, Result};

static FORKS: AtomicU64 = AtomicU64::new(0);
static WATCH: Once = Once::new();

/// Called in the child by fork(): only an atomic add (async-signal-safe).
extern "C" fn in_child() {
    FORKS.fetch_add(1, Ordering::SeqCst);
}

/// How many forks lie between the first process that used hccn and this one (0 there).
pub fn generation() -> u64 {
    // SAFETY: registers a handler that only adds to an atomic, once per process (the
    // registration is inherited by children).
    WATCH.call_once(|| unsafe {
        libc::pthread_atfork(None, None, Some(in_child));
    });
    FORKS.load(Ordering::SeqCst)
}

/// An error unless `made_in` (the generation a `what` was made in) is this process's.
pub fn check(made_in: u64, what: &str) -> Result<()> {
    if made_in == generation() {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "this {what} was made before this process (pid {}) was forked from its parent: a forked child cannot use \
         its parent's {what}s (their connections and threads belong to the parent); make the child's own, e.g. with \
         hccn_init_from_env or hccn_comm_init_rank, or fork before hccn is initialised",
        std::process::id()
    )))
}
