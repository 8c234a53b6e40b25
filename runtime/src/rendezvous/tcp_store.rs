//! The embedded store: one thread per client, requests framed as
//! `op u8 | key_len u32 | key | val_len u32 | val`, replies as `status u8 | len u32 | data`.
//! Every connection authenticates with the job token before its first request.
//!
//! What one connection may cost is bounded, since anyone who can reach the port can connect:
//! at most [`Limits::handshakes`] connections handshake at once (a new one beyond that closes the
//! oldest, so a flood of silent connections cannot lock members out), at most
//! [`Limits::clients`] authenticated clients are served at once (the next one is answered with
//! an error and closed), and every wait has an end: the handshake, the rest of a request once
//! its first byte came, writing a reply, an idle client, and a GET.

use crate::sync::{Locked, Waits};
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Store;
use crate::auth::{self, Purpose};
use crate::error::{Error, ErrorKind, Result};

const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;
const OP_CREATE: u8 = 4;

const ST_OK: u8 = 0;
const ST_TIMEOUT: u8 = 1;
const ST_BAD: u8 = 2;
const ST_EXISTS: u8 = 3;

/// Limits on what one request may carry.
pub const MAX_KEY_BYTES: usize = 4096;
pub const MAX_VALUE_BYTES: usize = 16 << 20;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait a GET may ask for; clients split longer waits.
const MAX_GET_WAIT: Duration = Duration::from_secs(3600);
/// How long a client may stay silent between requests before the store closes it; clients
/// that were idle half as long reconnect before their next request.
const IDLE_LIMIT: Duration = Duration::from_secs(3600);
/// How long the rest of a request may take once its first byte came, and a reply to be taken.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Stack of a connection thread: it parses frames and waits, nothing deep.
const CONN_STACK: usize = 256 << 10;
/// Connections dropped for want of room are logged one by one up to this many per interval,
/// then summed up (a failed handshake is always logged).
const LOG_EVERY: Duration = Duration::from_secs(10);
const LOGGED_PER_INTERVAL: u64 = 5;

/// How many connections the store serves at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections still in the job-token handshake.
    pub handshakes: usize,
    /// Authenticated clients: each rank holds one or two while communicators form.
    pub clients: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // Beyond ~4,000 ranks meeting at once, use etcd.
        Limits { handshakes: 64, clients: 4096 }
    }
}

/// The keys and values, and the GETs waiting for keys not set yet.
#[derive(Default)]
struct Data {
    entries: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    values: HashMap<String, Vec<u8>>,
    /// A condition variable per awaited key, with the number of GETs waiting on it: a write
    /// wakes only the GETs of its key. (One for all woke every waiting connection thread on
    /// every write: while 1,024 ranks meet, a million wake-ups on a few cores.)
    waiting: HashMap<String, (Arc<Condvar>, usize)>,
}

impl Entries {
    /// Writes `key` and wakes the GETs waiting for it.
    fn write(&mut self, key: String, value: Vec<u8>) {
        if let Some((changed, _)) = self.waiting.get(&key) {
            changed.notify_all();
        }
        self.values.insert(key, value);
    }
}

impl Data {
    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries.locked()
    }

    /// Wakes every waiting GET (the store stops).
    fn wake_all(&self) {
        for (changed, _) in self.lock().waiting.values() {
            changed.notify_all();
        }
    }

    /// The value of `key`, waited for until `deadline` (or until the store stops).
    fn get(&self, key: &str, deadline: Instant, stop: &AtomicBool) -> Option<Vec<u8>> {
        let mut entries = self.lock();
        if let Some(v) = entries.values.get(key) {
            return Some(v.clone());
        }
        let slot = entries.waiting.entry(key.to_owned()).or_insert_with(|| (Arc::new(Condvar::new()), 0));
        slot.1 += 1;
        let changed = Arc::clone(&slot.0);
        let found = loop {
            if let Some(v) = entries.values.get(key) {
                break Some(v.clone());
            }
            let now = Instant::now();
            if now >= deadline || stop.load(Ordering::SeqCst) {
                break None;
            }
            let wait = (deadline - now).min(Duration::from_millis(500));
            entries = changed.wait_locked_for(entries, wait);
        };
        if let Some(slot) = entries.waiting.get_mut(key) {
            slot.1 -= 1;
            if slot.1 == 0 {
                entries.waiting.remove(key);
            }
        }
        found
    }
}

