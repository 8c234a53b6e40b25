//! Shared-memory links between ranks on one host. Each pair of such ranks shares one segment (a
//! /dev/shm file created by the lower rank, mapped by both, unlinked as soon as both have it)
//! holding two single-producer rings, one per direction. A ring is `SLOTS` slots of up to
//! `SLOT_DATA` bytes; a frame takes one slot (header + payload) or, when larger, several slots
//! that the receiver consumes as they fill, reducing or copying straight out of shared memory.
//!
//! The TCP connection to the same peer stays: it carries goodbyes, heartbeats, revokes and
//! agreement frames, and its end-of-file is still how a dead peer is noticed. Only collective and
//! point-to-point data frames travel here, matched exactly as in the [`Inbox`]: a receiver polls
//! the ring of the peer it waits for; a frame at the head of that ring that belongs to another
//! wait (another communicator, stream or sequence number) is moved to the inbox for it.
//!
//! Waits spin briefly (not at all when the host's ranks outnumber its cores), then yield, then
//! sleep on a futex in the shared page (woken by the other side, or after 1 ms to look at the
//! peer's health). A waiting sender or receiver also drains the other rings into the inbox, so
//! that ranks blocked on full rings in a cycle can never deadlock: as with TCP, a send always
//! completes eventually, whatever the receiver is doing.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Frame, Health, Inbox, Key};
use crate::config::{Config, Transport, MAX_CHUNK_BYTES};
use crate::error::{Error, ErrorKind, Result};
use crate::wire::{self, FrameHeader, FrameKind, HEADER_LEN};

/// Payload bytes per slot; a multiple of 16 so that pieces of a frame never split an element.
const SLOT_DATA: usize = 64 << 10;
/// Slot header: frame header, piece length, flags.
const SLOT_HEAD: usize = 64;
const SLOT_BYTES: usize = SLOT_HEAD + SLOT_DATA;
const SLOTS: u64 = 16;
/// Ring control block: head, tail, data futex, space futex, each on its own cache line.
const CTRL: usize = 256;
const RING_BYTES: usize = CTRL + SLOTS as usize * SLOT_BYTES;
const SEG_BYTES: usize = 2 * RING_BYTES;
/// A slot header (one cache line): the frame header without magic, version and reserved word
/// (0..38), flags (38), piece length (40..44), a payload of up to `INLINE` bytes (48..56), so
/// that the smallest frames cost the receiver one cache line, and the sequence word (56..64).
const INLINE_AT: usize = 48;
const INLINE: usize = 8;
const SEQ_AT: usize = 56;
/// First piece of a frame (its slot header carries the frame header).
const FIRST: u8 = 1;
/// How long a futex sleep lasts before the sleeper looks at health and the inbox again.
pub(super) const NAP: Duration = Duration::from_millis(1);
/// How long a waiter spins before it yields, when every local rank has a core.
const SPIN: Duration = Duration::from_micros(20);
/// How often a waiter yields before it sleeps, when the host's ranks outnumber its cores.
const OVERSUBSCRIBED_YIELDS: u32 = 100;
const OFFER_MAGIC: u32 = 0x5348_4d31; // "SHM1"

/// Identity of the host this process runs on: boot id, host name, and network and mount
/// namespaces (two namespace "hosts" on one machine are different hosts).
pub(crate) type HostId = [u8; 32];

pub(crate) fn host_id() -> HostId {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(std::fs::read("/proc/sys/kernel/random/boot_id").unwrap_or_default());
    let mut name = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length, which is what we pass.
    if unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0 {
        h.update(name);
    }
    for ns in ["/proc/self/ns/net", "/proc/self/ns/mnt", "/proc/self/ns/ipc"] {
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::metadata(ns).map(|m| m.ino()).unwrap_or(0);
        h.update(ino.to_le_bytes());
    }
    h.finalize().into()
}

