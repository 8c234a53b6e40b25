//! A world of processes as this rank reaches it: one link per peer, shared memory to the peers
//! on this host, the inbox, and the watchdog.

use crate::sync::{Locked, RwLocked};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::channel::{Channel, Flow, Progress, SelfChannel, Status};
use super::ondemand::{Connector, OnDemand};
use super::{heartbeat, news, pulse, shm, shm_board, tcp, vouch, Fault, Inbox, Key, Link, Sink};
use crate::error::{Error, Result};
use crate::wire::{FrameHeader, FrameKind};

/// One peer as this rank reaches it: its TCP link (control frames, liveness) and its data
/// channel (shared memory or that same TCP link).
#[derive(Clone)]
pub(crate) struct Peer {
    pub link: Arc<dyn Link>,
    pub channel: Arc<dyn Channel>,
}

/// The peers of one world, indexed by world rank (this process's own numbering of its peers);
/// it grows when replacement ranks are admitted.
#[derive(Default)]
pub(crate) struct LinkTable {
    peers: std::sync::RwLock<Vec<Option<Peer>>>,
}

impl LinkTable {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Option<Peer>>> {
        self.peers.read_locked()
    }

    pub fn get(&self, rank: u32) -> Option<Arc<dyn Link>> {
        self.read().get(rank as usize).cloned().flatten().map(|p| p.link)
    }

    pub fn channel(&self, rank: u32) -> Option<Arc<dyn Channel>> {
        self.read().get(rank as usize).cloned().flatten().map(|p| p.channel)
    }

    pub fn peer(&self, rank: u32) -> Option<Peer> {
        self.read().get(rank as usize).cloned().flatten()
    }

    /// Files the link to world rank `rank`, opened on demand (ondemand.rs).
    pub fn set(&self, rank: u32, peer: Peer) {
        if let Some(slot) = self.peers.write_locked().get_mut(rank as usize) {
            *slot = Some(peer);
        }
    }

    /// Every live link with its world rank.
    pub fn all(&self) -> Vec<(u32, Arc<dyn Link>)> {
        self.read().iter().enumerate().filter_map(|(r, p)| p.as_ref().map(|p| (r as u32, p.link.clone()))).collect()
    }

    /// How many world ranks the table covers (the world's size, joiners included).
    pub fn len(&self) -> usize {
        self.read().len()
    }

    /// Takes the link to world rank `rank` out of the table.
    fn take(&self, rank: u32) -> Option<Peer> {
        self.peers.write_locked().get_mut(rank as usize).and_then(Option::take)
    }

    /// Adds the peer that `make` builds for the next world rank, and returns that rank.
    fn add(&self, make: impl FnOnce(u32) -> Result<Peer>) -> Result<u32> {
        let mut peers = self.peers.write_locked();
        let rank = peers.len() as u32;
        peers.push(Some(make(rank)?));
        Ok(rank)
    }
}

/// The links of one world of processes.
pub(crate) struct Net {
    pub rank: u32,
    pub links: Arc<LinkTable>,
    pub inbox: Arc<Inbox>,
    /// Shared-memory links to the peers on this host (set up with the mesh; none for joiners).
    pub shm: Arc<shm::Shm>,
    /// Host of each world rank, where known (all of them in a world formed together).
    pub hosts: Vec<Option<shm::HostId>>,
    /// This rank's channel to itself.
    local: Arc<dyn Channel>,
    /// What keeps this rank's channels moving while one waits (see channel.rs).
    progress: Option<Progress>,
    graceful: std::sync::atomic::AtomicBool,
    /// Taken when the world ends (dropped, or left at process exit: farewell.rs).
    watchdog: std::sync::Mutex<Option<heartbeat::Watchdog>>,
    /// The world has ended: its links are closed.
    ended: std::sync::atomic::AtomicBool,
    /// This rank's pulse socket, when heartbeats are on.
    pulse: Option<Arc<pulse::Pulse>>,
    /// HCCN_WATCHED_PEERS (see heartbeat.rs).
    watched_peers: usize,
    /// How links missing from `links` open, in a world that connects on demand.
    on_demand: Option<Arc<OnDemand>>,
}

