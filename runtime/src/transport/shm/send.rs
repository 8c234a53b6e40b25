//! The sending side of the rings: frames into slots, descriptors, and waiting for (or
//! withdrawing) what the peer has yet to read.

use crate::sync::Locked;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::*;
use crate::transport::wait::{futex_wait, NAP};

impl Shm {
    /// Writes one frame to `dst`'s ring, waiting for room as long as `dst` is healthy.
    pub fn send(&self, dst: u32, hdr: &FrameHeader, payload: &[u8], inbox: &Inbox, timeout: Duration) -> Result<()> {
        self.put(dst, hdr, payload, false, inbox, timeout).map(|_| ())
    }

    /// Writes a descriptor of `payload` to `dst`'s ring (see [`Shm::cma`]): `dst` reads the
    /// payload from this process's memory, which must stay unchanged until [`Shm::wait_sent`]
    /// returns or [`Shm::withdraw`] has withdrawn it. Returns the descriptor's number, or `None`
    /// when `dst` has left and will read nothing.
    pub fn send_desc(
        &self,
        dst: u32,
        hdr: &FrameHeader,
        payload: &[u8],
        inbox: &Inbox,
        timeout: Duration,
    ) -> Result<Option<u64>> {
        if !self.cma(dst) {
            return Err(Error::internal(format!("no single-copy path to {dst}")));
        }
        self.put(dst, hdr, payload, true, inbox, timeout)
    }

    /// Writes `payload` (or, with `desc`, a descriptor of it) to `dst`'s ring; returns the
    /// descriptor's number when one was written.
    fn put(
        &self,
        dst: u32,
        hdr: &FrameHeader,
        payload: &[u8],
        desc: bool,
        inbox: &Inbox,
        timeout: Duration,
    ) -> Result<Option<u64>> {
        let Some(p) = self.peer(dst) else { return Err(Error::internal(format!("no shared memory to {dst}"))) };
        let head = hdr.encode();
        let mut tx = p.tx_lock.locked();
        let tx = &mut *tx;
        let region = if desc { crate::mem::find(payload.as_ptr() as usize, payload.len()) } else { None };
        let d = Desc { addr: payload.as_ptr() as u64, len: payload.len() as u64, index: tx.posted, region };
        if desc {
            // Visible to the reader with the slot (published with Release). The state of
            // descriptor `index - CMA_STATES` is free: that one was acknowledged (see CMA_STATES).
            p.tx.cma_state(d.index).store(d.index << 2 | POSTED, Ordering::Relaxed);
        }
        let mut encoded = [0u8; Desc::IN_REGION];
        let n = if desc { d.encode(&mut encoded) } else { 0 };
        let (payload, flags) = if desc { (&encoded[..n], CMA) } else { (payload, 0) };
        let ring = &p.tx;
        let mut n = ring.head().load(Ordering::Relaxed);
        let mut off = 0usize;
        let mut deadline: Option<Instant> = None;
        let mut backoff = self.backoff();
        let mut gen = inbox.generation();
        loop {
            if n - tx.tail >= SLOTS {
                tx.tail = ring.tail().load(Ordering::Acquire);
            }
            if n - tx.tail >= SLOTS {
                // Full: wait for the consumer, and meanwhile keep our own rings moving.
                if backoff.step() {
                    self.drain(None, inbox);
                    let seen = ring.space_word().load(Ordering::SeqCst);
                    ring.space_sleepers().fetch_add(1, Ordering::SeqCst);
                    if n - ring.tail().load(Ordering::SeqCst) >= SLOTS {
                        futex_wait(ring.space_word(), seen, NAP);
                    }
                    ring.space_sleepers().fetch_sub(1, Ordering::SeqCst);
                }
                let g = inbox.generation();
                if g != gen {
                    gen = g;
                    if let Some(reason) = inbox.failed_reason(dst) {
                        return Err(Error::rank_failed(vec![dst], format!("world rank {dst} failed: {reason}")));
                    }
                    if inbox.has_departed(dst) {
                        // As over TCP, where the bytes would sit in a socket buffer: the peer
                        // left on purpose and will read nothing; the rest of the frame is void.
                        return Ok(None);
                    }
                }
                let d = *deadline.get_or_insert_with(|| Instant::now() + timeout);
                if backoff.sleeping() && Instant::now() >= d {
                    return Err(Error::timeout(format!(
                        "sending to world rank {dst} made no progress (shared memory full, HCCN_TIMEOUT_MS)"
                    )));
                }
                continue;
            }
            backoff.reset();
            let piece = &payload[off..(off + SLOT_DATA).min(payload.len())];
            ring.write(n, (off == 0).then_some(&head), flags, piece);
            ring.publish(n);
            n += 1;
            off += piece.len();
            if off >= payload.len() {
                if !desc {
                    return Ok(None);
                }
                tx.posted += 1;
                return Ok(Some(d.index));
            }
        }
    }

