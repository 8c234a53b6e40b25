//! Reading a link's frames a piece at a time, without ever blocking: the progress engine
//! (engine.rs) calls [`advance`] when the socket is readable and gets back to its other links
//! when the bytes run out, so that a slow or stalled peer holds up no one but itself; a receive
//! that polls its link calls it for one read (`TcpLink::pump`). What a frame half read so far
//! is waits in [`Rx`]. Complete frames are filed here: data into the inbox, control frames
//! (goodbye, suspicions, evictions, abandons, introductions, revokes) into the inbox's health,
//! heartbeats only mark the link heard.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::io::discard_skipped;
use super::{lost, LastHeard};
use crate::config::MAX_CHUNK_BYTES;
use crate::transport::{news, Fault, Frame, Inbox};
use crate::wire::{FrameHeader, FrameKind, HEADER_LEN};

/// What the receiving side of one link shares between the engine and the receives that take
/// their own frames (`TcpLink::pump`, `TcpLink::read_direct`).
pub(super) struct Conn {
    pub peer: u32,
    /// The socket; its descriptor lives as long as anyone (the engine included) holds the Conn.
    pub sock: std::net::TcpStream,
    pub fd: std::os::fd::RawFd,
    pub peer_addr: Option<SocketAddr>,
    pub inbox: Arc<Inbox>,
    pub closing: AtomicBool,
    pub heard: LastHeard,
    /// Held by whichever thread takes bytes off the socket (the engine, or a receive), so that
    /// frames are read whole and filed in the order they came.
    pub reading: Mutex<Rx>,
    /// How many receives poll this link for a small frame, taking it themselves: the engine
    /// stands aside meanwhile (see `TcpLink::poll`).
    pub polled: AtomicU32,
    /// Bytes of a frame that a receive began to land and gave up (see `TcpLink::read_direct`):
    /// whoever reads the socket next discards them first. Changed under `reading`.
    pub skip: AtomicU64,
    /// The engine stopped watching the socket because receives poll it (`polled`); whoever
    /// sees this first once they stop re-arms it (`TcpLink::unpark`), or the engine's tick.
    pub aside: AtomicBool,
    /// The engine found `reading` held by a receive and stopped watching: the receive re-arms
    /// the socket when it lets go (`TcpLink::let_go`).
    pub busy: AtomicBool,
}

impl Drop for Conn {
    /// Reads what is left before the socket closes: a close with unread bytes (a peer's late
    /// heartbeats) makes the kernel reset the connection and drop what it had still to send,
    /// the goodbye too, and the peer takes a reset for a crash.
    fn drop(&mut self) {
        let mut sink = [0u8; 4096];
        for _ in 0..64 {
            // SAFETY: a writable buffer of its length; `sock` keeps `fd` open until after this.
            let n = unsafe { libc::recv(self.fd, sink.as_mut_ptr().cast(), sink.len(), libc::MSG_DONTWAIT) };
            if n <= 0 {
                break;
            }
        }
    }
}

/// A frame taken off the socket so far, and the link's slow-frame record.
pub(super) struct Rx {
    head: [u8; HEADER_LEN],
    head_got: usize,
    /// The header, once all of it came and it passed the checks; the payload comes next.
    hdr: Option<FrameHeader>,
    payload: Vec<u8>,
    began: Option<Instant>,
    slow: Crawl,
    /// Nothing more is read from this socket: a goodbye came, or the link failed.
    pub done: bool,
}

impl Default for Rx {
    fn default() -> Rx {
        Rx {
            head: [0; HEADER_LEN],
            head_got: 0,
            hdr: None,
            payload: Vec::new(),
            began: None,
            slow: Crawl::default(),
            done: false,
        }
    }
}

impl Rx {
    /// True between frames: no bytes of a frame have been taken yet.
    pub fn between_frames(&self) -> bool {
        self.head_got == 0 && self.hdr.is_none()
    }

    /// Bytes of the stream up to the end of the frame under way; between frames, a header's.
    pub fn rest_of_frame(&self) -> usize {
        match self.hdr {
            Some(h) => h.len as usize - self.payload.len(),
            None => HEADER_LEN - self.head_got,
        }
    }
}

/// What one call of [`advance`] came to.
pub(super) enum Step {
    /// The socket has no more bytes now; `data` when a data frame was filed (more are likely
    /// to follow soon).
    Drained { data: bool },
    /// A frame boundary was reached while receives poll the link: they take the next frames.
    Aside { data: bool },
    /// The share of one turn was used up with bytes still waiting.
    More { data: bool },
    /// The link is over: a goodbye (`None`), or the fault that ends it.
    Over(Option<Fault>),
}

