//! Who serves the traffic, and what its prompt cache can do: a local server (llama.cpp,
//! Ollama, vLLM, SGLang: a cache the analysis models) or a hosted API, whose cache follows the
//! provider's published rules. A hosted provider never evicts a prefix for another
//! conversation or model the way a slot does, never keeps the reply it generated, and caches
//! nothing below its minimum: a miss there is its rule, not a server that dropped its cache.
//!
//! The provider is read from the response alone (a recording keeps no upstream host): fields
//! only that provider's API sets, which a digest recording keeps too.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::normalize::Api;

/// Who answered an exchange.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// A server on the user's side: llama.cpp, Ollama, vLLM, SGLang, LM Studio…
    #[default]
    Local,
    #[serde(rename = "openai")]
    OpenAi,
    Anthropic,
    #[serde(rename = "deepseek")]
    DeepSeek,
    Gemini,
    #[serde(rename = "openrouter")]
    OpenRouter,
    /// Another hosted API (`HOSTED_HOSTS`): no slot to evict, rules not in the table.
    Hosted,
}

/// Hosts of hosted APIs, by the end of the name, and who they are.
const PROVIDER_HOSTS: [(&str, Provider); 18] = [
    ("api.openai.com", Provider::OpenAi),
    (".openai.azure.com", Provider::OpenAi),
    ("api.anthropic.com", Provider::Anthropic),
    ("api.deepseek.com", Provider::DeepSeek),
    ("generativelanguage.googleapis.com", Provider::Gemini),
    ("openrouter.ai", Provider::OpenRouter),
    ("api.groq.com", Provider::Hosted),
    ("api.mistral.ai", Provider::Hosted),
    ("api.together.xyz", Provider::Hosted),
    ("api.fireworks.ai", Provider::Hosted),
    ("api.cerebras.ai", Provider::Hosted),
    ("api.x.ai", Provider::Hosted),
    ("api.z.ai", Provider::Hosted),
    ("api.perplexity.ai", Provider::Hosted),
    ("router.huggingface.co", Provider::Hosted),
    ("api.moonshot.ai", Provider::Hosted),
    (".amazonaws.com", Provider::Hosted),
    ("ollama.com", Provider::Hosted),
];

impl Provider {
    pub fn name(self) -> &'static str {
        match self {
            Provider::Local => "local server",
            Provider::OpenAi => "OpenAI API",
            Provider::Anthropic => "Anthropic API",
            Provider::DeepSeek => "DeepSeek API",
            Provider::Gemini => "Gemini API",
            Provider::OpenRouter => "OpenRouter",
            Provider::Hosted => "hosted API",
        }
    }

    /// The provider a host name says, when it is one of theirs (`PROVIDER_HOSTS`); the port
    /// and a trailing dot are ignored.
    pub fn of_host(host: &str) -> Option<Provider> {
        let name = host
            .rsplit_once(':')
            .filter(|(_, port)| port.chars().all(|c| c.is_ascii_digit()))
            .map_or(host, |(name, _)| name)
            .trim_end_matches('.')
            .to_ascii_lowercase();
        PROVIDER_HOSTS
            .iter()
            .find(|(suffix, _)| {
                name == suffix.trim_start_matches('.')
                    || (suffix.starts_with('.') && name.ends_with(suffix))
                    || name.ends_with(&format!(".{suffix}"))
            })
            .map(|(_, provider)| *provider)
    }

    pub fn hosted(self) -> bool {
        self != Provider::Local
    }

    /// For serde: a local server is the default, left out.
    pub fn is_local(&self) -> bool {
        *self == Provider::Local
    }

    /// The provider, from the response's kept fields (a response digest's `usage` map, or
    /// the body: top-level ids and the `usage` counters) and the model it names.
    ///
    /// - Anthropic: `usage.cache_creation_input_tokens`, which llama.cpp's and vLLM's
    ///   Anthropic-compatible endpoints do not send (llama.cpp sends `cache_read_input_tokens`
    ///   only, checked against its server).
    /// - DeepSeek: `usage.prompt_cache_hit_tokens`.
    /// - OpenRouter: an id `gen-…`.
    /// - OpenAI: a top-level `service_tier`, or a `system_fingerprint` `fp_…` other than
    ///   Ollama's `fp_ollama` (llama.cpp sends its build, `b1234-…`), or a `gpt-`/`o1`/`o3`/
    ///   `o4`/`chatgpt-` model with neither llama.cpp's `timings` nor Ollama's counters.
    /// - Gemini (OpenAI-compatible endpoint): a `gemini-` model without those.
    pub fn of_response(api: Api, fields: &Value) -> Provider {
        let text = |key: &str| fields.get(key).and_then(Value::as_str).unwrap_or("");
        let usage = |key: &str| fields.pointer(&format!("/usage/{key}")).is_some();
        // A server that answers with a model file's path (llama.cpp) is nobody's API.
        if api == Api::AnthropicMessages
            && usage("cache_creation_input_tokens")
            && text("model").starts_with("claude")
        {
            return Provider::Anthropic;
        }
        if usage("prompt_cache_hit_tokens") {
            return Provider::DeepSeek;
        }
        if !matches!(api, Api::OpenaiChat | Api::OpenaiResponses) {
            return Provider::Local;
        }
        if text("id").starts_with("gen-") {
            return Provider::OpenRouter;
        }
        let local_marks = fields.get("timings").is_some()
            || fields.get("prompt_progress").is_some()
            || text("system_fingerprint") == "fp_ollama";
        if local_marks {
            return Provider::Local;
        }
        let fingerprint = text("system_fingerprint");
        let model = text("model");
        // Open-weight models served locally under OpenAI's names are not its API.
        let openai_model = ["gpt-", "o1", "o3", "o4", "chatgpt-"]
            .iter()
            .any(|p| model.starts_with(p))
            && !model.starts_with("gpt-oss");
        if !text("service_tier").is_empty() || fingerprint.starts_with("fp_") || openai_model {
            return Provider::OpenAi;
        }
        if model.starts_with("gemini-") || model.starts_with("models/gemini-") {
            return Provider::Gemini;
        }
        Provider::Local
    }
}