impl Net {
    /// Joins the peers: `links` by world rank, and shared memory (`shm`) to those on this host,
    /// which then becomes their data channel; `hosts`: each world rank's host, where known. A watchdog thread tells the peers of this rank's
    /// losses and, with a heartbeat interval, keeps the links alive (with `pulse`, on a path of
    /// their own too) and declares silent peers failed.
    pub fn new(
        rank: u32,
        links: Vec<Option<Arc<dyn Link>>>,
        inbox: Arc<Inbox>,
        pulse: Option<pulse::Pulse>,
        (shm, mut hosts): (shm::Shm, Vec<Option<shm::HostId>>),
        cfg: &crate::config::Config,
        connector: Option<Box<dyn Connector>>,
    ) -> Net {
        let n = links.len();
        hosts.resize(n.max(rank as usize + 1), None);
        hosts[rank as usize] = Some(shm::host_id());
        let shm = Arc::new(shm);
        let progress: Option<Progress> = (!shm.is_empty()).then(|| {
            let (shm, inbox) = (shm.clone(), inbox.clone());
            Arc::new(move || shm.drain(None, &inbox)) as Progress
        });
        let peers: Vec<Option<Peer>> = links
            .into_iter()
            .enumerate()
            .map(|(r, link)| {
                let link = link?;
                let peer = r as u32;
                let channel: Arc<dyn Channel> = match shm.has(peer) {
                    true => {
                        Arc::new(shm::ShmChannel { shm: shm.clone(), peer, inbox: inbox.clone(), timeout: cfg.timeout })
                    }
                    false => Arc::new(tcp::TcpChannel {
                        peer,
                        link: link.clone(),
                        inbox: inbox.clone(),
                        progress: progress.clone(),
                    }),
                };
                Some(Peer { link, channel })
            })
            .collect();
        let links = Arc::new(LinkTable { peers: std::sync::RwLock::new(peers) });
        let pulse = pulse.filter(|_| !cfg.heartbeat.is_zero()).map(Arc::new);
        inbox.note_intro(rank, incarnation(), None);
        links.all().iter().for_each(|(_, l)| introduce(l.as_ref(), pulse.as_deref()));
        let on_demand = connector.map(|connector| {
            // Peers connected to few others pass news on (heartbeat.rs).
            inbox.set_relaying();
            let (links, inbox, shm, pulse) = (links.clone(), inbox.clone(), shm.clone(), pulse.clone());
            Arc::new(OnDemand::new(rank, (links, inbox, shm), pulse, progress.clone(), cfg, connector))
        });
        let watchdog = heartbeat::Watchdog::start(
            rank,
            links.clone(),
            inbox.clone(),
            pulse.clone(),
            (on_demand.clone(), shm.clone(), hosts.clone()),
            (cfg.heartbeat, cfg.dead_after, cfg.watched_peers),
        );
        let local = Arc::new(SelfChannel { inbox: inbox.clone(), rank });
        Net {
            rank,
            links,
            inbox,
            shm,
            hosts,
            local,
            progress,
            graceful: std::sync::atomic::AtomicBool::new(true),
            watchdog: std::sync::Mutex::new(watchdog),
            ended: std::sync::atomic::AtomicBool::new(false),
            pulse,
            watched_peers: cfg.watched_peers,
            on_demand,
        }
    }

    /// What opens links on demand, in a world that does (see ondemand.rs).
    pub fn on_demand(&self) -> Option<Arc<OnDemand>> {
        self.on_demand.clone()
    }

