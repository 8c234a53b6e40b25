//! While the members of a new group wait for each other (group.rs), each tells the others
//! which list it passed, so that lists that differ in their members fail on every member at
//! once instead of at the deadline. The members of one list meet in a check whose id comes from
//! the list's set and how many groups of that set the member made before; ranks whose lists
//! differ wait in different checks and never meet there. So a member that has waited a moment
//! sends its list, with that number, to the others of its list over a mailbox communicator (the
//! parent's members, an id of its own), and reads theirs. A list that names this rank, differs
//! from this rank's, and belongs to a creation this rank has not made yet is a mismatch (one
//! this rank made already is an old message). The rank that sees it fails its own check and
//! tells the members it has no conflict with; the other side sees the same conflict from its
//! end. A quick, healthy creation sends nothing.

use std::collections::HashMap;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{derive_id, CommInner};
use crate::collectives::Ctx;
use crate::error::{Error, ErrorKind};
use crate::sync::Locked;
use crate::wire::FrameKind;

/// How long members wait for each other before they exchange their lists.
const GRACE: Duration = Duration::from_millis(100);
/// How often a waiting member reads the lists sent to it.
const POLL: Duration = Duration::from_millis(20);
/// Marks the error of lists that differ (group.rs keeps its text).
pub(super) const LISTS_DIFFER: &str = "the members' lists differ";

/// The last list each member sent (by its rank in the parent), with the number of its
/// creation among those of the list's set. Kept across creations: an old one is told by its
/// number.
#[derive(Default)]
pub(super) struct Known(HashMap<u32, (u64, Vec<u32>)>);

/// The key under which group.rs counts the creations of `list`'s set.
pub(super) fn set_key(list: &[u32]) -> Vec<u32> {
    let mut set = list.to_vec();
    set.sort_unstable();
    [u32::MAX].into_iter().chain(set).collect()
}

/// Whether `entry` (a member's list and the number of its creation) names `me`, differs from
/// `mine` and belongs to a creation that `made` (how many creations of a set this rank has
/// made) does not cover.
fn differs(me: u32, mine: &[u32], entry: &(u64, Vec<u32>), made: &dyn Fn(&[u32]) -> u64) -> bool {
    let (nth, list) = entry;
    list.contains(&me) && list.as_slice() != mine && *nth > made(list)
}

/// The first member of `mine` whose known list [`differs`], with that list.
fn conflict(
    me: u32,
    mine: &[u32],
    known: &HashMap<u32, (u64, Vec<u32>)>,
    made: &dyn Fn(&[u32]) -> u64,
) -> Option<(u32, Vec<u32>)> {
    mine.iter()
        .filter(|&&m| m != me)
        .find_map(|m| known.get(m).filter(|e| differs(me, mine, e, made)).map(|(_, l)| (*m, l.clone())))
}

fn differ_error(me: u32, mine: &[u32], other: u32, theirs: &[u32]) -> Error {
    Error::new(
        ErrorKind::Mismatch,
        format!(
            "new_group: {LISTS_DIFFER}: rank {other} passed {theirs:?}, rank {me} passed {mine:?}; every member \
             must pass the same list (its order gives the new ranks)"
        ),
    )
}

/// A member's exchange of lists for one group creation, running beside its wait in the check.
pub(super) struct Watch {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    /// Starts the exchange of `list` (this rank's, in the parent's numbering) while this rank
    /// waits in `check` (the members of the list's set).
    pub(super) fn start(parent: &Arc<CommInner>, list: &[u32], nth: u64, check: &Arc<CommInner>) -> Watch {
        let (tx, rx) = mpsc::channel();
        let (parent, check, list) = (parent.clone(), check.clone(), list.to_vec());
        let thread = std::thread::Builder::new()
            .name("hccn-group".into())
            .spawn(move || exchange(&parent, &list, nth, &check, &rx))
            .ok();
        Watch { stop: Some(tx), thread }
    }

