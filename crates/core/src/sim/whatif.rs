//! What-if, pure: replays a recording's chat requests, in the order they reached the server,
//! against the simulated KV cache with other settings (slots, host cache), writes what the
//! simulated server would have reported into copies of the records, and analyses both. The
//! analysis is the same one as for real traffic, so predicted losses carry the same causes.
//!
//! Assumptions, reported with the result (`WhatIf::assumptions`):
//! - Tokens: the ceiling's (`sim::tokens`): each prompt has the server's count of tokens, each
//!   message's where the server's layout puts them (else at the recording's ratio), an edited
//!   message keeps its unchanged head, and a slot keeps the reply it generated but its last
//!   token.
//! - Time: each request occupies a slot for its recorded duration; one that finds every slot
//!   busy waits for the first to free (llama-server's queue). Prefill costs the recording's bulk
//!   rate (server prefill ms per evaluated token over requests of at least 50 tokens).

use serde::Serialize;
use serde_json::{Value, json};

use super::kv::{KvCache, KvConfig, Token};
use super::tokens::SimTokens;
use crate::analysis::{self, Config, Report};
use crate::normalize::Api;
use crate::normalize::exchange::{Exchange, normalize};
use crate::record::Record;

/// Template tokens around each message (`<|im_start|>`, role, newline, `<|im_end|>`).
const TOKENS_PER_MESSAGE: usize = 4;
/// The generation prompt after the last message.
pub(super) const GENERATION_PROMPT_TOKENS: usize = 3;
/// Requests with fewer evaluated tokens don't set the prefill rate (fixed costs dominate).
const RATE_MIN_EVALUATED: u64 = 50;