    /// The peer `rank`, connected first in a world that connects on demand.
    fn peer(&self, rank: u32) -> Result<Peer> {
        match (self.links.peer(rank), &self.on_demand) {
            (Some(p), _) => Ok(p),
            (None, Some(d)) => d.connect(rank),
            (None, None) => Err(match self.inbox.lost_anywhere(rank) {
                Some(reason) => Error::rank_failed(vec![rank], format!("world rank {rank} failed earlier: {reason}")),
                None => Error::internal(format!("no link to world rank {rank}")),
            }),
        }
    }

    /// Closes and forgets the links to those of `ranks` (world ranks a shrink or rebuild has
    /// just excluded) that are known failed. The world outlives its communicators: one that
    /// admits a replacement per failure would otherwise keep a socket per departed rank for as
    /// long as it runs. A rank excluded but not known failed keeps its link (it may still be
    /// told why it was left out).
    pub fn retire(&self, ranks: &[u32]) {
        let failed = self.inbox.failed();
        for &r in ranks.iter().filter(|r| failed.contains_key(r)) {
            if let Some(p) = self.links.take(r) {
                p.link.close(None);
            }
        }
    }

    /// Adds a peer admitted after the world formed (a joiner: TCP), whose link `make` builds for
    /// the next world rank; returns that rank.
    pub fn add_peer(&self, make: impl FnOnce(u32) -> Result<Arc<dyn Link>>) -> Result<u32> {
        let rank = self.links.add(|peer| {
            let link = make(peer)?;
            let (inbox, progress) = (self.inbox.clone(), self.progress.clone());
            let channel = Arc::new(tcp::TcpChannel { peer, link: link.clone(), inbox, progress });
            Ok(Peer { link, channel })
        })?;
        if let Some(link) = self.links.get(rank) {
            introduce(link.as_ref(), self.pulse.as_deref());
        }
        Ok(rank)
    }

    /// The data channel to world rank `peer`.
    fn channel(&self, peer: u32) -> Result<Arc<dyn Channel>> {
        match peer == self.rank {
            true => Ok(self.local.clone()),
            false => match self.links.channel(peer) {
                Some(c) => Ok(c),
                None => self.peer(peer).map(|p| p.channel),
            },
        }
    }

    /// The transport that carries data frames to world rank `peer`.
    /// This process's resources as `hccn-info` reports them: connections open in this world
    /// (to peers not known failed), shared memory mapped and heartbeats sent by the process.
    pub fn usage(&self) -> super::Usage {
        let failed = self.inbox.failed();
        let open = self.links.all().iter().filter(|(r, _)| !failed.contains_key(r)).count();
        super::usage::now(open)
    }

