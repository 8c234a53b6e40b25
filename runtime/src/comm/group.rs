//! New communicators from an existing one: `new_group` (members only, MPI_Comm_create_group)
//! and `split` (collective, MPI_Comm_split). Both reuse the parent's connections; the child's
//! id is derived identically on every member. A group's members meet once as it is made, to
//! check that they passed the same list.

use crate::sync::Locked;
use std::sync::atomic::Ordering;

use super::group_intents::LISTS_DIFFER;
use super::{derive_id, CommInner, Communicator};
use crate::collectives::{verify, Ctx, Op, Ptr};
use crate::error::{Error, ErrorKind, Result};
use crate::types::DataType;
use crate::wire::{Fingerprint, FrameKind};

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
        let list: Vec<u8> = ranks.iter().flat_map(|r| r.to_le_bytes()).collect();
        self.members_agree(ranks, &list)?;
        let nth = self.next_of(ranks.to_vec());
        let id = derive_id(&[&self.inner.id.to_le_bytes(), b"group", &list, &nth.to_le_bytes()]);
        Ok(self.child(id, me as u32, ranks))
    }

    /// Checks that every member of a new group passed the same list, in the same order (which
    /// gives the new ranks): the members of the same set meet in a barrier whose frames carry a
    /// digest of the ordered list, so that lists in another order fail at once with MISMATCH on
    /// every member, naming the ranks. Members whose sets differ never meet there: they tell
    /// each other their lists while they wait (group_intents.rs), and fail with MISMATCH once a
    /// member sees a list that names it and differs from its own; a member that no other lists
    /// fails at the deadline, told that the lists may differ.
    fn members_agree(&self, ranks: &[u32], list: &[u8]) -> Result<()> {
        if ranks.len() < 2 {
            return Ok(());
        }
        let mut set = ranks.to_vec();
        set.sort_unstable();
        // Counted apart from the lists (u32::MAX is no rank). A check that found the lists to
        // differ counts on every member (each fails it alike, and the next check must not meet
        // a frame of this one); one that timed out, where the sets may differ, counts on none,
        // so that members whose sets differed still number their next group alike.
        let key = super::group_intents::set_key(ranks);
        let nth = self.inner.group_seq.locked().get(&key).copied().unwrap_or(0) + 1;
        let set_bytes: Vec<u8> = set.iter().flat_map(|r| r.to_le_bytes()).collect();
        let id = derive_id(&[&self.inner.id.to_le_bytes(), b"group-check", &set_bytes, &nth.to_le_bytes()]);
        let me = set.iter().position(|&r| r == self.rank()).unwrap_or(0) as u32;
        let check = self.child(id, me, &set);
        // The ordered list's digest stands where a call's count would: frames of a list in
        // another order differ.
        let fp = Fingerprint { op: 0, dtype: 0, redop: 0, root: u32::MAX, count: derive_id(&[list]) };
        let ctx = Ctx::new(&check.inner, FrameKind::Collective, 0).with_fingerprint(&fp);
        let watch = super::group_intents::Watch::start(&self.inner, ranks, nth, &check.inner);
        let met = verify::barrier(&ctx);
        watch.finish();
        if met.as_ref().err().is_none_or(|e| e.kind() == ErrorKind::Mismatch) {
            self.next_of(key);
        }
        if let Err(e) = &met {
            // Every member waiting in the check hears why at once.
            check.inner.abandon(0, e);
        }
        met.map_err(|e| match e.kind() {
            ErrorKind::Mismatch if e.message().contains(LISTS_DIFFER) => {
                let text = e.message();
                Error::new(ErrorKind::Mismatch, &text[text.find("new_group: ").unwrap_or(0)..])
            }
            ErrorKind::Mismatch => {
                let others: Vec<u32> =
                    e.failed_ranks().iter().map(|&r| set[r as usize]).filter(|&r| r != self.rank()).collect();
                Error::new(
                    ErrorKind::Mismatch,
                    format!(
                        "new_group: rank(s) {others:?} passed the members in another order than this rank ({ranks:?}); \
                         every member must pass the same list (its order gives the new ranks)"
                    ),
                )
                .with_failed(others)
            }
            ErrorKind::Timeout => e.context(format!(
                "new_group: not every member of {ranks:?} created the group: every rank of the list must call \
                 hccn_new_group with the same list (lists that differ in their members never meet)"
            )),
            _ => e.context("new_group"),
        })
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

    /// The number of the next group made of `key` (a list, or a marked set) on this rank.
    fn next_of(&self, key: Vec<u32>) -> u64 {
        let mut seqs = self.inner.group_seq.locked();
        let n = seqs.entry(key).or_insert(0);
        *n += 1;
        *n
    }

    fn child(&self, id: u64, rank: u32, ranks: &[u32]) -> Communicator {
        let members = ranks.iter().map(|&r| self.inner.members[r as usize]).collect();
        let p = &self.inner;
        Communicator::from_inner(CommInner::new(p.net.clone(), id, p.epoch, rank, members, p.setup()))
    }
}
