//! Building a world communicator: through a unique id (`hccn_get_unique_id` +
//! `hccn_comm_init_rank`) or from the launcher's environment (`hccn_init_from_env`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{derive_id, join, CommInner, Communicator, Origin};
use crate::auth::random_bytes;
use crate::config::{Config, LaunchEnv};
use std::time::Duration;

use crate::error::{Error, ErrorKind, Result};
use crate::rendezvous::{Store, StoreAddr, StoreServer, TcpStore, UniqueId};
use crate::transport::{linkcost, tcp};

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
        let _span = tracing::info_span!("init_rank", rank, nranks).entered();
        if nranks == 0 || rank >= nranks {
            return Err(Error::invalid(format!("rank {rank} is not below nranks {nranks}")));
        }
        let store = TcpStore::connect(id.store, &id.token, cfg.timeout)?;
        let prefix = format!("uid/{}", hex(&id.nonce));
        let origin = Origin {
            store: StoreAddr::Tcp(id.store),
            durable: false,
            token: id.token.to_vec(),
            prefix,
            cfg: cfg.clone(),
        };
        Communicator::bootstrap(&store, Arc::new(origin), rank, nranks)
    }

    /// Joins the world described by the launcher's environment.
    pub fn init_from_env(env: &LaunchEnv, cfg: &Config) -> Result<Communicator> {
        let _span =
            tracing::info_span!("init_from_env", rank = env.rank, size = env.world_size, job = %env.job_id).entered();
        // Each call in a process builds a new world; all ranks make the same calls in order.
        static WORLDS: AtomicU64 = AtomicU64::new(0);
        let nth = WORLDS.fetch_add(1, Ordering::SeqCst);
        let store = env.store.connect(&env.job_token, cfg.timeout)?;
        let prefix = format!("job/{}/world{nth}", env.job_id);
        let origin = Arc::new(Origin {
            store: env.store.clone(),
            durable: true,
            token: env.job_token.clone(),
            prefix,
            cfg: cfg.clone(),
        });
        // A world that already exists is joined as a replacement, through the join queue.
        match store.get(&join::formed_key(&origin.prefix), Duration::ZERO) {
            Ok(_) => Communicator::join(store.as_ref(), origin),
            Err(e) if e.kind() == ErrorKind::Timeout => {
                Communicator::bootstrap(store.as_ref(), origin, env.rank, env.world_size)
            }
            Err(e) => Err(e),
        }
    }

    fn bootstrap(store: &dyn Store, origin: Arc<Origin>, rank: u32, size: u32) -> Result<Communicator> {
        let (prefix, cfg) = (&origin.prefix, &origin.cfg);
        let id = derive_id(&[prefix.as_bytes(), &size.to_le_bytes()]);
        let mut net = tcp::connect_mesh(rank, size, store, prefix, id, &origin.token, cfg)?;
        // Before any communicator exists, so that all of them (sub-communicators, shrinks,
        // rebuilds) see the same figures on every rank.
        net.costs = linkcost::agree(&net, size, id, cfg)?;
        let members = (0..size).collect();
        let inner = CommInner::new(Arc::new(net), id, 0, rank, members, cfg.timeout, cfg.chunk_bytes);
        if rank == 0 {
            // Every rank has connected, so every rank checked this key before it exists.
            store.set(&join::formed_key(prefix), b"1")?;
        }
        tracing::info!(rank, size, prefix = %prefix, "communicator ready");
        Ok(Communicator::world(inner, origin))
    }
}
