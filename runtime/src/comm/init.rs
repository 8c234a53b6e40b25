//! Building a world communicator: through a unique id (`hccn_get_unique_id` +
//! `hccn_comm_init_rank`) or from the launcher's environment (`hccn_init_from_env`).

use crate::sync::Locked;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::{derive_id, join, CommInner, Communicator, Origin};
use crate::auth::random_bytes;
use crate::config::{Config, LaunchEnv, Meet};
use std::time::{Duration, Instant};

use super::linkcost;
use crate::error::{Error, ErrorKind, Result};
use crate::rendezvous::{bootstrap, meet};
use crate::rendezvous::{runs, Store, StoreAddr, StoreServer, TcpStore, UniqueId};

/// Stores started by `new_unique_id` in this process. Each is held here until a communicator
/// made from it takes it over; from then on it lives exactly as long as this process's
/// communicators made from it (the world and what shrink or rebuild make of it), so a process
/// that makes an id per communicator keeps no socket or thread for the ones it destroyed.
static ID_STORES: Mutex<IdStores> = Mutex::new(IdStores { live: Vec::new(), released: VecDeque::new() });

struct IdStores {
    live: Vec<IdStore>,
    /// Nonces of stores released lately, to name the mistake when their id is used again.
    released: VecDeque<[u8; 16]>,
}

struct IdStore {
    nonce: [u8; 16],
    /// Until a communicator takes it.
    held: Option<Arc<StoreServer>>,
    taken: Weak<StoreServer>,
}

/// How many released ids are remembered (16 bytes each).
const RELEASED_REMEMBERED: usize = 4096;

/// How long a rank keeps dialling a unique id's store that refuses connections: it was running
/// before the id existed, so a refusal means it is gone, not starting.
const GONE_STORE_PATIENCE: Duration = Duration::from_secs(1);

/// Starts an embedded store for a new communicator and returns the id that leads to it.
pub fn new_unique_id(cfg: &Config) -> Result<UniqueId> {
    let token: [u8; 32] = random_bytes()?;
    let nonce: [u8; 16] = random_bytes()?;
    let server = Arc::new(StoreServer::start(SocketAddr::new(cfg.bind_addr, 0), &token)?);
    let id = UniqueId { store: server.local_addr(), token, nonce };
    let taken = Arc::downgrade(&server);
    id_stores().live.push(IdStore { nonce, held: Some(server), taken });
    Ok(id)
}

fn id_stores() -> std::sync::MutexGuard<'static, IdStores> {
    ID_STORES.locked()
}

/// The store of `id` if this process made it, for a communicator made from it to keep alive;
/// an error if it was made here and released already.
fn take_id_store(id: &UniqueId) -> Result<Option<Arc<StoreServer>>> {
    let mut stores = id_stores();
    let IdStores { live, released } = &mut *stores;
    live.retain(|e| {
        let alive = e.held.is_some() || e.taken.strong_count() > 0;
        if !alive {
            released.push_back(e.nonce);
        }
        alive
    });
    while released.len() > RELEASED_REMEMBERED {
        released.pop_front();
    }
    if released.contains(&id.nonce) {
        return Err(Error::invalid(
            "this unique id was used up: the communicator made from it was destroyed, and its store with it \
             (a unique id makes one communicator; call hccn_get_unique_id for each)",
        ));
    }
    Ok(live.iter_mut().find(|e| e.nonce == id.nonce).and_then(|e| e.held.take().or_else(|| e.taken.upgrade())))
}

impl Origin {
    /// The same origin without what it keeps alive: for a helper thread that must not delay
    /// its release (a unique id's store, the process's presence in the job's run).
    pub(crate) fn detached(&self) -> Origin {
        Origin {
            store: self.store.clone(),
            durable: self.durable,
            token: self.token.clone(),
            prefix: self.prefix.clone(),
            cfg: self.cfg.clone(),
            keep: Mutex::new(Vec::new()),
        }
    }
}

/// Keeps `thing` as long as the world's communicators live in this process.
fn hold(origin: &Origin, thing: Option<Box<dyn Send>>) {
    if let Some(thing) = thing {
        origin.keep.locked().push(thing);
    }
}

