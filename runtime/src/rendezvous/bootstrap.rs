//! Bootstrap: how the processes of a world meet and connect. Each rank publishes its listening
//! address in the store; world rank 0 gathers them into one roster, which every other rank reads
//! in one round trip (as NCCL's bootstrap root does: a world of n ranks costs the store O(n)
//! requests, not one per pair). Each rank then connects to the lower ranks and accepts the
//! higher ones (every connection authenticated with the job token, then a hello saying which
//! mesh and rank is calling), then sets up shared memory with the peers on its host; the result
//! is a [`Net`].

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ondemand::{self, Record, ON_DEMAND};
use super::patience::{Arrivals, Next, Patience};
pub(crate) use super::roster::Place;
use super::roster::{gather_roster, parse_record, read_roster};
use super::Store;
use crate::auth::{self, Purpose};
use crate::config::{Config, Transport};
use crate::error::{Error, ErrorKind, Result};
use crate::transport::tcp::start_link;
use crate::transport::waker::{wait_readable, Waker};
use crate::transport::{shm, Inbox, Link, Net};

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

/// Connects to world rank `peer` at the address `resolve` gives, asked again before every retry
/// (a store may still hold a previous run's address until the peer publishes its own), then
/// authenticates and says who is calling.
pub(crate) fn connect_peer(
    resolve: &dyn Fn() -> Result<SocketAddr>,
    peer: u32,
    mesh: u64,
    rank: u32,
    size: u32,
    token: &[u8],
    cfg: &Config,
) -> Result<TcpStream> {
    let deadline = Instant::now() + cfg.timeout;
    let mut sock = loop {
        let addr = resolve()?;
        match TcpStream::connect_timeout(&addr, cfg.timeout) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(Error::io(ErrorKind::Connect, format!("connect to world rank {peer} at {addr}"), &e))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    sock.set_read_timeout(Some(cfg.timeout)).map_err(|e| Error::io(ErrorKind::Connect, "peer socket", &e))?;
    say_hello(&mut sock, peer, (mesh, rank, size), token)?;
    Ok(sock)
}

/// The caller's side of a handshake on a connected stream to world rank `peer` (whose reads the
/// caller bounds): authenticates and says who is calling ([`hello`]: mesh, rank, size).
pub(crate) fn say_hello(
    sock: &mut (impl Read + Write),
    peer: u32,
    (mesh, rank, size): (u64, u32, u32),
    token: &[u8],
) -> Result<()> {
    auth::client_io(sock, token, Purpose::Peer).map_err(|e| e.context(format!("world rank {peer}")))?;
    sock.write_all(&hello(mesh, rank, size)).map_err(|e| Error::io(ErrorKind::Connect, "hello", &e))
}

/// The acceptor's side: authenticates an incoming connection and reads its [`hello`] (mesh,
/// rank, size), all within `timeout`.
pub(crate) fn hear_hello(sock: &mut TcpStream, token: &[u8], timeout: Duration) -> Result<(u64, u32, u32)> {
    sock.set_nonblocking(false).map_err(|e| Error::io(ErrorKind::System, "peer socket", &e))?;
    auth::server(sock, token, Purpose::Peer, timeout)?;
    let mut h = [0u8; 16];
    // Still under the handshake's read timeout.
    sock.read_exact(&mut h).map_err(|e| Error::io(ErrorKind::Connect, "peer left before saying who it is", &e))?;
    Ok(parse_hello(&h))
}

/// Handshakes in progress at once while a mesh forms; connections beyond wait to be accepted.
const MAX_PENDING_HANDSHAKES: usize = 64;

/// The ranks an acceptor waits for: known at once, or once the roster is read (the acceptor runs
/// meanwhile, so that a rank that connects early, or a caller that stalls, waits for nobody).
pub(crate) struct Expected {
    ranks: std::sync::OnceLock<Vec<u32>>,
    known: Waker,
}

impl Expected {
    pub fn later() -> Result<Expected> {
        let known = Waker::new().map_err(|e| Error::io(ErrorKind::System, "eventfd", &e))?;
        Ok(Expected { ranks: std::sync::OnceLock::new(), known })
    }

    pub fn now(ranks: Vec<u32>) -> Result<Expected> {
        let e = Expected::later()?;
        e.set(ranks);
        Ok(e)
    }

    pub fn set(&self, ranks: Vec<u32>) {
        let _ = self.ranks.set(ranks);
        self.known.wake();
    }
}

/// Accepts one connection from each rank `expected` names, refusing (and logging) anything not
/// in `from_ranks`. Each connection authenticates on a thread of its own, so a client that
/// connects and then stalls (or many of them) cannot hold up the members behind it: only the
/// deadline ends the wait.
pub(crate) fn accept_peers(
    listener: &TcpListener,
    mesh: u64,
    (from_ranks, expected): (std::ops::Range<u32>, &Expected),
    size: u32,
    token: &[u8],
    cfg: &Config,
) -> Result<Vec<(u32, TcpStream)>> {
    let sys = |e: std::io::Error| Error::io(ErrorKind::System, "listener", &e);
    listener.set_nonblocking(true).map_err(sys)?;
    // The deadline counts from the last sign of the world forming: the ranks expected becoming
    // known (the roster, read when every rank arrived), then each member connecting. Until they
    // are known the caller, which waits for the ranks to arrive, decides (see patience.rs).
    let mut patience: Option<Patience> = None;
    let handshake_timeout = cfg.timeout.min(Duration::from_secs(10));
    let (tx, rx) = std::sync::mpsc::channel::<(SocketAddr, Result<(u32, TcpStream)>)>();
    let pending = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Each handshake's outcome wakes the loop, which otherwise sleeps until a connection comes:
    // hundreds of ranks polling their listeners would take the CPU the others need to start.
    let done = Arc::new(Waker::new().map_err(sys)?);
    let mut got: Vec<(u32, TcpStream)> = Vec::new();
    let all_in = |got: &[(u32, TcpStream)]| {
        expected.ranks.get().is_some_and(|want| want.iter().all(|r| got.iter().any(|(g, _)| g == r)))
    };
    let mut early = None;
    while !all_in(&got) {
        while let Some((from, outcome)) = early.take().or_else(|| rx.try_recv().ok()) {
            match outcome {
                Ok((rank, _)) if got.iter().any(|(r, _)| *r == rank) => {
                    tracing::warn!(%from, rank, "refused a second connection claiming the same rank");
                }
                Ok(member) => {
                    got.push(member);
                    if let Some(p) = patience.as_mut() {
                        p.grew(Instant::now());
                    }
                }
                Err(_) => {} // logged by its handshake thread
            }
        }
        if all_in(&got) {
            break;
        }
        if patience.is_none() && expected.ranks.get().is_some() {
            patience = Some(Patience::new(Instant::now(), cfg.timeout, 0));
        }
        // At the cap, the next connections wait in the listen queue (not refused: at hundreds
        // of ranks on a few cores, many real members' handshakes are pending at once).
        let full = pending.load(Ordering::SeqCst) >= MAX_PENDING_HANDSHAKES;
        let accepted = if full { Err(std::io::ErrorKind::WouldBlock.into()) } else { listener.accept() };
        let (sock, from) = match accepted {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let next = patience.map(|p| p.next(Instant::now()));
                if next == Some(Next::GiveUp) {
                    let want = expected.ranks.get().cloned().unwrap_or_else(|| from_ranks.clone().collect());
                    let missing: Vec<u32> = want.iter().copied().filter(|r| !got.iter().any(|(g, _)| g == r)).collect();
                    return Err(Error::timeout(format!(
                        "ranks {missing:?} never connected: none came for {} ms (only {} of the {} expected \
                         did); did they start, and reach this address?",
                        cfg.timeout.as_millis(),
                        got.len(),
                        want.len(),
                    )));
                }
                // Cleared before looking, so that an outcome sent after the look still wakes us.
                done.clear();
                early = rx.try_recv().ok();
                if early.is_some() {
                    continue;
                }
                let left = match next {
                    Some(Next::Wait(d)) => d,
                    _ => Duration::from_millis(500),
                };
                expected.known.clear();
                if all_in(&got) {
                    break;
                }
                let listening: &[_] = match full {
                    true => &[done.fd(), expected.known.fd()],
                    false => &[listener.as_raw_fd(), done.fd(), expected.known.fd()],
                };
                wait_readable(listening, left.min(Duration::from_millis(500)));
                continue;
            }
            Err(e) => return Err(sys(e)),
        };
        pending.fetch_add(1, Ordering::SeqCst);
        let (tx, pending2, token, range) = (tx.clone(), pending.clone(), token.to_vec(), from_ranks.clone());
        let done = done.clone();
        let spawned = std::thread::Builder::new().name("hccn-handshake".into()).spawn(move || {
            let outcome = admit_peer(sock, mesh, range, size, &token, handshake_timeout);
            pending2.fetch_sub(1, Ordering::SeqCst);
            // Logged here: a refusal may come after the acceptor has its members and is gone.
            match &outcome {
                Err(e) if e.message().contains(EARLY) => tracing::debug!(%from, "{e}"),
                Err(e) => tracing::warn!(%from, "refused a peer connection: {e}"),
                Ok(_) => {}
            }
            // The acceptor may have finished (or given up) already: then the socket just closes.
            let _ = tx.send((from, outcome));
            done.wake();
        });
        if let Err(e) = spawned {
            pending.fetch_sub(1, Ordering::SeqCst);
            tracing::warn!(%from, "refused a peer connection: no thread for its handshake: {e}");
        }
    }
    Ok(got)
}

