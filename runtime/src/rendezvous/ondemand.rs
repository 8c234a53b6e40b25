//! Which links a world opens as it forms, and how the others open later (transport/ondemand.rs).
//!
//! Each rank's record in the store says where it listens and what a peer needs to decide about
//! it without a connection: its incarnation (how news names it), its host, whether it allows
//! shared memory, how many neighbours it watches and up to what size it connects every pair
//! (`HCCN_FULL_MESH_UP_TO`). A world larger than that opens, as it forms, only the links that
//! failure detection and news need: the `k` nearest ranks on each side in the ring (the watched
//! neighbours) and the hypercube partners (rank xor 2^i: news passed on along them reaches every
//! rank in log2(n) hops; the binomial trees of the link-cost broadcast and of rooted
//! collectives from rank 0 are made of them too). Every other link opens on its first frame:
//! the dialer's hello says it asks on demand, and the acceptor answers whether it keeps the
//! connection. A pair on one host that both allow it then sets up its shared-memory segment
//! over that connection ([`Dialer::upgrade`]), so a rank maps one segment per peer it talks
//! to, not per rank on its host (32 local ranks: 63 MiB mapped and 31 handshakes each before).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::sync::Locked;
use std::time::{Duration, Instant};

use super::bootstrap::{hear_hello, say_hello};
use crate::config::{Config, Transport};
use crate::error::{Error, ErrorKind, Result};
use crate::transport::shm::{self, HostId};
use crate::transport::{Connector, Dialed, OnDemand};

/// Set in the size field of a hello that asks for a connection on demand: a rank still forming
/// its world refuses it (it expects only the links the world forms with), and the dialer asks
/// again.
pub(crate) const ON_DEMAND: u32 = 1 << 31;

/// The protocol of the records, hellos and frames ranks exchange ([`crate::wire::VERSION`]).
pub(crate) const PROTOCOL: u16 = crate::wire::VERSION;
/// How every record starts, whatever its protocol: `hccn/<protocol> <hccn version> ...`. The
/// rest may change from one protocol to the next; these two fields never do, so that a rank
/// can tell a peer of another protocol from a record it merely cannot read yet.
const TAG: &str = "hccn/";

/// Another hccn's protocol, as its record names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Protocol {
    pub number: u16,
    /// The hccn version that wrote the record (records of protocol 2 do not say).
    pub hccn: Option<String>,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.hccn {
            Some(v) => write!(f, "protocol {} (hccn {v})", self.number),
            None => write!(f, "protocol {} or older", self.number),
        }
    }
}

impl Protocol {
    /// This build's.
    pub fn ours() -> Protocol {
        Protocol { number: PROTOCOL, hccn: Some(env!("CARGO_PKG_VERSION").to_owned()) }
    }
}

/// A rank's record in the store, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Published {
    /// A record of this protocol.
    Ours(Record),
    /// A record of another protocol: a rank running another hccn.
    Other(Protocol),
    /// Neither: what a previous run left under the same keys, say.
    Unreadable,
}

/// What a rank publishes about itself (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub addr: SocketAddr,
    pub incarnation: u64,
    pub host: HostId,
    pub shm: bool,
    pub watched: u32,
    pub full_mesh_up_to: u32,
    /// The world size this rank was started with: ranks started with different sizes are
    /// told so when they meet, instead of waiting for ranks that will never come.
    pub size: u32,
}

impl Record {
    pub fn mine(addr: SocketAddr, size: u32, cfg: &Config) -> Record {
        Record {
            size,
            addr,
            incarnation: crate::transport::incarnation(),
            host: crate::transport::shm::host_id(),
            shm: cfg.transport != Transport::Tcp,
            watched: cfg.watched_peers as u32,
            full_mesh_up_to: cfg.full_mesh_up_to,
        }
    }

