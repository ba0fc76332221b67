//! The batch profile: every policy at every capacity over the same requests, the ceiling and its
//! split, the leaderboards, and the traffic's shape (sessions, lengths, streaming, models, rate).

use std::collections::BTreeMap;

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::policy::{
    Belady, Ceiling, Event, EventBuilder, EveryCapacity, Policy, Served, next_uses,
    optimal_working_set,
};
use super::prefixes::{Leaderboards, TOP_PREFIXES, leaderboards};
use super::stats::{Distribution, distribution, mean_of_unit_values};
use super::{IdSet, PROFILE_REPORT_VERSION, Request};

/// A cache size, always a whole number of blocks; `label` is how the user gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    pub blocks: u64,
    pub label: String,
}

impl Capacity {
    /// The tokens it holds at `block_size` (at most `u64::MAX`: a capacity is a flag's number).
    pub fn tokens(&self, block_size: u32) -> u64 {
        self.blocks.saturating_mul(u64::from(block_size))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileConfig {
    pub block_size: u32,
    /// Leading fraction of requests that fills the cache uncounted (kvcache-simulator's 0.5).
    pub warmup: f64,
    /// Bounded policies; the ceiling is always computed.
    pub policies: Vec<Policy>,
    pub capacities: Vec<Capacity>,
    /// Where the requests' conversation keys came from, for the report.
    pub conversation_source: String,
    pub top_prefixes: usize,
    /// Replies never enter the cache (the trace semantics).
    pub prompts_only: bool,
}

impl Default for ProfileConfig {
    fn default() -> Self {
        ProfileConfig {
            block_size: 16,
            warmup: 0.5,
            policies: vec![Policy::Fifo, Policy::Lru, Policy::Optimal],
            capacities: Vec::new(),
            conversation_source: "none".to_string(),
            top_prefixes: TOP_PREFIXES,
            prompts_only: false,
        }
    }
}

/// One policy at one capacity (or the ceiling).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub policy: Policy,
    /// `None` for the ceiling (unbounded).
    pub capacity_blocks: Option<u64>,
    pub capacity_tokens: Option<u64>,
    pub capacity: Option<String>,
    pub hit_tokens: u64,
    pub measured_tokens: u64,
    pub hit_rate: f64,
    /// Hits on blocks this request's own conversation asked for before.
    pub same_conversation_tokens: u64,
    pub other_tokens: u64,
    /// Whether the cache was full before the measured window began. kvcache-simulator reports
    /// zero hits ("underfilled") when it was not; we report the hits and this flag.
    pub full_before_measurement: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conversations {
    pub source: String,
    pub requests_with_conversation: u64,
    pub conversations: u64,
}

/// The server's own reuse counters beside the ceiling, over the requests that reported them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerObserved {
    pub requests: u64,
    pub prompt_tokens: u64,
    /// Sum of what the server said it reused (`cache_n`, `cached_tokens`,
    /// `cache_read_input_tokens`).
    pub server_reused_tokens: u64,
    /// The ceiling's hits on the same requests, replayed cold from the first request.
    pub ceiling_hit_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sessions {
    pub requests_with_session_id: u64,
    pub share: f64,
    pub by_source: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lengths {
    pub input_tokens: Distribution,
    pub output_tokens: Distribution,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRate {
    pub duration_s: f64,
    pub requests_per_s: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileReport {
    pub version: u32,
    pub requests: u64,
    pub block_size: u32,
    pub warmup: f64,
    pub warmup_requests: u64,
    pub measured_tokens: u64,
    pub unique_blocks: u64,
    pub cuts: BTreeMap<String, u64>,
    pub block_keys: BTreeMap<String, u64>,
    pub conversations: Conversations,
    /// Every figure in the trace semantics (`--prompts-only`): prompts enter the cache, replies
    /// never do.
    pub prompts_only: bool,
    /// Requests whose reply entered the cache after their prompt.
    pub replies_cached: u64,
    /// The upper bound: every block ever held stays cached, replies included where known (a
    /// server keeps the generated tokens; the next turn starts with them).
    pub ceiling: Point,
    /// The same with prompts only: what an exported trace can reproduce.
    pub ceiling_prompts_only: Point,
    pub points: Vec<Point>,
    /// AIPerf `analyze-trace`'s cache_hit_rate: the plain mean of per-request ratios (index of
    /// the first id never seen before / number of ids), over raw ids without a trie.
    pub aiperf_cache_hit_rate: Option<f64>,
    pub server_observed: Option<ServerObserved>,
    pub top_prefixes: Leaderboards,
    pub sessions: Sessions,
    pub lengths: Lengths,
    pub streaming_share: Option<f64>,
    pub models: BTreeMap<String, u64>,
    pub request_rate: Option<RequestRate>,
}

/// The requests as events, in passes: each request's prompt is one pass (looked up, then
/// inserted, counted), and with replies, what it leaves cached (`Request::cached_after`: the
/// prompt and the reply as the next turn renders it) one more right after, inserted like a
/// request but never counted. Every policy then holds what a server holds after answering; on
/// inputs without replies (traces) the passes are the requests, as kvcache-simulator replays.
pub struct Passes {
    pub events: Vec<Event>,
    /// Where each pass's events start, and the last one ends.
    pub starts: Vec<usize>,
    /// Per pass, the request whose prompt it is (`None`: a request's reply, not counted).
    pub counted: Vec<Option<u32>>,
    /// Per request, its prompt's pass.
    pub request_pass: Vec<usize>,
    pub parents: Vec<u32>,
}

impl Passes {
    pub fn new(requests: &[Request], with_replies: bool) -> Passes {
        let mut builder = EventBuilder::new();
        let blocks: usize = requests
            .iter()
            .map(|r| {
                r.blocks.len()
                    + if with_replies {
                        r.cached_after.len()
                    } else {
                        0
                    }
            })
            .sum();
        builder.reserve(blocks);
        let mut events = Vec::with_capacity(blocks);
        let mut starts = Vec::with_capacity(requests.len() + 1);
        let mut counted = Vec::with_capacity(requests.len());
        let mut request_pass = Vec::with_capacity(requests.len());
        starts.push(0);
        for (index, request) in requests.iter().enumerate() {
            request_pass.push(counted.len());
            counted.push(Some(u32::try_from(index).unwrap_or(u32::MAX)));
            builder.push(request, &mut events);
            starts.push(events.len());
            if with_replies && !request.cached_after.is_empty() {
                counted.push(None);
                builder.push_blocks(
                    &request.cached_after,
                    request.conversation.as_deref(),
                    &mut events,
                );
                starts.push(events.len());
            }
        }
        Passes {
            events,
            starts,
            counted,
            request_pass,
            parents: builder.into_parents(),
        }
    }

    pub fn requests(&self) -> usize {
        self.request_pass.len()
    }

    pub fn passes(&self) -> usize {
        self.counted.len()
    }

    fn pass_range(&self, pass: usize) -> std::ops::Range<usize> {
        self.starts[pass]..self.starts[pass + 1]
    }

    pub fn request_events(&self, request: usize) -> &[Event] {
        &self.events[self.pass_range(self.request_pass[request])]
    }

    /// Each request's prompt events, in request order.
    pub fn request_ranges(&self) -> Vec<std::ops::Range<usize>> {
        self.request_pass
            .iter()
            .map(|&pass| self.pass_range(pass))
            .collect()
    }

    /// The first pass of request `request` (or the end): where a measured window begins.
    fn first_pass_of(&self, request: usize) -> usize {
        self.request_pass
            .get(request)
            .copied()
            .unwrap_or(self.passes())
    }
}

/// `floor(requests × warmup)`, as kvcache-simulator computes it.
pub(crate) fn warmup_requests(requests: usize, warmup: f64) -> usize {
    let fraction = if warmup.is_finite() {
        warmup.clamp(0.0, 1.0)
    } else {
        0.0
    };
    ((requests as f64 * fraction).floor() as usize).min(requests)
}

/// Totals of one replay over the measured window, plus every request's own hits.
struct Totals {
    hit_tokens: u64,
    same_conversation_tokens: u64,
    per_request: Vec<u64>,
    /// The pass during which the cache first filled up.
    full_since: Option<u64>,
}

/// One unit of a profile's work: a replay of (policy, capacity, prompts only), LRU or FIFO at
/// every capacity, optimal's next uses, or the leaderboards.
enum Task<'a> {
    Passes(Policy, Option<&'a Capacity>, bool),
    EveryCapacity(Policy),
    NextUses,
    Leaderboards,
}

/// Where a point's totals are: (task, position in the task's results).
type ResultAt = (usize, usize);

/// LRU (`Policy::Lru`) or FIFO at every capacity of `capacities` from one walk over the
/// passes (LRU's serves them all at once); only requests' prompts from `warmup` on count.
fn run_at_every_capacity(
    replay: &Passes,
    policy: Policy,
    capacities: &[u64],
    warmup: usize,
) -> Vec<Totals> {
    let mut caches = EveryCapacity::new(policy, capacities);
    let mut totals: Vec<Totals> = capacities
        .iter()
        .map(|_| Totals {
            hit_tokens: 0,
            same_conversation_tokens: 0,
            per_request: Vec::new(),
            full_since: None,
        })
        .collect();
    let nodes = replay.parents.len();
    for pass in 0..replay.passes() {
        let served = caches.serve(nodes, &replay.events[replay.pass_range(pass)]);
        if replay.counted[pass].is_some_and(|request| request as usize >= warmup) {
            for (totals, served) in totals.iter_mut().zip(served) {
                totals.hit_tokens += served.hit_tokens;
                totals.same_conversation_tokens += served.same_conversation_tokens;
            }
        }
    }
    for (totals, full_since) in totals.iter_mut().zip(caches.full_since()) {
        totals.full_since = full_since;
    }
    totals
}

/// One policy over every pass of `replay`; only requests' prompts from `warmup` on count.
/// `prompts_only`: the replies' passes are skipped (the ceiling of the trace semantics, on the
/// same events).
fn run_policy(
    scratch: &mut Scratch,
    replay: &Passes,
    policy: Policy,
    capacity: usize,
    next: &[u32],
    warmup: usize,
    prompts_only: bool,
) -> Totals {
    let mut totals = Totals {
        hit_tokens: 0,
        same_conversation_tokens: 0,
        per_request: Vec::new(),
        full_since: None,
    };
    let node_count = replay.parents.len();
    let add = |pass: usize, served: Served, totals: &mut Totals| {
        let Some(request) = replay.counted[pass] else {
            return;
        };
        if policy == Policy::Ceiling {
            totals.per_request.push(served.hit_tokens);
        }
        if request as usize >= warmup {
            totals.hit_tokens += served.hit_tokens;
            totals.same_conversation_tokens += served.same_conversation_tokens;
        }
    };
    let passes = (0..replay.passes()).filter(|&p| !prompts_only || replay.counted[p].is_some());
    match policy {
        Policy::Ceiling => {
            let mut ceiling = Ceiling::default();
            totals.per_request.reserve(replay.requests());
            for pass in passes {
                let served = ceiling.serve(node_count, &replay.events[replay.pass_range(pass)]);
                add(pass, served, &mut totals);
            }
        }
        Policy::Fifo | Policy::Lru => {
            unreachable!("FIFO and LRU are walked at every capacity at once")
        }
        Policy::Optimal => {
            let mut cache = match scratch.optimal.take() {
                Some(used) => used.recycle(capacity),
                None => Belady::new(capacity),
            };
            for pass in passes {
                let range = replay.pass_range(pass);
                let served =
                    cache.serve(&replay.parents, &replay.events[range.clone()], &next[range]);
                add(pass, served, &mut totals);
            }
            totals.full_since = cache.full_since();
            scratch.optimal = Some(cache);
        }
    }
    totals
}

/// Optimal at a capacity that holds its working set (`optimal_working_set`) hits what the
/// ceiling hits, and fills up during the pass whose new nodes bring the distinct nodes to the
/// capacity (nothing is evicted or bypassed before): that pass.
fn lossless_full_since(replay: &Passes, capacity: usize) -> Option<u64> {
    let mut seen = vec![false; replay.parents.len()];
    let mut distinct = 0usize;
    (0..replay.passes()).find_map(|pass| {
        for event in &replay.events[replay.pass_range(pass)] {
            if let Some(seen) = seen.get_mut(event.node() as usize)
                && !*seen
            {
                *seen = true;
                distinct += 1;
            }
        }
        (distinct >= capacity).then_some(pass as u64)
    })
}

/// One worker's caches, kept between its replays so each replay reuses the memory of the one
/// before instead of faulting in fresh pages (the kernel zeroing them was a third of the time).
#[derive(Default)]
struct Scratch {
    optimal: Option<Belady>,
}

fn point(
    policy: Policy,
    capacity: Option<&Capacity>,
    block_size: u32,
    totals: &Totals,
    measured_tokens: u64,
    warmup_pass: usize,
) -> Point {
    Point {
        policy,
        capacity_blocks: capacity.map(|c| c.blocks),
        capacity_tokens: capacity.map(|c| c.tokens(block_size)),
        capacity: capacity.map(|c| c.label.clone()),
        hit_tokens: totals.hit_tokens,
        measured_tokens,
        hit_rate: ratio(totals.hit_tokens, measured_tokens),
        same_conversation_tokens: totals.same_conversation_tokens,
        other_tokens: totals.hit_tokens - totals.same_conversation_tokens,
        full_before_measurement: capacity.map(|_| {
            totals
                .full_since
                .is_some_and(|p| (p as usize) < warmup_pass)
        }),
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// The whole profile of `requests`, in the order given.
pub fn profile(requests: &[Request], config: &ProfileConfig) -> ProfileReport {
    // What the report says of the requests alone (their shape and AIPerf's rate) is computed on
    // another core while the replay is built, which only one core can do.
    std::thread::scope(|scope| {
        let shape = scope.spawn(|| traffic_shape(requests, config));
        profile_beside(requests, config, || match shape.join() {
            Ok(shape) => shape,
            Err(panic) => std::panic::resume_unwind(panic),
        })
    })
}

/// The report's figures that need the requests only, not a replay.
struct TrafficShape {
    cuts: BTreeMap<String, u64>,
    block_keys: BTreeMap<String, u64>,
    conversations: Conversations,
    replies_cached: u64,
    aiperf_cache_hit_rate: Option<f64>,
    sessions: Sessions,
    lengths: Lengths,
    streaming_share: Option<f64>,
    models: BTreeMap<String, u64>,
    request_rate: Option<RequestRate>,
}

fn traffic_shape(requests: &[Request], config: &ProfileConfig) -> TrafficShape {
    TrafficShape {
        cuts: count_by(requests, |r| r.cut.map(|c| c.as_str().to_string())),
        block_keys: count_by(requests, |r| {
            r.keys.map(|k| {
                serde_json::to_value(k)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            })
        }),
        conversations: conversations(requests, &config.conversation_source),
        replies_cached: requests
            .iter()
            .filter(|r| !config.prompts_only && !r.cached_after.is_empty())
            .count() as u64,
        aiperf_cache_hit_rate: aiperf_cache_hit_rate(requests),
        sessions: sessions(requests),
        lengths: Lengths {
            input_tokens: distribution(
                &mut requests.iter().map(|r| r.input_tokens).collect::<Vec<_>>(),
            ),
            output_tokens: distribution(
                &mut requests
                    .iter()
                    .filter_map(|r| r.output_tokens)
                    .collect::<Vec<_>>(),
            ),
        },
        streaming_share: streaming_share(requests),
        models: count_by(requests, |r| {
            Some(r.model.clone().unwrap_or_else(|| "unknown".into()))
        }),
        request_rate: request_rate(requests),
    }
}

/// What a task leaves: totals (one per capacity it covers), or, for optimal at a capacity that
/// holds its working set, only when it filled up (its hits are the ceiling's, which another
/// task replays).
enum TaskOutput {
    Totals(Vec<Totals>),
    Lossless {
        full_since: Option<u64>,
    },
    Leaderboards(Leaderboards),
    /// The task's result went to the optimal replays that wait for it (the next uses).
    Done,
}

/// The profile, with the traffic's shape from `shape` (computed meanwhile).
fn profile_beside(
    requests: &[Request],
    config: &ProfileConfig,
    shape: impl FnOnce() -> TrafficShape,
) -> ProfileReport {
    let replay = Passes::new(requests, !config.prompts_only);
    let warmup = warmup_requests(requests.len(), config.warmup);
    let warmup_pass = replay.first_pass_of(warmup);
    let request_ranges = replay.request_ranges();
    let measured_tokens: u64 = request_ranges[warmup..]
        .iter()
        .flat_map(|range| &replay.events[range.clone()])
        .map(|e| u64::from(e.tokens))
        .sum();
    // Only optimal needs each block's next use (and the working set they give): the first task
    // computes them while the other worker starts on the rest.
    let future: OnceLock<(Vec<u32>, u64)> = OnceLock::new();
    let with_replies = replay.passes() > replay.requests();

    let capacities: Vec<u64> = config.capacities.iter().map(|c| c.blocks).collect();

    // The tasks, longest first where that is known, so that neither worker waits on the other:
    // optimal's next uses (which its replays wait for), the leaderboards, the ceiling, the
    // trace semantics' ceiling where replies were cached, FIFO and LRU at every capacity (one
    // walk each), then optimal at every capacity.
    let mut tasks: Vec<Task> = Vec::new();
    let optimal_replays =
        config.policies.contains(&Policy::Optimal) && !config.capacities.is_empty();
    if optimal_replays {
        tasks.push(Task::NextUses);
    }
    tasks.push(Task::Leaderboards);
    let boards_task = tasks.len() - 1;
    tasks.push(Task::Passes(Policy::Ceiling, None, false));
    let ceiling_task = tasks.len() - 1;
    let ceiling_prompts_only_task = with_replies.then(|| {
        tasks.push(Task::Passes(Policy::Ceiling, None, true));
        tasks.len() - 1
    });
    // Each policy's task for every capacity at once.
    let mut every_capacity_task = |policy: Policy| {
        (config.policies.contains(&policy) && !capacities.is_empty()).then(|| {
            tasks.push(Task::EveryCapacity(policy));
            tasks.len() - 1
        })
    };
    let fifo_task = every_capacity_task(Policy::Fifo);
    let lru_task = every_capacity_task(Policy::Lru);
    // The replays left, largest capacity first: below its working set, optimal's replay takes
    // longer the more it holds, and the last task to start should be a short one.
    let needs_replay = |policy: Policy| policy == Policy::Optimal;
    let mut largest_first: Vec<usize> = (0..config.capacities.len()).collect();
    largest_first.sort_by_key(|&position| std::cmp::Reverse(config.capacities[position].blocks));
    // The replay task of each (capacity, policy), by their positions in the config.
    let mut replay_task = vec![vec![None; config.policies.len()]; config.capacities.len()];
    for position in largest_first {
        let capacity = &config.capacities[position];
        for (k, &policy) in config.policies.iter().enumerate() {
            if needs_replay(policy) {
                tasks.push(Task::Passes(policy, Some(capacity), false));
                replay_task[position][k] = Some(tasks.len() - 1);
            }
        }
    }
    // Each point's policy and capacity, and where its totals come from.
    let mut point_sources: Vec<(Policy, &Capacity, Option<ResultAt>)> = Vec::new();
    for (position, capacity) in config.capacities.iter().enumerate() {
        for (k, &policy) in config.policies.iter().enumerate() {
            let source = match policy {
                Policy::Ceiling => continue,
                Policy::Fifo => fifo_task.map(|task| (task, position)),
                Policy::Lru => lru_task.map(|task| (task, position)),
                Policy::Optimal => replay_task[position][k].map(|task| (task, 0)),
            };
            point_sources.push((policy, capacity, source));
        }
    }
    let next_uses_and_working_set = || {
        future.get_or_init(|| {
            let next = next_uses(&replay.events, &replay.starts, replay.parents.len());
            let working_set = optimal_working_set(&replay.events, &replay.starts, &next);
            (next, working_set)
        })
    };
    let mut results = run_tasks(&tasks, |scratch, task| match *task {
        Task::NextUses => {
            next_uses_and_working_set();
            TaskOutput::Done
        }
        Task::Leaderboards => TaskOutput::Leaderboards(leaderboards(
            requests,
            &replay.events,
            &request_ranges,
            &replay.parents,
            config.top_prefixes,
        )),
        Task::Passes(policy, capacity, prompts_only) => {
            let blocks = capacity.map_or(0, |c| usize::try_from(c.blocks).unwrap_or(usize::MAX));
            let next: &[u32] = if policy == Policy::Optimal {
                let (next, working_set) = next_uses_and_working_set();
                if blocks > 0 && blocks as u64 >= *working_set && !prompts_only {
                    return TaskOutput::Lossless {
                        full_since: lossless_full_since(&replay, blocks),
                    };
                }
                next
            } else {
                &[]
            };
            TaskOutput::Totals(vec![run_policy(
                scratch,
                &replay,
                policy,
                blocks,
                next,
                warmup,
                prompts_only,
            )])
        }
        Task::EveryCapacity(policy) => {
            TaskOutput::Totals(run_at_every_capacity(&replay, policy, &capacities, warmup))
        }
    });
    let shape = shape();
    let boards = match results.get_mut(boards_task) {
        Some(TaskOutput::Leaderboards(boards)) => std::mem::take(boards),
        _ => Leaderboards::default(),
    };
    let totals_of = |task: usize| match results.get(task) {
        Some(TaskOutput::Totals(totals)) => totals.as_slice(),
        _ => &[],
    };
    let Some(ceiling_totals) = totals_of(ceiling_task).first() else {
        unreachable!("the ceiling's task always leaves its totals")
    };
    let ceiling = point(
        Policy::Ceiling,
        None,
        config.block_size,
        ceiling_totals,
        measured_tokens,
        warmup_pass,
    );
    let ceiling_prompts_only =
        match ceiling_prompts_only_task.and_then(|task| totals_of(task).first()) {
            Some(totals) => point(
                Policy::Ceiling,
                None,
                config.block_size,
                totals,
                measured_tokens,
                warmup_pass,
            ),
            None => ceiling.clone(),
        };
    let points = point_sources
        .iter()
        .filter_map(|&(policy, capacity, source)| {
            let (task, position) = source?;
            let lossless;
            let totals = match results.get(task)? {
                TaskOutput::Totals(totals) => totals.get(position)?,
                &TaskOutput::Lossless { full_since } => {
                    lossless = Totals {
                        hit_tokens: ceiling_totals.hit_tokens,
                        same_conversation_tokens: ceiling_totals.same_conversation_tokens,
                        per_request: Vec::new(),
                        full_since,
                    };
                    &lossless
                }
                TaskOutput::Leaderboards(_) | TaskOutput::Done => return None,
            };
            Some(point(
                policy,
                Some(capacity),
                config.block_size,
                totals,
                measured_tokens,
                warmup_pass,
            ))
        })
        .collect();

    ProfileReport {
        version: PROFILE_REPORT_VERSION,
        requests: requests.len() as u64,
        block_size: config.block_size,
        warmup: config.warmup,
        warmup_requests: warmup as u64,
        measured_tokens,
        unique_blocks: replay.parents.len() as u64 - 1,
        cuts: shape.cuts,
        block_keys: shape.block_keys,
        conversations: shape.conversations,
        prompts_only: config.prompts_only,
        replies_cached: shape.replies_cached,
        ceiling,
        ceiling_prompts_only,
        points,
        aiperf_cache_hit_rate: shape.aiperf_cache_hit_rate,
        server_observed: server_observed(requests, &ceiling_totals.per_request),
        top_prefixes: boards,
        sessions: shape.sessions,
        lengths: shape.lengths,
        streaming_share: shape.streaming_share,
        models: shape.models,
        request_rate: shape.request_rate,
    }
}

/// Runs independent replays on every core, each worker with its own scratch state; results
/// come back in task order.
fn run_tasks<T: Sync, R: Send, S: Default>(
    tasks: &[T],
    run: impl Fn(&mut S, &T) -> R + Sync,
) -> Vec<R> {
    use rayon::prelude::*;
    tasks
        .par_iter()
        .with_max_len(1)
        .map_init(S::default, |scratch, task| run(scratch, task))
        .collect()
}

fn count_by(
    requests: &[Request],
    key: impl Fn(&Request) -> Option<String>,
) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for request in requests {
        if let Some(k) = key(request) {
            *counts.entry(k).or_insert(0) += 1;
        }
    }
    counts
}

fn conversations(requests: &[Request], source: &str) -> Conversations {
    let keys: std::collections::HashSet<&str> = requests
        .iter()
        .filter_map(|r| r.conversation.as_deref())
        .collect();
    Conversations {
        source: source.to_string(),
        requests_with_conversation: requests.iter().filter(|r| r.conversation.is_some()).count()
            as u64,
        conversations: keys.len() as u64,
    }
}

/// The ceiling's hits of every request, replayed cold (replies cached after their prompts
/// when `with_replies`): what `server_observed` sums beside the server's reuse.
pub fn ceiling_per_request(requests: &[Request], with_replies: bool) -> Vec<u64> {
    let replay = Passes::new(requests, with_replies);
    run_policy(
        &mut Scratch::default(),
        &replay,
        Policy::Ceiling,
        0,
        &[],
        0,
        false,
    )
    .per_request
}

/// AIPerf's definition: the mean of the per-request ratios, rounded once as Python's
/// `statistics.mean` rounds it.
pub fn aiperf_cache_hit_rate(requests: &[Request]) -> Option<f64> {
    mean_of_unit_values(&aiperf_ratios(requests))
}

/// Per request, the share of its blocks before the first one no earlier request had (AIPerf's
/// per-request cache hit ratio).
pub fn aiperf_ratios(requests: &[Request]) -> Vec<f64> {
    let mut seen = SeenIds::default();
    let mut ratios = Vec::with_capacity(requests.len());
    for request in requests.iter().filter(|r| !r.blocks.is_empty()) {
        let first_unseen = request
            .blocks
            .iter()
            .position(|b| !seen.contains(b.id))
            .unwrap_or(request.blocks.len());
        ratios.push(first_unseen as f64 / request.blocks.len() as f64);
        for block in &request.blocks {
            seen.insert(block.id);
        }
    }
    ratios
}

/// A set of block ids: small ids as flags in an array ([`super::small_id_slot`]), the others in
/// a hash set.
#[derive(Default)]
struct SeenIds {
    small: Vec<bool>,
    others: IdSet<u64>,
    count: usize,
}

impl SeenIds {
    fn contains(&self, id: u64) -> bool {
        match usize::try_from(id).ok().filter(|&i| i < self.small.len()) {
            Some(i) if self.small[i] => true,
            _ => self.others.contains(&id),
        }
    }

    fn insert(&mut self, id: u64) {
        if self.contains(id) {
            return;
        }
        self.count += 1;
        match super::small_id_slot(id, self.small.len(), self.count) {
            Some(i) => {
                if i >= self.small.len() {
                    self.small.resize(i + 1, false);
                }
                self.small[i] = true;
            }
            None => {
                self.others.insert(id);
            }
        }
    }
}

fn server_observed(requests: &[Request], ceiling_per_request: &[u64]) -> Option<ServerObserved> {
    let mut observed = ServerObserved {
        requests: 0,
        prompt_tokens: 0,
        server_reused_tokens: 0,
        ceiling_hit_tokens: 0,
    };
    for (request, &ceiling) in requests.iter().zip(ceiling_per_request) {
        if let Some(reused) = request.server_reused_tokens {
            observed.requests += 1;
            observed.prompt_tokens += request.input_tokens;
            observed.server_reused_tokens += reused;
            observed.ceiling_hit_tokens += ceiling;
        }
    }
    (observed.requests > 0).then_some(observed)
}

fn sessions(requests: &[Request]) -> Sessions {
    let by_source = count_by(requests, |r| {
        r.session_id.as_ref().map(|s| s.source.clone())
    });
    let with: u64 = by_source.values().sum();
    Sessions {
        requests_with_session_id: with,
        share: ratio(with, requests.len() as u64),
        by_source,
    }
}

fn streaming_share(requests: &[Request]) -> Option<f64> {
    let known: Vec<bool> = requests.iter().filter_map(|r| r.streamed).collect();
    (!known.is_empty()).then(|| {
        ratio(
            known.iter().filter(|&&s| s).count() as u64,
            known.len() as u64,
        )
    })
}

fn request_rate(requests: &[Request]) -> Option<RequestRate> {
    let times: Vec<i64> = requests.iter().filter_map(|r| r.t_ms).collect();
    let (first, last) = (times.iter().min()?, times.iter().max()?);
    let duration_s = (last - first) as f64 / 1000.0;
    Some(RequestRate {
        duration_s,
        requests_per_s: (duration_s > 0.0).then(|| times.len() as f64 / duration_s),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Block;

    fn request(ids: &[u64], tokens: u32) -> Request {
        Request {
            blocks: ids.iter().map(|&id| Block { id, tokens }).collect(),
            input_tokens: u64::from(tokens) * ids.len() as u64,
            ..Request::default()
        }
    }

    /// Small ids in the array, large ones in the set, and an id that moves from the set's
    /// range into the array's as the array's bound grows: membership is a hash set's.
    #[test]
    fn seen_ids_hold_what_a_hash_set_holds() {
        let mut seen = SeenIds::default();
        let mut naive = std::collections::HashSet::new();
        let mut rng = crate::test_support::Xorshift::new(0x9e37_79b9_7f4a_7c15);
        for step in 0..20_000u64 {
            let state = rng.next();
            let id = match state % 3 {
                0 => 9_000 + state % 16,
                1 => state % 50_000,
                _ => u64::MAX - step,
            };
            assert_eq!(
                seen.contains(id),
                naive.contains(&id),
                "step {step}, id {id}"
            );
            seen.insert(id);
            naive.insert(id);
        }
        assert!(seen.small.len() > 9_016);
    }

    fn all_paths_from_root(parents: &[u32], events: &[Event], starts: &[usize]) -> bool {
        starts.windows(2).all(|bounds| {
            let mut parent = 0u32;
            events[bounds[0]..bounds[1]].iter().all(|event| {
                let on_path = event.node() != 0 && parents[event.node() as usize] == parent;
                parent = event.node();
                on_path
            })
        })
    }

    /// LRU's walk and optimal's shortcut need every pass to be a path from the root: prompts
    /// and the replies they leave cached are.
    #[test]
    fn every_pass_is_a_path_from_the_root() {
        let mut requests = vec![
            request(&[1, 2, 3], 10),
            request(&[1, 2, 4], 10),
            request(&[5], 10),
        ];
        requests[0].cached_after = [1, 2, 3, 7]
            .iter()
            .map(|&id| Block { id, tokens: 10 })
            .collect();
        let replay = Passes::new(&requests, true);
        assert_eq!(replay.passes(), 4);
        assert!(all_paths_from_root(
            &replay.parents,
            &replay.events,
            &replay.starts
        ));
    }

    /// The profile's shortcuts (LRU at every capacity from one walk, optimal at its working set)
    /// give every point what that policy at that capacity alone gives: hits, the
    /// conversation split and whether the cache filled before measuring, on requests with
    /// replies cached, conversations, and capacities from one block to more than all.
    #[test]
    fn every_point_equals_its_replay() {
        let mut rng = crate::test_support::Xorshift::new(0x2545_f491_4f6c_dd1du64);
        let mut random = move |n: u64| rng.below(n);
        let mut requests = Vec::new();
        for i in 0..400u64 {
            let stem = random(5);
            let mut ids = vec![1000 + stem];
            ids.extend((0..1 + random(14)).map(|k| {
                if random(3) == 0 {
                    5000 + i * 100 + k
                } else {
                    k
                }
            }));
            let mut request = request(&ids, 1 + random(16) as u32);
            if random(2) == 0 {
                request.cached_after = request.blocks.clone();
                request.cached_after.push(Block {
                    id: 90_000 + i,
                    tokens: 7,
                });
            }
            request.conversation = Some(format!("c{}", random(6)));
            requests.push(request);
        }
        let replay = Passes::new(&requests, true);
        assert!(replay.passes() > replay.requests());
        assert!(all_paths_from_root(
            &replay.parents,
            &replay.events,
            &replay.starts
        ));
        let warmup = warmup_requests(requests.len(), 0.3);
        let next = next_uses(&replay.events, &replay.starts, replay.parents.len());
        let working_set = optimal_working_set(&replay.events, &replay.starts, &next);
        // Optimal's shortcut is taken at some capacities and not at others; passes are up to 17
        // blocks long, longer than the small capacities.
        assert!(working_set > 20 && working_set < 100_000, "{working_set}");
        let mut scratch = Scratch::default();
        // In order; then unsorted, given twice, 0 and past any count, with a policy left out (the
        // points find their figures by position).
        let cases: [(&[u64], &[Policy]); 3] = [
            (
                &[1, 3, 8, 16, 20, 60, 200, 1000, 100_000],
                &[Policy::Fifo, Policy::Lru, Policy::Optimal],
            ),
            (
                &[4, u64::MAX, 4, 0, 2, u64::MAX - 3],
                &[Policy::Lru, Policy::Fifo],
            ),
            (&[60, 0, 7, 60], &[Policy::Optimal, Policy::Lru]),
        ];
        for (blocks, policies) in cases {
            let capacities: Vec<Capacity> = blocks
                .iter()
                .map(|&blocks| Capacity {
                    blocks,
                    label: format!("{blocks}b"),
                })
                .collect();
            let config = ProfileConfig {
                warmup: 0.3,
                capacities: capacities.clone(),
                policies: policies.to_vec(),
                ..ProfileConfig::default()
            };
            let report = profile(&requests, &config);
            assert_eq!(report.points.len(), blocks.len() * policies.len());
            let expected = capacities
                .iter()
                .flat_map(|capacity| policies.iter().map(move |&policy| (policy, capacity)));
            for (point, (policy, capacity)) in report.points.iter().zip(expected) {
                let blocks = usize::try_from(capacity.blocks).unwrap_or(usize::MAX);
                let totals = if policy == Policy::Optimal {
                    run_policy(&mut scratch, &replay, policy, blocks, &next, warmup, false)
                } else {
                    run_at_every_capacity(&replay, policy, &[capacity.blocks], warmup).remove(0)
                };
                let replayed = super::point(
                    policy,
                    Some(capacity),
                    config.block_size,
                    &totals,
                    report.measured_tokens,
                    replay.first_pass_of(warmup),
                );
                assert_eq!(*point, replayed, "{} at {blocks}", policy.as_str());
                // The fill point itself, which the point only compares with the warmup.
                if policy == Policy::Optimal && capacity.blocks >= working_set {
                    assert_eq!(
                        lossless_full_since(&replay, blocks),
                        totals.full_since,
                        "optimal at {blocks}"
                    );
                    let ceiling = run_policy(
                        &mut scratch,
                        &replay,
                        Policy::Ceiling,
                        0,
                        &[],
                        warmup,
                        false,
                    );
                    assert_eq!(
                        (ceiling.hit_tokens, ceiling.same_conversation_tokens),
                        (totals.hit_tokens, totals.same_conversation_tokens),
                        "optimal at {blocks}"
                    );
                }
            }
        }
    }

    #[test]
    fn warmup_is_floored() {
        assert_eq!(warmup_requests(12_031, 0.5), 6015);
        assert_eq!(warmup_requests(3, 0.0), 0);
        assert_eq!(warmup_requests(3, 1.0), 3);
    }

    #[test]
    fn the_measured_window_and_the_split() {
        let mut requests = vec![
            request(&[1, 2], 10),
            request(&[1, 2, 3], 10),
            request(&[1, 2, 3, 4], 10),
            request(&[1, 5], 10),
        ];
        requests[1].conversation = Some("a".into());
        requests[2].conversation = Some("a".into());
        requests[3].conversation = Some("b".into());
        let config = ProfileConfig {
            warmup: 0.5,
            capacities: vec![Capacity {
                blocks: 2,
                label: "2b".into(),
            }],
            ..ProfileConfig::default()
        };
        let report = profile(&requests, &config);
        assert_eq!(report.warmup_requests, 2);
        assert_eq!(report.measured_tokens, 60);
        // Request 3 hits 1, 2, 3 (its conversation asked for 1, 2, 3 in request 2); request 4 hits 1.
        assert_eq!(report.ceiling.hit_tokens, 40);
        assert_eq!(report.ceiling.same_conversation_tokens, 30);
        assert_eq!(report.ceiling.other_tokens, 10);
        assert_eq!(report.points.len(), 3);
        assert!(report.points.iter().all(|p| p.capacity_blocks == Some(2)));
        // AIPerf: ratios 0, 2/3, 3/4, 1/2.
        let expected = (0.0 + 2.0 / 3.0 + 0.75 + 0.5) / 4.0;
        assert!((report.aiperf_cache_hit_rate.unwrap_or(0.0) - expected).abs() < 1e-15);
    }
}
