//! One direction of a pair: a single-producer ring of slots in the shared segment, its control
//! block (head, tail, futex words, descriptor acknowledgements, the producer's core) and the slot
//! header that carries a frame's header in one cache line.

use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use super::*;
use crate::transport::wait::futex_wake;
use crate::wire::{self, HEADER_LEN};

/// One direction of a pair: a view into the segment.
#[derive(Clone, Copy)]
pub(super) struct Ring {
    pub(super) base: *mut u8,
}

impl Ring {
    pub(super) fn word64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is an 8-byte aligned offset inside the control block of a live mapping
        // (the mapping is page aligned); shared memory is only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.base.add(off).cast()) }
    }
    pub(super) fn word32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in `word64`, 4-byte aligned.
        unsafe { AtomicU32::from_ptr(self.base.add(off).cast()) }
    }
    /// Slots published by the producer.
    pub(super) fn head(&self) -> &AtomicU64 {
        self.word64(0)
    }
    /// Slots consumed by the consumer.
    pub(super) fn tail(&self) -> &AtomicU64 {
        self.word64(64)
    }
    /// Bumped when a slot is published and a consumer sleeps; the consumer's futex.
    pub(super) fn data_word(&self) -> &AtomicU32 {
        self.word32(128)
    }
    pub(super) fn data_sleepers(&self) -> &AtomicU32 {
        self.word32(132)
    }
    /// Bumped when a slot is freed and the producer sleeps; the producer's futex.
    pub(super) fn space_word(&self) -> &AtomicU32 {
        self.word32(192)
    }
    pub(super) fn space_sleepers(&self) -> &AtomicU32 {
        self.word32(196)
    }
    /// Descriptors the consumer has finished with (read, or found withdrawn): the producer's
    /// buffers up to there are free again.
    pub(super) fn cma_done(&self) -> &AtomicU64 {
        self.word64(256)
    }
    /// Bumped when a descriptor is finished and the producer sleeps; the producer's futex.
    pub(super) fn ack_word(&self) -> &AtomicU32 {
        self.word32(272)
    }
    pub(super) fn ack_sleepers(&self) -> &AtomicU32 {
        self.word32(276)
    }
    /// The core the producer last said it runs on (u32::MAX: not yet), when the host's ranks
    /// outnumber its cores (see placement.rs).
    pub(super) fn cpu_word(&self) -> &AtomicU32 {
        self.word32(CPU_AT)
    }
    /// Entry `i` of the producer's table of remote hosts heard (vouch.rs).
    pub(super) fn heard_word(&self, i: usize) -> &AtomicU64 {
        self.word64(HEARD_AT + (i % vouch::SLOTS) * 8)
    }
    /// Descriptor `n`'s state: `n << 2 | POSTED`, `READING` or `WITHDRAWN`. Both sides change
    /// it with compare-and-swap, so exactly one wins: the reader, which then reads, or the sender
    /// withdrawing it, after which the reader skips it.
    pub(super) fn cma_state(&self, n: u64) -> &AtomicU64 {
        self.word64(CMA_STATES_AT + (n % CMA_STATES) as usize * 8)
    }
    /// Records descriptor `n` as finished and wakes a producer waiting for it.
    pub(super) fn acknowledge(&self, n: u64) {
        self.cma_done().store(n + 1, Ordering::SeqCst);
        if self.ack_sleepers().load(Ordering::SeqCst) > 0 {
            self.ack_word().fetch_add(1, Ordering::SeqCst);
            futex_wake(self.ack_word());
        }
    }
    pub(super) fn slot(&self, n: u64) -> *mut u8 {
        // SAFETY: the index is reduced modulo SLOTS, so the slot lies inside this ring.
        unsafe { self.base.add(CTRL + (n % SLOTS) as usize * SLOT_BYTES) }
    }
    /// Publishes slot `n` (the next one) and wakes a sleeping consumer.
    pub(super) fn publish(&self, n: u64) {
        self.head().store(n + 1, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.data_sleepers().load(Ordering::Relaxed) > 0 {
            self.data_word().fetch_add(1, Ordering::SeqCst);
            futex_wake(self.data_word());
        }
    }
    /// Frees slot `n` (the oldest) and wakes a sleeping producer.
    pub(super) fn release(&self, n: u64) {
        self.tail().store(n + 1, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.space_sleepers().load(Ordering::Relaxed) > 0 {
            self.space_word().fetch_add(1, Ordering::SeqCst);
            futex_wake(self.space_word());
        }
    }
    /// Reads slot `n`'s header: the frame header if it is a first piece, the piece length, and
    /// whether the piece is a descriptor.
    pub(super) fn piece(&self, n: u64) -> (Option<[u8; HEADER_LEN]>, usize, bool) {
        let p = self.slot(n);
        let mut head = [0u8; INLINE_AT];
        // SAFETY: the slot was published to us (Acquire on its sequence word or on head); we own
        // it until release.
        unsafe { std::ptr::copy_nonoverlapping(p, head.as_mut_ptr(), INLINE_AT) };
        let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
        let first = head[1] & FIRST != 0;
        // Rebuild the wire header: magic and version are implied, epoch and reserved words zero.
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&wire::MAGIC.to_le_bytes());
        h[4..6].copy_from_slice(&wire::VERSION.to_le_bytes());
        h[6] = head[0];
        h[8..16].copy_from_slice(&head[8..16]);
        h[24..36].copy_from_slice(&head[16..28]);
        h[40..44].copy_from_slice(&head[28..32]);
        h[48..64].copy_from_slice(&head[32..48]);
        (first.then_some(h), len.min(SLOT_DATA), head[1] & CMA != 0)
    }
    /// Slot `n`'s payload: in the header's cache line when it is small enough.
    pub(super) fn data(&self, n: u64, len: usize) -> &[u8] {
        let at = if len <= INLINE { INLINE_AT } else { SLOT_HEAD };
        // SAFETY: the slot is ours until released (see `piece`); len <= SLOT_DATA, or <= INLINE
        // at INLINE_AT, inside the slot header.
        unsafe { std::slice::from_raw_parts(self.slot(n).add(at), len) }
    }
    pub(super) fn write(&self, n: u64, head: Option<&[u8; HEADER_LEN]>, flags: u8, data: &[u8]) {
        let p = self.slot(n);
        let mut sh = [0u8; SEQ_AT];
        if let Some(h) = head {
            sh[0] = h[6];
            sh[1] = FIRST | flags;
            sh[8..16].copy_from_slice(&h[8..16]);
            sh[16..28].copy_from_slice(&h[24..36]);
            // Frame lengths are at most MAX_CHUNK_BYTES (or a descriptor's few bytes).
            sh[28..32].copy_from_slice(&h[40..44]);
            sh[32..48].copy_from_slice(&h[48..64]);
        }
        sh[4..8].copy_from_slice(&(data.len() as u32).to_le_bytes());
        if data.len() <= INLINE {
            sh[INLINE_AT..INLINE_AT + data.len()].copy_from_slice(data);
        }
        // SAFETY: the slot is free (tail passed it) and only this producer writes it; data fits.
        unsafe {
            std::ptr::copy_nonoverlapping(sh.as_ptr(), p, SEQ_AT);
            if data.len() > INLINE {
                std::ptr::copy_nonoverlapping(data.as_ptr(), p.add(SLOT_HEAD), data.len());
            }
        }
        self.seq(n).store(n + 1, Ordering::Release);
        // The consumer reads the header line next (and a small payload): see `demote`.
        demote(p);
        if data.len() > INLINE {
            demote_small(p.wrapping_add(SLOT_HEAD), data.len());
        }
    }

    /// Slot `n`'s sequence word: `n + 1` once slot `n` is published. A consumer polls this
    /// (the line it reads next anyway) rather than `head`, one cache miss less per frame.
    pub(super) fn seq(&self, n: u64) -> &AtomicU64 {
        // SAFETY: SEQ_AT is 8-byte aligned inside the slot header (slots are 64-byte aligned).
        unsafe { AtomicU64::from_ptr(self.slot(n).add(SEQ_AT).cast()) }
    }
    /// True when slot `n` has been published (Acquire: its contents are visible).
    pub(super) fn ready(&self, n: u64, order: Ordering) -> bool {
        self.seq(n).load(order) == n + 1
    }
}
