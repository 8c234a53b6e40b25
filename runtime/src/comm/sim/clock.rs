//! Simulated time: an event queue ordered by time (ties in the order events were made), a
//! seeded generator, and the binary trees that notices and votes travel along.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::time::Duration;

/// Simulated time, in nanoseconds since the job started.
pub(super) type Nanos = u64;

pub(super) fn ns(d: Duration) -> Nanos {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// xorshift64*: deterministic and dependency-free.
pub(super) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed, so that neighbouring seeds start far apart.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)).max(1))
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// `base` moved by a uniform amount in `-spread..=spread`, at least 1 ns.
    pub fn around(&mut self, base: Nanos, spread: Nanos) -> Nanos {
        let offset = self.below(2 * spread + 1);
        (base + offset).saturating_sub(spread).max(1)
    }
}

/// A heap entry: the event itself waits in a slot, so that the heap moves 24 bytes, not a
/// message.
#[derive(PartialEq, Eq)]
struct Entry {
    at: Nanos,
    seq: u64,
    slot: usize,
}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Reversed: the heap's top is the earliest event.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Events by time; events of the same time in the order they were made.
pub(super) struct Queue<E> {
    heap: BinaryHeap<Entry>,
    slots: Vec<Option<E>>,
    free: Vec<usize>,
    made: u64,
}

impl<E> Queue<E> {
    pub fn new() -> Self {
        Queue { heap: BinaryHeap::new(), slots: Vec::new(), free: Vec::new(), made: 0 }
    }

    pub fn push(&mut self, at: Nanos, ev: E) {
        self.made += 1;
        self.insert(at, self.made, ev);
    }

    fn insert(&mut self, at: Nanos, seq: u64, ev: E) {
        let slot = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(ev);
                i
            }
            None => {
                self.slots.push(Some(ev));
                self.slots.len() - 1
            }
        };
        self.heap.push(Entry { at, seq, slot });
    }

    pub fn pop(&mut self) -> Option<(Nanos, E)> {
        let e = self.heap.pop()?;
        self.free.push(e.slot);
        let ev = self.slots[e.slot].take()?;
        Some((e.at, ev))
    }
}

/// A binary tree over a set of ranks laid out in ring order from a root: position `p` is
/// `ranks[(root + p) % len]`, its children are positions `2p + 1` and `2p + 2` (the shape the
/// agreement's COMMIT relay already uses). Every rank that knows the set and the root computes
/// the same tree, so a notice or vote needs to carry only those.
#[derive(Debug)]
pub(super) struct Tree {
    /// Ascending, each once.
    ranks: Vec<u32>,
    root: usize,
}

impl Tree {
    /// `ranks` ascending; `None` when `root` is not among them.
    pub fn new(ranks: Vec<u32>, root: u32) -> Option<Tree> {
        let root = ranks.binary_search(&root).ok()?;
        Some(Tree { ranks, root })
    }

    pub fn root(&self) -> u32 {
        self.ranks[self.root]
    }

    pub fn position(&self, rank: u32) -> Option<usize> {
        let i = self.ranks.binary_search(&rank).ok()?;
        Some((i + self.ranks.len() - self.root) % self.ranks.len())
    }

    fn at(&self, p: usize) -> u32 {
        self.ranks[(self.root + p) % self.ranks.len()]
    }

    pub fn children(&self, p: usize) -> impl Iterator<Item = u32> + '_ {
        [2 * p + 1, 2 * p + 2].into_iter().filter(|&c| c < self.ranks.len()).map(|c| self.at(c))
    }

    pub fn parent(&self, p: usize) -> Option<u32> {
        (p > 0).then(|| self.at((p - 1) / 2))
    }

    /// The ranks at and below position `p`.
    pub fn subtree(&self, p: usize) -> Vec<u32> {
        let mut level = vec![p];
        let mut out = Vec::new();
        while !level.is_empty() {
            out.extend(level.iter().map(|&q| self.at(q)));
            level = level.iter().flat_map(|&q| [2 * q + 1, 2 * q + 2]).filter(|&c| c < self.ranks.len()).collect();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_from_any_root_reaches_every_rank_once() {
        let ranks: Vec<u32> = (0..20).filter(|r| r % 3 != 1).collect();
        for &root in &ranks {
            let t = Tree::new(ranks.clone(), root).expect("root is a member");
            assert_eq!(t.root(), root);
            let mut all = t.subtree(0);
            all.sort_unstable();
            assert_eq!(all, ranks, "root {root}");
            for &r in &ranks {
                let p = t.position(r).expect("member");
                for c in t.children(p) {
                    assert_eq!(t.parent(t.position(c).expect("member")), Some(r), "root {root}, rank {r}");
                }
            }
        }
        assert!(Tree::new(vec![1, 2], 3).is_none());
    }

    #[test]
    fn events_come_out_by_time_then_in_the_order_made() {
        let mut q = Queue::new();
        q.push(5, 'a');
        q.push(3, 'b');
        q.push(5, 'c');
        q.push(4, 'd');
        let order: Vec<char> = std::iter::from_fn(|| q.pop().map(|e| e.1)).collect();
        assert_eq!(order, ['b', 'd', 'a', 'c']);
    }
}