    /// `hccn/<protocol> <hccn version>`, then the fields of this protocol (see [`Published`]).
    pub fn encode(&self) -> String {
        let host: String = self.host.iter().map(|b| format!("{b:02x}")).collect();
        let shm = u8::from(self.shm);
        let (w, m, n) = (self.watched, self.full_mesh_up_to, self.size);
        let (p, v) = (PROTOCOL, env!("CARGO_PKG_VERSION"));
        format!("{TAG}{p} {v} {} {:x} {host} {shm} {w} {m} {n}", self.addr, self.incarnation)
    }

    /// What a rank's record says: its protocol is read first, whatever follows it.
    pub fn read(text: &str) -> Published {
        let Some(tagged) = text.strip_prefix(TAG) else {
            // Protocol 2 wrote the fields alone: 6 of them, then 7 once world sizes were exchanged.
            let legacy = Record::fields(text).is_some() || Record::fields(&format!("{text} 0")).is_some();
            return match legacy {
                true => Published::Other(Protocol { number: 2, hccn: None }),
                false => Published::Unreadable,
            };
        };
        let mut f = tagged.splitn(3, ' ');
        let (Some(Ok(number)), Some(hccn)) = (f.next().map(str::parse::<u16>), f.next()) else {
            return Published::Unreadable;
        };
        if number != PROTOCOL {
            return Published::Other(Protocol { number, hccn: Some(hccn.to_owned()) });
        }
        match f.next().and_then(Record::fields) {
            Some(record) => Published::Ours(record),
            None => Published::Unreadable,
        }
    }

    /// A record of this protocol (`None` for anything else).
    pub fn parse(text: &str) -> Option<Record> {
        match Record::read(text) {
            Published::Ours(record) => Some(record),
            _ => None,
        }
    }

    /// The fields after the protocol and version.
    fn fields(text: &str) -> Option<Record> {
        let mut f = text.split(' ');
        let addr = f.next()?.parse().ok()?;
        let incarnation = u64::from_str_radix(f.next()?, 16).ok()?;
        let hex = f.next()?;
        let mut host = [0u8; 32];
        if hex.len() != 64 {
            return None;
        }
        for (i, b) in host.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        let shm = match f.next()? {
            "0" => false,
            "1" => true,
            _ => return None,
        };
        let watched = f.next()?.parse().ok()?;
        let full_mesh_up_to = f.next()?.parse().ok()?;
        let size = f.next()?.parse().ok()?;
        f.next().is_none().then_some(Record { addr, incarnation, host, shm, watched, full_mesh_up_to, size })
    }
}

/// Whether the world of these records connects on demand: it is larger than any of its ranks
/// connects every pair up to.
pub(crate) fn on_demand(records: &[Record]) -> bool {
    let n = records.len() as u64;
    records.iter().any(|r| n > u64::from(r.full_mesh_up_to))
}

/// Whether world ranks `a` and `b` connect as the world forms (the same answer on both sides).
pub(crate) fn eager(a: u32, b: u32, records: &[Record]) -> bool {
    let n = records.len() as u32;
    if !on_demand(records) {
        return true;
    }
    let (ra, rb) = (&records[a as usize], &records[b as usize]);
    let d = (a + n - b) % n;
    let k = ra.watched.max(rb.watched);
    d.min(n - d) <= k || (a ^ b).is_power_of_two()
}

/// What opens the links a world of these `records` forms without (this is world rank `me`):
/// none when it connects every pair.
pub(crate) fn connector(
    me: u32,
    mesh: u64,
    token: &[u8],
    records: &[Record],
    listener: TcpListener,
    cfg: &Config,
) -> Result<Option<Box<dyn Connector>>> {
    if !on_demand(records) {
        return Ok(None);
    }
    listener.set_nonblocking(true).map_err(|e| Error::io(ErrorKind::System, "listener", &e))?;
    let addrs = records.iter().map(|r| r.addr).collect();
    let here = crate::transport::shm::host_id();
    let mine = cfg.transport != Transport::Tcp;
    let shared_memory = records.iter().map(|r| mine && r.shm && r.host == here).collect();
    let size = records.len() as u32;
    let (token, cfg, pending) = (token.into(), cfg.clone(), Default::default());
    let shortage = Mutex::new(None);
    Ok(Some(Box::new(Dialer { me, size, mesh, token, addrs, shared_memory, listener, cfg, pending, shortage })))
}

