//! Digest mode: what the analysis needs and no text (llmp's digest rules, plus the Anthropic
//! Messages API). The same functions serve full recordings, so a full and a digest recording of
//! the same traffic give the same hashes.

use std::sync::Arc;

use serde_json::{Map, Value};
use xxhash_rust::xxh3::Xxh3;

use super::Api;
use crate::record::hash;
use crate::record::{
    MessageDigest, Output, Params, Record, RequestDigest, ResponseDigest, ToolCall, ToolDigest,
};

/// Characters hashed for `head` and `tail`.
const EDGE_CHARS: usize = 256;

/// Replaces bodies by digests: chat requests and their 2xx responses are digested, every other
/// body is dropped (`body_bytes` still says how big it was).
pub fn apply_digest(record: &mut Record) {
    let api = Api::from_path(&record.request.path);
    let request = &mut record.request;
    request.digest = match (api.is_chat(), request.body.as_ref()) {
        (true, Some(body)) => request_digest(api, body),
        _ => None,
    };
    request.body = None;
    request.body_text = None;
    if let Some(response) = record.response.as_mut() {
        let success = (200..300).contains(&response.status);
        response.digest = match response.body.as_ref() {
            Some(body) if api.is_chat() && success => Some(response_digest(api, body)),
            _ => None,
        };
        response.body = None;
        response.body_text = None;
    }
}

/// `None` when the body has no `messages` array.
pub fn request_digest(api: Api, body: &Value) -> Option<RequestDigest> {
    let chat = super::chat_request(api, body)?;
    Some(request_digest_of(api, body, &chat, true))
}

/// The request's digest from its chat form (`normalize::chat_request` of the same body), for a
/// caller that needs the chat form too and converts it once; without `with_messages`,
/// `messages` is left empty for a caller that digests them itself.
pub fn request_digest_of(
    api: Api,
    body: &Value,
    (messages, tools): &super::ChatRequest<'_>,
    with_messages: bool,
) -> RequestDigest {
    let (tools_hash, tools) = tools_digest(tools);
    RequestDigest {
        model: str_field(body, "model"),
        params: params(api, body),
        messages: if with_messages {
            messages.iter().map(message_digest).collect()
        } else {
            Vec::new()
        },
        tools,
        tools_hash,
    }
}

/// Top-level strings a digest keeps: ids, names and states the server sets, never text it
/// echoes (llama-server's `__verbose.prompt`, the Responses API's `instructions`).
/// `stop_sequence` (Anthropic: which of the client's stop sequences matched) is kept because
/// llmp's digest keeps it.
const KEPT_STRINGS: [&str; 12] = [
    "id",
    "object",
    "model",
    "system_fingerprint",
    "created_at",
    "done_reason",
    "stop_reason",
    "stop_sequence",
    "status",
    "type",
    "role",
    "service_tier",
];

/// Objects a digest keeps with their numbers only (nested objects too): the server's counters.
const COUNTER_OBJECTS: [&str; 3] = ["usage", "timings", "prompt_progress"];

/// The server's counters and ids, and the reply's sizes: top-level numbers, booleans, nulls
/// (`created`, Ollama's `prompt_eval_count`, `eval_count`, `*_duration`, `done`), the numbers
/// of `usage`, `timings` and llama.cpp's streamed `prompt_progress`, and the strings of `KEPT_STRINGS`. Nothing else: arrays
/// (`prompt_logprobs`, Ollama's `context` token ids) and other objects (`__verbose`) may hold
/// the prompt or the reply.
pub fn response_digest(api: Api, body: &Value) -> ResponseDigest {
    let usage = body
        .as_object()
        .map(|object| {
            object
                .iter()
                .filter_map(|(key, value)| {
                    let kept = match value {
                        Value::Number(_) | Value::Bool(_) | Value::Null => Some(value.clone()),
                        Value::String(_) if KEPT_STRINGS.contains(&key.as_str()) => {
                            Some(value.clone())
                        }
                        Value::Object(_) if COUNTER_OBJECTS.contains(&key.as_str()) => {
                            Some(numbers_only(value))
                        }
                        _ => None,
                    };
                    kept.map(|value| (key.clone(), value))
                })
                .collect::<Map<String, Value>>()
        })
        .unwrap_or_default();
    let reply = super::chat_reply(api, body);
    let output = reply
        .map(|message| Output {
            content_chars: char_count(&content_text(message.get("content"))),
            reasoning_chars: ["reasoning_content", "reasoning", "thinking"]
                .iter()
                .find_map(|key| message.get(*key).and_then(Value::as_str))
                .map(char_count)
                .unwrap_or_default(),
            tool_calls: reply_calls(&message),
        })
        .unwrap_or_default();
    ResponseDigest { usage, output }
}

