//! A world of processes as this rank reaches it: one link per peer, shared memory to the peers
//! on this host, the inbox, and the watchdog.

use std::cell::RefCell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{
    board, heartbeat, news, poll_yielding, pool, pulse, shm, Fault, Frame, Health, Inbox, Key, Landing, Link,
    POLL_ALONE_MAX,
};
use crate::error::{Error, ErrorKind, Result};
use crate::wire::{FrameHeader, FrameKind};

/// The links of one world, indexed by world rank (this process's own numbering of its peers);
/// it grows when replacement ranks are admitted.
#[derive(Default)]
pub(crate) struct LinkTable {
    links: std::sync::RwLock<Vec<Option<Arc<dyn Link>>>>,
}

impl LinkTable {
    pub fn new(links: Vec<Option<Arc<dyn Link>>>) -> Self {
        LinkTable { links: std::sync::RwLock::new(links) }
    }

    pub fn get(&self, rank: u32) -> Option<Arc<dyn Link>> {
        self.links.read().unwrap_or_else(|p| p.into_inner()).get(rank as usize).cloned().flatten()
    }

    /// Every live link with its world rank.
    pub fn all(&self) -> Vec<(u32, Arc<dyn Link>)> {
        let links = self.links.read().unwrap_or_else(|p| p.into_inner());
        links.iter().enumerate().filter_map(|(r, l)| l.clone().map(|l| (r as u32, l))).collect()
    }

    /// How many world ranks the table covers (the world's size, joiners included).
    pub fn len(&self) -> usize {
        self.links.read().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Adds the link that `make` builds for the next world rank, and returns that rank.
    pub fn add(&self, make: impl FnOnce(u32) -> Result<Arc<dyn Link>>) -> Result<u32> {
        let mut links = self.links.write().unwrap_or_else(|p| p.into_inner());
        let rank = links.len() as u32;
        links.push(Some(make(rank)?));
        Ok(rank)
    }
}

/// The links of one world of processes.
pub(crate) struct Net {
    pub rank: u32,
    pub links: Arc<LinkTable>,
    pub inbox: Arc<Inbox>,
    /// Shared-memory links to the peers on this host (set up with the mesh; none for joiners).
    pub shm: shm::Shm,
    /// Host of each world rank, where known (all of them in a world formed together).
    pub hosts: Vec<Option<shm::HostId>>,
    timeout: Duration,
    graceful: std::sync::atomic::AtomicBool,
    watchdog: Option<heartbeat::Watchdog>,
    /// This rank's pulse socket, when heartbeats are on.
    pulse: Option<Arc<pulse::Pulse>>,
}

impl Net {
    /// Joins the links; a watchdog thread tells the peers of this rank's losses and, with a
    /// heartbeat interval, keeps the links alive (with `pulse`, on a path of their own too) and
    /// declares silent peers failed.
    pub fn new(
        rank: u32,
        links: Vec<Option<Arc<dyn Link>>>,
        inbox: Arc<Inbox>,
        pulse: Option<pulse::Pulse>,
        cfg: &crate::config::Config,
    ) -> Net {
        let n = links.len();
        let links = Arc::new(LinkTable::new(links));
        let pulse = pulse.filter(|_| !cfg.heartbeat.is_zero()).map(Arc::new);
        inbox.note_intro(rank, incarnation(), None);
        links.all().iter().for_each(|(_, l)| introduce(l.as_ref(), pulse.as_deref()));
        let watchdog = heartbeat::Watchdog::start(
            rank,
            links.clone(),
            inbox.clone(),
            pulse.clone(),
            cfg.heartbeat,
            cfg.dead_after,
        );
        let mut hosts = vec![None; n.max(rank as usize + 1)];
        hosts[rank as usize] = Some(shm::host_id());
        Net {
            rank,
            links,
            inbox,
            shm: shm::Shm::default(),
            hosts,
            timeout: cfg.timeout,
            graceful: std::sync::atomic::AtomicBool::new(true),
            watchdog,
            pulse,
        }
    }

    /// The transport that carries data frames to world rank `peer`.
    pub fn transport(&self, peer: u32) -> &'static str {
        match peer {
            p if p == self.rank => "self",
            p if self.shm.has(p) => "shm",
            _ => "tcp",
        }
    }

