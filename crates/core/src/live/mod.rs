//! The live engine: every consumer of records that the panes read (the analysis engine, the
//! live cache simulation and its block model, the counters, what the panes derive) in one
//! place, behind one immutable `Snapshot`.
//!
//! `Engine` is pure and synchronous (no clock: arrival times come with the inputs), so tests and
//! the headless commands drive it directly. `spawn` runs it on a thread of its own and publishes
//! a snapshot at a capped rate, so the TUI never does record work on its thread and a key never
//! waits behind records (DESIGN.md, "Live engine").
//!
//! - `snapshot`: what a snapshot holds, its summary text and JSON.
//! - `predictions`: the simulated server's savings and the advice built on them.
//! - `runner`: the engine's thread.
//! - `sums`: the analysis's families summed across restarts (`--metrics`).
//! - `view`: what the panes derive from a report.

mod predictions;
mod runner;
mod snapshot;
mod sums;
pub mod view;

pub use predictions::{
    Advice, Baseline, MAX_WHATIF_BODY_BYTES, MAX_WHATIF_RECORDS, Prediction, Predictions,
    WHATIF_CAP_COST, advise, predict_at,
};
pub use runner::{Handle, INPUT_QUEUE, MIN_SNAPSHOT_INTERVAL_MS, SNAPSHOT_COST_FACTOR, spawn};
pub use snapshot::{SNAPSHOT_VERSION, Snapshot};
pub use sums::{Sums, Weighted, label_value};

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::analysis::{Analyzer, Config, Report, SharedRow};
use crate::cache::Policy;
use crate::cache::Request;
use crate::cache::blocks::{BlockModel, Cutter};
use crate::cache::live::LiveSimulator;
use crate::cache::prefixes::TOP_PREFIXES;
use crate::cache::profile::Capacity;
use crate::input::recording::{Pending, pending_request};
use crate::input::{BlockModelChoice, FileReport, Format, InputOptions, choose_block_model};
use crate::record::Record;
use crate::units::plural;
use view::{Curve, PrefixItem, View, thousands};

/// Block size of the live hit-rate curve until the traffic says otherwise (vLLM's and SGLang's).
pub const LIVE_BLOCK_SIZE: u32 = crate::input::DEFAULT_BLOCK_SIZE;
/// `watch` learns its block model (block size from the engine, tokens per character from the
/// server's counts) over the first requests, re-cutting them each time, then holds it: this
/// many requests with a server count, or this many requests in all.
pub const LEARN_COUNTED_REQUESTS: usize = 8;
pub const LEARN_MAX_REQUESTS: usize = 32;
/// Capacities on the live hit-rate curve: from one block up to the traffic's distinct working
/// set, in powers of two of tokens (so `profile --capacities` takes the same labels).
pub const AXIS_POINTS: usize = 6;
/// The axis spans at least this many blocks, before the traffic says more.
const AXIS_MIN_BLOCKS: u64 = 32;

/// The capacities of the axis for `working_set` distinct tokens at `block_size`, and the top
/// (tokens): it holds until the working set passes it.
pub fn capacity_axis(block_size: u32, working_set: u64) -> (u64, Vec<Capacity>) {
    let block = u64::from(block_size.max(1));
    let low = block.next_power_of_two();
    let top = working_set
        .max(low.saturating_mul(AXIS_MIN_BLOCKS))
        .checked_next_power_of_two()
        .unwrap_or(1 << 62);
    let (lo, hi) = (low.trailing_zeros() as usize, top.trailing_zeros() as usize);
    let mut capacities: Vec<Capacity> = Vec::new();
    for i in 0..AXIS_POINTS {
        let exponent = lo + ((hi - lo) * i + (AXIS_POINTS - 1) / 2) / (AXIS_POINTS - 1);
        let tokens = 1u64 << exponent;
        if capacities
            .last()
            .is_some_and(|c| c.label == token_label(tokens))
        {
            continue;
        }
        capacities.push(Capacity {
            blocks: (tokens / block).max(1),
            label: token_label(tokens),
        });
    }
    (top, capacities)
}

/// A power of two of tokens as `profile --capacities` reads it: 512, 4K, 16M.
fn token_label(tokens: u64) -> String {
    match tokens {
        t if t >= 1 << 20 && t % (1 << 20) == 0 => format!("{}M", t >> 20),
        t if t >= 1 << 10 && t % (1 << 10) == 0 => format!("{}K", t >> 10),
        t => t.to_string(),
    }
}

