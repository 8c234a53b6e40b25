//! Where ranks meet: a small key-value [`Store`] (Gloo's set/get/add), the embedded TCP store,
//! and the unique id that carries a store's address and job token between processes.

mod tcp_store;
mod unique_id;

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

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
}

/// A parsed `HCCN_STORE` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreAddr {
    Tcp(SocketAddr),
}

impl StoreAddr {
    pub fn parse(s: &str) -> Result<Self> {
        let bad = |why: &str| Error::invalid(format!("store address {s:?}: {why} (expected tcp://host:port)"));
        let rest = s.strip_prefix("tcp://").ok_or_else(|| bad("unknown scheme"))?;
        let addr = rest
            .to_socket_addrs()
            .map_err(|e| bad(&e.to_string()))?
            .next()
            .ok_or_else(|| bad("host did not resolve"))?;
        Ok(StoreAddr::Tcp(addr))
    }

    /// Connects to the store with the job token.
    pub fn connect(&self, token: &[u8], timeout: Duration) -> Result<Box<dyn Store>> {
        match self {
            StoreAddr::Tcp(addr) => Ok(Box::new(TcpStore::connect(*addr, token, timeout)?)),
        }
    }
}

impl std::fmt::Display for StoreAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreAddr::Tcp(a) => write!(f, "tcp://{a}"),
        }
    }
}