/// How much one turn of [`advance`] reads before the engine serves its other links.
const TURN_FRAMES: usize = 16;
const TURN_BYTES: usize = 4 << 20;

/// What one `recv` asks for at a frame boundary, or for the short rest of a payload: small
/// frames then cost a single system call, however many of them wait, where a header read and a
/// payload read took two. A payload whose rest is larger is read straight into its buffer. The
/// bytes land on the reading thread's stack, which may be a host program's small one: 8 KiB,
/// and a header, so that a frame of 8 KiB (a 2-rank alltoall of 16 KiB) takes one `recv`, not
/// a second one for its last 64 bytes.
pub(super) const FEED_BYTES: usize = (8 << 10) + HEADER_LEN;

/// Largest payload of a control frame (goodbye, suspect, evict, mismatch): what the news of
/// every rank of a large job takes, and no more.
const CONTROL_MAX: usize = 1 << 20;

/// Who calls [`advance`], and so how long it reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Turn {
    /// The engine: until the socket is drained or the turn used up, standing aside at a frame
    /// boundary while receives poll the link.
    Engine,
    /// A receive that polls for its frame (`TcpLink::pump`): one `recv` of at most this many
    /// bytes, whatever it held filed.
    Once(usize),
}

/// Reads what the socket holds now, frame by frame, filing each one complete; never blocks.
/// Called under `c.reading` (that is `rx`). Every byte taken off the socket is in `rx` when it
/// returns, so a frame is never left complete but unfiled: the next bytes wake the engine.
pub(super) fn advance(c: &Conn, rx: &mut Rx, turn: Turn) -> Step {
    let mut t = Tally::default();
    match discard_skipped(c.fd, &c.skip, libc::MSG_DONTWAIT) {
        Ok(0) => {}
        Ok(_) => return Step::Drained { data: false },
        Err(e) => return Step::Over(Some(lost(&e))),
    }
    loop {
        if turn == Turn::Engine {
            if rx.between_frames() && c.polled.load(Ordering::SeqCst) > 0 {
                return Step::Aside { data: t.data };
            }
            if t.frames >= TURN_FRAMES || t.bytes >= TURN_BYTES {
                return Step::More { data: t.data };
            }
        }
        let got = match rx.hdr {
            Some(h) if h.len as usize - rx.payload.len() >= FEED_BYTES => read_body(c, rx, &mut t),
            _ => {
                let max = match turn {
                    Turn::Engine => FEED_BYTES,
                    Turn::Once(max) => max.clamp(1, FEED_BYTES),
                };
                read_fed(c, rx, max, &mut t)
            }
        };
        match got {
            Ok(0) => return Step::Drained { data: t.data },
            Ok(n) => t.bytes += n,
            Err(end) => return Step::Over(end),
        }
        if turn != Turn::Engine {
            return Step::Drained { data: t.data };
        }
    }
}

/// What a turn of [`advance`] has read so far.
#[derive(Default)]
struct Tally {
    frames: usize,
    bytes: usize,
    /// A data frame was filed.
    data: bool,
}

/// One non-blocking `recv` into `buf`: how many bytes came (0: none now). The end of the stream
/// and errors are faults (`inside` a frame: said so).
fn recv_now(c: &Conn, buf: *mut u8, len: usize, inside: bool) -> Result<usize, Fault> {
    loop {
        // SAFETY: the callers pass writable memory of `len` bytes; `c.sock` keeps `fd` open.
        let n = unsafe { libc::recv(c.fd, buf.cast(), len, libc::MSG_DONTWAIT) };
        if n > 0 {
            c.heard.now();
            return Ok(n as usize);
        }
        let e = if n == 0 { std::io::ErrorKind::UnexpectedEof.into() } else { std::io::Error::last_os_error() };
        match e.kind() {
            std::io::ErrorKind::Interrupted => {}
            std::io::ErrorKind::WouldBlock => return Ok(0),
            _ => {
                let mut fault = lost(&e);
                if inside {
                    fault.reason = format!("inside a frame: {}", fault.reason);
                }
                return Err(fault);
            }
        }
    }
}

