//! What the upstream says about itself: llama.cpp's `/props`, `/slots`, `/health`, `/metrics`,
//! Ollama's `/api/ps`, the OpenAI-style `/v1/models` of vLLM, SGLang and llama.cpp, read into one
//! [`ServerInfo`]. Pure: the poller (`probe::poll`, feature `net`) asks, this reads.
//!
//! Every answer is hostile input: numbers are bounded before they size anything, strings are
//! cut, lists are capped, and a value of the wrong type is "not said", never a zero. A probe is
//! recorded as a record marked `probe: true` whose response body is the [`Reading`] (never the
//! server's raw body: `/slots` can carry prompts, `/props` the chat template), so a replay folds
//! the same readings into the same `ServerInfo`.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::capture::{Capture, ResponseCapture};
use crate::limits::plausible_tokens;
use crate::record::{ExchangeError, Record};

/// The `user-agent` every probe sends, so a server's log says who asked.
pub const USER_AGENT: &str = concat!("prefixscope/", env!("CARGO_PKG_VERSION"), " (probe)");

/// Slots kept of a `/slots` answer or `total_slots` (llama.cpp's `-np` is far below it).
pub const MAX_PROBE_SLOTS: usize = 256;
/// Models kept of a `/v1/models` or `/api/ps` answer.
pub const MAX_PROBE_MODELS: usize = 16;
/// Characters kept of a model name, build or status string.
pub const MAX_PROBE_TEXT_CHARS: usize = 160;
/// Probe records are numbered from here (2^48 + 0, + 1…), apart from the exchanges' 1, 2, 3…:
/// probing never renumbers the traffic, and ids stay unique in a recording.
pub const PROBE_ID_BASE: u64 = 1 << 48;
/// Bytes of a probe's answer read at most; past it the answer is not read (unavailable).
pub const MAX_PROBE_BODY_BYTES: usize = 1 << 20;

/// The paths asked, in the order asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    Props,
    Slots,
    Health,
    Metrics,
    Models,
    OllamaPs,
}

impl Endpoint {
    pub const ALL: [Endpoint; 6] = [
        Endpoint::Props,
        Endpoint::Slots,
        Endpoint::Health,
        Endpoint::Metrics,
        Endpoint::Models,
        Endpoint::OllamaPs,
    ];
    /// `record` asks these once: what the server is, not what it is doing.
    pub const AT_START: [Endpoint; 4] = [
        Endpoint::Props,
        Endpoint::Health,
        Endpoint::Models,
        Endpoint::OllamaPs,
    ];

    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Props => "/props",
            Endpoint::Slots => "/slots",
            Endpoint::Health => "/health",
            Endpoint::Metrics => "/metrics",
            Endpoint::Models => "/v1/models",
            Endpoint::OllamaPs => "/api/ps",
        }
    }

    /// The endpoint of a recorded probe's path (a prefix before it allowed: `/base/props`).
    pub fn from_path(path: &str) -> Option<Endpoint> {
        let path = path.split('?').next().unwrap_or_default();
        Endpoint::ALL
            .into_iter()
            .find(|e| path == e.path() || path.ends_with(e.path()))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerKind {
    #[serde(rename = "llama.cpp")]
    LlamaCpp,
    #[serde(rename = "Ollama")]
    Ollama,
    #[serde(rename = "vLLM")]
    Vllm,
    #[serde(rename = "SGLang")]
    Sglang,
}

/// llama.cpp's `GET /props`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Props {
    pub model: Option<String>,
    pub n_ctx: Option<u64>,
    pub total_slots: Option<u32>,
    /// Characters of `chat_template` (`None`: not said; the text itself is not kept).
    pub chat_template_chars: Option<u64>,
    pub build_info: Option<String>,
    /// `modalities` the server says are on (`vision`, `audio`…).
    pub modalities: Vec<String>,
    /// A sliding-window size, if the server says one (`n_swa`, `swa_window`, `sliding_window`).
    pub sliding_window: Option<u64>,
}