/// Every open connection, oldest first, with a handle to close it and whether it is still in
/// its handshake.
#[derive(Default)]
struct Conns(Mutex<VecDeque<(u64, TcpStream, bool)>>);

impl Conns {
    fn lock(&self) -> MutexGuard<'_, VecDeque<(u64, TcpStream, bool)>> {
        self.0.locked()
    }

    fn push(&self, id: u64, conn: TcpStream) {
        self.lock().push_back((id, conn, true));
    }

    fn authenticated(&self, id: u64) {
        if let Some(c) = self.lock().iter_mut().find(|c| c.0 == id) {
            c.2 = false;
        }
    }

    /// Closes the oldest connection still in its handshake; its peer.
    fn close_oldest_handshake(&self) -> Option<String> {
        let mut q = self.lock();
        let at = q.iter().position(|c| c.2)?;
        let (_, old, _) = q.remove(at)?;
        let _ = old.shutdown(Shutdown::Both);
        Some(old.peer_addr().map(|a| a.to_string()).unwrap_or_default())
    }

    fn done(&self, id: u64) {
        self.lock().retain(|c| c.0 != id);
    }

    /// Closes them all (the store stops): their threads end at once.
    fn close_all(&self) {
        for (_, conn, _) in self.lock().drain(..) {
            let _ = conn.shutdown(Shutdown::Both);
        }
    }
}

/// Connections dropped for want of room (a flood), logged one by one at first, then as a count
/// per [`LOG_EVERY`].
struct RefusalLog {
    since: Instant,
    logged: u64,
    quiet: u64,
}

impl RefusalLog {
    fn new() -> Self {
        RefusalLog { since: Instant::now(), logged: 0, quiet: 0 }
    }

    fn note(log: &Mutex<RefusalLog>, what: std::fmt::Arguments<'_>) {
        let mut l = log.locked();
        if l.since.elapsed() >= LOG_EVERY {
            if l.quiet > 0 {
                tracing::warn!("store: {} more connection(s) refused or closed in the last {:?}", l.quiet, LOG_EVERY);
            }
            *l = RefusalLog::new();
        }
        if l.logged < LOGGED_PER_INTERVAL {
            l.logged += 1;
            tracing::warn!("store: {what}");
        } else {
            l.quiet += 1;
        }
    }
}

/// What the accept loop and the connection threads share.
struct Shared {
    token: Vec<u8>,
    data: Data,
    stop: AtomicBool,
    limits: Limits,
    conns: Conns,
    /// Connection threads in their handshake, and serving clients (counted until they end).
    handshaking: AtomicUsize,
    clients: AtomicUsize,
    log: Mutex<RefusalLog>,
}

/// A running embedded store; stops when dropped.
pub struct StoreServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for StoreServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreServer").field("addr", &self.addr).finish()
    }
}

impl StoreServer {
    /// Listens on `bind` (port 0 picks one) and serves clients holding `token`.
    pub fn start(bind: SocketAddr, token: &[u8]) -> Result<StoreServer> {
        StoreServer::start_with(bind, token, Limits::default())
    }

