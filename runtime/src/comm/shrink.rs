//! Revoke and shrink: turning a communicator with failed members into a working one.

use std::sync::atomic::Ordering;

use super::{agree, derive_id, CommInner, Communicator};
use crate::error::{Error, Result};
use crate::wire::{FrameHeader, FrameKind};

impl Communicator {
    /// Marks this rank as left out of its world in the store (for the launcher, which must not
    /// report a job whose rank went on alone, or not at all, as a success), when the error says so.
    pub(crate) fn note_excluded(&self, e: &Error) {
        if e.kind() != crate::error::ErrorKind::StaleEpoch {
            return;
        }
        let Some(origin) = self.inner.origin.as_ref().filter(|o| o.durable) else { return };
        let world = self.inner.members.get(self.inner.rank as usize).copied().unwrap_or(self.inner.rank);
        let key = format!("{}/excluded/{world}", origin.prefix);
        let marked = origin
            .store
            .connect(&origin.token, origin.cfg.timeout)
            .and_then(|store| store.set(&key, e.message().as_bytes()));
        if let Err(why) = marked {
            tracing::warn!("could not mark this rank excluded in the store: {why}");
        }
    }

    /// Makes every member's pending and later operations on this communicator fail with
    /// `Revoked` (ULFM's revoke). The communicator can still be shrunk.
    pub fn revoke(&self) {
        let c = &self.inner;
        c.net.inbox.revoke(c.id);
        let hdr = FrameHeader::control(FrameKind::Revoke, c.id, c.epoch, 0, 0);
        for (r, &w) in c.members.iter().enumerate() {
            if r as u32 != c.rank {
                // Failed members need no notice.
                let _ = c.net.send(w, &hdr, &[]);
            }
        }
    }

    /// Called by every surviving member: agrees on the failed set (identical everywhere, or an
    /// error for all) and returns a communicator of the survivors at the next epoch, with dense
    /// ranks in old-rank order, over the connections that still work. No store is needed: a
    /// quorum of the members not surely dead must go on together (see `agree.rs`); where the
    /// world has a store that outlives its ranks the decision is also recorded there once per
    /// epoch, so that a rank left out of it is refused (`StaleEpoch`), never given a
    /// communicator of its own.
    pub fn shrink(&self) -> Result<Communicator> {
        let c = &self.inner;
        let _span = tracing::info_span!("shrink", rank = c.rank, epoch = c.epoch).entered();
        let _alone = c.enter()?;
        if c.aborted.load(Ordering::SeqCst) {
            return Err(Error::new(crate::error::ErrorKind::Aborted, "shrink: the communicator was aborted"));
        }
        let failed = agree::agree(c).inspect_err(|e| self.note_excluded(e))?;
        let small = self.survivors_of(&failed).inspect_err(|e| self.note_excluded(e))?;
        if let Some(origin) = c.origin.as_ref().filter(|o| o.durable) {
            super::join::record_decision(&small, origin, &failed, &[]).inspect_err(|e| self.note_excluded(e))?;
        }
        Ok(small)
    }

    /// The communicator of the members not in `failed`, at the next epoch.
    pub(crate) fn survivors_of(&self, failed: &[u32]) -> Result<Communicator> {
        let c = &self.inner;
        let survivors: Vec<u32> = (0..c.members.len() as u32).filter(|r| !failed.contains(r)).collect();
        let rank = survivors.iter().position(|&r| r == c.rank).ok_or_else(|| {
            Error::new(
                crate::error::ErrorKind::StaleEpoch,
                format!("shrink: the others went on to epoch {} without this rank", c.epoch + 1),
            )
            .with_failed(vec![c.rank])
        })?;
        let epoch = c.epoch + 1;
        let list: Vec<u8> = failed.iter().flat_map(|r| r.to_le_bytes()).collect();
        let id = derive_id(&[&c.id.to_le_bytes(), b"shrink", &epoch.to_le_bytes(), &list]);
        let members = survivors.iter().map(|&r| c.members[r as usize]).collect();
        let gone: Vec<u32> = failed.iter().filter_map(|&r| c.members.get(r as usize).copied()).collect();
        c.net.retire(&gone);
        tracing::info!(old_rank = c.rank, new_rank = rank, epoch, ?failed, "communicator shrunk");
        let inner = CommInner::new(c.net.clone(), id, epoch, rank as u32, members, c.setup());
        Ok(match c.origin.clone() {
            Some(origin) => Communicator::world(inner, origin),
            None => Communicator::from_inner(inner),
        })
    }
}
