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
//! Large frames can skip the ring's copy (CMA): when a probe at the handshake shows that both
//! processes may read each other's memory with `process_vm_readv` (pid namespaces, ptrace policy
//! or seccomp may forbid it; `HCCN_CMA=off` does), a sender that can wait for completion
//! ([`Shm::send_desc`], used by the pipelined ring) writes a one-slot descriptor of its buffer
//! instead of the payload. The receiver reads the payload from the sender's memory (with plain
//! loads when it lies in shareable memory the receiver has mapped, see `mem.rs`) and hands it to
//! its sink, then acknowledges it in the control block; the sender leaves its buffer alone until
//! then ([`Shm::wait_sent`]), or withdraws what was not read yet when its operation fails
//! ([`Shm::withdraw`]). Plain sends always use the ring: a sender blocked until its receiver
//! reads could wait in a cycle of ranks that all send first.
//!
//! Waits spin briefly (not at all when the host's ranks outnumber its cores), then yield, then
//! sleep on a futex in the shared page (woken by the other side, or after 1 ms to look at the
//! peer's health). A waiting sender or receiver also drains the other rings into the inbox, so
//! that ranks blocked on full rings in a cycle can never deadlock: as with TCP, a send always
//! completes eventually, whatever the receiver is doing. Where the ranks outnumber the cores, a
//! waiter that yielded says in the rings it produces which core it runs on, and the ranks keep
//! themselves evenly spread over the cores (placement.rs).

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::placement::{self, here, Countdown};
use super::{Frame, Health, Inbox, Key};
use crate::config::{Config, Transport, MAX_CHUNK_BYTES};
use crate::error::{Error, ErrorKind, Result};
use crate::mem::{PeerMaps, RegionRef};
use crate::wire::{self, FrameHeader, FrameKind, HEADER_LEN};

