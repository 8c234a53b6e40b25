//! New communicators from an existing one: `new_group` (members only, MPI_Comm_create_group)
//! and `split` (collective, MPI_Comm_split). Both reuse the parent's connections; the child's
//! id is derived identically on every member, so no extra round trip is needed for groups.

use crate::sync::Locked;
use std::sync::atomic::Ordering;

use super::{derive_id, CommInner, Communicator};
use crate::collectives::{Op, Ptr};
use crate::error::{Error, Result};
use crate::types::DataType;

impl Communicator {
    /// A communicator of `ranks` (in this communicator's numbering), called by those ranks only;
    /// the new rank of each member is its index in `ranks`.
    pub fn new_group(&self, ranks: &[u32]) -> Result<Communicator> {
        self.inner.check_state()?;
        let size = self.size();
        if ranks.is_empty() {
            return Err(Error::invalid("new_group: the rank list is empty"));
        }
        let mut seen = vec![false; size as usize];
        for &r in ranks {
            if r >= size {
                return Err(Error::invalid(format!(
                    "new_group: rank {r} is out of range for a communicator of {size}"
                )));
            }
            if std::mem::replace(&mut seen[r as usize], true) {
                return Err(Error::invalid(format!("new_group: rank {r} is listed twice")));
            }
        }
        let me = ranks
            .iter()
            .position(|&r| r == self.rank())
            .ok_or_else(|| Error::invalid(format!("new_group: the calling rank {} is not in the list", self.rank())))?;
        let nth = {
            let mut seqs = self.inner.group_seq.locked();
            let n = seqs.entry(ranks.to_vec()).or_insert(0);
            *n += 1;
            *n
        };
        let list: Vec<u8> = ranks.iter().flat_map(|r| r.to_le_bytes()).collect();
        let id = derive_id(&[&self.inner.id.to_le_bytes(), b"group", &list, &nth.to_le_bytes()]);
        Ok(self.child(id, me as u32, ranks))
    }

    /// Collective over this communicator: ranks with the same `color` form a new communicator,
    /// ordered by (`key`, old rank); a negative color gives `None`.
    pub fn split(&self, color: i32, key: i32) -> Result<Option<Communicator>> {
        let _alone = self.inner.enter()?;
        let n = self.size() as usize;
        let mine: Vec<u8> = color.to_le_bytes().into_iter().chain(key.to_le_bytes()).collect();
        let mut all = vec![0u8; 8 * n];
        let op = Op::AllGather {
            send: Ptr::from_const(mine.as_ptr()),
            recv: Ptr::from_mut(all.as_mut_ptr()),
            send_count: 2,
            dt: DataType::Int32,
        };
        // SAFETY: both buffers live on this frame until the blocking call returns.
        unsafe { self.submit_entered(op, None)? };
        let nth = self.inner.split_seq.fetch_add(1, Ordering::SeqCst);
        if color < 0 {
            return Ok(None);
        }
        let entry = |r: usize| {
            let c = i32::from_le_bytes([all[8 * r], all[8 * r + 1], all[8 * r + 2], all[8 * r + 3]]);
            let k = i32::from_le_bytes([all[8 * r + 4], all[8 * r + 5], all[8 * r + 6], all[8 * r + 7]]);
            (c, k)
        };
        let mut ranks: Vec<u32> = (0..n).filter(|&r| entry(r).0 == color).map(|r| r as u32).collect();
        ranks.sort_by_key(|&r| (entry(r as usize).1, r));
        let me = ranks
            .iter()
            .position(|&r| r == self.rank())
            .ok_or_else(|| Error::internal("split lost the calling rank"))?;
        let id = derive_id(&[&self.inner.id.to_le_bytes(), b"split", &nth.to_le_bytes(), &color.to_le_bytes()]);
        Ok(Some(self.child(id, me as u32, &ranks)))
    }

    fn child(&self, id: u64, rank: u32, ranks: &[u32]) -> Communicator {
        let members = ranks.iter().map(|&r| self.inner.members[r as usize]).collect();
        let p = &self.inner;
        Communicator::from_inner(CommInner::new(p.net.clone(), id, p.epoch, rank, members, p.setup()))
    }
}