/// A mapped segment; unmapped on drop (the other process keeps its own mapping).
pub(super) struct Segment {
    pub(super) ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access goes through atomics or through
// slots whose ownership the ring protocol hands from one side to the other.
unsafe impl Send for Segment {}
// SAFETY: as above.
unsafe impl Sync for Segment {}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing refers to it any more.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

impl Segment {
    pub(super) fn map(file: &std::fs::File, len: usize) -> std::io::Result<Segment> {
        // SAFETY: a fresh shared mapping of a file we hold open; checked for MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Segment { ptr: ptr.cast(), len })
    }
}

/// One direction of a pair: a view into the segment.
#[derive(Clone, Copy)]
struct Ring {
    base: *mut u8,
}

impl Ring {
    fn word64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is a cache-line offset inside the control block of a live mapping,
        // 8-byte aligned (the mapping is page aligned); shared memory is only accessed atomically.
        unsafe { AtomicU64::from_ptr(self.base.add(off).cast()) }
    }
    fn word32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in `word64`, 4-byte aligned.
        unsafe { AtomicU32::from_ptr(self.base.add(off).cast()) }
    }
    /// Slots published by the producer.
    fn head(&self) -> &AtomicU64 {
        self.word64(0)
    }
    /// Slots consumed by the consumer.
    fn tail(&self) -> &AtomicU64 {
        self.word64(64)
    }
    /// Bumped when a slot is published and a consumer sleeps; the consumer's futex.
    fn data_word(&self) -> &AtomicU32 {
        self.word32(128)
    }
    fn data_sleepers(&self) -> &AtomicU32 {
        self.word32(132)
    }
    /// Bumped when a slot is freed and the producer sleeps; the producer's futex.
    fn space_word(&self) -> &AtomicU32 {
        self.word32(192)
    }
    fn space_sleepers(&self) -> &AtomicU32 {
        self.word32(196)
    }
    fn slot(&self, n: u64) -> *mut u8 {
        // SAFETY: the index is reduced modulo SLOTS, so the slot lies inside this ring.
        unsafe { self.base.add(CTRL + (n % SLOTS) as usize * SLOT_BYTES) }
    }
    /// Publishes slot `n` (the next one) and wakes a sleeping consumer.
    fn publish(&self, n: u64) {
        self.head().store(n + 1, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.data_sleepers().load(Ordering::Relaxed) > 0 {
            self.data_word().fetch_add(1, Ordering::SeqCst);
            futex_wake(self.data_word());
        }
    }
    /// Frees slot `n` (the oldest) and wakes a sleeping producer.
    fn release(&self, n: u64) {
        self.tail().store(n + 1, Ordering::Release);
        fence(Ordering::SeqCst);
        if self.space_sleepers().load(Ordering::Relaxed) > 0 {
            self.space_word().fetch_add(1, Ordering::SeqCst);
            futex_wake(self.space_word());
        }
    }
    /// Reads slot `n`'s header: the frame header if it is a first piece, the piece length.
    fn piece(&self, n: u64) -> (Option<[u8; HEADER_LEN]>, usize) {
        let p = self.slot(n);
        let mut head = [0u8; INLINE_AT];
        // SAFETY: the slot was published to us (Acquire on its sequence word or on head); we own
        // it until release.
        unsafe { std::ptr::copy_nonoverlapping(p, head.as_mut_ptr(), INLINE_AT) };
        let len = u32::from_le_bytes([head[40], head[41], head[42], head[43]]) as usize;
        let first = head[38] & FIRST != 0;
        // Rebuild the wire header: magic and version are implied, the reserved word is zero.
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&wire::MAGIC.to_le_bytes());
        h[4..6].copy_from_slice(&wire::VERSION.to_le_bytes());
        h[6..36].copy_from_slice(&head[0..30]);
        h[40..48].copy_from_slice(&head[30..38]);
        (first.then_some(h), len.min(SLOT_DATA))
    }
    /// Slot `n`'s payload: in the header's cache line when it is small enough.
    fn data(&self, n: u64, len: usize) -> &[u8] {
        let at = if len <= INLINE { INLINE_AT } else { SLOT_HEAD };
        // SAFETY: the slot is ours until released (see `piece`); len <= SLOT_DATA, or <= INLINE
        // at INLINE_AT, inside the slot header.
        unsafe { std::slice::from_raw_parts(self.slot(n).add(at), len) }
    }
    fn write(&self, n: u64, head: Option<&[u8; HEADER_LEN]>, data: &[u8]) {
        let p = self.slot(n);
        let mut sh = [0u8; SEQ_AT];
        if let Some(h) = head {
            sh[0..30].copy_from_slice(&h[6..36]);
            sh[30..38].copy_from_slice(&h[40..48]);
            sh[38] = FIRST;
        }
        sh[40..44].copy_from_slice(&(data.len() as u32).to_le_bytes());
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
    }
    /// Slot `n`'s sequence word: `n + 1` once slot `n` is published. A consumer polls this
    /// (the line it reads next anyway) rather than `head`, one cache miss less per frame.
    fn seq(&self, n: u64) -> &AtomicU64 {
        // SAFETY: SEQ_AT is 8-byte aligned inside the slot header (slots are 64-byte aligned).
        unsafe { AtomicU64::from_ptr(self.slot(n).add(SEQ_AT).cast()) }
    }
    /// True when slot `n` has been published (Acquire: its contents are visible).
    fn ready(&self, n: u64, order: Ordering) -> bool {
        self.seq(n).load(order) == n + 1
    }
}