/// Payload bytes per slot; a multiple of 16 so that pieces of a frame never split an element.
const SLOT_DATA: usize = 64 << 10;
/// Slot header: frame header, piece length, flags.
const SLOT_HEAD: usize = 64;
const SLOT_BYTES: usize = SLOT_HEAD + SLOT_DATA;
const SLOTS: u64 = 16;
/// Ring control block: head, tail, data futex, space futex, CMA acknowledgements, the core the
/// producer last ran on, each on its own cache line, then the states of the descriptors in flight.
const CTRL: usize = CMA_STATES_AT + CMA_STATES as usize * 8;
const CPU_AT: usize = 320;
const CMA_STATES_AT: usize = 384;
/// Descriptors in flight whose state the control block can hold: more than a ring's slots plus
/// the one being read, the most that can be unacknowledged (a descriptor's slot is released just
/// before it is read).
const CMA_STATES: u64 = 32;
const _: () = assert!(CMA_STATES > SLOTS + 1);
/// A descriptor's state (with its number in the bits above): the sender posted it, the receiver
/// is reading it, or the sender withdrew it before the receiver began.
const POSTED: u64 = 1;
const READING: u64 = 2;
const WITHDRAWN: u64 = 3;
const RING_BYTES: usize = CTRL + SLOTS as usize * SLOT_BYTES;
const SEG_BYTES: usize = 2 * RING_BYTES;
/// A slot header (one cache line): the frame's kind (0), flags (1), piece length (4..8),
/// communicator (8..16), sequence (16..24), tag (24..28), frame length (28..32), fingerprint
/// (32..48); a payload of up to `INLINE` bytes (48..56), so that the smallest frames cost the
/// receiver one cache line; and the sequence word (56..64). Magic and version are implied, and
/// the epoch too: a communicator's id differs at every epoch.
const INLINE_AT: usize = 48;
const INLINE: usize = 8;
const SEQ_AT: usize = 56;
/// First piece of a frame (its slot header carries the frame header).
const FIRST: u8 = 1;
/// The slot holds a descriptor ([`Desc`]): the payload stays in the sender's memory and the
/// receiver reads it with process_vm_readv.
const CMA: u8 = 2;
/// Largest piece the receiver reads with one process_vm_readv into its scratch buffer: small
/// enough to stay in cache while the sink reduces it; a multiple of 16.
const CMA_PIECE: usize = 256 << 10;
/// Smallest payload sent by descriptor: below it, the setup of a cross-process read (pinning the
/// sender's pages) costs more than the copy through the ring saves.
pub(crate) const CMA_MIN: usize = 64 << 10;
/// How long a futex sleep lasts before the sleeper looks at health and the inbox again.
pub(super) const NAP: Duration = Duration::from_millis(1);
/// How long a waiter spins before it yields, when every local rank has a core.
const SPIN: Duration = Duration::from_micros(20);
/// How often a waiter yields before it sleeps, when the host's ranks outnumber its cores.
const OVERSUBSCRIBED_YIELDS: u32 = 100;
const OFFER_MAGIC: u32 = 0x5348_4d32; // "SHM2": slot headers carry fingerprints

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
        // SAFETY: `off` is an 8-byte aligned offset inside the control block of a live mapping
        // (the mapping is page aligned); shared memory is only accessed atomically.
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
    /// Descriptors the consumer has finished with (read, or found withdrawn): the producer's
    /// buffers up to there are free again.
    fn cma_done(&self) -> &AtomicU64 {
        self.word64(256)
    }
    /// Bumped when a descriptor is finished and the producer sleeps; the producer's futex.
    fn ack_word(&self) -> &AtomicU32 {
        self.word32(272)
    }
    fn ack_sleepers(&self) -> &AtomicU32 {
        self.word32(276)
    }
    /// The core the producer last said it runs on (u32::MAX: not yet), when the host's ranks
    /// outnumber its cores (see placement.rs).
    fn cpu_word(&self) -> &AtomicU32 {
        self.word32(CPU_AT)
    }
    /// Descriptor `n`'s state: `n << 2 | POSTED`, `READING` or `WITHDRAWN`. Both sides change
    /// it with compare-and-swap, so exactly one wins: the reader, which then reads, or the sender
    /// withdrawing it, after which the reader skips it.
    fn cma_state(&self, n: u64) -> &AtomicU64 {
        self.word64(CMA_STATES_AT + (n % CMA_STATES) as usize * 8)
    }
    /// Records descriptor `n` as finished and wakes a producer waiting for it.
    fn acknowledge(&self, n: u64) {
        self.cma_done().store(n + 1, Ordering::SeqCst);
        if self.ack_sleepers().load(Ordering::SeqCst) > 0 {
            self.ack_word().fetch_add(1, Ordering::SeqCst);
            futex_wake(self.ack_word());
        }
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
    /// Reads slot `n`'s header: the frame header if it is a first piece, the piece length, and
    /// whether the piece is a descriptor.
    fn piece(&self, n: u64) -> (Option<[u8; HEADER_LEN]>, usize, bool) {
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
    fn data(&self, n: u64, len: usize) -> &[u8] {
        let at = if len <= INLINE { INLINE_AT } else { SLOT_HEAD };
        // SAFETY: the slot is ours until released (see `piece`); len <= SLOT_DATA, or <= INLINE
        // at INLINE_AT, inside the slot header.
        unsafe { std::slice::from_raw_parts(self.slot(n).add(at), len) }
    }
    fn write(&self, n: u64, head: Option<&[u8; HEADER_LEN]>, flags: u8, data: &[u8]) {
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
pub(super) struct Backoff<'a> {
    n: u32,
    start: Option<Instant>,
    spin: Duration,
    yields: u32,
    spinning: bool,
    /// The links whose waiter this is: after each yield it says where it runs and keeps the
    /// ranks spread (see [`Shm::after_yield`]).
    links: Option<&'a Shm>,
}

impl Backoff<'static> {
    pub(super) fn new(w: Wait) -> Self {
        Backoff { n: 0, start: None, spin: w.spin, yields: w.yields, spinning: !w.spin.is_zero(), links: None }
    }
}

impl Backoff<'_> {
    /// True once spinning and yielding are over: the caller should sleep (and drain).
    pub(super) fn snooze(&mut self) -> bool {
        if self.spinning {
            // One pause per look (~25 ns on current x86): the awaited write is noticed within
            // a cache-line transfer. More pauses per look delayed a 4-byte allreduce by
            // ~0.1 µs on average.
            std::hint::spin_loop();
            // The clock only every 64th look (reading it costs ~45 ns in a VM, two looks), and
            // never on the first: most waits end within a few looks.
            self.n = self.n.wrapping_add(1);
            if !self.n.is_multiple_of(64) {
                return false;
            }
            let start = *self.start.get_or_insert_with(Instant::now);
            if start.elapsed() < self.spin {
                return false;
            }
            self.spinning = false;
            self.n = 0;
        }
        self.n = self.n.saturating_add(1);
        if self.n <= self.yields {
            std::thread::yield_now();
            if let Some(links) = self.links {
                links.after_yield();
            }
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

impl Wait {
    /// The host's ranks outnumber its cores: waiters yield rather than spin.
    pub(super) fn shares_cores(&self) -> bool {
        self.spin.is_zero()
    }
}

/// What a descriptor slot carries: where the payload lies in the sender's memory, the
/// descriptor's number in its direction (both sides count them, so a lost or repeated one shows),
/// and the shareable region that holds the payload, if one does (see `mem.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Desc {
    addr: u64,
    len: u64,
    index: u64,
    region: Option<RegionRef>,
}

impl Desc {
    /// Encoded length, without and with a region.
    const PLAIN: usize = 24;
    const IN_REGION: usize = Self::PLAIN + RegionRef::WORDS * 8;

    fn encode(&self, b: &mut [u8; Desc::IN_REGION]) -> usize {
        let words = [self.addr, self.len, self.index].into_iter().chain(self.region.iter().flat_map(|r| r.words()));
        let mut n = 0;
        for w in words {
            b[n..n + 8].copy_from_slice(&w.to_le_bytes());
            n += 8;
        }
        n
    }
    fn decode(b: &[u8]) -> Option<Desc> {
        if b.len() != Self::PLAIN && b.len() != Self::IN_REGION {
            return None;
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_le_bytes(w)
        };
        let region = (b.len() == Self::IN_REGION).then(|| RegionRef::from_words(std::array::from_fn(|i| word(3 + i))));
        Some(Desc { addr: word(0), len: word(1), index: word(2), region })
    }
}

/// A value at a fixed address of this process that a peer reads at the handshake to learn
/// whether the kernel lets it read this process's memory (random per process, so that a reader
/// in another pid namespace cannot mistake a same-numbered process running the same binary).
static CMA_MAGIC: AtomicU64 = AtomicU64::new(0);

fn cma_magic() -> &'static AtomicU64 {
    if CMA_MAGIC.load(Ordering::Relaxed) == 0 {
        let mut v = [0u8; 8];
        let _ = getrandom::getrandom(&mut v);
        let v = u64::from_le_bytes(v) | 1;
        let _ = CMA_MAGIC.compare_exchange(0, v, Ordering::SeqCst, Ordering::SeqCst);
    }
    &CMA_MAGIC
}

/// Reads `dst.len()` bytes at `addr` in process `pid`; anything short of all of them is an error.
fn cma_read(pid: i32, addr: u64, dst: &mut [u8]) -> std::io::Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    let local = libc::iovec { iov_base: dst.as_mut_ptr().cast(), iov_len: dst.len() };
    let remote = libc::iovec { iov_base: addr as usize as *mut libc::c_void, iov_len: dst.len() };
    // SAFETY: `local` covers exactly the writable `dst`; the kernel checks the remote range
    // against the other process's mappings (EFAULT), it never touches ours beyond `dst`.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    match n {
        n if n < 0 => Err(std::io::Error::last_os_error()),
        n if n as usize == dst.len() => Ok(()),
        n => Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, format!("read {n} of {} bytes", dst.len()))),
    }
}

/// True when this process may read `pid`'s memory and finds `expect` at `addr`.
fn cma_probe(pid: i32, addr: u64, expect: u64) -> bool {
    let mut v = [0u8; 8];
    match cma_read(pid, addr, &mut v) {
        Ok(()) => u64::from_le_bytes(v) == expect,
        Err(e) => {
            tracing::debug!(pid, "process_vm_readv not permitted ({e}); shared-memory rings only");
            false
        }
    }
}

