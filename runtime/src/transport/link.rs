//! One peer's TCP connection as the rest of the transport sees it ([`Link`]), and the frames
//! that arrive on connections ([`Key`], [`Frame`]).

use std::cell::RefCell;
use std::time::{Duration, Instant};

use crate::wire::{FrameHeader, FrameKind};

/// How long a thread that waits for a TCP frame (the receive, in the inbox; the link's reader,
/// at its socket) polls, yielding between looks, before it sleeps in the kernel. A sleeping
/// thread costs a wake-up per frame, and in a virtual machine the wake-up of an idle vCPU waits
/// for the host's scheduler (a blocking 8-byte round trip over loopback took 80 µs here, a
/// polled one 5.4 µs); a 256 KiB chunk over loopback takes about 100 µs to arrive.
pub(crate) const TCP_POLL: Duration = Duration::from_micros(200);

/// Yields until `ready` or until `budget` has passed; true when `ready`.
pub(crate) fn poll_yielding(budget: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if ready() {
            return true;
        }
        if start.elapsed() >= budget {
            return false;
        }
        std::thread::yield_now();
    }
}

/// One direction of traffic to a peer.
pub(crate) trait Link: Send + Sync {
    /// Writes one frame; an error means the peer is unreachable.
    fn send(&self, hdr: &FrameHeader, payload: &[u8]) -> std::io::Result<()>;
    /// Closes the connection; with a goodbye (carrying the news given), so that the peer sees a
    /// departure, not a failure.
    fn close(&self, goodbye: Option<&[u8]>);
    /// After a close with a goodbye: reads what the peer still sends until it closes its side
    /// too, or until `until` (see tcp's `linger`).
    fn linger(&self, _until: std::time::Instant) {}
    /// Sends a control frame (suspicions, an eviction) unless that would wait for another
    /// thread's frame or a full socket; false when not sent (try again later).
    fn control(&self, hdr: &FrameHeader, payload: &[u8]) -> bool;
    /// Sends a heartbeat unless that would wait (a busy link proves life by itself).
    fn heartbeat(&self);
    /// Time since the last frame arrived from the peer (since the link was made, before the
    /// first).
    fn silent_for(&self) -> Duration;
    /// Whether any frame has arrived from the peer yet.
    fn heard_yet(&self) -> bool {
        true
    }
    /// True when bytes from the peer are waiting to be read (it spoke; we did not listen yet).
    fn has_unread(&self) -> bool;
    /// How many segments carrying the peer's bytes this host's kernel has received on the link,
    /// readable or not (out of order behind a lost one), where the kernel says (TCP_INFO).
    fn segments_in(&self) -> Option<u32> {
        None
    }

    /// After a send to this link's peer failed: whether the peer had said goodbye (it left on
    /// purpose and reads nothing more), giving the progress engine a moment to read a goodbye
    /// still waiting in the socket. A survivor that leaves right after an error must not be
    /// blamed by one still sending to it.
    fn departed_before(&self, inbox: &crate::transport::Inbox, peer: u32) -> bool {
        let until = std::time::Instant::now() + std::time::Duration::from_millis(100);
        while self.has_unread() && !inbox.has_departed(peer) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        inbox.has_departed(peer)
    }
    /// The polling wait of a receive for a frame from this peer (see TCP_POLL): yields until
    /// `ready` or until `budget` has passed; true when `ready`. A link may meanwhile take
    /// frames off its connection into the inbox itself, so that the receive need not wait for
    /// the progress engine, and, when `small` (the frame expected is at most
    /// [`POLL_ALONE_MAX`]) or when the receive offers to `land` its frame, have that thread
    /// stand aside.
    fn poll(&self, budget: Duration, ready: &dyn Fn() -> bool, _small: bool, _land: Option<&DirectRead<'_>>) -> bool {
        poll_yielding(budget, ready)
    }
}

/// A receive's offer to take its frame straight into its buffer (see [`Link::poll`]): a large
/// frame that is only stored, so that it is copied out of the kernel once, not into a pooled
/// buffer first and then again.
pub(crate) struct DirectRead<'a> {
    pub key: Key,
    pub dst: &'a RefCell<&'a mut [u8]>,
    /// True once the receive must end (its deadline passed, its communicator failed): a frame
    /// half read is then left for the reader to discard.
    pub give_up: &'a dyn Fn() -> bool,
}

/// Largest frame for which a polling receive reads the socket alone (see [`Link::poll`]):
/// above it the engine's copy of one chunk overlaps the receive's work on the last.
pub(crate) const POLL_ALONE_MAX: usize = 64 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Key {
    pub src: u32,
    pub kind: FrameKind,
    pub comm_id: u64,
    pub seq: u64,
}

#[derive(Debug)]
pub(crate) struct Frame {
    pub hdr: FrameHeader,
    pub payload: Vec<u8>,
    /// The payload was read straight into the receive's buffer (see [`Link::poll`]); `payload`
    /// is empty, the frame only says so.
    pub landed: bool,
}
