//! Membership keys on etcd leases: a key published under a lease that a background thread keeps
//! alive, and a watch on the sibling keys. When a process dies or freezes, its keep-alives stop,
//! etcd deletes its keys at the lease's expiry, and every watcher learns of it. A process that
//! leaves on purpose first marks its key `<name>/left` (on the same lease), so that the deletion
//! that follows is not taken for a failure.

use std::collections::HashSet;
use std::sync::mpsc;
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, EventType, LeaseKeepAliveStream, LeaseKeeper, PutOptions, WatchOptions, WatchStream,
};
use hccn_runtime::rendezvous::{Member, OnGone};
use hccn_runtime::{Error, ErrorKind, Result};
use tokio::sync::oneshot;

use crate::background::{self, Started};

const LEFT: &str = "/left";

/// What the background thread needs; `key` and `watch` are full etcd keys.
pub(crate) struct Spec {
    pub endpoints: Vec<String>,
    pub options: ConnectOptions,
    pub timeout: Duration,
    pub key: String,
    pub value: Vec<u8>,
    pub ttl: Duration,
    pub watch: String,
    pub on_gone: OnGone,
}

/// The guard: dropping it withdraws the key (waiting at most a second for etcd to confirm).
struct Lease {
    stop: Option<oneshot::Sender<()>>,
    done: mpsc::Receiver<()>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            if stop.send(()).is_ok() {
                let _ = self.done.recv_timeout(Duration::from_secs(1));
            }
        }
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Store, format!("etcd {what}: {e}"))
}

/// Publishes the key and starts its keep-alive and watch; returns once the key is in etcd.
pub(crate) fn keep(spec: Spec) -> Result<Option<Member>> {
    let timeout = spec.timeout;
    let Started { ready: ready_rx, stop: stop_tx, done: done_rx } =
        background::start("hccn-etcd-lease", "the etcd lease", move |ready, stop| run(spec, ready, stop))?;
    match ready_rx.recv_timeout(timeout + Duration::from_secs(1)) {
        Ok(Ok(())) => Ok(Some(Box::new(Lease { stop: Some(stop_tx), done: done_rx }))),
        Ok(Err(e)) => Err(e),
        Err(_) => {
            Err(Error::timeout(format!("etcd did not take the membership key within {} ms", timeout.as_millis())))
        }
    }
}

struct Live {
    client: Client,
    lease: i64,
    every: Duration,
    events: WatchStream,
}

async fn start(spec: &Spec) -> Result<Live> {
    let mut client =
        Client::connect(&spec.endpoints, Some(spec.options.clone())).await.map_err(|e| err("connect", e))?;
    let ttl = spec.ttl.as_secs().max(1) as i64;
    let grant = client.lease_grant(ttl, None).await.map_err(|e| err("lease grant", e))?;
    // Watch before publishing, so that no sibling's departure can fall between the two.
    let events = watch(&mut client, &spec.watch).await?;
    let put = PutOptions::new().with_lease(grant.id());
    client.put(spec.key.as_str(), spec.value.as_slice(), Some(put)).await.map_err(|e| err("put", e))?;
    // etcd may grant more than asked; three keep-alives per period survive one lost request.
    let every = Duration::from_millis((grant.ttl().max(1) as u64 * 1000 / 3).max(100));
    Ok(Live { client, lease: grant.id(), every, events })
}

/// Keeps a lease alive: one keep-alive per call, on a stream that is replaced when it breaks
/// (its etcd member went away).
pub(crate) struct Renewer {
    lease: i64,
    keeper: Option<(LeaseKeeper, LeaseKeepAliveStream)>,
}

impl Renewer {
    pub(crate) async fn start(client: &mut Client, lease: i64) -> Renewer {
        Renewer { lease, keeper: client.lease_keep_alive(lease).await.ok() }
    }

    pub(crate) async fn renew(&mut self, client: &mut Client) {
        let kept = match self.keeper.as_mut() {
            Some((k, _)) => k.keep_alive().await.is_ok(),
            None => false,
        };
        if !kept {
            self.keeper = client.lease_keep_alive(self.lease).await.ok();
            if let Some((k, _)) = self.keeper.as_mut() {
                let _ = k.keep_alive().await;
            }
        }
        if let Some((_, replies)) = self.keeper.as_mut() {
            // Drain the replies so the stream never backs up; their content is not needed.
            while let Ok(Ok(Some(_))) = tokio::time::timeout(Duration::ZERO, replies.message()).await {}
        }
    }
}

async fn watch(client: &mut Client, prefix: &str) -> Result<WatchStream> {
    let opts = WatchOptions::new().with_prefix();
    client.watch(prefix, Some(opts)).await.map_err(|e| err("watch", e))
}

async fn run(spec: Spec, ready: mpsc::Sender<Result<()>>, mut stop: oneshot::Receiver<()>) {
    let mut live = match tokio::time::timeout(spec.timeout, start(&spec)).await {
        Ok(Ok(live)) => live,
        Ok(Err(e)) => return drop(ready.send(Err(e))),
        Err(_) => return drop(ready.send(Err(Error::timeout("etcd did not answer while publishing membership")))),
    };
    let _ = ready.send(Ok(()));
    let mut left: HashSet<String> = HashSet::new();
    let mut renewer = Renewer::start(&mut live.client, live.lease).await;
    let mut tick = tokio::time::interval(live.every);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = tick.tick() => renewer.renew(&mut live.client).await,
            msg = live.events.message() => match msg {
                Ok(Some(resp)) => {
                    for ev in resp.events() {
                        let Some(kv) = ev.kv() else { continue };
                        let Some(name) = kv.key_str().ok().and_then(|k| k.strip_prefix(spec.watch.as_str())) else { continue };
                        match ev.event_type() {
                            EventType::Put => {
                                if let Some(who) = name.strip_suffix(LEFT) {
                                    left.insert(who.to_owned());
                                }
                            }
                            EventType::Delete => {
                                if !name.contains('/') && !left.contains(name) {
                                    (spec.on_gone)(name);
                                }
                            }
                        }
                    }
                }
                _ => {
                    // The member serving the watch went away: watch again through another.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if let Ok(events) = watch(&mut live.client, &spec.watch).await {
                        live.events = events;
                    }
                }
            },
        }
    }
    // Withdraw: mark the departure first, then let the lease take every key with it.
    let marker = format!("{}{LEFT}", spec.key);
    let put = PutOptions::new().with_lease(live.lease);
    let withdraw = async {
        let _ = live.client.put(marker, "", Some(put)).await;
        let _ = live.client.lease_revoke(live.lease).await;
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), withdraw).await;
}