/// The error for a failed read of `src`'s memory: its death (the process is gone) or a transfer
/// error (a bad address or a short read: the pair is out of step).
fn cma_error(src: u32, e: &std::io::Error, inbox: &Inbox) -> Error {
    if e.raw_os_error() == Some(libc::ESRCH) {
        let reason = "its process ended while this rank read its data".to_owned();
        inbox.mark_failed(src, super::Fault::sure(reason.clone()));
        return Error::rank_failed(vec![src], format!("world rank {src} failed: {reason}"));
    }
    Error::io(ErrorKind::Transfer, format!("reading the data of world rank {src} (process_vm_readv)"), e)
}

fn out_of_step() -> Error {
    Error::new(ErrorKind::Transfer, "shared memory ring out of step")
}

/// A frame being moved into the inbox piece by piece.
struct Partial {
    hdr: FrameHeader,
    buf: Vec<u8>,
}

#[derive(Default)]
struct RxState {
    partial: Option<Partial>,
    /// Number of the next descriptor expected from the peer.
    cma_next: u64,
    /// Where descriptor payloads are read to, piece by piece (allocated at the first one).
    scratch: Vec<u8>,
    /// The peer's shareable regions mapped here, read without a system call.
    maps: PeerMaps,
}

/// The producer's side of a ring, held while writing a frame.
#[derive(Default)]
struct TxState {
    /// The last tail seen, so that a producer reads the consumer's cache line only when the ring
    /// looks full.
    tail: u64,
    /// Descriptors written so far.
    posted: u64,
}

/// The shared-memory link to one peer.
pub(crate) struct ShmPeer {
    _seg: Segment,
    tx: Ring,
    rx: Ring,
    tx_lock: Mutex<TxState>,
    rx_state: Mutex<RxState>,
    /// The peer's process id when both sides may read each other's memory (CMA).
    cma_pid: Option<i32>,
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
        ShmPeer {
            _seg: seg,
            tx,
            rx,
            tx_lock: Mutex::new(TxState::default()),
            rx_state: Mutex::new(RxState::default()),
            cma_pid: None,
        }
    }
}

impl ShmPeer {
    /// True when large frames to this peer go by descriptor.
    pub fn cma(&self) -> bool {
        self.cma_pid.is_some()
    }
}

/// What a receive hands its caller: the checked header first, then the payload.
pub(crate) struct Sink<'a, 'b> {
    pub check: &'a mut dyn FnMut(&FrameHeader) -> Result<()>,
    pub out: Out<'b>,
    /// The payload length expected, at most (`check` has the last word): how a receive waits.
    pub expect: usize,
}

