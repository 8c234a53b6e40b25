//! Building a world communicator: through a unique id (`hccn_get_unique_id` +
//! `hccn_comm_init_rank`) or from the launcher's environment (`hccn_init_from_env`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{derive_id, CommInner, Communicator};
use crate::auth::random_bytes;
use crate::config::{Config, LaunchEnv};
use crate::error::{Error, Result};
use crate::rendezvous::{Store, StoreServer, TcpStore, UniqueId};
use crate::transport::tcp;

/// Stores started by `new_unique_id`; they serve until the process exits, as the root's
/// bootstrap listener does in NCCL.
static ID_STORES: Mutex<Vec<StoreServer>> = Mutex::new(Vec::new());

/// Starts an embedded store for a new communicator and returns the id that leads to it.
pub fn new_unique_id(cfg: &Config) -> Result<UniqueId> {
    let token: [u8; 32] = random_bytes()?;
    let nonce: [u8; 16] = random_bytes()?;
    let server = StoreServer::start(SocketAddr::new(cfg.bind_addr, 0), &token)?;
    let id = UniqueId { store: server.local_addr(), token, nonce };
    ID_STORES.lock().unwrap_or_else(|p| p.into_inner()).push(server);
    Ok(id)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Communicator {
    /// Joins the communicator of `nranks` described by `id` as `rank`.
    pub fn init_rank(id: &UniqueId, nranks: u32, rank: u32, cfg: &Config) -> Result<Communicator> {
        if nranks == 0 || rank >= nranks {
            return Err(Error::invalid(format!("rank {rank} is not below nranks {nranks}")));
        }
        let store = TcpStore::connect(id.store, &id.token, cfg.timeout)?;
        let prefix = format!("uid/{}", hex(&id.nonce));
        Communicator::bootstrap(&store, &prefix, rank, nranks, &id.token, cfg)
    }

    /// Joins the world described by the launcher's environment.
    pub fn init_from_env(env: &LaunchEnv, cfg: &Config) -> Result<Communicator> {
        // Each call in a process builds a new world; all ranks make the same calls in order.
        static WORLDS: AtomicU64 = AtomicU64::new(0);
        let nth = WORLDS.fetch_add(1, Ordering::SeqCst);
        let store = env.store.connect(&env.job_token, cfg.timeout)?;
        let prefix = format!("job/{}/world{nth}", env.job_id);
        Communicator::bootstrap(store.as_ref(), &prefix, env.rank, env.world_size, &env.job_token, cfg)
    }

    fn bootstrap(
        store: &dyn Store,
        prefix: &str,
        rank: u32,
        size: u32,
        token: &[u8],
        cfg: &Config,
    ) -> Result<Communicator> {
        let id = derive_id(&[prefix.as_bytes(), &size.to_le_bytes()]);
        let net = tcp::connect_mesh(rank, size, store, prefix, id, token, cfg)?;
        let members = (0..size).collect();
        let comm =
            Communicator::from_inner(CommInner::new(Arc::new(net), id, 0, rank, members, cfg.timeout, cfg.chunk_bytes));
        tracing::info!(rank, size, prefix, "communicator ready");
        Ok(comm)
    }
}
