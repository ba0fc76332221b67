//! What the analysis's families sum to (`Sums`): one report's, or the analyses' before a
//! restart and the open one's added, so a figure kept across restarts (the `--metrics`
//! endpoint's) is a sum and never goes back.

use std::collections::{BTreeMap, HashMap};

use super::view::Aliases;
use crate::analysis::{Priced, Rated, Report, time};

/// Label values are cut to this many characters (user agents and model names can be long).
const MAX_LABEL_CHARS: usize = 80;

/// What the analysis families show, summed: one report's (`Sums::of`), or the closed windows'
/// and the open one's (`Sums::add`), so every figure is a sum and windows add up.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sums {
    /// Prompt, reused and evaluated tokens by model (label values).
    pub tokens_by_model: BTreeMap<String, [u64; 3]>,
    /// Tokens and milliseconds (where measured) lost, by (client alias, cause), label values.
    pub lost: BTreeMap<(String, String), (u64, Option<f64>)>,
    pub breaks_by_cause: BTreeMap<String, u64>,
    pub evictions_by_kind: BTreeMap<String, u64>,
    pub turns: u64,
    pub conversations: u64,
}

impl Sums {
    pub fn of<R: Priced>(report: &Report<R>) -> Sums {
        let mut totals = Sums {
            turns: report.coverage.turns,
            conversations: report.coverage.conversations,
            ..Sums::default()
        };
        for rated in report.rows.iter().map(Priced::rated) {
            let row = rated.row();
            let value =
                |m: Option<crate::analysis::Measured<u32>>| m.map_or(0, |m| u64::from(m.value));
            let sums = totals
                .tokens_by_model
                .entry(label_value(&row.model))
                .or_default();
            sums[0] += value(row.counts.prompt_tokens);
            sums[1] += value(row.counts.reused_tokens);
            sums[2] += value(row.counts.evaluated_tokens);
            if let Some(cause) = rated.break_cause {
                *totals
                    .breaks_by_cause
                    .entry(cause.name().to_string())
                    .or_default() += 1;
            }
            if let Some(evicted) = &rated.evicted_by {
                *totals
                    .evictions_by_kind
                    .entry(label_value(&evicted.kind))
                    .or_default() += 1;
            }
        }
        totals.lost = losses(report);
        totals
    }

    /// `other`'s figures added to these.
    pub fn add(&mut self, other: &Sums) {
        for (model, sums) in &other.tokens_by_model {
            let mine = self.tokens_by_model.entry(model.clone()).or_default();
            for (a, b) in mine.iter_mut().zip(sums) {
                *a += b;
            }
        }
        for (key, (tokens, ms)) in &other.lost {
            let mine = self.lost.entry(key.clone()).or_insert((0, None));
            mine.0 += tokens;
            if let Some(ms) = ms {
                mine.1 = Some(mine.1.unwrap_or(0.0) + ms);
            }
        }
        for (cause, n) in &other.breaks_by_cause {
            *self.breaks_by_cause.entry(cause.clone()).or_default() += n;
        }
        for (kind, n) in &other.evictions_by_kind {
            *self.evictions_by_kind.entry(kind.clone()).or_default() += n;
        }
        self.turns += other.turns;
        self.conversations += other.conversations;
    }

    /// Prompt tokens of every model (the weight of a window's ratios when windows are summed).
    pub fn prompt_tokens(&self) -> u64 {
        self.tokens_by_model.values().map(|sums| sums[0]).sum()
    }
}

/// Tokens and milliseconds lost by (client alias, cause): each client's rows through the
/// report's own `time` totals, so summed over clients they are `analyze`'s `time.by_cause` to
/// the token.
fn losses<R: Priced>(report: &Report<R>) -> BTreeMap<(String, String), (u64, Option<f64>)> {
    let aliases = Aliases::new(
        report
            .clients
            .iter()
            .map(|c| (c.client.as_str(), c.harness.as_deref())),
    );
    let mut by_client: HashMap<String, Vec<Rated<'_>>> = HashMap::new();
    for rated in report.rows.iter().map(Priced::rated) {
        let label = label_value(&aliases.of(&rated.row().client));
        by_client.entry(label).or_default().push(rated);
    }
    let mut lost = BTreeMap::new();
    for (client, rows) in by_client {
        for (cause, total) in time(&rows).by_cause {
            lost.insert(
                (client.clone(), label_value(&cause)),
                (total.tokens, total.ms.map(|ms| ms.value)),
            );
        }
    }
    lost
}

/// A label value the text formats take as it is: the encoder writes values unescaped, so
/// quotes, backslashes and control characters (a user agent's) become `_`; cut to
/// `MAX_LABEL_CHARS`.
pub fn label_value(text: &str) -> String {
    let value: String = text
        .chars()
        .take(MAX_LABEL_CHARS)
        .map(|c| {
            if c == '"' || c == '\\' || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    if value.is_empty() {
        "none".into()
    } else {
        value
    }
}

/// A ratio summed over analyses, each weighted by its prompt tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Weighted {
    sum: f64,
    weight: f64,
}

impl Weighted {
    pub fn add(&mut self, value: f64, weight: f64) {
        self.sum += value * weight;
        self.weight += weight;
    }

    /// These and `value` (of `weight`), or `value` alone when these weigh nothing.
    pub fn with(self, value: Option<f64>, weight: f64) -> Option<f64> {
        let mut all = self;
        if let Some(value) = value {
            all.add(value, weight);
        }
        if all.weight > 0.0 {
            Some(all.sum / all.weight)
        } else {
            value
        }
    }
}
