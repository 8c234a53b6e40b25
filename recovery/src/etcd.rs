//! The rendezvous `Store` on etcd v3. Keys live under `/hccn/`; a wait for a key is an etcd watch
//! (no polling), and `add` is a compare-and-swap loop, so concurrent ranks never lose an update.
//! etcd's own TLS, client certificates and users protect the cluster (`HCCN_ETCD_*`, see
//! access.rs); the job token still authenticates every connection between ranks.

use std::time::Duration;

use crate::access;
use crate::runs::JobKeys;
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, Txn, TxnOp};
use hccn_runtime::rendezvous::runs::{Entered, RunState};
use hccn_runtime::rendezvous::{EtcdAccess, EtcdCluster, Member, OnGone, Store};
use hccn_runtime::{Error, ErrorKind, Result};

const ROOT: &str = "/hccn/";

/// A store on an etcd cluster; each call blocks on the store's own single-thread runtime.
pub struct EtcdStore {
    rt: tokio::runtime::Runtime,
    client: Client,
    endpoints: Vec<String>,
    /// How every client of this cluster connects (this one and each lease's own).
    options: ConnectOptions,
    timeout: Duration,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore").field("endpoints", &self.endpoints).finish()
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Store, format!("etcd {what}: {e}"))
}

/// The connector the runtime calls for `etcd://` addresses.
pub(crate) fn connect(cluster: &EtcdCluster, _token: &[u8], timeout: Duration) -> Result<Box<dyn Store>> {
    Ok(Box::new(EtcdStore::connect_to(cluster, timeout)?))
}

impl EtcdStore {
    /// Connects to a cluster that needs neither TLS nor a login.
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<EtcdStore> {
        EtcdStore::connect_to(&EtcdCluster { endpoints: endpoints.to_vec(), access: EtcdAccess::default() }, timeout)
    }

    /// Connects and makes one read, so that a cluster that refuses this process's certificate
    /// or login says so here, at once and by name, rather than as a timeout of a later call.
    pub fn connect_to(cluster: &EtcdCluster, timeout: Duration) -> Result<EtcdStore> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::new(ErrorKind::System, format!("no runtime for etcd: {e}")))?;
        let options = access::options(&cluster.access, timeout)?;
        let endpoints = &cluster.endpoints;
        let client = rt.block_on(access::connect(endpoints, &cluster.access, options.clone(), timeout))?;
        Ok(EtcdStore { rt, client, endpoints: endpoints.clone(), options, timeout })
    }

    fn key(key: &str) -> String {
        format!("{ROOT}{key}")
    }
}

