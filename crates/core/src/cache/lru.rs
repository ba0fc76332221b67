//! `lru` at every capacity at once, one pass at a time. kvcache-simulator's trie LRU (see
//! [`super::policy`]) is nearly a stack algorithm (Mattson, Gecsei, Slutz and Traiger, 1970):
//! nodes rank by the last pass that used them (later ranks higher), then by depth (shallower
//! ranks higher), an order that does not depend on the capacity, and a cache of C blocks always
//! holds the top of that order: C nodes, or C - 1 after a pass longer than C, until a pass
//! inserts again. So one walk gives each block's stack distance (its place in the order), and a
//! block hits at capacity C when its distance is at most what C holds.
//!
//! Why, step for step against the replay (every pass a path from the root, as
//! [`super::policy::EventBuilder`] makes them):
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
//! `tests` holds the walk equal to a plain replay on generated tries, at capacities from one
//! block to more than all, so through passes longer than the cache.

use super::policy::{Event, Served};

/// "Never used": a node seen in no pass yet.
const NEVER: u32 = u32::MAX;

/// Counts of nodes by the pass that used them last, with prefix sums in O(log passes); one
/// more pass appended at a time.
#[derive(Debug, Clone)]
struct Fenwick {
    /// `tree[i]` sums the counts of passes `i - lowbit(i) .. i` (from 1; `tree[0]` unused).
    tree: Vec<i64>,
}

impl Fenwick {
    fn new() -> Fenwick {
        Fenwick { tree: vec![0] }
    }

    /// The sum of the first `len` passes' counts.
    fn sum_of_first(&self, len: usize) -> i64 {
        let mut i = len.min(self.tree.len() - 1);
        let mut sum = 0;
        while i > 0 {
            sum += self.tree[i];
            i -= i & i.wrapping_neg();
        }
        sum
    }

    /// The next pass's count.
    fn push(&mut self, count: i64) {
        let i = self.tree.len();
        let covered = i - (i & i.wrapping_neg());
        let entry = count + self.sum_of_first(i - 1) - self.sum_of_first(covered);
        self.tree.push(entry);
    }

    fn add(&mut self, pass: usize, delta: i64) {
        let mut i = pass + 1;
        while i < self.tree.len() {
            self.tree[i] += delta;
            i += i & i.wrapping_neg();
        }
    }

    /// Nodes whose last pass is at most `pass` (never negative: a node leaves only the pass
    /// that holds it).
    fn up_to(&self, pass: usize) -> u64 {
        u64::try_from(self.sum_of_first(pass + 1)).unwrap_or(0)
    }
}

/// `lru` at several capacities at once, fed one pass at a time (each a path from the root, as
/// [`super::policy::EventBuilder`] makes them). Memory: 4 bytes a node for every capacity
/// together, 8 a pass.
#[derive(Debug, Clone)]
pub struct Lru {
    /// The capacities, ascending and distinct.
    capacities: Vec<u64>,
    /// For each capacity as given, its place in `capacities`.
    given: Vec<usize>,
    /// How much of the top of the order each capacity holds: C, or C - 1 after a pass longer
    /// than C until a pass inserts again. Ascending, as the capacities are.
    held: Vec<u64>,
    last_use: Vec<u32>,
    by_last_use: Fenwick,
    /// Distinct nodes seen.
    seen: u64,
    passes: u64,
    full_since: Vec<Option<u64>>,
    /// Per pass: its blocks whose smallest capacity to hit is the k-th, then, summed, what the
    /// k-th capacity served.
    first_hits: Vec<Served>,
    /// Per pass: what each capacity as given served.
    served: Vec<Served>,
}

impl Lru {
    pub fn new(capacities: &[u64]) -> Lru {
        let mut sorted = capacities.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        let given = capacities
            .iter()
            .map(|c| sorted.partition_point(|s| s < c))
            .collect();
        Lru {
            held: sorted.clone(),
            full_since: vec![None; sorted.len()],
            first_hits: vec![Served::default(); sorted.len()],
            served: vec![Served::default(); capacities.len()],
            capacities: sorted,
            given,
            last_use: Vec::new(),
            by_last_use: Fenwick::new(),
            seen: 0,
            passes: 0,
        }
    }

    /// The pass during which each capacity as given first filled up (a capacity of 0 never
    /// does).
    pub fn full_since(&self) -> Vec<Option<u64>> {
        self.given.iter().map(|&k| self.full_since[k]).collect()
    }

