//! Connections on demand (worlds larger than `HCCN_FULL_MESH_UP_TO`): a world forms with the
//! links its failure detection and news need (rendezvous/ondemand.rs says which), and every
//! other link opens the first time a frame goes to that peer, from either side.
//!
//! Both sides of a pair may dial each other at once. One connection must win on both sides:
//! the one dialed by the lower rank. The acceptor answers each dial with one byte, and decides
//! under the same lock under which this side starts its own dials: it keeps the dialer's
//! connection (answer 1) unless it has a link already (its own dial won first) or is dialing
//! the dialer itself and has the lower rank (answer 0: the dialer then waits for the acceptor's
//! own connection to arrive on its side).

use std::collections::HashSet;
use std::net::TcpStream;
use std::os::fd::RawFd;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::channel::{Channel, Progress};
use super::net::{introduce, LinkTable, Peer};
#[cfg(doc)]
use super::Net;
use super::{pulse, shm, tcp, Inbox};
use crate::config::Config;
use crate::error::{Error, Result};
use crate::sync::{Locked, Waits};

/// The error for world rank `peer`, which news says was lost for `reason`.
fn lost(peer: u32, reason: &str) -> Error {
    Error::rank_failed(vec![peer], format!("world rank {peer} failed: {reason}"))
}

/// How long a world that ends waits for the dials under way (see [`OnDemand::close`]).
const CLOSING_DIALS: Duration = Duration::from_millis(300);

/// What a dial found.
pub(crate) enum Dialed {
    /// A socket past the handshake, which the peer keeps.
    Kept(TcpStream),
    /// The peer's own connection to this rank wins: it arrives through the acceptor.
    Theirs,
    /// Nothing listens at the peer's address any more: its process ended, or its world did.
    Gone,
}

/// Opens authenticated connections to peers and takes theirs (rendezvous/ondemand.rs).
pub(crate) trait Connector: Send + Sync {
    /// Dials world rank `peer`, until `given_up` says so (the peer is known lost meanwhile: a
    /// frozen one accepts connections in its kernel but never answers).
    fn dial(&self, peer: u32, given_up: &dyn Fn() -> bool) -> Result<Dialed>;
    /// The listening socket, readable when a peer dials; `None` while accepting is paused (this
    /// process ran short of descriptors or memory).
    fn listener(&self) -> Option<RawFd>;
    /// Takes the connections waiting at the listener without blocking, each handshaken on a
    /// thread of its own that ends with [`OnDemand::admit`]. The world's watchdog calls it when
    /// the listener is readable: no thread waits for connections that may never come.
    fn accept(&self, on: &Arc<OnDemand>);
    /// Sets up shared memory with `peer` over a connection both sides keep, before its reader
    /// starts, when the pair links that way (both sides call it, and agree whether to).
    /// What the handshake learnt, when there was one (a pair that may not link that way has
    /// none).
    fn upgrade(&self, peer: u32, sock: TcpStream) -> Result<(TcpStream, Option<shm::Learnt>)>;
}

/// What makes and installs links on demand for one world.
pub(crate) struct OnDemand {
    pub me: u32,
    links: Arc<LinkTable>,
    inbox: Arc<Inbox>,
    shm: Arc<shm::Shm>,
    pulse: Option<Arc<pulse::Pulse>>,
    progress: Option<Progress>,
    cfg: Config,
    connector: Box<dyn Connector>,
    /// The world ended: no more links. Holds the goodbye it ended with (`None`: abruptly).
    ended: OnceLock<Option<Vec<u8>>>,
    /// Peers this rank is dialing now.
    dialing: Mutex<HashSet<u32>>,
    /// Peers dialed on threads of their own (see [`OnDemand::connect_aside`]).
    aside: Mutex<HashSet<u32>>,
    /// Signalled when a link is installed or a dial ends.
    settled: Condvar,
}

impl OnDemand {
    pub fn new(
        me: u32,
        (links, inbox, shm): (Arc<LinkTable>, Arc<Inbox>, Arc<shm::Shm>),
        pulse: Option<Arc<pulse::Pulse>>,
        progress: Option<Progress>,
        cfg: &Config,
        connector: Box<dyn Connector>,
    ) -> OnDemand {
        OnDemand {
            me,
            links,
            inbox,
            shm,
            pulse,
            progress,
            cfg: cfg.clone(),
            connector,
            ended: OnceLock::new(),
            dialing: Mutex::new(HashSet::new()),
            aside: Mutex::new(HashSet::new()),
            settled: Condvar::new(),
        }
    }

    /// The listening socket (see [`Connector::listener`]).
    pub fn listener(&self) -> Option<RawFd> {
        self.connector.listener()
    }