/// One slot of llama.cpp's `GET /slots`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Slot {
    pub id: u32,
    /// The task it holds or last held (`None`: not said, or llama.cpp's -1 for none yet).
    pub id_task: Option<u64>,
    pub is_processing: bool,
    pub n_ctx: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Slots {
    pub slots: Vec<Slot>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Health {
    /// `ok`, `loading`, `error`, or the status code when the body says nothing.
    pub status: String,
}

/// The few `/metrics` families that say something about the cache or the load.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Metrics {
    pub kind: Option<ServerKind>,
    /// llama.cpp: prompt tokens evaluated (`llamacpp:prompt_tokens_total`, cached excluded).
    pub prompt_tokens_total: Option<f64>,
    /// llama.cpp: prompt tokens reused (`llamacpp:prompt_tokens_cached_total`).
    pub prompt_tokens_cached_total: Option<f64>,
    pub requests_processing: Option<f64>,
    pub kv_cache_usage_ratio: Option<f64>,
    /// vLLM: `vllm:prefix_cache_hits(_total)` and `vllm:prefix_cache_queries(_total)`, in tokens.
    pub prefix_cache_hits: Option<f64>,
    pub prefix_cache_queries: Option<f64>,
    /// SGLang: `sglang:cache_hit_rate`.
    pub cache_hit_rate: Option<f64>,
}

/// One model of `/v1/models` (`max_model_len`: vLLM and SGLang; `meta.n_ctx`: llama.cpp).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelCard {
    pub id: String,
    pub owned_by: Option<String>,
    pub max_model_len: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Models {
    pub models: Vec<ModelCard>,
}

/// One model Ollama holds in memory (`GET /api/ps`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct LoadedModel {
    pub name: String,
    pub size_vram: Option<u64>,
    pub context_length: Option<u64>,
    pub expires_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct OllamaPs {
    pub models: Vec<LoadedModel>,
}

/// What one endpoint said, as kept: the recorded probe's response body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reading", rename_all = "snake_case")]
pub enum Reading {
    Props(Props),
    Slots(Slots),
    Health(Health),
    Metrics(Metrics),
    Models(Models),
    OllamaPs(OllamaPs),
}

/// One endpoint's answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Read(Reading),
    /// It answered, but not with this (404, 405, 401, a body we cannot read): not asked again.
    Unavailable(String),
    /// Nothing answered (connection refused, no answer in time).
    Unreachable(String),
}

/// Reads one endpoint's answer: its status and body bytes.
pub fn read_answer(endpoint: Endpoint, status: u16, body: &[u8]) -> Answer {
    // llama.cpp's `/health` answers 503 while the model loads: that is its status, not absence.
    let health_status = endpoint == Endpoint::Health && matches!(status, 500..=503);
    if !(200..300).contains(&status) && !health_status {
        return Answer::Unavailable(format!("{} answered {status}", endpoint.path()));
    }
    if body.len() > MAX_PROBE_BODY_BYTES {
        return Answer::Unavailable(format!(
            "{} answered more than {} bytes",
            endpoint.path(),
            MAX_PROBE_BODY_BYTES
        ));
    }
    let reading = if endpoint == Endpoint::Metrics {
        parse_metrics(&String::from_utf8_lossy(body))
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(value) => parse_json(endpoint, status, &value),
            Err(_) if endpoint == Endpoint::Health => Some(Reading::Health(Health {
                status: health_from_status(status),
            })),
            Err(_) => None,
        }
    };
    match reading {
        Some(reading) => Answer::Read(reading),
        None => Answer::Unavailable(format!(
            "{} answered {status} with nothing we read",
            endpoint.path()
        )),
    }
}

fn parse_json(endpoint: Endpoint, status: u16, value: &Value) -> Option<Reading> {
    Some(match endpoint {
        Endpoint::Props => Reading::Props(parse_props(value)?),
        Endpoint::Slots => Reading::Slots(parse_slots(value)?),
        Endpoint::Health => Reading::Health(parse_health(status, value)),
        Endpoint::Metrics => return None,
        Endpoint::Models => Reading::Models(parse_models(value)?),
        Endpoint::OllamaPs => Reading::OllamaPs(parse_ollama_ps(value)?),
    })
}