/// Dials peers on demand at the addresses of the roster, and takes their connections at the
/// listener the world formed with.
pub(crate) struct Dialer {
    pub me: u32,
    pub size: u32,
    pub mesh: u64,
    pub token: Arc<[u8]>,
    pub addrs: Vec<SocketAddr>,
    /// By world rank: whether this rank and that one link by shared memory (one host, both allow
    /// it: the same answer on both sides).
    pub shared_memory: Vec<bool>,
    pub listener: TcpListener,
    pub cfg: Config,
    /// Handshakes of connections on demand in progress.
    pub pending: Arc<AtomicUsize>,
    /// Until when accepting is paused, while it fails for want of resources.
    shortage: Mutex<Option<Instant>>,
}

/// How long the listener is left alone after an accept failed for want of descriptors or
/// memory: the connection stays queued (its dialer waits, as for a slow acceptor), rather than
/// failing again at once in a loop.
const SHORTAGE_PAUSE: Duration = Duration::from_millis(100);

impl Dialer {
    /// Pauses accepting after a failed accept; says so once per shortage.
    fn short_of(&self, e: &std::io::Error) {
        let mut shortage = self.shortage.locked();
        if shortage.is_none() {
            match Error::local_shortage("connections on demand: accept", e) {
                Some(short) => tracing::warn!("{short}; trying again every {SHORTAGE_PAUSE:?}"),
                None => tracing::warn!("connections on demand: accept: {e}; trying again every {SHORTAGE_PAUSE:?}"),
            }
        }
        *shortage = Some(Instant::now() + SHORTAGE_PAUSE);
    }
}

/// Handshakes of connections on demand in progress at once; connections beyond are closed
/// unread (their dialers ask again), so a flood of stalled connections costs a bounded number
/// of threads.
const MAX_PENDING: usize = 64;

/// How long a dialer waits between asks while the peer is still forming its world.
const ASK_AGAIN: Duration = Duration::from_millis(10);
/// Longest handshake of one ask, as for the links a world forms with: a live peer answers in
/// milliseconds, but a crowded host (hundreds of ranks on two cores, all dialing after a
/// failure) may take seconds to run its acceptor, and an ask given up after the acceptor kept the
/// connection costs the pair a retry (see transport/ondemand.rs).
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

impl Connector for Dialer {
    fn listener(&self) -> Option<RawFd> {
        let paused = self.shortage.locked().is_some_and(|until| Instant::now() < until);
        (!paused).then(|| self.listener.as_raw_fd())
    }

