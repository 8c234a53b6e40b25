//! A link's reader thread: it files frames into the inbox, handles the control frames
//! (goodbye, suspicions, evictions, abandons, introductions, revokes), marks the link heard as
//! bytes arrive, and stands aside while receives take their own frames.

use crate::sync::Locked;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::io::{discard_skipped, read_exact_fd, read_payload, readable_now, wait_readable};
use super::{lost, LastHeard};
use crate::config::MAX_CHUNK_BYTES;
use crate::transport::shm::futex_wait;
use crate::transport::{news, Fault, Frame, Inbox};
use crate::wire::{FrameHeader, FrameKind, HEADER_LEN};

pub(super) struct Reader {
    pub(super) peer: u32,
    pub(super) inbox: Arc<Inbox>,
    pub(super) closing: Arc<AtomicBool>,
    pub(super) heard: Arc<LastHeard>,
    pub(super) reading: Arc<Mutex<()>>,
    pub(super) polled: Arc<AtomicU32>,
    pub(super) skip: Arc<AtomicU64>,
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
            let me = inbox.rank_of(crate::transport::incarnation()).unwrap_or(0);
            crate::trace::straggler(crate::trace::started_ago(took), me, peer);
        }
    }
}

pub(super) fn reader_loop(sock: TcpStream, r: Reader) {
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
        let ready =
            in_traffic && crate::transport::poll_yielding(crate::transport::TCP_POLL, || readable_now(fd) || aside());
        in_traffic = false;
        if !ready {
            wait_readable(fd);
        }
        if aside() {
            continue;
        }
        let _reading = reading.locked();
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
        let mut payload = crate::transport::pool::take(len);
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
