//! LRU at every capacity in one walk over the events. The trie LRU is nearly a stack algorithm
//! (Mattson, Gecsei, Slutz and Traiger, 1970): nodes rank by the last pass that used them (later
//! ranks higher), then by depth (shallower ranks higher), an order that does not depend on the capacity, and a cache of C blocks
//! always holds the top of that order: C nodes, or C - 1 after a pass longer than C, until a
//! pass inserts again. So one walk gives each block's stack distance (its place in the order),
//! and a block hits at capacity C when its distance is at most what C holds.
//!
//! Why, step for step against [`super::policy::TrieCache`] (every pass a path from the root, as
//! [`super::policy::EventBuilder`] makes them; [`all_paths_from_root`] checks it):
//!
//! - The order. Every pass through a node passes through its parent, so a cached child ranks
//!   below its parent (an earlier last pass, or the same and deeper) and the lowest cached node
//!   is a leaf. Two leaves never share a last pass (both would be on that pass's path), and a
//!   pass touches a node's ancestors before it, so the lowest leaf is the one with the oldest
//!   clock: the one the replay evicts. The current pass's cached nodes are its hits, which rank
//!   highest: that is their protection.
//! - A pass of at most C nodes. When the cache is full and the pass inserts its k-th node,
//!   k - 1 ≤ C - 1 of the cached nodes are on its path, so the deepest cached node off the path
//!   is an unprotected leaf: every eviction succeeds and takes the lowest node, and every
//!   inserted node's parent is cached. After the pass the cache holds its path and the highest
//!   of the rest: the top C of the new order (or still the top C - 1, if it inserted nothing).
//! - A pass longer than C. Its insertions evict every node off its path, lowest first; then the
//!   only unprotected leaf is the node it inserted last, which goes, and the next node's parent
//!   is gone, so the pass stops: the cache holds the path's first C - 1 nodes, the top C - 1 of
//!   the new order. If its hits alone fill the cache, nothing can be evicted and it keeps those
//!   C.
//! - By induction over the passes, a node is cached at a pass's start when its place in the
//!   order is within what the cache holds. Above a node x last used by pass q stand every node a
//!   later pass used, and x's ancestors that pass q used last too (a run of the path: along a
//!   path the last uses never grow with depth).
//!
//! `tests` holds the walk equal to the replay on generated tries, at capacities from one block
//! to more than all, so through passes longer than the cache.

use super::CapacityTotals;
use super::policy::Event;

/// "Never used": a node seen in no pass yet.
const NEVER: u32 = u32::MAX;

/// Whether every pass of `events` (delimited by `starts`) is a path from the root of `parents`
/// (else every capacity is replayed).
pub fn all_paths_from_root(parents: &[u32], events: &[Event], starts: &[usize]) -> bool {
    starts.windows(2).all(|bounds| {
        let Some(pass) = events.get(bounds[0]..bounds[1]) else {
            return false;
        };
        let mut parent = 0u32;
        pass.iter().all(|event| {
            let on_path = event.node() != 0 && parents.get(event.node() as usize) == Some(&parent);
            parent = event.node();
            on_path
        })
    })
}

/// Counts of nodes by the pass that used them last, with prefix sums in O(log passes).
struct Fenwick {
    tree: Vec<i64>,
}

impl Fenwick {
    fn new(len: usize) -> Fenwick {
        Fenwick {
            tree: vec![0; len + 1],
        }
    }

    fn add(&mut self, index: usize, delta: i64) {
        let mut i = index + 1;
        while i < self.tree.len() {
            self.tree[i] += delta;
            i += i & i.wrapping_neg();
        }
    }

    /// Nodes whose last pass is at most `index`.
    fn prefix(&self, index: usize) -> u64 {
        let mut i = (index + 1).min(self.tree.len() - 1);
        let mut sum = 0i64;
        while i > 0 {
            sum += self.tree[i];
            i -= i & i.wrapping_neg();
        }
        // Never negative: a node leaves only the pass that holds it.
        u64::try_from(sum).unwrap_or(0)
    }
}

