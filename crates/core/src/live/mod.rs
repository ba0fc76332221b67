//! The live engine: every consumer of records that the panes read (the analysis engine, the
//! live cache simulation and its block model, the counters, what the panes derive) in one
//! place, behind one immutable `Snapshot`.
//!
//! `Engine` is pure and synchronous (no clock: arrival times come with the inputs), so tests and
//! the headless commands drive it directly. `spawn` runs it on a thread of its own and publishes
//! a snapshot at a capped rate, so the TUI never does record work on its thread and a key never
//! waits behind records (DESIGN.md, "Live engine").

mod sums;
pub mod view;

pub use sums::{Sums, Weighted, label_value};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use serde::Serialize;

use crate::analysis::{Analyzer, Config, Finding, Report, Row, SharedRow};
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

/// Version of the snapshot JSON (the `s` key): `analyze --json`'s report at the same paths, plus
/// what the panes show.
pub const SNAPSHOT_VERSION: u32 = 1;
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

/// Snapshots are published at most this often.
pub const MIN_SNAPSHOT_INTERVAL_MS: u64 = 200;
/// ... and, after a snapshot that took `t` to build, not before `t` times this has passed: the
/// engine spends at most half its time on snapshots, the rest on records, and a record waits
/// at most about two build times to be seen.
pub const SNAPSHOT_COST_FACTOR: u32 = 1;
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

/// Records kept for the simulated server's what-if (the fixes' savings): past this many, the
/// findings view says to run `prefixscope whatif` on the recording instead. The what-if holds
/// every record and replays them all at each update while the view is open, so its cost grows
/// with the traffic (measured in a release build, BENCHMARKS.md "What-if in the TUI": 0.9 s
/// and 50 MiB at 1,000 agent records, 4.6 s and 250 MiB at 5,000, 20 s and 1 GiB at 20,000).
pub const MAX_WHATIF_RECORDS: usize = 1_000;
/// Body bytes of the records kept for the what-if at most: a thousand long-context requests
/// (a megabyte each) would hold gigabytes parsed.
pub const MAX_WHATIF_BODY_BYTES: u64 = 256 << 20;

/// Why the savings stop at `MAX_WHATIF_RECORDS`, in the views' words (the measured cost).
pub const WHATIF_CAP_COST: &str =
    "replayed at each update: 4.6 s and 250 MiB at 5,000 agent records, 20 s and 1 GiB at 20,000";

/// One server setting replayed by the simulated llama-server (`sim::whatif`, what
/// `prefixscope whatif` prints) over the records so far.
#[derive(Debug, Clone)]
pub struct Prediction {
    pub lever: crate::analysis::findings::Lever,
    pub recorded: crate::sim::whatif::Totals,
    pub predicted: crate::sim::whatif::Totals,
    pub replayed: usize,
    /// Prompt tokens the simulated server reused, of the replayed requests' prompt tokens.
    pub hit_rate: f64,
    /// The same of what the real server reported, where it reported it for every request.
    pub recorded_hit_rate: Option<f64>,
    /// The simulated server at the server's own settings: what a saving is measured from, so
    /// the model's own error cancels out.
    pub baseline: Arc<Baseline>,
}

/// The simulated server at the server's own settings (`sim::recorded_settings`: its `/props`,
/// else inferred from the traffic): what every prediction is measured from, and how far the
/// predictions are to be trusted (the calibration).
#[derive(Debug, Clone, PartialEq)]
pub struct Baseline {
    pub settings: crate::sim::RecordedSettings,
    pub predicted: crate::sim::whatif::Totals,
    pub recorded: crate::sim::whatif::Totals,
    /// Requests the server reported its reuse for, and those the replay matched.
    pub compared: usize,
    pub agreed: usize,
}

impl Baseline {
    pub fn trusted(&self) -> bool {
        self.compared > 0
            && self.agreed as f64 >= crate::sim::whatif::TRUSTED_AGREEMENT * self.compared as f64
    }

