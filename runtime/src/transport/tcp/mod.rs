//! TCP links: one authenticated socket per pair of ranks, whose frames the process's progress
//! engine (engine.rs: one thread, epoll over every link) files into the [`Inbox`], and writes
//! with `MSG_NOSIGNAL` so a dead peer is an error, never a SIGPIPE in the host program. One
//! thread reads a socket at a time (the `reading` lock): the engine, or a receive that polls
//! for its frame and reads the link itself (`pump`, one read through the engine's frame reader;
//! `read_direct`, a large frame straight into the receive's buffer), while the engine leaves
//! the link aside (`polled`). io.rs writes sockets and reads them exactly, rx.rs reads frames a
//! piece at a time for both.

mod channel;
mod engine;
mod io;
mod rx;

use crate::sync::Locked;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{DirectRead, Fault, Frame, Inbox, Key, Link};
use crate::config::{Config, MAX_CHUNK_BYTES};
use crate::error::{Error, ErrorKind, Result};
use crate::wire::{FrameHeader, FrameKind, HEADER_LEN};
pub(crate) use channel::TcpChannel;
use engine::Engine;
pub(crate) use io::send_all;
use io::{discard_skipped, peek_header, read_exact_fd, send_all_unless_full};
use rx::{advance, finish, Conn, Rx, Step, Turn, FEED_BYTES};

struct TcpLink {
    conn: Arc<Conn>,
    /// The link's name in the engine.
    token: u64,
    engine: Arc<Engine>,
    /// Held while a frame is written, so that frames go out whole. The socket's descriptor
    /// (`conn.fd`) serves what must not wait for it (a sender may hold it while blocked on a
    /// frozen peer): peeking, and the shutdown that unblocks that sender.
    writing: Mutex<()>,
}

/// When the last frame arrived, as milliseconds since the link started.
struct LastHeard {
    start: Instant,
    /// Milliseconds after `start` of the last frame, [`NEVER`] before the first.
    ms: AtomicU64,
}

const NEVER: u64 = u64::MAX;