/// Where a received payload goes.
pub(crate) enum Out<'a> {
    /// To a function, in (offset, bytes) pieces in order.
    Pieces(&'a mut dyn FnMut(usize, &[u8])),
    /// Into a buffer of the frame's length (checked by `check`), where a single-copy read lands
    /// directly.
    Into(&'a mut [u8]),
    /// Into a buffer of the frame's length, piece by piece through a function that writes the
    /// piece of the buffer at an offset: `f(dst, Some(bytes), off)` where the payload bytes lie
    /// in memory this process can read (a ring slot, a peer's mapped region), `f(dst, None, off)`
    /// where they have landed in `dst` already (a single-copy read), while still in cache. A
    /// reduction thus writes `dst` once and never reads it from memory first.
    IntoThen(&'a mut [u8], &'a mut WritePiece<'a>),
}

/// Writes the piece `dst` of a buffer at an offset, from the payload bytes where they lie or
/// (`None`) from what has landed in `dst` (see [`Out::IntoThen`]).
pub(crate) type WritePiece<'a> = dyn FnMut(&mut [u8], Option<&[u8]>, usize) + 'a;

impl Sink<'_, '_> {
    /// Hands over the payload bytes at `off`.
    pub fn piece(&mut self, off: usize, bytes: &[u8]) {
        match &mut self.out {
            Out::Pieces(f) => f(off, bytes),
            Out::Into(buf) => {
                if let Some(dst) = buf.get_mut(off..off + bytes.len()) {
                    dst.copy_from_slice(bytes);
                }
            }
            Out::IntoThen(buf, then) => {
                if let Some(dst) = buf.get_mut(off..off + bytes.len()) {
                    then(dst, Some(bytes), off);
                }
            }
        }
    }
}

/// The shared-memory links of one world, by world rank.
#[derive(Default)]
pub(crate) struct Shm {
    /// This rank's world rank.
    me: u32,
    peers: Vec<Option<ShmPeer>>,
    wait: Wait,
    /// The core this rank last said it runs on, in every ring it produces.
    said: AtomicU32,
    spread_in: Countdown,
}

enum Polled {
    Done,
    Progress,
    Nothing,
    /// The frame was a descriptor its sender withdrew: its operation failed.
    Withdrawn,
}

fn header(raw: &[u8; HEADER_LEN], src: u32) -> Result<FrameHeader> {
    let hdr = FrameHeader::decode(raw, MAX_CHUNK_BYTES).map_err(|e| e.context(format!("shared memory from {src}")))?;
    if !matches!(hdr.kind, FrameKind::Collective | FrameKind::P2p) {
        return Err(Error::new(ErrorKind::Transfer, format!("a {:?} frame in shared memory from {src}", hdr.kind)));
    }
    Ok(hdr)
}

impl Shm {
    pub fn new(me: u32, peers: Vec<Option<ShmPeer>>) -> Shm {
        let local = 1 + peers.iter().filter(|p| p.is_some()).count();
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        // Spinning only pays when every local rank has a core of its own.
        let wait = if local <= cores {
            Wait { spin: SPIN, yields: 0 }
        } else {
            Wait { spin: Duration::ZERO, yields: OVERSUBSCRIBED_YIELDS }
        };
        Shm { me, peers, wait, said: AtomicU32::new(u32::MAX), spread_in: Countdown::default() }
    }

    fn backoff(&self) -> Backoff<'_> {
        Backoff { links: Some(self), ..Backoff::new(self.wait) }
    }

    /// After a waiter yielded (the host's ranks outnumber its cores): says in its rings where
    /// this rank runs now (a write per local peer, only on a change), and now and then moves it
    /// off a crowded core (placement.rs).
    fn after_yield(&self) {
        let mine = here();
        self.say_cpu(mine);
        if !self.spread_in.due() {
            return;
        }
        let cores = |f: &mut dyn FnMut(u32, u32)| {
            f(self.me, mine);
            for (rank, p) in self.peers.iter().enumerate() {
                if let Some(p) = p {
                    f(rank as u32, p.rx.cpu_word().load(Ordering::Relaxed));
                }
            }
        };
        if let Some(to) = placement::spread(self.me, mine, &cores) {
            self.spread_in.settle();
            self.say_cpu(to);
        }
    }

    fn say_cpu(&self, cpu: u32) {
        if self.said.swap(cpu, Ordering::Relaxed) != cpu {
            self.peers.iter().flatten().for_each(|p| p.tx.cpu_word().store(cpu, Ordering::Relaxed));
        }
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

    /// True when frames to `rank` may go by descriptor (both sides agreed at the handshake).
    pub fn cma(&self, rank: u32) -> bool {
        self.peer(rank).is_some_and(|p| p.cma_pid.is_some())
    }

    /// True when `payload` should go to `rank` by descriptor, for the receiver to read once,
    /// rather than be copied through the ring. Where the host's ranks outnumber its cores only a
    /// payload in shareable memory (read in place) does: there a receiver's `process_vm_readv`
    /// (which pins the sender's pages) while its sender waits cost more than two copies made by
    /// both sides through the ring's cached slots (4 ranks on 2 cores: allgather and
    /// reduce-scatter 1.7-2.3x, the ring allreduce 1.6-2x slower from 1 to 64 MiB).
    pub fn single_copy(&self, rank: u32, payload: &[u8]) -> bool {
        self.cma(rank)
            && (!self.wait.shares_cores() || crate::mem::find(payload.as_ptr() as usize, payload.len()).is_some())
    }

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
        let mut tx = p.tx_lock.lock().unwrap_or_else(|e| e.into_inner());
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
                if inbox.troubles() != 0 {
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
            if backoff.snooze() {
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
            if backoff.snooze() {
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

    /// Receives the frame `key` (its source has a shared-memory link): from the inbox if another
    /// wait moved it there, else straight from the ring.
    pub fn recv(
        &self,
        key: Key,
        inbox: &Inbox,
        timeout: Duration,
        status: &dyn Fn(&Health<'_>) -> Option<Error>,
        sink: &mut Sink<'_, '_>,
    ) -> Result<()> {
        let Some(p) = self.peer(key.src) else { return Err(Error::internal("no shared memory to that rank")) };
        let deadline = Instant::now() + timeout;
        let mut gen = u64::MAX;
        let mut backoff = self.backoff();
        let mut ended: Option<Error> = None;
        let mut withdrawn: Option<Instant> = None;
        loop {
            let g = inbox.generation();
            if g != gen {
                gen = g;
                if inbox.queued() > 0 && withdrawn.is_none() {
                    if let Some(f) = inbox.try_take(key) {
                        (sink.check)(&f.hdr)?;
                        sink.piece(0, &f.payload);
                        super::pool::give(f.payload);
                        return Ok(());
                    }
                }
                // Noted now, returned only after one more look at the ring below: what the
                // peer wrote before it died or left is still delivered. (Frames of others wait
                // in the inbox too: they may show that this wait is in vain.)
                if inbox.troubles() != 0 || inbox.queued() > 0 {
                    ended = inbox.ended(key.src, status);
                    if withdrawn.is_none() && inbox.given_up(key) {
                        withdrawn = Some(Instant::now());
                    }
                }
            }
            // Once the sender withdrew a frame of ours, its later ones must not be taken for it.
            if withdrawn.is_none() {
                if let Ok(mut st) = p.rx_state.try_lock() {
                    match self.poll(p, &mut st, key, inbox, deadline, sink)? {
                        Polled::Done => return Ok(()),
                        Polled::Progress => {
                            backoff.reset();
                            continue;
                        }
                        Polled::Nothing => {}
                        Polled::Withdrawn => {
                            inbox.give_up(key);
                            withdrawn = Some(Instant::now());
                        }
                    }
                }
            }
            if let Some(e) = ended.take() {
                // The ring had one more look above: what the peer wrote before it died or left
                // is delivered; nothing more will come.
                return Err(e);
            }
            if withdrawn.is_some_and(|t| t.elapsed() >= super::WITHDRAW_GRACE) {
                return Err(Error::new(
                    ErrorKind::Remote,
                    format!("world rank {} gave up its operation before this rank read its data", key.src),
                ));
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
                if withdrawn.is_some() {
                    // Only news can end this wait now; the ring may hold the rest of the frame.
                    std::thread::sleep(NAP);
                    continue;
                }
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
        sink: &mut Sink<'_, '_>,
    ) -> Result<Polled> {
        let ring = &p.rx;
        if st.partial.is_some() {
            // Another frame is half moved; finish it first (the sender is streaming it).
            return match fill(p, st, key.src, inbox)? {
                true => Ok(Polled::Progress),
                false => Ok(Polled::Nothing),
            };
        }
        let mut t = ring.tail().load(Ordering::Relaxed);
        if !ring.ready(t, Ordering::Acquire) {
            return Ok(Polled::Nothing);
        }
        let (raw, len, desc) = ring.piece(t);
        let raw = raw.ok_or_else(out_of_step)?;
        let hdr = header(&raw, key.src)?;
        let this = Key { src: key.src, kind: hdr.kind, comm_id: hdr.comm_id, seq: hdr.seq };
        if this != key {
            // Another wait's frame: into the inbox with it (what has arrived of it, for now).
            fill(p, st, key.src, inbox)?;
            return Ok(Polled::Progress);
        }
        if desc {
            let d = descriptor(p, st, t, len, &hdr)?;
            (sink.check)(&hdr)?;
            ring.release(t);
            st.cma_next += 1;
            return match cma_take(p, st, key.src, d, inbox, &mut sink.out)? {
                true => Ok(Polled::Done),
                false => Ok(Polled::Withdrawn),
            };
        }
        (sink.check)(&hdr)?;
        let total = hdr.len as usize;
        sink.piece(0, ring.data(t, len));
        let mut off = len;
        ring.release(t);
        t += 1;
        let mut backoff = self.backoff();
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
            let (first, len, desc) = ring.piece(t);
            if first.is_some() || desc || off + len > total {
                return Err(out_of_step());
            }
            sink.piece(off, ring.data(t, len));
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
                match fill(p, &mut st, src as u32, inbox) {
                    Ok(true) => {}
                    Ok(false) => break,
                    Err(e) => {
                        inbox.mark_failed(src as u32, super::Fault::cut(e.message()));
                        break;
                    }
                }
            }
        }
    }
}

/// Moves available slots of `p`'s ring into the partial frame (starting one if none), pushing it
/// to the inbox when complete; a descriptor's payload is read whole into its frame. True when
/// anything moved.
fn fill(p: &ShmPeer, st: &mut RxState, src: u32, inbox: &Inbox) -> Result<bool> {
    let ring = &p.rx;
    let mut t = ring.tail().load(Ordering::Relaxed);
    let mut moved = false;
    while ring.head().load(Ordering::Acquire) != t {
        let (first, len, desc) = ring.piece(t);
        match (&mut st.partial, first) {
            (None, Some(raw)) if desc => {
                let hdr = header(&raw, src)?;
                let d = descriptor(p, st, t, len, &hdr)?;
                ring.release(t);
                t += 1;
                moved = true;
                st.cma_next += 1;
                let mut buf = super::pool::take(d.len as usize);
                buf.resize(d.len as usize, 0);
                // A withdrawn descriptor's frame is dropped, and so are the later frames of
                // its wait (its sender's operation failed), which then fails.
                if cma_take(p, st, src, d, inbox, &mut Out::Into(&mut buf))? {
                    st.partial = Some(Partial { hdr, buf });
                } else {
                    inbox.give_up(Key { src, kind: hdr.kind, comm_id: hdr.comm_id, seq: hdr.seq });
                }
            }
            (None, Some(raw)) => {
                let hdr = header(&raw, src)?;
                let mut buf = super::pool::take(hdr.len as usize);
                buf.extend_from_slice(ring.data(t, len));
                st.partial = Some(Partial { hdr, buf });
                ring.release(t);
                t += 1;
                moved = true;
            }
            (Some(part), None) if !desc && part.buf.len() + len <= part.hdr.len as usize => {
                part.buf.extend_from_slice(ring.data(t, len));
                ring.release(t);
                t += 1;
                moved = true;
            }
            _ => return Err(out_of_step()),
        }
        if let Some(part) = st.partial.take_if(|p| p.buf.len() >= p.hdr.len as usize) {
            inbox.push(src, Frame { hdr: part.hdr, payload: part.buf, landed: false });
            // A thread of ours may sleep on this ring waiting for exactly that frame.
            ring.data_word().fetch_add(1, Ordering::SeqCst);
            if ring.data_sleepers().load(Ordering::SeqCst) > 0 {
                futex_wake(ring.data_word());
            }
        }
    }
    Ok(moved)
}

/// The descriptor in slot `t` (the only slot of its frame), checked against the frame's header,
/// the count of descriptors so far, and the pair's agreement to use them.
fn descriptor(p: &ShmPeer, st: &RxState, t: u64, len: usize, hdr: &FrameHeader) -> Result<Desc> {
    if p.cma_pid.is_none() {
        return Err(Error::new(ErrorKind::Transfer, "a single-copy descriptor in shared memory where none was agreed"));
    }
    match Desc::decode(p.rx.data(t, len)) {
        Some(d) if d.len == hdr.len && d.index == st.cma_next => Ok(d),
        _ => Err(out_of_step()),
    }
}

/// Reads descriptor `d`'s payload from `src`'s memory straight into `out`'s buffer, or in pieces
/// to `out`'s function, then acknowledges it, whatever the outcome: with plain loads when it lies
/// in a region of shareable memory this process has mapped, else with `process_vm_readv`
/// (through the scratch buffer for a function). False when the sender had withdrawn it (nothing
/// was read).
fn cma_take(p: &ShmPeer, st: &mut RxState, src: u32, d: Desc, inbox: &Inbox, out: &mut Out<'_>) -> Result<bool> {
    let Some(pid) = p.cma_pid else { return Err(Error::internal("no single-copy path")) };
    let ring = &p.rx;
    let (posted, reading) = (d.index << 2 | POSTED, d.index << 2 | READING);
    match ring.cma_state(d.index).compare_exchange(posted, reading, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(_) => {}
        Err(s) => {
            ring.acknowledge(d.index);
            return if s == d.index << 2 | WITHDRAWN { Ok(false) } else { Err(out_of_step()) };
        }
    }
    let total = d.len as usize;
    let r = match d.region {
        Some(region) => match st.maps.view(pid, &region, d.addr, total) {
            Ok(Some(mapped)) => take_mapped(mapped, out),
            Ok(None) => take_cma(pid, d.addr, total, &mut st.scratch, out),
            Err(e) => {
                ring.acknowledge(d.index);
                return Err(e.context(format!("world rank {src}")));
            }
        },
        None => take_cma(pid, d.addr, total, &mut st.scratch, out),
    };
    ring.acknowledge(d.index);
    r.map(|_| true).map_err(|e| cma_error(src, &e, inbox))
}

/// Hands a payload mapped into this process to `out`, piece by piece where a piece is then read
/// again (so that it is still in cache).
fn take_mapped(src: &[u8], out: &mut Out<'_>) -> std::io::Result<()> {
    let short = || std::io::Error::other("a frame longer than its buffer");
    match out {
        Out::Into(buf) => buf.get_mut(..src.len()).ok_or_else(short)?.copy_from_slice(src),
        Out::IntoThen(buf, then) => {
            let dst = buf.get_mut(..src.len()).ok_or_else(short)?;
            for (i, (d, s)) in dst.chunks_mut(CMA_PIECE).zip(src.chunks(CMA_PIECE)).enumerate() {
                then(d, Some(s), i * CMA_PIECE);
            }
        }
        Out::Pieces(piece) => {
            for (i, s) in src.chunks(CMA_PIECE).enumerate() {
                piece(i * CMA_PIECE, s);
            }
        }
    }
    Ok(())
}

/// Reads `total` bytes at `addr` in process `pid` into `out` with `process_vm_readv`.
fn take_cma(pid: i32, addr: u64, total: usize, scratch: &mut Vec<u8>, out: &mut Out<'_>) -> std::io::Result<()> {
    match out {
        Out::Into(buf) => match buf.get_mut(..total) {
            Some(dst) => cma_read(pid, addr, dst),
            None => Err(std::io::Error::other("a frame longer than its buffer")),
        },
        // Piece by piece, so that each is still in cache when `then` reads it.
        Out::IntoThen(buf, then) => match buf.get_mut(..total) {
            Some(dst) => {
                for (i, piece) in dst.chunks_mut(CMA_PIECE).enumerate() {
                    cma_read(pid, addr + (i * CMA_PIECE) as u64, piece)?;
                    then(piece, None, i * CMA_PIECE);
                }
                Ok(())
            }
            None => Err(std::io::Error::other("a frame longer than its buffer")),
        },
        Out::Pieces(piece) => {
            if scratch.is_empty() {
                *scratch = vec![0u8; CMA_PIECE];
            }
            let mut off = 0;
            while off < total {
                let n = (total - off).min(CMA_PIECE);
                cma_read(pid, addr + off as u64, &mut scratch[..n])?;
                piece(off, &scratch[..n]);
                off += n;
            }
            Ok(())
        }
    }
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
    let mut link = if me < peer { offer(sock, me, peer, mesh)? } else { accept(sock, peer)? };
    if let Some(l) = &mut link {
        l.cma_pid = agree_cma(sock, peer, cfg.cma)?;
    }
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

/// Both sides of a shared-memory pair send their pid and the address and value of their
/// [`CMA_MAGIC`], try to read the other's, and tell each other whether that worked: single-copy
/// reads are on only when both worked (pid namespaces, ptrace policy or seccomp may forbid them,
/// in one direction only). Returns the peer's pid when they are on.
fn agree_cma(sock: &mut TcpStream, peer: u32, allow: bool) -> Result<Option<i32>> {
    let io = |what: &'static str| hs_err(peer, what);
    let magic = cma_magic();
    let mut mine = [0u8; 21];
    mine[0] = allow as u8;
    mine[1..5].copy_from_slice(&std::process::id().to_le_bytes());
    mine[5..13].copy_from_slice(&(magic.as_ptr() as u64).to_le_bytes());
    mine[13..21].copy_from_slice(&magic.load(Ordering::Relaxed).to_le_bytes());
    // Both write before they read: 21 bytes fit any socket buffer.
    sock.write_all(&mine).map_err(io("send pid"))?;
    let mut theirs = [0u8; 21];
    sock.read_exact(&mut theirs).map_err(io("receive pid"))?;
    let (pid, addr, value) = cma_offer(&theirs);
    let can = allow && theirs[0] == 1 && pid.is_some_and(|pid| cma_probe(pid, addr, value));
    sock.write_all(&[can as u8]).map_err(io("send probe"))?;
    let mut their_can = [0u8; 1];
    sock.read_exact(&mut their_can).map_err(io("receive probe"))?;
    let on = can && their_can[0] == 1;
    if !on && allow {
        tracing::debug!(peer, "no single-copy reads with world rank {peer} (HCCN_CMA, or the kernel forbids them)");
    }
    Ok(pid.filter(|_| on))
}

/// The pid (if it is a valid one), magic address and magic value in a peer's probe message.
fn cma_offer(m: &[u8; 21]) -> (Option<i32>, u64, u64) {
    let pid = u32::from_le_bytes([m[1], m[2], m[3], m[4]]);
    let word =
        |i: usize| u64::from_le_bytes([m[i], m[i + 1], m[i + 2], m[i + 3], m[i + 4], m[i + 5], m[i + 6], m[i + 7]]);
    let pid = i32::try_from(pid).ok().filter(|p| *p > 0);
    (pid, word(5), word(13))
}

/// Marks a new segment's rings as produced by ranks that have not said where they run yet (0
/// would read as core 0).
fn unsaid(seg: &Segment) {
    for base in [seg.ptr, seg.ptr.wrapping_add(RING_BYTES)] {
        Ring { base }.cpu_word().store(u32::MAX, Ordering::Relaxed);
    }
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
        Ok(s) => {
            unsaid(&s);
            Some(s)
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_other_lengths_are_refused() {
        let region = RegionRef { id: 3, fd: 17, ino: 99, base: 0x7fff_1234_0000, len: 1 << 21, frees: 2 };
        for region in [None, Some(region)] {
            let d = Desc { addr: 0x7fff_1234_5670, len: (1 << 20) + 12, index: 41, region };
            let mut b = [0u8; Desc::IN_REGION];
            let n = d.encode(&mut b);
            assert_eq!(n, if region.is_some() { Desc::IN_REGION } else { Desc::PLAIN });
            assert_eq!(Desc::decode(&b[..n]), Some(d));
            assert_eq!(Desc::decode(&b[..n - 1]), None);
        }
        assert_eq!(Desc::decode(&[0u8; Desc::PLAIN + 1]), None);
    }

    #[test]
    fn the_probe_reads_this_process_and_fails_cleanly_otherwise() {
        let m = cma_magic();
        let (me, addr, value) = (std::process::id() as i32, m.as_ptr() as u64, m.load(Ordering::Relaxed));
        assert!(cma_probe(me, addr, value), "reading this process's own magic");
        assert!(!cma_probe(me, addr, value ^ 1), "a wrong value");
        assert!(!cma_probe(me, 8, value), "an unmapped address");
        // Above the largest pid Linux hands out: no such process.
        let e = cma_read(i32::MAX, addr, &mut [0u8; 8]).err().and_then(|e| e.raw_os_error());
        assert_eq!(e, Some(libc::ESRCH));
        assert!(!cma_probe(i32::MAX, addr, value));
        let bogus = [1u8, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(cma_offer(&bogus).0, None, "a pid above i32::MAX");
    }

    /// Both sides of `agree_cma` over a loopback connection, with what each allows.
    fn agree(a: bool, b: bool) -> (Option<i32>, Option<i32>) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let t = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).expect("connect");
            agree_cma(&mut s, 0, b).expect("agree")
        });
        let (mut s, _) = listener.accept().expect("accept");
        let mine = agree_cma(&mut s, 1, a).expect("agree");
        (mine, t.join().expect("join"))
    }

    #[test]
    fn both_sides_agree_only_when_both_allow() {
        let me = Some(std::process::id() as i32);
        assert_eq!(agree(true, true), (me, me));
        assert_eq!(agree(true, false), (None, None));
        assert_eq!(agree(false, true), (None, None));
    }

    /// Two ends of one segment in this process (world ranks 0 and 1), with single-copy reads
    /// agreed on the sending and the receiving side as given.
    fn pair(send_cma: bool, recv_cma: bool) -> (Shm, Shm) {
        let path = format!("/dev/shm/hccn-unit-{}-{send_cma}-{recv_cma}", std::process::id());
        let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).expect("open");
        f.set_len(SEG_BYTES as u64).expect("size");
        let (a, b) = (Segment::map(&f, SEG_BYTES).expect("map"), Segment::map(&f, SEG_BYTES).expect("map"));
        let _ = std::fs::remove_file(&path);
        unsaid(&a);
        let me = std::process::id() as i32;
        let mut a = ShmPeer::new(a, true);
        let mut b = ShmPeer::new(b, false);
        a.cma_pid = send_cma.then_some(me);
        b.cma_pid = recv_cma.then_some(me);
        (Shm::new(0, vec![None, Some(a)]), Shm::new(1, vec![Some(b), None]))
    }

    fn hdr(seq: u64, len: usize) -> FrameHeader {
        FrameHeader { tag: 3, ..FrameHeader::control(FrameKind::Collective, 7, 0, seq, len) }
    }

    fn key(seq: u64) -> Key {
        Key { src: 0, kind: FrameKind::Collective, comm_id: 7, seq }
    }

    /// Receives `key` on `shm` into a Vec.
    fn recv(shm: &Shm, inbox: &Inbox, k: Key) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut check = |_: &FrameHeader| Ok(());
        let mut piece = |off: usize, p: &[u8]| {
            assert_eq!(off, out.len(), "pieces in order");
            out.extend_from_slice(p);
        };
        let mut sink = Sink { check: &mut check, out: Out::Pieces(&mut piece), expect: usize::MAX };
        shm.recv(k, inbox, Duration::from_secs(2), &|_| None, &mut sink)?;
        Ok(out)
    }

    #[test]
    fn each_side_says_where_it_runs_in_the_ring_it_produces() {
        let (a, b) = pair(false, true);
        let seen_by = |s: &Shm, peer: u32| s.peer(peer).expect("peer").rx.cpu_word().load(Ordering::Relaxed);
        assert_eq!((seen_by(&a, 1), seen_by(&b, 0)), (u32::MAX, u32::MAX), "nothing said yet");
        a.say_cpu(1);
        assert_eq!((seen_by(&a, 1), seen_by(&b, 0)), (u32::MAX, 1));
        b.say_cpu(0);
        assert_eq!((seen_by(&a, 1), seen_by(&b, 0)), (0, 1));
    }

    #[test]
    fn a_descriptor_is_read_in_place_drained_or_withdrawn() {
        let bytes: Vec<u8> = (0..(CMA_PIECE * 2 + 12)).map(|i| (i * 7 % 251) as u8).collect();
        descriptors_in_every_state(&bytes, false);
        // The same from shareable memory, which the receiver maps rather than reads.
        let mut shared = crate::mem::SharedBuf::new(bytes.len()).expect("alloc");
        shared.copy_from_slice(&bytes);
        descriptors_in_every_state(&shared, true);
    }

    fn descriptors_in_every_state(payload: &[u8], mapped: bool) {
        let (tx, rx) = pair(true, true);
        let (tx_inbox, rx_inbox) = (Inbox::default(), Inbox::default());
        let t = Duration::from_secs(2);
        let want = payload.to_vec();
        assert_eq!(tx.send_desc(1, &hdr(1, payload.len()), payload, &tx_inbox, t).ok(), Some(Some(0)));
        assert_eq!(recv(&rx, &rx_inbox, key(1)).ok().as_ref(), Some(&want), "read in place");
        let maps = rx.peer(0).map(|p| p.rx_state.lock().map(|st| st.maps.mapped()).unwrap_or(0));
        assert_eq!(maps, Some(mapped as usize), "shareable memory is mapped, other memory is not");
        assert!(tx.wait_sent(1, 0, &tx_inbox, t, &|_| None).is_ok(), "acknowledged");
        // Another wait's descriptor moves into the inbox, read whole.
        assert_eq!(tx.send_desc(1, &hdr(2, payload.len()), payload, &tx_inbox, t).ok(), Some(Some(1)));
        rx.drain(None, &rx_inbox);
        assert_eq!(rx_inbox.try_take(key(2)).map(|f| f.payload).as_ref(), Some(&want), "drained");
        assert!(tx.wait_sent(1, 1, &tx_inbox, t, &|_| None).is_ok());
        // Withdrawn before it was read: the receiver gets an error, not stale bytes; the
        // descriptor before it (another operation's, say) is still read.
        assert_eq!(tx.send_desc(1, &hdr(6, payload.len()), payload, &tx_inbox, t).ok(), Some(Some(2)));
        assert_eq!(tx.send_desc(1, &hdr(3, payload.len()), payload, &tx_inbox, t).ok(), Some(Some(3)));
        tx.withdraw(1, 3, &tx_inbox, t);
        assert_eq!(recv(&rx, &rx_inbox, key(6)).ok().as_ref(), Some(&want), "not withdrawn");
        // Told nothing else about the sender (no failure reaches this inbox), the receiver gives
        // the withdrawal as its error after the grace period, before its own deadline.
        let mut check = |_: &FrameHeader| Ok(());
        let mut ignore = |_: usize, _: &[u8]| {};
        let mut sink = Sink { check: &mut check, out: Out::Pieces(&mut ignore), expect: usize::MAX };
        let e = rx.recv(key(3), &rx_inbox, Duration::from_secs(6), &|_| None, &mut sink).err();
        assert_eq!(e.map(|e| e.kind()), Some(ErrorKind::Remote));
        tx.withdraw(1, 2, &tx_inbox, t);
        // The pair stays in step: plain frames and descriptors go on.
        tx.send(1, &hdr(4, 5), b"hello", &tx_inbox, t).expect("send");
        assert_eq!(recv(&rx, &rx_inbox, key(4)).ok().as_deref(), Some(&b"hello"[..]));
        assert_eq!(tx.send_desc(1, &hdr(5, payload.len()), payload, &tx_inbox, t).ok(), Some(Some(4)));
        assert_eq!(recv(&rx, &rx_inbox, key(5)).ok().as_ref(), Some(&want));
    }

    #[test]
    fn after_a_withdrawn_descriptor_the_rest_of_its_frames_is_never_taken_for_it() {
        // A sender posted two chunks of one wait (the second shorter, as a segment's last) and
        // withdrew the first when its operation failed: the receiver must end its wait with the
        // sender's failure, not take the second chunk for the first (which was refused as a
        // protocol error, excluding a live rank from the next agreement). Read from the ring
        // by the receive itself, and moved by a drain first.
        for drained in [false, true] {
            let (tx, rx) = pair(true, true);
            let (tx_inbox, rx_inbox) = (Inbox::default(), Inbox::default());
            let t = Duration::from_secs(2);
            let (first, last) = (vec![1u8; CMA_MIN * 2], vec![2u8; CMA_MIN]);
            let a = tx.send_desc(1, &hdr(7, first.len()), &first, &tx_inbox, t).ok().flatten();
            let b = tx.send_desc(1, &hdr(7, last.len()), &last, &tx_inbox, t).ok().flatten();
            tx.withdraw(1, a.unwrap_or(0), &tx_inbox, t);
            if drained {
                rx.drain(None, &rx_inbox);
            }
            let mut check = |h: &FrameHeader| match h.len as usize == first.len() {
                true => Ok(()),
                false => Err(Error::new(ErrorKind::Transfer, "took a later chunk for the withdrawn one")),
            };
            let mut ignore = |_: usize, _: &[u8]| {};
            let mut sink = Sink { check: &mut check, out: Out::Pieces(&mut ignore), expect: usize::MAX };
            let e = rx.recv(key(7), &rx_inbox, Duration::from_secs(6), &|_| None, &mut sink).err();
            assert_eq!(e.map(|e| e.kind()), Some(ErrorKind::Remote), "drained={drained}");
            tx.withdraw(1, b.unwrap_or(1), &tx_inbox, t);
            // The pair stays usable for other waits.
            tx.send(1, &hdr(8, 5), b"hello", &tx_inbox, t).expect("send");
            assert_eq!(recv(&rx, &rx_inbox, key(8)).ok().as_deref(), Some(&b"hello"[..]), "drained={drained}");
        }
    }

    #[test]
    fn a_descriptor_where_none_was_agreed_or_of_the_wrong_length_is_a_protocol_error() {
        let (tx, rx) = pair(true, false);
        let (tx_inbox, rx_inbox) = (Inbox::default(), Inbox::default());
        let t = Duration::from_secs(2);
        let payload = vec![1u8; CMA_MIN];
        tx.send_desc(1, &hdr(1, payload.len()), &payload, &tx_inbox, t).expect("send");
        let e = recv(&rx, &rx_inbox, key(1)).err().map(|e| (e.kind(), e.message().to_owned()));
        assert!(e.as_ref().is_some_and(|(k, m)| *k == ErrorKind::Transfer && m.contains("none was agreed")), "{e:?}");

        let (tx, rx) = pair(true, true);
        tx.send_desc(1, &hdr(1, payload.len() + 16), &payload, &tx_inbox, t).expect("send");
        let e = recv(&rx, &rx_inbox, key(1)).err().map(|e| (e.kind(), e.message().to_owned()));
        assert!(e.as_ref().is_some_and(|(k, m)| *k == ErrorKind::Transfer && m.contains("out of step")), "{e:?}");
    }

    #[test]
    fn a_descriptor_of_unreadable_memory_is_a_transfer_error_not_a_crash() {
        let (tx, rx) = pair(true, true);
        let (tx_inbox, rx_inbox) = (Inbox::default(), Inbox::default());
        let t = Duration::from_secs(2);
        let len = CMA_MIN;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a fresh private anonymous mapping of `len` bytes, checked for MAP_FAILED.
        let m = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0) };
        assert_ne!(m, libc::MAP_FAILED);
        {
            // SAFETY: the mapping is `len` readable bytes; the slice is gone before the mprotect.
            let payload = unsafe { std::slice::from_raw_parts(m as *const u8, len) };
            tx.send_desc(1, &hdr(1, len), payload, &tx_inbox, t).expect("send");
        }
        // Unreadable but still mapped (unmapped, its addresses could be mapped again by another
        // test thread meanwhile).
        // SAFETY: `m` is the mapping made above, no longer referenced.
        assert_eq!(unsafe { libc::mprotect(m, len, libc::PROT_NONE) }, 0);
        let e = recv(&rx, &rx_inbox, key(1)).err().map(|e| e.kind());
        // SAFETY: as above.
        unsafe { libc::munmap(m, len) };
        assert_eq!(e, Some(ErrorKind::Transfer));
        assert!(tx.wait_sent(1, 0, &tx_inbox, t, &|_| None).is_ok(), "acknowledged all the same");
    }

    #[test]
    fn a_sender_waiting_for_a_dead_reader_gets_an_error() {
        let (tx, _rx) = pair(true, true);
        let tx_inbox = Inbox::default();
        let t = Duration::from_secs(2);
        let payload = vec![1u8; CMA_MIN];
        let index = tx.send_desc(1, &hdr(1, payload.len()), &payload, &tx_inbox, t).ok().flatten();
        tx_inbox.mark_failed(1, crate::transport::Fault::sure("killed"));
        let e = tx.wait_sent(1, index.unwrap_or(0), &tx_inbox, t, &|_| None).err().map(|e| e.kind());
        assert_eq!(e, Some(ErrorKind::RankFailed));
        let e = tx.wait_sent(1, 0, &Inbox::default(), Duration::from_millis(50), &|_| None).err().map(|e| e.kind());
        assert_eq!(e, Some(ErrorKind::Timeout), "nobody reads: the deadline ends the wait");
    }
}
