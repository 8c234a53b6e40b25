//! Where ranks meet: a small key-value [`Store`] (Gloo's set/get/add), the embedded TCP store,
//! and the unique id that carries a store's address and job token between processes.

pub(crate) mod bootstrap;
pub(crate) mod meet;
pub(crate) mod ondemand;
mod patience;
pub mod pmix;
mod roster;
pub mod runs;
mod tcp_store;
mod unique_id;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

#[doc(hidden)]
#[cfg(any(test, feature = "test-support"))]
pub use tcp_store::serve_bytes;
pub use tcp_store::{StoreServer, TcpStore};
pub use unique_id::UniqueId;

use crate::error::{Error, Result};

/// Rendezvous store used only while communicators are built, never by the data path.
pub trait Store: Send + Sync {
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Waits up to `timeout` for `key` to exist.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
    /// Adds `delta` to the integer at `key` (0 when absent) and returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// Sets `key` only if it does not exist (compare-and-swap on absence): `None` when this call
    /// created it, else the value already there.
    fn create(&self, key: &str, value: &[u8]) -> Result<Option<Vec<u8>>>;

    /// Publishes `key` = `value` for as long as this process lives (etcd: a key bound to a lease
    /// kept alive in the background), and calls `on_gone` with the name, below `watch`, of every
    /// key there that vanishes without being withdrawn: its process died, or froze past the
    /// lease's `ttl`. The key is withdrawn when the returned guard drops. Stores without leases
    /// return `None`: the embedded store lives only as long as the job, and heartbeats alone
    /// detect failures there.
    fn keep_member(
        &self,
        key: &str,
        value: &[u8],
        ttl: Duration,
        watch: &str,
        on_gone: OnGone,
    ) -> Result<Option<Member>> {
        let _ = (key, value, ttl, watch, on_gone);
        Ok(None)
    }

    /// Deletes every key under `prefix` (records nobody will read again). Stores that live only
    /// as long as the job keep them and return `Ok`.
    fn remove_prefix(&self, prefix: &str) -> Result<()> {
        let _ = prefix;
        Ok(())
    }

    /// The current generation of the job rooted at `job` and whether a process of it is alive
    /// (see [`runs`]). Stores that live for one run only have generation 1, always live.
    fn run_state(&self, job: &str) -> Result<runs::RunState> {
        let _ = job;
        Ok(runs::RunState::SINGLE)
    }

    /// Enters the job as process `me`, atomically against what `seen` said: joins its
    /// generation if it is live and still current, starts the next one (removing the records
    /// of `seen`'s) if it is dead and still current. `None`: the job changed since `seen`;
    /// read it again. The presence lives on a lease of `ttl`.
    fn enter_run(&self, job: &str, seen: runs::RunState, me: &str, ttl: Duration) -> Result<Option<runs::Entered>> {
        let _ = (job, seen, me, ttl);
        Ok(Some(runs::Entered { generation: runs::RunState::SINGLE.generation, presence: None }))
    }

    /// Deletes every key of the job if no process of its current generation is alive; whether
    /// they are gone (hccnrun, after a job whose ranks all exited 0). Stores that live for one
    /// run only take the job's keys with them: `true`.
    fn remove_job_if_idle(&self, job: &str) -> Result<bool> {
        let _ = job;
        Ok(true)
    }
}

/// Called with the name of a membership key that vanished without being withdrawn.
pub type OnGone = Box<dyn Fn(&str) + Send + Sync>;

/// A published membership key; dropping it withdraws the key (a graceful departure).
pub type Member = Box<dyn Send>;

/// A parsed `HCCN_STORE` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreAddr {
    /// The embedded store (hosted by hccnrun, or by the rank that made a unique id).
    Tcp(SocketAddr),
    /// An etcd v3 cluster; served by a connector another crate registers (hccn-recovery), since
    /// the runtime itself knows nothing of etcd.
    Etcd(EtcdCluster),
}