    /// `-np 2 (the server's /props), --cache-ram off (inferred)`.
    pub fn settings_text(&self) -> String {
        let short = |source: &str| source.split(':').next().unwrap_or(source).to_string();
        let s = &self.settings;
        format!(
            "-np {} ({}), --cache-ram {} ({}){}",
            s.slots,
            short(&s.slots_source),
            if s.cache_ram { "on" } else { "off" },
            short(&s.cache_ram_source),
            match &s.sliding_window {
                Some((window, source)) => {
                    format!(
                        ", sliding window {} ({})",
                        thousands(*window as u64),
                        short(source)
                    )
                }
                None => String::new(),
            }
        )
    }

    /// The calibration as every output says it, with "not to be trusted" below
    /// `TRUSTED_AGREEMENT`.
    pub fn line(&self) -> String {
        if self.compared == 0 {
            return format!(
                "calibration: not measured (the server reported no reuse); at {}",
                self.settings_text()
            );
        }
        format!(
            "calibration: at {} the simulated server matched the server's reuse on {} of {} requests, and predicts {} tokens lost where {} were{}",
            self.settings_text(),
            self.agreed,
            self.compared,
            thousands(self.predicted.lost_tokens),
            thousands(self.recorded.lost_tokens),
            if self.trusted() {
                String::new()
            } else {
                format!(
                    "; under {:.0}%: the predictions are not to be trusted",
                    crate::sim::whatif::TRUSTED_AGREEMENT * 100.0
                )
            }
        )
    }
}

impl Prediction {
    /// Tokens the setting would save against the server's own settings, both simulated
    /// (negative: it would lose more).
    pub fn saving_tokens(&self) -> i64 {
        self.baseline.predicted.lost_tokens as i64 - self.predicted.lost_tokens as i64
    }

    pub fn saving_ms(&self) -> Option<f64> {
        Some(self.baseline.predicted.lost_ms? - self.predicted.lost_ms.unwrap_or(0.0))
    }

    /// `--cache-ram on: −8,175 tokens, −2.1 s`, the saving as the fix states it.
    pub fn saving_text(&self) -> String {
        let tokens = self.saving_tokens();
        let sign = |v: bool| if v { "−" } else { "+" };
        let time = self.saving_ms().map_or(String::new(), |ms| {
            format!(", {}{}", sign(ms >= 0.0), view::duration(ms.abs()))
        });
        format!(
            "{}: {}{} tokens{time}",
            self.lever.flag(),
            sign(tokens >= 0),
            thousands(tokens.unsigned_abs())
        )
    }
}

/// What the simulated server predicts for the records so far.
#[derive(Debug, Clone, Default)]
pub enum Predictions {
    /// Not worked out for this snapshot (the findings view is closed, the source goes on).
    #[default]
    NotAsked,
    /// More records than `MAX_WHATIF_RECORDS` (how many).
    TooMany(u64),
    /// No request the simulated llama-server can replay (not llama.cpp's chat with counts).
    NotReplayable,
    Ready(Vec<Prediction>),
}

impl Predictions {
    /// The simulated server at the server's own settings, which every prediction is measured
    /// from: the capacity view marks them, the slot view replays them.
    pub fn baseline(&self) -> Option<&Baseline> {
        match self {
            Predictions::Ready(all) => all.first().map(|p| &*p.baseline),
            _ => None,
        }
    }

    pub fn of(&self, lever: crate::analysis::findings::Lever) -> Option<&Prediction> {
        match self {
            Predictions::Ready(all) => all.iter().find(|p| p.lever == lever),
            _ => None,
        }
    }

    /// The prediction of `lever` where it saves something: a fix never offers a setting that
    /// saves nothing or loses more.
    pub fn saving(&self, lever: crate::analysis::findings::Lever) -> Option<&Prediction> {
        self.of(lever).filter(|p| p.saving_tokens() > 0)
    }
}

/// A finding with its fix and the savings the simulated server predicts for it.
#[derive(Debug, Clone)]
pub struct Advice {
    pub finding: Finding,
    /// `analyze`'s words for it.
    pub label: String,
    pub fix: crate::analysis::findings::Fix,
    pub savings: Vec<Prediction>,
}

