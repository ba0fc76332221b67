//! LRU at every large capacity in one pass: the trie LRU is a stack algorithm there (Mattson,
//! Gecsei, Slutz and Traiger, 1970), so one walk over the events gives each block's stack
//! distance, and a block hits at capacity C exactly when its distance is at most C.
//!
//! Why this equals [`super::policy::TrieCache`]'s LRU, step for step, when C is at least the
//! longest pass (every pass a path from the root, as [`super::policy::EventBuilder`] makes them):
//!
//! - No pass is cut short. When the cache is full and a pass inserts its k-th node, k - 1 ≤ C - 1
//!   of the C cached nodes are on its path; the deepest cached node off the path is a leaf and
//!   unprotected, so an eviction always succeeds, and a node's parent is always cached (a hit,
//!   or inserted just before). After a pass, its whole path is cached.
//! - The victim is the cached node of lowest rank, where a node ranks by the last pass whose
//!   path holds it, then shallower first. A leaf's clock is the newest of its subtree (a pass
//!   touches a node's ancestors before it), every pass through a node passes through its
//!   parent, so the oldest leaf is the lowest node in that order; the current pass's nodes rank
//!   highest, which is their protection. The rank does not depend on C.
//! - Then, by induction over the passes, the cache of C blocks holds the C highest-ranked nodes
//!   seen so far, and a node is cached at the start of a pass when fewer than C nodes rank above
//!   it. Above a node x last used by pass q stand every node used by a later pass, and x's
//!   ancestors that pass q used last too (they are a run of the path: along a path, the last
//!   uses never grow with depth).
//!
//! The capacities below the longest pass are replayed: there a pass can be cut, and the cut
//! depends on C. `tests` checks both ways agree on generated traces and capacities.

use super::policy::Event;

/// "Never used": a node seen in no pass yet.
const NEVER: u32 = u32::MAX;

/// One capacity's figures from the one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapacityTotals {
    pub hit_tokens: u64,
    pub same_conversation_tokens: u64,
    /// The pass during which the cache first filled up.
    pub full_since: Option<u64>,
}

/// The longest pass, if every pass of `events` (delimited by `starts`) is a path from the root of
/// `parents`; `None` when one is not (then every capacity is replayed).
pub fn longest_root_path(parents: &[u32], events: &[Event], starts: &[usize]) -> Option<usize> {
    let mut longest = 0;
    for bounds in starts.windows(2) {
        let pass = events.get(bounds[0]..bounds[1])?;
        let mut parent = 0u32;
        for event in pass {
            if parents.get(event.node() as usize) != Some(&parent) {
                return None;
            }
            parent = event.node();
        }
        longest = longest.max(pass.len());
    }
    Some(longest)
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

/// LRU over every pass of `events`, at each of `capacities` (ascending, each at least the longest
/// pass as [`longest_root_path`] gives it, and above 0); only the passes `counted` says count.
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
    for pass in 0..passes {
        let path = &events[starts[pass]..starts[pass + 1]];
        let counts = counted(pass);
        // The path's last uses fall with depth, in runs of one pass each.
        let mut run_pass = NEVER;
        let mut run_start = 0;
        let mut ranked_above = 0u64;
        let mut fresh = 0u64;
        for (depth, event) in path.iter().enumerate() {
            let node = event.node() as usize;
            let last = last_use.get(node).copied().unwrap_or(NEVER);
            last_use[node] = u32::try_from(pass).unwrap_or(NEVER - 1);
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
            if counts {
                let distance = ranked_above + (depth - run_start) as u64 + 1;
                let first = capacities.partition_point(|&c| c < distance);
                if first < capacities.len() {
                    hit_from[first] += u64::from(event.tokens);
                    if event.seen_in_conversation() {
                        same_from[first] += u64::from(event.tokens);
                    }
                }
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
        let mut state = seed | 1;
        let mut next = move |bound: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % bound
        };
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
    fn equals_the_replay_at_every_capacity_from_the_longest_pass() {
        for seed in 1..40u64 {
            let (parents, events, starts) = generated(seed, 300);
            let longest = longest_root_path(&parents, &events, &starts).expect("paths");
            let capacities: Vec<u64> = [0, 1, 2, 5, 17, 60, 250, 5000]
                .iter()
                .map(|&extra| longest as u64 + extra)
                .collect();
            let warmup = 100;
            let counted = |pass: usize| pass >= warmup;
            let stacked = lru_stack(parents.len(), &events, &starts, &capacities, counted);
            // Evictions at the smaller capacities: the figures grow with the capacity.
            assert!(stacked[0].hit_tokens < stacked[7].hit_tokens, "seed {seed}");
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
        assert_eq!(longest_root_path(&parents, &path, &[0, 2]), Some(2));
        let skipped = [Event::new(2, 1, false)];
        assert_eq!(longest_root_path(&parents, &skipped, &[0, 1]), None);
        let unknown = [Event::new(9, 1, false)];
        assert_eq!(longest_root_path(&parents, &unknown, &[0, 1]), None);
    }
}