/// LRU over every pass of `events` (paths from the root: [`all_paths_from_root`]), at each of
/// `capacities` (ascending, distinct, each above 0); only the passes `counted` says count.
/// Returns one [`CapacityTotals`] per capacity, in order.
pub fn lru_stack(
    node_count: usize,
    events: &[Event],
    starts: &[usize],
    capacities: &[u64],
    counted: impl Fn(usize) -> bool,
) -> Vec<CapacityTotals> {
    let passes = starts.len().saturating_sub(1);
    let mut last_use = vec![NEVER; node_count];
    let mut by_last_use = Fenwick::new(passes);
    let mut seen: u64 = 0;
    // Hits first counted at capacity k: a block hits at k and every larger one.
    let mut hit_from = vec![0u64; capacities.len()];
    let mut same_from = vec![0u64; capacities.len()];
    let mut full_since = vec![None; capacities.len()];
    let mut not_full = 0;
    // How much of the top of the order each capacity holds: C, or C - 1 after a pass longer
    // than C until a pass inserts again. Ascending, as the capacities are.
    let mut held: Vec<u64> = capacities.to_vec();
    // Per pass: its blocks whose smallest capacity to hit is the k-th.
    let mut first_hits = vec![0u64; capacities.len()];
    for pass in 0..passes {
        let path = &events[starts[pass]..starts[pass + 1]];
        let length = path.len() as u64;
        let counts = counted(pass);
        // The path's last uses fall with depth, in runs of one pass each.
        let mut run_pass = NEVER;
        let mut run_start = 0;
        let mut ranked_above = 0u64;
        let mut fresh = 0u64;
        first_hits.fill(0);
        for (depth, event) in path.iter().enumerate() {
            // Every node is below `node_count` (the paths are checked against the parents).
            let Some(slot) = last_use.get_mut(event.node() as usize) else {
                continue;
            };
            let last = std::mem::replace(slot, u32::try_from(pass).unwrap_or(NEVER - 1));
            if last == NEVER {
                fresh += 1;
                continue;
            }
            if last != run_pass {
                if run_pass != NEVER {
                    by_last_use.add(run_pass as usize, -((depth - run_start) as i64));
                }
                run_pass = last;
                run_start = depth;
                ranked_above = seen - by_last_use.prefix(last as usize);
            }
            let distance = ranked_above + (depth - run_start) as u64 + 1;
            let first = held.partition_point(|&h| h < distance);
            if first < capacities.len() {
                first_hits[first] += 1;
                if counts {
                    hit_from[first] += u64::from(event.tokens);
                    if event.seen_in_conversation() {
                        same_from[first] += u64::from(event.tokens);
                    }
                }
            }
        }
        let mut hits = 0;
        for (k, &capacity) in capacities.iter().enumerate() {
            hits += first_hits[k];
            if length > capacity {
                held[k] = if hits >= capacity {
                    capacity
                } else {
                    capacity - 1
                };
            } else if length > hits {
                held[k] = capacity;
            }
        }
        if run_pass != NEVER {
            let run_end = path.len() - fresh as usize;
            by_last_use.add(run_pass as usize, -((run_end - run_start) as i64));
        }
        by_last_use.add(pass, path.len() as i64);
        seen += fresh;
        while not_full < capacities.len() && seen >= capacities[not_full] {
            full_since[not_full] = Some(pass as u64);
            not_full += 1;
        }
    }
    let (mut hits, mut same) = (0, 0);
    (0..capacities.len())
        .map(|k| {
            hits += hit_from[k];
            same += same_from[k];
            CapacityTotals {
                hit_tokens: hits,
                same_conversation_tokens: same,
                full_since: full_since[k],
            }
        })
        .collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::cache::policy::TrieCache;

    /// A small trie walked by random paths: many shared prefixes, evictions at every capacity.
    pub(in crate::cache) fn generated(
        seed: u64,
        passes: usize,
    ) -> (Vec<u32>, Vec<Event>, Vec<usize>) {
        let mut rng = crate::test_support::Xorshift::new(seed);
        let mut next = move |bound: u64| rng.below(bound);
        let mut parents = vec![0u32];
        let mut children: Vec<Vec<u32>> = vec![Vec::new()];
        let mut events = Vec::new();
        let mut starts = vec![0];
        for _ in 0..passes {
            let length = 1 + next(12) as usize;
            let mut node = 0u32;
            for _ in 0..length {
                let kids = &children[node as usize];
                let child = if kids.is_empty() || next(3) == 0 {
                    let child = parents.len() as u32;
                    parents.push(node);
                    children.push(Vec::new());
                    children[node as usize].push(child);
                    child
                } else {
                    kids[next(kids.len() as u64) as usize]
                };
                events.push(Event::new(child, 1 + next(512) as u32, next(2) == 0));
                node = child;
            }
            starts.push(events.len());
        }
        (parents, events, starts)
    }

    fn replayed(
        parents: &[u32],
        events: &[Event],
        starts: &[usize],
        capacity: u64,
        counted: impl Fn(usize) -> bool,
    ) -> CapacityTotals {
        let mut cache = TrieCache::lru(capacity as usize);
        let mut totals = CapacityTotals::default();
        for pass in 0..starts.len() - 1 {
            let served = cache.serve(parents, &events[starts[pass]..starts[pass + 1]], &[]);
            if counted(pass) {
                totals.hit_tokens += served.hit_tokens;
                totals.same_conversation_tokens += served.same_conversation_tokens;
            }
        }
        totals.full_since = cache.full_since();
        totals
    }

    #[test]
    fn equals_the_replay_at_every_capacity() {
        for seed in 1..40u64 {
            let (parents, events, starts) = generated(seed, 300);
            assert!(all_paths_from_root(&parents, &events, &starts));
            // Passes are 1 to 12 blocks long: the small capacities see passes longer than
            // themselves, back to back and between shorter ones.
            let capacities = [1u64, 2, 3, 4, 5, 7, 9, 11, 12, 13, 17, 60, 250, 5000];
            let warmup = 100;
            let counted = |pass: usize| pass >= warmup;
            let stacked = lru_stack(parents.len(), &events, &starts, &capacities, counted);
            // Evictions at the smaller capacities: the figures grow with the capacity.
            assert!(
                stacked[0].hit_tokens < stacked[13].hit_tokens,
                "seed {seed}"
            );
            for (&capacity, stack) in capacities.iter().zip(&stacked) {
                let replay = replayed(&parents, &events, &starts, capacity, counted);
                assert_eq!(*stack, replay, "seed {seed}, capacity {capacity}");
            }
        }
    }

    #[test]
    fn a_pass_that_is_not_a_path_from_the_root_is_refused() {
        let parents = vec![0, 0, 1];
        let path = [Event::new(1, 1, false), Event::new(2, 1, false)];
        assert!(all_paths_from_root(&parents, &path, &[0, 2]));
        let skipped = [Event::new(2, 1, false)];
        assert!(!all_paths_from_root(&parents, &skipped, &[0, 1]));
        let unknown = [Event::new(9, 1, false)];
        assert!(!all_paths_from_root(&parents, &unknown, &[0, 1]));
    }
}