/// Every finding by cost, each with its fix and, where a server setting applies, its savings.
pub fn advise(findings: &[Finding], predictions: &Predictions) -> Vec<Advice> {
    crate::analysis::findings::by_cost(findings)
        .into_iter()
        .map(|finding| {
            let fix = crate::analysis::findings::fix(finding);
            let mut savings: Vec<Prediction> = fix
                .levers
                .iter()
                .filter_map(|l| predictions.saving(*l).cloned())
                .collect();
            savings.sort_by_key(|p| std::cmp::Reverse(p.saving_tokens()));
            Advice {
                finding: finding.clone(),
                label: crate::analysis::report::finding_label(finding),
                fix,
                savings,
            }
        })
        .collect()
}

/// The simulated server over `records` at `settings` (`(slots, cache_ram)`), the recording
/// analysed once for all of them.
/// `props_slots`: the slot count the server's `/props` gave, where `records` hold no probes
/// (the live engine keeps them apart).
pub fn predict_at(
    records: &[Record],
    settings: &[(usize, bool)],
    props_slots: Option<usize>,
) -> Predictions {
    let recorded = crate::analysis::analyze(records, &Config::default());
    let own = crate::sim::whatif::settings_with_slots(records, props_slots);
    let at_own =
        crate::sim::whatif::what_if_given(records, own.slots, own.cache_ram, false, &recorded);
    let (compared, agreed) = at_own.calibration();
    let baseline = Arc::new(Baseline {
        settings: own.clone(),
        predicted: at_own.predicted.clone(),
        recorded: at_own.recorded.clone(),
        compared,
        agreed,
    });
    let mut all = Vec::new();
    // A sliding-window model's lever: a full-size cache, at the server's own slots and host
    // cache.
    let swa_full = own
        .sliding_window
        .is_some()
        .then_some((own.slots, own.cache_ram, true));
    let levers = settings
        .iter()
        .map(|&(slots, cache_ram)| (slots, cache_ram, false))
        .chain(swa_full);
    let mut at_own = Some(at_own);
    for (slots, cache_ram, swa_full) in levers {
        // The server's own settings are usually one of the grid's: replayed once.
        let result = match at_own
            .take_if(|_| (slots, cache_ram, swa_full) == (own.slots, own.cache_ram, false))
        {
            Some(result) => result,
            None => {
                crate::sim::whatif::what_if_given(records, slots, cache_ram, swa_full, &recorded)
            }
        };
        if result.replayed == 0 {
            return Predictions::NotReplayable;
        }
        let prompt: u64 = result
            .requests
            .iter()
            .map(|r| u64::from(r.prompt_tokens))
            .sum();
        let share = |reused: u64| {
            if prompt == 0 {
                0.0
            } else {
                reused as f64 / prompt as f64
            }
        };
        let predicted_reused: u64 = result
            .requests
            .iter()
            .map(|r| u64::from(r.predicted_reused))
            .sum();
        let recorded_reused: Option<u64> = result
            .requests
            .iter()
            .map(|r| r.recorded_reused.map(u64::from))
            .sum();
        all.push(Prediction {
            lever: if swa_full {
                crate::analysis::findings::Lever::SwaFull
            } else {
                crate::analysis::findings::Lever::of_settings(slots, cache_ram)
            },
            recorded: result.recorded,
            predicted: result.predicted,
            replayed: result.replayed,
            hit_rate: share(predicted_reused),
            recorded_hit_rate: recorded_reused.map(share),
            baseline: Arc::clone(&baseline),
        });
    }
    Predictions::Ready(all)
}