/// Why a rank still forming its world refuses a connection on demand (the dialer asks again).
const EARLY: &str = "asked for a connection on demand before this rank's world formed";

/// Authenticates one incoming connection and reads who it is; `Err` says why it is refused.
fn admit_peer(
    mut sock: TcpStream,
    mesh: u64,
    from_ranks: std::ops::Range<u32>,
    size: u32,
    token: &[u8],
    timeout: Duration,
) -> Result<(u32, TcpStream)> {
    let (their_mesh, their_rank, their_size) = hear_hello(&mut sock, token, timeout)?;
    if their_mesh == mesh && their_size == size | ON_DEMAND {
        return Err(Error::new(ErrorKind::Connect, format!("world rank {their_rank} {EARLY}")));
    }
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

/// Sockets to peers, by world rank.
type Sockets = Vec<(u32, TcpStream)>;
/// The links of a world as it forms (by world rank), its shared memory, every rank's host.
type Started = (Vec<Option<Arc<dyn Link>>>, shm::Shm, Vec<Option<shm::HostId>>);

/// Forms world `size`: publish our record, connect to the lower ranks and accept the higher
/// ones (every pair, or in a world that connects on demand the pairs `ondemand::eager` names),
/// set up shared memory with the peers on this host. `at` namespaces the store keys; `mesh`
/// is checked in every hello.
pub(crate) fn connect_mesh(
    rank: u32,
    size: u32,
    store: &dyn Store,
    at: Place<'_>,
    mesh: u64,
    token: &[u8],
    cfg: &Config,
) -> Result<Net> {
    let _span = tracing::debug_span!("mesh", rank, size).entered();
    crate::transport::sweep_once();
    let listener = TcpListener::bind((cfg.bind_addr, 0))
        .map_err(|e| Error::io(ErrorKind::System, format!("listen on {}", cfg.bind_addr), &e))?;
    let addr = listener.local_addr().map_err(|e| Error::io(ErrorKind::System, "listen address", &e))?;
    let mine = Record::mine(addr, size, cfg);
    store.set(&at.addr_key(rank), mine.encode().as_bytes())?;
    Arrivals::count_in(store, at.prefix)?;
    let w = Meeting { rank, size, store, at, mesh, token, cfg };
    let (records, sockets) = w.meet(&listener, &mine)?;

    let inbox = Arc::new(Inbox::default());
    let (links, shm, hosts) = w.start_links(sockets, &records, &inbox)?;
    // News names processes by incarnation: every rank's, also those this one has no link to.
    for (peer, r) in records.iter().enumerate() {
        inbox.note_intro(peer as u32, r.incarnation, None);
    }
    let connector = ondemand::connector(rank, mesh, token, &records, listener, cfg)?;
    let pulse = crate::transport::pulse::Pulse::open(cfg.bind_addr, token);
    Ok(Net::new(rank, links, inbox, pulse, (shm, hosts), cfg, connector))
}

/// Tells an acceptor still waiting to learn whom to expect that nobody is coming.
struct Unblock<'a>(&'a Expected);