/// A string cut to `MAX_PROBE_TEXT_CHARS` characters.
fn text(value: Option<&Value>) -> Option<String> {
    let s = value?.as_str()?;
    Some(s.chars().take(MAX_PROBE_TEXT_CHARS).collect())
}

/// A token count: a non-negative integer within `MAX_PROMPT_TOKENS`.
fn tokens(value: Option<&Value>) -> Option<u64> {
    value?.as_u64().and_then(plausible_tokens)
}

fn positive_tokens(value: Option<&Value>) -> Option<u64> {
    tokens(value).filter(|&n| n > 0)
}

/// `GET /props` (llama.cpp). `None` when it is not an object or holds none of its fields.
pub fn parse_props(value: &Value) -> Option<Props> {
    let object = value.as_object()?;
    let settings = value.get("default_generation_settings");
    let modalities = object
        .get("modalities")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter(|(_, on)| on.as_bool() == Some(true))
                .take(MAX_PROBE_MODELS)
                .map(|(name, _)| name.chars().take(MAX_PROBE_TEXT_CHARS).collect())
                .collect()
        })
        .unwrap_or_default();
    let sliding_window = ["n_swa", "swa_window", "sliding_window"]
        .iter()
        .find_map(|key| {
            positive_tokens(object.get(*key))
                .or_else(|| positive_tokens(settings.and_then(|s| s.get(*key))))
        });
    let props = Props {
        model: text(object.get("model_alias"))
            .filter(|s| !s.is_empty())
            .or_else(|| text(object.get("model_path"))),
        n_ctx: positive_tokens(settings.and_then(|s| s.get("n_ctx")))
            .or_else(|| positive_tokens(object.get("n_ctx"))),
        total_slots: object
            .get("total_slots")
            .and_then(Value::as_u64)
            .filter(|&n| (1..=MAX_PROBE_SLOTS as u64).contains(&n))
            .map(|n| n as u32),
        chat_template_chars: object
            .get("chat_template")
            .and_then(Value::as_str)
            .map(|t| t.chars().count() as u64),
        build_info: text(object.get("build_info")),
        modalities,
        sliding_window,
    };
    let said_something = props.model.is_some()
        || props.n_ctx.is_some()
        || props.total_slots.is_some()
        || props.chat_template_chars.is_some();
    said_something.then_some(props)
}

/// `GET /slots` (llama.cpp): an array of slots; entries that are not slots are skipped.
pub fn parse_slots(value: &Value) -> Option<Slots> {
    let array = value.as_array()?;
    let mut slots: Vec<Slot> = array
        .iter()
        .filter_map(|slot| {
            let id = slot.get("id")?.as_u64()?;
            Some(Slot {
                id: u32::try_from(id)
                    .ok()
                    .filter(|&id| (id as usize) < 1 << 16)?,
                id_task: slot.get("id_task").and_then(Value::as_u64),
                is_processing: slot
                    .get("is_processing")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                n_ctx: positive_tokens(slot.get("n_ctx")),
            })
        })
        .take(MAX_PROBE_SLOTS)
        .collect();
    slots.sort_by_key(|s| s.id);
    slots.dedup_by_key(|s| s.id);
    Some(Slots { slots })
}

/// `GET /health`: `{"status": "ok"}`, or llama.cpp's 503 `{"error": {"message": "Loading model"}}`.
pub fn parse_health(status: u16, value: &Value) -> Health {
    if let Some(said) = text(value.get("status")).filter(|s| !s.is_empty()) {
        return Health { status: said };
    }
    let message = value
        .pointer("/error/message")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_ascii_lowercase();
    Health {
        status: if message.contains("loading") {
            "loading".to_string()
        } else {
            health_from_status(status)
        },
    }
}