impl LastHeard {
    fn now(&self) {
        self.ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl Link for TcpLink {
    fn send(&self, hdr: &FrameHeader, payload: &[u8]) -> std::io::Result<()> {
        let head = hdr.encode();
        let _w = self.writing.locked();
        send_all(&self.conn.sock, &head, payload)
    }

    fn close(&self, goodbye: Option<&[u8]>) {
        let c = &self.conn;
        c.closing.store(true, Ordering::SeqCst);
        let how = match goodbye {
            Some(news) => {
                let _w = self.writing.locked();
                say_goodbye(&c.sock, news);
                // The reading side stays open for `linger`.
                std::net::Shutdown::Write
            }
            None => std::net::Shutdown::Both,
        };
        let _ = c.sock.shutdown(how);
        self.engine.remove(self.token, c.fd);
        // Once the engine's turn on this link (if any) is over, nothing more is filed from it.
        drop(c.reading.locked());
        tracing::debug!(peer = c.peer, graceful = goodbye.is_some(), "link closed");
    }

    fn linger(&self, until: Instant) {
        linger(&self.conn.sock, until);
    }

    fn control(&self, hdr: &FrameHeader, payload: &[u8]) -> bool {
        // Never wait behind another thread's frame: the caller tries again later.
        let Ok(_w) = self.writing.try_lock() else { return false };
        send_all_unless_full(&self.conn.sock, &hdr.encode(), payload)
    }

    fn heartbeat(&self) {
        if let Ok(_w) = self.writing.try_lock() {
            let beat = FrameHeader::control(FrameKind::Heartbeat, 0, 0, 0, 0);
            let b = beat.encode();
            // Never wait: a full socket buffer means the peer has data to read from us already.
            // SAFETY: `b` is a readable buffer of its length; the fd belongs to `conn.sock`.
            unsafe { libc::send(self.conn.fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
        }
    }

    fn silent_for(&self) -> Duration {
        let heard = &self.conn.heard;
        let last = match heard.ms.load(Ordering::Relaxed) {
            NEVER => Duration::ZERO,
            ms => Duration::from_millis(ms),
        };
        heard.start.elapsed().saturating_sub(last)
    }

    fn heard_yet(&self) -> bool {
        self.conn.heard.ms.load(Ordering::Relaxed) != NEVER
    }

    fn segments_in(&self) -> Option<u32> {
        io::data_segments_in(self.conn.fd)
    }

    fn has_unread(&self) -> bool {
        let mut b = [0u8; 1];
        // SAFETY: peeks at most one byte into a local buffer; `conn.sock` keeps the fd open.
        let n = unsafe { libc::recv(self.conn.fd, b.as_mut_ptr().cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        n > 0
    }

    fn poll(&self, budget: Duration, ready: &dyn Fn() -> bool, small: bool, land: Option<&DirectRead<'_>>) -> bool {
        let look = || match land {
            Some(l) => self.read_direct(l),
            None => self.pump(),
        } || ready();
        if !small && land.is_none() {
            // A large frame is the engine's to copy while this thread works on the last one:
            // have it watch the socket again in case an earlier small receive left it aside.
            self.unpark();
            return super::poll_yielding(budget, look);
        }
        // The receive takes its frame itself (small ones whole, one it lands straight into its
        // buffer): the engine woken by each would find nothing to do, and take a core from the
        // ranks that share it.
        self.conn.polled.fetch_add(1, Ordering::SeqCst);
        let got = super::poll_yielding(budget, look);
        if self.conn.polled.fetch_sub(1, Ordering::SeqCst) == 1 && !got {
            // The receive will sleep: from now on the engine must watch the socket.
            self.unpark();
        }
        got
    }
}

impl Drop for TcpLink {
    fn drop(&mut self) {
        // A link dropped without `close` (a failed start) is no failure of the peer.
        self.conn.closing.store(true, Ordering::SeqCst);
        self.engine.remove(self.token, self.conn.fd);
    }
}

impl TcpLink {
    /// Has the engine watch the socket again if it left it aside for polling receives.
    fn unpark(&self) {
        fence(Ordering::SeqCst);
        if self.conn.aside.swap(false, Ordering::SeqCst) {
            self.engine.arm(self.token, self.conn.fd);
        }
    }

    /// Lets go of `reading`, and re-arms the socket if the engine found it held meanwhile.
    fn let_go(&self, rx: MutexGuard<'_, Rx>) {
        drop(rx);
        fence(Ordering::SeqCst);
        if self.conn.busy.swap(false, Ordering::SeqCst) {
            self.engine.arm(self.token, self.conn.fd);
        }
    }

    /// Takes what the connection holds now into the inbox, with one `recv` that no other
    /// thread is in the middle of, so that a receive that waits for a frame need not wait for
    /// the engine; true when a data frame was filed. A frame that came in part waits in `Rx`
    /// for the next look, or for the engine.
    fn pump(&self) -> bool {
        let Ok(mut rx) = self.conn.reading.try_lock() else { return false };
        let took = self.pump_locked(&mut rx, FEED_BYTES);
        self.let_go(rx);
        took
    }

    /// [`pump`](Self::pump) with a `recv` of at most `max` bytes.
    fn pump_locked(&self, rx: &mut MutexGuard<'_, Rx>, max: usize) -> bool {
        let c = &*self.conn;
        if rx.done || c.closing.load(Ordering::SeqCst) {
            return false;
        }
        match advance(c, rx, Turn::Once(max)) {
            Step::Drained { data } | Step::Aside { data } | Step::More { data } => data,
            Step::Over(end) => {
                finish(c, rx, end);
                self.engine.remove(self.token, c.fd);
                false
            }
        }
    }

    /// Reads the frame at the head of the stream straight into `l.dst` when it is the next
    /// frame of `l.key` (none of its frames waits in the inbox) and exactly as long, then files
    /// a marker for it (`Frame::landed`); true when it did. A frame ahead of it is taken into
    /// the inbox ([`pump`](Self::pump)) without a byte past its end, so that ours still lands.
    /// It waits for the payload as it comes, until the receive must give up: then the rest of
    /// the frame is left to be discarded (`skip`), and `dst` is never written again.
    fn read_direct(&self, l: &DirectRead<'_>) -> bool {
        let Ok(mut rx) = self.conn.reading.try_lock() else { return false };
        let took = self.read_direct_locked(&mut rx, l);
        self.let_go(rx);
        took
    }

    fn read_direct_locked(&self, rx: &mut MutexGuard<'_, Rx>, l: &DirectRead<'_>) -> bool {
        let c = &*self.conn;
        if c.inbox.has_queued(&l.key) {
            return false;
        }
        if !self.caught_up(rx) {
            let rest = rx.rest_of_frame();
            return self.pump_locked(rx, rest);
        }
        let Some(mut head) = peek_header(c.fd) else { return false };
        let peeked = FrameHeader::decode(&head, MAX_CHUNK_BYTES).ok();
        let dst_len = l.dst.borrow().len() as u64;
        let ours = peeked
            .filter(|h| Key { src: c.peer, kind: h.kind, comm_id: h.comm_id, seq: h.seq } == l.key && h.len == dst_len);
        let Some(hdr) = ours else {
            // Another frame is ahead: taken, and no byte past its end. A malformed header is
            // read alone, and its check ends the link as the engine's would.
            let upto = peeked.map_or(HEADER_LEN, |h| HEADER_LEN + h.len as usize);
            return self.pump_locked(rx, upto);
        };
        let mut dst = l.dst.borrow_mut();
        if let Err(e) = read_exact_fd(c.fd, &mut head) {
            return self.fail(rx, &e);
        }
        let mut got = 0;
        while got < dst.len() {
            let rest = &mut dst[got..];
            // SAFETY: `rest` is writable memory of its length; `conn.sock` keeps the fd open.
            let n = unsafe { libc::recv(c.fd, rest.as_mut_ptr().cast(), rest.len(), libc::MSG_DONTWAIT) };
            if n > 0 {
                got += n as usize;
                c.heard.now();
                continue;
            }
            let e = std::io::Error::last_os_error();
            match n {
                0 => return self.fail(rx, &std::io::ErrorKind::UnexpectedEof.into()),
                _ if e.kind() == std::io::ErrorKind::Interrupted => {}
                _ if e.kind() != std::io::ErrorKind::WouldBlock => return self.fail(rx, &e),
                _ if (l.give_up)() => {
                    c.skip.store((dst.len() - got) as u64, Ordering::SeqCst);
                    return false;
                }
                _ => {
                    let mut p = libc::pollfd { fd: c.fd, events: libc::POLLIN, revents: 0 };
                    // SAFETY: one valid pollfd; `conn.sock` keeps the fd open.
                    unsafe { libc::poll(&mut p, 1, 1) };
                }
            }
        }
        c.inbox.push(c.peer, Frame { hdr, payload: Vec::new(), landed: true });
        true
    }

    /// True when the next byte of the socket starts a frame: the engine has no frame half read,
    /// and what a receive left of a frame it gave up (see `read_direct`) is discarded. Called
    /// under `reading`.
    fn caught_up(&self, rx: &Rx) -> bool {
        !rx.done
            && rx.between_frames()
            && discard_skipped(self.conn.fd, &self.conn.skip, libc::MSG_DONTWAIT).is_ok_and(|left| left == 0)
    }

    /// The connection broke inside a frame: as the engine would, close it and say why.
    fn fail(&self, rx: &mut MutexGuard<'_, Rx>, e: &std::io::Error) -> bool {
        let mut fault = lost(e);
        fault.reason = format!("inside a frame: {}", fault.reason);
        finish(&self.conn, rx, Some(fault));
        self.engine.remove(self.token, self.conn.fd);
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

/// Tells the peer on `sock` that this rank leaves on purpose, knowing of `news` (best effort:
/// a peer that cannot hear it sees the connection end).
fn say_goodbye(sock: &TcpStream, news: &[u8]) {
    let hdr = FrameHeader { len: news.len() as u64, tag: crate::transport::farewell::goodbye_tag(), ..GOODBYE };
    let _ = send_all(sock, &hdr.encode(), news);
}

/// After a goodbye and a half close: reads what the peer still sends until it closes its side
/// too, or until `until`. Closing a socket with unread bytes resets the connection, and the
/// reset may discard the goodbye before it left this host: the peer would see a crash.
fn linger(sock: &TcpStream, until: Instant) {
    let mut sink = [0u8; 4096];
    loop {
        let left = until.saturating_duration_since(Instant::now());
        let mut p = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; `sock` keeps the fd open.
        if left.is_zero() || unsafe { libc::poll(&mut p, 1, left.as_millis().max(1) as i32) } <= 0 {
            return;
        }
        // SAFETY: a writable buffer of its length; `sock` keeps the fd open.
        let n = unsafe { libc::recv(sock.as_raw_fd(), sink.as_mut_ptr().cast(), sink.len(), libc::MSG_DONTWAIT) };
        if n == 0 || (n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock) {
            return;
        }
    }
}

/// Leaves on a connection this rank will not keep though the peer may have: a goodbye, then
/// [`linger`] for at most `within`.
pub(crate) fn leave(sock: &TcpStream, news: &[u8], within: Duration) {
    say_goodbye(sock, news);
    let _ = sock.shutdown(std::net::Shutdown::Write);
    linger(sock, Instant::now() + within);
}

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
    let engine = engine::engine().map_err(sys)?;
    let conn = Arc::new(Conn {
        peer,
        fd: sock.as_raw_fd(),
        peer_addr: sock.peer_addr().ok(),
        sock,
        inbox: inbox.clone(),
        closing: AtomicBool::new(false),
        heard: LastHeard { start: Instant::now(), ms: AtomicU64::new(NEVER) },
        reading: Mutex::new(Rx::default()),
        polled: AtomicU32::new(0),
        skip: AtomicU64::new(0),
        aside: AtomicBool::new(false),
        busy: AtomicBool::new(false),
    });
    let token = engine.add(&conn).map_err(sys)?;
    Ok(Arc::new(TcpLink { conn, token, engine, writing: Mutex::new(()) }))
}

#[cfg(test)]
mod tests;