    /// Receives the frame `key`: `sink.check` sees its header, then `sink.out` its payload
    /// (in order, in pieces that never split an element). Bounded by `timeout`; ends early with
    /// the error `status` gives (the communicator failed, was aborted or revoked).
    pub fn recv(
        &self,
        key: Key,
        timeout: Duration,
        status: &dyn Fn(&Health<'_>) -> Option<Error>,
        sink: &mut shm::Sink<'_, '_>,
    ) -> Result<()> {
        if self.shm.has(key.src) {
            return self.shm.recv(key, &self.inbox, timeout, status, sink);
        }
        let link = self.links.get(key.src);
        let small = sink.expect <= POLL_ALONE_MAX;
        let deadline = Instant::now() + timeout;
        let give_up =
            || Instant::now() >= deadline || (self.inbox.troubles() != 0 && self.inbox.status(status).is_some());
        let frame = {
            // A large frame that is only stored may land straight in the receive's buffer.
            let into = match &mut sink.out {
                shm::Out::Into(buf) if !small && buf.len() == sink.expect => Some(RefCell::new(&mut **buf)),
                _ => None,
            };
            let landing = into.as_ref().map(|dst| Landing { key, dst, give_up: &give_up });
            let poll = |budget, ready: &dyn Fn() -> bool| match &link {
                Some(l) => l.poll(budget, ready, small, landing.as_ref()),
                None => poll_yielding(budget, ready),
            };
            if self.shm.is_empty() {
                self.inbox.take(key, timeout, status, &poll)?
            } else {
                // Wait in slices, keeping the shared-memory rings moving meanwhile: a local sender
                // blocked on a full ring must not wait for this remote frame.
                loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self.inbox.take(key, left.min(Duration::from_millis(2)), status, &poll) {
                        Ok(f) => break f,
                        Err(e) if e.kind() == ErrorKind::Timeout && !left.is_zero() => {
                            self.shm.drain(None, &self.inbox)
                        }
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
            }
        };
        (sink.check)(&frame.hdr)?;
        if frame.landed {
            return Ok(());
        }
        sink.piece(0, &frame.payload);
        pool::give(frame.payload);
        Ok(())
    }

    /// Creates the shared-memory board of a communicator of `n` ranks at `path` (this is rank
    /// `me`); its waits behave like those of the rings.
    pub fn create_board(&self, path: &str, n: u32, me: u32) -> std::io::Result<board::Board> {
        board::Board::create(path, n, me, self.shm.wait())
    }

    /// Maps the board another rank created (see [`Net::create_board`]).
    pub fn open_board(&self, path: &str, n: u32, me: u32) -> std::io::Result<board::Board> {
        board::Board::open(path, n, me, self.shm.wait())
    }

    /// Moves frames waiting in the shared-memory rings into the inbox, so that their senders
    /// can go on while this rank waits for something else.
    pub fn keep_moving(&self) {
        self.shm.drain(None, &self.inbox);
    }

    /// Sends one frame to world rank `dst` (to itself through the inbox).
    pub fn send(&self, dst: u32, hdr: &FrameHeader, payload: &[u8]) -> Result<()> {
        if dst == self.rank {
            let mut copy = pool::take(payload.len());
            copy.extend_from_slice(payload);
            self.inbox.push(dst, Frame { hdr: *hdr, payload: copy, landed: false });
            return Ok(());
        }
        let failed =
            |reason: String| Err(Error::rank_failed(vec![dst], format!("world rank {dst} failed earlier: {reason}")));
        if matches!(hdr.kind, FrameKind::Collective | FrameKind::P2p) && self.shm.has(dst) {
            if self.inbox.troubles() != 0 {
                if let Some(reason) = self.inbox.failed_reason(dst) {
                    return failed(reason);
                }
            }
            return self.shm.send(dst, hdr, payload, &self.inbox, self.timeout);
        }
        let link = self.links.get(dst).ok_or_else(|| Error::internal(format!("no link to world rank {dst}")))?;
        if let Some(reason) = self.inbox.failed_reason(dst) {
            return failed(reason);
        }
        link.send(hdr, payload).map_err(|e| {
            if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) {
                return Error::timeout(format!("sending to world rank {dst} made no progress (HCCN_TIMEOUT_MS)"));
            }
            self.inbox.mark_failed(dst, Fault::cut(format!("send failed: {e}")));
            Error::rank_failed(vec![dst], format!("world rank {dst} is unreachable: {e}"))
        })
    }

    /// Starts sending one frame to world rank `dst`. A large data frame to a same-host peer that
    /// permits it goes by descriptor: the peer reads `payload` from this process's memory, and
    /// the returned number must be passed to [`Net::send_wait`] (or [`Net::send_withdraw`])
    /// before `payload` changes or is freed. Any other frame is sent at once (`None`).
    pub fn send_start(&self, dst: u32, hdr: &FrameHeader, payload: &[u8]) -> Result<Option<u64>> {
        let single_copy = payload.len() >= shm::CMA_MIN
            && dst != self.rank
            && matches!(hdr.kind, FrameKind::Collective | FrameKind::P2p)
            && self.shm.single_copy(dst, payload);
        if !single_copy {
            return self.send(dst, hdr, payload).map(|_| None);
        }
        if self.inbox.troubles() != 0 {
            if let Some(reason) = self.inbox.failed_reason(dst) {
                return Err(Error::rank_failed(vec![dst], format!("world rank {dst} failed earlier: {reason}")));
            }
        }
        self.shm.send_desc(dst, hdr, payload, &self.inbox, self.timeout)
    }

    /// Waits until world rank `dst` has read the frame [`Net::send_start`] numbered `index` and
    /// every earlier one; on an error, what it has not read is withdrawn.
    pub fn send_wait(&self, dst: u32, index: u64, status: &dyn Fn(&Health<'_>) -> Option<Error>) -> Result<()> {
        self.shm.wait_sent(dst, index, &self.inbox, self.timeout, status)
    }

    /// Withdraws the frame numbered `index` unless world rank `dst` has begun to read it, and
    /// then waits for the read to end: its buffer is this process's again.
    pub fn send_withdraw(&self, dst: u32, index: u64) {
        self.shm.withdraw(dst, index, &self.inbox, self.timeout)
    }

    /// How long world rank `peer` has been silent (nothing on its link, no pulse); `None`
    /// without a link to it.
    pub fn silent_for(&self, peer: u32) -> Option<Duration> {
        let link = self.links.get(peer)?.silent_for();
        let pulse = self.pulse.as_ref().and_then(|p| p.silent_for(peer));
        Some(pulse.map_or(link, |p| p.min(link)))
    }

    /// Introduces this rank on a link added after the world formed (a joiner's).
    pub fn introduce(&self, link: &dyn Link) {
        introduce(link, self.pulse.as_deref());
    }

    /// Closes the connection to world rank `peer` after it sent something this rank refuses.
    pub fn refuse(&self, peer: u32, reason: &str) {
        self.inbox.mark_failed(peer, Fault::cut(format!("refused: {reason}")));
        if let Some(link) = self.links.get(peer) {
            link.close(None);
        }
    }

    /// Makes the coming close look like a failure to peers (used by abort).
    pub fn close_abruptly(&self) {
        self.graceful.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// This process's incarnation: a random id that names it in news to peers (see news.rs).
pub(crate) fn incarnation() -> u64 {
    static ID: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *ID.get_or_init(|| {
        let pid = u64::from(std::process::id());
        crate::auth::random_bytes::<8>().map_or(pid, |b| u64::from_le_bytes(b) ^ pid)
    })
}

/// Tells the peer of `link` who this process is and where its pulses come from.
fn introduce(link: &dyn Link, pulse: Option<&pulse::Pulse>) {
    let mut intro = [0u8; 10];
    intro[0..8].copy_from_slice(&incarnation().to_le_bytes());
    intro[8..10].copy_from_slice(&pulse.map_or(0, |p| p.port()).to_le_bytes());
    let hdr = FrameHeader::control(FrameKind::Intro, 0, 0, 0, intro.len());
    // At link start nothing else is being written: the first try takes it.
    for _ in 0..1000 {
        if link.control(&hdr, &intro) {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    tracing::warn!("a peer was not told who this rank is: its news about this rank will not be understood");
}

impl Drop for Net {
    fn drop(&mut self) {
        // Stop watching before the links close, or their closing would look like failures.
        drop(self.watchdog.take());
        // A goodbye carries what this rank lost: the peers learn why it left with it.
        let graceful = self.graceful.load(std::sync::atomic::Ordering::SeqCst);
        let news = graceful.then(|| news::encode(&self.inbox.by_id(self.inbox.losses())));
        for (_, link) in self.links.all() {
            link.close(news.as_deref());
        }
    }
}