    fn accept(&self, on: &Arc<OnDemand>) {
        loop {
            let (sock, from) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => return self.short_of(&e),
            };
            *self.shortage.locked() = None;
            if self.pending.load(Ordering::SeqCst) >= MAX_PENDING {
                tracing::warn!(%from, "closed a connection on demand unread: {MAX_PENDING} handshakes in progress");
                continue;
            }
            self.pending.fetch_add(1, Ordering::SeqCst);
            let pending = self.pending.clone();
            let (on, token, mesh, size) = (on.clone(), self.token.clone(), self.mesh, self.size);
            let timeout = self.cfg.timeout.min(Duration::from_secs(10));
            // A handshake of its own: a caller that stalls holds up nobody.
            let spawned = std::thread::Builder::new().name("hccn-handshake".into()).spawn(move || {
                accept_one(sock, mesh, size, &token, timeout, &on, from);
                pending.fetch_sub(1, Ordering::SeqCst);
            });
            if let Err(e) = spawned {
                self.pending.fetch_sub(1, Ordering::SeqCst);
                tracing::warn!(%from, "refused a connection on demand: no thread for its handshake: {e}");
            }
        }
    }

    fn dial(&self, peer: u32, given_up: &dyn Fn() -> bool) -> Result<Dialed> {
        let addr =
            *self.addrs.get(peer as usize).ok_or_else(|| Error::internal(format!("no address of rank {peer}")))?;
        let deadline = Instant::now() + self.cfg.timeout;
        loop {
            // Every rank listened before it published its record, until its world ends: a
            // refusal means the peer is gone, and so does a reset (its listener closed with this
            // connection still in its queue: it left just now, as a survivor does after its last
            // call; blaming it for a failure would fail the callers' operations).
            let mut sock = match TcpStream::connect_timeout(&addr, self.cfg.timeout) {
                Ok(s) => s,
                Err(e) if gone(&e) => return Ok(Dialed::Gone),
                Err(e) => {
                    let what = format!("connect to world rank {peer} at {addr}");
                    if let Some(short) = Error::local_shortage(&what, &e) {
                        return Err(short);
                    }
                    return Err(Error::io(ErrorKind::Connect, format!("connect to world rank {peer} at {addr}"), &e));
                }
            };
            let asked = self.ask(&mut sock, peer, given_up);
            match asked {
                Ok(true) => return Ok(Dialed::Kept(sock)),
                Ok(false) => return Ok(Dialed::Theirs),
                Err(e) if Instant::now() >= deadline || given_up() => return Err(e),
                // No answer: the peer is still forming its world.
                Err(_) => std::thread::sleep(ASK_AGAIN),
            }
        }
    }

    fn upgrade(&self, peer: u32, sock: TcpStream) -> Result<(TcpStream, Option<shm::Learnt>)> {
        if !self.shared_memory.get(peer as usize).is_some_and(|&on| on) {
            if self.cfg.transport == Transport::Shm {
                return Err(Error::invalid(format!(
                    "HCCN_TRANSPORT=shm, but world rank {peer} is on another host (or network namespace)"
                )));
            }
            return Ok((sock, None));
        }
        // Its phases are small messages each side writes before reading the other's: with
        // Nagle's algorithm on, each would wait for a delayed acknowledgement (40 ms).
        sock.set_nodelay(true).map_err(|e| Error::io(ErrorKind::Connect, "socket", &e))?;
        let mut socks = vec![(peer, sock)];
        let learnt = shm::handshake(&mut socks, self.me, self.mesh, &shm::host_id(), &self.cfg)?;
        let (_, sock) = socks.pop().ok_or_else(|| Error::internal("shared-memory handshake lost its socket"))?;
        Ok((sock, learnt.into_iter().next()))
    }
}

/// Whether a failed connect says that nothing listens at the address any more.
fn gone(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(e.kind(), ConnectionRefused | ConnectionReset | ConnectionAborted)
}

impl Dialer {
    /// Authenticates, says who is calling and reads whether the peer keeps the connection, in
    /// at most [`ASK_TIMEOUT`] (then the dial asks again, unless it gave up), or until the dial
    /// is given up: a frozen peer's kernel takes the connection, and nothing ever answers.
    fn ask(&self, sock: &mut TcpStream, peer: u32, given_up: &dyn Fn() -> bool) -> Result<bool> {
        let deadline = Instant::now() + self.cfg.timeout.min(ASK_TIMEOUT);
        let mut sock = Patient { sock, given_up, deadline };
        say_hello(&mut sock, peer, (self.mesh, self.me, self.size | ON_DEMAND), &self.token)?;
        let mut answer = [0u8; 1];
        sock.read_exact(&mut answer)
            .map_err(|e| Error::io(ErrorKind::Connect, "no answer to a connection on demand", &e))?;
        Ok(answer[0] == 1)
    }
}

/// A socket whose reads wait a slice at a time, and end at a deadline or once `given_up` says so.
struct Patient<'a> {
    sock: &'a TcpStream,
    given_up: &'a dyn Fn() -> bool,
    deadline: Instant,
}

/// How often a dial waiting for an answer looks whether it was given up.
const PATIENCE: Duration = Duration::from_millis(20);

impl Read for Patient<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || (self.given_up)() {
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the peer did not answer"));
            }
            self.sock.set_read_timeout(Some(left.min(PATIENCE)))?;
            let mut sock = self.sock;
            match sock.read(buf) {
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                read => return read,
            }
        }
    }
}

impl Write for Patient<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut sock = self.sock;
        sock.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let mut sock = self.sock;
        sock.flush()
    }
}