    /// [`StoreServer::start`] with other connection limits.
    pub fn start_with(bind: SocketAddr, token: &[u8], limits: Limits) -> Result<StoreServer> {
        let listener =
            TcpListener::bind(bind).map_err(|e| Error::io(ErrorKind::Store, format!("store bind {bind}"), &e))?;
        let addr = listener.local_addr().map_err(|e| Error::io(ErrorKind::Store, "store address", &e))?;
        let shared = Arc::new(Shared {
            token: token.to_vec(),
            data: Data::default(),
            stop: AtomicBool::new(false),
            limits: Limits { handshakes: limits.handshakes.max(1), clients: limits.clients.max(1) },
            conns: Conns::default(),
            handshaking: AtomicUsize::new(0),
            clients: AtomicUsize::new(0),
            log: Mutex::new(RefusalLog::new()),
        });
        let shared2 = shared.clone();
        let accept = std::thread::Builder::new()
            .name("hccn-store".into())
            .spawn(move || accept_loop(listener, shared2))
            .map_err(|e| Error::io(ErrorKind::System, "store thread", &e))?;
        Ok(StoreServer { addr, shared, accept: Some(accept) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether `key` is set (for the process that hosts the store; no connection needed).
    pub fn contains(&self, key: &str) -> bool {
        self.shared.data.lock().values.contains_key(key)
    }

    /// The keys holding `part`, with their values (for the process that hosts the store).
    pub fn find(&self, part: &str) -> Vec<(String, Vec<u8>)> {
        let mut found: Vec<(String, Vec<u8>)> = self
            .shared
            .data
            .lock()
            .values
            .iter()
            .filter(|(k, _)| k.contains(part))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        found.sort();
        found
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        // Closing every connection ends its thread now (even one in a GET or idle).
        self.shared.conns.close_all();
        self.shared.data.wake_all();
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    let next_id = AtomicU64::new(0);
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(conn) = conn else { continue };
        let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
        if !make_room(&shared, &peer) {
            RefusalLog::note(
                &shared.log,
                format_args!(
                    "refused a connection from {peer}: too many connections were proving their job token at once"
                ),
            );
            continue;
        }
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        let Ok(handle) = conn.try_clone() else {
            RefusalLog::note(&shared.log, format_args!("refused a connection from {peer}: no descriptor to spare"));
            continue;
        };
        shared.conns.push(id, handle);
        shared.handshaking.fetch_add(1, Ordering::SeqCst);
        let shared2 = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("hccn-store-conn".into())
            .stack_size(CONN_STACK)
            .spawn(move || connection(conn, id, &peer, &shared2));
        if let Err(e) = spawned {
            shared.conns.done(id);
            shared.handshaking.fetch_sub(1, Ordering::SeqCst);
            RefusalLog::note(&shared.log, format_args!("refused a connection: no thread for it: {e}"));
        }
    }
}

/// Makes a handshake slot for a new connection when all are taken, by closing the oldest
/// connection still in its handshake (a silent one, most likely) and waiting for its thread to
/// end; false if no slot came free within a second.
fn make_room(shared: &Shared, peer: &str) -> bool {
    let limit = shared.limits.handshakes;
    if shared.handshaking.load(Ordering::SeqCst) < limit {
        return true;
    }
    if let Some(old) = shared.conns.close_oldest_handshake() {
        RefusalLog::note(
            &shared.log,
            format_args!(
                "closed the oldest of {limit} connections still in their handshake ({old}) to take one from {peer}"
            ),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(1);
    while shared.handshaking.load(Ordering::SeqCst) >= limit {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// One connection: handshake, then requests until the client leaves.
fn connection(mut conn: TcpStream, id: u64, peer: &str, shared: &Shared) {
    let shook = auth::server(&mut conn, &shared.token, Purpose::Store, HANDSHAKE_TIMEOUT).and_then(|()| {
        conn.set_write_timeout(Some(REQUEST_TIMEOUT)).map_err(|e| Error::io(ErrorKind::System, "socket", &e))
    });
    shared.conns.authenticated(id);
    let limit = shared.limits.clients;
    // Counted as a client before it stops counting as a handshake: never fewer than there are.
    let over = shared.clients.fetch_add(1, Ordering::SeqCst) >= limit;
    shared.handshaking.fetch_sub(1, Ordering::SeqCst);
    let served = match shook {
        Err(e) => {
            // Each failed handshake is logged: it is an intruder, or a member with the wrong token.
            tracing::warn!(peer = %peer, "store refused a connection: {e}");
            Ok(())
        }
        Ok(()) if over => {
            RefusalLog::note(
                &shared.log,
                format_args!("refused a client from {peer}: {limit} clients are being served"),
            );
            let why = format!("the store serves at most {limit} clients at once; use etcd for larger jobs");
            let _ = refuse(&mut Timed(&mut conn), &why);
            Ok(())
        }
        Ok(()) => serve(&mut Timed(&mut conn), &shared.data, &shared.stop, MAX_GET_WAIT),
    };
    shared.conns.done(id);
    shared.clients.fetch_sub(1, Ordering::SeqCst);
    if let Err(e) = served {
        if e.kind() != ErrorKind::Remote {
            tracing::warn!(peer = %peer, "store closed a connection: {e}");
        }
    }
}

/// A client socket whose reads wait [`IDLE_LIMIT`] for the first byte of a request and
/// [`REQUEST_TIMEOUT`] for the rest of it.
struct Timed<'a>(&'a mut TcpStream);

impl Read for Timed<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0.read(buf)
    }
}

impl Write for Timed<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Where request bytes come from: a socket with per-phase timeouts, or fuzz input.
trait RequestSource: Read + Write {
    /// Before the first byte of a request (an idle client may wait long).
    fn expect_request(&mut self) -> std::io::Result<()> {
        Ok(())
    }
    /// Within a request.
    fn in_request(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl RequestSource for Timed<'_> {
    fn expect_request(&mut self) -> std::io::Result<()> {
        self.0.set_read_timeout(Some(IDLE_LIMIT))
    }
    fn in_request(&mut self) -> std::io::Result<()> {
        self.0.set_read_timeout(Some(REQUEST_TIMEOUT))
    }
}

#[cfg(any(test, feature = "test-support"))]
impl RequestSource for crate::fuzzing::Duplex<'_> {}

/// Reads one request and answers it with `why` as an error: a client over the limit learns
/// the reason on its first call rather than from a closed socket.
fn refuse(conn: &mut impl RequestSource, why: &str) -> Result<()> {
    // Only a request's time: a refused client cannot hold its thread idle.
    conn.in_request().map_err(|e| Error::io(ErrorKind::Remote, "store socket", &e))?;
    let mut op = [0u8; 1];
    conn.read_exact(&mut op).map_err(|e| Error::io(ErrorKind::Remote, "request", &e))?;
    read_bytes(conn, MAX_KEY_BYTES, "key")?;
    read_bytes(conn, MAX_VALUE_BYTES, "value")?;
    reply(conn, ST_BAD, why.as_bytes())
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_bytes(r: &mut impl Read, limit: usize, what: &str) -> Result<Vec<u8>> {
    let len = read_u32(r).map_err(|e| Error::io(ErrorKind::Remote, what, &e))? as usize;
    if len > limit {
        return Err(Error::new(ErrorKind::Store, format!("{what} of {len} bytes exceeds the limit of {limit}")));
    }
    let mut v = vec![0u8; len];
    r.read_exact(&mut v).map_err(|e| Error::io(ErrorKind::Remote, what, &e))?;
    Ok(v)
}

fn reply(w: &mut impl Write, status: u8, data: &[u8]) -> Result<()> {
    let mut out = Vec::with_capacity(5 + data.len());
    out.push(status);
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
    w.write_all(&out).map_err(|e| Error::io(ErrorKind::Remote, "store reply", &e))
}

/// Serves one authenticated client until it leaves or breaks the protocol; a GET waits at most
/// `max_wait` for its key.
fn serve(conn: &mut impl RequestSource, data: &Data, stop: &AtomicBool, max_wait: Duration) -> Result<()> {
    let socket = |e: std::io::Error| Error::io(ErrorKind::Store, "store socket", &e);
    loop {
        conn.expect_request().map_err(socket)?;
        let mut op = [0u8; 1];
        if conn.read_exact(&mut op).is_err() || stop.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Remote, "client left (or was idle too long)"));
        }
        conn.in_request().map_err(socket)?;
        let key = read_bytes(conn, MAX_KEY_BYTES, "key")?;
        let key = String::from_utf8(key).map_err(|_| Error::new(ErrorKind::Store, "key is not UTF-8"))?;
        let val = read_bytes(conn, MAX_VALUE_BYTES, "value")?;
        match op[0] {
            OP_SET => {
                data.lock().write(key, val);
                reply(conn, ST_OK, &[])?;
            }
            OP_GET => {
                let ms = u64::from_le_bytes(val.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]));
                let deadline = Instant::now() + Duration::from_millis(ms).min(max_wait);
                match data.get(&key, deadline, stop) {
                    Some(v) => reply(conn, ST_OK, &v)?,
                    None => reply(conn, ST_TIMEOUT, &[])?,
                }
            }
            OP_ADD => {
                let delta = i64::from_le_bytes(val.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]));
                let mut entries = data.lock();
                let cur = entries
                    .values
                    .get(&key)
                    .and_then(|v| v.get(..8).and_then(|b| b.try_into().ok()))
                    .map(i64::from_le_bytes)
                    .unwrap_or(0);
                let new = cur.wrapping_add(delta);
                entries.write(key, new.to_le_bytes().to_vec());
                drop(entries);
                reply(conn, ST_OK, &new.to_le_bytes())?;
            }
            OP_CREATE => {
                let mut entries = data.lock();
                let existing = entries.values.get(&key).cloned();
                if existing.is_none() {
                    entries.write(key, val);
                }
                drop(entries);
                match existing {
                    Some(v) => reply(conn, ST_EXISTS, &v)?,
                    None => reply(conn, ST_OK, &[])?,
                }
            }
            other => {
                reply(conn, ST_BAD, format!("unknown store op {other}").as_bytes())?;
                return Err(Error::new(ErrorKind::Store, format!("unknown store op {other}")));
            }
        }
    }
}