    /// Ends the exchange once this rank's check is over.
    pub(super) fn finish(mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn exchange(parent: &Arc<CommInner>, list: &[u32], nth: u64, check: &Arc<CommInner>, stop: &mpsc::Receiver<()>) {
    if stop.recv_timeout(GRACE) != Err(mpsc::RecvTimeoutError::Timeout) {
        return;
    }
    let me = parent.rank;
    let others: Vec<u32> = list.iter().copied().filter(|&m| m != me).collect();
    let mailbox = parent.mailbox();
    for &m in &others {
        send_list(&mailbox, m, nth, list);
    }
    let made = |l: &[u32]| parent.group_seq.locked().get(&set_key(l)).copied().unwrap_or(0);
    loop {
        for &m in &others {
            read_lists(parent, &mailbox, m);
        }
        let known = std::mem::take(&mut parent.group_intents.locked().0);
        let found = conflict(me, list, &known, &made);
        // Members whose lists conflict with this one see it themselves, and are in another check.
        let skip: Vec<u32> = others
            .iter()
            .filter(|m| known.get(m).is_some_and(|e| differs(me, list, e, &made)))
            .map(|&m| parent.members[m as usize])
            .collect();
        parent.group_intents.locked().0.extend(known);
        if let Some((other, theirs)) = found {
            check.tell_abandoned_except(0, &differ_error(me, list, other, &theirs), &skip);
            return;
        }
        if stop.recv_timeout(POLL) != Err(mpsc::RecvTimeoutError::Timeout) {
            return;
        }
    }
}

/// Sends `list` and the number of its creation to member `m` of the parent: the number and
/// the list's length, then its ranks.
fn send_list(mailbox: &CommInner, m: u32, nth: u64, list: &[u32]) {
    let mut head = nth.to_le_bytes().to_vec();
    head.extend_from_slice(&(list.len() as u32).to_le_bytes());
    let bytes: Vec<u8> = list.iter().flat_map(|r| r.to_le_bytes()).collect();
    for frame in [head, bytes] {
        let seq = mailbox.next_p2p(true, m);
        let _ = Ctx::new(mailbox, FrameKind::P2p, seq).send(m, 0, &frame);
    }
}

/// Reads whatever lists member `m` sent since the last read (the mailbox's waits are short).
fn read_lists(parent: &CommInner, mailbox: &CommInner, m: u32) {
    loop {
        let seq = mailbox.p2p_seq.locked().1[m as usize];
        let Ok(head) = Ctx::new(mailbox, FrameKind::P2p, seq).recv(m, 0, 12) else { return };
        mailbox.next_p2p(false, m);
        let nth = u64::from_le_bytes([head[0], head[1], head[2], head[3], head[4], head[5], head[6], head[7]]);
        let n = u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize;
        // Sent right behind its head.
        let until = Instant::now() + Duration::from_secs(2);
        let seq = mailbox.p2p_seq.locked().1[m as usize];
        let bytes = loop {
            match Ctx::new(mailbox, FrameKind::P2p, seq).recv(m, 0, 4 * n) {
                Ok(b) => break b,
                Err(e) if e.kind() == ErrorKind::Timeout && Instant::now() < until => continue,
                Err(_) => return,
            }
        };
        mailbox.next_p2p(false, m);
        let list = bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        parent.group_intents.locked().0.insert(m, (nth, list));
    }
}

impl CommInner {
    /// The mailbox of group creations: the parent's members under an id of their own, with
    /// waits of a few milliseconds (a read looks whether something arrived).
    fn mailbox(&self) -> Arc<CommInner> {
        self.group_mailbox
            .get_or_init(|| {
                let id = derive_id(&[&self.id.to_le_bytes(), b"group-mailbox"]);
                let mut setup = self.setup();
                setup.timeout = Duration::from_millis(2);
                Arc::new(CommInner::new(self.net.clone(), id, self.epoch, self.rank, self.members.clone(), setup))
            })
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(entries: &[(u32, u64, &[u32])]) -> HashMap<u32, (u64, Vec<u32>)> {
        entries.iter().map(|(m, n, l)| (*m, (*n, l.to_vec()))).collect()
    }

    #[test]
    fn a_list_that_names_this_rank_and_differs_is_a_conflict() {
        let k = known(&[(1, 1, &[0, 1, 2]), (2, 1, &[0, 1])]);
        let none = |_: &[u32]| 0;
        assert_eq!(conflict(0, &[0, 1], &k, &none), Some((1, vec![0, 1, 2])));
        assert_eq!(conflict(0, &[0, 1, 2], &k, &none), Some((2, vec![0, 1])));
        // The same set in another order is a conflict too.
        assert_eq!(conflict(0, &[1, 0], &known(&[(1, 1, &[0, 1])]), &none), Some((1, vec![0, 1])));
    }

    #[test]
    fn equal_lists_lists_without_this_rank_and_old_creations_are_no_conflict() {
        let none = |_: &[u32]| 0;
        assert_eq!(conflict(0, &[0, 1, 2], &known(&[(1, 1, &[0, 1, 2]), (2, 1, &[1, 2, 3])]), &none), None);
        assert_eq!(conflict(0, &[0, 1, 2], &HashMap::new(), &none), None);
        // Rank 1's list of a creation of {0, 1, 2} this rank made already.
        let made_one = |l: &[u32]| u64::from(set_key(l) == set_key(&[0, 1, 2]));
        assert_eq!(conflict(0, &[0, 1], &known(&[(1, 1, &[2, 1, 0])]), &made_one), None);
        assert_eq!(conflict(0, &[0, 1], &known(&[(1, 2, &[2, 1, 0])]), &made_one), Some((1, vec![2, 1, 0])));
    }
}