/// Arrivals are counted per second for the last minute (requests per second).
const ARRIVAL_WINDOW_S: i64 = 60;

/// What the engine consumes.
#[derive(Debug, Clone)]
pub enum Input {
    /// One exchange, from the proxy's recorder or a replayed file, and when it arrived (ms).
    Record(Arc<Record>, i64),
    /// A request the proxy has just sent on, its response not in yet (no response in the
    /// record): what it will do to the server's slots is predicted until its record comes.
    Started(Arc<Record>),
    /// One request of a trace (no messages: only the cache panes use it).
    Request(Arc<Request>, i64),
    /// The source has no more (a replay's end).
    SourceDone,
    /// Something the user asked for: the answer is the next snapshot.
    Command(Command),
    /// The block model to cut prompts with, measured over the whole input before its first
    /// record (a replay's first pass); what was cut before is cut again.
    BlockModel(Box<FirstPass>),
}

/// What a replay's first pass found: the block model, and the first record id (where the
/// cache simulation starts: it takes requests in id order, the order they reached the server).
#[derive(Debug, Clone)]
pub struct FirstPass {
    pub model: BlockModel,
    pub choice: BlockModelChoice,
    pub first_id: Option<u64>,
}

impl FirstPass {
    /// Measures `records` as a replay's first pass does (one at a time, keeping nothing).
    pub fn of<R: std::borrow::Borrow<Record>>(records: impl IntoIterator<Item = R>) -> FirstPass {
        let mut evidence = crate::input::ModelEvidence::default();
        let mut first_id: Option<u64> = None;
        for record in records {
            let record = record.borrow();
            if record.probe {
                continue;
            }
            crate::input::recording::observe_record(record, &mut evidence);
            first_id = Some(first_id.map_or(record.id, |f| f.min(record.id)));
        }
        let (model, choice) = choose_block_model(&InputOptions::default(), &evidence);
        FirstPass {
            model,
            choice,
            first_id,
        }
    }
}

/// Records whose earlier ones are still in flight wait at most this many at once before the
/// oldest goes to the cache simulation anyway (an id that never comes must not stall it).
pub const MAX_REORDER: usize = 256;
/// ... nor longer than this behind the newest arrival (ms): an exchange that never completes,
/// or a request id the recorder never wrote, holds the cache panes back 30 s at most.
pub const MAX_REORDER_WAIT_MS: i64 = 30_000;

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Panes show only rows matching this (client, model, `c3`, break text).
    Filter(String),
    /// The hit-rate chart is open: work out Belady's optimal for it.
    Chart(bool),
    /// The findings view is open: work out the findings and the simulated server's savings
    /// for every snapshot (else only once the source is done).
    Advice(bool),
    /// The capacity view is open: the simulated server at every setting of it.
    Capacity(bool),
}

