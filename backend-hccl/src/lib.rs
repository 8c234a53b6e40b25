//! hccn's HCCL backend (`HCCN_BACKEND=hccl`). Each communicator is a pair: an HCCL communicator
//! that moves the data on ACL streams, and hccn's native communicator beside it, on which hccn
//! keeps its own control plane: argument checks, heartbeats (failure detection), agreement for
//! shrink, group membership, the exchange of root infos for sub-communicators, and the
//! operations HCCL lacks (staged through host memory). See docs/hccl.md.

pub mod api;
mod bucket;
mod comm;
mod seam;
mod stage;
mod stream;

use hccn_runtime::sync::Locked;
use std::cell::Cell;
use std::sync::{Arc, Mutex};

pub use api::{Api, Signature, SIGNATURES};
pub use bucket::HcclBucket;
pub use comm::HcclCommunicator;
pub use seam::{install, Hccl};
pub use stream::AclStream;

use hccn_runtime::{Config, Result};

/// The loaded libraries of this process, with the device they drive.
#[derive(Debug)]
pub struct HcclLibrary {
    pub api: Api,
    pub device: i32,
}

static BACKEND: Mutex<Option<Arc<HcclLibrary>>> = Mutex::new(None);

thread_local! {
    /// Whether this thread has called aclrtSetDevice (a per-thread binding in ACL).
    static BOUND: Cell<bool> = const { Cell::new(false) };
}

impl HcclLibrary {
    /// The process's backend: loads the libraries and calls `aclInit` on first use, then binds
    /// the calling thread to the device (`HCCN_DEVICE_ID`, else `HCCN_LOCAL_RANK`, else 0).
    /// A failed load is not remembered, so a corrected environment can try again.
    pub fn get(cfg: &Config) -> Result<Arc<HcclLibrary>> {
        let b = {
            let mut slot = BACKEND.locked();
            match slot.as_ref() {
                Some(b) => b.clone(),
                None => {
                    let api = Api::load(cfg)?;
                    let init = api::need(api.aclInit, "aclInit")?;
                    // SAFETY: public signature; NULL means no configuration file.
                    let rc = unsafe { init(std::ptr::null()) };
                    if rc != api::ACL_ERROR_REPEAT_INITIALIZE {
                        api.acl("aclInit", rc)?;
                    }
                    let device = cfg.device_id.unwrap_or(0);
                    tracing::info!(hccl = %api.hccl_path, acl = %api.acl_path, device, "HCCL backend loaded");
                    let absent = api.absent();
                    if !absent.is_empty() {
                        tracing::info!(
                            "HCCL backend: optional symbols absent, using their fallbacks: {}",
                            absent.join(" ")
                        );
                    }
                    let b = Arc::new(HcclLibrary { api, device });
                    *slot = Some(b.clone());
                    b
                }
            }
        };
        b.bind()?;
        Ok(b)
    }

    /// Binds the calling thread to this backend's device, once per thread.
    pub fn bind(&self) -> Result<()> {
        if BOUND.with(|b| b.get()) {
            return Ok(());
        }
        let set = api::need(self.api.aclrtSetDevice, "aclrtSetDevice")?;
        // SAFETY: public signature.
        self.api.acl(&format!("aclrtSetDevice({})", self.device), unsafe { set(self.device) })?;
        BOUND.with(|b| b.set(true));
        Ok(())
    }
}

/// Checks that the backend can be loaded with `cfg` (for tools and tests).
pub fn probe(cfg: &Config) -> Result<String> {
    let b = HcclLibrary::get(cfg)?;
    Ok(format!("{} + {}", b.api.hccl_path, b.api.acl_path))
}
