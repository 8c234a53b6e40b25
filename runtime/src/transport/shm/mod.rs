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
//! processes may read each other's memory with `process_vm_readv` (pid namespaces, ptrace policy or
//! seccomp may forbid it; `HCCN_CMA=off` does), and such a read costs this host less than the
//! copies it saves or the frame lies in memory the receiver maps ([`Shm::single_copy`]), a sender
//! that can wait for completion ([`Shm::send_desc`], used by the pipelined ring) writes a one-slot
//! descriptor of its buffer instead of the payload. The receiver reads the payload from the
//! sender's memory (with plain loads when it lies in shareable memory the receiver has mapped, see
//! `mem.rs`) and hands it to its sink, then acknowledges it in the control block; the sender leaves
//! its buffer alone until then ([`Shm::wait_sent`]), or withdraws what was not read yet when its
//! operation fails ([`Shm::withdraw`]). Plain sends always use the ring: a sender blocked until its
//! receiver reads could wait in a cycle of ranks that all send first.
//!
//! Waits spin briefly (not at all when the host's ranks outnumber its cores), then yield, then
//! sleep on a futex in the shared page (woken by the other side, or after 1 ms to look at the
//! peer's health). A waiting sender or receiver also drains the other rings into the inbox, so
//! that ranks blocked on full rings in a cycle can never deadlock: as with TCP, a send always
//! completes eventually, whatever the receiver is doing. Where the ranks outnumber the cores, a
//! waiter that yielded says in the rings it produces which core it runs on, and the ranks keep
//! themselves evenly spread over the cores (placement.rs).

mod cma;
mod handshake;
mod recv;
mod ring;
mod segment;
mod send;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::kernel_liveness::Process;
use super::{Flow, Frame, Health, Inbox, Key};
use crate::config::{Cma, Config, Transport, MAX_CHUNK_BYTES};
use crate::error::{Error, ErrorKind, Result};
use crate::mem::{PeerMaps, RegionRef};
use crate::transport::placement::{self, here, Countdown};
use crate::transport::vouch;
use crate::wire::{FrameHeader, FrameKind, HEADER_LEN};

pub(crate) use crate::transport::sink::{Out, Sink, WritePiece};
pub(crate) use crate::transport::wait::{futex_wait, futex_wake, Backoff, Wait, NAP};
use cma::*;
pub use cma::{read_cost, ReadCost};
pub(crate) use handshake::{handshake, Learnt};
use ring::Ring;
pub(crate) use segment::{demote, demote_small, fell_back, host_id, HostId, Segment};

/// Payload bytes per slot; a multiple of 16 so that pieces of a frame never split an element.
const SLOT_DATA: usize = 64 << 10;
/// Slot header: frame header, piece length, flags.
const SLOT_HEAD: usize = 64;
const SLOT_BYTES: usize = SLOT_HEAD + SLOT_DATA;
const SLOTS: u64 = 16;
/// Ring control block: head, tail, data futex, space futex, CMA acknowledgements, the core the
/// producer last ran on, each on its own cache line, then the states of the descriptors in flight,
/// then when the producer last heard each remote host (vouch.rs).
const CTRL: usize = HEARD_AT + vouch::SLOTS * 8;
const CPU_AT: usize = 320;
const CMA_STATES_AT: usize = 384;
const HEARD_AT: usize = CMA_STATES_AT + CMA_STATES as usize * 8;
// Slots begin on a cache line.
const _: () = assert!(CTRL.is_multiple_of(64));
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
/// Smallest frame of a gather's sender that goes through the ring where ranks have a core each:
/// its copy into the ring runs while the root copies its own block and reads the others, which
/// a read in place leaves to the root alone (2 bound ranks: 512 KiB 63-70 us against 76-110 by
/// the read in place, 16 MiB 3.0-3.9 ms against 5.2-6.8; 128 KiB 15 against 13).
const COLLECTED_RING_MIN: usize = 512 << 10;

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
    /// Whether frames to the peer may go by descriptor for a `process_vm_readv`, which costs
    /// more than the copies it saves on some hosts (see [`reads_pay`]); a frame in shareable
    /// memory, read with plain loads, may whenever `cma_pid` is known.
    reads_pay: bool,
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
            reads_pay: false,
        }
    }
}

impl ShmPeer {
    /// True when large frames to this peer go by descriptor.
    pub fn cma(&self) -> bool {
        self.cma_pid.is_some()
    }
}