/// An object with its numbers, booleans and nulls, nested objects filtered alike; strings and
/// arrays dropped, but for arrays of objects, filtered alike (Anthropic's `usage.iterations`:
/// the counters of each pass the server ran).
fn numbers_only(value: &Value) -> Value {
    match value {
        Value::Object(object) => Value::Object(
            object
                .iter()
                // A pass's `type` (`message`, `compaction`) is the server's name, never text.
                .filter(|(k, v)| match v {
                    Value::String(_) => k.as_str() == "type",
                    Value::Array(items) => !items.is_empty() && items.iter().all(Value::is_object),
                    _ => true,
                })
                .map(|(k, v)| (k.clone(), numbers_only(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(numbers_only).collect()),
        other => other.clone(),
    }
}

/// A message's identity is (role, content, tool calls, name, tool call id); every field of its
/// digest follows from it, so digests are remembered by a 128-bit hash of that identity.
pub fn message_digest(message: &Value) -> MessageDigest {
    message_digest_and_text(message, message_key(message)).0
}

/// The text fields of a message that its key and its digest both read.
struct TextFields<'a> {
    role: &'a str,
    name: Option<&'a str>,
    tool_call_id: Option<&'a str>,
    reasoning: &'a str,
}

fn text_fields(message: &Value) -> TextFields<'_> {
    let text = |key: &str| message.get(key).and_then(Value::as_str);
    TextFields {
        role: text("role").unwrap_or_default(),
        name: text("name").or_else(|| text("tool_name")),
        tool_call_id: text("tool_call_id"),
        reasoning: ["reasoning_content", "reasoning", "thinking"]
            .into_iter()
            .find_map(text)
            .unwrap_or_default(),
    }
}

/// A key of everything a message's digest and text are made of: equal keys, equal digests.
pub(super) fn message_key(message: &Value) -> u128 {
    let TextFields {
        role,
        name,
        tool_call_id,
        reasoning,
    } = text_fields(message);
    let mut hasher = Xxh3::new();
    hasher.update(b"message");
    // The memo's key only: two messages that differ in their reasoning alone have one identity.
    hash::feed_bytes(reasoning.as_bytes(), &mut hasher);
    hash::feed_bytes(role.as_bytes(), &mut hasher);
    hash::feed_structure(message.get("content").unwrap_or(&Value::Null), &mut hasher);
    hash::feed_structure(raw_tool_calls(message).unwrap_or(&Value::Null), &mut hasher);
    for field in [name, tool_call_id] {
        match field {
            Some(text) => hash::feed_bytes(text.as_bytes(), &mut hasher),
            None => hasher.update(b"-"),
        }
    }
    hasher.digest128()
}

/// The digest and the text of a message whose `message_key` is `key`. Equal texts share one
/// allocation, so the analysis can keep the texts of a long conversation (for break location)
/// without a copy per turn.
pub(super) fn message_digest_and_text(message: &Value, key: u128) -> (MessageDigest, Arc<str>) {
    memo::with(|memo| {
        if let Some(known) = memo.messages.get(key) {
            return known;
        }
        let fields = text_fields(message);
        let role = fields.role.to_string();
        let name = fields.name.map(str::to_string);
        let tool_call_id = fields.tool_call_id.map(str::to_string);
        let reasoning = fields.reasoning;
        let content = message.get("content").unwrap_or(&Value::Null);
        let calls = raw_tool_calls(message).unwrap_or(&Value::Null);
        let canonical = &mut memo.scratch;
        write_identity(&role, content, calls, &name, &tool_call_id, canonical);
        let hash = hash::hex(canonical);
        let identity = rendered_content(content).map(|content| {
            write_identity(&role, &content, calls, &name, &tool_call_id, canonical);
            hash::hex(canonical)
        });
        let text: Arc<str> = message_text(message).into();
        let (head, tail) = edges(&text);
        let digest = MessageDigest {
            role,
            hash,
            identity,
            chars: char_count(&text),
            head: hash::hex(head.as_bytes()),
            tail: hash::hex(tail.as_bytes()),
            tool_calls: tool_calls(message),
            tool_call_id,
            name,
            reasoning_chars: char_count(reasoning),
            media: media_parts(message),
        };
        memo.messages
            .insert(key, (digest.clone(), Arc::clone(&text)));
        (digest, text)
    })
}

/// Content part types that carry media: OpenAI's chat and Responses parts, Anthropic's
/// blocks (in the chat form `normalize` makes of them).
const MEDIA_TYPES: [&str; 8] = [
    "image_url",
    "input_image",
    "image",
    "input_audio",
    "audio",
    "file",
    "input_file",
    "document",
];

/// A message's parts whose tokens no character count sees: media (typed content parts of
/// `MEDIA_TYPES`, Ollama's `images`) and a hosted provider's own tool uses and results
/// (Anthropic's `server_tool_use`, `web_search_tool_result`, `mcp_tool_result`…), whose
/// content is the provider's (encrypted search results, files).
pub fn media_parts(message: &Value) -> u32 {
    let opaque = |t: &str| {
        MEDIA_TYPES.contains(&t)
            || t.ends_with("_tool_result")
            || matches!(
                t,
                "server_tool_use" | "mcp_tool_use" | "container_upload" | "search_result"
            )
    };
    let parts = message
        .get("content")
        .and_then(Value::as_array)
        .map_or(0, |parts| {
            parts
                .iter()
                .filter(|part| part.get("type").and_then(Value::as_str).is_some_and(opaque))
                .count()
        });
    let images = message
        .get("images")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    u32::try_from(parts + images).unwrap_or(u32::MAX)
}

/// The canonical form the message hash is taken over: `[role, content, tool calls, name,
/// tool call id]`.
fn write_identity(
    role: &str,
    content: &Value,
    calls: &Value,
    name: &Option<String>,
    tool_call_id: &Option<String>,
    out: &mut Vec<u8>,
) {
    out.clear();
    out.push(b'[');
    hash::write_string(role, out);
    out.push(b',');
    hash::write_canonical(content, out);
    out.push(b',');
    hash::write_canonical(calls, out);
    out.push(b',');
    write_optional(name.as_deref(), out);
    out.push(b',');
    write_optional(tool_call_id.as_deref(), out);
    out.push(b']');
}

/// The content as a server renders it, when that differs from what was sent: without
/// `cache_control` markers, and a list of one text block as that text (both APIs accept either
/// shape, and templates render them alike). `None` when the content is already in that form.
fn rendered_content(content: &Value) -> Option<Value> {
    let Value::Array(blocks) = content else {
        return None;
    };
    let marked = blocks
        .iter()
        .any(|block| block.get("cache_control").is_some());
    let strip = |block: &Value| match block {
        Value::Object(map) if map.contains_key("cache_control") => Value::Object(
            map.iter()
                .filter(|(key, _)| key.as_str() != "cache_control")
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect(),
        ),
        other => other.clone(),
    };
    if let [only] = blocks.as_slice() {
        let only = strip(only);
        if let Value::Object(map) = &only
            && map.len() == 2
            && map.get("type").and_then(Value::as_str) == Some("text")
            && let Some(Value::String(text)) = map.get("text")
        {
            return Some(Value::String(text.clone()));
        }
    }
    marked.then(|| Value::Array(blocks.iter().map(strip).collect()))
}

fn write_optional(text: Option<&str>, out: &mut Vec<u8>) {
    match text {
        Some(text) => hash::write_string(text, out),
        None => out.extend_from_slice(b"null"),
    }
}

/// A message's content (text parts joined without separator), then its tool calls as canonical
/// JSON.
pub fn message_text(message: &Value) -> String {
    let mut text = content_text(message.get("content"));
    if let Some(calls) = raw_tool_calls(message) {
        text.push_str(&hash::canonical_json(calls));
    }
    text
}

/// The tool set's hash and each tool's digest; remembered, since agents send the same tools on
/// every request.
fn tools_digest(tools: &[Value]) -> (Option<String>, Vec<ToolDigest>) {
    if tools.is_empty() {
        return (None, Vec::new());
    }
    let mut hasher = Xxh3::new();
    hasher.update(b"tools");
    for tool in tools {
        hash::feed_structure(tool, &mut hasher);
    }
    let key = hasher.digest128();
    memo::with(|memo| {
        if let Some(known) = memo.tools.get(key) {
            return known;
        }
        let canonical = &mut memo.scratch;
        canonical.clear();
        canonical.push(b'[');
        for (i, tool) in tools.iter().enumerate() {
            if i > 0 {
                canonical.push(b',');
            }
            hash::write_canonical(tool, canonical);
        }
        canonical.push(b']');
        let known = (
            Some(hash::hex(canonical)),
            tools.iter().map(tool_digest).collect::<Vec<_>>(),
        );
        memo.tools.insert(key, known.clone());
        known
    })
}

fn tool_digest(tool: &Value) -> ToolDigest {
    let canonical = hash::canonical_json(tool);
    let name = tool
        .pointer("/function/name")
        .or_else(|| tool.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    // A client's tool carries its schema (`function`, `parameters`, `input_schema`); a
    // provider's names a type of its own and nothing to render.
    let provided = tool
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| !matches!(t, "function" | "custom"))
        && ["function", "parameters", "input_schema"]
            .iter()
            .all(|key| tool.get(*key).is_none());
    ToolDigest {
        name,
        hash: hash::hex(canonical.as_bytes()),
        chars: char_count(&canonical),
        provided,
    }
}

/// A bounded memo of digests (two generations: a key seen in the last two generations stays),
/// kept per thread. It only saves work: results are the same with or without it.
pub(super) mod memo {
    use std::cell::RefCell;
    use std::collections::HashMap;

    use std::sync::Arc;

    use crate::record::{MessageDigest, ToolDigest};

    /// Entries per generation: enough for the live messages of many interleaved conversations,
    /// small enough that the texts held stay a few megabytes.
    const GENERATION: usize = 1 << 12;

    /// The values of the latest keys: two generations, the older dropped when the younger is
    /// full.
    pub(in crate::normalize) struct Generations<V> {
        young: HashMap<u128, V>,
        old: HashMap<u128, V>,
    }

    impl<V: Clone> Generations<V> {
        pub(in crate::normalize) fn new() -> Self {
            Generations {
                young: HashMap::new(),
                old: HashMap::new(),
            }
        }

        pub(in crate::normalize) fn get(&mut self, key: u128) -> Option<V> {
            if let Some(value) = self.young.get(&key) {
                return Some(value.clone());
            }
            let value = self.old.remove(&key)?;
            self.insert(key, value.clone());
            Some(value)
        }

        pub(in crate::normalize) fn insert(&mut self, key: u128, value: V) {
            if self.young.len() >= GENERATION {
                self.old = std::mem::take(&mut self.young);
            }
            self.young.insert(key, value);
        }
    }

    pub(super) struct Memo {
        /// Reused buffer for canonical JSON.
        pub scratch: Vec<u8>,
        pub messages: Generations<(MessageDigest, Arc<str>)>,
        pub tools: Generations<(Option<String>, Vec<ToolDigest>)>,
    }

    thread_local! {
        static MEMO: RefCell<Memo> = RefCell::new(Memo {
            scratch: Vec::new(),
            messages: Generations::new(),
            tools: Generations::new(),
        });
    }

    pub(super) fn with<T>(f: impl FnOnce(&mut Memo) -> T) -> T {
        MEMO.with(|memo| f(&mut memo.borrow_mut()))
    }
}

fn params(api: Api, body: &Value) -> Params {
    let max_tokens = [
        "max_tokens",
        "max_completion_tokens",
        "max_output_tokens",
        "n_predict",
    ]
    .iter()
    .find_map(|key| body.get(*key).and_then(Value::as_u64))
    .or_else(|| body.pointer("/options/num_predict").and_then(Value::as_u64))
    .and_then(|n| u32::try_from(n).ok());
    let response_format = is_set(body.get("format"))
        || (is_set(body.get("response_format"))
            && body
                .pointer("/response_format/type")
                .and_then(Value::as_str)
                != Some("text"));
    let grammar = is_set(body.get("grammar")) || is_set(body.get("json_schema"));
    let stream = body
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(api == Api::OllamaChat);
    Params {
        max_tokens,
        response_format,
        grammar,
        stream,
        // Where the API has them: other requests would carry a field that says nothing.
        cache_marks: (api == Api::AnthropicMessages)
            .then(|| crate::provider::CacheMarks::of_request(body)),
    }
}

fn is_set(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(_) => true,
    }
}