    pub fn transport(&self, peer: u32) -> &'static str {
        match (peer == self.rank, self.links.channel(peer)) {
            (true, _) => self.local.name(),
            (false, Some(c)) => c.name(),
            // Not connected yet: it will be over TCP.
            (false, None) if self.on_demand.is_some() && (peer as usize) < self.links.len() => "tcp",
            (false, None) => "none",
        }
    }

    /// Receives the data frame `key` on its sender's channel (see [`Channel::recv`]).
    pub fn recv(&self, key: Key, timeout: Duration, status: Status<'_>, sink: &mut Sink<'_, '_>) -> Result<()> {
        self.channel(key.src)?.recv(key, timeout, status, sink)
    }

    /// Moves what world rank `src` has written to its ring for this rank into the inbox, where
    /// [`Inbox::holds_from`](super::inbox::Inbox::holds_from) sees it (frames over TCP are
    /// there already). Looks once; takes nothing.
    pub fn drain(&self, src: u32) {
        let nothing = Key { src, kind: FrameKind::P2p, comm_id: 0, seq: u64::MAX };
        let mut check = |_: &FrameHeader| Err(crate::error::Error::internal("no frame matches a drain"));
        let mut skip = |_: usize, _: &[u8]| {};
        let mut sink = Sink { check: &mut check, out: super::Out::Pieces(&mut skip), expect: 0 };
        let _ = self.recv(nothing, Duration::ZERO, &|_| None, &mut sink);
    }

    /// Creates the shared-memory board of a communicator of `n` ranks at `path` (this is rank
    /// `me`); its waits behave like those of the rings.
    pub fn create_board(&self, path: &str, n: u32, me: u32) -> std::io::Result<shm_board::Board> {
        shm_board::Board::create(path, n, me, self.shm.wait())
    }

    /// Maps the board another rank created (see [`Net::create_board`]).
    pub fn open_board(&self, path: &str, n: u32, me: u32) -> std::io::Result<shm_board::Board> {
        shm_board::Board::open(path, n, me, self.shm.wait())
    }

    /// Runs the progress hook: frames waiting on this rank's channels move into the inbox, so
    /// that their senders can go on while this rank waits for something else.
    pub fn keep_moving(&self) {
        if let Some(p) = &self.progress {
            p();
        }
    }

    /// Sends one frame to world rank `dst`: a data frame on its channel, any other on its link.
    /// A frame to a peer that left on purpose is void, as over a link it closed (see
    /// `Link::departed_before`): nobody will read it.
    pub fn send(&self, dst: u32, hdr: &FrameHeader, payload: &[u8]) -> Result<()> {
        if matches!(hdr.kind, FrameKind::Collective | FrameKind::P2p) || dst == self.rank {
            return match self.channel(dst) {
                Err(_) if self.inbox.has_departed(dst) => Ok(()),
                c => c?.send(hdr, payload),
            };
        }
        if let Some(reason) = self.inbox.failed_reason(dst) {
            return Err(Error::rank_failed(vec![dst], format!("world rank {dst} failed earlier: {reason}")));
        }
        let link = match self.links.get(dst) {
            Some(link) => link,
            // Told to the ranks this one has links to, who pass it on (heartbeat.rs): dialing
            // every member when an operation fails would cost the job n² connections.
            None if self.on_demand.is_some() && matches!(hdr.kind, FrameKind::Abandon | FrameKind::Revoke) => {
                return Ok(())
            }
            None => match self.peer(dst) {
                Err(_) if self.inbox.has_departed(dst) => return Ok(()),
                p => p?.link,
            },
        };
        let Err(e) = link.send(hdr, payload) else { return Ok(()) };
        if link.departed_before(&self.inbox, dst) {
            return Ok(());
        }
        self.inbox.mark_failed(dst, Fault::cut(format!("send failed: {e}")));
        Err(Error::rank_failed(vec![dst], format!("world rank {dst} is unreachable: {e}")))
    }

    /// Starts sending one data frame to world rank `dst` (see [`Channel::send_start`]).
    pub fn send_start(&self, dst: u32, hdr: &FrameHeader, payload: &[u8], flow: Flow) -> Result<Option<u64>> {
        match self.channel(dst) {
            Err(_) if self.inbox.has_departed(dst) => Ok(None),
            c => c?.send_start(hdr, payload, flow),
        }
    }

    /// Waits until world rank `dst` has read frame `index` (see [`Channel::send_wait`]).
    pub fn send_wait(&self, dst: u32, index: u64, status: Status<'_>) -> Result<()> {
        self.channel(dst)?.send_wait(index, status)
    }

    /// Withdraws frame `index` to world rank `dst` (see [`Channel::send_withdraw`]).
    pub fn send_withdraw(&self, dst: u32, index: u64) {
        if let Ok(c) = self.channel(dst) {
            c.send_withdraw(index);
        }
    }

    /// Whether this rank watches world rank `peer` for silence (heartbeat.rs): only a watcher
    /// may take silence for a failure, since an unwatched link may carry nothing for long.
    pub fn watches(&self, peer: u32) -> bool {
        let failed = self.inbox.failed();
        let ranks: Vec<u32> = match self.on_demand {
            // As the watchdog does: every rank of the world, linked or not.
            Some(_) => (0..self.links.len() as u32).collect(),
            None => self.links.all().into_iter().map(|(r, _)| r).collect(),
        };
        let live = ranks.into_iter().filter(|r| *r != self.rank && !failed.contains_key(r));
        heartbeat::watches(self.rank, peer, live, self.watched_peers)
    }

    /// How long world rank `peer` has been silent (nothing on its link, no pulse); `None`
    /// without a link to it.
    pub fn silent_for(&self, peer: u32) -> Option<Duration> {
        let link = self.links.get(peer)?.silent_for();
        let pulse = self.pulse.as_ref().and_then(|p| p.silent_for(peer));
        Some(pulse.map_or(link, |p| p.min(link)))
    }

    /// Whether world rank `peer`'s host, when it is another, was heard within `within`: by this
    /// rank on the link or pulses of any of its ranks, or by a host-mate (vouch.rs).
    pub fn host_heard(&self, peer: u32, within: Duration) -> bool {
        let host_of = |r: u32| self.hosts.get(r as usize).copied().flatten();
        let Some(host) = host_of(peer).filter(|h| Some(*h) != host_of(self.rank)) else { return false };
        let ranks = 0..self.hosts.len() as u32;
        let own = ranks.filter(|&r| host_of(r) == Some(host)).filter_map(|r| self.silent_for(r)).min();
        vouch::host_heard(own, self.shm.mates_heard(vouch::tag(&host)), within).heard()
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

/// How long a world that ends waits for its peers to close their side after its goodbye.
const LINGER: Duration = Duration::from_millis(200);

/// This process's incarnation: a random id that names it in news to peers (see news.rs); a
/// forked child has its own.
pub(crate) fn incarnation() -> u64 {
    static ID: std::sync::Mutex<Option<(u64, u64)>> = std::sync::Mutex::new(None);
    let generation = crate::fork::generation();
    let mut id = ID.locked();
    match *id {
        Some((g, id)) if g == generation => id,
        _ => {
            let pid = u64::from(std::process::id());
            let fresh = crate::auth::random_bytes::<8>().map_or(pid, |b| u64::from_le_bytes(b) ^ pid);
            *id = Some((generation, fresh));
            fresh
        }
    }
}

/// Tells the peer of `link` who this process is and where its pulses come from.
pub(crate) fn introduce(link: &dyn Link, pulse: Option<&pulse::Pulse>) {
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

impl Net {
    /// Shared by the communicators of the world; said goodbye for at a successful process exit
    /// if none ends it before (farewell.rs).
    pub fn shared(self) -> Arc<Net> {
        let net = Arc::new(self);
        super::farewell::register(&net);
        net
    }

    /// Ends the world: closes its links, with a goodbye unless it was aborted. Once only: when
    /// dropped, or at process exit.
    pub(super) fn end(&self) {
        if self.ended.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        // A goodbye carries what this rank lost: the peers learn why it left with it.
        let graceful = self.graceful.load(std::sync::atomic::Ordering::SeqCst);
        let news = graceful.then(|| news::encode(&self.inbox.by_id(self.inbox.losses())));
        // No new links once the world ends.
        if let Some(on) = &self.on_demand {
            on.close(news.clone());
        }
        // Stop watching before the links close, or their closing would look like failures.
        drop(self.watchdog.locked().take());
        let links = self.links.all();
        for (_, link) in &links {
            link.close(news.as_deref());
        }
        // At process exit the goodbye is not waited out: a frozen peer must not hold an exiting
        // process. Its data is in the peers' sockets before the close.
        if news.is_some() && super::farewell::goodbye_tag() != super::farewell::EXIT_TAG {
            // The peers close their side once they read the goodbye (tcp/rx.rs); a frozen one
            // costs this much once, not per link.
            let until = Instant::now() + LINGER;
            for (_, link) in &links {
                link.linger(until);
            }
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.end();
    }
}
