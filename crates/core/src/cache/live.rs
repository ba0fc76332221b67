//! The live view's simulator: fed one request at a time, it keeps `ceiling`, `lru` and `fifo`
//! at each capacity up to date, as a cold replay (warmup does not apply to an open-ended stream:
//! the figures are over every request so far). It runs the same policy structs as the batch
//! profile, so after N requests it equals `profile` with `--warmup 0` on those N (tested).
//!
//! Cost per request: FIFO and the ceiling O(blocks); LRU O(blocks × log requests) for every
//! capacity at once. `optimal` needs the future: [`LiveSimulator::optimal_snapshot`] replays
//! what has arrived so far.

use super::policy::{
    Belady, Ceiling, Event, EventBuilder, EveryCapacity, Policy, Served, next_uses,
};
use super::profile::Point;
use super::{Capacity, Request};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Running {
    hit_tokens: u64,
    same_conversation_tokens: u64,
}

impl Running {
    fn add(&mut self, served: Served) {
        self.hit_tokens += served.hit_tokens;
        self.same_conversation_tokens += served.same_conversation_tokens;
    }
}

pub struct LiveSimulator {
    block_size: u32,
    capacities: Vec<Capacity>,
    builder: EventBuilder,
    ceiling: Ceiling,
    /// FIFO, then LRU, each at every capacity, with its totals per capacity.
    bounded: Vec<(Policy, EveryCapacity, Vec<Running>)>,
    ceiling_total: Running,
    /// The ceiling of the trace semantics: prompts only, replies never cached.
    prompts_ceiling: Ceiling,
    prompts_ceiling_total: Running,
    measured_tokens: u64,
    /// Every event so far, kept for the optimal snapshot (8 bytes per block), in passes as
    /// `profile::Passes` has them: a request's prompt, then what it leaves cached.
    events: Vec<Event>,
    starts: Vec<usize>,
    /// Each request's prompt events.
    request_ranges: Vec<std::ops::Range<usize>>,
    /// Per pass, whether it is a request's prompt (counted) or its reply.
    counted: Vec<bool>,
    scratch: Vec<Event>,
    reply_scratch: Vec<Event>,
    /// Tokens of the distinct blocks seen so far (the working set a cache would need for the
    /// ceiling).
    distinct_tokens: u64,
    /// The first `MAX_DESCRIBED` requests with their first parts only, in push order: what the
    /// top prefixes are made of (`profile`'s description).
    described: Vec<Request>,
}

/// Requests whose parts are kept for the top prefixes' descriptions (past them: not described).
pub(crate) const MAX_DESCRIBED: usize = 20_000;
/// Parts kept of each (a prefix shared by many requests is their first few parts).
const DESCRIBED_PARTS: usize = 8;

impl LiveSimulator {
    pub fn new(block_size: u32, capacities: Vec<Capacity>) -> LiveSimulator {
        LiveSimulator {
            block_size,
            bounded: bounded(&capacities),
            capacities,
            builder: EventBuilder::new(),
            ceiling: Ceiling::default(),
            ceiling_total: Running::default(),
            prompts_ceiling: Ceiling::default(),
            prompts_ceiling_total: Running::default(),
            measured_tokens: 0,
            events: Vec::new(),
            starts: vec![0],
            request_ranges: Vec::new(),
            counted: Vec::new(),
            scratch: Vec::new(),
            reply_scratch: Vec::new(),
            distinct_tokens: 0,
            described: Vec::new(),
        }
    }

    pub fn capacities(&self) -> &[Capacity] {
        &self.capacities
    }

    /// Tokens of every distinct block seen so far.
    pub fn distinct_tokens(&self) -> u64 {
        self.distinct_tokens
    }