#[derive(Debug, Clone, Serialize)]
pub struct WhatIf {
    pub slots: usize,
    pub cache_ram: bool,
    /// Requests replayed (chat requests with the server's prompt token count).
    pub replayed: usize,
    /// Records left as they were (not chat, failed, or no token count from the server); probe
    /// records are not counted.
    pub not_replayed: usize,
    pub tokens_per_char: f64,
    pub prefill_ms_per_token: Option<f64>,
    pub assumptions: Vec<String>,
    pub recorded: Totals,
    pub predicted: Totals,
    /// Per replayed request: record id, tokens the server reused, tokens the sim would reuse.
    pub requests: Vec<RequestWhatIf>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RequestWhatIf {
    pub id: u64,
    pub prompt_tokens: u32,
    pub recorded_reused: Option<u32>,
    pub predicted_reused: u32,
    pub slot: usize,
    pub restored: bool,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Totals {
    pub prefill_ms: Option<f64>,
    pub lost_tokens: u64,
    pub lost_ms: Option<f64>,
    /// Cause → (tokens, ms).
    pub by_cause: Vec<(String, u64, Option<f64>)>,
}

impl Totals {
    pub fn from_report(report: &Report) -> Totals {
        Totals {
            prefill_ms: report.time.prefill_ms.map(|m| m.value),
            lost_tokens: report.time.lost_tokens,
            lost_ms: report.time.lost_ms.map(|m| m.value),
            by_cause: report
                .time
                .by_cause
                .iter()
                .map(|(cause, total)| (cause.clone(), total.tokens, total.ms.map(|m| m.value)))
                .collect(),
        }
    }
}

/// The chat requests a replay can use (llama.cpp's `timings` ride on OpenAI-style chat
/// responses, and each needs the server's prompt count), with their record's index.
fn replayable<B: std::borrow::Borrow<Record>>(records: &[B]) -> Vec<(usize, Exchange)> {
    records
        .iter()
        .enumerate()
        .filter_map(|(i, r)| normalize(r.borrow()).ok().map(|x| (i, x)))
        .filter(|(_, x)| {
            x.ok && x.api == Api::OpenaiChat && x.counts.prompt_tokens.is_some_and(|p| p.value > 0)
        })
        .collect()
}

/// What every replay of the same records shares: the requests it can use and their tokens. A
/// request's tokens depend on the order requests reached the server alone (the cutter learns
/// from the ones before it), never on a replay's settings, so they are cut once for all.
pub struct Replayable<'a, B> {
    records: &'a [B],
    /// In record order, with their record's index.
    exchanges: Vec<(usize, Exchange)>,
    /// In the order they reached the server, those the block model can render.
    cut: Vec<CutRequest>,
    /// The tokens' model after every request, for requests still to come.
    tokens: SimTokens,
    sliding_window: Option<(usize, String)>,
}

/// A request as every replay serves it.
struct CutRequest {
    /// Its position in `Replayable::exchanges`.
    exchange: usize,
    prompt: Vec<Token>,
    /// What its slot holds after it.
    held: Vec<Token>,
}

impl<'a, B: std::borrow::Borrow<Record>> Replayable<'a, B> {
    pub fn of(records: &'a [B]) -> Replayable<'a, B> {
        let exchanges = replayable(records);
        let mut order: Vec<usize> = (0..exchanges.len()).collect();
        order.sort_by_key(|&i| (exchanges[i].1.t_start_ms, exchanges[i].1.id));
        let mut tokens = SimTokens::of(records);
        let cut = order
            .into_iter()
            .filter_map(|exchange| {
                let record = records.get(exchanges[exchange].0)?.borrow();
                let (prompt, held) = tokens.answered(record)?;
                Some(CutRequest {
                    exchange,
                    prompt,
                    held,
                })
            })
            .collect();
        Replayable {
            records,
            exchanges,
            cut,
            tokens,
            sliding_window: sliding_window(records),
        }
    }

    /// Replays the requests on a simulated cache with `slots` and `cache_ram`, in the order
    /// they reached the server, each holding a slot for its recorded duration (queued when all
    /// are busy) and leaving its prompt and reply there; `served` sees each request (record
    /// index, exchange, its sim prompt, what the cache did, the reuse in the server's tokens).
    /// Returns the cache as it ends.
    pub(super) fn replay(
        &self,
        slots: usize,
        cache_ram: bool,
        swa_full: bool,
        mut served: impl FnMut(usize, &Exchange, &[Token], super::kv::Served, u32),
    ) -> KvCache {
        let mut config = KvConfig::new(slots, cache_ram);
        config.swa_window = self
            .sliding_window
            .as_ref()
            .filter(|_| !swa_full)
            .map(|(window, _)| *window);
        let mut kv = KvCache::new(config);
        let mut free_at = vec![i64::MIN; kv.slot_count()];
        for CutRequest {
            exchange,
            prompt,
            held,
        } in &self.cut
        {
            let (index, x) = &self.exchanges[*exchange];
            // Wait for a slot if all are busy, as llama-server queues the request.
            let earliest = free_at.iter().copied().min().unwrap_or(i64::MIN);
            let start = x.t_start_ms.max(earliest);
            let slot = kv.choose_slot(prompt, |i| free_at[i] <= start).unwrap_or(0);
            free_at[slot] = start + (x.t_end_ms - x.t_start_ms).max(0);
            let result = kv.serve(slot, prompt, x.id);
            kv.hold(result.slot, held);
            let server_prompt = x.counts.prompt_tokens.map_or(0, |p| p.value);
            // The prompt has the server's count of tokens (fewer only where a count was
            // implausible for its text): the scale is 1 but there.
            let scale = f64::from(server_prompt) / prompt.len().max(1) as f64;
            let reused = ((result.cache_n as f64 * scale).round() as u32)
                .min(server_prompt.saturating_sub(1));
            served(*index, x, prompt, result, reused);
        }
        kv
    }

    /// The tokens' model after every request: requests still to come are cut with it.
    pub(super) fn into_tokens(self) -> SimTokens {
        self.tokens
    }

    /// The server's own settings (`recorded_settings`), with the slot count the server's
    /// `/props` gave where the records do not carry it (the live engine reads the probes
    /// apart).
    pub fn settings(&self, props_slots: Option<usize>) -> RecordedSettings {
        let records = self.records;
        let mut server = crate::probe::ServerInfo::default();
        for record in records.iter().map(|r| r.borrow()).filter(|r| r.probe) {
            server.apply_record(record);
        }
        let props_slots = server.total_slots().or(props_slots);
        let agreed = |slots: usize, cache_ram: bool| -> (usize, usize) {
            let (mut compared, mut agreed) = (0, 0);
            self.replay(slots, cache_ram, false, |_, x, _, _, reused| {
                if let (Some(recorded), Some(prompt)) =
                    (x.counts.reused_tokens, x.counts.prompt_tokens)
                {
                    compared += 1;
                    agreed += usize::from(super::residency::agrees(
                        prompt.value,
                        recorded.value,
                        reused,
                    ));
                }
            });
            (compared, agreed)
        };
        let slot_choices: Vec<usize> = match props_slots {
            Some(slots) => vec![slots.clamp(1, 1_024)],
            None => SLOTS_TRIED.to_vec(),
        };
        // Every candidate, best agreement first; among equals the fewest slots, the host cache on.
        let mut tried: Vec<(usize, bool, (usize, usize))> = slot_choices
            .iter()
            .flat_map(|&slots| [(slots, true), (slots, false)])
            .map(|(slots, cache_ram)| (slots, cache_ram, agreed(slots, cache_ram)))
            .collect();
        tried.sort_by_key(|&(slots, cache_ram, (_, agreed))| {
            (std::cmp::Reverse(agreed), slots, !cache_ram)
        });
        let (slots, cache_ram, (compared, best)) = tried[0];
        let other = tried
            .iter()
            .find(|&&(s, c, _)| s == slots && c != cache_ram)
            .map_or(0, |t| t.2.1);
        let slots_source = match props_slots {
            Some(_) => "the server's /props".to_string(),
            None if compared == 0 => {
                "assumed: the server said nothing and reported no reuse".into()
            }
            None if tried.iter().filter(|t| t.2.1 == best).count() > 1 => format!(
                "assumed: the fewest that agree best with the server's reuse ({best} of {compared} requests); its /props was not recorded"
            ),
            None => format!(
                "inferred: the simulation agrees with the server's reuse on {best} of {compared} requests with it; its /props was not recorded"
            ),
        };
        // Inferred only when every setting that agrees best has the host cache the same way.
        let undecided = tried
            .iter()
            .any(|&(_, c, (_, agreed))| agreed == best && c != cache_ram);
        let cache_ram_source = if compared == 0 || best == other {
            "assumed: llama-server's default; the traffic does not tell".to_string()
        } else if undecided {
            format!(
                "assumed: with {slots} slot{} the simulation agrees with the server's reuse on {best} of {compared} requests with it {}, but other slot counts agree as well either way",
                if slots == 1 { "" } else { "s" },
                if cache_ram { "on" } else { "off" }
            )
        } else {
            format!(
                "inferred: the simulation agrees with the server's reuse on {best} of {compared} requests with it {}, on {other} with it {}",
                if cache_ram { "on" } else { "off" },
                if cache_ram { "off" } else { "on" }
            )
        };
        RecordedSettings {
            sliding_window: self.sliding_window.clone(),
            slots,
            slots_source,
            cache_ram,
            cache_ram_source,
        }
    }

    /// `what_if_given` at these settings: several over the same records cut their requests
    /// into tokens once.
    pub fn what_if(
        &self,
        slots: usize,
        cache_ram: bool,
        swa_full: bool,
        recorded: &Report,
    ) -> WhatIf {
        let records = self.records;
        let exchanges = &self.exchanges;
        let tokens_per_char = tokens_per_char(exchanges.iter().map(|(_, x)| x));
        let rate = prefill_rate(exchanges.iter().map(|(_, x)| x));

        let mut predicted: Vec<Option<Predicted>> = (0..records.len()).map(|_| None).collect();
        let mut requests = Vec::new();
        let kv = self.replay(slots, cache_ram, swa_full, |index, x, _, served, reused| {
            let server_prompt = x.counts.prompt_tokens.map_or(0, |p| p.value);
            let evaluated = server_prompt - reused;
            requests.push(RequestWhatIf {
                id: x.id,
                prompt_tokens: server_prompt,
                recorded_reused: x.counts.reused_tokens.map(|m| m.value),
                predicted_reused: reused,
                slot: served.slot,
                restored: served.restored,
            });
            let prefill_ms = match rate {
                Some(rate) => f64::from(evaluated) * rate,
                None => x.counts.prefill_ms.map_or(0.0, |m| m.value),
            };
            predicted[index] = Some(Predicted {
                reused,
                evaluated,
                prefill_ms,
            });
        });
        let replayed = requests.len();
        let rewritten: Vec<Record> = records
            .iter()
            .zip(&predicted)
            .map(|(record, p)| match p {
                Some(p) => with_counts(record.borrow(), p),
                None => record.borrow().clone(),
            })
            .collect();
        let config = Config::default();
        let after = analysis::analyze(&rewritten, &config);
        WhatIf {
            slots: kv.slot_count(),
            cache_ram,
            replayed,
            // prefixscope's probe records are not traffic: neither replayed nor left out.
            not_replayed: records.iter().filter(|r| !r.borrow().probe).count() - replayed,
            tokens_per_char,
            prefill_ms_per_token: rate,
            assumptions: assumptions(tokens_per_char, rate),
            recorded: Totals::from_report(recorded),
            predicted: Totals::from_report(&after),
            requests,
        }
    }
}

/// The server's settings as the recording shows them, each with where it comes from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecordedSettings {
    /// The sliding window the replay models, and its source (`None`: full attention).
    pub sliding_window: Option<(usize, String)>,
    pub slots: usize,
    /// `the server's /props`, `inferred: …` or `assumed: …`.
    pub slots_source: String,
    pub cache_ram: bool,
    pub cache_ram_source: String,
}

/// The model's sliding window, in tokens, and where it comes from: the server's `/props`, else
/// the served model's family (assumed from its model card); `None` for full attention.
pub(crate) fn sliding_window<B: std::borrow::Borrow<Record>>(
    records: &[B],
) -> Option<(usize, String)> {
    let mut server = crate::probe::ServerInfo::default();
    let mut model = None;
    for record in records.iter().map(|r| r.borrow()) {
        if record.probe {
            server.apply_record(record);
        } else if model.is_none()
            && let Ok(x) = normalize(record)
            && x.api == Api::OpenaiChat
        {
            model = Some(x.served_model.as_deref().unwrap_or(&x.model).to_string());
        }
    }
    if let Some(window) = server.props.as_ref().and_then(|p| p.sliding_window) {
        return Some((
            usize::try_from(window).unwrap_or(usize::MAX),
            "the server's /props".into(),
        ));
    }
    let model = server.model().map(str::to_string).or(model)?;
    let (window, family) = crate::analysis::engine_cause::sliding_window_of(&model)?;
    Some((
        window as usize,
        format!("assumed: {family}'s window, from the model's name"),
    ))
}

/// Slot counts tried when the server never said its own.
const SLOTS_TRIED: [usize; 4] = [1, 2, 4, 8];

/// The server's own settings, from evidence: the slot count its `/props` gave (probe records);
/// what it does not say is inferred from the traffic, as the setting under which the
/// simulation's reuse agrees with the server's on the most requests (a host cache shows as a
/// conversation that comes back to a taken slot with its prefix reused); a default
/// (llama-server's: host cache on) only where nothing tells them apart, and said.
pub fn recorded_settings<B: std::borrow::Borrow<Record>>(records: &[B]) -> RecordedSettings {
    Replayable::of(records).settings(None)
}

/// The simulated server's counts for one request, in the server's tokens.
struct Predicted {
    reused: u32,
    evaluated: u32,
    prefill_ms: f64,
}

pub fn what_if(records: &[Record], slots: usize, cache_ram: bool) -> WhatIf {
    let recorded = analysis::analyze(records, &Config::default());
    what_if_given(records, slots, cache_ram, false, &recorded)
}

/// `what_if` with the recording's own analysis already done (`analysis::analyze(records,
/// &Config::default())`). `swa_full`: a sliding-window model given a full-size cache
/// (llama-server's `--swa-full`).
pub fn what_if_given(
    records: &[Record],
    slots: usize,
    cache_ram: bool,
    swa_full: bool,
    recorded: &Report,
) -> WhatIf {
    Replayable::of(records).what_if(slots, cache_ram, swa_full, recorded)
}

impl WhatIf {
    /// Requests the server reported its reuse for, and of them those whose reuse the replay
    /// matched (`residency::agrees`): at the server's own settings, how far to trust it.
    pub fn calibration(&self) -> (usize, usize) {
        self.requests
            .iter()
            .filter_map(|r| Some((r.prompt_tokens, r.recorded_reused?, r.predicted_reused)))
            .fold(
                (0, 0),
                |(compared, agreed), (prompt, recorded, predicted)| {
                    (
                        compared + 1,
                        agreed + usize::from(super::residency::agrees(prompt, recorded, predicted)),
                    )
                },
            )
    }
}

/// The share of requests the replay must match at the server's own settings for its
/// predictions to be trusted.
pub const TRUSTED_AGREEMENT: f64 = 0.9;

fn assumptions(tokens_per_char: f64, rate: Option<f64>) -> Vec<String> {
    vec![
        "requests replayed in the order they reached the server, each holding a slot for its recorded duration (queued when all slots were busy)".into(),
        format!(
            "tokens as the ceiling has them: each prompt the server's count, each message where the server's layout puts it, else at {tokens_per_char:.3} tokens a character (the recording's ratio); a changed message keeps its unchanged start"
        ),
        "a slot keeps the prompt and the reply it generated, but the reply's last token (llama.cpp's prompt + completion − 1)".into(),
        match rate {
            Some(rate) => format!(
                "prefill at the recording's rate, {:.3} ms per evaluated token",
                rate
            ),
            None => "no server prefill times in the recording: each request keeps its own".into(),
        },
        "llama-server's slot choice (shared prefix over 10% of the prompt, else least recently used) and, with --cache-ram on, an unbounded host cache".into(),
    ]
}

/// Σ prompt tokens (less the template's) / Σ characters of messages and tools.
fn tokens_per_char<'a>(exchanges: impl Iterator<Item = &'a Exchange>) -> f64 {
    let (mut tokens, mut chars) = (0.0, 0.0);
    for x in exchanges {
        let template = (x.messages.len() * TOKENS_PER_MESSAGE + GENERATION_PROMPT_TOKENS) as f64;
        let prompt = f64::from(x.counts.prompt_tokens.map_or(0, |p| p.value));
        tokens += (prompt - template).max(0.0);
        chars += f64::from(
            x.messages
                .iter()
                .map(|m| m.chars)
                .chain(x.tools.iter().map(|t| t.chars))
                .sum::<u32>(),
        );
    }
    if chars > 0.0 { tokens / chars } else { 0.25 }
}