/// Runs the store's request loop on the bytes of `input`, as one authenticated client, with a
/// fresh store and GETs that never wait; returns what the store replied. For the fuzz targets.
#[cfg(any(test, feature = "test-support"))]
#[doc(hidden)]
pub fn serve_bytes(input: &[u8]) -> (Result<()>, Vec<u8>) {
    let mut conn = crate::fuzzing::Duplex::new(input);
    let r = serve(&mut conn, &Data::default(), &AtomicBool::new(false), Duration::ZERO);
    (r, conn.output)
}

/// A client of the embedded store.
pub struct TcpStore {
    /// The connection and when it was last used.
    conn: Mutex<(TcpStream, Instant)>,
    addr: SocketAddr,
    token: Vec<u8>,
    timeout: Duration,
}

impl std::fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStore").field("addr", &self.addr).finish()
    }
}

impl TcpStore {
    /// Connects (retrying until `timeout` while the store starts) and authenticates.
    pub fn connect(addr: SocketAddr, token: &[u8], timeout: Duration) -> Result<TcpStore> {
        let conn = TcpStore::dial(addr, token, timeout, timeout)?;
        Ok(TcpStore { conn: Mutex::new((conn, Instant::now())), addr, token: token.to_vec(), timeout })
    }

    /// Connects to a store that is already running, such as the one a unique id names: a
    /// refused connection means it is gone, and fails after `patience` rather than `timeout`.
    pub fn connect_existing(addr: SocketAddr, token: &[u8], timeout: Duration, patience: Duration) -> Result<TcpStore> {
        let conn = TcpStore::dial(addr, token, timeout, patience.min(timeout))?;
        Ok(TcpStore { conn: Mutex::new((conn, Instant::now())), addr, token: token.to_vec(), timeout })
    }