fn raw_tool_calls(message: &Value) -> Option<&Value> {
    message
        .get("tool_calls")
        .filter(|calls| calls.as_array().is_some_and(|a| !a.is_empty()))
}

/// A reply's calls: its tool calls, or the one call of OpenAI's legacy `function_call`.
fn reply_calls(message: &Value) -> Vec<ToolCall> {
    let calls = tool_calls(message);
    match message
        .pointer("/function_call/name")
        .and_then(Value::as_str)
    {
        Some(name) if calls.is_empty() => vec![ToolCall {
            id: None,
            name: name.to_string(),
        }],
        _ => calls,
    }
}

fn tool_calls(message: &Value) -> Vec<ToolCall> {
    raw_tool_calls(message)
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .map(|call| ToolCall {
                    id: str_field(call, "id"),
                    name: call
                        .pointer("/function/name")
                        .or_else(|| call.get("name"))
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A message's text content as the digest counts it: a string, or the text parts of a content
/// array joined without separator (llmp's rule, so our character counts equal its own).
pub fn content_text(content: Option<&Value>) -> String {
    text_parts_joined(content, "")
}

/// A message's text content as llama-server's chat templates render it: the text parts of a
/// content array joined by a line feed. The simulated server renders prompts this way; the
/// digest must not (llmp counts the parts without separator).
pub fn content_text_newline_joined(content: Option<&Value>) -> String {
    text_parts_joined(content, "\n")
}

fn text_parts_joined(content: Option<&Value>, separator: &str) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            let texts = parts
                .iter()
                .filter_map(|part| part.get("text").and_then(Value::as_str));
            for (i, part) in texts.enumerate() {
                if i > 0 {
                    text.push_str(separator);
                }
                text.push_str(part);
            }
            text
        }
        _ => String::new(),
    }
}

