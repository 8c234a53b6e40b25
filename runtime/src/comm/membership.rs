//! Membership keys on a store with leases (etcd): each world communicator publishes
//! `<prefix>/members/<epoch>/<id>/<rank>` and watches its siblings' keys. A key that vanishes
//! without being withdrawn (its lease expired: the process died or froze) marks that rank
//! failed: a backstop to the heartbeats that works even when they are off or a link is quiet.

use crate::sync::Locked;
use std::sync::{Arc, Mutex, Weak};

use super::{CommInner, Communicator, Origin};
use crate::rendezvous::{Member, StoreAddr};

/// The published key of one communicator; dropping it withdraws the key.
#[derive(Default)]
pub(crate) struct MemberSlot(Mutex<Option<Member>>);

impl MemberSlot {
    fn fill(&self, member: Member) {
        *self.0.locked() = Some(member);
    }
}

fn watch_prefix(origin: &Origin, epoch: u64, id: u64) -> String {
    format!("{}/members/{epoch}/{id:016x}/", origin.prefix)
}

impl Communicator {
    /// Makes `inner` a world communicator of `origin`; with etcd, its membership is published
    /// in the background (creation never waits for it, and a store that cannot take it only
    /// costs the backstop, with a warning).
    pub(super) fn world(inner: CommInner, origin: Arc<Origin>) -> Communicator {
        let comm = Communicator::from_inner(inner.with_origin(Some(origin.clone())));
        if matches!(origin.store, StoreAddr::Etcd(_)) {
            let weak = Arc::downgrade(&comm.inner);
            // A copy without what the origin keeps, which must go with the communicators.
            let origin = Arc::new(origin.detached());
            let spawned = std::thread::Builder::new().name("hccn-member".into()).spawn(move || publish(weak, origin));
            if let Err(e) = spawned {
                tracing::warn!("membership key not published (no thread: {e}); heartbeats alone detect failures");
            }
        }
        comm
    }
}

fn publish(weak: Weak<CommInner>, origin: Arc<Origin>) {
    let Some(c) = weak.upgrade() else { return };
    let (members, rank, net) = (c.members.clone(), c.rank, Arc::downgrade(&c.net));
    let prefix = watch_prefix(&origin, c.epoch, c.id);
    drop(c);
    let ttl = origin.cfg.lease_ttl.as_secs();
    let dead_after = origin.cfg.dead_after;
    let on_gone = Box::new(move |name: &str| {
        let (Ok(r), Some(net)) = (name.parse::<u32>(), net.upgrade()) else { return };
        let Some(&world) = members.get(r as usize).filter(|_| r != rank) else { return };
        // The store is not in the data path: a lease that expires while the rank is heard on
        // its link (the store was out of reach, say) fails nobody, nor while its host is heard
        // (its path is congested: its keep-alives queue as its frames do), which leaves it to
        // its watchers' patience. Only the rank's watchers can read its silence (an unwatched
        // link may carry nothing for long); they tell the rest.
        if !net.watches(world) {
            tracing::info!(rank = r, "its membership lease expired: left to the ranks that watch it");
            return;
        }
        match net.silent_for(world) {
            Some(silent) if silent <= dead_after => {
                tracing::info!(rank = r, "its membership lease expired, but it is alive on its link: ignored")
            }
            _ if net.host_heard(world, dead_after) => {
                tracing::info!(rank = r, "its membership lease expired, but its host is heard: left to its watchers")
            }
            _ => net.inbox.mark_failed(
                world,
                crate::transport::Fault::cut(format!(
                    "its membership lease in the store expired and its link is silent (dead or frozen for {ttl} s)"
                )),
            ),
        }
    });
    let key = format!("{prefix}{rank}");
    let published = origin
        .store
        .connect(&origin.token, origin.cfg.timeout)
        .and_then(|store| store.keep_member(&key, b"1", origin.cfg.lease_ttl, &prefix, on_gone));
    match published {
        Ok(Some(member)) => match weak.upgrade() {
            Some(c) => c.member.fill(member),
            None => drop(member),
        },
        Ok(None) => {}
        Err(e) => tracing::warn!("membership key {key} not published: {e}; heartbeats alone detect failures"),
    }
}