/// Where an etcd cluster is and how to get in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdCluster {
    /// `host:port` of each member.
    pub endpoints: Vec<String>,
    pub access: EtcdAccess,
}

/// What an etcd that demands TLS or a login needs (`HCCN_ETCD_CA`, `HCCN_ETCD_CERT`,
/// `HCCN_ETCD_KEY`, `HCCN_ETCD_USER`, `HCCN_ETCD_PASSWORD`, parsed in config.rs). The files are
/// read when a connection is made.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EtcdAccess {
    /// PEM file of the CA that signed the members' certificates; TLS is on when it is set.
    pub ca: Option<PathBuf>,
    /// Client certificate and its key (PEM), for an etcd started with `--client-cert-auth`.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// An etcd user and its password, for an etcd with authentication enabled.
    pub user: Option<String>,
    pub password: Option<String>,
}

impl std::fmt::Debug for EtcdAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password: configurations end up in logs.
        f.debug_struct("EtcdAccess")
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<set>"))
            .finish()
    }
}

/// Connects to an etcd cluster: the cluster, job token, timeout.
pub type EtcdConnector = fn(&EtcdCluster, &[u8], Duration) -> Result<Box<dyn Store>>;

static ETCD: std::sync::OnceLock<EtcdConnector> = std::sync::OnceLock::new();

/// Makes `etcd://` store addresses usable in this process (called by hccn-recovery's `install`).
pub fn register_etcd(connect: EtcdConnector) {
    let _ = ETCD.set(connect);
}

impl StoreAddr {
    pub fn parse(s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::invalid(format!(
                "store address {s:?}: {why} (expected tcp://host:port or etcd://host:port[,host:port...])"
            ))
        };
        if let Some(list) = s.strip_prefix("etcd://") {
            let eps: Vec<String> =
                list.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect();
            if eps.is_empty() || eps.iter().any(|e| !e.contains(':')) {
                return Err(bad("every etcd endpoint needs host:port"));
            }
            if eps.iter().any(|e| e.rsplit(':').next().and_then(|p| p.parse::<u16>().ok()) == Some(0)) {
                return Err(bad("port 0 names no etcd endpoint"));
            }
            return Ok(StoreAddr::Etcd(EtcdCluster { endpoints: eps, access: EtcdAccess::default() }));
        }
        let rest = s.strip_prefix("tcp://").ok_or_else(|| bad("unknown scheme"))?;
        let addr = rest
            .to_socket_addrs()
            .map_err(|e| bad(&e.to_string()))?
            .next()
            .ok_or_else(|| bad("host did not resolve"))?;
        if addr.port() == 0 {
            return Err(bad("port 0 names no store (it means \"any free port\" to a server)"));
        }
        Ok(StoreAddr::Tcp(addr))
    }

    /// The same address with `access` as the way into an etcd cluster (a TCP store has no use
    /// for it).
    pub fn with_etcd_access(self, access: EtcdAccess) -> Self {
        match self {
            StoreAddr::Etcd(c) => StoreAddr::Etcd(EtcdCluster { access, ..c }),
            tcp => tcp,
        }
    }

    /// Connects to the store with the job token.
    pub fn connect(&self, token: &[u8], timeout: Duration) -> Result<Box<dyn Store>> {
        match self {
            StoreAddr::Tcp(addr) => Ok(Box::new(TcpStore::connect(*addr, token, timeout)?)),
            StoreAddr::Etcd(cluster) => {
                let connect = ETCD.get().ok_or_else(|| {
                    Error::new(
                        crate::error::ErrorKind::Unavailable,
                        "etcd:// stores need hccn-recovery, which this program does not include",
                    )
                })?;
                connect(cluster, token, timeout)
            }
        }
    }
}

impl std::fmt::Display for StoreAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreAddr::Tcp(a) => write!(f, "tcp://{a}"),
            StoreAddr::Etcd(c) => write!(f, "etcd://{}", c.endpoints.join(",")),
        }
    }
}