/// One `recv` of up to `max` (at most [`FEED_BYTES`]), fed into `rx`: the frame under way
/// continued, every frame that completes filed, the start of the next one kept.
fn read_fed(c: &Conn, rx: &mut Rx, max: usize, t: &mut Tally) -> Result<usize, Option<Fault>> {
    let mut buf = std::mem::MaybeUninit::<[u8; FEED_BYTES]>::uninit();
    let n = recv_now(c, buf.as_mut_ptr().cast(), max.min(FEED_BYTES), !rx.between_frames())?;
    // SAFETY: the kernel initialised the first `n` bytes of `buf`.
    let mut bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n) };
    while !bytes.is_empty() {
        let k = match rx.hdr {
            None => {
                let k = (HEADER_LEN - rx.head_got).min(bytes.len());
                rx.head[rx.head_got..rx.head_got + k].copy_from_slice(&bytes[..k]);
                rx.head_got += k;
                k
            }
            Some(h) => {
                let k = (h.len as usize - rx.payload.len()).min(bytes.len());
                rx.payload.extend_from_slice(&bytes[..k]);
                k
            }
        };
        bytes = &bytes[k..];
        file_if_whole(c, rx, t)?;
    }
    Ok(n)
}

/// Reads more of the payload under way straight into its buffer; files the frame once whole.
fn read_body(c: &Conn, rx: &mut Rx, t: &mut Tally) -> Result<usize, Option<Fault>> {
    let want = rx.hdr.map_or(0, |h| h.len as usize) - rx.payload.len();
    let spare = &mut rx.payload.spare_capacity_mut()[..want];
    let n = recv_now(c, spare.as_mut_ptr().cast(), spare.len(), true)?;
    // SAFETY: the kernel initialised the first `n` bytes of `spare`, which follow `len()`.
    unsafe { rx.payload.set_len(rx.payload.len() + n) };
    file_if_whole(c, rx, t)?;
    Ok(n)
}

/// Takes the step that bytes just added to `rx` allow: a header complete is checked, a frame
/// complete is filed. `Err` ends the link (a goodbye: `None`).
fn file_if_whole(c: &Conn, rx: &mut Rx, t: &mut Tally) -> Result<(), Option<Fault>> {
    if rx.hdr.is_none() && rx.head_got == HEADER_LEN && !header(c, rx).map_err(Some)? {
        t.frames += 1;
    }
    if let Some(hdr) = rx.hdr.filter(|h| rx.payload.len() as u64 == h.len) {
        t.frames += 1;
        t.data |= file(c, rx, hdr)?;
    }
    Ok(())
}

/// Checks the header just read whole. Frames that are a header alone (heartbeats, revokes) are
/// done with here: `Ok(false)`. Otherwise the payload comes next: `Ok(true)`.
fn header(c: &Conn, rx: &mut Rx) -> Result<bool, Fault> {
    let hdr = FrameHeader::decode(&rx.head, MAX_CHUNK_BYTES)
        .map_err(|e| Fault::cut(format!("refused a frame and closed the connection: {e}")))?;
    rx.head_got = 0;
    let control = matches!(
        hdr.kind,
        FrameKind::Goodbye
            | FrameKind::Suspect
            | FrameKind::Evict
            | FrameKind::Abandon
            | FrameKind::Revoke
            | FrameKind::Intro
            | FrameKind::Relay
    );
    match hdr.kind {
        FrameKind::Heartbeat if hdr.len == 0 => return Ok(false),
        FrameKind::Heartbeat | FrameKind::Revoke if hdr.len != 0 => {
            return Err(Fault::cut(format!("refused a {:?} frame carrying {} bytes", hdr.kind, hdr.len)))
        }
        FrameKind::Revoke => {
            c.inbox.note_revoke(c.peer, hdr);
            return Ok(false);
        }
        _ if control && hdr.len > CONTROL_MAX as u64 => {
            return Err(Fault::cut(format!("refused a {:?} frame of {} bytes", hdr.kind, hdr.len)))
        }
        _ => {}
    }
    rx.payload = crate::transport::pool::take(hdr.len as usize);
    rx.payload.clear();
    rx.payload.reserve_exact(hdr.len as usize);
    rx.hdr = Some(hdr);
    rx.began = Some(Instant::now());
    Ok(true)
}

