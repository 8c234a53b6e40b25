//! TCP links: one authenticated socket per pair of ranks, a reader thread per socket that files
//! frames into the [`Inbox`], and writes with `MSG_NOSIGNAL` so a dead peer is an error, never a
//! SIGPIPE in the host program.

use std::io::Read;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::shm::{futex_wait, futex_wake};
use super::{news, shm, Fault, Frame, Inbox, Key, Landing, Link, Net};
use crate::auth::{self, Purpose};
use crate::config::{Config, MAX_CHUNK_BYTES};
use crate::error::{Error, ErrorKind, Result};
use crate::rendezvous::Store;
use crate::wire::{FrameHeader, FrameKind, HEADER_LEN};

struct TcpLink {
    peer: u32,
    /// The socket's descriptor, for what must not wait for the writer lock (a sender may hold it
    /// while blocked on a frozen peer): peeking, and the shutdown that unblocks that sender.
    fd: std::os::fd::RawFd,
    writer: Mutex<TcpStream>,
    closing: Arc<AtomicBool>,
    reader: Mutex<Option<JoinHandle<()>>>,
    heard: Arc<LastHeard>,
    inbox: Arc<Inbox>,
    /// Held by whichever thread takes a frame off the socket (the reader thread, or a receive
    /// in [`TcpLink::pump`]), so that frames are read whole and filed in the order they came.
    reading: Arc<Mutex<()>>,
    /// How many receives poll this link for a small frame, taking it themselves: the reader
    /// thread stands aside meanwhile (a futex word, see [`Link::poll`]).
    polled: Arc<AtomicU32>,
    /// Bytes of a frame that a receive began to land and gave up (see [`TcpLink::land`]):
    /// whoever reads the socket next discards them first. Changed under `reading`.
    skip: Arc<AtomicU64>,
}

/// When the last frame arrived, as milliseconds since the link started.
struct LastHeard {
    start: Instant,
    ms: AtomicU64,
}