/// What a request asks the provider to cache, where the API lets it choose (Anthropic's
/// `cache_control`): read from the request body, kept in digest recordings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CacheMarks {
    /// `cache_control` markers: on the request itself (automatic caching), the system
    /// prompt, tools or message blocks.
    pub breakpoints: u32,
    /// The longest lifetime any marker asks for, in seconds (300, or 3,600 for `"ttl": "1h"`).
    pub ttl_s: u32,
}

impl CacheMarks {
    /// The markers of an Anthropic request body.
    pub fn of_request(body: &Value) -> CacheMarks {
        let mut marks = CacheMarks::default();
        // Bounded by the body: every marker is at least its own bytes.
        fn walk(value: &Value, marks: &mut CacheMarks) {
            match value {
                Value::Object(object) => {
                    for (key, value) in object {
                        if key == "cache_control" && value.is_object() {
                            marks.breakpoints = marks.breakpoints.saturating_add(1);
                            let ttl = match value.get("ttl").and_then(Value::as_str) {
                                Some("1h") => 3_600,
                                _ => ANTHROPIC_TTL_S,
                            };
                            marks.ttl_s = marks.ttl_s.max(ttl);
                        } else {
                            walk(value, marks);
                        }
                    }
                }
                Value::Array(items) => items.iter().for_each(|item| walk(item, marks)),
                _ => {}
            }
        }
        walk(body, &mut marks);
        marks
    }
}

// The rules and their sources below were read on 2026-12-06.

/// Anthropic's default cache lifetime: 5 minutes, refreshed on every hit.
const ANTHROPIC_TTL_S: u32 = 300;

/// A provider's prompt-cache rules for one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Prompts shorter than this are never cached.
    pub minimum: u32,
    /// Past the minimum, what is cached grows in steps of this many tokens (1: any length).
    pub step: u32,
    /// The request must mark what to cache (`cache_control`); nothing is cached without.
    pub needs_breakpoint: bool,
    /// The shortest time an unused prefix is kept; a miss after a longer gap is the cache
    /// expiring. `None`: the provider names no lifetime short enough to tell.
    pub ttl_s: Option<u32>,
    /// Where the rule is published.
    pub source: &'static str,
}

impl Rules {
    /// What of `reusable` tokens (the prefix the last request sent) the provider can serve
    /// from its cache on a prompt of `prompt` tokens.
    pub fn cacheable(&self, reusable: f64, prompt: u32) -> f64 {
        if prompt < self.minimum {
            return 0.0;
        }
        let reusable = reusable.min(f64::from(prompt));
        if reusable < f64::from(self.minimum) {
            return 0.0;
        }
        let step = f64::from(self.step.max(1));
        let past = ((reusable - f64::from(self.minimum)) / step).floor() * step;
        f64::from(self.minimum) + past
    }
}

const OPENAI_SOURCE: &str = "https://developers.openai.com/api/docs/guides/prompt-caching";
const ANTHROPIC_SOURCE: &str =
    "https://platform.claude.com/docs/en/build-with-claude/prompt-caching";
