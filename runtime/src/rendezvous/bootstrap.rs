//! Bootstrap: how the processes of a world meet and connect. Each rank publishes its listening
//! address in the store, connects to the lower ranks and accepts the higher ones (every
//! connection authenticated with the job token, then a hello saying which mesh and rank is
//! calling), then sets up shared memory with the peers on its host; the result is a [`Net`].

use std::io::Read;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Store;
use crate::auth::{self, Purpose};
use crate::config::Config;
use crate::error::{Error, ErrorKind, Result};
use crate::transport::tcp::{send_all, start_link};
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
    auth::client(&mut sock, token, Purpose::Peer, cfg.timeout).map_err(|e| e.context(format!("world rank {peer}")))?;
    send_all(&sock, &hello(mesh, rank, size), &[]).map_err(|e| Error::io(ErrorKind::Connect, "hello", &e))?;
    Ok(sock)
}

/// Handshakes in progress at once while a mesh forms; connections beyond wait to be accepted.
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
    // Each handshake's outcome wakes the loop, which otherwise sleeps until a connection comes:
    // hundreds of ranks polling their listeners would take the CPU the others need to start.
    let done = Arc::new(Waker::new().map_err(sys)?);
    let mut got: Vec<(u32, TcpStream)> = Vec::new();
    let want = from_ranks.len();
    let mut early = None;
    while got.len() < want {
        while let Some((from, outcome)) = early.take().or_else(|| rx.try_recv().ok()) {
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
        // At the cap, the next connections wait in the listen queue (not refused: at hundreds
        // of ranks on a few cores, many real members' handshakes are pending at once).
        let full = pending.load(Ordering::SeqCst) >= MAX_PENDING_HANDSHAKES;
        let accepted = if full { Err(std::io::ErrorKind::WouldBlock.into()) } else { listener.accept() };
        let (sock, from) = match accepted {
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
                // Cleared before looking, so that an outcome sent after the look still wakes us.
                done.clear();
                early = rx.try_recv().ok();
                if early.is_some() {
                    continue;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                let listening: &[_] = if full { &[done.fd()] } else { &[listener.as_raw_fd(), done.fd()] };
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
            if let Err(e) = &outcome {
                tracing::warn!(%from, "refused a peer connection: {e}");
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
    crate::transport::sweep_once();
    let inbox = Arc::new(Inbox::default());
    let listener = TcpListener::bind((cfg.bind_addr, 0))
        .map_err(|e| Error::io(ErrorKind::System, format!("listen on {}", cfg.bind_addr), &e))?;
    let addr = listener.local_addr().map_err(|e| Error::io(ErrorKind::System, "listen address", &e))?;
    store.set(&format!("{prefix}/addr/{rank}"), addr.to_string().as_bytes())?;

    let sockets = std::thread::scope(|s| -> Result<Vec<(u32, TcpStream)>> {
        let acceptor = s.spawn(|| accept_peers(&listener, mesh, rank + 1..size, size, token, cfg));
        let mut connected = Vec::new();
        for peer in 0..rank {
            let resolve = || {
                let raw = store.get(&format!("{prefix}/addr/{peer}"), cfg.timeout)?;
                let text = String::from_utf8_lossy(&raw).into_owned();
                text.parse().map_err(|_| Error::new(ErrorKind::Store, format!("bad address {text:?} for rank {peer}")))
            };
            connected.push((peer, connect_peer(&resolve, peer, mesh, rank, size, token, cfg)?));
        }
        let accepted = acceptor.join().map_err(|_| Error::internal("accept thread panicked"))??;
        connected.extend(accepted);
        Ok(connected)
    })?;

    // Host ids and shared memory, with every peer at once (see shm::handshake).
    let mut sockets = sockets;
    sockets.sort_by_key(|(peer, _)| *peer);
    let mine = shm::host_id();
    let mut hosts = vec![None; size as usize];
    hosts[rank as usize] = Some(mine);
    let mut local: Vec<Option<shm::ShmPeer>> = (0..size).map(|_| None).collect();
    let learnt = shm::handshake(&mut sockets, rank, mesh, &mine, cfg)?;
    for ((peer, _), (host, link)) in sockets.iter().zip(learnt) {
        let (transport, cma) = match &link {
            Some(l) => ("shm", l.cma()),
            None => ("tcp", false),
        };
        // Logged as the transport's (HCCN_LOG=hccn_runtime::transport=info shows every link).
        tracing::info!(target: "hccn_runtime::transport", rank, peer = *peer, transport, cma, "data link");
        hosts[*peer as usize] = Some(host);
        local[*peer as usize] = link;
    }
    let mut links: Vec<Option<Arc<dyn Link>>> = (0..size).map(|_| None).collect();
    for (peer, sock) in sockets {
        links[peer as usize] = Some(start_link(sock, peer, &inbox, cfg)?);
    }
    let pulse = crate::transport::pulse::Pulse::open(cfg.bind_addr, token);
    let mut net = Net::new(rank, links, inbox, pulse, shm::Shm::new(rank, local), cfg);
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
        let got = std::thread::scope(|s| {
            let acceptor = s.spawn(|| accept_peers(&listener, 77, 1..2, 2, token, &cfg));
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
        let got = std::thread::scope(|s| {
            let acceptor = s.spawn(|| accept_peers(&listener, 77, 1..2, 2, token, &cfg));
            let member = connect_peer(&resolve, 0, 77, 1, 2, token, &cfg);
            assert!(member.is_ok(), "never reached the live address: {:?}", member.err());
            acceptor.join().expect("acceptor")
        });
        assert_eq!(got.expect("accepted").len(), 1);
        assert!(asked.load(Ordering::SeqCst) >= 4, "the address was not asked for again");
    }
}
