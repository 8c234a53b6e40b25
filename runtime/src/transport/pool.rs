//! Payload buffers of received TCP frames, reused. A fresh pipeline-chunk allocation per frame
//! (512 KiB by default) is an mmap, a page fault per 4 KiB and an munmap; a bounded pool of
//! recently freed buffers makes the steady state allocate nothing.

use std::sync::Mutex;

/// Bytes the pool may hold in all (a few chunks in flight per peer).
const MAX_POOLED_BYTES: usize = 32 << 20;
/// Smaller buffers come cheaply from malloc's own free lists.
const MIN_POOLED: usize = 64 << 10;

struct Pool {
    free: Vec<Vec<u8>>,
    bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool { free: Vec::new(), bytes: 0 });

/// An empty buffer with room for `len` bytes.
pub(crate) fn take(len: usize) -> Vec<u8> {
    if len >= MIN_POOLED {
        let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = pool.free.iter().position(|b| b.capacity() >= len && b.capacity() <= 2 * len) {
            let buf = pool.free.swap_remove(i);
            pool.bytes -= buf.capacity();
            return buf;
        }
    }
    Vec::with_capacity(len)
}

/// Returns a buffer whose contents are no longer needed.
pub(crate) fn give(mut buf: Vec<u8>) {
    if buf.capacity() < MIN_POOLED {
        return;
    }
    buf.clear();
    let mut pool = POOL.lock().unwrap_or_else(|p| p.into_inner());
    if pool.bytes + buf.capacity() <= MAX_POOLED_BYTES {
        pool.bytes += buf.capacity();
        pool.free.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_fitting_buffers_within_its_bound() {
        let a = take((3 << 20) + 17);
        let ptr = a.as_ptr();
        give(a);
        let b = take((3 << 20) + 17);
        assert_eq!(b.as_ptr(), ptr, "the freed buffer comes back");
        assert!(b.is_empty() && b.capacity() >= 3 << 20);
        // Far too large a buffer for the request is not handed out.
        give(b);
        assert!(take(100 << 10).capacity() < 3 << 20);
        let small = take(100);
        give(small);
        let held = POOL.lock().map(|p| p.bytes).unwrap_or(usize::MAX);
        assert!(held <= MAX_POOLED_BYTES);
    }
}