    /// Takes the connections waiting at the listener (see [`Connector::accept`]).
    pub fn accept(self: &Arc<Self>) {
        if self.ended.get().is_none() {
            self.connector.accept(self);
        }
    }

    /// The world ends, with `goodbye` on its links (`None`: abruptly): connections still being
    /// handshaken are refused, and one the peer already kept hears the same goodbye.
    pub fn close(&self, goodbye: Option<Vec<u8>>) {
        // Under the lock links are installed under: a link installed before is among those
        // the world says goodbye on; none is installed after.
        let mut dialing = self.dialing.locked();
        let _ = self.ended.set(goodbye);
        // A dial under way (a new neighbour's, on a thread of its own) may have been kept by
        // its peer already: it is let end, briefly, so that the peer hears the goodbye rather
        // than this process's exit.
        let until = Instant::now() + CLOSING_DIALS;
        while !dialing.is_empty() && Instant::now() < until {
            dialing = self.settled.wait_locked_for(dialing, Duration::from_millis(5));
        }
    }

    /// The link to world rank `peer`, connecting first if there is none yet.
    pub fn connect(&self, peer: u32) -> Result<Peer> {
        if let Some(p) = self.links.peer(peer) {
            return Ok(p);
        }
        if peer == self.me || peer as usize >= self.links.len() {
            return Err(Error::internal(format!("no link to world rank {peer}")));
        }
        // Not dialed once any rank lost it: a frozen process's kernel takes the connection but
        // nothing answers.
        if let Some(reason) = self.inbox.lost_anywhere(peer) {
            return Err(Error::rank_failed(vec![peer], format!("world rank {peer} failed earlier: {reason}")));
        }
        let deadline = Instant::now() + self.cfg.timeout;
        {
            let mut dialing = self.dialing.locked();
            loop {
                if let Some(p) = self.links.peer(peer) {
                    return Ok(p);
                }
                if !dialing.contains(&peer) {
                    break;
                }
                // Another thread of this rank is dialing it.
                dialing = self.wait(dialing, peer, deadline)?;
            }
            dialing.insert(peer);
        }
        let dialed = self.connector.dial(peer, &|| self.inbox.lost_anywhere(peer).is_some());
        let mut dialing = self.dialing.locked();
        dialing.remove(&peer);
        self.settled.notify_all();
        match dialed {
            Ok(Dialed::Kept(sock)) => {
                let p = self.install(peer, sock)?;
                drop(dialing);
                introduce(p.link.as_ref(), self.pulse.as_deref());
                tracing::debug!(me = self.me, peer, "connected on demand");
                Ok(p)
            }
            Ok(Dialed::Theirs) => loop {
                if let Some(p) = self.links.peer(peer) {
                    return Ok(p);
                }
                dialing = self.wait(dialing, peer, deadline)?;
            },
            Ok(Dialed::Gone) => {
                drop(dialing);
                self.gone(peer)
            }
            Err(e) => {
                drop(dialing);
                // Given up because news said the peer was lost: that is the reason.
                if let Some(reason) = self.inbox.lost_anywhere(peer) {
                    return Err(lost(peer, &reason));
                }
                // This rank's own want (`Error::local_shortage`: a dial's other errors are
                // Connect, Auth or Timeout): the peer is not to blame (a shrink would evict it).
                if matches!(e.kind(), crate::error::ErrorKind::System | crate::error::ErrorKind::OutOfMemory) {
                    return Err(e);
                }
                let why = format!("could not connect: {}", e.message());
                self.inbox.mark_failed(peer, super::Fault::cut(why.clone()));
                Err(Error::rank_failed(vec![peer], format!("world rank {peer} is unreachable: {why}")))
            }
        }
    }