impl LastHeard {
    fn now(&self) {
        self.ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

/// Sends `head` then `payload` whole, with `sendmsg` of both (a small frame leaves in one
/// segment without being copied into a buffer of its own first), resuming after partial writes.
fn send_all(sock: &TcpStream, mut head: &[u8], mut payload: &[u8]) -> std::io::Result<()> {
    while !head.is_empty() || !payload.is_empty() {
        let mut iov = [
            libc::iovec { iov_base: head.as_ptr() as *mut libc::c_void, iov_len: head.len() },
            libc::iovec { iov_base: payload.as_ptr() as *mut libc::c_void, iov_len: payload.len() },
        ];
        // SAFETY: a zeroed msghdr is valid (no name, no control data); it points at `iov`,
        // whose two entries cover exactly the readable `head` and `payload`.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = iov.len() as _;
        // SAFETY: as above; the fd is owned by `sock`.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        let from_head = (n as usize).min(head.len());
        head = &head[from_head..];
        payload = &payload[n as usize - from_head..];
    }
    Ok(())
}

/// Sends a whole frame unless the socket cannot take its first byte now (a full buffer: the
/// peer is not reading); once a byte is out the rest follows, waiting if need be, so that a
/// frame is never left half written. True when sent.
fn send_all_unless_full(sock: &TcpStream, head: &[u8], payload: &[u8]) -> bool {
    // SAFETY: `head` is a readable buffer of its length; the fd belongs to `sock`.
    let n = unsafe { libc::send(sock.as_raw_fd(), head.as_ptr().cast(), 1, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    n == 1 && send_all(sock, &head[1..], payload).is_ok()
}

impl Link for TcpLink {
    fn send(&self, hdr: &FrameHeader, payload: &[u8]) -> std::io::Result<()> {
        let head = hdr.encode();
        let sock = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        send_all(&sock, &head, payload)
    }

    fn close(&self, goodbye: Option<&[u8]>) {
        self.closing.store(true, Ordering::SeqCst);
        if let Some(news) = goodbye {
            let sock = self.writer.lock().unwrap_or_else(|p| p.into_inner());
            let hdr = FrameHeader { len: news.len() as u64, ..GOODBYE };
            let _ = send_all(&sock, &hdr.encode(), news);
        }
        // SAFETY: `fd` stays open as long as `writer` (owned by self) lives.
        unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
        // A reader standing aside (see `poll`) sees `closing` at once.
        futex_wake(&self.polled);
        if let Some(t) = self.reader.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
        tracing::debug!(peer = self.peer, graceful = goodbye.is_some(), "link closed");
    }

    fn control(&self, hdr: &FrameHeader, payload: &[u8]) -> bool {
        // Never wait behind another thread's frame: the caller tries again later.
        let Ok(sock) = self.writer.try_lock() else { return false };
        send_all_unless_full(&sock, &hdr.encode(), payload)
    }

    fn heartbeat(&self) {
        if let Ok(sock) = self.writer.try_lock() {
            let beat = FrameHeader::control(FrameKind::Heartbeat, 0, 0, 0, 0);
            let b = beat.encode();
            // Never wait: a full socket buffer means the peer has data to read from us already.
            // SAFETY: `b` is a readable buffer of its length; the fd belongs to `sock`.
            unsafe {
                libc::send(sock.as_raw_fd(), b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
            };
        }
    }

    fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.heard.ms.load(Ordering::Relaxed));
        self.heard.start.elapsed().saturating_sub(last)
    }

    fn has_unread(&self) -> bool {
        let mut b = [0u8; 1];
        // SAFETY: peeks at most one byte into a local buffer; `fd` lives as long as self.
        let n = unsafe { libc::recv(self.fd, b.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        n > 0
    }

    fn poll(&self, budget: Duration, ready: &dyn Fn() -> bool, small: bool, land: Option<&Landing<'_>>) -> bool {
        let look = || land.is_some_and(|l| self.land(l)) || self.pump() || ready();
        if !small && land.is_none() {
            // A large frame is the reader's to copy while this thread works on the last one:
            // wake the reader in case it stands aside after an earlier small receive.
            futex_wake(&self.polled);
            return super::poll_yielding(budget, look);
        }
        // The receive takes its frame itself (small ones whole, one it lands straight into its
        // buffer): a reader thread woken by each would find nothing to do, and take a core
        // from the ranks that share it.
        self.polled.fetch_add(1, Ordering::SeqCst);
        let got = super::poll_yielding(budget, look);
        if self.polled.fetch_sub(1, Ordering::SeqCst) == 1 && !got {
            // The receive will sleep: from now on the reader must watch the socket.
            futex_wake(&self.polled);
        }
        got
    }
}

impl TcpLink {
    /// Takes one frame off the connection into the inbox if that can be done at once (the
    /// whole frame is there and no other thread is reading), so that a receive that waits
    /// for it need not wait for the link's reader thread; true when it did.
    fn pump(&self) -> bool {
        let Ok(_reading) = self.reading.try_lock() else { return false };
        if !self.caught_up() {
            return false;
        }
        let mut peeked = [0u8; HEADER_LEN + PEEK_PAYLOAD];
        let Some((hdr, seen)) = whole_frame(self.fd, &mut peeked) else { return false };
        let data = hdr.kind != FrameKind::Heartbeat;
        let len = hdr.len as usize;
        // Every byte of the frame is in the socket: no read below can block.
        let mut payload = if data { super::pool::take(len) } else { Vec::new() };
        let read = if HEADER_LEN + len <= seen {
            // The peek showed the whole frame: take it off the socket in one read of its length
            // (the same bytes again), not two.
            let frame = &mut peeked[..HEADER_LEN + len];
            read_exact_fd(self.fd, frame).map(|()| payload.extend_from_slice(&frame[HEADER_LEN..]))
        } else {
            let mut head = [0u8; HEADER_LEN];
            read_exact_fd(self.fd, &mut head).and_then(|()| read_payload(self.fd, &mut payload, len, None))
        };
        if let Err(e) = read {
            return self.fail(&e);
        }
        self.heard.now();
        if data {
            self.inbox.push(self.peer, Frame { hdr, payload, landed: false });
        }
        true
    }

    /// Reads the frame at the head of the stream straight into `l.dst` when it is the next
    /// frame of `l.key` (none of its frames waits in the inbox) and exactly as long, then files
    /// a marker for it (`Frame::landed`); true when it did. It waits for the payload as it
    /// comes, until the receive must give up: then the rest of the frame is left to be
    /// discarded (`skip`), and `dst` is never written again.
    fn land(&self, l: &Landing<'_>) -> bool {
        let Ok(_reading) = self.reading.try_lock() else { return false };
        if !self.caught_up() || self.inbox.has_queued(&l.key) {
            return false;
        }
        let Some(mut head) = peek_header(self.fd) else { return false };
        let mut dst = l.dst.borrow_mut();
        let ours = FrameHeader::decode(&head, MAX_CHUNK_BYTES).ok().filter(|h| {
            Key { src: self.peer, kind: h.kind, comm_id: h.comm_id, seq: h.seq } == l.key && h.len == dst.len() as u64
        });
        let Some(hdr) = ours else { return false };
        if let Err(e) = read_exact_fd(self.fd, &mut head) {
            self.fail(&e);
            return false;
        }
        let mut got = 0;
        while got < dst.len() {
            let rest = &mut dst[got..];
            // SAFETY: `rest` is writable memory of its length; `fd` lives as long as self.
            let n = unsafe { libc::recv(self.fd, rest.as_mut_ptr().cast(), rest.len(), libc::MSG_DONTWAIT) };
            if n > 0 {
                got += n as usize;
                self.heard.now();
                continue;
            }
            let e = std::io::Error::last_os_error();
            match n {
                0 => return self.fail(&std::io::ErrorKind::UnexpectedEof.into()),
                _ if e.kind() == std::io::ErrorKind::Interrupted => {}
                _ if e.kind() != std::io::ErrorKind::WouldBlock => return self.fail(&e),
                _ if (l.give_up)() => {
                    self.skip.store((dst.len() - got) as u64, Ordering::SeqCst);
                    return false;
                }
                _ => {
                    let mut p = libc::pollfd { fd: self.fd, events: libc::POLLIN, revents: 0 };
                    // SAFETY: one valid pollfd; `fd` lives as long as self.
                    unsafe { libc::poll(&mut p, 1, 1) };
                }
            }
        }
        self.inbox.push(self.peer, Frame { hdr, payload: Vec::new(), landed: true });
        true
    }

    /// Discards what a receive left of a frame it gave up (see `land`); false while some of
    /// it is still to come. Called under `reading`.
    fn caught_up(&self) -> bool {
        discard_skipped(self.fd, &self.skip, libc::MSG_DONTWAIT).is_ok_and(|left| left == 0)
    }

    /// The connection broke inside a frame: as the reader thread would, close it and say why.
    fn fail(&self, e: &std::io::Error) -> bool {
        if !self.closing.load(Ordering::SeqCst) {
            // SAFETY: `fd` stays open as long as `writer` (owned by self) lives.
            unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
            let mut fault = lost(e);
            fault.reason = format!("inside a frame: {}", fault.reason);
            self.inbox.mark_failed(self.peer, fault);
        }
        false
    }
}

const GOODBYE: FrameHeader = FrameHeader {
    kind: FrameKind::Goodbye,
    comm_id: 0,
    epoch: 0,
    seq: 0,
    tag: 0,
    len: 0,
    fp: crate::wire::Fingerprint { op: 0, dtype: 0, redop: 0, root: 0, count: 0 },
};

/// What a broken connection says of the peer: an end without a goodbye, or a reset, is its
/// process gone (the kernel closes a dead process's sockets); anything else only a lost link.
fn lost(e: &std::io::Error) -> Fault {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => {
            Fault::sure("connection closed without a goodbye (the process exited or was killed)")
        }
        std::io::ErrorKind::ConnectionReset => Fault::sure(format!("connection reset: {e}")),
        _ => Fault::cut(format!("connection lost: {e}")),
    }
}

/// Reads exactly `len` bytes into the empty `buf`'s reserved capacity: whatever the socket
/// holds at each call (`read_to_end` reads in pieces from 8 KiB up, a call each), and without
/// zero-filling first, which would touch every byte twice.
///
/// Every piece that arrives marks the link heard: a large frame crossing a slow link is a peer
/// that speaks, not a silent one.
fn read_payload(
    fd: std::os::fd::RawFd,
    buf: &mut Vec<u8>,
    len: usize,
    heard: Option<&LastHeard>,
) -> std::io::Result<()> {
    buf.clear();
    buf.reserve_exact(len);
    while buf.len() < len {
        let want = len - buf.len();
        let spare = &mut buf.spare_capacity_mut()[..want];
        // SAFETY: `spare` is writable memory of its length inside `buf`'s allocation.
        let n = unsafe { recv_some(fd, spare.as_mut_ptr().cast(), spare.len()) }?;
        // SAFETY: the kernel initialised the first `n` bytes of `spare`, which follow `len()`.
        unsafe { buf.set_len(buf.len() + n) };
        if let Some(h) = heard {
            h.now();
        }
    }
    Ok(())
}

/// One `recv` of at most `len` (> 0) bytes into `ptr`: how many came. The end of the stream
/// is `UnexpectedEof`; an interrupted call is retried.
///
/// # Safety
/// `ptr` must be writable for `len` bytes; the caller keeps `fd` open.
unsafe fn recv_some(fd: std::os::fd::RawFd, ptr: *mut u8, len: usize) -> std::io::Result<usize> {
    loop {
        // SAFETY: as the caller promises.
        let n = unsafe { libc::recv(fd, ptr.cast(), len, 0) };
        if n > 0 {
            return Ok(n as usize);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Reads and drops the bytes `skip` counts (the rest of a frame a receive gave up landing),
/// as far as `recv` with `flags` goes; how many are left.
fn discard_skipped(fd: std::os::fd::RawFd, skip: &AtomicU64, flags: libc::c_int) -> std::io::Result<u64> {
    let mut left = skip.load(Ordering::SeqCst);
    let mut scratch = [0u8; 4096];
    while left > 0 {
        let want = scratch.len().min(left as usize);
        // SAFETY: `scratch` is writable memory of at least `want` bytes; the caller keeps `fd` open.
        let n = unsafe { libc::recv(fd, scratch.as_mut_ptr().cast(), want, flags) };
        if n > 0 {
            left -= n as u64;
            continue;
        }
        let e = if n == 0 { std::io::ErrorKind::UnexpectedEof.into() } else { std::io::Error::last_os_error() };
        if e.kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        skip.store(left, Ordering::SeqCst);
        return if e.kind() == std::io::ErrorKind::WouldBlock { Ok(left) } else { Err(e) };
    }
    skip.store(0, Ordering::SeqCst);
    Ok(0)
}

/// Reads exactly `buf.len()` bytes from `fd`.
fn read_exact_fd(fd: std::os::fd::RawFd, buf: &mut [u8]) -> std::io::Result<()> {
    let mut off = 0;
    while off < buf.len() {
        let rest = &mut buf[off..];
        // SAFETY: `rest` is writable memory of its length.
        off += unsafe { recv_some(fd, rest.as_mut_ptr(), rest.len()) }?;
    }
    Ok(())
}

/// The bytes of the frame header at the head of `fd`'s stream, left there, once all have come.
fn peek_header(fd: std::os::fd::RawFd) -> Option<[u8; HEADER_LEN]> {
    let mut head = [0u8; HEADER_LEN];
    // SAFETY: peeks at most HEADER_LEN bytes into `head`; the caller keeps `fd` open.
    let n = unsafe { libc::recv(fd, head.as_mut_ptr().cast(), HEADER_LEN, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    (n == HEADER_LEN as isize).then_some(head)
}

/// Payload bytes that [`whole_frame`] peeks beyond the header: a frame up to this size is then
/// taken whole by one more read.
const PEEK_PAYLOAD: usize = 4096;

/// The header of the frame at the head of `fd`'s stream when all of it is there, and it is one
/// that a receive may take: a data frame or a plain heartbeat, with how many bytes of the
/// stream (header first) the call peeked into `buf`. Anything else, malformed frames
/// included, is the reader thread's to handle.
fn whole_frame(fd: std::os::fd::RawFd, buf: &mut [u8; HEADER_LEN + PEEK_PAYLOAD]) -> Option<(FrameHeader, usize)> {
    let mut avail: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int; the caller keeps `fd` open.
    if unsafe { libc::ioctl(fd, libc::FIONREAD, &mut avail) } != 0 || (avail as usize) < HEADER_LEN {
        return None;
    }
    // All that is there when it fits, else the header alone: a look at a large frame as it
    // arrives must not copy kilobytes each time.
    let want = if avail as usize <= buf.len() { avail as usize } else { HEADER_LEN };
    // SAFETY: peeks at most `want` <= buf.len() bytes into `buf`; the caller keeps `fd` open.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), want, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    let seen = usize::try_from(n).ok().filter(|&n| n >= HEADER_LEN)?;
    let hdr = FrameHeader::decode(buf[..HEADER_LEN].try_into().ok()?, MAX_CHUNK_BYTES).ok()?;
    match hdr.kind {
        FrameKind::Heartbeat if hdr.len == 0 => {}
        FrameKind::Collective | FrameKind::P2p | FrameKind::Agree => {}
        // Control frames, and malformed ones, are the reader thread's.
        _ => return None,
    }
    ((avail as u64) >= HEADER_LEN as u64 + hdr.len).then_some((hdr, seen))
}

/// Sleeps until `fd` is readable, closed or failed.
fn wait_readable(fd: std::os::fd::RawFd) {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd; the caller keeps `fd` open.
    while unsafe { libc::poll(&mut p, 1, -1) } < 0
        && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
    {}
}

/// True when a read of `fd` would not block (data, end of stream or an error).
fn readable_now(fd: std::os::fd::RawFd) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: peeks at most one byte into a local buffer; the caller keeps `fd` open.
    let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    n >= 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock
}

struct Reader {
    peer: u32,
    inbox: Arc<Inbox>,
    closing: Arc<AtomicBool>,
    heard: Arc<LastHeard>,
    reading: Arc<Mutex<()>>,
    polled: Arc<AtomicU32>,
    skip: Arc<AtomicU64>,
}

/// How long a reader that stands aside for polling receives sleeps before it looks again (a
/// receive that stops polling without its frame wakes it at once). Unit tests nap longer than
/// their receives wait, so that a receive the reader never hears of fails instead of being late.
#[cfg(not(test))]
const ASIDE_NAP: Duration = Duration::from_millis(20);
#[cfg(test)]
const ASIDE_NAP: Duration = Duration::from_secs(30);

/// Large frames that crawl in: a slow link, shown as a straggler link in the trace and logged
/// once (`HCCN_LOG=warn`), never counted as a failure while its bytes keep coming.
#[derive(Default)]
struct Crawl {
    warned: bool,
    /// When the last straggler event was traced: at most one a second.
    last: Option<Instant>,
}

/// A frame slower than this, of at least `CRAWL_BYTES`, is a straggler.
const CRAWL_RATE: f64 = 50e6;
const CRAWL_BYTES: usize = 64 << 10;

impl Crawl {
    fn frame(&mut self, inbox: &Inbox, peer: u32, len: usize, began: Instant) {
        let took = began.elapsed();
        if len < CRAWL_BYTES || (len as f64) >= CRAWL_RATE * took.as_secs_f64() {
            return;
        }
        if !std::mem::replace(&mut self.warned, true) {
            let rate = len as f64 / took.as_secs_f64() / 1e6;
            tracing::warn!(peer, "slow link: a frame of {len} bytes took {} ms ({rate:.1} MB/s)", took.as_millis());
        }
        if self.last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            self.last = Some(Instant::now());
            let me = inbox.rank_of(super::incarnation()).unwrap_or(0);
            crate::trace::straggler(crate::trace::started_ago(took), me, peer);
        }
    }
}

fn reader_loop(sock: TcpStream, r: Reader) {
    let Reader { peer, inbox, closing, heard, reading, polled, skip } = r;
    let fd = sock.as_raw_fd();
    let mut slow = Crawl::default();
    // Whether the last frame carried data: only then is another likely to follow soon.
    let mut in_traffic = false;
    let reason = loop {
        let receives = polled.load(Ordering::SeqCst);
        if receives > 0 && !closing.load(Ordering::SeqCst) {
            // Receives poll for small frames and take them (TcpLink::poll); woken by each
            // arrival, this thread would find nothing. A goodbye, a revoke, a malformed frame
            // or the end of the stream waits for it, at most TCP_POLL: a receive that polls
            // that long without its frame wakes us before it sleeps.
            futex_wait(&polled, receives, ASIDE_NAP);
            in_traffic = false;
            continue;
        }
        // Frames of an operation follow each other closely: look for the next one a while
        // before sleeping (see TCP_POLL), but not after a heartbeat, where the look would only
        // take time from the ranks sharing our cores. Readable, closed or failed all end the
        // wait; the read then says which. The wait holds no lock: a receive may take the
        // frame meanwhile (`TcpLink::pump`), and then there is nothing to read here.
        let aside = || polled.load(Ordering::Relaxed) > 0;
        let ready = in_traffic && super::poll_yielding(super::TCP_POLL, || readable_now(fd) || aside());
        in_traffic = false;
        if !ready {
            wait_readable(fd);
        }
        if aside() {
            continue;
        }
        let _reading = reading.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = discard_skipped(fd, &skip, 0) {
            break lost(&e);
        }
        if !readable_now(fd) {
            continue;
        }
        let mut head = [0u8; HEADER_LEN];
        if let Err(e) = read_exact_fd(fd, &mut head) {
            break lost(&e);
        }
        heard.now();
        let hdr = match FrameHeader::decode(&head, MAX_CHUNK_BYTES) {
            Ok(h) => h,
            Err(e) => break Fault::cut(format!("refused a frame and closed the connection: {e}")),
        };
        let control = matches!(
            hdr.kind,
            FrameKind::Goodbye
                | FrameKind::Suspect
                | FrameKind::Evict
                | FrameKind::Abandon
                | FrameKind::Revoke
                | FrameKind::Intro
        );
        match hdr.kind {
            FrameKind::Heartbeat if hdr.len == 0 => continue,
            FrameKind::Heartbeat | FrameKind::Revoke if hdr.len != 0 => {
                break Fault::cut(format!("refused a {:?} frame carrying {} bytes", hdr.kind, hdr.len))
            }
            FrameKind::Revoke => {
                inbox.revoke(hdr.comm_id);
                continue;
            }
            _ if control && hdr.len > CONTROL_MAX as u64 => {
                break Fault::cut(format!("refused a {:?} frame of {} bytes", hdr.kind, hdr.len))
            }
            _ => {}
        }
        let len = hdr.len as usize;
        let mut payload = super::pool::take(len);
        let began = Instant::now();
        let read = read_payload(fd, &mut payload, len, Some(&heard));
        slow.frame(&inbox, peer, len, began);
        if let Err(e) = read {
            let mut fault = lost(&e);
            fault.reason = format!("inside a frame: {}", fault.reason);
            break fault;
        }
        heard.now();
        match hdr.kind {
            FrameKind::Goodbye => {
                inbox.mark_departed(peer, news::decode(&payload).unwrap_or_default());
                return;
            }
            FrameKind::Intro => match <[u8; 10]>::try_from(&payload[..]) {
                Ok(b) => {
                    let id = u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
                    let port = u16::from_le_bytes([b[8], b[9]]);
                    let pulse = sock.peer_addr().ok().filter(|_| port != 0).map(|a| SocketAddr::new(a.ip(), port));
                    inbox.note_intro(peer, id, pulse);
                }
                Err(_) => break Fault::cut("refused a malformed intro frame and closed the connection"),
            },
            FrameKind::Evict => {
                let why = String::from_utf8_lossy(&payload).into_owned();
                break Fault::cut(format!("it declared this rank dead ({why}) and closed the connection"));
            }
            FrameKind::Suspect => match news::decode(&payload) {
                Some(faults) => inbox.note_suspects(peer, faults),
                None => break Fault::cut("refused a malformed suspect frame and closed the connection"),
            },
            FrameKind::Abandon => inbox.note_abandon(peer, hdr, &payload),
            _ => {
                in_traffic = true;
                inbox.push(peer, Frame { hdr, payload, landed: false });
            }
        }
    };
    if !closing.load(Ordering::SeqCst) {
        let _ = sock.shutdown(Shutdown::Both);
        inbox.mark_failed(peer, reason);
    }
}

/// Largest payload of a control frame (goodbye, suspect, evict, mismatch): what the news of
/// every rank of a large job takes, and no more.
const CONTROL_MAX: usize = 1 << 20;

pub(crate) fn start_link(sock: TcpStream, peer: u32, inbox: &Arc<Inbox>, cfg: &Config) -> Result<Arc<dyn Link>> {
    let sys = |e: std::io::Error| Error::io(ErrorKind::System, format!("socket to world rank {peer}"), &e);
    sock.set_nodelay(true).map_err(sys)?;
    sock.set_read_timeout(None).map_err(sys)?;
    sock.set_write_timeout(Some(cfg.timeout)).map_err(sys)?;
    let rx = sock.try_clone().map_err(sys)?;
    let closing = Arc::new(AtomicBool::new(false));
    let heard = Arc::new(LastHeard { start: Instant::now(), ms: AtomicU64::new(0) });
    let reading = Arc::new(Mutex::new(()));
    let polled = Arc::new(AtomicU32::new(0));
    let skip = Arc::new(AtomicU64::new(0));
    let r = Reader {
        peer,
        inbox: inbox.clone(),
        closing: closing.clone(),
        heard: heard.clone(),
        reading: reading.clone(),
        polled: polled.clone(),
        skip: skip.clone(),
    };
    let reader =
        std::thread::Builder::new().name(format!("hccn-rx-{peer}")).spawn(move || reader_loop(rx, r)).map_err(sys)?;
    let fd = sock.as_raw_fd();
    Ok(Arc::new(TcpLink {
        peer,
        fd,
        writer: Mutex::new(sock),
        closing,
        reader: Mutex::new(Some(reader)),
        heard,
        inbox: inbox.clone(),
        reading,
        polled,
        skip,
    }))
}

/// The first bytes after the handshake: which mesh and which rank is calling.
pub(crate) fn hello(mesh: u64, rank: u32, size: u32) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..8].copy_from_slice(&mesh.to_le_bytes());
    b[8..12].copy_from_slice(&rank.to_le_bytes());
    b[12..16].copy_from_slice(&size.to_le_bytes());
    b
}

/// Reads a [`hello`]: mesh, rank, size.
pub(crate) fn parse_hello(h: &[u8; 16]) -> (u64, u32, u32) {
    let mesh = u64::from_le_bytes(h[0..8].try_into().unwrap_or_default());
    let rank = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
    let size = u32::from_le_bytes(h[12..16].try_into().unwrap_or_default());
    (mesh, rank, size)
}

pub(crate) fn connect_peer(
    addr: SocketAddr,
    peer: u32,
    mesh: u64,
    rank: u32,
    size: u32,
    token: &[u8],
    cfg: &Config,
) -> Result<TcpStream> {
    let deadline = Instant::now() + cfg.timeout;
    let mut sock = loop {
        match TcpStream::connect_timeout(&addr, cfg.timeout) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(Error::io(ErrorKind::Connect, format!("connect to world rank {peer} at {addr}"), &e))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    auth::client(&mut sock, token, Purpose::Peer, cfg.timeout).map_err(|e| e.context(format!("world rank {peer}")))?;
    send_all(&sock, &hello(mesh, rank, size), &[]).map_err(|e| Error::io(ErrorKind::Connect, "hello", &e))?;
    Ok(sock)
}

/// Handshakes in progress at once while a mesh forms; connections beyond are closed unread.
const MAX_PENDING_HANDSHAKES: usize = 64;

/// Accepts one connection from each rank in `from_ranks`, refusing (and logging) anything else.
/// Each connection authenticates on a thread of its own, so a client that connects and then
/// stalls (or many of them) cannot hold up the members behind it: only the deadline ends the wait.
pub(crate) fn accept_peers(
    listener: &TcpListener,
    mesh: u64,
    from_ranks: std::ops::Range<u32>,
    size: u32,
    token: &[u8],
    cfg: &Config,
) -> Result<Vec<(u32, TcpStream)>> {
    let sys = |e: std::io::Error| Error::io(ErrorKind::System, "listener", &e);
    listener.set_nonblocking(true).map_err(sys)?;
    let deadline = Instant::now() + cfg.timeout;
    let handshake_timeout = cfg.timeout.min(Duration::from_secs(10));
    let (tx, rx) = std::sync::mpsc::channel::<(SocketAddr, Result<(u32, TcpStream)>)>();
    let pending = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut got: Vec<(u32, TcpStream)> = Vec::new();
    let want = from_ranks.len();
    while got.len() < want {
        while let Ok((from, outcome)) = rx.try_recv() {
            match outcome {
                Ok((rank, _)) if got.iter().any(|(r, _)| *r == rank) => {
                    tracing::warn!(%from, rank, "refused a second connection claiming the same rank");
                }
                Ok(member) => got.push(member),
                Err(_) => {} // logged by its handshake thread
            }
        }
        if got.len() >= want {
            break;
        }
        let (sock, from) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<u32> = from_ranks.clone().filter(|r| !got.iter().any(|(g, _)| g == r)).collect();
                    return Err(Error::timeout(format!(
                        "ranks {missing:?} never connected within {} ms (only {} of the {want} expected did); \
                         did they start, and reach this address?",
                        cfg.timeout.as_millis(),
                        got.len(),
                    )));
                }
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(e) => return Err(sys(e)),
        };
        if pending.load(Ordering::SeqCst) >= MAX_PENDING_HANDSHAKES {
            tracing::warn!(%from, "refused a peer connection: {MAX_PENDING_HANDSHAKES} handshakes already pending");
            continue;
        }
        pending.fetch_add(1, Ordering::SeqCst);
        let (tx, pending2, token, range) = (tx.clone(), pending.clone(), token.to_vec(), from_ranks.clone());
        let spawned = std::thread::Builder::new().name("hccn-handshake".into()).spawn(move || {
            let outcome = admit_peer(sock, mesh, range, size, &token, handshake_timeout);
            pending2.fetch_sub(1, Ordering::SeqCst);
            // Logged here: a refusal may come after the acceptor has its members and is gone.
            if let Err(e) = &outcome {
                tracing::warn!(%from, "refused a peer connection: {e}");
            }
            // The acceptor may have finished (or given up) already: then the socket just closes.
            let _ = tx.send((from, outcome));
        });
        if let Err(e) = spawned {
            pending.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(%from, "refused a peer connection: no thread for its handshake: {e}");
        }
    }
    Ok(got)
}

/// Authenticates one incoming connection and reads who it is; `Err` says why it is refused.
fn admit_peer(
    mut sock: TcpStream,
    mesh: u64,
    from_ranks: std::ops::Range<u32>,
    size: u32,
    token: &[u8],
    timeout: Duration,
) -> Result<(u32, TcpStream)> {
    sock.set_nonblocking(false).map_err(|e| Error::io(ErrorKind::System, "peer socket", &e))?;
    auth::server(&mut sock, token, Purpose::Peer, timeout)?;
    let mut h = [0u8; 16];
    // Still under the handshake's read timeout.
    sock.read_exact(&mut h).map_err(|e| Error::io(ErrorKind::Connect, "peer left before saying who it is", &e))?;
    let (their_mesh, their_rank, their_size) = parse_hello(&h);
    if their_mesh != mesh || their_size != size || !from_ranks.contains(&their_rank) {
        return Err(Error::new(
            ErrorKind::Connect,
            format!(
                "not an expected member of this communicator (rank {their_rank} of {their_size}, mesh {their_mesh:#x})"
            ),
        ));
    }
    Ok((their_rank, sock))
}

/// Builds the full mesh of world `size`: publish our address, connect to lower ranks, accept
/// higher ones. `prefix` namespaces the store keys; `mesh` is checked in every hello.
pub(crate) fn connect_mesh(
    rank: u32,
    size: u32,
    store: &dyn Store,
    prefix: &str,
    mesh: u64,
    token: &[u8],
    cfg: &Config,
) -> Result<Net> {
    let _span = tracing::debug_span!("mesh", rank, size).entered();
    super::sweep::once();
    let inbox = Arc::new(Inbox::default());
    let listener = TcpListener::bind((cfg.bind_addr, 0))
        .map_err(|e| Error::io(ErrorKind::System, format!("listen on {}", cfg.bind_addr), &e))?;
    let addr = listener.local_addr().map_err(|e| Error::io(ErrorKind::System, "listen address", &e))?;
    store.set(&format!("{prefix}/addr/{rank}"), addr.to_string().as_bytes())?;

    let sockets = std::thread::scope(|s| -> Result<Vec<(u32, TcpStream)>> {
        let acceptor = s.spawn(|| accept_peers(&listener, mesh, rank + 1..size, size, token, cfg));
        let mut connected = Vec::new();
        for peer in 0..rank {
            let raw = store.get(&format!("{prefix}/addr/{peer}"), cfg.timeout)?;
            let text = String::from_utf8_lossy(&raw).into_owned();
            let peer_addr: SocketAddr = text
                .parse()
                .map_err(|_| Error::new(ErrorKind::Store, format!("bad address {text:?} for rank {peer}")))?;
            connected.push((peer, connect_peer(peer_addr, peer, mesh, rank, size, token, cfg)?));
        }
        let accepted = acceptor.join().map_err(|_| Error::internal("accept thread panicked"))??;
        connected.extend(accepted);
        Ok(connected)
    })?;

    // Host ids and shared memory, pair by pair in ascending peer order: every rank goes through
    // its pairs in the same global order, so the blocking handshakes cannot wait in a cycle.
    let mut sockets = sockets;
    sockets.sort_by_key(|(peer, _)| *peer);
    let mine = shm::host_id();
    let mut hosts = vec![None; size as usize];
    hosts[rank as usize] = Some(mine);
    let mut local: Vec<Option<shm::ShmPeer>> = (0..size).map(|_| None).collect();
    for (peer, sock) in &mut sockets {
        let (host, link) = shm::handshake(sock, rank, *peer, mesh, &mine, cfg)?;
        let (transport, cma) = match &link {
            Some(l) => ("shm", l.cma()),
            None => ("tcp", false),
        };
        tracing::info!(rank, peer = *peer, transport, cma, "data link");
        hosts[*peer as usize] = Some(host);
        local[*peer as usize] = link;
    }
    let mut links: Vec<Option<Arc<dyn Link>>> = (0..size).map(|_| None).collect();
    for (peer, sock) in sockets {
        links[peer as usize] = Some(start_link(sock, peer, &inbox, cfg)?);
    }
    let pulse = super::pulse::Pulse::open(cfg.bind_addr, token);
    let mut net = Net::new(rank, links, inbox, pulse, cfg);
    net.shm = shm::Shm::new(rank, local);
    net.hosts = hosts;
    Ok(net)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stalled_connections_do_not_hold_up_a_member() {
        // Regression: handshakes ran one after another, so each client that connected and sent
        // nothing held the mesh up for a whole handshake timeout, and a few of them made the
        // real member's own handshake time out.
        let cfg = Config { timeout: Duration::from_secs(4), ..Config::default() };
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stalled: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).expect("connect")).collect();
        let token = b"job token";
        let (got, member) = std::thread::scope(|s| {
            let acceptor = s.spawn(|| accept_peers(&listener, 77, 1..2, 2, token, &cfg));
            // Let the acceptor take the stalled connections first.
            std::thread::sleep(Duration::from_millis(200));
            let member = connect_peer(addr, 0, 77, 1, 2, token, &cfg);
            (acceptor.join().expect("acceptor"), member)
        });
        assert!(member.is_ok(), "member refused: {:?}", member.err());
        let got = got.expect("the member is accepted although three connections stall");
        assert_eq!(got.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![1]);
        drop(stalled);
    }

    fn socket_pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let a = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (b, _) = listener.accept().expect("accept");
        (a, b)
    }

    #[test]
    fn a_payload_is_read_whole_across_pieces_and_a_cut_one_is_an_eof() {
        let (mut tx, rx) = socket_pair();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let writer = {
            let data = data.clone();
            std::thread::spawn(move || {
                use std::io::Write;
                for piece in data.chunks(70_001) {
                    tx.write_all(piece).expect("write");
                    std::thread::sleep(Duration::from_millis(5));
                }
                // Half of a second frame, then the connection ends.
                tx.write_all(&data[..1000]).expect("write");
            })
        };
        let mut buf = vec![7u8; 3];
        read_payload(rx.as_raw_fd(), &mut buf, data.len(), None).expect("whole payload");
        assert_eq!(buf, data);
        writer.join().expect("writer");
        let cut = read_payload(rx.as_raw_fd(), &mut buf, 2000, None).expect_err("the peer closed inside the frame");
        assert_eq!(cut.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn frames_taken_by_the_receive_and_by_the_reader_arrive_whole_once_and_in_order() {
        // The receive's `pump` and the reader thread race for every frame; whoever wins, the
        // inbox must get each frame once, intact and in order, also when a frame arrives in
        // pieces (then only the reader may take it).
        let (mut tx, inbox, link, cfg) = linked(Duration::from_secs(20));
        const FRAMES: u64 = 300;
        let body = |seq: u64| -> Vec<u8> { (0..(seq * 997) % 70_000).map(|i| (i * 31 + seq) as u8).collect() };
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            for seq in 0..FRAMES {
                let payload = body(seq);
                let hdr = collective(seq, payload.len());
                if seq % 3 == 0 {
                    // In pieces, with pauses between them.
                    tx.write_all(&hdr.encode()[..10]).expect("write");
                    std::thread::sleep(Duration::from_micros(300));
                    tx.write_all(&hdr.encode()[10..]).expect("write");
                    let half = payload.len() / 2;
                    tx.write_all(&payload[..half]).expect("write");
                    std::thread::sleep(Duration::from_micros(300));
                    tx.write_all(&payload[half..]).expect("write");
                } else {
                    send_all(&tx, &hdr.encode(), &payload).expect("send");
                }
            }
            tx
        });
        for seq in 0..FRAMES {
            // Half of the receives wait as for a small frame (the reader stands aside), half
            // as for a large one (the reader races them).
            let poll = |budget, ready: &dyn Fn() -> bool| link.poll(budget, ready, seq % 2 == 0, None);
            let f = inbox.take(key(seq), cfg.timeout, &|_| None, &poll).expect("frame");
            assert_eq!((f.hdr.seq, f.hdr.tag), (seq, 3));
            assert!(f.payload == body(seq), "frame {seq} intact");
        }
        assert_eq!(inbox.queued(), 0);
        drop(writer.join().expect("writer"));
        link.close(None);
    }

    #[test]
    fn frames_queued_back_to_back_are_taken_one_at_a_time_by_the_peek_and_the_plain_reads() {
        // Frames up to the peek's size are taken with the bytes the peek saw, larger ones by
        // header and payload; with several in the socket at once a read must stop at its
        // frame's end.
        let (tx, inbox, link, cfg) = linked(Duration::from_secs(20));
        let lens: Vec<usize> = (0..60).map(|i| [0, 1, 7, 4095, 4096, 4097, 9000, 70][i % 8] + i).collect();
        let body = |seq: usize| -> Vec<u8> { (0..lens[seq]).map(|i| (i * 7 + seq) as u8).collect() };
        let mut stream = Vec::new();
        for (seq, &len) in lens.iter().enumerate() {
            stream.extend_from_slice(&collective(seq as u64, len).encode());
            stream.extend_from_slice(&body(seq));
        }
        send_all(&tx, &stream, &[]).expect("send");
        for (seq, &len) in lens.iter().enumerate() {
            let poll = |budget, ready: &dyn Fn() -> bool| link.poll(budget, ready, true, None);
            let f = inbox.take(key(seq as u64), cfg.timeout, &|_| None, &poll).expect("frame");
            assert!(f.payload == body(seq), "frame {seq} of {len} bytes intact");
        }
        assert_eq!(inbox.queued(), 0);
        link.close(None);
    }

    /// A link to world rank 1 over a socket pair, without heartbeats: the peer's end, the
    /// inbox, the link and its configuration.
    fn linked(timeout: Duration) -> (TcpStream, Arc<Inbox>, Arc<dyn Link>, Config) {
        let (tx, rx) = socket_pair();
        let inbox = Arc::new(Inbox::default());
        let cfg = Config { timeout, heartbeat: Duration::ZERO, ..Config::default() };
        let link = start_link(rx, 1, &inbox, &cfg).expect("link");
        (tx, inbox, link, cfg)
    }

    fn collective(seq: u64, len: usize) -> FrameHeader {
        FrameHeader { tag: 3, ..FrameHeader::control(FrameKind::Collective, 9, 0, seq, len) }
    }

    fn key(seq: u64) -> Key {
        Key { src: 1, kind: FrameKind::Collective, comm_id: 9, seq }
    }

    #[test]
    fn large_frames_land_whole_in_the_receive_buffer_and_the_others_still_arrive_in_order() {
        let (mut tx, inbox, link, cfg) = linked(Duration::from_secs(20));
        const FRAMES: u64 = 40;
        let len = |seq: u64| if seq.is_multiple_of(2) { 100_000 + seq as usize * 1000 } else { 40 + seq as usize };
        let body = move |seq: u64| -> Vec<u8> { (0..len(seq)).map(|i| (i as u64 * 7 + seq) as u8).collect() };
        // Each frame is written once its receive polls, so that the reader stands aside.
        let (go, polling) = std::sync::mpsc::channel::<u64>();
        let writer = std::thread::spawn(move || {
            use std::io::Write;
            for seq in polling {
                let payload = body(seq);
                tx.write_all(&collective(seq, payload.len()).encode()).expect("write");
                // In pieces, with pauses between them.
                for piece in payload.chunks(30_000) {
                    tx.write_all(piece).expect("write");
                    std::thread::sleep(Duration::from_micros(300));
                }
            }
        });
        for seq in 0..FRAMES {
            let mut buf = vec![0u8; len(seq)];
            let f = {
                let cell = std::cell::RefCell::new(&mut buf[..]);
                let give_up = || false;
                let landing = (seq % 2 == 0).then(|| Landing { key: key(seq), dst: &cell, give_up: &give_up });
                let asked = std::cell::Cell::new(false);
                let poll = |_, ready: &dyn Fn() -> bool| {
                    // Longer than TCP_POLL: the frame must arrive while this receive polls. It
                    // is written from the first look, once the reader stands aside: asked for
                    // before, it could reach the reader first.
                    let look = || {
                        if !asked.replace(true) {
                            go.send(seq).expect("writer");
                        }
                        ready()
                    };
                    link.poll(Duration::from_secs(10), &look, seq % 2 == 1, landing.as_ref())
                };
                inbox.take(key(seq), cfg.timeout, &|_| None, &poll).expect("frame")
            };
            assert_eq!((f.hdr.seq, f.hdr.len), (seq, len(seq) as u64));
            assert_eq!(f.landed, seq % 2 == 0, "frame {seq}: landed only when offered");
            if !f.landed {
                buf.copy_from_slice(&f.payload);
            }
            assert!(buf == body(seq), "frame {seq} intact");
        }
        assert_eq!(inbox.queued(), 0);
        drop(go);
        writer.join().expect("writer");
        link.close(None);
    }

    #[test]
    fn a_receive_that_gives_up_inside_a_frame_never_writes_its_buffer_again_and_the_stream_goes_on() {
        let (tx, inbox, link, cfg) = linked(Duration::from_secs(20));
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8 + 1).collect();
        let (go, polling) = std::sync::mpsc::channel::<()>();
        let (rest, gave_up) = std::sync::mpsc::channel::<()>();
        let writer = {
            let big = big.clone();
            std::thread::spawn(move || {
                use std::io::Write;
                let mut tx = tx;
                polling.recv().expect("receive polls");
                tx.write_all(&collective(0, big.len()).encode()).expect("write");
                tx.write_all(&big[..50_000]).expect("write");
                gave_up.recv().expect("receive gave up");
                // The rest of that frame, then the next one: the rest is dropped, the next arrives.
                tx.write_all(&big[50_000..]).expect("write");
                let small = b"after the abandoned frame";
                send_all(&tx, &collective(1, small.len()).encode(), small).expect("send");
                tx
            })
        };
        let mut buf = vec![0u8; big.len()];
        let e = {
            let cell = std::cell::RefCell::new(&mut buf[..]);
            let start = Instant::now();
            // Gives up (as at its deadline) once the first part has had time to land.
            let give_up = || start.elapsed() > Duration::from_millis(300);
            let landing = Landing { key: key(0), dst: &cell, give_up: &give_up };
            let poll = |_, ready: &dyn Fn() -> bool| {
                let _ = go.send(());
                link.poll(Duration::from_millis(600), ready, false, Some(&landing))
            };
            inbox.take(key(0), Duration::from_millis(500), &|_| None, &poll).expect_err("gave up")
        };
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        assert!(buf[..50_000] == big[..50_000], "the first part landed");
        rest.send(()).expect("writer");
        let f = inbox.take(key(1), cfg.timeout, &|_| None, &|b, r| link.poll(b, r, true, None)).expect("next frame");
        assert_eq!(&f.payload[..], &b"after the abandoned frame"[..]);
        assert!(buf[50_000..].iter().all(|&b| b == 0), "the buffer was written after the receive gave up");
        drop(writer.join().expect("writer"));
        link.close(None);
    }

