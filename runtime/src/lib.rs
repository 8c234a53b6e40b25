//! hccn's engine: communicators over authenticated TCP links, an embedded rendezvous store, the
//! collective algorithms and host streams. Pure Rust: the C ABI lives in `hccn-capi`.

#[doc(hidden)]
pub mod auth;
pub mod backend;
pub mod collectives;
pub mod comm;
pub mod config;
pub mod error;
pub mod fork;
pub mod fusion;
#[doc(hidden)]
#[cfg(any(test, feature = "test-support"))]
pub mod fuzzing;
pub mod log;
pub mod mem;
pub mod reduce;
pub mod rendezvous;
pub mod stream;
pub mod sync;
pub mod trace;
mod transport;
pub mod tuning;
pub mod types;
pub mod wire;

pub use backend::{AnyStream, BackendComm};
pub use collectives::{Op, Ptr};
pub use comm::{new_unique_id, Communicator};
pub use config::{BackendKind, Config, LaunchEnv};
pub use error::{Error, ErrorKind, Result};
pub use fusion::Bucket;
pub use rendezvous::{StoreAddr, StoreServer, UniqueId};
pub use stream::{Event, Stream};
pub use transport::{read_cost, ReadCost, Usage};
pub use types::{DataType, ReduceOp};

/// Version as MAJOR*10000 + MINOR*100 + PATCH, from the crate version.
pub fn version() -> i32 {
    let part = |s: &str| s.parse::<i32>().unwrap_or(0);
    part(env!("CARGO_PKG_VERSION_MAJOR")) * 10000
        + part(env!("CARGO_PKG_VERSION_MINOR")) * 100
        + part(env!("CARGO_PKG_VERSION_PATCH"))
}
