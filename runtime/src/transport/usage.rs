//! What this process's transport holds and sends, for `hccn-info`'s resource report: counters
//! kept where the resources are made, read without stopping anything.

use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of shared memory this process has mapped (rings, boards), as mapped, not as touched.
static SHM_MAPPED: AtomicU64 = AtomicU64::new(0);
/// Heartbeat frames and pulse datagrams this process has sent since it started.
static HEARTBEATS: AtomicU64 = AtomicU64::new(0);

pub(crate) fn mapped(bytes: usize) {
    SHM_MAPPED.fetch_add(bytes as u64, Ordering::Relaxed);
}

pub(crate) fn unmapped(bytes: usize) {
    SHM_MAPPED.fetch_sub(bytes as u64, Ordering::Relaxed);
}

pub(crate) fn heartbeats_sent(n: usize) {
    HEARTBEATS.fetch_add(n as u64, Ordering::Relaxed);
}

/// What this process holds for its worlds now, and what it has sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Open connections to peers (of the world this was asked of).
    pub connections: usize,
    /// Shared memory mapped by the whole process, in bytes.
    pub shm_mapped: u64,
    /// Heartbeat frames and pulses sent by the whole process since it started; sample twice for
    /// a rate.
    pub heartbeats_sent: u64,
}

pub(crate) fn now(connections: usize) -> Usage {
    Usage {
        connections,
        shm_mapped: SHM_MAPPED.load(Ordering::Relaxed),
        heartbeats_sent: HEARTBEATS.load(Ordering::Relaxed),
    }
}
