//! What a prompt's parts weigh in tokens when no tokenizer counted them (`Weights`), and their
//! fit to the server's own prompt counts (`WeightFit`, least absolute deviations).

use super::{DEFAULT_TOKENS_PER_CHAR, Prompt, Segment, tokens_per_char};

/// What a part weighs in tokens when no tokenizer counted it: its characters × a ratio (one for
/// message text, one for tool definitions: some templates render tools densely, some not at
/// all), plus the template's tokens around each message.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Weights {
    pub per_text_char: f64,
    pub per_tools_char: f64,
    pub per_message: f64,
    /// What a template adds to a prompt without a system message (many render a default one:
    /// SmolLM2's, Qwen2.5's), before its first message.
    #[serde(default)]
    pub per_missing_system: f64,
}

impl Weights {
    /// One ratio for every character, nothing per message.
    pub fn ratio(tokens_per_char: f64) -> Weights {
        Weights {
            per_text_char: tokens_per_char,
            per_tools_char: tokens_per_char,
            per_message: 0.0,
            per_missing_system: 0.0,
        }
    }

    pub(super) fn of(&self, segment: &Segment) -> f64 {
        if &*segment.kind == "tools" {
            segment.chars as f64 * self.per_tools_char
        } else {
            segment.chars as f64 * self.per_text_char + self.per_message
        }
    }

    /// Where a part's tokens sit in its characters: its kind's ratio (a fit that came out at 0
    /// or below, or not a number, places them at the default ratio).
    pub(super) fn per_char(&self, segment: &Segment) -> f64 {
        let ratio = if &*segment.kind == "tools" {
            self.per_tools_char
        } else {
            self.per_text_char
        };
        if ratio.is_finite() && ratio > 0.0 {
            ratio
        } else {
            DEFAULT_TOKENS_PER_CHAR
        }
    }
}

/// (message characters, tool characters, messages, 1 without a system message).
const FEATURES: usize = 4;

/// Requests the fit keeps (the first ones with a server count): 40 bytes each.
pub(crate) const MAX_FIT_SAMPLES: usize = 4_096;

/// The server's prompt counts against (message characters, tool characters, messages, no system
/// message), request by request, for a fit of what parts weigh. Bounded and independent of the
/// order requests are added in (a replay's first pass reads them as they completed, the profile
/// in id order; both must fit the same weights): the `MAX_FIT_SAMPLES` requests of smallest key
/// (the record id), plus exact integer sums over all of them for the single ratio.
#[derive(Debug, Clone, Default)]
pub struct WeightFit {
    /// (key, features, tokens), a max-heap by key so the largest goes first past the bound.
    samples: std::collections::BinaryHeap<(u64, [u64; FEATURES], u64)>,
    requests: u64,
    chars: u64,
    tokens: u64,
}

/// Most a per-message template overhead may weigh (tokens).
const MAX_PER_MESSAGE: f64 = 1_000.0;
/// Fewest tokens per character a fit may give text (below, it explains the counts by
/// overheads instead of by the text: not a tokenizer).
const MIN_TOKENS_PER_CHAR: f64 = 0.05;

impl WeightFit {
    /// Adds one prompt whose server count is `tokens`; `key` orders the requests (the record
    /// id, a log's row).
    pub fn add(&mut self, key: u64, prompt: &Prompt, tokens: u64) {
        let text: u64 = prompt.messages.iter().map(|m| m.chars).sum();
        let tools = prompt.tools.as_ref().map_or(0, |t| t.chars);
        let no_system = u64::from(prompt.messages.first().is_none_or(|m| &*m.kind != "system"));
        self.samples.push((
            key,
            [text, tools, prompt.messages.len() as u64, no_system],
            tokens,
        ));
        if self.samples.len() > MAX_FIT_SAMPLES {
            self.samples.pop();
        }
        self.chars = self.chars.saturating_add(text + tools);
        self.tokens = self.tokens.saturating_add(tokens);
        self.requests += 1;
    }

    /// Requests the fit saw.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Their server prompt counts, summed.
    pub fn tokens(&self) -> u64 {
        self.tokens
    }

    /// The single ratio over every character (the fallback).
    pub fn ratio(&self) -> f64 {
        tokens_per_char([(self.chars, Some(self.tokens))])
    }

    /// The kept samples in key order, as numbers.
    fn sorted_samples(&self) -> Vec<([f64; FEATURES], f64)> {
        let mut kept: Vec<_> = self.samples.iter().copied().collect();
        kept.sort_unstable();
        kept.into_iter()
            .map(|(_, x, y)| (x.map(|v| v as f64), y as f64))
            .collect()
    }