    #[test]
    fn a_receive_whose_last_poll_saw_another_change_still_gets_its_frame_from_the_reader() {
        // The receive polls (the reader stands aside and naps), its last poll ends on some other
        // change in the inbox, and its own frame comes only after it went to sleep: the reader
        // must be awake to take it.
        let (tx, inbox, link, _) = linked(Duration::from_secs(5));
        let (go, went) = std::sync::mpsc::channel::<()>();
        let writer = std::thread::spawn(move || {
            went.recv().expect("go");
            std::thread::sleep(Duration::from_millis(100));
            send_all(&tx, &collective(0, 8).encode(), &[7; 8]).expect("send");
            tx
        });
        let start = Instant::now();
        let first = std::cell::Cell::new(true);
        let poll = |budget: Duration, ready: &dyn Fn() -> bool| {
            if !first.replace(false) {
                return link.poll(budget, ready, true, None);
            }
            // Long enough for the reader to see the poll and nap; ends as if another frame came.
            link.poll(Duration::from_secs(1), &|| start.elapsed() > Duration::from_millis(200), true, None);
            go.send(()).expect("go");
            true
        };
        let f = inbox.take(key(0), Duration::from_secs(5), &|_| None, &poll).expect("the frame, from the reader");
        assert_eq!(f.payload, [7; 8]);
        drop(writer.join().expect("writer"));
        link.close(None);
    }