    /// Waits until `dst` has read every descriptor up to number `index` (its acknowledgement),
    /// keeping the other rings moving meanwhile. Ends early, withdrawing descriptor `index` if
    /// `dst` has not begun to read it, when `dst` fails or leaves, `status` gives the
    /// communicator's error, or the deadline passes.
    pub fn wait_sent(
        &self,
        dst: u32,
        index: u64,
        inbox: &Inbox,
        timeout: Duration,
        status: &dyn Fn(&Health<'_>) -> Option<Error>,
    ) -> Result<()> {
        let Some(p) = self.peer(dst) else { return Err(Error::internal(format!("no shared memory to {dst}"))) };
        let ring = &p.tx;
        let deadline = Instant::now() + timeout;
        let mut backoff = self.backoff();
        let mut gen = u64::MAX;
        loop {
            if ring.cma_done().load(Ordering::Acquire) > index {
                return Ok(());
            }
            let g = inbox.generation();
            if g != gen {
                gen = g;
                if inbox.health_changes() != 0 {
                    if let Some(reason) = inbox.failed_reason(dst) {
                        // Declared failed may still mean frozen: it must not read on if it wakes.
                        self.withdraw(dst, index, inbox, timeout);
                        return Err(Error::rank_failed(vec![dst], format!("world rank {dst} failed: {reason}")));
                    }
                    let ended = inbox.health(|h| status(h));
                    if ended.is_some() || inbox.has_departed(dst) {
                        self.withdraw(dst, index, inbox, timeout);
                        return ended.map_or(Ok(()), Err);
                    }
                }
            }
            if backoff.step() {
                if Instant::now() >= deadline {
                    self.withdraw(dst, index, inbox, timeout);
                    return Err(Error::timeout(format!(
                        "world rank {dst} did not read this rank's data within {} ms (HCCN_TIMEOUT_MS)",
                        timeout.as_millis()
                    )));
                }
                // The receiver may itself wait for a ring of ours to move before it reads.
                self.drain(None, inbox);
                let seen = ring.ack_word().load(Ordering::SeqCst);
                ring.ack_sleepers().fetch_add(1, Ordering::SeqCst);
                if ring.cma_done().load(Ordering::SeqCst) <= index && inbox.generation() == gen {
                    futex_wait(ring.ack_word(), seen, NAP);
                }
                ring.ack_sleepers().fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Withdraws descriptor `index` to `dst` unless it has begun to read it, and then waits for
    /// the read to end: afterwards `dst` no longer touches its buffer.
    pub fn withdraw(&self, dst: u32, index: u64, inbox: &Inbox, timeout: Duration) {
        let Some(p) = self.peer(dst) else { return };
        let ring = &p.tx;
        let state = ring.cma_state(index);
        let posted = index << 2 | POSTED;
        if state.compare_exchange(posted, index << 2 | WITHDRAWN, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            return;
        }
        // Being read, or finished (its state may already belong to a later descriptor).
        let mut backoff = self.backoff();
        let deadline = Instant::now() + timeout;
        loop {
            if ring.cma_done().load(Ordering::SeqCst) > index {
                return;
            }
            // A reader that died or froze mid-read never ends it: its failure ends the wait.
            if backoff.step() {
                if inbox.peer_gone(dst).is_some() {
                    return;
                }
                if Instant::now() >= deadline {
                    tracing::warn!(dst, "world rank {dst} is still reading withdrawn data");
                    return;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
}