fn edges(text: &str) -> (String, String) {
    let total = text.chars().count();
    let head = text.chars().take(EDGE_CHARS).collect();
    let tail = text
        .chars()
        .skip(total.saturating_sub(EDGE_CHARS))
        .collect();
    (head, tail)
}

fn char_count(text: &str) -> u32 {
    u32::try_from(text.chars().count()).unwrap_or(u32::MAX)
}

fn str_field(value: &Value, key: &str) -> Option<String> {
    value.get(key).and_then(Value::as_str).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reasoning_is_counted_beside_the_identity_not_in_it() {
        let with = json!({"role": "assistant", "content": "In src/config.rs.", "reasoning_content": "Look in config."});
        let without = json!({"role": "assistant", "content": "In src/config.rs."});
        // Both orders, so the memo cannot hand one the other's digest.
        let (a, b) = (message_digest(&with), message_digest(&without));
        let (b2, a2) = (message_digest(&without), message_digest(&with));
        assert_eq!(
            (a.hash.clone(), a.identity.clone()),
            (b.hash.clone(), b.identity.clone())
        );
        assert_eq!((a.reasoning_chars, b.reasoning_chars), (15, 0));
        assert_eq!((a2.reasoning_chars, b2.reasoning_chars), (15, 0));
    }

    #[test]
    fn identity_ignores_key_order_and_empty_tool_calls() {
        let a = json!({"role": "user", "content": "hello"});
        let b: Value =
            serde_json::from_str(r#"{"content":"hello","role":"user","tool_calls":[]}"#).unwrap();
        assert_eq!(message_digest(&a).hash, message_digest(&b).hash);
    }

    #[test]
    fn role_content_name_and_call_id_are_identity() {
        let base = message_digest(&json!({"role": "tool", "content": "x", "tool_call_id": "1"}));
        for other in [
            json!({"role": "user", "content": "x", "tool_call_id": "1"}),
            json!({"role": "tool", "content": "y", "tool_call_id": "1"}),
            json!({"role": "tool", "content": "x", "tool_call_id": "2"}),
            json!({"role": "tool", "content": "x", "tool_call_id": "1", "name": "n"}),
        ] {
            assert_ne!(base.hash, message_digest(&other).hash);
        }
    }

    #[test]
    fn head_and_tail_cover_256_characters() {
        let text = format!("{}{}", "a".repeat(300), "b".repeat(300));
        let d = message_digest(&json!({"role": "user", "content": text}));
        assert_eq!(d.chars, 600);
        assert_eq!(d.head, hash::hex("a".repeat(256).as_bytes()));
        assert_eq!(d.tail, hash::hex("b".repeat(256).as_bytes()));
    }

    #[test]
    fn anthropic_cache_control_changes_only_the_counted_markers() {
        let plain = json!({"model": "m", "max_tokens": 9, "system": [{"type": "text", "text": "Be brief."}],
            "tools": [{"name": "ls", "description": "list", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]});
        let mut marked = plain.clone();
        marked["system"][0]["cache_control"] = json!({"type": "ephemeral"});
        marked["tools"][0]["cache_control"] = json!({"type": "ephemeral"});
        marked["messages"][0]["content"][0]["cache_control"] = json!({"type": "ephemeral"});
        let a = request_digest(Api::AnthropicMessages, &plain).unwrap();
        let mut b = request_digest(Api::AnthropicMessages, &marked).unwrap();
        assert_eq!(b.params.cache_marks.map(|m| m.breakpoints), Some(3));
        assert_eq!(a.params.cache_marks.map(|m| m.breakpoints), Some(0));
        b.params.cache_marks = a.params.cache_marks;
        assert_eq!(a, b);
        assert_eq!(a.messages[0].role, "system");
        assert_eq!(a.messages[0].chars, 9);
        assert_eq!(a.params.max_tokens, Some(9));
        assert_eq!(a.tools[0].name, "ls");
    }

    #[test]
    fn anthropic_tool_use_and_result_become_calls_and_tool_messages() {
        let body = json!({"model": "m", "messages": [
            {"role": "user", "content": "read it"},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"},
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "fn main"}]}]});
        let d = request_digest(Api::AnthropicMessages, &body).unwrap();
        assert_eq!(d.messages.len(), 3);
        assert_eq!(
            d.messages[1].tool_calls,
            vec![ToolCall {
                id: Some("toolu_1".into()),
                name: "read_file".into()
            }]
        );
        assert_eq!(d.messages[2].role, "tool");
        assert_eq!(d.messages[2].tool_call_id.as_deref(), Some("toolu_1"));
        assert_eq!(d.messages[2].chars, 7);
    }

    #[test]
    fn anthropic_response_digest_keeps_usage_and_sizes() {
        let body = json!({"id": "x", "type": "message", "role": "assistant", "model": "m",
            "content": [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Paris"},
                {"type": "tool_use", "id": "t1", "name": "ls", "input": {}}],
            "stop_reason": "tool_use", "usage": {"input_tokens": 3, "cache_read_input_tokens": 40, "output_tokens": 2}});
        let d = response_digest(Api::AnthropicMessages, &body);
        assert_eq!(d.usage["usage"]["cache_read_input_tokens"], 40);
        assert!(!d.usage.contains_key("content"));
        assert_eq!(d.output.content_chars, 5);
        assert_eq!(d.output.reasoning_chars, 3);
        assert_eq!(d.output.tool_calls[0].name, "ls");
    }

    #[test]
    fn response_digest_keeps_counters_and_ids_never_echoed_text() {
        let body = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "model": "m", "created": 7,
            "system_fingerprint": "b1",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "REPLY"}}],
            "usage": {"prompt_tokens": 45, "prompt_tokens_details": {"cached_tokens": 40, "note": "ECHO"}, "service_tier": "ECHO"},
            "timings": {"cache_n": 40, "prompt_n": 5, "prompt_ms": 1.5},
            "__verbose": {"prompt": "ECHO-PROMPT", "content": "ECHO-CONTENT"},
            "prompt_logprobs": [null, {"1": {"logprob": -1.0, "decoded_token": "ECHO-TOKEN"}}],
            "context": [1, 2, 3],
            "instructions": "ECHO-INSTRUCTIONS",
            "eval_count": 9, "load_duration": 12, "done": true, "done_reason": "stop"
        });
        let d = response_digest(Api::OpenaiChat, &body);
        let text = serde_json::to_string(&d.usage).unwrap_or_default();
        assert!(!text.contains("ECHO"), "{text}");
        assert!(!text.contains("REPLY"), "{text}");
        assert!(!d.usage.contains_key("context"), "{text}");
        assert_eq!(
            d.usage["usage"]["prompt_tokens_details"]["cached_tokens"],
            40
        );
        assert_eq!(d.usage["timings"]["prompt_ms"], 1.5);
        for key in [
            "id",
            "object",
            "model",
            "created",
            "system_fingerprint",
            "eval_count",
            "load_duration",
            "done",
            "done_reason",
        ] {
            assert!(d.usage.contains_key(key), "{key}: {text}");
        }
    }
}