impl EtcdStore {
    /// Runs `op` until it succeeds or the store's timeout passes: while a member is down or a
    /// leader is being elected, requests fail for a moment and the next one may succeed through
    /// another member. Timeouts of the operation itself are final.
    fn retry<T>(&self, what: &str, mut op: impl FnMut() -> Result<T>) -> Result<T> {
        let deadline = std::time::Instant::now() + self.timeout;
        loop {
            match op() {
                Err(e) if e.kind() == ErrorKind::Store && std::time::Instant::now() < deadline => {
                    tracing::debug!("etcd {what} will be retried: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) if e.kind() == ErrorKind::Store => {
                    return Err(e.context(format!(
                        "etcd at {} gave no answer within {} ms (no leader, or unreachable)",
                        self.endpoints.join(","),
                        self.timeout.as_millis()
                    )))
                }
                other => return other,
            }
        }
    }
}

impl Store for EtcdStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.retry("put", || {
            let mut c = self.client.clone();
            self.rt.block_on(c.put(Self::key(key), value, None)).map_err(|e| err("put", e))?;
            Ok(())
        })
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.retry("get", || self.get_once(key, timeout))
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        self.retry("add", || self.add_once(key, delta))
    }

    fn create(&self, key: &str, value: &[u8]) -> Result<Option<Vec<u8>>> {
        self.retry("create", || {
            let k = Self::key(key);
            let mut c = self.client.clone();
            self.rt.block_on(async {
                // Version 0: the key does not exist. Either way the reply carries what is there.
                let txn = Txn::new()
                    .when([Compare::version(k.as_str(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(k.as_str(), value, None)])
                    .or_else([TxnOp::get(k.as_str(), None)]);
                let resp = c.txn(txn).await.map_err(|e| err("txn", e))?;
                if resp.succeeded() {
                    return Ok(None);
                }
                let existing = resp.op_responses().into_iter().find_map(|r| match r {
                    etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
                    _ => None,
                });
                Ok(Some(existing.unwrap_or_default()))
            })
        })
    }

    fn keep_member(
        &self,
        key: &str,
        value: &[u8],
        ttl: Duration,
        watch: &str,
        on_gone: OnGone,
    ) -> Result<Option<Member>> {
        crate::lease::keep(crate::lease::Spec {
            endpoints: self.endpoints.clone(),
            options: self.options.clone(),
            timeout: self.timeout,
            key: Self::key(key),
            value: value.to_vec(),
            ttl,
            watch: Self::key(watch),
            on_gone,
        })
    }

    fn remove_prefix(&self, prefix: &str) -> Result<()> {
        self.retry("delete", || {
            let mut c = self.client.clone();
            let opts = DeleteOptions::new().with_prefix();
            self.rt.block_on(c.delete(Self::key(prefix), Some(opts))).map_err(|e| err("delete", e))?;
            Ok(())
        })
    }

    fn run_state(&self, job: &str) -> Result<RunState> {
        let keys = JobKeys::new(ROOT, job);
        self.retry("get", || self.rt.block_on(crate::runs::state(&mut self.client.clone(), &keys)))
    }

    fn enter_run(&self, job: &str, seen: RunState, me: &str, ttl: Duration) -> Result<Option<Entered>> {
        crate::runs::enter_run(crate::runs::Spec {
            endpoints: self.endpoints.clone(),
            options: self.options.clone(),
            timeout: self.timeout,
            keys: JobKeys::new(ROOT, job),
            seen,
            me: me.to_owned(),
            ttl,
        })
    }

    fn remove_job_if_idle(&self, job: &str) -> Result<bool> {
        let keys = JobKeys::new(ROOT, job);
        self.retry("delete", || self.rt.block_on(crate::runs::remove_if_idle(&mut self.client.clone(), &keys)))
    }
}

impl EtcdStore {
    fn get_once(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let k = Self::key(key);
        let mut c = self.client.clone();
        self.rt.block_on(async {
            // Watch first, then read: a put between the two is seen by one of them.
            // Dropping the stream ends the watch.
            let mut events = c.watch(k.as_str(), None).await.map_err(|e| err("watch", e))?;
            let now = c.get(k.as_str(), None).await.map_err(|e| err("get", e))?;
            if let Some(kv) = now.kvs().first() {
                return Ok(kv.value().to_vec());
            }
            let wait = async {
                while let Some(resp) = events.message().await.map_err(|e| err("watch", e))? {
                    if let Some(ev) = resp.events().iter().find(|ev| ev.event_type() == EventType::Put) {
                        return Ok(ev.kv().map(|kv| kv.value().to_vec()).unwrap_or_default());
                    }
                }
                Err(err("watch", "the stream ended"))
            };
            let found = tokio::time::timeout(timeout, wait).await;
            found.map_err(|_| {
                Error::timeout(format!("store key {key:?} did not appear within {} ms", timeout.as_millis()))
            })?
        })
    }

    fn add_once(&self, key: &str, delta: i64) -> Result<i64> {
        let k = Self::key(key);
        let mut c = self.client.clone();
        let deadline = std::time::Instant::now() + self.timeout;
        self.rt.block_on(async {
            loop {
                let cur = c.get(k.as_str(), None).await.map_err(|e| err("get", e))?;
                let (value, version) = match cur.kvs().first() {
                    Some(kv) => {
                        let b: [u8; 8] =
                            kv.value().try_into().map_err(|_| err("add", "the key does not hold a counter"))?;
                        (i64::from_le_bytes(b), kv.version())
                    }
                    None => (0, 0),
                };
                let new = value.wrapping_add(delta);
                // Version 0 means absent: the swap only succeeds if nobody wrote in between.
                let txn = Txn::new()
                    .when([Compare::version(k.as_str(), CompareOp::Equal, version)])
                    .and_then([TxnOp::put(k.as_str(), new.to_le_bytes(), None)]);
                if c.txn(txn).await.map_err(|e| err("txn", e))?.succeeded() {
                    return Ok(new);
                }
                if std::time::Instant::now() >= deadline {
                    return Err(Error::timeout(format!("store counter {key:?}: too much contention")));
                }
            }
        })
    }
}