fn health_from_status(status: u16) -> String {
    match status {
        200..=299 => "ok".to_string(),
        503 => "unavailable (503)".to_string(),
        other => format!("error ({other})"),
    }
}

/// `GET /v1/models`: `{"data": [{"id", "owned_by", "max_model_len"}]}` (llama.cpp puts n_ctx
/// under `meta`).
pub fn parse_models(value: &Value) -> Option<Models> {
    let data = value.get("data")?.as_array()?;
    let models = data
        .iter()
        .filter_map(|card| {
            Some(ModelCard {
                id: text(card.get("id"))?,
                owned_by: text(card.get("owned_by")),
                max_model_len: positive_tokens(card.get("max_model_len"))
                    .or_else(|| positive_tokens(card.pointer("/meta/n_ctx"))),
            })
        })
        .take(MAX_PROBE_MODELS)
        .collect();
    Some(Models { models })
}

/// `GET /api/ps` (Ollama): `{"models": [{"name", "size_vram", "context_length", "expires_at"}]}`.
/// An entry needs `expires_at` or `size_vram` to be a loaded model: llama.cpp's `/v1/models`
/// has a `models` list too, of another shape.
pub fn parse_ollama_ps(value: &Value) -> Option<OllamaPs> {
    let list = value.get("models")?.as_array()?;
    let models: Vec<LoadedModel> = list
        .iter()
        .filter_map(|m| {
            let name = text(m.get("name")).or_else(|| text(m.get("model")))?;
            let size_vram = m.get("size_vram").and_then(Value::as_u64);
            let expires_at = text(m.get("expires_at"));
            (size_vram.is_some() || expires_at.is_some()).then(|| LoadedModel {
                name,
                size_vram,
                context_length: positive_tokens(m.get("context_length")),
                expires_at,
            })
        })
        .take(MAX_PROBE_MODELS)
        .collect();
    (list.is_empty() || !models.is_empty()).then_some(OllamaPs { models })
}

/// `GET /metrics` (Prometheus text): the known families only. `None` when none is there.
pub fn parse_metrics(text: &str) -> Option<Reading> {
    let mut metrics = Metrics::default();
    let mut found = false;
    for line in text.lines().take(100_000) {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // `name{labels} value [timestamp]`; the labels (vLLM's model_name) are not kept.
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => (&line[..i], &line[i..]),
            None => continue,
        };
        let rest = match rest.strip_prefix('{') {
            Some(labelled) => match labelled.find('}') {
                Some(end) => &labelled[end + 1..],
                None => continue,
            },
            None => rest,
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|v| v.is_finite() && *v >= 0.0)
        else {
            continue;
        };
        let (slot, kind) = match name {
            "llamacpp:prompt_tokens_total" => {
                (&mut metrics.prompt_tokens_total, ServerKind::LlamaCpp)
            }
            "llamacpp:prompt_tokens_cached_total" => (
                &mut metrics.prompt_tokens_cached_total,
                ServerKind::LlamaCpp,
            ),
            "llamacpp:requests_processing" => {
                (&mut metrics.requests_processing, ServerKind::LlamaCpp)
            }
            "llamacpp:kv_cache_usage_ratio" => {
                (&mut metrics.kv_cache_usage_ratio, ServerKind::LlamaCpp)
            }
            "vllm:prefix_cache_hits" | "vllm:prefix_cache_hits_total" => {
                (&mut metrics.prefix_cache_hits, ServerKind::Vllm)
            }
            "vllm:prefix_cache_queries" | "vllm:prefix_cache_queries_total" => {
                (&mut metrics.prefix_cache_queries, ServerKind::Vllm)
            }
            "sglang:cache_hit_rate" => (&mut metrics.cache_hit_rate, ServerKind::Sglang),
            _ => continue,
        };
        // Several series of one family (one per model): summed; a rate is the last one's.
        *slot = Some(match (*slot, name) {
            (Some(sum), n) if !n.ends_with("ratio") && !n.ends_with("rate") => sum + value,
            _ => value,
        });
        metrics.kind = Some(kind);
        found = true;
    }
    found.then_some(Reading::Metrics(metrics))
}

