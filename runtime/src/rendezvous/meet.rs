//! Where the ranks of `hccn_init_from_env` meet, made real: the store named by `HCCN_STORE`,
//! or one rank 0 starts at the address the launcher implies (config/launcher.rs), or one whose
//! address rank 0 tells the others through the launcher's PMIx.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::sync::{Arc, Mutex};

use super::pmix;
use super::{StoreAddr, StoreServer};
use crate::auth::random_bytes;
use crate::config::{Config, LaunchEnv, Meet};
use crate::error::{Error, ErrorKind, Result};
use crate::sync::Locked;

/// The store of a world and how to reach it.
pub(crate) struct Met {
    pub store: StoreAddr,
    pub token: Vec<u8>,
    /// How the ranks met: `HCCN_STORE`, `the launcher's address` or `PMIx` (logged).
    pub via: &'static str,
    /// Whether this process hosts the store (rank 0).
    pub hosts: bool,
    /// What lives as long as the world's communicators (the store rank 0 made for it through
    /// PMIx).
    pub keep: Vec<Box<dyn Send>>,
    /// The address this rank listens on, where `HCCN_BIND_ADDR` does not say.
    pub bind: Option<IpAddr>,
}

/// Stores rank 0 hosts at a launcher's address, kept until the process exits: every later world
/// of the process (another `hccn_init_from_env`) meets in the same store under its own prefix.
/// A store per world would reopen the same port, and a fast rank could reach the one closing.
static HOSTED: Mutex<Vec<Arc<StoreServer>>> = Mutex::new(Vec::new());

/// The PMIx key of the `nth` world's store: each world of a process gets its own.
fn pmix_key(nth: u64) -> String {
    format!("hccn.store.{nth}")
}

/// Meets the other ranks of `env` for this process's `nth` world.
pub(crate) fn meet(env: &LaunchEnv, cfg: &Config, nth: u64) -> Result<Met> {
    meet_by(&env.meet, env, cfg, nth)
}

fn meet_by(how: &Meet, env: &LaunchEnv, cfg: &Config, nth: u64) -> Result<Met> {
    match how {
        Meet::Store(store) => Ok(Met {
            store: store.clone(),
            token: env.job_token.clone(),
            via: "HCCN_STORE",
            hosts: false,
            keep: Vec::new(),
            bind: None,
        }),
        Meet::Rank0 { dial, listen } => {
            let hosts = env.rank == 0;
            if hosts {
                host(*listen, &env.job_token)?;
            }
            let (via, bind) = ("the launcher's address", toward(env, dial.ip()));
            Ok(Met { store: StoreAddr::Tcp(*dial), token: env.job_token.clone(), via, hosts, keep: Vec::new(), bind })
        }
        Meet::Pmix { single_node, fallback } => match pmix::session(env.pmix_lib.as_deref()) {
            Ok(session) => by_pmix(&session, env, cfg, *single_node, nth),
            Err(e) => match fallback {
                Some(f) => {
                    tracing::info!("{e}; meeting without PMIx");
                    meet_by(f, env, cfg, nth)
                }
                None => Err(e.context(
                    "the ranks meet through PMIx here; set HCCN_STORE, or make libpmix.so.2 loadable (HCCN_PMIX_LIB)",
                )),
            },
        },
    }
}

/// Starts rank 0's store at `listen` unless this process hosts it already.
fn host(listen: SocketAddr, token: &[u8]) -> Result<()> {
    let mut hosted = HOSTED.locked();
    if hosted.iter().any(|s| s.local_addr() == listen) {
        return Ok(());
    }
    // Bound once first to say what is wrong in the user's words (the store binds it again).
    if let Err(e) = TcpListener::bind(listen) {
        let why = match e.kind() {
            std::io::ErrorKind::AddrInUse => "the port is taken (by another job, or another program)".to_owned(),
            std::io::ErrorKind::AddrNotAvailable => format!("{} is not an address of this host", listen.ip()),
            _ => e.to_string(),
        };
        return Err(Error::new(
            ErrorKind::Store,
            format!(
                "rank 0 cannot host the store at {listen}: {why}; set HCCN_STORE=tcp://HOST:PORT (the same on every rank) \
                 to a free port of rank 0's host, or HCCN_BIND_ADDR to an address of it (docs/launchers.md)"
            ),
        ));
    }
    hosted.push(Arc::new(StoreServer::start(listen, token)?));
    Ok(())
}

/// This host's address on the way to `store` (no packet is sent), unless `HCCN_BIND_ADDR`
/// names one: ranks of several hosts must listen where the others reach them.
fn toward(env: &LaunchEnv, store: IpAddr) -> Option<IpAddr> {
    if env.bind_given {
        return None;
    }
    let any: IpAddr =
        if store.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { std::net::Ipv6Addr::UNSPECIFIED.into() };
    let s = UdpSocket::bind((any, 0)).ok()?;
    s.connect((store, 9)).ok()?;
    s.local_addr().ok().map(|a| a.ip())
}

/// An address of this host that other hosts can reach: its name's, if that is not loopback.
fn host_address() -> Result<IpAddr> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is writable for its whole length, which is what we pass.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    let found = if rc == 0 { std::net::ToSocketAddrs::to_socket_addrs(&(name.as_str(), 0)).ok() } else { None };
    found.into_iter().flatten().map(|a| a.ip()).find(|ip| !ip.is_loopback()).ok_or_else(|| {
        Error::invalid(format!(
            "rank 0 must host the store where the other hosts reach it, but this host's name {name:?} resolves to \
             no address besides loopback: set HCCN_BIND_ADDR to this host's address"
        ))
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Rank 0 starts a store on a free port and puts `ADDRESS TOKEN` under the world's key; every
/// rank fences and gets it. A token made here travels only through the launcher's PMIx.
fn by_pmix(session: &pmix::Session, env: &LaunchEnv, cfg: &Config, single_node: bool, nth: u64) -> Result<Met> {
    if session.rank() != env.rank {
        return Err(Error::invalid(format!(
            "PMIx numbers this process {} but {} says {}: set HCCN_PMIX=off, or HCCN_STORE",
            session.rank(),
            env.launcher.name(),
            env.rank
        )));
    }
    let key = pmix_key(nth);
    let mut keep: Vec<Box<dyn Send>> = Vec::new();
    if env.rank == 0 {
        let ip = match (env.bind_given, single_node) {
            (true, _) => cfg.bind_addr,
            (false, true) => Ipv4Addr::LOCALHOST.into(),
            (false, false) => host_address()?,
        };
        let token = if env.token_given { env.job_token.clone() } else { hex(&random_bytes::<32>()?).into_bytes() };
        let s = Arc::new(StoreServer::start(SocketAddr::new(ip, 0), &token)?);
        session.put(&key, &format!("{} {}", s.local_addr(), String::from_utf8_lossy(&token)))?;
        keep.push(Box::new(s));
    }
    session.fence(cfg.timeout)?;
    let value = session.get(0, &key, cfg.timeout)?;
    let (addr, token) =
        value.split_once(' ').ok_or_else(|| Error::new(ErrorKind::Store, "PMIx: a malformed store address"))?;
    let addr: SocketAddr =
        addr.parse().map_err(|_| Error::new(ErrorKind::Store, format!("PMIx: {addr:?} is no address")))?;
    let token = if env.token_given { env.job_token.clone() } else { token.as_bytes().to_vec() };
    let (hosts, bind) = (!keep.is_empty(), toward(env, addr.ip()));
    Ok(Met { store: StoreAddr::Tcp(addr), token, via: "PMIx", hosts, keep, bind })
}
