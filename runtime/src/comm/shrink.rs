//! Revoke and shrink: turning a communicator with failed members into a working one.

use std::sync::atomic::Ordering;

use super::{agree, derive_id, CommInner, Communicator};
use crate::error::{Error, Result};
use crate::rendezvous::StoreAddr;
use crate::wire::{FrameHeader, FrameKind};

impl Communicator {
    /// Makes every member's pending and later operations on this communicator fail with
    /// `Revoked` (ULFM's revoke). The communicator can still be shrunk.
    pub fn revoke(&self) {
        let c = &self.inner;
        c.net.inbox.revoke(c.id);
        let hdr = FrameHeader { kind: FrameKind::Revoke, comm_id: c.id, epoch: c.epoch, seq: 0, tag: 0, len: 0 };
        for (r, &w) in c.members.iter().enumerate() {
            if r as u32 != c.rank {
                // Failed members need no notice.
                let _ = c.net.send(w, &hdr, &[]);
            }
        }
    }

    /// Called by every surviving member: agrees on the failed set (identical everywhere, or an
    /// error for all) and returns a communicator of the survivors at the next epoch, with dense
    /// ranks in old-rank order, over the connections that still work. No store is needed; with
    /// an etcd store (replicated, unlike the embedded one) the decision is also recorded there
    /// by compare-and-swap, so that two partitioned halves cannot both go on.
    pub fn shrink(&self) -> Result<Communicator> {
        let c = &self.inner;
        let _span = tracing::info_span!("shrink", rank = c.rank, epoch = c.epoch).entered();
        if c.aborted.load(Ordering::SeqCst) {
            return Err(Error::new(crate::error::ErrorKind::Aborted, "shrink: the communicator was aborted"));
        }
        let instance = c.shrink_seq.fetch_add(1, Ordering::SeqCst);
        let failed = agree::agree(c, instance)?;
        let small = self.survivors_of(&failed, instance)?;
        if let Some(origin) = c.origin.as_ref().filter(|o| matches!(o.store, StoreAddr::Etcd(_))) {
            super::join::record_decision(&small, origin, &failed, &[])?;
        }
        Ok(small)
    }

    /// The communicator of the members not in `failed`, at the next epoch.
    pub(crate) fn survivors_of(&self, failed: &[u32], instance: u64) -> Result<Communicator> {
        let c = &self.inner;
        let survivors: Vec<u32> = (0..c.members.len() as u32).filter(|r| !failed.contains(r)).collect();
        let rank = survivors.iter().position(|&r| r == c.rank).ok_or_else(|| {
            Error::rank_failed(vec![c.rank], "shrink: the survivors decided that this rank had failed")
        })?;
        let epoch = c.epoch + 1;
        let list: Vec<u8> = failed.iter().flat_map(|r| r.to_le_bytes()).collect();
        let id = derive_id(&[&c.id.to_le_bytes(), b"shrink", &epoch.to_le_bytes(), &instance.to_le_bytes(), &list]);
        let members = survivors.iter().map(|&r| c.members[r as usize]).collect();
        tracing::info!(old_rank = c.rank, new_rank = rank, epoch, ?failed, "communicator shrunk");
        let inner = CommInner::new(c.net.clone(), id, epoch, rank as u32, members, c.timeout, c.chunk_bytes);
        Ok(match c.origin.clone() {
            Some(origin) => Communicator::world(inner, origin),
            None => Communicator::from_inner(inner),
        })
    }
}