/// Files the frame read whole: `Ok(true)` for a data frame; `Err` ends the link (a goodbye:
/// `None`).
fn file(c: &Conn, rx: &mut Rx, hdr: FrameHeader) -> Result<bool, Option<Fault>> {
    rx.hdr = None;
    let payload = std::mem::take(&mut rx.payload);
    if let Some(began) = rx.began.take() {
        rx.slow.frame(&c.inbox, c.peer, payload.len(), began);
    }
    let (inbox, peer) = (&c.inbox, c.peer);
    match hdr.kind {
        FrameKind::Goodbye if hdr.tag == crate::transport::farewell::EXIT_TAG => {
            // Its process exits without having destroyed the communicator: lost, but no crash.
            inbox.mark_exited(peer);
            let _ = c.sock.shutdown(std::net::Shutdown::Write);
            return Err(None);
        }
        FrameKind::Goodbye => {
            inbox.mark_departed(peer, news::decode(&payload).unwrap_or_default());
            // Nothing more goes to a rank that left: closing this side ends its wait (`linger`).
            let _ = c.sock.shutdown(std::net::Shutdown::Write);
            return Err(None);
        }
        FrameKind::Intro => match <[u8; 10]>::try_from(&payload[..]) {
            Ok(b) => {
                let id = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
                let port = u16::from_le_bytes([b[8], b[9]]);
                let pulse = c.peer_addr.filter(|_| port != 0).map(|a| SocketAddr::new(a.ip(), port));
                inbox.note_intro(peer, id, pulse);
            }
            Err(_) => return Err(Some(Fault::cut("refused a malformed intro frame and closed the connection"))),
        },
        FrameKind::Evict => {
            let why = String::from_utf8_lossy(&payload).into_owned();
            return Err(Some(Fault::cut(format!("it declared this rank dead ({why}) and closed the connection"))));
        }
        FrameKind::Suspect => match news::decode(&payload) {
            Some(faults) => inbox.note_suspects(peer, faults, peer),
            None => return Err(Some(Fault::cut("refused a malformed suspect frame and closed the connection"))),
        },
        FrameKind::Relay => match news::decode_relay(&payload) {
            Some((reporter, faults)) => inbox.note_relayed(reporter, faults, peer),
            None => return Err(Some(Fault::cut("refused a malformed relay frame and closed the connection"))),
        },
        FrameKind::Abandon => inbox.note_abandon(peer, hdr, &payload),
        _ => {
            inbox.push(peer, Frame { hdr, payload, landed: false });
            return Ok(true);
        }
    }
    Ok(false)
}

/// Ends the link after [`Step::Over`]: nothing more is read; a fault (unless the link is
/// closing) shuts the socket and marks the peer failed. Called under `reading`.
pub(super) fn finish(c: &Conn, rx: &mut MutexGuard<'_, Rx>, end: Option<Fault>) {
    rx.done = true;
    if let Some(fault) = end {
        if !c.closing.load(Ordering::SeqCst) {
            let _ = c.sock.shutdown(std::net::Shutdown::Both);
            c.inbox.mark_failed(c.peer, fault);
        }
    }
}

/// Large frames that crawl in: a slow link, shown as a straggler link in the trace and logged
/// once (`HCCN_LOG=warn`), never counted as a failure while its bytes keep coming.
#[derive(Default)]
struct Crawl {
    warned: bool,
    /// When the last straggler event was traced: at most one a second.
    last: Option<Instant>,
}

/// A frame slower than this, of at least `CRAWL_BYTES`, that took at least `CRAWL_TIME`, is a
/// straggler. The time floor keeps out a reader that its crowded core kept waiting: 4 ranks on 2
/// cores over loopback showed 512 KiB frames of 11 ms, while a link held to 4 Mbit/s takes 131
/// ms for one of 64 KiB.
const CRAWL_RATE: f64 = 50e6;
const CRAWL_BYTES: usize = 64 << 10;
const CRAWL_TIME: Duration = Duration::from_millis(50);

impl Crawl {
    fn frame(&mut self, inbox: &Inbox, peer: u32, len: usize, began: Instant) {
        let took = began.elapsed();
        if len < CRAWL_BYTES || took < CRAWL_TIME || (len as f64) >= CRAWL_RATE * took.as_secs_f64() {
            return;
        }
        if !std::mem::replace(&mut self.warned, true) {
            let rate = len as f64 / took.as_secs_f64() / 1e6;
            tracing::warn!(peer, "slow link: a frame of {len} bytes took {} ms ({rate:.1} MB/s)", took.as_millis());
        }
        if self.last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            self.last = Some(Instant::now());
            let me = inbox.rank_of(crate::transport::incarnation()).unwrap_or(0);
            crate::trace::straggler(crate::trace::started_ago(took), me, peer);
        }
    }
}