/// Everything the panes, the headless lines, the exit summary and the `s` key read; immutable
/// once built.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Increases with every snapshot the engine builds.
    pub generation: u64,
    /// Records and trace requests received.
    pub requests: u64,
    /// Of them, the requests the cache simulation took (the hit-rate curve's "cold replay of N
    /// requests").
    pub simulated: u64,
    /// Why the others were not simulated, `(reason, count)`: not a prompt API (a model list),
    /// a failed exchange, a non-2xx response, no prompt, or waiting for an earlier request
    /// still in flight. `simulated` plus these is `requests`.
    pub not_simulated: Vec<(String, u64)>,
    /// Arrivals per second `(second, count)`, oldest first, for the last minute.
    pub arrivals: Vec<(i64, u32)>,
    pub source_done: bool,
    /// The filter and chart state the view was built with.
    pub filter: String,
    pub chart: bool,
    /// Its rows shared with the engine (and the snapshots before), which writes a row again only
    /// when its label changed; losses are priced by `SharedRow`. Its `findings` are empty:
    /// no pane shows them, so they are worked out when read (`findings()`).
    pub report: Report<SharedRow>,
    pub view: View,
    /// Tokens per character and block size of the hit-rate simulation, and where they came from.
    pub block_model: String,
    /// How long building this snapshot took (µs), measured by the runner; 0 when built directly.
    pub build_us: u64,
    /// How long the oldest input in it waited to be published (µs): queued, pushed, built.
    pub waited_us: u64,
    /// What the server's probes said (`probe`), folded from the probe records so far: the same
    /// in `watch` and in a replay of its recording.
    pub server: crate::probe::ServerInfo,
    /// Probe records received (never counted in `requests`).
    pub probes: u64,
    /// What the findings are worked out with, and them once they were.
    config: Config,
    findings: std::sync::OnceLock<Vec<Finding>>,
    /// The simulated server's savings (when asked: the findings view, the source's end).
    pub predictions: Arc<Predictions>,
    /// Who holds the server's slots now (the capacity view open, llama.cpp's chat traffic).
    pub slots: Arc<Option<SlotView>>,
    advice: std::sync::OnceLock<Vec<Advice>>,
    /// What the analysis dropped at its memory budget, if it reached it.
    pub earlier: Option<Earlier>,
}

impl Snapshot {
    /// The report's findings, worked out on first use (the summary, the JSON).
    pub fn findings(&self) -> &[Finding] {
        self.findings
            .get_or_init(|| crate::analysis::find(&self.report, &self.config))
    }

    /// The findings by cost with their fixes and savings, worked out on first use.
    pub fn advice(&self) -> &[Advice] {
        self.advice.get_or_init(|| {
            advise(
                &crate::analysis::findings::listed(&self.report, self.findings()),
                &self.predictions,
            )
        })
    }

    /// The advice if it was worked out (drawing reads this: it never works anything out).
    pub fn advice_ready(&self) -> Option<&[Advice]> {
        self.advice.get().map(Vec::as_slice)
    }

    /// One line per fix with its predicted saving, for the summary and the `s` text: each server
    /// setting once, with the causes it answers; then the clients' own changes.
    pub fn fix_lines(&self) -> Vec<String> {
        let mut settings: Vec<(&Prediction, Vec<&str>)> = Vec::new();
        let mut changes: Vec<String> = Vec::new();
        for advice in self.advice() {
            let cause = crate::units::cause_label_plural(crate::analysis::findings::advice_cause(
                &advice.finding,
            ));
            for saving in &advice.savings {
                match settings.iter_mut().find(|(p, _)| p.lever == saving.lever) {
                    Some((_, causes)) => {
                        if !causes.contains(&cause) {
                            causes.push(cause);
                        }
                    }
                    None => settings.push((saving, vec![cause])),
                }
            }
            if advice.savings.is_empty() && advice.finding.lost_tokens.unwrap_or(0) > 0 {
                let line = format!("  {} ({cause})", advice.fix.change);
                if !changes.contains(&line) {
                    changes.push(line);
                }
            }
        }
        let mut lines: Vec<String> = settings
            .into_iter()
            .map(|(saving, causes)| {
                format!(
                    "  {} (whatif {}; for {})",
                    saving.saving_text(),
                    saving.lever.whatif_args(),
                    causes.join(", ")
                )
            })
            .collect();
        let wants_settings = self.advice().iter().any(|a| !a.fix.levers.is_empty());
        if let (Predictions::TooMany(n), true) = (&*self.predictions, wants_settings) {
            lines.push(format!(
                "  the server settings' savings: prefixscope whatif FILE --cache-ram on, --slots N ({} records is past the live what-if's {} or {} MiB of bodies: {WHATIF_CAP_COST})",
                thousands(*n),
                thousands(MAX_WHATIF_RECORDS as u64),
                MAX_WHATIF_BODY_BYTES >> 20
            ));
        }
        lines.extend(changes);
        lines
    }

    /// The row behind a detail view, its losses priced.
    pub fn row(&self, id: u64) -> Option<Row> {
        self.report
            .rows
            .iter()
            .find(|r| r.row.id == id)
            .map(SharedRow::priced)
    }