const DEEPSEEK_SOURCE: &str = "https://api-docs.deepseek.com/guides/kv_cache";
const GEMINI_SOURCE: &str = "https://ai.google.dev/gemini-api/docs/caching";

/// Anthropic's minimum cacheable prompt by model, first match wins (the prompt-caching page
/// as of 2026-08-21; Claude 3 models from its 2025 version). A model not listed takes the
/// smallest: a turn is called too short only when it surely is.
const ANTHROPIC_MINIMUMS: [(&str, u32); 11] = [
    ("claude-opus-5", 512),
    ("claude-fable-5", 512),
    ("claude-mythos-5", 512),
    ("claude-opus-4-7", 2_048),
    ("claude-mythos-preview", 2_048),
    ("claude-3-5-haiku", 2_048),
    ("claude-3-haiku", 2_048),
    ("claude-opus-4-6", 4_096),
    ("claude-opus-4-5", 4_096),
    ("claude-haiku-4-5", 4_096),
    ("claude-", 1_024),
];

/// Gemini's implicit caching minimums (the caching page, updated 2026-10-13), first match
/// wins; a model not listed takes the smallest.
const GEMINI_MINIMUMS: [(&str, u32); 3] = [
    ("gemini-2.5-", 2_048),
    ("gemini-3", 4_096),
    ("gemini-", 1_024),
];

/// OpenAI's steps and lifetimes by model, first match wins: GPT-5.6 and later report the exact
/// boundary and keep prefixes 30 minutes; earlier models round down to 128 tokens and keep
/// prefixes 5 to 10 minutes unused, except where 24-hour retention is the default (GPT-5.x,
/// GPT-4.1: no lifetime short enough to tell an expiry).
const OPENAI_STEPS: [(&str, u32, Option<u32>); 5] = [
    ("gpt-5.6", 1, Some(1_800)),
    ("gpt-6", 1, Some(1_800)),
    ("gpt-5", 128, None),
    ("gpt-4.1", 128, None),
    ("", 128, Some(300)),
];

/// The rules of `provider` for `model`; `None` for a local server (its cache is modelled, not
/// ruled) and for a model OpenRouter routes to a provider not known here.
pub fn rules(provider: Provider, model: &str) -> Option<Rules> {
    let model = model.rsplit('/').next().unwrap_or(model);
    let first = |table: &[(&str, u32)]| {
        table
            .iter()
            .find(|(prefix, _)| model.starts_with(prefix))
            .map_or(1_024, |(_, minimum)| *minimum)
    };
    match provider {
        Provider::Local | Provider::Hosted => None,
        // Automatic for prompts of 1,024 tokens or more.
        Provider::OpenAi => {
            let (_, step, ttl_s) = OPENAI_STEPS
                .iter()
                .find(|(prefix, _, _)| model.starts_with(prefix))
                .copied()
                .unwrap_or(("", 128, Some(300)));
            Some(Rules {
                minimum: 1_024,
                step,
                needs_breakpoint: false,
                ttl_s,
                source: OPENAI_SOURCE,
            })
        }
        // Up to a `cache_control` breakpoint only, past the model's minimum; 5 minutes (or 1
        // hour when asked), refreshed on every read.
        Provider::Anthropic => Some(Rules {
            minimum: first(&ANTHROPIC_MINIMUMS),
            step: 1,
            needs_breakpoint: true,
            ttl_s: Some(ANTHROPIC_TTL_S),
            source: ANTHROPIC_SOURCE,
        }),
        // Automatic, on disk; under 64 tokens never cached (the 2024 announcement; the unit
        // of today's models is not published, so no step is assumed); kept hours to days.
        Provider::DeepSeek => Some(Rules {
            minimum: 64,
            step: 1,
            needs_breakpoint: false,
            ttl_s: None,
            source: DEEPSEEK_SOURCE,
        }),
        // Implicit caching, automatic past the model's minimum; no lifetime promised.
        Provider::Gemini => Some(Rules {
            minimum: first(&GEMINI_MINIMUMS),
            step: 1,
            needs_breakpoint: false,
            ttl_s: None,
            source: GEMINI_SOURCE,
        }),
        // OpenRouter passes the request on: the rules of the model's own provider.
        Provider::OpenRouter => {
            let vendor = if model.starts_with("claude-") {
                Provider::Anthropic
            } else if model.starts_with("gpt-") || model.starts_with('o') {
                Provider::OpenAi
            } else if model.starts_with("deepseek") {
                Provider::DeepSeek
            } else if model.starts_with("gemini-") {
                Provider::Gemini
            } else {
                return None;
            };
            rules(vendor, model)
        }
    }
}