    /// A peer whose listener is closed. It may have dialed this rank before it left, sent its
    /// frames on that connection and said goodbye: then this rank's acceptor keeps (or has just
    /// kept) that connection, and its frames are still to be read, so its link is the answer.
    /// Else its process crashed (its links' other ends saw that, and their news comes within
    /// moments) or it left on purpose (only the ranks it had links to heard its goodbye): a
    /// departure unless news says otherwise, so that a rank that left right after its own
    /// error is not blamed (see [`Net::send`]).
    fn gone(&self, peer: u32) -> Result<Peer> {
        let until = Instant::now() + super::WITHDRAW_GRACE;
        loop {
            if let Some(p) = self.links.peer(peer) {
                return Ok(p);
            }
            if Instant::now() >= until || self.inbox.lost_anywhere(peer).is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Err(match self.inbox.lost_anywhere(peer) {
            Some(reason) => lost(peer, &reason),
            None => {
                // What it left knowing is unknown: most likely what this rank knows of (a rank
                // that leaves right after a failure leaves because of it), so that the failure
                // is named, not the rank that left.
                let known = self.inbox.losses();
                self.inbox.mark_departed(peer, self.inbox.by_id(known.clone()));
                super::departure(peer, &known)
            }
        })
    }

    /// Connects to `peer` on a thread of its own unless one is at it already (the watchdog's
    /// new neighbour after a failure: the watchdog must not wait for a dial).
    pub fn connect_aside(self: &Arc<Self>, peer: u32) {
        if !self.aside.locked().insert(peer) {
            return;
        }
        let on = self.clone();
        let spawned = std::thread::Builder::new().name("hccn-dial".into()).spawn(move || {
            if let Err(e) = on.connect(peer) {
                tracing::debug!(peer, "no link to a new neighbour: {e}");
            }
            on.aside.locked().remove(&peer);
        });
        if spawned.is_err() {
            self.aside.locked().remove(&peer);
        }
    }

    /// Waits (a slice at a time) for a change to the dials or links, until `deadline` or until
    /// `peer` is known failed.
    fn wait<'a>(
        &self,
        dialing: std::sync::MutexGuard<'a, HashSet<u32>>,
        peer: u32,
        deadline: Instant,
    ) -> Result<std::sync::MutexGuard<'a, HashSet<u32>>> {
        if let Some(reason) = self.inbox.lost_anywhere(peer) {
            return Err(lost(peer, &reason));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::timeout(format!(
                "no connection with world rank {peer} within {} ms (HCCN_TIMEOUT_MS)",
                self.cfg.timeout.as_millis()
            )));
        }
        let (g, _) = self
            .settled
            .wait_timeout(dialing, left.min(Duration::from_millis(20)))
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Ok(g)
    }

    /// The acceptor's decision on a connection dialed by world rank `peer`, told to the dialer
    /// in one byte (see the module's documentation): a connection kept is installed before this
    /// returns true.
    pub fn admit(&self, peer: u32, sock: TcpStream) -> Result<bool> {
        let answer = |keep: bool| {
            tcp::send_all(&sock, &[u8::from(keep)], &[])
                .map_err(|e| Error::io(crate::error::ErrorKind::Connect, format!("answer to world rank {peer}"), &e))
        };
        if peer == self.me || peer as usize >= self.links.len() {
            return answer(false).map(|()| false);
        }
        let dialing = self.dialing.locked();
        if self.ended.get().is_some() {
            // No answer: the dialer asks again and finds the listener closed, a departure.
            return Ok(false);
        }
        let theirs_wins = !dialing.contains(&peer) || peer < self.me;
        if self.links.peer(peer).is_some() || !theirs_wins {
            return answer(false).map(|()| false);
        }
        answer(true)?;
        let p = self.install(peer, sock)?;
        drop(dialing);
        self.settled.notify_all();
        introduce(p.link.as_ref(), self.pulse.as_deref());
        tracing::debug!(me = self.me, peer, "accepted on demand");
        Ok(true)
    }

    /// Starts the link on `sock`, with shared memory where the pair links that way, and files it
    /// as `peer`'s (called under `dialing`).
    fn install(&self, peer: u32, sock: TcpStream) -> Result<Peer> {
        if let Some(goodbye) = self.ended.get() {
            // The peer kept this connection (this rank dialed): without the goodbye, its end
            // would look like a crash to the peer.
            if let Some(news) = goodbye {
                tcp::leave(&sock, news, Duration::from_millis(100));
            }
            return Err(Error::new(
                crate::error::ErrorKind::Aborted,
                format!("no link to world rank {peer}: this rank's world ended"),
            ));
        }
        let (sock, learnt) = self.connector.upgrade(peer, sock)?;
        let local = learnt.and_then(|l| {
            self.shm.know_process(peer, l.process);
            l.link
        });
        let link = tcp::start_link(sock, peer, &self.inbox, &self.cfg)?;
        let transport = if local.is_some() { "shm" } else { "tcp" };
        tracing::info!(target: "hccn_runtime::transport", rank = self.me, peer, transport, "data link on demand");
        let channel: Arc<dyn Channel> = match local.is_some_and(|l| self.shm.add(peer, l)) {
            true => Arc::new(shm::ShmChannel {
                shm: self.shm.clone(),
                peer,
                inbox: self.inbox.clone(),
                timeout: self.cfg.timeout,
            }),
            false => Arc::new(tcp::TcpChannel {
                peer,
                link: link.clone(),
                inbox: self.inbox.clone(),
                progress: self.progress.clone(),
            }),
        };
        let p = Peer { link, channel };
        self.links.set(peer, p.clone());
        Ok(p)
    }
}