impl Reading {
    pub fn endpoint(&self) -> Endpoint {
        match self {
            Reading::Props(_) => Endpoint::Props,
            Reading::Slots(_) => Endpoint::Slots,
            Reading::Health(_) => Endpoint::Health,
            Reading::Metrics(_) => Endpoint::Metrics,
            Reading::Models(_) => Endpoint::Models,
            Reading::OllamaPs(_) => Endpoint::OllamaPs,
        }
    }

    /// The same bounds as a server's answer, for a reading read back from a file.
    fn bounded(self) -> Reading {
        let cut = |s: String| -> String { s.chars().take(MAX_PROBE_TEXT_CHARS).collect() };
        let count = |n: Option<u64>| n.and_then(plausible_tokens).filter(|&n| n > 0);
        match self {
            Reading::Props(p) => Reading::Props(Props {
                model: p.model.map(cut),
                n_ctx: count(p.n_ctx),
                total_slots: p
                    .total_slots
                    .filter(|&n| (1..=MAX_PROBE_SLOTS as u32).contains(&n)),
                chat_template_chars: p.chat_template_chars,
                build_info: p.build_info.map(cut),
                modalities: p
                    .modalities
                    .into_iter()
                    .take(MAX_PROBE_MODELS)
                    .map(cut)
                    .collect(),
                sliding_window: count(p.sliding_window),
            }),
            Reading::Slots(s) => {
                let mut slots: Vec<Slot> = s
                    .slots
                    .into_iter()
                    .filter(|slot| slot.id < 1 << 16)
                    .take(MAX_PROBE_SLOTS)
                    .map(|slot| Slot {
                        n_ctx: count(slot.n_ctx),
                        ..slot
                    })
                    .collect();
                slots.sort_by_key(|s| s.id);
                slots.dedup_by_key(|s| s.id);
                Reading::Slots(Slots { slots })
            }
            Reading::Health(h) => Reading::Health(Health {
                status: cut(h.status),
            }),
            Reading::Metrics(m) => Reading::Metrics(Metrics {
                kind: m.kind,
                prompt_tokens_total: finite(m.prompt_tokens_total),
                prompt_tokens_cached_total: finite(m.prompt_tokens_cached_total),
                requests_processing: finite(m.requests_processing),
                kv_cache_usage_ratio: finite(m.kv_cache_usage_ratio),
                prefix_cache_hits: finite(m.prefix_cache_hits),
                prefix_cache_queries: finite(m.prefix_cache_queries),
                cache_hit_rate: finite(m.cache_hit_rate),
            }),
            Reading::Models(m) => Reading::Models(Models {
                models: m
                    .models
                    .into_iter()
                    .take(MAX_PROBE_MODELS)
                    .map(|c| ModelCard {
                        id: cut(c.id),
                        owned_by: c.owned_by.map(cut),
                        max_model_len: count(c.max_model_len),
                    })
                    .collect(),
            }),
            Reading::OllamaPs(ps) => Reading::OllamaPs(OllamaPs {
                models: ps
                    .models
                    .into_iter()
                    .take(MAX_PROBE_MODELS)
                    .map(|m| LoadedModel {
                        name: cut(m.name),
                        size_vram: m.size_vram,
                        context_length: count(m.context_length),
                        expires_at: m.expires_at.map(cut),
                    })
                    .collect(),
            }),
        }
    }
}

fn finite(value: Option<f64>) -> Option<f64> {
    value.filter(|v| v.is_finite() && *v >= 0.0)
}

