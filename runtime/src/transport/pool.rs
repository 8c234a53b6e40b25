//! Payload buffers of received frames, reused. A fresh pipeline-chunk allocation per frame
//! (512 KiB by default) is an mmap, a page fault per 4 KiB and an munmap; a small one is a
//! trip through malloc per message. A bounded pool of recently freed buffers makes the steady
//! state allocate nothing at any size.

use crate::sync::Locked;
use std::sync::Mutex;

/// Bytes the pool may hold in large buffers (a few chunks in flight per peer).
const MAX_POOLED_BYTES: usize = 32 << 20;
/// Buffers up to this size come in power-of-two classes from `SMALL_MIN` bytes; larger ones
/// are kept whole, each fitting requests down to half its size.
const SMALL_MAX: usize = 64 << 10;
const SMALL_MIN: usize = 64;
const SMALL_CLASSES: usize = (SMALL_MAX / SMALL_MIN).trailing_zeros() as usize + 1;
/// Buffers kept per small class (frames in flight from every peer at once): at most 4 MiB in
/// all.
const SMALL_PER_CLASS: usize = 32;

struct Pool {
    free: Vec<Vec<u8>>,
    bytes: usize,
    small: [Vec<Vec<u8>>; SMALL_CLASSES],
}

static POOL: Mutex<Pool> = Mutex::new(Pool::new());

/// An empty buffer with room for `len` bytes.
pub(crate) fn take(len: usize) -> Vec<u8> {
    if len == 0 {
        return Vec::new();
    }
    let found = POOL.locked().take(len);
    // A fresh allocation happens outside the lock.
    found.unwrap_or_else(|| Vec::with_capacity(if len <= SMALL_MAX { small_class(len).1 } else { len }))
}

/// Returns a buffer whose contents are no longer needed.
pub(crate) fn give(buf: Vec<u8>) {
    // A buffer not kept is freed outside the lock.
    let not_kept = POOL.locked().give(buf);
    drop(not_kept);
}

/// The class of a small buffer of `len` bytes, and its capacity.
fn small_class(len: usize) -> (usize, usize) {
    let cap = len.max(SMALL_MIN).next_power_of_two();
    ((cap / SMALL_MIN).trailing_zeros() as usize, cap)
}

impl Pool {
    const fn new() -> Self {
        Pool { free: Vec::new(), bytes: 0, small: [const { Vec::new() }; SMALL_CLASSES] }
    }

    /// A kept buffer with room for `len` (> 0) bytes, if there is one.
    fn take(&mut self, len: usize) -> Option<Vec<u8>> {
        if len <= SMALL_MAX {
            return self.small[small_class(len).0].pop();
        }
        let i = self.free.iter().position(|b| b.capacity() >= len && b.capacity() <= 2 * len)?;
        let buf = self.free.swap_remove(i);
        self.bytes -= buf.capacity();
        Some(buf)
    }

    /// Keeps `buf` for a later `take`, or hands it back when the pool is full or it fits no
    /// class (only buffers of a class's exact size, those `take` makes, serve its requests).
    fn give(&mut self, mut buf: Vec<u8>) -> Option<Vec<u8>> {
        let cap = buf.capacity();
        buf.clear();
        if cap <= SMALL_MAX {
            let (class, class_cap) = small_class(cap);
            let list = &mut self.small[class];
            if cap != class_cap || list.len() >= SMALL_PER_CLASS {
                return Some(buf);
            }
            list.push(buf);
        } else {
            if self.bytes + cap > MAX_POOLED_BYTES {
                return Some(buf);
            }
            self.bytes += cap;
            self.free.push(buf);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reuses_fitting_large_buffers_within_its_bound() {
        let mut pool = Pool::new();
        let a = Vec::with_capacity((3 << 20) + 17);
        let ptr = a.as_ptr();
        assert!(pool.give(a).is_none());
        assert!(pool.take(100 << 10).is_none(), "far too large a buffer for the request is not handed out");
        let b = pool.take((3 << 20) + 17).expect("the freed buffer comes back");
        assert_eq!(b.as_ptr(), ptr);
        assert!(b.is_empty() && pool.bytes == 0);
        for _ in 0..MAX_POOLED_BYTES / (3 << 20) {
            assert!(pool.give(Vec::with_capacity(3 << 20)).is_none());
        }
        assert!(pool.give(Vec::with_capacity(3 << 20)).is_some(), "the pool is full");
        assert!(pool.bytes <= MAX_POOLED_BYTES);
    }

    #[test]
    fn small_buffers_come_back_by_class_and_stay_bounded() {
        assert_eq!((take(0).capacity(), take(1).capacity(), take(5000).capacity()), (0, SMALL_MIN, 8192));
        assert_eq!(take(SMALL_MAX).capacity(), SMALL_MAX);
        let mut pool = Pool::new();
        let a = Vec::with_capacity(8192);
        let ptr = a.as_ptr();
        assert!(pool.give(a).is_none());
        assert!(pool.take(8193).is_none() && pool.take(4096).is_none(), "other classes are apart");
        assert_eq!(pool.take(4097).map(|b| b.as_ptr()), Some(ptr), "any request of the class gets it");
        assert!(pool.give(Vec::with_capacity(3000)).is_some(), "a buffer of no class's size is not kept");
        for _ in 0..SMALL_PER_CLASS {
            assert!(pool.give(Vec::with_capacity(32 << 10)).is_none());
        }
        assert!(pool.give(Vec::with_capacity(32 << 10)).is_some(), "the class is full");
    }
}