/// The shared-memory links of one world, by world rank: set up as the world forms, or later,
/// once each, when a world that connects on demand first links a pair ([`Shm::add`]).
#[derive(Default)]
pub(crate) struct Shm {
    /// This rank's world rank.
    me: u32,
    peers: Vec<OnceLock<ShmPeer>>,
    /// The processes of this host's peers that this rank sees in /proc, whatever their link.
    processes: Vec<OnceLock<Process>>,
    /// The world's ranks on this host that may link by shared memory, this one included.
    local: usize,
    wait: Wait,
    /// The core this rank last said it runs on, in every ring it produces.
    said: AtomicU32,
    spread_in: Countdown,
}

impl crate::transport::wait::Yielded for Shm {
    fn yielded(&self) {
        self.spread();
    }
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
    /// The links `peers` (by world rank) of a world with `local` ranks on this host that may link
    /// by shared memory (more may link later, see [`Shm::add`]).
    pub fn new(me: u32, peers: Vec<Option<ShmPeer>>, local: usize) -> Shm {
        let local = local.max(1 + peers.iter().filter(|p| p.is_some()).count());
        let processes = peers.iter().map(|_| OnceLock::new()).collect();
        let peers = peers.into_iter().map(|p| p.map_or_else(OnceLock::new, OnceLock::from)).collect();
        let wait = Wait::for_local_ranks(local);
        Shm { me, peers, processes, local, wait, said: AtomicU32::new(u32::MAX), spread_in: Countdown::default() }
    }

    /// Files the process of peer `rank`, learnt at a handshake (the first one stays).
    pub fn know_process(&self, rank: u32, process: Option<Process>) {
        if let (Some(slot), Some(p)) = (self.processes.get(rank as usize), process) {
            let _ = slot.set(p);
        }
    }

    /// Files the link to `rank` set up after the world formed; false when it has one already.
    pub fn add(&self, rank: u32, peer: ShmPeer) -> bool {
        let Some(slot) = self.peers.get(rank as usize) else { return false };
        let said = self.said.load(Ordering::Relaxed);
        if said != u32::MAX {
            peer.tx.cpu_word().store(said, Ordering::Relaxed);
        }
        slot.set(peer).is_ok()
    }

    /// The links there are now.
    fn linked(&self) -> impl Iterator<Item = (u32, &ShmPeer)> {
        self.peers.iter().enumerate().filter_map(|(rank, p)| p.get().map(|p| (rank as u32, p)))
    }

    fn backoff(&self) -> Backoff<'_> {
        Backoff::with_after_yield(self.wait, self)
    }

    /// After a waiter yielded (the host's ranks outnumber its cores): says in its rings where
    /// this rank runs now (a write per local peer, only on a change), and now and then moves it
    /// off a crowded core (placement.rs).
    fn spread(&self) {
        let mine = here();
        self.publish_cpu(mine);
        if !self.spread_in.due() {
            return;
        }
        let cores = |f: &mut dyn FnMut(u32, u32)| {
            f(self.me, mine);
            for (rank, p) in self.linked() {
                f(rank, p.rx.cpu_word().load(Ordering::Relaxed));
            }
        };
        if let Some(to) = placement::spread(self.me, mine, &cores) {
            self.spread_in.after_move();
            self.publish_cpu(to);
        }
    }

    fn publish_cpu(&self, cpu: u32) {
        if self.said.swap(cpu, Ordering::Relaxed) != cpu {
            self.linked().for_each(|(_, p)| p.tx.cpu_word().store(cpu, Ordering::Relaxed));
        }
    }

    /// Publishes to every host-mate linked by shared memory when this rank last heard each remote
    /// host: `heard` gives how long ago, by host tag (see vouch.rs).
    pub fn publish_heard(&self, heard: impl IntoIterator<Item = (u32, Duration)>) {
        let words = vouch::entries(clock_ms(), heard);
        for (_, p) in self.linked() {
            for (i, &w) in words.iter().enumerate() {
                if p.tx.heard_word(i).load(Ordering::Relaxed) != w {
                    p.tx.heard_word(i).store(w, Ordering::Relaxed);
                }
            }
        }
    }

    /// How long ago any host-mate linked by shared memory last heard the host tagged `tag`.
    pub fn mates_heard(&self, tag: u32) -> Option<Duration> {
        let words =
            self.linked().flat_map(|(_, p)| (0..vouch::SLOTS).map(|i| p.rx.heard_word(i).load(Ordering::Relaxed)));
        vouch::mates_heard(clock_ms(), tag, words)
    }

    /// No rank of the world may link with this one by shared memory, now or later.
    pub fn is_empty(&self) -> bool {
        self.local <= 1
    }

    /// How this host's waiters wait (spin or yield first), for other shared-memory waits.
    pub(super) fn wait(&self) -> Wait {
        self.wait
    }

    pub fn has(&self, rank: u32) -> bool {
        self.peer(rank).is_some()
    }

    fn peer(&self, rank: u32) -> Option<&ShmPeer> {
        self.peers.get(rank as usize).and_then(OnceLock::get)
    }

    /// The process of peer `rank` as the kernel shows it, when this rank can see it.
    pub fn process(&self, rank: u32) -> Option<Process> {
        self.processes.get(rank as usize).and_then(OnceLock::get).copied()
    }

    /// True when frames to `rank` may go by descriptor (both sides agreed at the handshake).
    pub fn cma(&self, rank: u32) -> bool {
        self.peer(rank).is_some_and(|p| p.cma_pid.is_some())
    }

    /// True when `payload` should go to `rank` by descriptor, for the receiver to read once,
    /// rather than be copied through the ring. A payload in shareable memory the receiver maps
    /// always does: it is read with plain loads. Otherwise the receiver's `process_vm_readv`
    /// (which pins the sender's pages) must pay on this host ([`reads_pay`]: on the 2-core
    /// development VM it costs 3-4 copies, and 2 bound ranks ran allreduces of 1-16 MiB 1.5-2x
    /// faster, scatters of 1 MiB 3x, through the rings). Where the host's ranks outnumber its
    /// cores, a frame its receiver combines on arrival never goes by a read: a receiver's read
    /// while it reduces and its sender waits cost more than two copies made by both sides
    /// through the ring's cached slots (4 ranks on 2 cores: the ring allreduce 1.6-2x slower
    /// from 1 to 64 MiB); a frame only stored does (there: alltoall of 256 KiB 47-56 us against
    /// 72, allgather of 1 MiB 750-865 against 1,120-1,240, on a host where reads paid). A frame
    /// collected beside other work (a gather's root) takes the ring from
    /// [`COLLECTED_RING_MIN`].
    pub fn single_copy(&self, rank: u32, payload: &[u8], flow: Flow) -> bool {
        let Some(p) = self.peer(rank).filter(|p| p.cma_pid.is_some()) else { return false };
        let own_core = !self.wait.shares_cores();
        let by_read = p.reads_pay
            && match flow {
                Flow::Stored => true,
                Flow::Combined => own_core,
                Flow::Collected => own_core && payload.len() < COLLECTED_RING_MIN,
            };
        by_read || crate::mem::find(payload.as_ptr() as usize, payload.len()).is_some()
    }
}