/// The engine's state: what every pane derives from, updated record by record.
pub struct Engine {
    analyzer: Analyzer,
    config: Config,
    cache: LiveSimulator,
    cutter: Cutter,
    /// What the cut follows and why; `None` for traces (their own hash ids).
    choice: Option<BlockModelChoice>,
    /// Requests kept while the block model is being learned (`watch`): each new one re-cuts
    /// them all. `None` once the model holds.
    learning: Option<Vec<Pending>>,
    /// Records arrive as they complete; the cache simulation takes them by id (the order they
    /// reached the server, as `profile` does): a record waits here for the earlier ones still
    /// in flight (`None`: nothing to simulate, it only moves the order on).
    waiting: std::collections::BTreeMap<u64, (Option<Pending>, i64)>,
    /// When the newest record arrived (ms): a record that waited `MAX_REORDER_WAIT_MS` behind
    /// it goes to the simulation without the earlier ones.
    newest_arrival_ms: i64,
    /// The id the simulation takes next (`None`: the first that arrives).
    next_id: Option<u64>,
    cache_skips: FileReport,
    /// Prompt tokens of simulated requests, and of those the server said it reused (only
    /// requests whose server reported reuse count in both).
    server_reuse: (u64, u64),
    requests: u64,
    arrivals: std::collections::VecDeque<(i64, u32)>,
    filter: String,
    chart: bool,
    source_done: bool,
    generation: u64,
    /// Records kept for the what-if (up to `MAX_WHATIF_RECORDS`), and how many came in all.
    records: Vec<Arc<Record>>,
    records_seen: u64,
    /// Body bytes of every record that came (`MAX_WHATIF_BODY_BYTES`).
    whatif_body_bytes: u64,
    /// What the probe records said, and how many came.
    server: crate::probe::ServerInfo,
    probes: u64,
    /// The findings view is open.
    advice: bool,
    /// The capacity view is open: every setting, not only the fixes' levers.
    capacity: bool,
    /// The last predictions, how many records they were worked out over, and whether at every
    /// setting.
    predicted: Option<(u64, bool, Arc<Predictions>)>,
    /// The server's own slots and host cache, when known (the simulated server's; a probe's).
    server_settings: Option<ServerSettings>,
    /// The last slot residency and what it was worked out with.
    resided: Option<(SlotViewInputs, Arc<Option<SlotView>>)>,
    /// Requests started whose record has not come (at most `MAX_STARTING`), and the ids of the
    /// latest records (a start that comes after its record is not in flight).
    starting: BTreeMap<u64, Arc<Record>>,
    recently_done: std::collections::VecDeque<u64>,
    /// What the analyses before the last restart covered, when there was one.
    earlier: Option<Earlier>,
    /// Records (probes apart) in the analysis since it last started.
    in_analysis: usize,
    /// The newest probe records, told to the analysis again when it starts again.
    recent_probes: std::collections::VecDeque<Arc<Record>>,
}

/// The analysis's heap at most unless `--memory-budget` says otherwise (an estimate,
/// `Analyzer::held_bytes`): some 100,000 agent records, or 40,000 of random text.
pub const DEFAULT_MEMORY_BUDGET: usize = 512 << 20;
/// Probe records told again to an analysis that starts again past the memory budget.
const PROBES_KEPT: usize = 16;

/// What the analyses before the last restart covered: the records, what they lost, and their
/// families summed (`Sums`, which the `--metrics` endpoint adds to the open analysis's). The
/// panes' figures are of the records since (they equal `analyze` of those); this is said on
/// screen and in the summary.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Earlier {
    pub restarts: u64,
    pub budget: usize,
    /// Records per analysis at most (`--metrics-window`), when set.
    pub window: Option<usize>,
    pub records: u64,
    pub lost_tokens: u64,
    /// When the last restart happened (the last record before it started, ms).
    pub until_ms: i64,
    pub sums: Sums,
    /// Their ceilings and the server's reuse, weighted by their prompt tokens.
    pub ceiling: Weighted,
    pub server_reuse: Weighted,
    /// Requests the earlier cache simulations took or left out (the hit rate is of those since).
    pub requests: u64,
}

impl Earlier {
    /// The line every output says it with.
    pub fn line(&self) -> String {
        let why = match self.window {
            None => format!("memory budget ({} MiB) reached", self.budget >> 20),
            Some(window) => format!(
                "analysis window ({} records, or {} MiB) full",
                thousands(window as u64),
                self.budget >> 20
            ),
        };
        format!(
            "{why}: the analysis started again {}; the {} records before, which lost {}, are not in these figures",
            match self.restarts {
                1 => "once".to_string(),
                n => format!("{n} times"),
            },
            thousands(self.records),
            crate::units::plural(self.lost_tokens, "token")
        )
    }
}

/// The shortest prefix the by-count list shows (tokens).
pub const MIN_LISTED_PREFIX_TOKENS: u64 = 64;

/// Started requests kept for the slot predictions: more than a server has slots for.
const MAX_STARTING: usize = 64;
/// Record ids remembered to tell a late start from a request in flight.
const RECENTLY_DONE: usize = 256;

/// What a slot residency was worked out with: how many records, which settings and which
/// started requests (it is worked out again when any of them changes).
#[derive(Debug, Clone, PartialEq)]
struct SlotViewInputs {
    records_seen: u64,
    settings: Option<ServerSettings>,
    starting: Vec<u64>,
}

/// The server's settings the slot residency is replayed with, and where they come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    pub slots: usize,
    pub cache_ram: bool,
    /// `the simulated server's`, `the server's /props (host cache assumed on, its default)`.
    pub source: String,
}