pub(super) fn futex_wait(word: &AtomicU32, seen: u32, timeout: Duration) {
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as _ };
    // SAFETY: a shared (not private) futex wait on a live 4-byte word with a relative timeout.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, seen, &ts as *const libc::timespec) };
}

pub(super) fn futex_wake(word: &AtomicU32) {
    // SAFETY: a shared futex wake on a live word.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

/// Spin (for `spin`), then yield (`yields` times), then sleep. With a core per local rank the
/// waiter spins and then sleeps: yielding on a machine loaded by other work can give a whole time
/// slice away. With more local ranks than cores it does not spin but yields, which runs the rank
/// it waits for when that one shares its core.
pub(super) struct Backoff {
    n: u32,
    start: Option<Instant>,
    spin: Duration,
    yields: u32,
    spinning: bool,
}

impl Backoff {
    pub(super) fn new(w: Wait) -> Self {
        Backoff { n: 0, start: None, spin: w.spin, yields: w.yields, spinning: !w.spin.is_zero() }
    }
    /// True once spinning and yielding are over: the caller should sleep (and drain).
    pub(super) fn snooze(&mut self) -> bool {
        if self.spinning {
            for _ in 0..8 {
                std::hint::spin_loop();
            }
            let start = *self.start.get_or_insert_with(Instant::now);
            if start.elapsed() < self.spin {
                return false;
            }
            self.spinning = false;
        }
        self.n = self.n.saturating_add(1);
        if self.n <= self.yields {
            std::thread::yield_now();
            false
        } else {
            true
        }
    }
    fn reset(&mut self) {
        self.n = 0;
        self.start = None;
        self.spinning = !self.spin.is_zero();
    }
    fn sleeping(&self) -> bool {
        self.n > self.yields
    }
}

/// How a waiter waits (see [`Backoff`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Wait {
    spin: Duration,
    yields: u32,
}

/// A frame being moved into the inbox piece by piece.
struct Partial {
    hdr: FrameHeader,
    buf: Vec<u8>,
}

#[derive(Default)]
struct RxState {
    partial: Option<Partial>,
}

/// The shared-memory link to one peer.
pub(crate) struct ShmPeer {
    _seg: Segment,
    tx: Ring,
    rx: Ring,
    /// Held while writing a frame; holds the last tail seen, so that a producer reads the
    /// consumer's cache line only when the ring looks full.
    tx_lock: Mutex<u64>,
    rx_state: Mutex<RxState>,
}

// SAFETY: the raw ring pointers point into `_seg`, which lives as long as the peer and is
// Send + Sync; all shared state is atomics or protected by the ring protocol and the mutexes.
unsafe impl Send for ShmPeer {}
// SAFETY: as above.
unsafe impl Sync for ShmPeer {}