    /// Requests per second over the ten seconds before `now_ms`.
    pub fn requests_per_second(&self, now_ms: i64) -> f64 {
        let now = now_ms.div_euclid(1000);
        let recent: u64 = self
            .arrivals
            .iter()
            .filter(|(second, _)| *second > now - 10 && *second <= now)
            .map(|(_, n)| u64::from(*n))
            .sum();
        recent as f64 / 10.0
    }

    /// The summary every output ends with: the analysis's (as `analyze` prints it), then the
    /// hit-rate curve and the top prefixes, as the panes show them.
    pub fn summary(&self) -> String {
        let mut out = if self.report.coverage.records > 0 || self.requests == 0 {
            self.report.summary_with(self.findings())
        } else {
            String::new()
        };
        if let Some(earlier) = &self.earlier {
            out.insert_str(0, &format!("{}\n", earlier.line()));
        }
        if let Some(curve) = &self.view.curve {
            let points: Vec<String> = curve
                .points
                .iter()
                .map(|(label, lru, _, _)| format!("{label} {:.1}%", lru * 100.0))
                .collect();
            out.push_str(&format!(
                "hit rate ({}): ceiling {:.1}%{} · LRU {}\n",
                curve.label,
                curve.ceiling * 100.0,
                curve
                    .observed
                    .map_or(String::new(), |o| format!(" · server {:.1}%", o * 100.0)),
                points.join(", ")
            ));
        }
        if let Some(line) = self.simulated_line() {
            out.push_str(&line);
            out.push('\n');
        }
        if self.probes > 0 {
            out.push_str(&self.server.line());
            out.push('\n');
        }
        let fixes = self.fix_lines();
        if !fixes.is_empty() {
            out.push_str("fixes (savings predicted by the simulated llama-server):\n");
            for line in fixes {
                out.push_str(&line);
                out.push('\n');
            }
            if let Some(baseline) = self.predictions.baseline() {
                out.push_str(&format!("  {}\n", baseline.line()));
            }
        }
        if !self.view.prefixes.is_empty() {
            out.push_str("top prefixes (requests × prefix, reusable tokens):\n");
            for item in self.view.prefixes.iter().take(5) {
                out.push_str(&format!(
                    "  {}× {} · {} reusable\n",
                    item.count,
                    item.label,
                    thousands(item.reusable_tokens)
                ));
            }
        }
        out
    }

    /// What the cold replay leaves out, when it leaves something out: `the hit rate simulates
    /// 23 of 24 requests (not simulated: 1 not a prompt API)`.
    pub fn simulated_line(&self) -> Option<String> {
        (self.simulated != self.requests).then(|| {
            let reasons: Vec<String> = self
                .not_simulated
                .iter()
                .map(|(reason, n)| format!("{n} {reason}"))
                .collect();
            format!(
                "  the hit rate simulates {} of {} (not simulated: {})",
                thousands(self.simulated),
                plural(self.requests, "request"),
                if reasons.is_empty() {
                    "?".to_string()
                } else {
                    reasons.join(", ")
                }
            )
        })
    }

