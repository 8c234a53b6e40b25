//! What a rank knows of who reaches whom, and the choice of the ranks that go on after a
//! failure: the largest set of live members that all reach each other, evicting the fewest
//! ranks that explain every lost link (a minimum vertex cover of the lost links), ties broken
//! toward the lowest ranks; and the quorum rule that keeps two sides of a partition from both
//! going on. Pure functions of the knowledge, so that every rank that knows the same computes
//! the same.

use std::collections::{BTreeMap, BTreeSet};

/// Communicator ranks whose process is surely gone, and pairs of members that cannot reach
/// each other. Knowledge only grows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Knowledge {
    pub dead: BTreeSet<u32>,
    /// Lost links as (lower rank, higher rank).
    pub cuts: BTreeSet<(u32, u32)>,
}

impl Knowledge {
    pub fn cut(&mut self, a: u32, b: u32) {
        if a != b {
            self.cuts.insert((a.min(b), a.max(b)));
        }
    }

    /// Adds what `other` knows; true when anything was new.
    pub fn merge(&mut self, other: &Knowledge) -> bool {
        let before = self.dead.len() + self.cuts.len();
        self.dead.extend(&other.dead);
        self.cuts.extend(&other.cuts);
        self.dead.len() + self.cuts.len() != before
    }

    /// How much is known: grows with every fact learnt.
    pub fn size(&self) -> usize {
        self.dead.len() + self.cuts.len()
    }

    /// Live members whose link to `rank` is lost.
    fn cut_from(&self, rank: u32) -> impl Iterator<Item = u32> + '_ {
        self.cuts.iter().filter_map(move |&(a, b)| match (a == rank, b == rank) {
            (true, _) => Some(b),
            (_, true) => Some(a),
            _ => None,
        })
    }

    /// Whether `a` and `b` are both alive and their link is not known lost.
    pub fn reach(&self, a: u32, b: u32) -> bool {
        !self.dead.contains(&a) && !self.dead.contains(&b) && !self.cuts.contains(&(a.min(b), a.max(b)))
    }
}

/// Components of the lost-link graph up to this many ranks are solved exactly.
const EXACT_MAX: usize = 12;

/// The members of a communicator of `n` that go on: the live ranks minus the fewest whose
/// eviction leaves no lost link among the rest (ties: keep the lowest ranks), ascending.
pub(crate) fn kept(n: u32, k: &Knowledge) -> Vec<u32> {
    let alive = |r: &u32| *r < n && !k.dead.contains(r);
    let mut adj: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for &(a, b) in k.cuts.iter().filter(|(a, b)| alive(a) && alive(b)) {
        adj.entry(a).or_default().insert(b);
        adj.entry(b).or_default().insert(a);
    }
    let mut evicted = BTreeSet::new();
    for comp in components(&adj) {
        evicted.extend(cover(&comp, &adj));
    }
    (0..n).filter(|r| alive(r) && !evicted.contains(r)).collect()
}

/// The connected components of the lost-link graph, each ascending.
fn components(adj: &BTreeMap<u32, BTreeSet<u32>>) -> Vec<Vec<u32>> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for &start in adj.keys() {
        if !seen.insert(start) {
            continue;
        }
        let mut comp = vec![start];
        let mut i = 0;
        while i < comp.len() {
            for &next in &adj[&comp[i]] {
                if seen.insert(next) {
                    comp.push(next);
                }
            }
            i += 1;
        }
        comp.sort_unstable();
        out.push(comp);
    }
    out
}

/// A minimum set of `comp`'s ranks covering every lost link among them: exact for small
/// components (of the smallest covers, the one that keeps the lexicographically lowest ranks),
/// greedy above (most lost links first, the highest rank on ties) -- a partition into hosts,
/// the large case, is a complete bipartite graph, where that picks the smaller side exactly.
fn cover(comp: &[u32], adj: &BTreeMap<u32, BTreeSet<u32>>) -> Vec<u32> {
    if comp.len() <= EXACT_MAX {
        let edges: Vec<(usize, usize)> = comp
            .iter()
            .enumerate()
            .flat_map(|(i, a)| {
                adj[a].iter().filter(move |b| *b > a).filter_map(move |b| Some((i, comp.binary_search(b).ok()?)))
            })
            .collect();
        let covers = |mask: u32| edges.iter().all(|&(i, j)| mask & (1 << i) != 0 || mask & (1 << j) != 0);
        for size in 1..=comp.len() as u32 {
            // The kept set compared as a sorted list: lower ranks kept first.
            let best = (0u32..1 << comp.len())
                .filter(|m| m.count_ones() == size && covers(*m))
                .min_by_key(|m| (0..comp.len()).filter(|i| m & (1 << i) == 0).collect::<Vec<_>>());
            if let Some(m) = best {
                return (0..comp.len()).filter(|i| m & (1 << i) != 0).map(|i| comp[i]).collect();
            }
        }
        return comp.to_vec();
    }
    let mut left: BTreeMap<u32, BTreeSet<u32>> = comp.iter().map(|r| (*r, adj[r].clone())).collect();
    let mut out = Vec::new();
    while let Some((&r, _)) = left.iter().filter(|(_, n)| !n.is_empty()).max_by_key(|(r, n)| (n.len(), **r)) {
        let gone = left.remove(&r).unwrap_or_default();
        for other in gone {
            if let Some(set) = left.get_mut(&other) {
                set.remove(&r);
            }
        }
        out.push(r);
    }
    out
}

/// How a set of ranks stands against the members not surely dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Quorum {
    /// More than half: may go on.
    Majority,
    /// Exactly half: may go on only where a tie is broken (see [`may_go_on`]).
    Tie,
    Minority,
}

