//! The snapshot: everything the panes, the headless lines, the exit summary and the `s` key
//! read, with its text summary and JSON.

use std::sync::Arc;

use serde::Serialize;

use super::view::{View, thousands};
use super::{
    Advice, Earlier, MAX_WHATIF_BODY_BYTES, MAX_WHATIF_RECORDS, Prediction, Predictions, SlotView,
    WHATIF_CAP_COST, advise,
};
use crate::analysis::{Config, Finding, Report, Row, SharedRow};
use crate::units::plural;

/// Version of the snapshot JSON (the `s` key): `analyze --json`'s report at the same paths, plus
/// what the panes show.
pub const SNAPSHOT_VERSION: u32 = 1;

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
    pub(super) config: Config,
    pub(super) findings: std::sync::OnceLock<Vec<Finding>>,
    /// The simulated server's savings (when asked: the findings view, the source's end).
    pub predictions: Arc<Predictions>,
    /// Who holds the server's slots now (the capacity view open, llama.cpp's chat traffic).
    pub slots: Arc<Option<SlotView>>,
    pub(super) advice: std::sync::OnceLock<Vec<Advice>>,
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