fn accept_one(
    mut sock: TcpStream,
    mesh: u64,
    size: u32,
    token: &[u8],
    timeout: Duration,
    on: &OnDemand,
    from: SocketAddr,
) {
    let admitted = (|| -> Result<bool> {
        let (their_mesh, rank, their_size) = hear_hello(&mut sock, token, timeout)?;
        if their_mesh != mesh || their_size != size | ON_DEMAND || rank >= size {
            return Err(Error::new(ErrorKind::Connect, "not a connection on demand of this world"));
        }
        on.admit(rank, sock)
    })();
    if let Err(e) = admitted {
        tracing::warn!(%from, "refused a connection on demand: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(port: u16, host: u8, shm: bool) -> Record {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        Record {
            addr,
            incarnation: u64::from(port) << 20,
            host: [host; 32],
            shm,
            watched: 2,
            full_mesh_up_to: 16,
            size: 4,
        }
    }

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let r = record(4242, 7, true);
        assert_eq!(Record::parse(&r.encode()), Some(r.clone()));
        assert_eq!(Record::parse("127.0.0.1:1"), None);
        assert_eq!(Record::parse(&format!("{} extra", r.encode())), None);
        assert_eq!(Record::parse(&r.encode().replace(" 1 ", " 2 ")), None);
    }

    #[test]
    fn a_record_of_another_protocol_is_named_by_it_whatever_follows() {
        let r = record(4242, 7, true);
        let ours = r.encode();
        assert!(ours.starts_with(&format!("hccn/{PROTOCOL} {} ", env!("CARGO_PKG_VERSION"))), "{ours}");
        assert_eq!(Record::read(&ours), Published::Ours(r.clone()));
        let other = |number, hccn: &str| Published::Other(Protocol { number, hccn: Some(hccn.to_owned()) });
        assert_eq!(Record::read("hccn/99 9.9.9 fields of another layout"), other(99, "9.9.9"));
        assert_eq!(Record::read("hccn/99 9.9.9"), other(99, "9.9.9"));
        // Protocol 2 wrote the fields alone: 7 of them (6 before world sizes were exchanged).
        let fields = ours.splitn(3, ' ').nth(2).expect("fields").to_owned();
        let legacy = Published::Other(Protocol { number: 2, hccn: None });
        assert_eq!(Record::read(&fields), legacy);
        assert_eq!(Record::read(fields.rsplit_once(' ').expect("size").0), legacy);
        assert_eq!(Record::read("127.0.0.1:1"), Published::Unreadable);
        assert_eq!(Record::read("hccn/x 1.0 ..."), Published::Unreadable);
        assert_eq!(Record::read(&format!("{ours} extra")), Published::Unreadable);
        assert_eq!(Protocol::ours().to_string(), format!("protocol {PROTOCOL} (hccn {})", env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn small_worlds_connect_every_pair_large_ones_their_ring_and_hypercube() {
        let small: Vec<Record> = (0..16).map(|r| record(r, 1, false)).collect();
        assert!((0..16).all(|a| (0..16).all(|b| a == b || eager(a, b, &small))));
        let n = 64u32;
        let tcp: Vec<Record> = (0..n).map(|r| record(r as u16, 1, false)).collect();
        for a in 0..n {
            let peers: Vec<u32> = (0..n).filter(|&b| b != a && eager(a, b, &tcp)).collect();
            assert!(peers.iter().all(|&b| eager(b, a, &tcp)), "the rule is symmetric");
            // 2 on each side, and the 6 hypercube partners (some of them neighbours already).
            assert!(peers.len() <= 4 + 6, "rank {a}: {peers:?}");
            assert!(peers.contains(&((a + 1) % n)) && peers.contains(&(a ^ 32)));
        }
        // Shared memory changes nothing: its pairs link on demand too.
        let local: Vec<Record> = (0..n).map(|r| record(r as u16, 1, true)).collect();
        assert!(!eager(0, 10, &local) && !eager(0, 11, &tcp) && eager(0, 8, &local));
    }
}