/// Who holds the server's cache now (`sim::residency` over the records so far), with the
/// settings it was replayed with.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotView {
    pub residency: crate::sim::residency::Residency,
    /// Where the settings come from; the nearest setting's, when the server's are unknown.
    pub source: String,
}

fn live_simulator(block_size: u32) -> LiveSimulator {
    let block_size = block_size.max(1);
    LiveSimulator::new(block_size, capacity_axis(block_size, 0).1)
}

impl Engine {
    /// An engine that learns its block model from the first requests (`watch`, the demo).
    pub fn new(config: Config) -> Engine {
        let (model, choice) = choose_block_model(&InputOptions::default(), &Default::default());
        let mut engine = Engine::with_model(config, model, Some(choice));
        engine.learning = Some(Vec::new());
        engine
    }

    /// An engine for a trace's requests, which come with their blocks: `block_size` is the
    /// trace's (e.g. 512 for Mooncake; capacities stay in tokens).
    pub fn with_block_size(config: Config, block_size: u32) -> Engine {
        let model = BlockModel {
            block_size: block_size.max(1),
            ..BlockModel::default()
        };
        Engine::with_model(config, model, None)
    }

    /// An engine for `records` (pushed after), cut with the block model measured over all of
    /// them first, as a replay of their file is.
    pub fn for_records<'a>(
        config: Config,
        records: impl IntoIterator<Item = &'a Record>,
    ) -> Engine {
        let measured = FirstPass::of(records);
        let mut engine = Engine::with_block_model(config, measured.model, measured.choice);
        engine.next_id = measured.first_id;
        engine
    }

    /// An engine whose records are cut with a block model measured beforehand (a replay's).
    pub fn with_block_model(config: Config, model: BlockModel, choice: BlockModelChoice) -> Engine {
        Engine::with_model(config, model, Some(choice))
    }

    fn with_model(config: Config, model: BlockModel, choice: Option<BlockModelChoice>) -> Engine {
        Engine {
            analyzer: Analyzer::new(config.clone()),
            config,
            cache: live_simulator(model.block_size),
            cutter: Cutter::new(model),
            choice,
            learning: None,
            waiting: std::collections::BTreeMap::new(),
            newest_arrival_ms: i64::MIN,
            next_id: None,
            cache_skips: FileReport::new("live", Format::Recording),
            server_reuse: (0, 0),
            requests: 0,
            arrivals: std::collections::VecDeque::new(),
            filter: String::new(),
            chart: false,
            source_done: false,
            generation: 0,
            records: Vec::new(),
            records_seen: 0,
            whatif_body_bytes: 0,
            server: crate::probe::ServerInfo::default(),
            probes: 0,
            advice: false,
            capacity: false,
            predicted: None,
            server_settings: None,
            resided: None,
            starting: BTreeMap::new(),
            recently_done: std::collections::VecDeque::new(),
            earlier: None,
            in_analysis: 0,
            recent_probes: std::collections::VecDeque::new(),
        }
    }

    /// An estimate of the analysis's heap (`Analyzer::held_bytes`), what the memory budget
    /// (`Config::memory_budget`) is compared with.
    pub fn held_bytes(&self) -> usize {
        self.analyzer.held_bytes()
    }

    /// What the analyses before the last restart covered, when there was one.
    pub fn earlier(&self) -> Option<&Earlier> {
        self.earlier.as_ref()
    }

    /// Keeps what the analysis and the cache simulation so far covered and starts them again
    /// (the analysis told the newest probes): past the memory budget, or a full window.
    fn restart(&mut self, until_ms: i64) {
        let report = self.analyzer.live_report();
        let sums = Sums::of(&report);
        let weight = sums.prompt_tokens() as f64;
        let curve = self.curve();
        let waiting = self.waiting.values().filter(|(p, _)| p.is_some()).count() as u64;
        let earlier = self.earlier.get_or_insert_with(Earlier::default);
        earlier.restarts += 1;
        earlier.budget = self.config.memory_budget;
        earlier.window = self.config.window;
        earlier.records += report.coverage.records;
        earlier.lost_tokens += report.time.lost_tokens;
        earlier.until_ms = until_ms;
        earlier.sums.add(&sums);
        if let Some(curve) = curve {
            earlier.ceiling.add(curve.ceiling, weight);
            if let Some(observed) = curve.observed {
                earlier.server_reuse.add(observed, weight);
            }
        }
        // The requests waiting for an earlier one go to the new simulation.
        earlier.requests = self.requests.saturating_sub(waiting);
        self.analyzer = Analyzer::new(self.config.clone());
        for probe in &self.recent_probes {
            self.analyzer.push(probe);
        }
        self.cache = live_simulator(self.cutter.model.block_size);
        self.cache_skips = FileReport::new("live", Format::Recording);
        self.server_reuse = (0, 0);
        if let Some(learning) = self.learning.as_mut() {
            learning.clear();
        }
        self.records = Vec::new();
        self.records_seen = 0;
        self.whatif_body_bytes = 0;
        self.predicted = None;
        self.resided = None;
        self.in_analysis = 0;
    }

    /// Applies one input. Returns whether the user is waiting for its answer (a command, the
    /// end of the source): the runner then publishes a snapshot at once.
    pub fn push(&mut self, input: Input) -> bool {
        match input {
            Input::Record(record, _) if record.probe => {
                // Our own request to the server: its reading, never traffic (its id is of the
                // probes' own range, so the simulation's order of ids is the exchanges').
                self.analyzer.push(&record);
                self.server.apply_record(&record);
                self.probes += 1;
                if self.recent_probes.len() == PROBES_KEPT {
                    self.recent_probes.pop_front();
                }
                self.recent_probes.push_back(Arc::clone(&record));
                false
            }
            Input::Started(record) => {
                if !record.probe && !self.recently_done.contains(&record.id) {
                    self.starting.insert(record.id, record);
                    while self.starting.len() > MAX_STARTING {
                        self.starting.pop_first();
                    }
                }
                false
            }
            Input::Record(record, arrived_ms) => {
                let full = self.config.window.is_some_and(|w| self.in_analysis >= w);
                if full || self.analyzer.held_bytes() > self.config.memory_budget {
                    self.restart(record.t_start_ms);
                }
                self.in_analysis += 1;
                self.analyzer.push(&record);
                self.records_seen += 1;
                self.starting.remove(&record.id);
                self.recently_done.push_back(record.id);
                if self.recently_done.len() > RECENTLY_DONE {
                    self.recently_done.pop_front();
                }
                self.whatif_body_bytes += record.request.body_bytes
                    + record.response.as_ref().map_or(0, |r| r.body_bytes);
                if self.records_seen as usize <= MAX_WHATIF_RECORDS
                    && self.whatif_body_bytes <= MAX_WHATIF_BODY_BYTES
                {
                    self.records.push(Arc::clone(&record));
                } else if !self.records.is_empty() {
                    // Past the cap the predictions would be of part of the traffic: none.
                    self.records = Vec::new();
                }
                let pending = pending_request(&record, &mut self.cache_skips);
                if self.next_id.is_some_and(|next| record.id < next) {
                    // Past its turn (an id seen before, a second file): at once.
                    if let Some(pending) = pending {
                        self.admit(pending);
                    }
                } else {
                    self.newest_arrival_ms = self.newest_arrival_ms.max(arrived_ms);
                    self.waiting.insert(record.id, (pending, arrived_ms));
                    self.release(false);
                }
                self.count_arrival(arrived_ms);
                false
            }
            Input::Request(request, arrived_ms) => {
                self.simulate(&request);
                self.count_arrival(arrived_ms);
                false
            }
            Input::SourceDone => {
                self.release(true);
                self.source_done = true;
                true
            }
            Input::Command(Command::Filter(filter)) => {
                self.filter = filter;
                true
            }
            Input::Command(Command::Chart(open)) => {
                self.chart = open;
                true
            }
            Input::Command(Command::Advice(open)) => {
                self.advice = open;
                true
            }
            Input::Command(Command::Capacity(open)) => {
                self.capacity = open;
                true
            }
            Input::BlockModel(given) => {
                let FirstPass {
                    model,
                    choice,
                    first_id,
                } = *given;
                let kept = self.learning.take().unwrap_or_default();
                self.recut(model, choice, kept);
                if first_id.is_some() {
                    self.next_id = first_id;
                }
                false
            }
        }
    }

    /// Hands the records whose turn has come to the simulation, in id order: the next id, or
    /// (`all`, too many waiting, or the oldest waited too long) the oldest there is.
    fn release(&mut self, all: bool) {
        while let Some((&id, &(_, arrived_ms))) = self.waiting.first_key_value() {
            let due = all
                || self.next_id.is_none_or(|next| id <= next)
                || self.waiting.len() > MAX_REORDER
                || self.newest_arrival_ms.saturating_sub(arrived_ms) > MAX_REORDER_WAIT_MS;
            if !due {
                break;
            }
            let Some((pending, _)) = self.waiting.remove(&id) else {
                break;
            };
            self.next_id = Some(id.saturating_add(1));
            if let Some(pending) = pending {
                self.admit(pending);
            }
        }
    }

    /// One request into the simulation: kept for learning, or cut and simulated.
    fn admit(&mut self, pending: Pending) {
        match &mut self.learning {
            Some(kept) => {
                kept.push(pending);
                self.learn();
            }
            None => {
                let request = pending.cut(&mut self.cutter);
                self.simulate(&request);
            }
        }
    }

    /// Chooses the block model over the requests kept so far and cuts them again with it; holds
    /// it once enough were seen.
    fn learn(&mut self) {
        let kept = self.learning.take().unwrap_or_default();
        let (model, mut choice) =
            choose_block_model(&InputOptions::default(), &Pending::evidence(&kept));
        let counted = kept.iter().filter(|p| p.prompt_tokens.is_some()).count();
        let done = counted >= LEARN_COUNTED_REQUESTS || kept.len() >= LEARN_MAX_REQUESTS;
        choice.tokens_per_char_source = format!(
            "{}, learned over the first {} request{}{}",
            choice.tokens_per_char_source,
            kept.len(),
            if kept.len() == 1 { "" } else { "s" },
            if done {
                ", then held"
            } else {
                " (still learning)"
            }
        );
        let kept = self.recut(model, choice, kept);
        if !done {
            self.learning = Some(kept);
        }
    }

    /// Restarts the simulation with `model` and feeds it `kept` again; returns them.
    fn recut(
        &mut self,
        model: BlockModel,
        choice: BlockModelChoice,
        kept: Vec<Pending>,
    ) -> Vec<Pending> {
        self.cache = live_simulator(model.block_size);
        self.cutter = Cutter::new(model);
        self.choice = Some(choice);
        self.server_reuse = (0, 0);
        for pending in &kept {
            let request = pending.clone().cut(&mut self.cutter);
            self.simulate(&request);
        }
        kept
    }

    fn simulate(&mut self, request: &Request) {
        let request_tokens = self.cache.push(request);
        // The axis follows the working set: past its top, every capacity moves (the policies
        // are replayed at the new ones; a few times in all, as the top doubles at least).
        let block_size = self.cutter.model.block_size;
        let axis_top = self
            .cache
            .capacities()
            .last()
            .map_or(0, |c| c.tokens(block_size.max(1)));
        if self.cache.distinct_tokens() > axis_top {
            let (_, capacities) = capacity_axis(block_size, self.cache.distinct_tokens());
            self.cache.set_capacities(capacities);
        }
        if let Some(reused) = request.server_reused_tokens {
            self.server_reuse.0 += request_tokens;
            self.server_reuse.1 += reused.min(request_tokens);
        }
    }

    fn count_arrival(&mut self, arrived_ms: i64) {
        let second = arrived_ms.div_euclid(1000);
        match self.arrivals.back_mut() {
            Some((s, n)) if *s == second => *n = n.saturating_add(1),
            _ => self.arrivals.push_back((second, 1)),
        }
        while self
            .arrivals
            .front()
            .is_some_and(|(s, _)| *s < second - ARRIVAL_WINDOW_S)
        {
            self.arrivals.pop_front();
        }
        self.requests += 1;
    }

    /// Builds the snapshot of everything pushed so far.
    pub fn snapshot(&mut self) -> Snapshot {
        self.generation += 1;
        let report = self.analyzer.live_report();
        let with_text =
            (!self.filter.trim().is_empty()).then(|| self.analyzer.ids_with_text(&self.filter));
        let mut view = View::build_with_text(&report, &self.filter, with_text.as_ref());
        view.curve = self.curve();
        view.prefixes = self.prefixes();
        let asked = self.advice || self.capacity || self.source_done;
        let predictions = if asked {
            self.predictions()
        } else {
            Arc::new(Predictions::NotAsked)
        };
        let slots = if self.capacity {
            self.slot_view(&predictions, &report)
        } else {
            Arc::new(None)
        };
        let snapshot = Snapshot {
            generation: self.generation,
            requests: self.requests,
            simulated: self.cache.requests() as u64,
            not_simulated: self.not_simulated(),
            arrivals: self.arrivals.iter().copied().collect(),
            source_done: self.source_done,
            filter: self.filter.clone(),
            chart: self.chart,
            report,
            view,
            block_model: match &self.choice {
                Some(choice) => choice.describe(),
                None => format!(
                    "{}-token blocks (the trace's hash ids)",
                    self.cutter.model.block_size
                ),
            },
            build_us: 0,
            waited_us: 0,
            server: self.server.clone(),
            probes: self.probes,
            config: self.config.clone(),
            findings: std::sync::OnceLock::new(),
            predictions,
            slots,
            advice: std::sync::OnceLock::new(),
            earlier: self.earlier.clone(),
        };
        if asked {
            // Worked out here, on the engine's thread, so the view only reads them.
            snapshot.advice();
        }
        snapshot
    }

    /// The analysis and the hit-rate curve alone, without the panes' view a snapshot builds:
    /// what the metrics endpoint reads at every rebuild.
    pub fn analysis_and_curve(&mut self) -> (Report<SharedRow>, Option<Curve>) {
        (self.analyzer.live_report(), self.curve())
    }

    /// The server's own slots and host cache, for the slot residency of the capacity view.
    pub fn set_server_settings(&mut self, settings: Option<ServerSettings>) {
        if self.server_settings != settings {
            self.server_settings = settings;
            self.resided = None;
        }
    }

    /// Who holds the slots now: the records so far replayed with the server's settings (its
    /// /props and the traffic, said). Worked out again only when records came since.
    fn slot_view<R: crate::analysis::Priced>(
        &mut self,
        predictions: &Predictions,
        report: &crate::analysis::Report<R>,
    ) -> Arc<Option<SlotView>> {
        // Another engine's slots are its own (Ollama's runner, vLLM's and SGLang's blocks):
        // the replay is llama-server's, and says so.
        let not_llama = self
            .server
            .kind()
            .filter(|k| *k != crate::probe::ServerKind::LlamaCpp)
            .map_or(String::new(), |k| {
                format!(
                    "; the server is {}, whose cache is not llama-server's slots: as llama-server would hold it",
                    crate::units::serde_name(k)
                )
            });
        // The server's own settings, as the predictions found them (its /props, else the
        // traffic), unless the source knows them (the demo's simulated server).
        let settings = self.server_settings.clone().or_else(|| {
            predictions.baseline().map(|b| ServerSettings {
                slots: b.settings.slots,
                cache_ram: b.settings.cache_ram,
                source: format!("its own settings: /props and the traffic{not_llama}"),
            })
        });
        let inputs = SlotViewInputs {
            records_seen: self.records_seen,
            settings: settings.clone(),
            starting: self.starting.keys().copied().collect(),
        };
        if let Some((used, view)) = &self.resided
            && *used == inputs
        {
            return Arc::clone(view);
        }
        let view = Arc::new(match (settings, predictions) {
            // Past the records kept, a replay would be of part of the traffic: none.
            (Some(settings), _) if self.records_seen as usize <= self.records.len() => {
                // The live report is the batch analysis of the same records (the engine's
                // promise): its conversations and links, without analysing them again.
                let starting: Vec<Record> = self.starting.values().map(|r| (**r).clone()).collect();
                Some(SlotView {
                    residency: crate::sim::residency::residency_with_starts(
                        &self.records,
                        report,
                        &starting,
                        settings.slots,
                        settings.cache_ram,
                    ),
                    source: settings.source,
                })
            }
            _ => None,
        });
        self.resided = Some((inputs, Arc::clone(&view)));
        view
    }

    /// The simulated server's savings over the records so far, worked out again only when
    /// records came since.
    fn predictions(&mut self) -> Arc<Predictions> {
        let every = self.capacity;
        if let Some((seen, all, predictions)) = &self.predicted
            && *seen == self.records_seen
            && (*all || !every)
        {
            return Arc::clone(predictions);
        }
        let predictions = Arc::new(if self.records_seen as usize > self.records.len() {
            Predictions::TooMany(self.records_seen)
        } else {
            let records: Vec<Record> = self.records.iter().map(|r| (**r).clone()).collect();
            let props_slots = self.server.total_slots();
            if every {
                predict_at(
                    &records,
                    &crate::analysis::findings::CAPACITY_SETTINGS,
                    props_slots,
                )
            } else {
                let levers: Vec<(usize, bool)> = crate::analysis::findings::LEVERS
                    .iter()
                    .filter_map(|l| l.settings())
                    .collect();
                predict_at(&records, &levers, props_slots)
            }
        });
        self.predicted = Some((self.records_seen, every, Arc::clone(&predictions)));
        predictions
    }

    /// Why received requests are not in the simulation, with how many.
    fn not_simulated(&self) -> Vec<(String, u64)> {
        let mut reasons: Vec<(String, u64)> = self
            .cache_skips
            .skipped
            .iter()
            .map(|(reason, n)| (reason.clone(), *n))
            .collect();
        if self.cache_skips.non_2xx > 0 {
            reasons.push(("non-2xx".into(), self.cache_skips.non_2xx));
        }
        let waiting = self.waiting.values().filter(|(p, _)| p.is_some()).count() as u64;
        if waiting > 0 {
            reasons.push(("waiting for an earlier request".into(), waiting));
        }
        if let Some(earlier) = &self.earlier {
            reasons.push(("before the analysis started again".into(), earlier.requests));
        }
        reasons.retain(|(_, n)| *n > 0);
        reasons
    }

    /// The hit-rate curve of the requests so far (LRU and FIFO at each capacity, the
    /// ceiling, the server's reuse), or `None` before the first simulated request.
    fn curve(&self) -> Option<Curve> {
        if self.cache.requests() == 0 {
            return None;
        }
        let points = self.cache.points();
        let share = |policy: Policy, label: &str| {
            points
                .iter()
                .find(|p| p.policy == policy && p.capacity.as_deref() == Some(label))
                .map_or(0.0, |p| p.hit_rate)
        };
        // Belady's optimal replays every block so far, so only while the chart shows it.
        let optimal = |capacity: &Capacity| {
            self.chart
                .then(|| self.cache.optimal_snapshot(capacity).hit_rate)
        };
        Some(Curve {
            label: format!(
                "cold replay of {}, {}-token blocks",
                plural(self.cache.requests() as u64, "request"),
                self.cutter.model.block_size
            ),
            points: self
                .cache
                .capacities()
                .iter()
                .map(|capacity| {
                    (
                        capacity.label.clone(),
                        share(Policy::Lru, &capacity.label),
                        share(Policy::Fifo, &capacity.label),
                        optimal(capacity),
                    )
                })
                .collect(),
            ceiling: self.cache.ceiling().hit_rate,
            ceiling_prompts_only: self.cache.ceiling_prompts_only().hit_rate,
            observed: (self.server_reuse.0 > 0)
                .then(|| self.server_reuse.1 as f64 / self.server_reuse.0 as f64),
        })
    }

    /// Both leaderboards, merged (the pane sorts by the key the user picked).
    fn prefixes(&self) -> Vec<PrefixItem> {
        let boards = self.cache.leaderboards(TOP_PREFIXES);
        let mut items: Vec<PrefixItem> = Vec::new();
        // By count, the shared role markup every request starts with (2–6 tokens) would lead:
        // a prefix shorter than this says nothing about what is reused.
        let listed = boards
            .by_count
            .iter()
            .chain(&boards.by_reusable_tokens)
            .filter(|g| g.prefix_tokens >= MIN_LISTED_PREFIX_TOKENS);
        for group in listed {
            let label = format!(
                "{} tok prefix ({:.0}% of reusable)",
                thousands(group.prefix_tokens),
                group.share_of_reusable * 100.0
            );
            if !items.iter().any(|i| {
                i.label == label
                    && i.count == group.count
                    && i.reusable_tokens == group.reusable_tokens
            }) {
                items.push(PrefixItem {
                    label,
                    what: group.what.clone(),
                    share_of_reusable: group.share_of_reusable,
                    prefix_tokens: group.prefix_tokens,
                    count: group.count,
                    reusable_tokens: group.reusable_tokens,
                });
            }
        }
        items
    }
}