impl Drop for Unblock<'_> {
    fn drop(&mut self) {
        self.0.set(Vec::new());
    }
}

/// One rank's part in forming a world (see [`connect_mesh`]).
struct Meeting<'a> {
    rank: u32,
    size: u32,
    store: &'a dyn Store,
    at: Place<'a>,
    mesh: u64,
    token: &'a [u8],
    cfg: &'a Config,
}

impl Meeting<'_> {
    /// Every rank's record, and authenticated sockets to the peers the world forms with.
    fn meet(&self, listener: &TcpListener, mine: &Record) -> Result<(Vec<Record>, Sockets)> {
        let Meeting { rank, size, store, at, mesh, token, cfg } = *self;
        let expected = Expected::later()?;
        std::thread::scope(|s| {
            // Accepting before the roster is read: a rank that reads it sooner connects at once.
            let acceptor = s.spawn(|| accept_peers(listener, mesh, (rank + 1..size, &expected), size, token, cfg));
            // The acceptor keeps no deadline of its own until it knows whom to expect: however
            // this closure ends, it knows (nobody, if the roster never came).
            let _unblock = Unblock(&expected);
            let records = match rank {
                0 => gather_roster(store, at, size, mine, cfg),
                _ => read_roster(store, at, (rank, size), mine, cfg),
            };
            let records = match records {
                Ok(r) => r,
                Err(e) => {
                    // The acceptor would wait for its deadline: nobody is coming.
                    expected.set(Vec::new());
                    return Err(e);
                }
            };
            let eager = |peer: u32| ondemand::eager(rank, peer, &records);
            expected.set((rank + 1..size).filter(|&p| eager(p)).collect());
            let mut connected = Vec::new();
            for peer in (0..rank).filter(|&p| eager(p)) {
                // The roster's address first; on a retry the peer's own record, which a roster
                // gathered before the peer published its own may hold a previous run's value of.
                let asked = std::cell::Cell::new(false);
                let resolve = || match asked.replace(true) {
                    false => Ok(records[peer as usize].addr),
                    true => parse_record(&store.get(&at.addr_key(peer), cfg.timeout)?, (peer, rank)).map(|r| r.addr),
                };
                connected.push((peer, connect_peer(&resolve, peer, mesh, rank, size, token, cfg)?));
            }
            let accepted = acceptor.join().map_err(|_| Error::internal("accept thread panicked"))??;
            connected.extend(accepted);
            Ok((records, connected))
        })
    }

    /// Shared memory with the peers of this host among `sockets` (see shm::handshake), then the
    /// links: by world rank, none where the world forms without one; and every rank's host.
    fn start_links(&self, mut sockets: Sockets, records: &[Record], inbox: &Arc<Inbox>) -> Result<Started> {
        let (rank, cfg) = (self.rank, self.cfg);
        sockets.sort_by_key(|(peer, _)| *peer);
        let here = shm::host_id();
        let mut hosts: Vec<Option<shm::HostId>> = records.iter().map(|r| Some(r.host)).collect();
        hosts[rank as usize] = Some(here);
        let mut local: Vec<Option<shm::ShmPeer>> = (0..self.size).map(|_| None).collect();
        let mut processes = Vec::new();
        let learnt = shm::handshake(&mut sockets, rank, self.mesh, &here, cfg)?;
        for ((peer, _), shm::Learnt { host, link, process }) in sockets.iter().zip(learnt) {
            let (transport, cma) = match &link {
                Some(l) => ("shm", l.cma()),
                None => ("tcp", false),
            };
            // Logged as the transport's (HCCN_LOG=hccn_runtime::transport=info shows every link).
            tracing::info!(target: "hccn_runtime::transport", rank, peer = *peer, transport, cma, "data link");
            hosts[*peer as usize] = Some(host);
            local[*peer as usize] = link;
            processes.push((*peer, process));
        }
        let mut links: Vec<Option<Arc<dyn Link>>> = (0..self.size).map(|_| None).collect();
        for (peer, sock) in sockets {
            links[peer as usize] = Some(start_link(sock, peer, inbox, cfg)?);
        }
        // The ranks this one may link with by shared memory, now or on demand.
        let sharing = records
            .iter()
            .enumerate()
            .filter(|&(peer, r)| peer != rank as usize && cfg.transport != Transport::Tcp && r.shm && r.host == here);
        let sharing = 1 + sharing.count();
        let shm = shm::Shm::new(rank, local, sharing);
        for (peer, process) in processes {
            shm.know_process(peer, process);
        }
        Ok((links, shm, hosts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where the test worlds meet.
    const AT_W: Place<'static> = Place { prefix: "w", job: None };

    /// A store that counts the reads of records each rank makes (not those of the arrivals
    /// counter, one per wait and per slice of it: see patience.rs).
    struct Counting {
        inner: crate::rendezvous::TcpStore,
        gets: std::sync::atomic::AtomicUsize,
    }

    impl Store for Counting {
        fn set(&self, key: &str, value: &[u8]) -> Result<()> {
            self.inner.set(key, value)
        }
        fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
            if key != crate::rendezvous::patience::arrivals_key("w") {
                self.gets.fetch_add(1, Ordering::SeqCst);
            }
            self.inner.get(key, timeout)
        }
        fn add(&self, key: &str, delta: i64) -> Result<i64> {
            self.inner.add(key, delta)
        }
        fn create(&self, key: &str, value: &[u8]) -> Result<Option<Vec<u8>>> {
            self.inner.create(key, value)
        }
    }

    /// An embedded store for worlds of threads over TCP, and their configuration.
    fn store_for_threads(token: &[u8], timeout: Duration) -> (crate::rendezvous::StoreServer, Config) {
        let server = crate::rendezvous::StoreServer::start("127.0.0.1:0".parse().expect("addr"), token).expect("store");
        let cfg = Config {
            timeout,
            transport: crate::config::Transport::Tcp,
            heartbeat: Duration::ZERO,
            ..Config::default()
        };
        (server, cfg)
    }

    #[test]
    fn a_world_costs_the_store_one_read_per_rank_and_rank_0_one_per_rank() {
        let token = b"job token";
        let (server, cfg) = store_for_threads(token, Duration::from_secs(20));
        let size = 6u32;
        let reads: Vec<usize> = std::thread::scope(|s| {
            let ranks: Vec<_> = (0..size)
                .map(|rank| {
                    let (server, cfg) = (&server, &cfg);
                    s.spawn(move || {
                        let inner = crate::rendezvous::TcpStore::connect(server.local_addr(), token, cfg.timeout)
                            .expect("store connection");
                        let store = Counting { inner, gets: Default::default() };
                        let net = connect_mesh(rank, size, &store, AT_W, 99, token, cfg).expect("mesh");
                        assert_eq!(net.links.all().len(), size as usize - 1, "rank {rank} reaches every peer");
                        let reads = store.gets.load(Ordering::SeqCst);
                        // Every rank's mesh stays up until all have counted.
                        (net, reads)
                    })
                })
                .collect();
            let done: Vec<_> = ranks.into_iter().map(|h| h.join().expect("rank")).collect();
            done.into_iter().map(|(_, reads)| reads).collect()
        });
        assert_eq!(reads[0], size as usize - 1, "rank 0 reads each other rank's address once");
        let alone = "every other rank reads rank 0's record (its protocol) and the roster alone";
        assert!(reads[1..].iter().all(|&r| r == 2), "{alone}: {reads:?}");
    }

    #[test]
    fn records_left_by_a_previous_run_do_not_keep_a_world_from_forming() {
        let token = b"job token";
        let (server, cfg) = store_for_threads(token, Duration::from_secs(20));
        // A previous run of another size, under the same prefix, left its records behind:
        // nobody listens at those addresses any more.
        let old = crate::rendezvous::TcpStore::connect(server.local_addr(), token, cfg.timeout).expect("store");
        let gone = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("address");
        for stale_size in [4, 3] {
            let stale = vec![gone.to_string(); stale_size].join("\n");
            old.set(&AT_W.roster_key(), stale.as_bytes()).expect("set");
            for r in 0..4 {
                old.set(&AT_W.addr_key(r), gone.to_string().as_bytes()).expect("set");
            }
            forms_despite_stale_records(&server, token, &cfg);
        }
    }

    /// Three ranks form a world under prefix "w" whatever the store held there, rank 0 coming
    /// late (the others read what was there first).
    fn forms_despite_stale_records(server: &crate::rendezvous::StoreServer, token: &[u8], cfg: &Config) {
        let started = Instant::now();
        std::thread::scope(|s| {
            let ranks: Vec<_> = (0..3u32)
                .map(|rank| {
                    s.spawn(move || {
                        // Rank 0 comes late: the others read the old roster first.
                        if rank == 0 {
                            std::thread::sleep(Duration::from_millis(300));
                        }
                        let store = crate::rendezvous::TcpStore::connect(server.local_addr(), token, cfg.timeout)
                            .expect("store connection");
                        connect_mesh(rank, 3, &store, AT_W, 99, token, cfg).map(|net| net.links.all().len())
                    })
                })
                .collect();
            for h in ranks {
                assert_eq!(h.join().expect("rank").expect("the new world forms"), 2);
            }
        });
        assert!(started.elapsed() < Duration::from_secs(10), "the stale records held the world up");
    }

    #[test]
    fn a_world_that_does_not_meet_names_the_ranks_that_never_came() {
        // Ranks 0 and 1 of 3 come; rank 2 never does.
        for (got, _) in staggered((2, 3), Duration::ZERO, Duration::from_millis(600)) {
            let e = got.expect_err("the world cannot meet");
            assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
            assert!(e.message().contains("ranks [2] never published their address"), "{e}");
        }
    }

    /// Ranks 0..`come` of a world of `size` start `apart` one after another; what each got (its
    /// links), and when.
    fn staggered((come, size): (u32, u32), apart: Duration, timeout: Duration) -> Vec<(Result<usize>, Duration)> {
        let token = b"job token";
        let (server, cfg) = store_for_threads(token, timeout);
        let started = Instant::now();
        std::thread::scope(|s| {
            let ranks: Vec<_> = (0..come)
                .map(|rank| {
                    let (server, cfg) = (&server, &cfg);
                    s.spawn(move || {
                        std::thread::sleep(apart * rank);
                        let store = crate::rendezvous::TcpStore::connect(server.local_addr(), token, cfg.timeout)
                            .expect("store connection");
                        let got =
                            connect_mesh(rank, size, &store, AT_W, 99, token, cfg).map(|net| net.links.all().len());
                        (got, started.elapsed())
                    })
                })
                .collect();
            ranks.into_iter().map(|h| h.join().expect("rank")).collect()
        })
    }

    #[test]
    fn a_world_whose_ranks_keep_arriving_meets_after_more_than_the_timeout() {
        // The last rank starts 1.2 s after the first, whose timeout is 0.6 s.
        for (rank, (got, at)) in
            staggered((4, 4), Duration::from_millis(400), Duration::from_millis(600)).into_iter().enumerate()
        {
            assert_eq!(got.expect("the world meets"), 3, "rank {rank}");
            assert!(at >= Duration::from_millis(1200), "rank {rank} met at {at:?}, before the last rank came");
        }
    }

    #[test]
    fn a_world_fails_one_timeout_after_the_last_arrival_naming_who_never_came() {
        // Ranks 0, 1, 2 come 300 ms apart (the last at 600 ms); rank 3 never does.
        for (rank, (got, at)) in
            staggered((3, 4), Duration::from_millis(300), Duration::from_millis(600)).into_iter().enumerate()
        {
            let e = got.expect_err("the world cannot meet");
            assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
            assert!(e.message().contains("ranks [3] never published their address"), "{e}");
            let ms = at.as_millis();
            assert!((1150..3000).contains(&ms), "rank {rank} gave up at {ms} ms, not ~600 ms after the last arrival");
        }
    }

    #[test]
    fn a_rank_of_another_protocol_is_named_by_every_rank_at_once() {
        let token = b"job token";
        let (server, cfg) = store_for_threads(token, Duration::from_secs(20));
        // The rank of another protocol is rank 1 (rank 0 reads its record), then rank 0 (the
        // others read its record first): it publishes its record and nothing else.
        for (other, prefix) in [(1u32, "p1"), (0, "p0")] {
            let at = Place { prefix, job: None };
            let elder = crate::rendezvous::TcpStore::connect(server.local_addr(), token, cfg.timeout).expect("store");
            elder.set(&at.addr_key(other), b"hccn/99 9.9.9 a layout this protocol does not know").expect("set");
            let started = Instant::now();
            let errors: Vec<Error> = std::thread::scope(|s| {
                let ranks: Vec<_> = (0..3u32)
                    .filter(|&r| r != other)
                    .map(|rank| {
                        let (server, cfg) = (&server, &cfg);
                        s.spawn(move || {
                            let store = crate::rendezvous::TcpStore::connect(server.local_addr(), token, cfg.timeout)
                                .expect("store connection");
                            connect_mesh(rank, 3, &store, at, 99, token, cfg).err().expect("no world across protocols")
                        })
                    })
                    .collect();
                ranks.into_iter().map(|h| h.join().expect("rank")).collect()
            });
            let ours = format!("protocol {} (hccn {})", ondemand::PROTOCOL, env!("CARGO_PKG_VERSION"));
            for e in errors {
                assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
                let m = e.message();
                assert!(m.contains(&format!("rank {other} runs protocol 99 (hccn 9.9.9)")) && m.contains(&ours), "{e}");
            }
            assert!(started.elapsed() < Duration::from_secs(5), "waited for the deadline: {:?}", started.elapsed());
        }
    }

    #[test]
    fn a_rank_that_waits_alone_names_the_job_id_it_waited_under() {
        let token = b"job token";
        let (server, cfg) = store_for_threads(token, Duration::from_millis(300));
        let store = crate::rendezvous::TcpStore::connect(server.local_addr(), token, cfg.timeout).expect("store");
        let at = Place { prefix: "job/mine/g1/world0", job: Some("mine") };
        let e = connect_mesh(1, 2, &store, at, 99, token, &cfg).err().expect("rank 0 never comes");
        assert_eq!(e.kind(), ErrorKind::Timeout, "{e}");
        let m = e.message();
        assert!(m.contains("ranks [0] never published") && m.contains("job id \"mine\" (HCCN_JOB_ID)"), "{e}");
        assert!(m.contains("another job id"), "{e}");
    }

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
        let one = Expected::now(vec![1]).expect("eventfd");
        let (got, member) = std::thread::scope(|s| {
            let acceptor = s.spawn(|| accept_peers(&listener, 77, (1..2, &one), 2, token, &cfg));
            // Let the acceptor take the stalled connections first.
            std::thread::sleep(Duration::from_millis(200));
            let member = connect_peer(&|| Ok(addr), 0, 77, 1, 2, token, &cfg);
            (acceptor.join().expect("acceptor"), member)
        });
        assert!(member.is_ok(), "member refused: {:?}", member.err());
        let got = got.expect("the member is accepted although three connections stall");
        assert_eq!(got.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![1]);
        drop(stalled);
    }

    #[test]
    fn a_token_holder_outside_the_communicator_is_refused() {
        let cfg = Config { timeout: Duration::from_secs(4), ..Config::default() };
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let token = b"job token";
        let one = Expected::now(vec![1]).expect("eventfd");
        let got = std::thread::scope(|s| {
            let acceptor = s.spawn(|| accept_peers(&listener, 77, (1..2, &one), 2, token, &cfg));
            // Right token, wrong mesh; then a rank outside the range; then the member.
            let _a = connect_peer(&|| Ok(addr), 0, 78, 1, 2, token, &cfg).expect("handshake passes");
            let _b = connect_peer(&|| Ok(addr), 0, 77, 5, 2, token, &cfg).expect("handshake passes");
            let _c = connect_peer(&|| Ok(addr), 0, 77, 1, 2, token, &cfg).expect("member");
            acceptor.join().expect("acceptor")
        });
        let got = got.expect("accepted");
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 1);
    }

    #[test]
    fn a_stale_address_is_asked_for_again_until_the_peer_publishes_its_own() {
        let cfg = Config { timeout: Duration::from_secs(4), ..Config::default() };
        // A previous run's address: nobody listens there any more.
        let stale = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("stale address");
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let live = listener.local_addr().expect("addr");
        let asked = std::sync::atomic::AtomicU32::new(0);
        // The store answers with the stale address three times, then with the peer's own.
        let resolve = || Ok(if asked.fetch_add(1, Ordering::SeqCst) < 3 { stale } else { live });
        let token = b"job token";
        let one = Expected::now(vec![1]).expect("eventfd");
        let got = std::thread::scope(|s| {
            let acceptor = s.spawn(|| accept_peers(&listener, 77, (1..2, &one), 2, token, &cfg));
            let member = connect_peer(&resolve, 0, 77, 1, 2, token, &cfg);
            assert!(member.is_ok(), "never reached the live address: {:?}", member.err());
            acceptor.join().expect("acceptor")
        });
        assert_eq!(got.expect("accepted").len(), 1);
        assert!(asked.load(Ordering::SeqCst) >= 4, "the address was not asked for again");
    }
}