/// A record's probe reading: its endpoint and answer, read as hostile input (a file can say
/// anything). `None` for a record that is not a probe, or names no endpoint we ask.
pub fn answer_of_record(record: &Record) -> Option<(Endpoint, Answer)> {
    if !record.probe {
        return None;
    }
    let endpoint = Endpoint::from_path(&record.request.path)?;
    match record.error {
        Some(ExchangeError::Timeout) => {
            let why = format!("{}: no answer in time", endpoint.path());
            return Some((endpoint, Answer::Unavailable(why)));
        }
        // The reason (the OS's) is not in the record: the server did not take the connection.
        Some(_) => return Some((endpoint, Answer::Unreachable("no connection".into()))),
        None => {}
    }
    let Some(response) = record.response.as_ref() else {
        return Some((
            endpoint,
            Answer::Unreachable(format!("{}: no answer", endpoint.path())),
        ));
    };
    let reading = response
        .body
        .as_ref()
        .and_then(|body| serde_json::from_value::<Reading>(body.clone()).ok())
        .filter(|r| r.endpoint() == endpoint)
        .map(Reading::bounded);
    Some((
        endpoint,
        match reading {
            Some(reading) => Answer::Read(reading),
            None => {
                Answer::Unavailable(format!("{} answered {}", endpoint.path(), response.status))
            }
        },
    ))
}

/// What the probes said so far, folded answer by answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ServerInfo {
    pub props: Option<Props>,
    pub slots: Option<Slots>,
    pub health: Option<Health>,
    pub metrics: Option<Metrics>,
    pub models: Option<Models>,
    pub ollama: Option<OllamaPs>,
    /// Endpoints that answered but not with what we read (not asked again).
    pub unavailable: BTreeSet<Endpoint>,
    /// Nothing answered the last probe, and why.
    pub unreachable: Option<String>,
    /// Answers folded in (0: not probed).
    pub answers: u64,
}

impl ServerInfo {
    pub fn apply(&mut self, endpoint: Endpoint, answer: Answer) {
        self.answers += 1;
        match answer {
            Answer::Read(reading) => {
                self.unreachable = None;
                self.unavailable.remove(&endpoint);
                match reading {
                    Reading::Props(p) => self.props = Some(p),
                    Reading::Slots(s) => self.slots = Some(s),
                    Reading::Health(h) => self.health = Some(h),
                    Reading::Metrics(m) => self.metrics = Some(m),
                    Reading::Models(m) => self.models = Some(m),
                    Reading::OllamaPs(p) => self.ollama = Some(p),
                }
            }
            Answer::Unavailable(_) => {
                self.unreachable = None;
                self.unavailable.insert(endpoint);
            }
            Answer::Unreachable(why) => self.unreachable = Some(why),
        }
    }

    /// Folds a recorded probe in; whether `record` was one.
    pub fn apply_record(&mut self, record: &Record) -> bool {
        match answer_of_record(record) {
            Some((endpoint, answer)) => {
                self.apply(endpoint, answer);
                true
            }
            None => record.probe,
        }
    }

    /// Which server this is, from what answered (`None`: cannot tell).
    pub fn kind(&self) -> Option<ServerKind> {
        let owned_by = |name: &str| {
            self.models.as_ref().is_some_and(|m| {
                m.models
                    .iter()
                    .any(|c| c.owned_by.as_deref().is_some_and(|o| o == name))
            })
        };
        if self.props.as_ref().is_some_and(|p| p.total_slots.is_some())
            || self.slots.as_ref().is_some_and(|s| !s.slots.is_empty())
            || owned_by("llamacpp")
        {
            return Some(ServerKind::LlamaCpp);
        }
        if owned_by("vllm") {
            return Some(ServerKind::Vllm);
        }
        if owned_by("sglang") {
            return Some(ServerKind::Sglang);
        }
        if self.ollama.is_some() {
            return Some(ServerKind::Ollama);
        }
        self.metrics.as_ref().and_then(|m| m.kind)
    }

    pub fn model(&self) -> Option<&str> {
        self.props
            .as_ref()
            .and_then(|p| p.model.as_deref())
            .or_else(|| {
                self.ollama
                    .as_ref()
                    .and_then(|o| o.models.first())
                    .map(|m| m.name.as_str())
            })
            .or_else(|| {
                self.models
                    .as_ref()
                    .and_then(|m| m.models.first())
                    .map(|c| c.id.as_str())
            })
    }