    /// The `s` key's JSON: `analyze --json`'s report (same keys at the same paths), then what
    /// the panes show beside it.
    pub fn to_json(&self) -> serde_json::Value {
        #[derive(Serialize)]
        struct Point<'a> {
            capacity: &'a str,
            lru: f64,
            fifo: f64,
            optimal: Option<f64>,
        }
        let mut json = serde_json::to_value(&self.report).unwrap_or_default();
        if let Some(object) = json.as_object_mut() {
            object.insert(
                "findings".into(),
                serde_json::to_value(self.findings()).unwrap_or_default(),
            );
            object.insert("snapshot_version".into(), SNAPSHOT_VERSION.into());
            object.insert("requests_received".into(), self.requests.into());
            object.insert("requests_simulated".into(), self.simulated.into());
            if let Some(earlier) = &self.earlier {
                object.insert(
                    "memory_budget".into(),
                    serde_json::json!({
                        "budget_bytes": earlier.budget,
                        "window_records": earlier.window,
                        "restarts": earlier.restarts,
                        "earlier_records": earlier.records,
                        "earlier_lost_tokens": earlier.lost_tokens,
                        "line": earlier.line(),
                    }),
                );
            }
            object.insert(
                "server".into(),
                serde_json::json!({
                    "line": self.server.line(),
                    "kind": self.server.kind(),
                    "model": self.server.model(),
                    "n_ctx": self.server.n_ctx(),
                    "total_slots": self.server.total_slots(),
                    "busy_slots": self.server.busy_slots(),
                    "slots": self.server.slots.as_ref().map(|s| &s.slots),
                    "probes": self.probes,
                }),
            );
            object.insert(
                "not_simulated".into(),
                self.not_simulated
                    .iter()
                    .map(|(reason, n)| (reason.clone(), serde_json::Value::from(*n)))
                    .collect::<serde_json::Map<_, _>>()
                    .into(),
            );
            object.insert(
                "hit_rate".into(),
                match &self.view.curve {
                    Some(curve) => serde_json::json!({
                        "label": curve.label,
                        "ceiling": curve.ceiling,
                        "ceiling_prompts_only": curve.ceiling_prompts_only,
                        "server": curve.observed,
                        "block_model": self.block_model,
                        "points": curve.points.iter().map(|(capacity, lru, fifo, optimal)| Point {
                            capacity, lru: *lru, fifo: *fifo, optimal: *optimal,
                        }).collect::<Vec<_>>(),
                    }),
                    None => serde_json::Value::Null,
                },
            );
            object.insert(
                "top_prefixes".into(),
                serde_json::to_value(&self.view.prefixes).unwrap_or_default(),
            );
            object.insert("filter".into(), self.filter.clone().into());
            let fixes: Vec<serde_json::Value> = self
                .advice()
                .iter()
                .map(|a| {
                    serde_json::json!({
                        "kind": a.finding.kind,
                        "client": a.finding.client,
                        "lost_tokens": a.finding.lost_tokens,
                        "finding": a.label,
                        "owner": a.fix.owner,
                        "fix": a.fix.change,
                        "savings": a.savings.iter().map(|s| serde_json::json!({
                            "setting": s.lever.flag(),
                            "whatif": s.lever.whatif_args(),
                            "recorded_lost_tokens": s.recorded.lost_tokens,
                            "predicted_lost_tokens": s.predicted.lost_tokens,
                            "saved_tokens": s.saving_tokens(),
                            "saved_ms": s.saving_ms(),
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            object.insert("fixes".into(), fixes.into());
            // How far the savings are to be trusted: the simulated server at the server's own
            // settings against what it reported.
            if let Some(b) = self.predictions.baseline() {
                object.insert(
                    "calibration".into(),
                    serde_json::json!({
                        "settings": b.settings,
                        "compared": b.compared,
                        "agreed": b.agreed,
                        "trusted": b.trusted(),
                        "predicted_lost_tokens": b.predicted.lost_tokens,
                        "recorded_lost_tokens": b.recorded.lost_tokens,
                    }),
                );
            }
        }
        json
    }
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

/// The engine on its own thread: what it is fed, and how to reach it.
pub struct Handle {
    inputs: Sender<Input>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Handle {
    /// Where records, trace requests, the end of the source and commands go (bounded: a file
    /// reader waits for the engine instead of holding the file in memory).
    pub fn sender(&self) -> Sender<Input> {
        self.inputs.clone()
    }

    pub fn command(&self, command: Command) {
        let _ = self.inputs.send(Input::Command(command));
    }

    /// Waits for the engine to finish what it was given (every sender dropped) and publish its
    /// last snapshot.
    pub fn join(mut self) {
        let (closed, _) = crossbeam_channel::bounded(1);
        self.inputs = closed;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// How many inputs may wait for the engine (records are small next to what a reader would
/// otherwise hold: a parsed file).
pub const INPUT_QUEUE: usize = 1024;

/// Runs `engine` on its own thread. It takes inputs from the returned handle's channel and, for
/// `watch`, records straight from the recorder (`records`: the recorder's consumer channel, no
/// bridge thread), stamped with `clock`. Every snapshot goes to `publish`, at most every
/// `MIN_SNAPSHOT_INTERVAL_MS` and never sooner than `SNAPSHOT_COST_FACTOR` times the last
/// one's build time; a command or the end of the source is answered at once. The thread ends,
/// after a last snapshot, when every input sender is dropped and `records` is closed.
pub fn spawn(
    mut engine: Engine,
    records: Option<Receiver<Arc<Record>>>,
    clock: Arc<dyn Fn() -> i64 + Send + Sync>,
    publish: impl Fn(Arc<Snapshot>) + Send + 'static,
) -> Handle {
    let (inputs, receiver) = crossbeam_channel::bounded::<Input>(INPUT_QUEUE);
    let thread = std::thread::Builder::new()
        .name("live-engine".into())
        .spawn(move || {
            run(&mut engine, &receiver, records.as_ref(), &*clock, &publish);
        })
        .ok();
    Handle { inputs, thread }
}

/// How long the engine works through queued inputs before it looks at the clock again.
const DRAIN_SLICE: Duration = Duration::from_millis(20);

fn run(
    engine: &mut Engine,
    inputs: &Receiver<Input>,
    records: Option<&Receiver<Arc<Record>>>,
    clock: &(dyn Fn() -> i64 + Send + Sync),
    publish: &dyn Fn(Arc<Snapshot>),
) {
    let never_records = crossbeam_channel::never::<Arc<Record>>();
    let never_inputs = crossbeam_channel::never::<Input>();
    let records_rx = records.unwrap_or(&never_records);
    let (mut inputs_open, mut records_open) = (true, records.is_some());
    let mut dirty = false;
    let mut urgent = false;
    let mut next_build = Instant::now();
    // When the oldest input not yet in a published snapshot arrived.
    let mut waiting_since: Option<Instant> = None;
    let build = |engine: &mut Engine, waiting_since: &mut Option<Instant>| {
        let start = Instant::now();
        let mut snapshot = engine.snapshot();
        let cost = start.elapsed();
        snapshot.build_us = u64::try_from(cost.as_micros()).unwrap_or(u64::MAX);
        snapshot.waited_us = waiting_since.take().map_or(0, |since| {
            u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX)
        });
        publish(Arc::new(snapshot));
        Instant::now()
            + (cost * SNAPSHOT_COST_FACTOR).max(Duration::from_millis(MIN_SNAPSHOT_INTERVAL_MS))
    };
    while inputs_open || records_open {
        // Wait for something, or for the next snapshot to be due.
        let wait = if dirty {
            next_build.saturating_duration_since(Instant::now())
        } else {
            Duration::from_secs(3600)
        };
        let inputs_rx = if inputs_open { inputs } else { &never_inputs };
        let records_now = if records_open {
            records_rx
        } else {
            &never_records
        };
        crossbeam_channel::select! {
            recv(inputs_rx) -> input => match input {
                Ok(input) => {
                    urgent |= engine.push(input);
                    dirty = true;
                }
                Err(_) => inputs_open = false,
            },
            recv(records_now) -> record => match record {
                Ok(record) => {
                    engine.push(Input::Record(record, clock()));
                    dirty = true;
                }
                Err(_) => records_open = false,
            },
            default(wait) => {}
        }
        // Work through what is queued, a slice of time at a time, commands first in line.
        let slice_end = Instant::now() + DRAIN_SLICE;
        while !urgent && Instant::now() < slice_end {
            let mut took = false;
            if inputs_open {
                match inputs.try_recv() {
                    Ok(input) => {
                        urgent |= engine.push(input);
                        dirty = true;
                        took = true;
                    }
                    Err(TryRecvError::Disconnected) => inputs_open = false,
                    Err(TryRecvError::Empty) => {}
                }
            }
            if records_open {
                match records_rx.try_recv() {
                    Ok(record) => {
                        engine.push(Input::Record(record, clock()));
                        dirty = true;
                        took = true;
                    }
                    Err(TryRecvError::Disconnected) => records_open = false,
                    Err(TryRecvError::Empty) => {}
                }
            }
            if !took {
                break;
            }
        }
        if dirty && waiting_since.is_none() {
            waiting_since = Some(Instant::now());
        }
        if dirty && (urgent || Instant::now() >= next_build) {
            next_build = build(engine, &mut waiting_since);
            dirty = false;
            urgent = false;
        }
    }
    if dirty {
        build(engine, &mut waiting_since);
    }
}
