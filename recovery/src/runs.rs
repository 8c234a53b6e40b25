//! A job's generations on etcd (hccn_runtime::rendezvous::runs says why and how): reading the
//! current one, entering it or starting the next in one transaction, a process's presence on
//! a lease kept alive by a thread of its own, and removing the job's keys at a clean end.

use std::collections::BTreeSet;
use std::sync::mpsc;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp};
use hccn_runtime::rendezvous::runs::{self, Entered, RunState};
use hccn_runtime::{Error, ErrorKind, Result};
use tokio::sync::oneshot;

use crate::background::{self, Started};

use crate::lease::Renewer;

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Store, format!("etcd {what}: {e}"))
}

/// Full etcd keys of one job: `root` is the store's key root, `job` the job's (`job/<id>`).
#[derive(Debug, Clone)]
pub(crate) struct JobKeys {
    root: String,
    job: String,
}

impl JobKeys {
    pub(crate) fn new(root: &str, job: &str) -> JobKeys {
        JobKeys { root: root.to_owned(), job: job.to_owned() }
    }
    fn run(&self) -> String {
        format!("{}{}", self.root, runs::generation_key(&self.job))
    }
    fn live(&self, g: u64) -> String {
        format!("{}{}", self.root, runs::live_prefix(&self.job, g))
    }
    fn entered(&self, g: u64) -> String {
        format!("{}{}", self.root, runs::entered_prefix(&self.job, g))
    }
    fn left(&self, g: u64) -> String {
        format!("{}{}", self.root, runs::left_prefix(&self.job, g))
    }
    fn records(&self, g: u64) -> String {
        format!("{}{}", self.root, runs::generation_prefix(&self.job, g))
    }
    fn everything(&self) -> String {
        format!("{}{}/", self.root, self.job)
    }

    /// True while `run` still holds generation `g` (0: absent).
    fn still(&self, g: u64) -> Compare {
        if g == 0 {
            Compare::version(self.run(), CompareOp::Equal, 0)
        } else {
            Compare::value(self.run(), CompareOp::Equal, g.to_le_bytes().to_vec())
        }
    }

    /// True when some process of generation `g` is alive (`alive`), or none is.
    fn liveness(&self, g: u64, alive: bool) -> Compare {
        // A compare over a range holds when it holds for every key in it, or, with no key, for
        // an absent one (version 0).
        let (op, v) = if alive { (CompareOp::Greater, 0) } else { (CompareOp::Equal, 0) };
        Compare::version(self.live(g), op, v).with_prefix()
    }
}

fn prefix() -> Option<DeleteOptions> {
    Some(DeleteOptions::new().with_prefix())
}

async fn count(client: &mut Client, prefix: &str) -> Result<i64> {
    let r = client.get(prefix, Some(GetOptions::new().with_prefix().with_count_only())).await;
    Ok(r.map_err(|e| err("get", e))?.count())
}

/// Names (after the prefix) of the keys under `prefix`.
async fn names(client: &mut Client, prefix: &str) -> Result<BTreeSet<String>> {
    let r = client.get(prefix, Some(GetOptions::new().with_prefix().with_keys_only())).await;
    let r = r.map_err(|e| err("get", e))?;
    Ok(r.kvs().iter().filter_map(|kv| kv.key_str().ok()?.strip_prefix(prefix).map(str::to_owned)).collect())
}

pub(crate) async fn state(client: &mut Client, keys: &JobKeys) -> Result<RunState> {
    let r = client.get(keys.run(), None).await.map_err(|e| err("get", e))?;
    let generation = match r.kvs().first() {
        Some(kv) => u64::from_le_bytes(
            kv.value().try_into().map_err(|_| err("run", "the job's generation key holds no number"))?,
        ),
        None => 0,
    };
    let live = generation > 0 && count(client, &keys.live(generation)).await? > 0;
    Ok(RunState { generation, live })
}

/// The transaction of [`runs`]: join `seen`'s generation or start the next; the generation
/// entered, or `None` when the job changed since `seen`.
async fn enter(client: &mut Client, keys: &JobKeys, seen: RunState, me: &str, lease: i64) -> Result<Option<u64>> {
    let g = seen.generation;
    let presence = |n: u64| {
        [
            TxnOp::put(format!("{}{me}", keys.live(n)), "", Some(PutOptions::new().with_lease(lease))),
            TxnOp::put(format!("{}{me}", keys.entered(n)), "", None),
        ]
    };
    let (entered, txn) = if seen.live {
        (g, Txn::new().when([keys.still(g), keys.liveness(g, true)]).and_then(presence(g)))
    } else {
        let next = g + 1;
        let mut ops = vec![
            TxnOp::put(keys.run(), next.to_le_bytes(), None),
            // What the dead generation left; the new one's records cannot exist, but go too.
            TxnOp::delete(keys.records(g), prefix()),
            TxnOp::delete(keys.records(next), prefix()),
            TxnOp::delete(keys.entered(g), prefix()),
            TxnOp::delete(keys.left(g), prefix()),
        ];
        ops.extend(presence(next));
        (next, Txn::new().when([keys.still(g), keys.liveness(g, false)]).and_then(ops))
    };
    let done = client.txn(txn).await.map_err(|e| err("txn", e))?.succeeded();
    Ok(done.then_some(entered))
}