/// Server prefill ms per evaluated token over requests that evaluated enough to measure it.
fn prefill_rate<'a>(exchanges: impl Iterator<Item = &'a Exchange>) -> Option<f64> {
    let (mut ms, mut evaluated) = (0.0, 0u64);
    for x in exchanges {
        if let (Some(prefill), Some(n)) = (x.counts.prefill_ms, x.counts.evaluated_tokens)
            && u64::from(n.value) >= RATE_MIN_EVALUATED
            && prefill.source == analysis::Source::Server
        {
            ms += prefill.value;
            evaluated += u64::from(n.value);
        }
    }
    (evaluated > 0).then(|| ms / evaluated as f64)
}

/// A copy of `record` whose response says what the simulated server did.
fn with_counts(record: &Record, p: &Predicted) -> Record {
    let mut record = record.clone();
    let Some(response) = record.response.as_mut() else {
        return record;
    };
    let fields = match (response.body.as_mut(), response.digest.as_mut()) {
        (_, Some(digest)) => Some(&mut digest.usage),
        (Some(Value::Object(body)), None) => Some(body),
        _ => None,
    };
    let Some(fields) = fields else {
        return record;
    };
    let timings = fields.entry("timings").or_insert_with(|| json!({}));
    if let Value::Object(timings) = timings {
        timings.insert("cache_n".into(), json!(p.reused));
        timings.insert("prompt_n".into(), json!(p.evaluated));
        timings.insert("prompt_ms".into(), json!(p.prefill_ms));
        if p.evaluated > 0 && p.prefill_ms > 0.0 {
            timings.insert(
                "prompt_per_token_ms".into(),
                json!(p.prefill_ms / f64::from(p.evaluated)),
            );
            timings.insert(
                "prompt_per_second".into(),
                json!(f64::from(p.evaluated) * 1000.0 / p.prefill_ms),
            );
        }
    }
    if let Some(Value::Object(details)) = fields.get_mut("usage").and_then(|usage| {
        usage.as_object_mut().map(|u| {
            u.entry("prompt_tokens_details")
                .or_insert_with(|| json!({}))
        })
    }) {
        details.insert("cached_tokens".into(), json!(p.reused));
    }
    record
}