    /// The weights that fit the counts best among those the requests determine: least absolute
    /// deviations (one template quirk, such as a default system message on one request, must
    /// not bend every weight), for every subset of (tools, per message, no system message)
    /// beside the text that has at least twice as many requests as unknowns, kept when every
    /// weight is non-negative and bounded; the single ratio when none fits better.
    pub fn weights(&self) -> Weights {
        let fallback = Weights::ratio(self.ratio());
        if self.samples.is_empty() || self.tokens == 0 {
            return fallback;
        }
        let samples = self.sorted_samples();
        let single = self.ratio();
        let single_error: f64 = samples
            .iter()
            .map(|(x, y)| (y - single * (x[0] + x[1])).abs())
            .sum();
        let mut best: Option<(f64, Weights)> = None;
        for mask in 0..(1usize << (FEATURES - 1)) {
            let mut features = vec![0usize];
            features.extend((1..FEATURES).filter(|f| mask & (1 << (f - 1)) != 0));
            if samples.len() < 2 * features.len() {
                continue;
            }
            let Some(beta) = least_absolute_deviations(&samples, &features) else {
                continue;
            };
            let weight = |i: usize| {
                features
                    .iter()
                    .position(|&f| f == i)
                    .map_or(0.0, |a| beta[a])
            };
            let weights = Weights {
                per_text_char: weight(0),
                // Tools not fitted: they weigh what text does.
                per_tools_char: if features.contains(&1) {
                    weight(1)
                } else {
                    weight(0)
                },
                per_message: weight(2),
                per_missing_system: weight(3),
            };
            let valid = [
                weights.per_text_char,
                weights.per_tools_char,
                weights.per_message,
                weights.per_missing_system,
            ]
            .iter()
            .all(|w| w.is_finite() && *w >= 0.0)
                && (MIN_TOKENS_PER_CHAR..=crate::limits::MAX_TOKENS_PER_CHAR)
                    .contains(&weights.per_text_char)
                && weights.per_tools_char <= crate::limits::MAX_TOKENS_PER_CHAR
                && weights.per_message <= MAX_PER_MESSAGE
                && weights.per_missing_system <= MAX_PER_MESSAGE * 10.0;
            if !valid {
                continue;
            }
            let error: f64 = samples
                .iter()
                .map(|(x, y)| {
                    let fitted: f64 = features.iter().zip(&beta).map(|(&f, b)| x[f] * b).sum();
                    (y - fitted).abs()
                })
                .sum();
            if best.as_ref().is_none_or(|(b, _)| error < *b) {
                best = Some((error, weights));
            }
        }
        match best {
            Some((error, weights)) if error < single_error * 0.999 => weights,
            _ => fallback,
        }
    }
}

/// Least absolute deviations of `samples` on `features`, by iteratively reweighted least
/// squares (weights 1 / |residual|); `None` when the requests do not determine the weights.
fn least_absolute_deviations(
    samples: &[([f64; FEATURES], f64)],
    features: &[usize],
) -> Option<Vec<f64>> {
    let mut weights = vec![1.0f64; samples.len()];
    let mut beta = Vec::new();
    for _ in 0..50 {
        let n = features.len();
        let mut xx = vec![vec![0.0f64; n]; n];
        let mut xy = vec![0.0f64; n];
        for ((x, y), w) in samples.iter().zip(&weights) {
            for a in 0..n {
                for b in 0..n {
                    xx[a][b] += w * x[features[a]] * x[features[b]];
                }
                xy[a] += w * x[features[a]] * y;
            }
        }
        let next = solve(&xx, &xy)?;
        let converged = !beta.is_empty()
            && next
                .iter()
                .zip(&beta)
                .all(|(a, b): (&f64, &f64)| (a - b).abs() <= 1e-9 * b.abs().max(1e-9));
        beta = next;
        if converged {
            break;
        }
        for ((x, y), w) in samples.iter().zip(&mut weights) {
            let fitted: f64 = features.iter().zip(&beta).map(|(&f, b)| x[f] * b).sum();
            *w = 1.0 / (y - fitted).abs().max(1e-3);
        }
    }
    Some(beta)
}

/// Solves `xx · beta = xy` (Gaussian elimination with partial pivoting); `None` when singular.
fn solve(xx: &[Vec<f64>], xy: &[f64]) -> Option<Vec<f64>> {
    let n = xy.len();
    let mut m: Vec<Vec<f64>> = xx
        .iter()
        .zip(xy)
        .map(|(row, &y)| {
            let mut row = row.clone();
            row.push(y);
            row
        })
        .collect();
    for col in 0..n {
        let pivot = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        let scale = m.iter().map(|r| r[col].abs()).fold(0.0, f64::max);
        if scale == 0.0 || m[pivot][col].abs() <= scale * 1e-9 {
            return None;
        }
        m.swap(col, pivot);
        let pivot_row = m[col].clone();
        for (index, row) in m.iter_mut().enumerate() {
            if index != col {
                let factor = row[col] / pivot_row[col];
                for (value, pivot_value) in row.iter_mut().zip(&pivot_row).skip(col) {
                    *value -= factor * pivot_value;
                }
            }
        }
    }
    Some((0..n).map(|i| m[i][n] / m[i][i]).collect())
}