    pub fn n_ctx(&self) -> Option<u64> {
        self.props
            .as_ref()
            .and_then(|p| p.n_ctx)
            .or_else(|| {
                self.ollama
                    .as_ref()
                    .and_then(|o| o.models.first())
                    .and_then(|m| m.context_length)
            })
            .or_else(|| {
                self.models
                    .as_ref()
                    .and_then(|m| m.models.first())
                    .and_then(|c| c.max_model_len)
            })
    }

    /// Slots in all: `/slots`' count, else `/props`' `total_slots`.
    pub fn total_slots(&self) -> Option<usize> {
        self.slots
            .as_ref()
            .map(|s| s.slots.len())
            .filter(|&n| n > 0)
            .or_else(|| self.props.as_ref()?.total_slots.map(|n| n as usize))
    }

    /// Slots processing now (`None`: `/slots` not read).
    pub fn busy_slots(&self) -> Option<usize> {
        let slots = self.slots.as_ref()?;
        Some(slots.slots.iter().filter(|s| s.is_processing).count())
    }

    /// The server line: what it is (kind, slots, context, model), or what is not known. Never a
    /// zero for "not said".
    pub fn line(&self) -> String {
        if self.answers == 0 {
            return "server: not probed".to_string();
        }
        if let Some(why) = &self.unreachable
            && self.kind().is_none()
        {
            return format!("server: unreachable ({why})");
        }
        let mut parts = vec![format!(
            "server: {}",
            self.kind()
                .map_or("unknown kind".into(), crate::units::serde_name)
        )];
        match (self.total_slots(), self.busy_slots()) {
            (Some(n), Some(busy)) => parts.push(format!(
                "{} ({busy} busy)",
                crate::units::plural(n as u64, "slot")
            )),
            (Some(n), None) => parts.push(crate::units::plural(n as u64, "slot")),
            (None, _) => {}
        }
        if let Some(n_ctx) = self.n_ctx() {
            parts.push(format!("n_ctx {}", crate::units::thousands(n_ctx)));
        }
        // The model last: its name is the longest part, and a narrow pane cuts the end.
        if let Some(model) = self.model() {
            parts.push(model_name(model).to_string());
        }
        if let Some(window) = self.props.as_ref().and_then(|p| p.sliding_window) {
            parts.push(format!("SWA {}", crate::units::thousands(window)));
        }
        if let Some(health) = self.health.as_ref().filter(|h| h.status != "ok") {
            parts.push(format!("health {}", health.status));
        }
        if self.kind() == Some(ServerKind::LlamaCpp) && self.unavailable.contains(&Endpoint::Slots)
        {
            parts.push("/slots not available".to_string());
        }
        if let Some(why) = &self.unreachable {
            parts.push(format!("now unreachable ({why})"));
        }
        parts.join(" · ")
    }

    /// llama.cpp's slots, one short text each: `0 idle (task 12)`, `1 busy (task 14)`.
    pub fn slot_texts(&self) -> Vec<String> {
        let Some(slots) = self.slots.as_ref() else {
            return Vec::new();
        };
        slots
            .slots
            .iter()
            .map(|s| {
                let state = if s.is_processing { "busy" } else { "idle" };
                match s.id_task {
                    Some(task) => format!("{} {state} (task {task})", s.id),
                    None => format!("{} {state}", s.id),
                }
            })
            .collect()
    }
}