    /// Serves one pass (`node_count`: the nodes known so far): what each capacity as given
    /// served.
    pub fn serve(&mut self, node_count: usize, path: &[Event]) -> &[Served] {
        let pass = usize::try_from(self.passes).unwrap_or(usize::MAX);
        if self.last_use.len() < node_count {
            self.last_use.resize(node_count, NEVER);
        }
        self.first_hits.fill(Served::default());
        // The path's last uses fall with depth, in runs of one pass each.
        let mut run_pass = NEVER;
        let mut run_start = 0;
        let mut ranked_above = 0u64;
        let mut fresh = 0u64;
        for (depth, event) in path.iter().enumerate() {
            let Some(slot) = self.last_use.get_mut(event.node() as usize) else {
                continue;
            };
            let last = std::mem::replace(slot, u32::try_from(pass).unwrap_or(NEVER - 1));
            if last == NEVER {
                fresh += 1;
                continue;
            }
            if last != run_pass {
                if run_pass != NEVER {
                    self.by_last_use
                        .add(run_pass as usize, -((depth - run_start) as i64));
                }
                run_pass = last;
                run_start = depth;
                ranked_above = self.seen - self.by_last_use.up_to(last as usize);
            }
            let distance = ranked_above + (depth - run_start) as u64 + 1;
            let first = self.held.partition_point(|&h| h < distance);
            if let Some(first_hit) = self.first_hits.get_mut(first) {
                first_hit.hit(event);
            }
        }
        let length = path.len() as u64;
        let mut hits = Served::default();
        for (k, &capacity) in self.capacities.iter().enumerate() {
            hits.add(self.first_hits[k]);
            self.first_hits[k] = hits;
            let hit_blocks = u64::from(hits.hit_blocks);
            if length > capacity {
                self.held[k] = if hit_blocks >= capacity {
                    capacity
                } else {
                    capacity - 1
                };
            } else if length > hit_blocks {
                self.held[k] = capacity;
            }
        }
        if run_pass != NEVER {
            let run_end = path.len() - fresh as usize;
            self.by_last_use
                .add(run_pass as usize, -((run_end - run_start) as i64));
        }
        self.by_last_use.push(path.len() as i64);
        self.seen += fresh;
        for (k, &capacity) in self.capacities.iter().enumerate() {
            if capacity > 0 && self.seen >= capacity && self.full_since[k].is_none() {
                self.full_since[k] = Some(self.passes);
            }
        }
        self.passes += 1;
        for (served, &k) in self.served.iter_mut().zip(&self.given) {
            *served = self.first_hits[k];
        }
        &self.served
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::cache::policy::EventBuilder;
    use crate::cache::{Block, Request};

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

    /// kvcache-simulator's LRU as [`crate::cache::policy`] states it, replayed plainly: a clock
    /// bumped on every touch, the hits protected, the unprotected cached leaf with the oldest
    /// clock evicted, a node inserted only under a cached parent, the rest of the pass dropped
    /// when one cannot be. Each pass's hits and, at the end, when the cache first filled up.
    fn replayed(
        parents: &[u32],
        events: &[Event],
        starts: &[usize],
        capacity: usize,
    ) -> (Vec<Served>, Option<u64>) {
        let mut cached = vec![false; parents.len()];
        cached[0] = true;
        let mut children = vec![0u32; parents.len()];
        let mut clock_of = vec![0u64; parents.len()];
        let (mut clock, mut size, mut full_since) = (0u64, 0usize, None);
        let mut per_pass = Vec::new();
        for (pass, bounds) in starts.windows(2).enumerate() {
            let path = &events[bounds[0]..bounds[1]];
            let mut served = Served::default();
            if capacity == 0 {
                per_pass.push(served);
                continue;
            }
            let hits = path
                .iter()
                .take_while(|e| cached[e.node() as usize])
                .count();
            for event in &path[..hits] {
                clock += 1;
                clock_of[event.node() as usize] = clock;
                served.hit(event);
            }
            let protected: Vec<u32> = path[..hits].iter().map(|e| e.node()).collect();
            for event in &path[hits..] {
                let node = event.node() as usize;
                if size >= capacity {
                    let victim = (1..parents.len())
                        .filter(|&n| cached[n] && children[n] == 0)
                        .filter(|&n| !protected.contains(&(n as u32)))
                        .min_by_key(|&n| clock_of[n]);
                    let Some(victim) = victim else { break };
                    cached[victim] = false;
                    children[parents[victim] as usize] -= 1;
                    size -= 1;
                }
                let parent = parents[node] as usize;
                if !cached[parent] {
                    break;
                }
                cached[node] = true;
                children[parent] += 1;
                size += 1;
                clock += 1;
                clock_of[node] = clock;
                if size >= capacity && full_since.is_none() {
                    full_since = Some(pass as u64);
                }
            }
            per_pass.push(served);
        }
        (per_pass, full_since)
    }

    #[test]
    fn equals_the_replay_at_every_capacity_and_pass() {
        for seed in 1..40u64 {
            let (parents, events, starts) = generated(seed, 300);
            // Passes are 1 to 12 blocks long: the small capacities see passes longer than
            // themselves, back to back and between shorter ones. Unsorted, with a repeat and 0.
            let capacities = [5u64, 1, 2, 3, 4, 0, 7, 9, 11, 12, 13, 17, 60, 250, 5000, 7];
            let mut lru = Lru::new(&capacities);
            let walked: Vec<Vec<Served>> = starts
                .windows(2)
                .map(|pass| lru.serve(parents.len(), &events[pass[0]..pass[1]]).to_vec())
                .collect();
            let full_since = lru.full_since();
            let total = |k: usize| walked.iter().map(|p| p[k].hit_tokens).sum::<u64>();
            // Evictions at the smaller capacities: the figures grow with the capacity.
            assert!(total(1) < total(14), "seed {seed}");
            for (k, &capacity) in capacities.iter().enumerate() {
                let (replay, replay_full) = replayed(&parents, &events, &starts, capacity as usize);
                let walk: Vec<Served> = walked.iter().map(|p| p[k]).collect();
                assert_eq!(walk, replay, "seed {seed}, capacity {capacity}");
                assert_eq!(
                    full_since[k], replay_full,
                    "seed {seed}, capacity {capacity}"
                );
            }
        }
    }

    fn serve_ids(lru: &mut Lru, builder: &mut EventBuilder, ids: &[u64]) -> u64 {
        let request = Request {
            blocks: ids.iter().map(|&id| Block { id, tokens: 1 }).collect(),
            ..Request::default()
        };
        let mut events = Vec::new();
        builder.push(&request, &mut events);
        lru.serve(builder.node_count(), &events)[0].hit_tokens
    }

    #[test]
    fn lru_refreshes_on_hits_and_evicts_leaves_only() {
        let mut b = EventBuilder::new();
        let mut lru = Lru::new(&[2]);
        let mut serve = |ids: &[u64]| serve_ids(&mut lru, &mut b, ids);
        assert_eq!(serve(&[1]), 0);
        assert_eq!(serve(&[2]), 0);
        assert_eq!(serve(&[1]), 1); // 1 is now newer than 2
        assert_eq!(serve(&[3]), 0); // evicts 2
        assert_eq!(serve(&[1]), 1);
        assert_eq!(serve(&[2]), 0);
    }

    #[test]
    fn lru_protects_only_what_was_cached_before_the_request() {
        let mut b = EventBuilder::new();
        let mut lru = Lru::new(&[2]);
        // Capacity 2: 1 and 2 go in. 3 needs a victim: 2, inserted by this very request, is not
        // protected (the reference marks before inserting), so it goes, and then 3's parent is
        // missing and the rest of the request is dropped.
        assert_eq!(serve_ids(&mut lru, &mut b, &[1, 2, 3]), 0);
        assert_eq!(serve_ids(&mut lru, &mut b, &[1, 2, 3]), 1);
        // The same again: 2 goes in and is the victim for 3. The request never caches past 1.
        assert_eq!(serve_ids(&mut lru, &mut b, &[1, 2, 3]), 1);
    }

    #[test]
    fn the_pass_counts_grow_past_every_power_of_two() {
        let mut fenwick = Fenwick::new();
        let counts: Vec<i64> = (0..300).map(|i| (i * 7 % 13) as i64).collect();
        for &count in &counts {
            fenwick.push(count);
        }
        fenwick.add(100, -3);
        let mut expected = counts.clone();
        expected[100] -= 3;
        for pass in 0..counts.len() {
            let sum: i64 = expected[..=pass].iter().sum();
            assert_eq!(fenwick.up_to(pass), sum as u64, "pass {pass}");
        }
    }
}
