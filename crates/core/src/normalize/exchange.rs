//! Record → Exchange: what the analysis reads from one chat exchange, with every count carrying
//! its source. Adapted from llmp 0.1.0 (`normalize/`, MIT, see NOTICE), extended with the
//! Anthropic Messages API.

use std::cell::RefCell;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::digest::memo::Generations;
use super::measured::{Measured, Source};
use super::{Api, digest};
use crate::record::{MessageDigest, Output, Params, Record, RequestDigest, ToolCall};

#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Counts {
    pub prompt_tokens: Option<Measured<u32>>,
    pub completion_tokens: Option<Measured<u32>>,
    pub reused_tokens: Option<Measured<u32>>,
    pub evaluated_tokens: Option<Measured<u32>>,
    pub prefill_ms: Option<Measured<f64>>,
    pub decode_ms: Option<Measured<f64>>,
    pub load_ms: Option<Measured<f64>>,
    /// prefixscope: tokens the provider wrote to its cache for later requests (Anthropic's
    /// `cache_creation_input_tokens`), billed above the input price. With `reused_tokens` it
    /// is where the request's last `cache_control` breakpoint fell.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_written: Option<Measured<u32>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    pub id: u64,
    pub t_start_ms: i64,
    pub t_end_ms: i64,
    pub api: Api,
    pub model: String,
    /// The model the server says it ran (llama.cpp: the model file's path), when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served_model: Option<Arc<str>>,
    pub user_agent: Option<Arc<str>>,
    /// The harness's session or conversation id (`SESSION_ID_HEADERS`), when it sends one:
    /// requests with different ids are never one conversation.
    pub session_id: Option<Arc<str>>,
    pub messages: Vec<Arc<Msg>>,
    /// Shared, like the messages: every request of a conversation sends the same tools.
    pub tools: Arc<[ToolDef]>,
    pub tools_hash: Option<Arc<str>>,
    pub params: Params,
    pub counts: Counts,
    pub output: Output,
    pub ok: bool,
    /// prefixscope: who answered, read from the response (`Provider::of_response`).
    #[serde(default)]
    pub provider: crate::provider::Provider,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Msg {
    pub role: String,
    /// llmp's message hash (the recording format's key, tokenizer counts are keyed by it).
    pub hash: String,
    /// What the analysis compares: equal when a server renders two messages alike
    /// (`MessageDigest::identity`), else the hash.
    pub identity: String,
    pub chars: u32,
    pub tokens: Option<Measured<u32>>,
    pub head: String,
    pub tail: String,
    /// The text, in full mode only (digest recordings keep none).
    pub text: Option<Arc<str>>,
    pub tool_calls: Vec<ToolCall>,
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// Characters of the reasoning sent back with it (`MessageDigest::reasoning_chars`).
    #[serde(default)]
    pub reasoning_chars: u32,
    /// Its media parts (`MessageDigest::media`): their tokens are the server's count less the
    /// text's, never spread over the other messages.
    #[serde(default)]
    pub media: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDef {
    pub name: String,
    pub hash: String,
    pub chars: u32,
    pub tokens: Option<Measured<u32>>,
    /// The provider's own tool (`ToolDigest::provided`).
    #[serde(default)]
    pub provided: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SkipReason {
    NotChat,
    Error,
    Non2xx,
    Unparsed,
    /// More messages or tools than any conversation holds (`MAX_MESSAGES`, `MAX_TOOLS`): a
    /// body of tiny values (`"messages": [0, 0, …]`) would cost hundreds of times its bytes.
    TooLarge,
}

/// The most messages a request may have to be analysed: agent sessions reach thousands.
pub(crate) const MAX_MESSAGES: usize = 20_000;
/// The most tools a request may offer to be analysed.
pub(crate) const MAX_TOOLS: usize = 2_000;

/// Request headers harnesses send with a session or conversation id, first match wins:
/// Claude Code's, opencode's (`x-session-affinity` beside `x-session-id`), then generic names.
pub(crate) const SESSION_ID_HEADERS: [&str; 10] = [
    "x-claude-code-session-id",
    "x-session-affinity",
    "x-session-id",
    "x-opencode-session",
    "x-conversation-id",
    "x-client-session-id",
    "session-id",
    "session_id",
    "conversation-id",
    "conversation_id",
];

fn session_id(record: &Record) -> Option<Arc<str>> {
    let headers = &record.request.headers;
    SESSION_ID_HEADERS
        .iter()
        .find_map(|name| headers.get(*name))
        .filter(|value| !value.is_empty())
        .map(|value| Arc::from(value.as_str()))
}

/// A client that hung up once the reply had ended, before the server closed the stream: the
/// exchange is whole, the error only the client's haste. Codex hangs up at the Responses
/// stream's `response.completed`; aider (litellm) sometimes at the chat chunk that carries
/// `finish_reason`, before `[DONE]`. The end is the Responses `status: completed`, a chat
/// choice's `finish_reason`, or Anthropic's `stop_reason` (the last two kept by a digest only as
/// Anthropic's top-level `stop_reason`).
pub fn closed_after_completion(record: &Record) -> bool {
    let ended = |v: &Value| {
        v.get("status").and_then(Value::as_str) == Some("completed")
            || v.get("stop_reason").is_some_and(|r| !r.is_null())
            || v.pointer("/choices/0/finish_reason")
                .is_some_and(|r| !r.is_null())
    };
    record.error == Some(crate::record::ExchangeError::ClientDisconnected)
        && record.response.as_ref().is_some_and(|response| {
            response.body.as_ref().is_some_and(ended)
                || response.digest.as_ref().is_some_and(|d| {
                    d.usage.get("status").and_then(Value::as_str) == Some("completed")
                        || d.usage.get("stop_reason").is_some_and(|r| !r.is_null())
                })
        })
}

/// A request that only checks the server is there: a `HEAD` anywhere, or `GET /` (Claude Code
/// sends `HEAD /` before its first stream).
pub(crate) fn is_connectivity_check(record: &Record) -> bool {
    let path = record.request.path.split('?').next().unwrap_or_default();
    let method = record.request.method.as_str();
    method.eq_ignore_ascii_case("HEAD") || (method.eq_ignore_ascii_case("GET") && path == "/")
}

/// First match wins: not a chat path, an error or no response, a non-2xx status, no messages.
pub fn normalize(record: &Record) -> Result<Exchange, SkipReason> {
    let api = Api::from_path(&record.request.path);
    if !api.is_chat() {
        return Err(SkipReason::NotChat);
    }
    if record.error.is_some() && !closed_after_completion(record) {
        return Err(SkipReason::Error);
    }
    let Some(response) = record.response.as_ref() else {
        return Err(SkipReason::Error);
    };
    if !(200..300).contains(&response.status) {
        return Err(SkipReason::Non2xx);
    }
    let (request, sent) = request_parts(api, record)?;
    let response_digest = match (&response.digest, &response.body) {
        (Some(digest), _) => Some(digest.clone()),
        (None, Some(body)) => Some(digest::response_digest(api, body)),
        (None, None) => None,
    };
    let ok = response_digest.is_some();
    let (fields, output) = response_digest.map_or((Value::Null, Output::default()), |digest| {
        (Value::Object(digest.usage), digest.output)
    });
    let served_model = fields
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .map(|m| match m.char_indices().nth(MAX_MODEL_CHARS) {
            Some((cut, _)) => Arc::from(&m[..cut]),
            None => Arc::from(m),
        });
    // The host the upstream answered as, where the recording has it, else the response.
    let provider = record
        .request
        .headers
        .get("host")
        .and_then(|host| crate::provider::Provider::of_host(host))
        .unwrap_or_else(|| crate::provider::Provider::of_response(api, &fields));
    let server = match api {
        Api::OllamaChat => ollama_counts(&fields),
        Api::AnthropicMessages => anthropic_counts(&fields),
        Api::OpenaiResponses => responses_counts(&fields),
        _ => openai_counts(&fields),
    };
    let ttfb_ms = record
        .t_first_byte_ms
        .map(|first_byte| (first_byte - record.t_start_ms).max(0));
    let counts = derive(server, response.stream.is_some(), ttfb_ms);

    let tokens = record.tokens.as_ref();
    let tokenizer = |value: &u32| Measured {
        value: *value,
        source: Source::Tokenizer,
    };
    let counted = |message: Arc<Msg>| match tokens.and_then(|t| t.messages.get(&message.hash)) {
        Some(count) => Arc::new(Msg {
            tokens: Some(tokenizer(count)),
            ..Msg::clone(&message)
        }),
        None => message,
    };
    let messages: Vec<Arc<Msg>> = match sent {
        Some(sent) => sent.into_iter().map(counted).collect(),
        // Collected into a new vector, not in place: the digests' buffer is 27 times the size
        // of the `Arc`s, and an in-place collect would keep all of it for the life of the
        // exchange (1.4 KB of a real record's 3.9 KB in the engine).
        None => {
            let mut messages = Vec::with_capacity(request.messages.len());
            messages.extend(
                request
                    .messages
                    .into_iter()
                    .map(|message| counted(Arc::new(Msg::of(message, None)))),
            );
            messages
        }
    };
    let tools = request
        .tools
        .into_iter()
        .map(|tool| ToolDef {
            tokens: tokens.and_then(|t| t.tools.get(&tool.hash)).map(tokenizer),
            name: tool.name,
            hash: tool.hash,
            chars: tool.chars,
            provided: tool.provided,
        })
        .collect();
    Ok(Exchange {
        id: record.id,
        t_start_ms: record.t_start_ms,
        t_end_ms: record.t_end_ms,
        api,
        model: request.model.unwrap_or_default(),
        served_model,
        user_agent: record
            .request
            .headers
            .get("user-agent")
            .map(|agent| Arc::from(agent.as_str())),
        session_id: session_id(record),
        messages,
        tools,
        tools_hash: request.tools_hash.map(Arc::from),
        params: request.params,
        counts,
        output,
        ok,
        provider,
    })
}

/// A served model name longer than this is cut (a path is rarely longer; a hostile server's
/// could be megabytes).
const MAX_MODEL_CHARS: usize = 256;

/// A full request's messages with their texts (for break location), before the recording's
/// tokenizer counts.
type SentMessages = Vec<Arc<Msg>>;

/// The request's digest, and in full mode its messages (the digest's `messages` then empty).
fn request_parts(
    api: Api,
    record: &Record,
) -> Result<(RequestDigest, Option<SentMessages>), SkipReason> {
    if let Some(digest) = &record.request.digest {
        if digest.messages.len() > MAX_MESSAGES || digest.tools.len() > MAX_TOOLS {
            return Err(SkipReason::TooLarge);
        }
        return Ok((digest.clone(), None));
    }
    let body = record.request.body.as_ref().ok_or(SkipReason::Unparsed)?;
    let chat = super::chat_request(api, body).ok_or(SkipReason::Unparsed)?;
    if chat.0.len() > MAX_MESSAGES || chat.1.len() > MAX_TOOLS {
        return Err(SkipReason::TooLarge);
    }
    let digest = digest::request_digest_of(api, body, &chat, false);
    Ok((digest, Some(chat.0.iter().map(sent_message).collect())))
}

thread_local! {
    /// The messages this thread built lately, by `digest::message_key`: each request re-sends
    /// its conversation, and a message built once is shared by every request that re-sends it
    /// (so the engine keeps it by pointer, without comparing it).
    static SENT: RefCell<Generations<Arc<Msg>>> = RefCell::new(Generations::new());
}

/// A message of a full request, with its text, before the recording's tokenizer counts.
fn sent_message(message: &Value) -> Arc<Msg> {
    let key = digest::message_key(message);
    if let Some(known) = SENT.with(|sent| sent.borrow_mut().get(key)) {
        return known;
    }
    let (digest, text) = digest::message_digest_and_text(message, key);
    let built = Arc::new(Msg::of(digest, Some(text)));
    SENT.with(|sent| sent.borrow_mut().insert(key, Arc::clone(&built)));
    built
}

impl Msg {
    /// The message of a digest, without tokenizer counts.
    fn of(digest: MessageDigest, text: Option<Arc<str>>) -> Msg {
        Msg {
            tokens: None,
            text,
            role: digest.role,
            identity: digest.identity.unwrap_or_else(|| digest.hash.clone()),
            hash: digest.hash,
            chars: digest.chars,
            head: digest.head,
            tail: digest.tail,
            reasoning_chars: digest.reasoning_chars,
            media: digest.media,
            tool_calls: digest.tool_calls,
            tool_call_id: digest.tool_call_id,
            name: digest.name,
        }
    }
}

/// Derivation rules, in order: 0. prompt = reused + evaluated; 1. the missing one of reused /
/// evaluated = prompt − the known one; 2. a streamed response's proxy TTFT is the prefill time
/// when the server gave none (an upper bound: it includes queueing).
fn derive(mut counts: Counts, streamed: bool, ttfb_ms: Option<i64>) -> Counts {
    if counts.prompt_tokens.is_none()
        && let (Some(reused), Some(evaluated)) = (counts.reused_tokens, counts.evaluated_tokens)
    {
        counts.prompt_tokens = Some(Measured {
            value: reused.value.saturating_add(evaluated.value),
            source: reused.source.max(evaluated.source),
        });
    }
    if let Some(prompt) = counts.prompt_tokens {
        match (counts.reused_tokens, counts.evaluated_tokens) {
            (Some(reused), None) => {
                counts.evaluated_tokens = Some(Measured {
                    value: prompt.value.saturating_sub(reused.value),
                    source: reused.source,
                });
            }
            (None, Some(evaluated)) => {
                counts.reused_tokens = Some(Measured {
                    value: prompt.value.saturating_sub(evaluated.value),
                    source: evaluated.source,
                });
            }
            _ => {}
        }
    }
    if counts.prefill_ms.is_none()
        && streamed
        && let Some(ttfb_ms) = ttfb_ms
    {
        counts.prefill_ms = Some(Measured {
            value: ttfb_ms as f64,
            source: Source::Proxy,
        });
    }
    counts
}

fn server_tokens(fields: &Value, pointer: &str) -> Option<Measured<u32>> {
    // Past every context window: not a count (the cache readers report it as a bad value).
    let value = crate::limits::plausible_tokens(fields.pointer(pointer)?.as_u64()?)?;
    Some(Measured {
        value: u32::try_from(value).ok()?,
        source: Source::Server,
    })
}

fn server_ms(fields: &Value, pointer: &str, divisor: f64) -> Option<Measured<f64>> {
    let value = fields.pointer(pointer)?.as_f64()?;
    Some(Measured {
        value: value / divisor,
        source: Source::Server,
    })
}

/// llama.cpp: `timings` wins over `cached_tokens` because it comes with `prompt_n` and
/// `prompt_ms`, and a stream asked with `return_progress` ends its `prompt_progress` with the
/// whole prompt (`total`, `cache`, `time_ms`) when no `timings` came; vLLM
/// (`--enable-prompt-tokens-details`), SGLang (`--enable-cache-report`) and Ollama's
/// OpenAI-compatible API give `usage` only; LM Studio gives no reuse at all (not measured).
fn openai_counts(fields: &Value) -> Counts {
    let progress = |key: &str| server_tokens(fields, &format!("/prompt_progress/{key}"));
    Counts {
        prompt_tokens: server_tokens(fields, "/usage/prompt_tokens").or_else(|| progress("total")),
        completion_tokens: server_tokens(fields, "/usage/completion_tokens")
            .or_else(|| server_tokens(fields, "/timings/predicted_n")),
        reused_tokens: server_tokens(fields, "/timings/cache_n")
            .or_else(|| server_tokens(fields, "/usage/prompt_tokens_details/cached_tokens"))
            .or_else(|| server_tokens(fields, "/usage/prompt_cache_hit_tokens"))
            .or_else(|| progress("cache")),
        evaluated_tokens: server_tokens(fields, "/timings/prompt_n"),
        prefill_ms: server_ms(fields, "/timings/prompt_ms", 1.0)
            .or_else(|| server_ms(fields, "/prompt_progress/time_ms", 1.0)),
        decode_ms: server_ms(fields, "/timings/predicted_ms", 1.0),
        load_ms: None,
        cache_written: server_tokens(fields, "/usage/prompt_tokens_details/cache_write_tokens"),
    }
}

/// The Responses API: `input_tokens` is the whole prompt, `input_tokens_details.cached_tokens`
/// the reused part (llama.cpp adds `timings` where it has them).
fn responses_counts(fields: &Value) -> Counts {
    let timings = openai_counts(fields);
    Counts {
        prompt_tokens: server_tokens(fields, "/usage/input_tokens"),
        completion_tokens: server_tokens(fields, "/usage/output_tokens")
            .or(timings.completion_tokens),
        reused_tokens: timings
            .reused_tokens
            .or_else(|| server_tokens(fields, "/usage/input_tokens_details/cached_tokens")),
        ..timings
    }
}

/// Ollama's `prompt_eval_count` is the whole prompt, cached or not (0.32 reported 459 on two
/// identical requests); since 0.33 `prompt_eval_cached_count` says how much of it came from the
/// prefix cache. Without it no reuse is reported.
fn ollama_counts(fields: &Value) -> Counts {
    const NANOS_PER_MS: f64 = 1e6;
    Counts {
        prompt_tokens: server_tokens(fields, "/prompt_eval_count"),
        completion_tokens: server_tokens(fields, "/eval_count"),
        reused_tokens: server_tokens(fields, "/prompt_eval_cached_count"),
        evaluated_tokens: None,
        prefill_ms: server_ms(fields, "/prompt_eval_duration", NANOS_PER_MS),
        decode_ms: server_ms(fields, "/eval_duration", NANOS_PER_MS),
        load_ms: server_ms(fields, "/load_duration", NANOS_PER_MS),
        cache_written: None,
    }
}

/// Anthropic Messages: reused = `cache_read_input_tokens`; evaluated = `input_tokens` +
/// `cache_creation_input_tokens` (both were processed this time); the prompt is their sum.
///
/// A response that ran several passes on the server (server tools such as web search, an
/// advisor, compaction) reports their sum: 404,500 input tokens for a 1.3 KB request. The
/// prompt's own counts are then those of its first pass (`usage.iterations[0]`, when that is
/// the message itself), else not measured.
fn anthropic_counts(fields: &Value) -> Counts {
    let server_tool_passes = fields
        .pointer("/usage/server_tool_use")
        .and_then(Value::as_object)
        .is_some_and(|uses| uses.values().any(|n| n.as_u64().is_some_and(|n| n > 0)));
    let iterations = fields
        .pointer("/usage/iterations")
        .and_then(Value::as_array);
    let first_pass: Value;
    let fields = match iterations {
        Some(passes) if passes.len() > 1 => {
            first_pass = passes
                .first()
                .filter(|pass| pass.get("type").and_then(Value::as_str) == Some("message"))
                .map_or(Value::Null, |pass| serde_json::json!({ "usage": pass }));
            &first_pass
        }
        _ if server_tool_passes => &Value::Null,
        _ => fields,
    };
    let input = server_tokens(fields, "/usage/input_tokens");
    let creation = server_tokens(fields, "/usage/cache_creation_input_tokens");
    let evaluated = input.map(|i| Measured {
        value: i.value.saturating_add(creation.map_or(0, |c| c.value)),
        source: Source::Server,
    });
    let reused = server_tokens(fields, "/usage/cache_read_input_tokens");
    Counts {
        prompt_tokens: None,
        completion_tokens: server_tokens(fields, "/usage/output_tokens"),
        reused_tokens: reused,
        evaluated_tokens: evaluated,
        prefill_ms: None,
        decode_ms: None,
        load_ms: None,
        cache_written: creation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn server<T>(value: T) -> Option<Measured<T>> {
        Some(Measured {
            value,
            source: Source::Server,
        })
    }

    #[test]
    fn a_client_that_hung_up_after_the_reply_ended_left_a_whole_exchange() {
        let record = |body: Value| -> Record {
            serde_json::from_value(json!({"v": 1, "id": 1, "conn": 1, "t_start_ms": 0,
                "t_first_byte_ms": null, "t_end_ms": 0,
                "request": {"method": "POST", "path": "/v1/chat/completions", "headers": {},
                    "body_bytes": 0, "body": null, "body_text": null, "digest": null},
                "response": {"status": 200, "headers": {}, "stream": null, "chunks": null,
                    "bad_chunks": null, "body_bytes": 0, "truncated": false, "body": body,
                    "body_text": null, "digest": null},
                "error": "client_disconnected", "tokens": null}))
            .unwrap()
        };
        let ended = [
            json!({"status": "completed"}),
            json!({"choices": [{"finish_reason": "stop"}]}),
            json!({"stop_reason": "end_turn"}),
        ];
        assert!(
            ended
                .into_iter()
                .all(|b| closed_after_completion(&record(b)))
        );
        // Cut off mid-reply: not whole.
        let cut = [
            json!({"status": "in_progress"}),
            json!({"choices": [{"finish_reason": null}]}),
            json!({"stop_reason": null}),
        ];
        assert!(!cut.into_iter().any(|b| closed_after_completion(&record(b))));
    }

    #[test]
    fn llama_cpp_fields_and_derivation() {
        let c = openai_counts(
            &json!({"timings": {"cache_n": 20, "prompt_n": 5, "prompt_ms": 21.9, "predicted_n": 4, "predicted_ms": 28.8}}),
        );
        let c = derive(c, true, Some(40));
        assert_eq!(c.prompt_tokens, server(25));
        assert_eq!(c.completion_tokens, server(4));
        assert_eq!(c.prefill_ms, server(21.9));
    }

    #[test]
    fn vllm_style_derives_evaluated_and_uses_ttfb_when_streamed() {
        let c = openai_counts(
            &json!({"usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 64}}}),
        );
        let c = derive(c, true, Some(25));
        assert_eq!(c.evaluated_tokens, server(36));
        assert_eq!(
            c.prefill_ms,
            Some(Measured {
                value: 25.0,
                source: Source::Proxy
            })
        );
        let c = derive(
            openai_counts(&json!({"usage": {"prompt_tokens": 100}})),
            false,
            Some(25),
        );
        assert_eq!(
            c.prefill_ms, None,
            "a non-streamed time to first byte is the whole generation"
        );
    }

    #[test]
    fn anthropic_fields() {
        let c = derive(
            anthropic_counts(
                &json!({"usage": {"input_tokens": 15, "cache_read_input_tokens": 44, "cache_creation_input_tokens": 5, "output_tokens": 7}}),
            ),
            false,
            None,
        );
        assert_eq!(
            (
                c.prompt_tokens,
                c.reused_tokens,
                c.evaluated_tokens,
                c.completion_tokens
            ),
            (server(64), server(44), server(20), server(7))
        );
    }
}