/// One probe's answer in a few words, for the line of its record (`records`, `record`'s status).
pub fn describe(answer: &Answer) -> String {
    let reading = match answer {
        Answer::Read(reading) => reading,
        Answer::Unavailable(why) => return format!("not available: {why}"),
        Answer::Unreachable(why) => return format!("unreachable: {why}"),
    };
    let mut info = ServerInfo::default();
    info.apply(reading.endpoint(), Answer::Read(reading.clone()));
    match reading {
        Reading::Props(_) | Reading::Models(_) | Reading::OllamaPs(_) => info
            .line()
            .strip_prefix("server: ")
            .unwrap_or_default()
            .to_string(),
        Reading::Slots(_) => {
            let texts = info.slot_texts();
            format!(
                "{}: {}",
                crate::units::plural(texts.len() as u64, "slot"),
                texts.join(", ")
            )
        }
        Reading::Health(h) => format!("health {}", h.status),
        Reading::Metrics(m) => {
            let named = [
                ("prompt_tokens_total", m.prompt_tokens_total),
                ("prompt_tokens_cached_total", m.prompt_tokens_cached_total),
                ("requests_processing", m.requests_processing),
                ("kv_cache_usage_ratio", m.kv_cache_usage_ratio),
                ("prefix_cache_hits", m.prefix_cache_hits),
                ("prefix_cache_queries", m.prefix_cache_queries),
                ("cache_hit_rate", m.cache_hit_rate),
            ];
            let said: Vec<String> = named
                .iter()
                .filter_map(|(name, v)| v.map(|v| format!("{name} {v}")))
                .collect();
            format!("metrics: {}", said.join(", "))
        }
    }
}

/// The file name of a model path (`models/SmolLM2.gguf` → `SmolLM2.gguf`).
fn model_name(model: &str) -> &str {
    model.rsplit('/').next().unwrap_or(model)
}

/// The capture of one probe's answer for the recorder: `GET path` with our user agent, the
/// response's body the [`Reading`] as JSON (its status the server's), or no response and
/// `upstream_unreachable` / `timeout`. `conn` 0: no client connection.
pub fn probe_capture<B>(
    id: u64,
    (t_start_ms, t_end_ms): (i64, i64),
    path: &str,
    status: Option<u16>,
    answer: &Answer,
) -> Capture<B> {
    let headers = BTreeMap::from([("user-agent".to_string(), USER_AGENT.to_string())]);
    let (response, error) = match (answer, status) {
        (Answer::Unreachable(_), _) => (None, Some(ExchangeError::UpstreamUnreachable)),
        // The path did not answer (in time, or whole): not asked again.
        (Answer::Unavailable(_), None) => (None, Some(ExchangeError::Timeout)),
        (answer, status) => {
            let body = match answer {
                Answer::Read(reading) => serde_json::to_vec(reading).unwrap_or_default(),
                _ => Vec::new(),
            };
            let response = ResponseCapture {
                status: status.unwrap_or(200),
                headers: BTreeMap::from([(
                    "content-type".to_string(),
                    "application/json".to_string(),
                )]),
                stream: None,
                body_bytes: body.len() as u64,
                body,
                truncated: false,
            };
            (Some(response), None)
        }
    };
    Capture {
        id,
        conn: 0,
        t_start_ms,
        t_first_byte_ms: response.as_ref().map(|_| t_end_ms),
        t_end_ms,
        method: "GET".to_string(),
        path: path.to_string(),
        request_headers: headers,
        request_body_bytes: 0,
        request_body: None,
        response,
        error,
        probe: true,
    }
}

/// Answers per endpoint, as last recorded: a probe is recorded only when its answer changed.
#[derive(Debug, Default)]
pub struct Changes {
    last: BTreeMap<Endpoint, Answer>,
}

impl Changes {
    /// Whether `answer` differs from the last recorded one of `endpoint` (and notes it).
    pub fn changed(&mut self, endpoint: Endpoint, answer: &Answer) -> bool {
        let same = match (self.last.get(&endpoint), answer) {
            (Some(Answer::Unreachable(_)), Answer::Unreachable(_)) => true,
            (Some(Answer::Unavailable(_)), Answer::Unavailable(_)) => true,
            (Some(last), now) => last == now,
            (None, _) => false,
        };
        if !same {
            self.last.insert(endpoint, answer.clone());
        }
        !same
    }

    /// Forgets `endpoint`'s last answer (its record could not be handed over: record it next time).
    pub fn forget(&mut self, endpoint: Endpoint) {
        self.last.remove(&endpoint);
    }
}

#[cfg(test)]
mod tests;
