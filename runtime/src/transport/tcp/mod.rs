//! TCP links: one authenticated socket per pair of ranks, a reader thread per socket that files
//! frames into the [`Inbox`], and writes with `MSG_NOSIGNAL` so a dead peer is an error, never a
//! SIGPIPE in the host program. One thread takes a frame off the socket at a time (the
//! `reading` lock): the link's reader thread, or a receive that polls for its frame and takes
//! it itself (`pump`, whole small frames; `land`, a large frame straight into the receive's
//! buffer), while the reader stands aside (`polled`). io.rs reads and writes sockets, reader.rs
//! is the reader thread.

mod channel;
mod io;
mod reader;

use crate::sync::Locked;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::shm::futex_wake;
use super::{DirectRead, Fault, Frame, Inbox, Key, Link};
use crate::config::{Config, MAX_CHUNK_BYTES};
use crate::error::{Error, ErrorKind, Result};
use crate::wire::{FrameHeader, FrameKind, HEADER_LEN};
pub(crate) use channel::TcpChannel;
pub(crate) use io::send_all;
use io::{discard_skipped, peek_header, read_exact_fd, read_payload, send_all_unless_full, whole_frame, PEEK_PAYLOAD};
use reader::{reader_loop, Reader};

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

impl Link for TcpLink {
    fn send(&self, hdr: &FrameHeader, payload: &[u8]) -> std::io::Result<()> {
        let head = hdr.encode();
        let sock = self.writer.locked();
        send_all(&sock, &head, payload)
    }

    fn close(&self, goodbye: Option<&[u8]>) {
        self.closing.store(true, Ordering::SeqCst);
        if let Some(news) = goodbye {
            let sock = self.writer.locked();
            let hdr = FrameHeader { len: news.len() as u64, ..GOODBYE };
            let _ = send_all(&sock, &hdr.encode(), news);
        }
        // SAFETY: `fd` stays open as long as `writer` (owned by self) lives.
        unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
        // A reader standing aside (see `poll`) sees `closing` at once.
        futex_wake(&self.polled);
        if let Some(t) = self.reader.locked().take() {
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

    fn poll(&self, budget: Duration, ready: &dyn Fn() -> bool, small: bool, land: Option<&DirectRead<'_>>) -> bool {
        let look = || land.is_some_and(|l| self.read_direct(l)) || self.pump() || ready();
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
    fn read_direct(&self, l: &DirectRead<'_>) -> bool {
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

#[cfg(test)]
mod tests;