    /// Simulates FIFO and LRU at `capacities` instead, over every request so far (replayed from
    /// the events kept: O(all blocks so far)); the ceiling is unchanged.
    pub fn set_capacities(&mut self, capacities: Vec<Capacity>) {
        self.bounded = bounded(&capacities);
        self.capacities = capacities;
        let nodes = self.builder.node_count();
        for (window, &counted) in self.starts.windows(2).zip(&self.counted) {
            let events = &self.events[window[0]..window[1]];
            serve_bounded(&mut self.bounded, nodes, events, counted);
        }
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    pub fn requests(&self) -> usize {
        self.request_ranges.len()
    }

    /// Serves `request`'s prompt under every policy, then inserts what it leaves cached (its
    /// `cached_after`, uncounted), as `profile` replays it. Returns the prompt's tokens.
    pub fn push(&mut self, request: &Request) -> u64 {
        if self.described.len() < MAX_DESCRIBED {
            self.described.push(Request {
                parts: request
                    .parts
                    .iter()
                    .take(DESCRIBED_PARTS)
                    .cloned()
                    .collect(),
                ..Request::default()
            });
        }
        self.scratch.clear();
        let known = self.builder.node_count();
        self.builder.push(request, &mut self.scratch);
        self.distinct_tokens += new_tokens(&self.scratch, known);
        let events = &self.scratch;
        let request_tokens: u64 = events.iter().map(|e| u64::from(e.tokens)).sum();
        self.measured_tokens += request_tokens;
        let nodes = self.builder.node_count();
        self.ceiling_total.add(self.ceiling.serve(nodes, events));
        self.prompts_ceiling_total
            .add(self.prompts_ceiling.serve(nodes, events));
        serve_bounded(&mut self.bounded, nodes, events, true);
        let start = self.events.len();
        crate::growth::reserve_by_quarter(&mut self.events, self.scratch.len());
        self.events.extend_from_slice(&self.scratch);
        self.starts.push(self.events.len());
        self.request_ranges.push(start..self.events.len());
        self.counted.push(true);

        if !request.cached_after.is_empty() {
            self.reply_scratch.clear();
            let known = self.builder.node_count();
            self.builder.push_blocks(
                &request.cached_after,
                request.conversation.as_deref(),
                &mut self.reply_scratch,
            );
            self.distinct_tokens += new_tokens(&self.reply_scratch, known);
            let events = &self.reply_scratch;
            let nodes = self.builder.node_count();
            self.ceiling.serve(nodes, events);
            serve_bounded(&mut self.bounded, nodes, events, false);
            crate::growth::reserve_by_quarter(&mut self.events, self.reply_scratch.len());
            self.events.extend_from_slice(&self.reply_scratch);
            self.starts.push(self.events.len());
            self.counted.push(false);
        }
        request_tokens
    }

    fn point(&self, policy: Policy, capacity: Option<&Capacity>, running: Running) -> Point {
        Point {
            policy,
            capacity_blocks: capacity.map(|c| c.blocks),
            capacity_tokens: capacity.map(|c| c.tokens(self.block_size)),
            capacity: capacity.map(|c| c.label.clone()),
            hit_tokens: running.hit_tokens,
            measured_tokens: self.measured_tokens,
            hit_rate: if self.measured_tokens == 0 {
                0.0
            } else {
                running.hit_tokens as f64 / self.measured_tokens as f64
            },
            same_conversation_tokens: running.same_conversation_tokens,
            other_tokens: running.hit_tokens - running.same_conversation_tokens,
            full_before_measurement: None,
        }
    }

    pub fn ceiling(&self) -> Point {
        self.point(Policy::Ceiling, None, self.ceiling_total)
    }

    /// The ceiling with prompts only (replies never cached): what an export can reproduce.
    pub fn ceiling_prompts_only(&self) -> Point {
        self.point(Policy::Ceiling, None, self.prompts_ceiling_total)
    }

    /// FIFO then LRU, each at every capacity.
    pub fn points(&self) -> Vec<Point> {
        self.bounded
            .iter()
            .flat_map(|(policy, _, totals)| {
                (self.capacities.iter().zip(totals))
                    .map(|(capacity, running)| self.point(*policy, Some(capacity), *running))
            })
            .collect()
    }

    /// The top prefixes of the requests so far (without descriptions: the live view keeps no
    /// prompts). O(all blocks so far).
    pub fn leaderboards(&self, top: usize) -> super::prefixes::Leaderboards {
        super::prefixes::leaderboards(
            &self.described,
            &self.events,
            &self.request_ranges,
            self.builder.parents(),
            top,
        )
    }

    /// Belady's optimal over the requests so far, replayed cold: O(all blocks so far).
    pub fn optimal_snapshot(&self, capacity: &Capacity) -> Point {
        let parents = self.builder.parents();
        let next = next_uses(&self.events, &self.starts, parents.len());
        let mut cache = Belady::new(usize::try_from(capacity.blocks).unwrap_or(usize::MAX));
        let mut running = Running::default();
        for (window, &counted) in self.starts.windows(2).zip(&self.counted) {
            let range = window[0]..window[1];
            let served = cache.serve(parents, &self.events[range.clone()], &next[range]);
            if counted {
                running.add(served);
            }
        }
        self.point(Policy::Optimal, Some(capacity), running)
    }
}

/// FIFO and LRU at every capacity of `capacities`, nothing served yet.
fn bounded(capacities: &[Capacity]) -> Vec<(Policy, EveryCapacity, Vec<Running>)> {
    let blocks: Vec<u64> = capacities.iter().map(|c| c.blocks).collect();
    [Policy::Fifo, Policy::Lru]
        .into_iter()
        .map(|policy| {
            let totals = vec![Running::default(); blocks.len()];
            (policy, EveryCapacity::new(policy, &blocks), totals)
        })
        .collect()
}

/// Serves one pass under FIFO and LRU at every capacity; `counted`: a prompt, which counts.
fn serve_bounded(
    bounded: &mut [(Policy, EveryCapacity, Vec<Running>)],
    nodes: usize,
    events: &[Event],
    counted: bool,
) {
    for (_, caches, totals) in bounded {
        let served = caches.serve(nodes, events);
        if counted {
            for (total, served) in totals.iter_mut().zip(served) {
                total.add(*served);
            }
        }
    }
}

/// Tokens of the events whose node is new (numbered from `known` on).
fn new_tokens(events: &[Event], known: usize) -> u64 {
    events
        .iter()
        .filter(|e| e.node() as usize >= known)
        .map(|e| u64::from(e.tokens))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::{Block, ProfileConfig, profile};

    #[test]
    fn live_equals_a_cold_batch_replay_at_every_step() {
        // A small pseudo-random workload: shared stems, conversations that grow, strays.
        let mut rng = crate::test_support::Xorshift::new(0x2545_f491_4f6c_dd1du64);
        let mut random = move |n: u64| rng.below(n);
        let mut requests = Vec::new();
        for i in 0..300u64 {
            let stem = random(4);
            let length = 1 + random(12);
            let mut blocks = vec![Block {
                id: 1000 + stem,
                tokens: 16,
            }];
            blocks.extend((0..length).map(|k| Block {
                id: if random(3) == 0 {
                    5000 + i * 100 + k
                } else {
                    k
                },
                tokens: 16,
            }));
            // Some leave their reply cached: the prompt's blocks, then a few more.
            let cached_after = if random(2) == 0 {
                let mut after = blocks.clone();
                after.extend((0..1 + random(4)).map(|k| Block {
                    id: 9000 + i * 10 + k,
                    tokens: 16,
                }));
                after
            } else {
                Vec::new()
            };
            requests.push(Request {
                blocks,
                cached_after,
                conversation: Some(format!("c{}", random(5))),
                ..Request::default()
            });
        }
        let capacities: Vec<Capacity> = [4u64, 16, 64]
            .iter()
            .map(|&blocks| Capacity {
                blocks,
                label: format!("{blocks}b"),
            })
            .collect();
        let mut live = LiveSimulator::new(16, capacities.clone());
        for (n, request) in requests.iter().enumerate() {
            live.push(request);
            if (n + 1) % 50 != 0 {
                continue;
            }
            let config = ProfileConfig {
                warmup: 0.0,
                capacities: capacities.clone(),
                ..ProfileConfig::default()
            };
            let batch = profile(&requests[..=n], &config);
            assert_eq!(live.ceiling().hit_tokens, batch.ceiling.hit_tokens);
            assert_eq!(
                live.ceiling().same_conversation_tokens,
                batch.ceiling.same_conversation_tokens
            );
            for point in live.points() {
                let twin = batch.points.iter().find(|p| {
                    p.policy == point.policy && p.capacity_blocks == point.capacity_blocks
                });
                let twin =
                    twin.map(|p| (p.hit_tokens, p.same_conversation_tokens, p.measured_tokens));
                assert_eq!(
                    twin,
                    Some((
                        point.hit_tokens,
                        point.same_conversation_tokens,
                        point.measured_tokens
                    ))
                );
            }
            for capacity in &capacities {
                let optimal = live.optimal_snapshot(capacity);
                let twin = batch.points.iter().find(|p| {
                    p.policy == Policy::Optimal && p.capacity_blocks == Some(capacity.blocks)
                });
                assert_eq!(twin.map(|p| p.hit_tokens), Some(optimal.hit_tokens));
            }
        }
    }
}