pub(crate) fn quorum(n: u32, k: &Knowledge, set: &[u32]) -> Quorum {
    let voters = (0..n).filter(|r| !k.dead.contains(r)).count();
    match (2 * set.len()).cmp(&voters) {
        std::cmp::Ordering::Greater => Quorum::Majority,
        std::cmp::Ordering::Equal => Quorum::Tie,
        std::cmp::Ordering::Less => Quorum::Minority,
    }
}

/// Whether `set` may go on: a majority of the members not surely dead; or exactly half when a
/// store breaks the tie (`store_decides`: the first half to record its decision wins) or when it
/// holds the lowest of those members.
pub(crate) fn may_go_on(n: u32, k: &Knowledge, set: &[u32], store_decides: bool) -> bool {
    match quorum(n, k, set) {
        Quorum::Majority => true,
        Quorum::Tie => store_decides || (0..n).find(|r| !k.dead.contains(r)).is_some_and(|low| set.contains(&low)),
        Quorum::Minority => false,
    }
}

/// Whether any set that keeps `me` could go on: false tells a rank on the small side of a
/// partition (or left behind while frozen) at once that it is out.
pub(crate) fn could_go_on(n: u32, k: &Knowledge, me: u32, store_decides: bool) -> bool {
    let cut: BTreeSet<u32> = k.cut_from(me).collect();
    let best: Vec<u32> = (0..n).filter(|r| !k.dead.contains(r) && !cut.contains(r)).collect();
    best.contains(&me) && may_go_on(n, k, &best, store_decides)
}

/// Knowledge of these dead ranks and cut links, for tests.
#[cfg(test)]
pub(crate) fn know(dead: &[u32], cuts: &[(u32, u32)]) -> Knowledge {
    let mut k = Knowledge { dead: dead.iter().copied().collect(), ..Knowledge::default() };
    cuts.iter().for_each(|&(a, b)| k.cut(a, b));
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kept_set_is_the_largest_that_all_reach_each_other_lowest_first() {
        type Case<'a> = (u32, &'a [u32], &'a [(u32, u32)], &'a [u32]);
        let cases: &[Case] = &[
            (4, &[], &[], &[0, 1, 2, 3]),
            (4, &[2], &[], &[0, 1, 3]),
            // One cut link of three hosts: two ranks stay, the lowest pair.
            (3, &[], &[(0, 1)], &[0, 2]),
            (3, &[], &[(1, 2)], &[0, 1]),
            (3, &[], &[(0, 2)], &[0, 1]),
            // A rank cut from everyone (frozen) is the one to go.
            (4, &[], &[(2, 0), (2, 1), (2, 3)], &[0, 1, 3]),
            // Two hosts of two: the half with rank 0.
            (4, &[], &[(0, 2), (0, 3), (1, 2), (1, 3)], &[0, 1]),
            // A path of lost links 0-1-2: evicting 1 alone explains both.
            (4, &[], &[(0, 1), (1, 2)], &[0, 2, 3]),
            // Dead ranks and their links do not count.
            (5, &[4], &[(4, 0), (1, 3)], &[0, 1, 2]),
        ];
        for &(n, dead, cuts, want) in cases {
            assert_eq!(kept(n, &know(dead, cuts)), want, "n {n}, dead {dead:?}, cuts {cuts:?}");
        }
    }

    #[test]
    fn a_large_partition_keeps_the_larger_side_and_on_a_tie_the_side_of_rank_0() {
        let bipartite = |a: std::ops::Range<u32>, b: std::ops::Range<u32>| {
            let mut k = Knowledge::default();
            for x in a.clone() {
                for y in b.clone() {
                    k.cut(x, y);
                }
            }
            k
        };
        assert_eq!(kept(64, &bipartite(0..32, 32..64)), (0..32).collect::<Vec<_>>());
        assert_eq!(kept(64, &bipartite(0..24, 24..64)), (24..64).collect::<Vec<_>>());
    }

    #[test]
    fn quorum_counts_the_members_not_surely_dead_and_breaks_ties_by_store_or_lowest_rank() {
        let k = know(&[], &[]);
        assert!(may_go_on(4, &k, &[0, 1, 3], false));
        assert!(may_go_on(4, &k, &[0, 1], false), "a tie with rank 0");
        assert!(!may_go_on(4, &k, &[2, 3], false), "a tie without rank 0 and no store");
        assert!(may_go_on(4, &k, &[2, 3], true), "a tie the store breaks");
        assert!(!may_go_on(4, &k, &[3], true));
        // The lone survivor of a crash goes on; of a freeze only if it holds the lowest rank.
        assert!(may_go_on(2, &know(&[1], &[]), &[0], false));
        assert!(may_go_on(2, &know(&[0], &[]), &[1], false));
        assert!(may_go_on(2, &know(&[], &[(0, 1)]), &[0], false));
        assert!(!may_go_on(2, &know(&[], &[(0, 1)]), &[1], false));
    }

    #[test]
    fn a_rank_cut_from_the_majority_knows_at_once_that_it_cannot_go_on() {
        // Rank 2 woke up from a freeze: every link is gone.
        let k = know(&[], &[(2, 0), (2, 1), (2, 3)]);
        assert!(!could_go_on(4, &k, 2, true));
        assert!(could_go_on(4, &k, 0, false));
        // The small side of a partition.
        let k = know(&[], &[(0, 3), (1, 3), (2, 3)]);
        assert!(!could_go_on(4, &k, 3, true));
        // A rank that lost one link of three may still be kept.
        assert!(could_go_on(3, &know(&[], &[(0, 1)]), 1, false));
    }
}