impl ShmPeer {
    fn new(seg: Segment, creator: bool) -> ShmPeer {
        // SAFETY: both rings lie inside the segment (SEG_BYTES = 2 * RING_BYTES).
        let (a, b) = (Ring { base: seg.ptr }, Ring { base: unsafe { seg.ptr.add(RING_BYTES) } });
        let (tx, rx) = if creator { (a, b) } else { (b, a) };
        ShmPeer { _seg: seg, tx, rx, tx_lock: Mutex::new(0), rx_state: Mutex::new(RxState::default()) }
    }
}

/// What a receive hands its caller: the checked header first, then the payload in pieces.
pub(crate) struct Sink<'a> {
    pub check: &'a mut dyn FnMut(&FrameHeader) -> Result<()>,
    pub piece: &'a mut dyn FnMut(usize, &[u8]),
}

/// The shared-memory links of one world, by world rank.
#[derive(Default)]
pub(crate) struct Shm {
    peers: Vec<Option<ShmPeer>>,
    wait: Wait,
}

enum Polled {
    Done,
    Progress,
    Nothing,
}

fn header(raw: &[u8; HEADER_LEN], src: u32) -> Result<FrameHeader> {
    let hdr = FrameHeader::decode(raw, MAX_CHUNK_BYTES).map_err(|e| e.context(format!("shared memory from {src}")))?;
    if !matches!(hdr.kind, FrameKind::Collective | FrameKind::P2p) {
        return Err(Error::new(ErrorKind::Transfer, format!("a {:?} frame in shared memory from {src}", hdr.kind)));
    }
    Ok(hdr)
}

impl Shm {
    pub fn new(peers: Vec<Option<ShmPeer>>) -> Shm {
        let local = 1 + peers.iter().filter(|p| p.is_some()).count();
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        // Spinning only pays when every local rank has a core of its own.
        let wait = if local <= cores {
            Wait { spin: SPIN, yields: 0 }
        } else {
            Wait { spin: Duration::ZERO, yields: OVERSUBSCRIBED_YIELDS }
        };
        Shm { peers, wait }
    }

    pub fn is_empty(&self) -> bool {
        self.peers.iter().all(|p| p.is_none())
    }

    /// How this host's waiters wait (spin or yield first), for other shared-memory waits.
    pub(super) fn wait(&self) -> Wait {
        self.wait
    }

    pub fn has(&self, rank: u32) -> bool {
        self.peer(rank).is_some()
    }

    fn peer(&self, rank: u32) -> Option<&ShmPeer> {
        self.peers.get(rank as usize).and_then(|p| p.as_ref())
    }