/// Whether `key` is in the store now.
fn is_set(store: &dyn Store, key: &str) -> Result<bool> {
    match store.get(key, Duration::ZERO) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == ErrorKind::Timeout => Ok(false),
        Err(e) => Err(e),
    }
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
        let server = take_id_store(id)?;
        let store = TcpStore::connect_existing(id.store, &id.token, cfg.timeout, GONE_STORE_PATIENCE).map_err(|e| {
            e.context(
                "the unique id's store does not answer; it closes when the communicator made from the id is \
                 destroyed in the process that made it (a unique id makes one communicator)",
            )
        })?;
        let prefix = format!("uid/{}", hex(&id.nonce));
        // A unique id is single-use: its nonce keys the rendezvous, and a second use would meet
        // the first one's records (and dial its ranks' closed listeners until the timeout).
        if store.get(&join::formed_key(&prefix), Duration::ZERO).is_ok() {
            return Err(Error::invalid(
                "this unique id has made its communicator already (a unique id makes one communicator; \
                 call hccn_get_unique_id for each)",
            ));
        }
        let keep: Vec<Box<dyn Send>> = server.into_iter().map(|s| Box::new(s) as Box<dyn Send>).collect();
        let origin = Origin {
            store: StoreAddr::Tcp(id.store),
            durable: false,
            token: id.token.to_vec(),
            prefix,
            cfg: cfg.clone(),
            keep: Mutex::new(keep),
        };
        Communicator::bootstrap(&store, Arc::new(origin), rank, nranks, None)
    }

    /// Joins the world described by the launcher's environment (config/launcher.rs), meeting
    /// where it says (rendezvous/meet.rs), in the job's current run (see rendezvous/runs.rs): as
    /// a member of a world that forms, or as the replacement of a rank of a live world that
    /// formed already.
    pub fn init_from_env(env: &LaunchEnv, cfg: &Config) -> Result<Communicator> {
        let _span =
            tracing::info_span!("init_from_env", rank = env.rank, size = env.world_size, job = %env.job_id).entered();
        // Each call in a process builds a new world; all ranks make the same calls in order.
        static WORLDS: AtomicU64 = AtomicU64::new(0);
        let nth = WORLDS.fetch_add(1, Ordering::SeqCst);
        let met = meet::meet(env, cfg, nth)?;
        tracing::info!(launcher = env.launcher.name(), via = met.via, store = %met.store, hosts = met.hosts, "meeting");
        let mut cfg = cfg.clone();
        if let Some(ip) = met.bind {
            cfg.bind_addr = ip;
        }
        let cfg = &cfg;
        let store = met.store.connect(&met.token, cfg.timeout)?;
        let store = store.as_ref();
        let job = runs::job_root(&env.job_id);
        let me = format!("w{nth}-r{}-{}", env.rank, hex(&random_bytes::<8>()?));
        // A store rank 0 hosts lives as long as its communicators, like a unique id's.
        let durable = matches!(env.meet, Meet::Store(_));
        let kept = Arc::new(Mutex::new(met.keep));
        let origin = |prefix: String| Origin {
            store: met.store.clone(),
            durable,
            token: met.token.clone(),
            prefix,
            cfg: cfg.clone(),
            keep: Mutex::new(vec![Box::new(kept.clone())]),
        };
        let deadline = Instant::now() + cfg.timeout;
        loop {
            let seen = store.run_state(&job)?;
            let prefix = runs::world_prefix(&job, seen.generation, nth);
            if seen.live && is_set(store, &join::formed_key(&prefix))? {
                let origin = Arc::new(origin(prefix));
                // Waiting is in vain once the run ends (crashed, say): then this is a new run.
                let alive = || store.run_state(&job).map_or(true, |now| now == seen);
                if let Some(comm) = Communicator::join(store, origin.clone(), &alive)? {
                    match store.enter_run(&job, seen, &me, cfg.lease_ttl) {
                        Ok(Some(entered)) => hold(&origin, entered.presence),
                        Ok(None) => tracing::warn!("the run ended as this process joined it"),
                        Err(e) => tracing::warn!("this process's presence in the run is not recorded: {e}"),
                    }
                    return Ok(comm);
                }
                tracing::info!(generation = seen.generation, "the run ended while this process waited to join");
                continue;
            }
            if let Some(entered) = store.enter_run(&job, seen, &me, cfg.lease_ttl)? {
                let prefix = runs::world_prefix(&job, entered.generation, nth);
                tracing::debug!(generation = entered.generation, prefix = %prefix, "entered the job's run");
                let origin = Arc::new(origin(prefix));
                hold(&origin, entered.presence);
                return Communicator::bootstrap(store, origin, env.rank, env.world_size, Some(&env.job_id));
            }
            // Someone entered or started a run since `seen`: look again.
            if Instant::now() >= deadline {
                return Err(Error::timeout(format!(
                    "the job's run in the store kept changing for {} ms",
                    cfg.timeout.as_millis()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Forms the world of `size` ranks under the origin's prefix, in `job` (the job id, where
    /// one names the world).
    fn bootstrap(
        store: &dyn Store,
        origin: Arc<Origin>,
        rank: u32,
        size: u32,
        job: Option<&str>,
    ) -> Result<Communicator> {
        let (prefix, cfg) = (&origin.prefix, &origin.cfg);
        let id = derive_id(&[prefix.as_bytes(), &size.to_le_bytes()]);
        let at = bootstrap::Place { prefix, job };
        let net = bootstrap::connect_mesh(rank, size, store, at, id, &origin.token, cfg)?;
        // Before any communicator exists, so that all of them (sub-communicators, shrinks,
        // rebuilds) see the same figures on every rank.
        let costs = linkcost::agree(&net, size, id, cfg)?;
        let members = (0..size).collect();
        let inner = CommInner::new(net.shared(), id, 0, rank, members, super::Setup::of(cfg, costs));
        if rank == 0 {
            // Every rank has connected, so every rank checked this key before it exists.
            store.set(&join::formed_key(prefix), b"1")?;
        }
        tracing::info!(rank, size, prefix = %prefix, "communicator ready");
        Ok(Communicator::world(inner, origin))
    }
}