/// Leaves generation `g` on purpose; the last process to leave, when all that entered left,
/// deletes the job's keys.
async fn leave(client: &mut Client, keys: &JobKeys, g: u64, me: &str, lease: i64) -> Result<()> {
    client.put(format!("{}{me}", keys.left(g)), "", None).await.map_err(|e| err("put", e))?;
    client.lease_revoke(lease).await.map_err(|e| err("lease revoke", e))?;
    if count(client, &keys.live(g)).await? > 0 {
        return Ok(());
    }
    let (entered, left) = (names(client, &keys.entered(g)).await?, names(client, &keys.left(g)).await?);
    if !entered.is_subset(&left) {
        // Someone died instead of leaving: keep the records (hccnrun or the next run clears them).
        return Ok(());
    }
    let txn = Txn::new()
        .when([keys.still(g), keys.liveness(g, false)])
        .and_then([TxnOp::delete(keys.everything(), prefix())]);
    client.txn(txn).await.map_err(|e| err("txn", e))?;
    Ok(())
}

/// Deletes the job's keys unless a process of its current generation is alive.
pub(crate) async fn remove_if_idle(client: &mut Client, keys: &JobKeys) -> Result<bool> {
    let g = state(client, keys).await?.generation;
    let txn = Txn::new()
        .when([keys.still(g), keys.liveness(g, false)])
        .and_then([TxnOp::delete(keys.everything(), prefix())]);
    Ok(client.txn(txn).await.map_err(|e| err("txn", e))?.succeeded())
}

/// What the presence thread needs.
pub(crate) struct Spec {
    pub endpoints: Vec<String>,
    pub options: ConnectOptions,
    pub timeout: Duration,
    pub keys: JobKeys,
    pub seen: RunState,
    pub me: String,
    pub ttl: Duration,
}

/// A process's presence in a generation; dropping it leaves (waiting at most 2 s for etcd).
struct Presence {
    stop: Option<oneshot::Sender<()>>,
    done: mpsc::Receiver<()>,
}

impl Drop for Presence {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            if stop.send(()).is_ok() {
                let _ = self.done.recv_timeout(Duration::from_secs(2));
            }
        }
    }
}

/// Enters the job on a thread that then keeps the presence's lease alive until it is dropped.
pub(crate) fn enter_run(spec: Spec) -> Result<Option<Entered>> {
    let timeout = spec.timeout;
    let Started { ready: ready_rx, stop: stop_tx, done: done_rx } =
        background::start("hccn-etcd-run", "the job's presence", move |ready, stop| present(spec, ready, stop))?;
    match ready_rx.recv_timeout(timeout + Duration::from_secs(1)) {
        Ok(Ok(Some(generation))) => {
            let presence = Box::new(Presence { stop: Some(stop_tx), done: done_rx });
            Ok(Some(Entered { generation, presence: Some(presence) }))
        }
        Ok(Ok(None)) => Ok(None),
        Ok(Err(e)) => Err(e),
        Err(_) => {
            Err(Error::timeout(format!("etcd did not answer within {} ms while entering the job", timeout.as_millis())))
        }
    }
}

async fn present(spec: Spec, ready: mpsc::Sender<Result<Option<u64>>>, stop: oneshot::Receiver<()>) {
    let start = async {
        let mut client =
            Client::connect(&spec.endpoints, Some(spec.options.clone())).await.map_err(|e| err("connect", e))?;
        let grant =
            client.lease_grant(spec.ttl.as_secs().max(1) as i64, None).await.map_err(|e| err("lease grant", e))?;
        let entered = enter(&mut client, &spec.keys, spec.seen, &spec.me, grant.id()).await;
        if !matches!(entered, Ok(Some(_))) {
            let _ = client.lease_revoke(grant.id()).await;
        }
        Ok::<_, Error>((client, grant.id(), grant.ttl(), entered?))
    };
    let (mut client, lease, ttl, g) = match tokio::time::timeout(spec.timeout, start).await {
        Ok(Ok((client, lease, ttl, Some(g)))) => (client, lease, ttl, g),
        Ok(Ok((.., None))) => return drop(ready.send(Ok(None))),
        Ok(Err(e)) => return drop(ready.send(Err(e))),
        Err(_) => return drop(ready.send(Err(Error::timeout("etcd did not answer while entering the job")))),
    };
    let _ = ready.send(Ok(Some(g)));
    let mut renewer = Renewer::start(&mut client, lease).await;
    // Three keep-alives per period survive one lost request.
    let mut tick = tokio::time::interval(Duration::from_millis((ttl.max(1) as u64 * 1000 / 3).max(100)));
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => renewer.renew(&mut client).await,
        }
    }
    let left =
        tokio::time::timeout(Duration::from_millis(1500), leave(&mut client, &spec.keys, g, &spec.me, lease)).await;
    match left {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("leaving the job's generation {g}: {e} (its lease expires on its own)"),
        Err(_) => {
            tracing::warn!("leaving the job's generation {g}: etcd did not answer (its lease expires on its own)")
        }
    }
}