    #[test]
    fn a_receive_polling_for_a_small_frame_learns_that_the_peer_died_from_the_reader() {
        // The reader stands aside while the receive polls; the end of the stream is still its
        // to find, and the receive must hear of it, not wait out its timeout.
        let (tx, inbox, link, cfg) = linked(Duration::from_secs(60));
        let killer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            drop(tx);
        });
        let status =
            |h: &super::super::Health<'_>| h.failed.get(&1).map(|why| Error::rank_failed(vec![1], why.reason.clone()));
        let poll = |budget, ready: &dyn Fn() -> bool| link.poll(budget, ready, true, None);
        let got = inbox.take(key(0), cfg.timeout, &status, &poll);
        killer.join().expect("killer");
        let e = got.expect_err("the peer closed its connection");
        assert_eq!(e.kind(), ErrorKind::RankFailed, "{e}");
        link.close(None);
    }

    #[test]
    fn a_token_holder_outside_the_communicator_is_refused() {
        let cfg = Config { timeout: Duration::from_secs(4), ..Config::default() };
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let token = b"job token";
        let got = std::thread::scope(|s| {
            let acceptor = s.spawn(|| accept_peers(&listener, 77, 1..2, 2, token, &cfg));
            // Right token, wrong mesh; then a rank outside the range; then the member.
            let _a = connect_peer(addr, 0, 78, 1, 2, token, &cfg).expect("handshake passes");
            let _b = connect_peer(addr, 0, 77, 5, 2, token, &cfg).expect("handshake passes");
            let _c = connect_peer(addr, 0, 77, 1, 2, token, &cfg).expect("member");
            acceptor.join().expect("acceptor")
        });
        let got = got.expect("accepted");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 1);
    }
}
