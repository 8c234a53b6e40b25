//! The one branch between the data paths (`HCCN_BACKEND`): a communicator handle is either a
//! native communicator or an HCCL one (which carries a native communicator for its control
//! plane, so everything that only asks about ranks, epochs and failures reads that).

use std::ops::Deref;
use std::time::Duration;

use hccn_backend_hccl::HcclCommunicator;
use hccn_runtime::{Backend, Communicator, Config, LaunchEnv, Result, UniqueId};

pub(crate) enum CommHandle {
    Native(Communicator),
    Hccl(HcclCommunicator),
}

impl Deref for CommHandle {
    type Target = Communicator;

    fn deref(&self) -> &Communicator {
        match self {
            CommHandle::Native(c) => c,
            CommHandle::Hccl(h) => h.native(),
        }
    }
}

impl CommHandle {
    pub fn init_rank(id: &UniqueId, nranks: u32, rank: u32, cfg: &Config) -> Result<Self> {
        Ok(match cfg.backend {
            Backend::Native => CommHandle::Native(Communicator::init_rank(id, nranks, rank, cfg)?),
            Backend::Hccl => CommHandle::Hccl(HcclCommunicator::init_rank(id, nranks, rank, cfg)?),
        })
    }

    pub fn init_from_env(env: &LaunchEnv, cfg: &Config) -> Result<Self> {
        Ok(match cfg.backend {
            Backend::Native => CommHandle::Native(Communicator::init_from_env(env, cfg)?),
            Backend::Hccl => CommHandle::Hccl(HcclCommunicator::init_from_env(env, cfg)?),
        })
    }

    pub fn new_group(&self, ranks: &[u32]) -> Result<Self> {
        Ok(match self {
            CommHandle::Native(c) => CommHandle::Native(c.new_group(ranks)?),
            CommHandle::Hccl(h) => CommHandle::Hccl(h.new_group(ranks)?),
        })
    }

    pub fn split(&self, color: i32, key: i32) -> Result<Option<Self>> {
        Ok(match self {
            CommHandle::Native(c) => c.split(color, key)?.map(CommHandle::Native),
            CommHandle::Hccl(h) => h.split(color, key)?.map(CommHandle::Hccl),
        })
    }

    pub fn shrink(&self) -> Result<Self> {
        Ok(match self {
            CommHandle::Native(c) => CommHandle::Native(c.shrink()?),
            CommHandle::Hccl(h) => CommHandle::Hccl(h.shrink()?),
        })
    }

    pub fn rebuild(&self, timeout: Duration) -> Result<Self> {
        Ok(match self {
            CommHandle::Native(c) => CommHandle::Native(c.rebuild(timeout)?),
            CommHandle::Hccl(h) => CommHandle::Hccl(h.rebuild(timeout)?),
        })
    }

    pub fn abort(&self) {
        match self {
            CommHandle::Native(c) => c.abort(),
            CommHandle::Hccl(h) => h.abort(),
        }
    }

    pub fn async_error(&self) -> Result<()> {
        match self {
            CommHandle::Native(c) => c.async_error(),
            CommHandle::Hccl(h) => h.async_error(),
        }
    }
}