/// The shared-memory data channel of a peer on this host (see the module's documentation).
pub(crate) struct ShmChannel {
    pub shm: Arc<Shm>,
    pub peer: u32,
    pub inbox: Arc<Inbox>,
    pub timeout: Duration,
}

impl ShmChannel {
    /// The error for a send to a peer this rank lost earlier.
    fn lost_earlier(&self) -> Result<()> {
        if self.inbox.health_changes() == 0 {
            return Ok(());
        }
        match self.inbox.failed_reason(self.peer) {
            Some(reason) => {
                Err(Error::rank_failed(vec![self.peer], format!("world rank {} failed earlier: {reason}", self.peer)))
            }
            None => Ok(()),
        }
    }
}

impl crate::transport::channel::Channel for ShmChannel {
    fn name(&self) -> &'static str {
        "shm"
    }

    fn send(&self, hdr: &FrameHeader, payload: &[u8]) -> Result<()> {
        self.lost_earlier()?;
        self.shm.send(self.peer, hdr, payload, &self.inbox, self.timeout)
    }

    fn send_start(&self, hdr: &FrameHeader, payload: &[u8], flow: Flow) -> Result<Option<u64>> {
        if payload.len() < CMA_MIN || !self.shm.single_copy(self.peer, payload, flow) {
            return self.send(hdr, payload).map(|()| None);
        }
        self.lost_earlier()?;
        self.shm.send_desc(self.peer, hdr, payload, &self.inbox, self.timeout)
    }

    fn send_wait(&self, index: u64, status: crate::transport::channel::Status<'_>) -> Result<()> {
        self.shm.wait_sent(self.peer, index, &self.inbox, self.timeout, status)
    }

    fn send_withdraw(&self, index: u64) {
        self.shm.withdraw(self.peer, index, &self.inbox, self.timeout)
    }

    fn recv(
        &self,
        key: Key,
        timeout: Duration,
        status: crate::transport::channel::Status<'_>,
        sink: &mut Sink<'_, '_>,
    ) -> Result<()> {
        self.shm.recv(key, &self.inbox, timeout, status, sink)
    }
}

/// Milliseconds of CLOCK_MONOTONIC: one clock for every process of this host.
fn clock_ms() -> u64 {
    // SAFETY: a timespec is plain integers (all zeroes valid), filled by the call.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and a timespec to fill; it cannot fail with these arguments.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1000 + u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000
}