    /// Writes one frame to `dst`'s ring, waiting for room as long as `dst` is healthy.
    pub fn send(&self, dst: u32, hdr: &FrameHeader, payload: &[u8], inbox: &Inbox, timeout: Duration) -> Result<()> {
        let Some(p) = self.peer(dst) else { return Err(Error::internal(format!("no shared memory to {dst}"))) };
        let head = hdr.encode();
        let mut tail = p.tx_lock.lock().unwrap_or_else(|e| e.into_inner());
        let ring = &p.tx;
        let mut n = ring.head().load(Ordering::Relaxed);
        let mut off = 0usize;
        let mut deadline: Option<Instant> = None;
        let mut backoff = Backoff::new(self.wait);
        let mut gen = inbox.generation();
        loop {
            if n - *tail >= SLOTS {
                *tail = ring.tail().load(Ordering::Acquire);
            }
            if n - *tail >= SLOTS {
                // Full: wait for the consumer, and meanwhile keep our own rings moving.
                if backoff.snooze() {
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
                        return Ok(());
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
            ring.write(n, (off == 0).then_some(&head), piece);
            ring.publish(n);
            n += 1;
            off += piece.len();
            if off >= payload.len() {
                return Ok(());
            }
        }
    }

    /// Receives the frame `key` (its source has a shared-memory link): from the inbox if another
    /// wait moved it there, else straight from the ring.
    pub fn recv(
        &self,
        key: Key,
        inbox: &Inbox,
        timeout: Duration,
        status: &dyn Fn(&Health<'_>) -> Option<Error>,
        sink: &mut Sink<'_>,
    ) -> Result<()> {
        let Some(p) = self.peer(key.src) else { return Err(Error::internal("no shared memory to that rank")) };
        let deadline = Instant::now() + timeout;
        let mut gen = u64::MAX;
        let mut backoff = Backoff::new(self.wait);
        let mut ended: Option<Error> = None;
        loop {
            let g = inbox.generation();
            if g != gen {
                gen = g;
                if inbox.queued() > 0 {
                    if let Some(f) = inbox.try_take(key) {
                        (sink.check)(&f.hdr)?;
                        (sink.piece)(0, &f.payload);
                        return Ok(());
                    }
                }
                // Noted now, returned only after one more look at the ring below: what the
                // peer wrote before it died or left is still delivered.
                if inbox.troubles() != 0 {
                    ended = inbox.ended(key.src, status);
                }
            }
            if let Ok(mut st) = p.rx_state.try_lock() {
                match self.poll(p, &mut st, key, inbox, deadline, sink)? {
                    Polled::Done => return Ok(()),
                    Polled::Progress => {
                        backoff.reset();
                        continue;
                    }
                    Polled::Nothing => {}
                }
            }
            if let Some(e) = ended {
                return Err(e);
            }
            if backoff.snooze() {
                if Instant::now() >= deadline {
                    return Err(Error::timeout(format!(
                        "no message from world rank {} within {} ms (HCCN_TIMEOUT_MS)",
                        key.src,
                        timeout.as_millis()
                    )));
                }
                self.drain(Some(key.src), inbox);
                let ring = &p.rx;
                let seen = ring.data_word().load(Ordering::SeqCst);
                ring.data_sleepers().fetch_add(1, Ordering::SeqCst);
                if !ring.ready(ring.tail().load(Ordering::Relaxed), Ordering::SeqCst) && inbox.generation() == gen {
                    futex_wait(ring.data_word(), seen, NAP);
                }
                ring.data_sleepers().fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Looks at `p`'s ring once: delivers `key` if it is next, moves other frames to the inbox.
    fn poll(
        &self,
        p: &ShmPeer,
        st: &mut RxState,
        key: Key,
        inbox: &Inbox,
        deadline: Instant,
        sink: &mut Sink<'_>,
    ) -> Result<Polled> {
        let ring = &p.rx;
        if st.partial.is_some() {
            // Another frame is half moved; finish it first (the sender is streaming it).
            return match fill(ring, st, key.src, inbox)? {
                true => Ok(Polled::Progress),
                false => Ok(Polled::Nothing),
            };
        }
        let mut t = ring.tail().load(Ordering::Relaxed);
        if !ring.ready(t, Ordering::Acquire) {
            return Ok(Polled::Nothing);
        }
        let (raw, len) = ring.piece(t);
        let raw = raw.ok_or_else(|| Error::new(ErrorKind::Transfer, "shared memory ring out of step"))?;
        let hdr = header(&raw, key.src)?;
        let this = Key { src: key.src, kind: hdr.kind, comm_id: hdr.comm_id, seq: hdr.seq };
        if this != key {
            // Another wait's frame: into the inbox with it (what has arrived of it, for now).
            fill(ring, st, key.src, inbox)?;
            return Ok(Polled::Progress);
        }
        (sink.check)(&hdr)?;
        let total = hdr.len as usize;
        (sink.piece)(0, ring.data(t, len));
        let mut off = len;
        ring.release(t);
        t += 1;
        let mut backoff = Backoff::new(self.wait);
        while off < total {
            if !ring.ready(t, Ordering::Acquire) {
                if backoff.snooze() {
                    // Only the sender's end stops a frame that has begun: leaving it half read
                    // (for a revoke, say) would put the ring out of step for the next receive.
                    if let Some(e) = inbox.peer_gone(key.src) {
                        if !ring.ready(t, Ordering::Acquire) {
                            return Err(e);
                        }
                    }
                    if Instant::now() >= deadline {
                        return Err(Error::timeout(format!("world rank {} stopped inside a frame", key.src)));
                    }
                    let seen = ring.data_word().load(Ordering::SeqCst);
                    ring.data_sleepers().fetch_add(1, Ordering::SeqCst);
                    if !ring.ready(t, Ordering::SeqCst) {
                        futex_wait(ring.data_word(), seen, NAP);
                    }
                    ring.data_sleepers().fetch_sub(1, Ordering::SeqCst);
                }
                continue;
            }
            backoff.reset();
            let (first, len) = ring.piece(t);
            if first.is_some() || off + len > total {
                return Err(Error::new(ErrorKind::Transfer, "shared memory ring out of step"));
            }
            (sink.piece)(off, ring.data(t, len));
            off += len;
            ring.release(t);
            t += 1;
        }
        Ok(Polled::Done)
    }

    /// Moves whatever has arrived on the rings (except `except`'s) into the inbox, so that their
    /// senders can go on.
    pub fn drain(&self, except: Option<u32>, inbox: &Inbox) {
        for (src, p) in self.peers.iter().enumerate() {
            let Some(p) = p else { continue };
            if Some(src as u32) == except || p.rx.head().load(Ordering::Acquire) == p.rx.tail().load(Ordering::Relaxed)
            {
                continue;
            }
            let Ok(mut st) = p.rx_state.try_lock() else { continue };
            loop {
                match fill(&p.rx, &mut st, src as u32, inbox) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        inbox.mark_failed(src as u32, e.message().to_owned());
                        break;
                    }
                }
            }
        }
    }
}

/// Moves available slots of `ring` into the partial frame (starting one if none), pushing it to
/// the inbox when complete. True when anything moved.
fn fill(ring: &Ring, st: &mut RxState, src: u32, inbox: &Inbox) -> Result<bool> {
    let mut t = ring.tail().load(Ordering::Relaxed);
    let mut moved = false;
    while ring.head().load(Ordering::Acquire) != t {
        let (first, len) = ring.piece(t);
        match (&mut st.partial, first) {
            (None, Some(raw)) => {
                let hdr = header(&raw, src)?;
                let mut buf = Vec::with_capacity(hdr.len as usize);
                buf.extend_from_slice(ring.data(t, len));
                st.partial = Some(Partial { hdr, buf });
            }
            (Some(part), None) if part.buf.len() + len <= part.hdr.len as usize => {
                part.buf.extend_from_slice(ring.data(t, len));
            }
            _ => return Err(Error::new(ErrorKind::Transfer, "shared memory ring out of step")),
        }
        ring.release(t);
        t += 1;
        moved = true;
        if let Some(part) = st.partial.take_if(|p| p.buf.len() >= p.hdr.len as usize) {
            inbox.push(src, Frame { hdr: part.hdr, payload: part.buf });
            // A thread of ours may sleep on this ring waiting for exactly that frame.
            ring.data_word().fetch_add(1, Ordering::SeqCst);
            if ring.data_sleepers().load(Ordering::SeqCst) > 0 {
                futex_wake(ring.data_word());
            }
        }
    }
    Ok(moved)
}

/// Offers and accepts shared memory on a freshly authenticated socket, before its reader
/// starts. Both sides first exchange host ids and whether they allow shared memory; on one host
/// the lower rank creates the segment and names it, the higher maps it and answers, and the
/// lower unlinks it. Returns the peer's host id and the link, if shared memory was set up.
pub(crate) fn handshake(
    sock: &mut TcpStream,
    me: u32,
    peer: u32,
    mesh: u64,
    mine: &HostId,
    cfg: &Config,
) -> Result<(HostId, Option<ShmPeer>)> {
    let io = |what: &'static str| hs_err(peer, what);
    sock.set_read_timeout(Some(cfg.timeout)).map_err(io("timeout"))?;
    let allow = cfg.transport != Transport::Tcp;
    let mut hello = [0u8; 37];
    hello[0..4].copy_from_slice(&OFFER_MAGIC.to_le_bytes());
    hello[4..36].copy_from_slice(mine);
    hello[36] = allow as u8;
    sock.write_all(&hello).map_err(io("send"))?;
    let mut theirs = [0u8; 37];
    sock.read_exact(&mut theirs).map_err(io("receive"))?;
    if theirs[0..4] != OFFER_MAGIC.to_le_bytes() {
        return Err(Error::new(ErrorKind::Connect, format!("world rank {peer} sent no shared-memory hello")));
    }
    let mut their_host = [0u8; 32];
    their_host.copy_from_slice(&theirs[4..36]);
    let same = their_host == *mine;
    if cfg.transport == Transport::Shm && !same {
        return Err(Error::invalid(format!(
            "HCCN_TRANSPORT=shm, but world rank {peer} is on another host (or network namespace)"
        )));
    }
    if !(same && allow && theirs[36] == 1) {
        return Ok((their_host, None));
    }
    let link = if me < peer { offer(sock, me, peer, mesh)? } else { accept(sock, peer)? };
    if link.is_none() && cfg.transport == Transport::Shm {
        return Err(Error::new(
            ErrorKind::System,
            format!("no shared memory with world rank {peer} (HCCN_TRANSPORT=shm)"),
        ));
    }
    Ok((their_host, link))
}

fn hs_err(peer: u32, what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::io(ErrorKind::Connect, format!("shared-memory handshake with world rank {peer}: {what}"), &e)
}

fn offer(sock: &mut TcpStream, me: u32, peer: u32, mesh: u64) -> Result<Option<ShmPeer>> {
    let io = |what: &'static str| hs_err(peer, what);
    let path = format!("/dev/shm/hccn-{mesh:016x}-{}-{me}-{peer}", std::process::id());
    let made = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|f| f.set_len(SEG_BYTES as u64).map(|_| f))
        .and_then(|f| Segment::map(&f, SEG_BYTES));
    let seg = match made {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(peer, "no shared memory ({path}: {e}); using TCP");
            let _ = std::fs::remove_file(&path);
            None
        }
    };
    let name = if seg.is_some() { path.as_bytes() } else { &[][..] };
    let mut msg = (name.len() as u32).to_le_bytes().to_vec();
    msg.extend_from_slice(name);
    let sent = sock.write_all(&msg).map_err(io("send name"));
    let mut ok = [0u8; 1];
    let answered = sent.and_then(|_| sock.read_exact(&mut ok).map_err(io("receive answer")));
    // Both have it mapped (or never will): the name is no longer needed.
    let _ = std::fs::remove_file(&path);
    answered?;
    Ok(seg.filter(|_| ok[0] == 1).map(|s| ShmPeer::new(s, true)))
}

fn accept(sock: &mut TcpStream, peer: u32) -> Result<Option<ShmPeer>> {
    let io = |what: &'static str| hs_err(peer, what);
    let mut len = [0u8; 4];
    sock.read_exact(&mut len).map_err(io("receive name"))?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 {
        return Ok(None);
    }
    if len > 256 {
        return Err(Error::new(ErrorKind::Connect, "shared-memory name too long"));
    }
    let mut name = vec![0u8; len];
    sock.read_exact(&mut name).map_err(io("receive name"))?;
    let path = String::from_utf8_lossy(&name).into_owned();
    let mapped = if path.starts_with("/dev/shm/hccn-") && !path.contains("..") {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .and_then(|f| match f.metadata()?.len() {
                l if l == SEG_BYTES as u64 => Segment::map(&f, SEG_BYTES),
                l => Err(std::io::Error::other(format!("segment of {l} bytes"))),
            })
            .map_err(|e| tracing::warn!("no shared memory ({path}: {e}); using TCP"))
            .ok()
    } else {
        None
    };
    sock.write_all(&[mapped.is_some() as u8]).map_err(io("answer"))?;
    Ok(mapped.map(|s| ShmPeer::new(s, false)))
}