/// Why a hosted provider served less of a turn's prefix from its cache than the turn before
/// sent: its own rules, never another conversation or a server that dropped its cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "rule", rename_all = "snake_case")]
pub enum Uncached {
    /// The prompt is shorter than the provider caches (OpenAI's 1,024 tokens, a Claude
    /// model's minimum).
    BelowMinimum { minimum: u32 },
    /// Anthropic caches only up to a `cache_control` breakpoint, and the request had none.
    NoBreakpoint,
    /// The gap since the prefix was last sent exceeded the cache's lifetime.
    Expired { gap_s: u64, ttl_s: u32 },
    /// None of the rules explains it: the provider did not serve the prefix it had (OpenAI
    /// routes by prefix and sends overflow elsewhere; a cache is per machine).
    ProviderMiss,
}

impl Uncached {
    /// The loss's cause key (`rows[].lost_*.cause`), `None` where nothing could have been
    /// served (below the minimum: no loss).
    pub fn loss_cause(&self) -> Option<&'static str> {
        match self {
            Uncached::BelowMinimum { .. } => None,
            Uncached::NoBreakpoint => Some("no_cache_breakpoint"),
            Uncached::Expired { .. } => Some("cache_expired"),
            Uncached::ProviderMiss => Some("provider_miss"),
        }
    }

    /// The client can change it (a marker, a shorter pause); a miss is the provider's.
    pub fn clients(&self) -> bool {
        matches!(self, Uncached::NoBreakpoint)
    }

    /// In the user's words: "not cacheable: below 1,024 tokens".
    pub fn text(&self) -> String {
        match self {
            Uncached::BelowMinimum { minimum } => format!(
                "not cacheable: below {} tokens",
                crate::units::thousands(u64::from(*minimum))
            ),
            Uncached::NoBreakpoint => "not cacheable: no cache_control breakpoint".into(),
            Uncached::Expired { gap_s, ttl_s } => format!(
                "cache expired: {} since the prefix was sent, past the {} lifetime",
                crate::units::duration_compound(*gap_s as f64 * 1000.0),
                ttl_words(*ttl_s)
            ),
            Uncached::ProviderMiss => {
                "the provider did not serve the prefix it was sent before".into()
            }
        }
    }
}

fn ttl_words(ttl_s: u32) -> String {
    match ttl_s {
        3_600 => "1-hour".into(),
        s if s % 60 == 0 => format!("{}-minute", s / 60),
        s => format!("{s}-second"),
    }
}

