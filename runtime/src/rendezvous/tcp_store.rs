//! The embedded store: one thread per client, requests framed as
//! `op u8 | key_len u32 | key | val_len u32 | val`, replies as `status u8 | len u32 | data`.
//! Every connection authenticates with the job token before its first request.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
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
/// Longest wait a GET may ask for.
const MAX_GET_WAIT: Duration = Duration::from_secs(24 * 3600);

#[derive(Default)]
struct Data {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

impl Data {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<u8>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running embedded store; stops when dropped.
pub struct StoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
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
        let listener =
            TcpListener::bind(bind).map_err(|e| Error::io(ErrorKind::Store, format!("store bind {bind}"), &e))?;
        let addr = listener.local_addr().map_err(|e| Error::io(ErrorKind::Store, "store address", &e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let data = Arc::new(Data::default());
        let token = token.to_vec();
        let stop2 = stop.clone();
        let accept = std::thread::Builder::new()
            .name("hccn-store".into())
            .spawn(move || accept_loop(listener, token, data, stop2))
            .map_err(|e| Error::io(ErrorKind::System, "store thread", &e))?;
        Ok(StoreServer { addr, stop, accept: Some(accept) })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, token: Vec<u8>, data: Arc<Data>, stop: Arc<AtomicBool>) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let Ok(mut conn) = conn else { continue };
        let (token, data, stop) = (token.clone(), data.clone(), stop.clone());
        let peer = conn.peer_addr().map(|a| a.to_string()).unwrap_or_default();
        let spawned = std::thread::Builder::new().name("hccn-store-conn".into()).spawn(move || {
            if let Err(e) = auth::server(&mut conn, &token, Purpose::Store, HANDSHAKE_TIMEOUT) {
                tracing::warn!(peer = %peer, "store refused a connection: {e}");
                return;
            }
            // After the handshake a client may stay idle for the whole job.
            if let Err(e) = conn.set_read_timeout(None) {
                tracing::warn!(peer = %peer, "store socket: {e}");
                return;
            }
            if let Err(e) = serve(&mut conn, &data, &stop, MAX_GET_WAIT) {
                if e.kind() != ErrorKind::Remote {
                    tracing::warn!(peer = %peer, "store closed a connection: {e}");
                }
            }
        });
        if let Err(e) = spawned {
            tracing::error!("store cannot start a connection thread: {e}");
        }
    }
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
fn serve(conn: &mut (impl Read + Write), data: &Data, stop: &AtomicBool, max_wait: Duration) -> Result<()> {
    loop {
        let mut op = [0u8; 1];
        if conn.read_exact(&mut op).is_err() || stop.load(Ordering::SeqCst) {
            return Err(Error::new(ErrorKind::Remote, "client left"));
        }
        let key = read_bytes(conn, MAX_KEY_BYTES, "key")?;
        let key = String::from_utf8(key).map_err(|_| Error::new(ErrorKind::Store, "key is not UTF-8"))?;
        let val = read_bytes(conn, MAX_VALUE_BYTES, "value")?;
        match op[0] {
            OP_SET => {
                data.lock().insert(key, val);
                data.changed.notify_all();
                reply(conn, ST_OK, &[])?;
            }
            OP_GET => {
                let ms = u64::from_le_bytes(val.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]));
                let deadline = Instant::now() + Duration::from_millis(ms).min(max_wait);
                let mut map = data.lock();
                let found = loop {
                    if let Some(v) = map.get(&key) {
                        break Some(v.clone());
                    }
                    let now = Instant::now();
                    if now >= deadline || stop.load(Ordering::SeqCst) {
                        break None;
                    }
                    let wait = (deadline - now).min(Duration::from_millis(500));
                    map = data.changed.wait_timeout(map, wait).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
                };
                drop(map);
                match found {
                    Some(v) => reply(conn, ST_OK, &v)?,
                    None => reply(conn, ST_TIMEOUT, &[])?,
                }
            }
            OP_ADD => {
                let delta = i64::from_le_bytes(val.get(..8).and_then(|b| b.try_into().ok()).unwrap_or([0; 8]));
                let mut map = data.lock();
                let cur = map
                    .get(&key)
                    .and_then(|v| v.get(..8).and_then(|b| b.try_into().ok()))
                    .map(i64::from_le_bytes)
                    .unwrap_or(0);
                let new = cur.wrapping_add(delta);
                map.insert(key, new.to_le_bytes().to_vec());
                drop(map);
                data.changed.notify_all();
                reply(conn, ST_OK, &new.to_le_bytes())?;
            }
            OP_CREATE => {
                let mut map = data.lock();
                let existing = map.get(&key).cloned();
                if existing.is_none() {
                    map.insert(key, val);
                }
                drop(map);
                data.changed.notify_all();
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
#[doc(hidden)]
pub fn serve_bytes(input: &[u8]) -> (Result<()>, Vec<u8>) {
    let mut conn = crate::fuzzing::Duplex::new(input);
    let r = serve(&mut conn, &Data::default(), &AtomicBool::new(false), Duration::ZERO);
    (r, conn.output)
}

/// A client of the embedded store.
pub struct TcpStore {
    conn: Mutex<TcpStream>,
    addr: SocketAddr,
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
        let deadline = Instant::now() + timeout;
        let mut conn = loop {
            match TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(5))) {
                Ok(c) => break c,
                Err(e) if Instant::now() >= deadline => {
                    return Err(Error::io(ErrorKind::Store, format!("store at tcp://{addr} is unreachable"), &e))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let _ = conn.set_nodelay(true);
        auth::client(&mut conn, token, Purpose::Store, timeout)
            .map_err(|e| e.context(format!("store tcp://{addr}")))?;
        Ok(TcpStore { conn: Mutex::new(conn), addr, timeout })
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
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let io = |e: std::io::Error| Error::io(ErrorKind::Store, format!("store tcp://{}", self.addr), &e);
        conn.set_read_timeout(Some(wait + self.timeout)).map_err(io)?;
        conn.write_all(&msg).map_err(io)?;
        let mut status = [0u8; 1];
        conn.read_exact(&mut status).map_err(io)?;
        let data = read_bytes(&mut *conn, MAX_VALUE_BYTES, "store reply")
            .map_err(|e| Error::new(ErrorKind::Store, e.message().to_owned()))?;
        Ok((status[0], data))
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
        let ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        match self.request(OP_GET, key, &ms.to_le_bytes(), timeout)? {
            (ST_OK, v) => Ok(v),
            (ST_TIMEOUT, _) => Err(Error::timeout(format!("store key {key:?} did not appear within {ms} ms"))),
            (_, why) => Err(Error::new(ErrorKind::Store, String::from_utf8_lossy(&why).into_owned())),
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
    fn wrong_token_is_refused() {
        let server = StoreServer::start("127.0.0.1:0".parse().expect("addr"), b"tok").expect("server");
        let e = TcpStore::connect(server.local_addr(), b"nope", Duration::from_secs(5)).err().map(|e| e.kind());
        assert_eq!(e, Some(ErrorKind::Auth));
    }
}