    fn dial(addr: SocketAddr, token: &[u8], timeout: Duration, refused_for: Duration) -> Result<TcpStream> {
        let started = Instant::now();
        let mut conn = loop {
            match TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(5))) {
                Ok(c) => break c,
                Err(e) => {
                    let waited = started.elapsed();
                    let refused = e.kind() == std::io::ErrorKind::ConnectionRefused;
                    if waited >= timeout || (refused && waited >= refused_for) {
                        return Err(Error::io(ErrorKind::Store, format!("store at tcp://{addr} is unreachable"), &e));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        let _ = conn.set_nodelay(true);
        auth::client(&mut conn, token, Purpose::Store, timeout)
            .map_err(|e| e.context(format!("store tcp://{addr}")))?;
        Ok(conn)
    }

    fn request(&self, op: u8, key: &str, val: &[u8], wait: Duration) -> Result<(u8, Vec<u8>)> {
        if key.len() > MAX_KEY_BYTES || val.len() > MAX_VALUE_BYTES {
            return Err(Error::invalid(format!("store key or value too large ({} / {} bytes)", key.len(), val.len())));
        }
        let mut msg = Vec::with_capacity(9 + key.len() + val.len());
        msg.push(op);
        msg.extend_from_slice(&(key.len() as u32).to_le_bytes());
        msg.extend_from_slice(key.as_bytes());
        msg.extend_from_slice(&(val.len() as u32).to_le_bytes());
        msg.extend_from_slice(val);
        let mut guard = self.conn.locked();
        if guard.1.elapsed() >= IDLE_LIMIT / 2 {
            // The store closes clients idle for IDLE_LIMIT: start afresh well before that.
            guard.0 = TcpStore::dial(self.addr, &self.token, self.timeout, self.timeout)?;
        }
        guard.1 = Instant::now();
        let conn = &mut guard.0;
        let io = |e: std::io::Error| Error::io(ErrorKind::Store, format!("store tcp://{}", self.addr), &e);
        conn.set_read_timeout(Some(wait + self.timeout)).map_err(io)?;
        conn.write_all(&msg).map_err(io)?;
        let mut status = [0u8; 1];
        conn.read_exact(&mut status).map_err(io)?;
        let data = read_bytes(conn, MAX_VALUE_BYTES, "store reply")
            .map_err(|e| Error::new(ErrorKind::Store, e.message().to_owned()))?;
        Ok((status[0], data))
    }

    fn get_within(&self, key: &str, timeout: Duration) -> Result<Option<Vec<u8>>> {
        let ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        match self.request(OP_GET, key, &ms.to_le_bytes(), timeout)? {
            (ST_OK, v) => Ok(Some(v)),
            (ST_TIMEOUT, _) => Ok(None),
            (_, why) => Err(Error::new(ErrorKind::Store, String::from_utf8_lossy(&why).into_owned())),
        }
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        match self.request(OP_SET, key, value, Duration::ZERO)? {
            (ST_OK, _) => Ok(()),
            (_, why) => Err(Error::new(ErrorKind::Store, String::from_utf8_lossy(&why).into_owned())),
        }
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        // The store answers a GET within MAX_GET_WAIT; a longer wait is several of them.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let left = deadline.map_or(MAX_GET_WAIT, |d| d.saturating_duration_since(Instant::now()));
            if let Some(v) = self.get_within(key, left.min(MAX_GET_WAIT))? {
                return Ok(v);
            }
            if left <= MAX_GET_WAIT {
                let ms = timeout.as_millis();
                return Err(Error::timeout(format!("store key {key:?} did not appear within {ms} ms")));
            }
        }
    }

    fn create(&self, key: &str, value: &[u8]) -> Result<Option<Vec<u8>>> {
        match self.request(OP_CREATE, key, value, Duration::ZERO)? {
            (ST_OK, _) => Ok(None),
            (ST_EXISTS, v) => Ok(Some(v)),
            (_, why) => Err(Error::new(ErrorKind::Store, String::from_utf8_lossy(&why).into_owned())),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        match self.request(OP_ADD, key, &delta.to_le_bytes(), Duration::ZERO)? {
            (ST_OK, v) if v.len() == 8 => Ok(i64::from_le_bytes(v.try_into().unwrap_or([0; 8]))),
            (_, why) => Err(Error::new(ErrorKind::Store, String::from_utf8_lossy(&why).into_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_add_and_wait() {
        let server = StoreServer::start("127.0.0.1:0".parse().expect("addr"), b"tok").expect("server");
        let a = TcpStore::connect(server.local_addr(), b"tok", Duration::from_secs(5)).expect("client a");
        let b = TcpStore::connect(server.local_addr(), b"tok", Duration::from_secs(5)).expect("client b");
        let waiter = std::thread::spawn(move || b.get("late", Duration::from_secs(5)));
        std::thread::sleep(Duration::from_millis(50));
        a.set("late", b"value").expect("set");
        assert_eq!(waiter.join().expect("join").ok(), Some(b"value".to_vec()));
        assert_eq!(a.add("n", 2).ok(), Some(2));
        assert_eq!(a.add("n", 3).ok(), Some(5));
        assert_eq!(a.create("once", b"first").ok(), Some(None));
        assert_eq!(a.create("once", b"second").ok(), Some(Some(b"first".to_vec())));
        let e = a.get("never", Duration::from_millis(50)).err().map(|e| e.kind());
        assert_eq!(e, Some(ErrorKind::Timeout));
    }

    #[test]
    fn a_flood_of_silent_connections_does_not_lock_members_out() {
        let limits = Limits { handshakes: 4, clients: 16 };
        let server = StoreServer::start_with("127.0.0.1:0".parse().expect("addr"), b"tok", limits).expect("server");
        let mut silent: Vec<TcpStream> =
            (0..40).map(|_| TcpStream::connect(server.local_addr()).expect("connect")).collect();
        // A member arriving after the flood gets in, within its handshake's time.
        let started = Instant::now();
        let member = TcpStore::connect(server.local_addr(), b"tok", Duration::from_secs(5)).expect("member");
        member.set("k", b"v").expect("set");
        assert_eq!(member.get("k", Duration::from_secs(1)).ok(), Some(b"v".to_vec()));
        assert!(started.elapsed() < Duration::from_secs(3), "the member waited {:?}", started.elapsed());
        assert!(server.shared.handshaking.load(Ordering::SeqCst) <= limits.handshakes);
        // The oldest silent connections were closed by the store (EOF), not left to time out.
        silent[0].set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
        assert_eq!(silent[0].read(&mut [0u8; 1]).ok(), Some(0), "the oldest silent connection is closed");
    }

    #[test]
    fn clients_beyond_the_limit_are_told_why() {
        let limits = Limits { handshakes: 4, clients: 2 };
        let server = StoreServer::start_with("127.0.0.1:0".parse().expect("addr"), b"tok", limits).expect("server");
        let connect = || TcpStore::connect(server.local_addr(), b"tok", Duration::from_secs(5)).expect("client");
        let (a, b) = (connect(), connect());
        a.set("a", b"1").expect("first client");
        b.set("b", b"1").expect("second client");
        let e = connect().set("c", b"1").err().map(|e| (e.kind(), e.to_string()));
        let (kind, msg) = e.expect("a third client is refused");
        assert_eq!(kind, ErrorKind::Store);
        assert!(msg.contains("at most 2 clients"), "{msg}");
        // A client that leaves makes room.
        drop(a);
        let deadline = Instant::now() + Duration::from_secs(5);
        while connect().set("c", b"1").is_err() {
            assert!(Instant::now() < deadline, "no room after a client left");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn wrong_token_is_refused() {
        let server = StoreServer::start("127.0.0.1:0".parse().expect("addr"), b"tok").expect("server");
        let e = TcpStore::connect(server.local_addr(), b"nope", Duration::from_secs(5)).err().map(|e| e.kind());
        assert_eq!(e, Some(ErrorKind::Auth));
    }
}