/// The fix of a provider's rule, in the user's terms (the findings' fix table).
pub fn fix(cause: &str, provider: Provider) -> &'static str {
    match (cause, provider) {
        ("no_cache_breakpoint", _) => {
            "put a cache_control breakpoint at the end of the stable prefix (the system prompt and tools, then the newest message), or send a top-level cache_control to cache automatically"
        }
        ("cache_expired", Provider::Anthropic) => {
            "the conversation paused past the cache's lifetime: ask for the 1-hour lifetime (cache_control {\"type\": \"ephemeral\", \"ttl\": \"1h\"}) where pauses are longer than 5 minutes"
        }
        ("cache_expired", _) => {
            "the conversation paused past the cache's lifetime (5 to 10 minutes unused): nothing to change unless the pauses can be shorter; OpenAI's extended retention (prompt_cache_retention) keeps prefixes longer on the models that offer it"
        }
        ("provider_miss", Provider::OpenAi) => {
            "the provider did not serve a prefix it had: OpenAI routes requests by a hash of the prompt's start, and a prompt_cache_key per conversation keeps them on the machine that has its prefix"
        }
        _ => {
            "the provider did not serve a prefix it had: its cache is per machine and best-effort; nothing in the traffic explains it"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn providers_from_their_responses() {
        let anthropic = json!({"id": "msg_01X", "model": "claude-sonnet-4-5-20250929", "usage": {"input_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}});
        assert_eq!(
            Provider::of_response(Api::AnthropicMessages, &anthropic),
            Provider::Anthropic
        );
        // llama.cpp's Anthropic endpoint, as its server answered.
        let llama = json!({"id": "chatcmpl-L7lw", "type": "message", "usage": {"cache_read_input_tokens": 0, "input_tokens": 32, "output_tokens": 8}});
        assert_eq!(
            Provider::of_response(Api::AnthropicMessages, &llama),
            Provider::Local
        );
        let openai = json!({"id": "chatcmpl-B9", "model": "gpt-4o-mini-2024-07-18", "service_tier": "default", "system_fingerprint": "fp_1", "usage": {"prompt_tokens": 5}});
        assert_eq!(
            Provider::of_response(Api::OpenaiChat, &openai),
            Provider::OpenAi
        );
        let llama_chat = json!({"model": "gpt-4o", "system_fingerprint": "b0-unknown", "timings": {"cache_n": 1}});
        assert_eq!(
            Provider::of_response(Api::OpenaiChat, &llama_chat),
            Provider::Local
        );
        let ollama = json!({"model": "gpt-oss:20b", "system_fingerprint": "fp_ollama"});
        assert_eq!(
            Provider::of_response(Api::OpenaiChat, &ollama),
            Provider::Local
        );
        let deepseek = json!({"model": "deepseek-chat", "usage": {"prompt_cache_hit_tokens": 64}});
        assert_eq!(
            Provider::of_response(Api::OpenaiChat, &deepseek),
            Provider::DeepSeek
        );
        let vllm = json!({"model": "Qwen/Qwen3-8B", "usage": {"prompt_tokens": 5}});
        assert_eq!(
            Provider::of_response(Api::OpenaiChat, &vllm),
            Provider::Local
        );
        let gpt_oss =
            json!({"model": "gpt-oss-20b", "service_tier": null, "usage": {"prompt_tokens": 5}});
        assert_eq!(
            Provider::of_response(Api::OpenaiChat, &gpt_oss),
            Provider::Local
        );
        let gguf = json!({"model": "/models/qwen.gguf", "usage": {"input_tokens": 3, "cache_creation_input_tokens": 0}});
        assert_eq!(
            Provider::of_response(Api::AnthropicMessages, &gguf),
            Provider::Local
        );
    }

    #[test]
    fn providers_from_their_hosts() {
        assert_eq!(Provider::of_host("api.openai.com"), Some(Provider::OpenAi));
        assert_eq!(
            Provider::of_host("myorg.openai.azure.com:443"),
            Some(Provider::OpenAi)
        );
        assert_eq!(
            Provider::of_host("API.Anthropic.com."),
            Some(Provider::Anthropic)
        );
        assert_eq!(Provider::of_host("api.groq.com"), Some(Provider::Hosted));
        assert_eq!(Provider::of_host("127.0.0.1:8080"), None);
        assert_eq!(Provider::of_host("notapi.openai.com.evil"), None);
        assert_eq!(Provider::of_host("llm.example.com"), None);
    }

    #[test]
    fn openai_caches_from_1024_tokens_in_128_token_steps() {
        let rules = rules(Provider::OpenAi, "gpt-4o-mini").unwrap();
        assert_eq!(rules.cacheable(900.0, 1_000), 0.0);
        assert_eq!(rules.cacheable(1_100.0, 1_200), 1_024.0);
        assert_eq!(rules.cacheable(1_300.0, 1_400), 1_280.0);
        assert_eq!(rules.cacheable(5_000.0, 1_400), 1_280.0);
        let newer = super::rules(Provider::OpenAi, "gpt-5.6-mini").unwrap();
        assert_eq!((newer.step, newer.ttl_s), (1, Some(1_800)));
        let retained = super::rules(Provider::OpenAi, "gpt-4.1-nano").unwrap();
        assert_eq!((retained.step, retained.ttl_s), (128, None));
    }

    #[test]
    fn claude_minimums_by_family_and_unknown_models_take_the_smallest() {
        let min = |model: &str| rules(Provider::Anthropic, model).unwrap().minimum;
        assert_eq!(min("claude-haiku-4-5-20251001"), 4_096);
        assert_eq!(min("claude-3-5-haiku-latest"), 2_048);
        assert_eq!(min("claude-sonnet-4-5"), 1_024);
        assert_eq!(min("claude-fable-5"), 512);
        assert_eq!(min("claude-sonnet-9"), 1_024);
        assert_eq!(
            rules(Provider::OpenRouter, "anthropic/claude-3-5-haiku")
                .unwrap()
                .minimum,
            2_048
        );
        assert!(rules(Provider::Local, "claude-sonnet-4-5").is_none());
    }

    #[test]
    fn markers_counted_with_their_longest_lifetime() {
        let body = json!({
            "cache_control": {"type": "ephemeral"},
            "system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral", "ttl": "1h"}}],
            "messages": [{"role": "user", "content": "no marker"}]
        });
        assert_eq!(
            CacheMarks::of_request(&body),
            CacheMarks {
                breakpoints: 2,
                ttl_s: 3_600
            }
        );
        assert_eq!(
            CacheMarks::of_request(&json!({"messages": []})),
            CacheMarks::default()
        );
    }
}
