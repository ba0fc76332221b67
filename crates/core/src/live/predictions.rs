//! What the simulated llama-server predicts over the records so far (`sim::whatif` at each
//! setting): the fixes' savings, and the advice that pairs each finding with its fix.

use std::sync::Arc;

use super::view::{self, thousands};
use crate::analysis::{Config, Finding};
use crate::record::Record;

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
/// analysed and its requests cut into tokens once for all of them.
/// `props_slots`: the slot count the server's `/props` gave, where `records` hold no probes
/// (the live engine keeps them apart).
pub fn predict_at(
    records: &[Record],
    settings: &[(usize, bool)],
    props_slots: Option<usize>,
) -> Predictions {
    use crate::sim::whatif::Replayable;
    let recorded = crate::analysis::analyze(records, &Config::default());
    let replayable = Replayable::of(records);
    let own = replayable.settings(props_slots);
    let at_own = replayable.what_if(own.slots, own.cache_ram, false, &recorded);
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
            None => replayable.what_if(slots, cache_ram, swa_full, &recorded),
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
