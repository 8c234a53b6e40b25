//! The TCP data channel of a peer on another host (or of every peer, `HCCN_TRANSPORT=tcp`): frames
//! go out on the peer's link; a receive takes its frame from the inbox, where the progress
//! engine files it, or polls the socket for it itself (see the module above).

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::transport::channel::{deliver, Channel, Progress, Status};
use crate::transport::{DirectRead, Fault, Inbox, Key, Link, Out, Sink, POLL_ALONE_MAX};
use crate::wire::FrameHeader;

pub(crate) struct TcpChannel {
    pub peer: u32,
    pub link: Arc<dyn Link>,
    pub inbox: Arc<Inbox>,
    /// The world's progress hook, when it has other channels to keep moving (shared memory).
    pub progress: Option<Progress>,
}

/// A slice of a wait between calls of the progress hook.
const SLICE: Duration = Duration::from_millis(2);

impl Channel for TcpChannel {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn send(&self, hdr: &FrameHeader, payload: &[u8]) -> Result<()> {
        let dst = self.peer;
        if let Some(reason) = self.inbox.failed_reason(dst) {
            return Err(Error::rank_failed(vec![dst], format!("world rank {dst} failed earlier: {reason}")));
        }
        let Err(e) = self.link.send(hdr, payload) else { return Ok(()) };
        if self.link.departed_before(&self.inbox, dst) {
            // As over shared memory: a peer that left on purpose reads nothing; the frame is void.
            return Ok(());
        }
        if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
            return Err(Error::timeout(format!("sending to world rank {dst} made no progress (HCCN_TIMEOUT_MS)")));
        }
        self.inbox.mark_failed(dst, Fault::cut(format!("send failed: {e}")));
        Err(Error::rank_failed(vec![dst], format!("world rank {dst} is unreachable: {e}")))
    }

    fn recv(&self, key: Key, timeout: Duration, status: Status<'_>, sink: &mut Sink<'_, '_>) -> Result<()> {
        let small = sink.expect <= POLL_ALONE_MAX;
        let deadline = Instant::now() + timeout;
        let give_up =
            || Instant::now() >= deadline || (self.inbox.health_changes() != 0 && self.inbox.status(status).is_some());
        let frame = {
            // A large frame that is only stored may land straight in the receive's buffer.
            let into = match &mut sink.out {
                Out::Into(buf) if !small && buf.len() == sink.expect => Some(RefCell::new(&mut **buf)),
                _ => None,
            };
            let direct = into.as_ref().map(|dst| DirectRead { key, dst, give_up: &give_up });
            let poll = |budget, ready: &dyn Fn() -> bool| self.link.poll(budget, ready, small, direct.as_ref());
            let Some(progress) = &self.progress else {
                return deliver(self.inbox.take(key, timeout, status, &poll)?, sink);
            };
            // Wait in slices, keeping the other channels moving meanwhile: a local sender blocked
            // on a full ring must not wait for this remote frame.
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match self.inbox.take(key, left.min(SLICE), status, &poll) {
                    Ok(f) => break f,
                    Err(e) if e.kind() == ErrorKind::Timeout && !left.is_zero() => progress(),
                    Err(e) if e.kind() == ErrorKind::Timeout => {
                        return Err(Error::timeout(format!(
                            "no message from world rank {} within {} ms (HCCN_TIMEOUT_MS)",
                            key.src,
                            timeout.as_millis()
                        )))
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        deliver(frame, sink)
    }
}
