//! Merging a streamed response into the shape of its non-streamed twin, so the analysis reads one
//! shape. Events that don't parse are counted (`bad_chunks`) and skipped; a stream with no
//! readable event merges to `Null` and is kept as text by the caller.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::Api;
use crate::record::StreamKind;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Merged {
    pub body: Value,
    pub chunks: u32,
    pub bad_chunks: u32,
}

pub(crate) fn merge(api: Api, kind: StreamKind, raw: &[u8]) -> Merged {
    match kind {
        StreamKind::Ndjson => merge_ndjson(raw),
        StreamKind::Sse => {
            let events = sse_events(raw);
            match api {
                Api::AnthropicMessages => merge_anthropic(&events),
                Api::OpenaiResponses => merge_responses(&events),
                _ => merge_openai(&events),
            }
        }
    }
}

/// The `data` of each SSE event (several `data:` lines join with `\n`), `[DONE]` left out.
fn sse_events(raw: &[u8]) -> Vec<String> {
    let text = crate::text::utf8_lossy(raw);
    let mut events = Vec::new();
    let mut data: Option<String> = None;
    for line in text.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            events.extend(data.take());
            continue;
        }
        if let Some(value) = line.strip_prefix("data:") {
            let value = value.strip_prefix(' ').unwrap_or(value);
            match data.as_mut() {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_string()),
            }
        }
    }
    events.extend(data);
    events.retain(|e| e.trim() != "[DONE]");
    events
}

fn parse_events(events: &[String]) -> (Vec<Map<String, Value>>, u32, u32) {
    let mut parsed = Vec::new();
    let mut bad = 0u32;
    for event in events {
        match serde_json::from_str::<Value>(event) {
            Ok(Value::Object(object)) => parsed.push(object),
            _ => bad += 1,
        }
    }
    (parsed, u32::try_from(events.len()).unwrap_or(u32::MAX), bad)
}

#[derive(Default)]
struct Choice {
    role: Option<String>,
    content: Option<String>,
    text: Option<String>,
    reasoning_key: Option<&'static str>,
    reasoning: String,
    finish_reason: Option<Value>,
    tool_calls: BTreeMap<u64, CallAcc>,
}

#[derive(Default)]
struct CallAcc {
    id: Option<String>,
    kind: Option<String>,
    name: String,
    arguments: String,
}

/// OpenAI chat and completions: deltas concatenated, tool calls merged by index, the last
/// non-null value of every other top-level field kept (`usage`, `timings`).
///
/// The events are read last first: once a later event has given a field its value, an earlier
/// one's is read and dropped, never copied into the merge. An event that would not parse as a
/// JSON object counts as bad and gives nothing, as when each event was parsed into a `Value`
/// whole (a test holds the two equal).
fn merge_openai(events: &[String]) -> Merged {
    let chunks = u32::try_from(events.len()).unwrap_or(u32::MAX);
    let mut bad_chunks = 0u32;
    let mut top = Map::new();
    // Each good event's `choices`, last event first.
    let mut choices_of_events: Vec<Option<Value>> = Vec::new();
    for event in events.iter().rev() {
        let Some(read) = read_openai_event(event, &top) else {
            bad_chunks += 1;
            continue;
        };
        for (key, value) in read.fields {
            if !value.is_null() {
                top.entry(key).or_insert(value);
            }
        }
        choices_of_events.push(read.choices);
    }
    if choices_of_events.is_empty() {
        return Merged {
            body: Value::Null,
            chunks,
            bad_chunks,
        };
    }
    let mut choices: BTreeMap<u64, Choice> = BTreeMap::new();
    for event_choices in choices_of_events.iter().rev() {
        if let Some(Value::Array(items)) = event_choices {
            for (position, item) in items.iter().enumerate() {
                merge_choice(&mut choices, position, choice_view(item));
            }
        }
    }
    openai_merged(top, choices, chunks, bad_chunks)
}

/// The merged body: the last top-level fields, the merged choices, the non-streamed `object`.
fn openai_merged(
    mut top: Map<String, Value>,
    choices: BTreeMap<u64, Choice>,
    chunks: u32,
    bad_chunks: u32,
) -> Merged {
    if let Some(object) = top.get_mut("object") {
        *object = Value::from(merged_object(&choices));
    }
    let choices = choices
        .into_iter()
        .map(|(index, choice)| finish_choice(index, choice))
        .collect();
    top.insert("choices".into(), Value::Array(choices));
    Merged {
        body: Value::Object(top),
        chunks,
        bad_chunks,
    }
}

/// The merged body's `object`: the non-streamed twin's.
fn merged_object(choices: &BTreeMap<u64, Choice>) -> &'static str {
    if choices.values().any(|c| c.text.is_some()) {
        "text_completion"
    } else {
        "chat.completion"
    }
}

/// What one OpenAI event gives the merge: its `choices`, and its top-level fields that no later
/// event has settled (a repeated key keeps its last value, as in a `Value`).
struct OpenaiEvent {
    fields: Vec<(String, Value)>,
    choices: Option<Value>,
}

/// The event, if it is a JSON object; `settled` holds the fields later events gave.
fn read_openai_event(event: &str, settled: &Map<String, Value>) -> Option<OpenaiEvent> {
    use serde::de::DeserializeSeed;
    let mut deserializer = serde_json::Deserializer::from_str(event);
    let read = OpenaiEventSeed { settled }
        .deserialize(&mut deserializer)
        .ok()?;
    deserializer.end().ok()?;
    Some(read)
}

/// A key of an event: borrowed from the event's text unless it had escapes.
struct EventKey<'de>(pub std::borrow::Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for EventKey<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> Result<EventKey<'de>, D::Error> {
        struct KeyVisitor;
        impl<'de> serde::de::Visitor<'de> for KeyVisitor {
            type Value = EventKey<'de>;

            fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
                formatter.write_str("a string")
            }

            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<EventKey<'de>, E> {
                Ok(EventKey(std::borrow::Cow::Borrowed(key)))
            }

            fn visit_str<E>(self, key: &str) -> Result<EventKey<'de>, E> {
                Ok(EventKey(std::borrow::Cow::Owned(key.to_string())))
            }
        }
        // As a `Value`'s keys are read (`deserialize_str`).
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct OpenaiEventSeed<'a> {
    settled: &'a Map<String, Value>,
}

impl<'de> serde::de::DeserializeSeed<'de> for OpenaiEventSeed<'_> {
    type Value = OpenaiEvent;

    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<OpenaiEvent, D::Error> {
        // `deserialize_any`, as a `Value` is read: anything but an object is an error here.
        deserializer.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for OpenaiEventSeed<'_> {
    type Value = OpenaiEvent;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<OpenaiEvent, A::Error> {
        let mut read = OpenaiEvent {
            fields: Vec::new(),
            choices: None,
        };
        while let Some(EventKey(key)) = map.next_key::<EventKey<'de>>()? {
            if key == "choices" {
                read.choices = Some(map.next_value::<Value>()?);
            } else if self.settled.contains_key(key.as_ref()) {
                map.next_value::<Value>()?;
            } else {
                let value = map.next_value::<Value>()?;
                match read.fields.iter_mut().find(|(known, _)| *known == key) {
                    Some(field) => field.1 = value,
                    None => read.fields.push((key.into_owned(), value)),
                }
            }
        }
        Ok(read)
    }
}

/// What the merge reads of one item of an event's `choices`.
struct ChoiceView<'a> {
    pub index: Option<u64>,
    /// Not `null`.
    pub finish_reason: Option<&'a Value>,
    pub text: Option<&'a str>,
    /// `delta`, else `message`: present (even `null`) when the item has one.
    pub delta: Option<DeltaView<'a>>,
}

#[derive(Default)]
struct DeltaView<'a> {
    pub role: Option<&'a str>,
    pub content: Option<&'a str>,
    /// The first of `reasoning_content` and `reasoning` that is a string, with its key.
    pub reasoning: Option<(&'static str, &'a str)>,
    pub tool_calls: Vec<CallView<'a>>,
}

struct CallView<'a> {
    pub index: Option<u64>,
    pub id: Option<&'a str>,
    pub kind: Option<&'a str>,
    pub name: Option<&'a str>,
    pub arguments: Option<&'a str>,
}

const REASONING_KEYS: [&str; 2] = ["reasoning_content", "reasoning"];

fn text<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

fn choice_view(item: &Value) -> ChoiceView<'_> {
    ChoiceView {
        index: item.get("index").and_then(Value::as_u64),
        finish_reason: item.get("finish_reason").filter(|r| !r.is_null()),
        text: text(item, "text"),
        delta: item
            .get("delta")
            .or_else(|| item.get("message"))
            .map(|delta| DeltaView {
                role: text(delta, "role"),
                content: text(delta, "content"),
                reasoning: REASONING_KEYS
                    .into_iter()
                    .find_map(|key| text(delta, key).map(|reasoning| (key, reasoning))),
                tool_calls: delta
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|call| CallView {
                        index: call.get("index").and_then(Value::as_u64),
                        id: text(call, "id"),
                        kind: text(call, "type"),
                        name: call.pointer("/function/name").and_then(Value::as_str),
                        arguments: call.pointer("/function/arguments").and_then(Value::as_str),
                    })
                    .collect(),
            }),
    }
}

fn merge_choice(choices: &mut BTreeMap<u64, Choice>, position: usize, item: ChoiceView<'_>) {
    let index = item.index.unwrap_or(position as u64);
    let choice = choices.entry(index).or_default();
    if let Some(reason) = item.finish_reason {
        choice.finish_reason = Some(reason.clone());
    }
    if let Some(text) = item.text {
        choice.text.get_or_insert_with(String::new).push_str(text);
    }
    let Some(delta) = item.delta else {
        return;
    };
    if let Some(role) = delta.role {
        choice.role = Some(role.to_string());
    }
    if let Some(content) = delta.content {
        choice
            .content
            .get_or_insert_with(String::new)
            .push_str(content);
    }
    if let Some((key, reasoning)) = delta.reasoning {
        choice.reasoning_key.get_or_insert(key);
        choice.reasoning.push_str(reasoning);
    }
    for (position, call) in delta.tool_calls.into_iter().enumerate() {
        let slot = call.index.unwrap_or(position as u64);
        let acc = choice.tool_calls.entry(slot).or_default();
        if let Some(id) = call.id {
            acc.id = Some(id.to_string());
        }
        if let Some(kind) = call.kind {
            acc.kind = Some(kind.to_string());
        }
        if let Some(name) = call.name
            && acc.name.is_empty()
        {
            acc.name = name.to_string();
        }
        if let Some(arguments) = call.arguments {
            acc.arguments.push_str(arguments);
        }
    }
}

fn finish_choice(index: u64, choice: Choice) -> Value {
    let mut out = Map::new();
    out.insert("index".into(), Value::from(index));
    out.insert(
        "finish_reason".into(),
        choice.finish_reason.unwrap_or(Value::Null),
    );
    if let Some(text) = choice.text {
        out.insert("text".into(), Value::from(text));
        return Value::Object(out);
    }
    let mut message = Map::new();
    message.insert(
        "role".into(),
        Value::from(choice.role.unwrap_or_else(|| "assistant".into())),
    );
    message.insert("content".into(), Value::from(choice.content));
    if let Some(key) = choice.reasoning_key {
        message.insert(key.into(), Value::from(choice.reasoning));
    }
    if !choice.tool_calls.is_empty() {
        let calls = choice
            .tool_calls
            .into_values()
            .map(|call| {
                serde_json::json!({
                    "id": call.id,
                    "type": call.kind.unwrap_or_else(|| "function".into()),
                    "function": {"name": call.name, "arguments": call.arguments},
                })
            })
            .collect();
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    out.insert("message".into(), Value::Object(message));
    Value::Object(out)
}

/// Anthropic Messages: `message_start` gives the message, content blocks are rebuilt from their
/// deltas (`input_json_delta` parsed into `input`), `message_delta` sets `stop_reason` and
/// updates `usage`.
fn merge_anthropic(events: &[String]) -> Merged {
    let (parsed, chunks, mut bad_chunks) = parse_events(events);
    let mut message: Option<Map<String, Value>> = None;
    let mut blocks: BTreeMap<u64, (Map<String, Value>, String)> = BTreeMap::new();
    for event in parsed {
        let index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
        match event.get("type").and_then(Value::as_str) {
            Some("message_start") => {
                if let Some(Value::Object(m)) = event.get("message") {
                    message = Some(m.clone());
                }
            }
            Some("content_block_start") => {
                if let Some(Value::Object(block)) = event.get("content_block") {
                    blocks.insert(index, (block.clone(), String::new()));
                }
            }
            Some("content_block_delta") => {
                let (block, json) = blocks.entry(index).or_default();
                let Some(delta) = event.get("delta") else {
                    continue;
                };
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => append(block, "text", delta.get("text")),
                    Some("thinking_delta") => append(block, "thinking", delta.get("thinking")),
                    Some("signature_delta") => append(block, "signature", delta.get("signature")),
                    Some("input_json_delta") => json.push_str(
                        delta
                            .get("partial_json")
                            .and_then(Value::as_str)
                            .unwrap_or_default(),
                    ),
                    _ => {}
                }
            }
            Some("message_delta") => {
                let m = message.get_or_insert_with(Map::new);
                if let Some(Value::Object(delta)) = event.get("delta") {
                    for (key, value) in delta {
                        m.insert(key.clone(), value.clone());
                    }
                }
                if let Some(Value::Object(usage)) = event.get("usage") {
                    let target = m
                        .entry("usage")
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let Value::Object(target) = target {
                        for (key, value) in usage {
                            target.insert(key.clone(), value.clone());
                        }
                    }
                }
            }
            _ => {}
        }
    }
    let Some(mut message) = message else {
        return Merged {
            body: Value::Null,
            chunks,
            bad_chunks,
        };
    };
    let mut content = Vec::new();
    for (_, (mut block, json)) in blocks {
        if !json.is_empty() {
            match serde_json::from_str::<Value>(&json) {
                Ok(input) => {
                    block.insert("input".into(), input);
                }
                Err(_) => bad_chunks += 1,
            }
        }
        content.push(Value::Object(block));
    }
    message.insert("content".into(), Value::Array(content));
    Merged {
        body: Value::Object(message),
        chunks,
        bad_chunks,
    }
}

/// Appends a delta to the block's text in place: copying the text so far for every delta made a
/// 200,000-delta stream quadratic (3.3 s on the recorder thread, issue #17).
fn append(block: &mut Map<String, Value>, key: &str, piece: Option<&Value>) {
    let piece = piece.and_then(Value::as_str).unwrap_or_default();
    match block.get_mut(key) {
        Some(Value::String(text)) => text.push_str(piece),
        _ => {
            block.insert(key.into(), Value::from(piece));
        }
    }
}

/// OpenAI Responses: the final event (`response.completed`, `.incomplete` or `.failed`) carries
/// the whole response.
fn merge_responses(events: &[String]) -> Merged {
    let (parsed, chunks, bad_chunks) = parse_events(events);
    let body = parsed
        .iter()
        .rev()
        .find(|e| {
            matches!(
                e.get("type").and_then(Value::as_str),
                Some("response.completed" | "response.incomplete" | "response.failed")
            )
        })
        .and_then(|e| e.get("response").cloned())
        .unwrap_or(Value::Null);
    Merged {
        body,
        chunks,
        bad_chunks,
    }
}

/// Ollama NDJSON: `message.content` and `message.thinking` concatenated, tool calls collected,
/// counters from the final object.
fn merge_ndjson(raw: &[u8]) -> Merged {
    let text = crate::text::utf8_lossy(raw);
    let mut chunks = 0u32;
    let mut bad_chunks = 0u32;
    let mut top = Map::new();
    let mut role: Option<String> = None;
    let mut content = String::new();
    let mut thinking: Option<String> = None;
    let mut tool_calls: Vec<Value> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        chunks += 1;
        let Ok(Value::Object(object)) = serde_json::from_str::<Value>(line) else {
            bad_chunks += 1;
            continue;
        };
        for (key, value) in object {
            if key != "message" {
                top.insert(key, value);
                continue;
            }
            if let Some(r) = value.get("role").and_then(Value::as_str) {
                role = Some(r.to_string());
            }
            if let Some(c) = value.get("content").and_then(Value::as_str) {
                content.push_str(c);
            }
            if let Some(t) = value.get("thinking").and_then(Value::as_str) {
                thinking.get_or_insert_with(String::new).push_str(t);
            }
            if let Some(calls) = value.get("tool_calls").and_then(Value::as_array) {
                tool_calls.extend(calls.iter().cloned());
            }
        }
    }
    if chunks == bad_chunks {
        return Merged {
            body: Value::Null,
            chunks,
            bad_chunks,
        };
    }
    let mut message = Map::new();
    message.insert(
        "role".into(),
        Value::from(role.unwrap_or_else(|| "assistant".into())),
    );
    message.insert("content".into(), Value::from(content));
    if let Some(thinking) = thinking {
        message.insert("thinking".into(), Value::from(thinking));
    }
    if !tool_calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    top.insert("message".into(), Value::Object(message));
    Merged {
        body: Value::Object(top),
        chunks,
        bad_chunks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sse(events: &[Value]) -> Vec<u8> {
        let mut out = String::new();
        for e in events {
            out.push_str(&format!("data: {e}\n\n"));
        }
        out.push_str("data: [DONE]\n\n");
        out.into_bytes()
    }

    /// The merge as it was: every event parsed into a `Value` whole, fields taken in order.
    fn merge_openai_by_values(events: &[String]) -> Merged {
        let (parsed, chunks, bad_chunks) = parse_events(events);
        if parsed.is_empty() {
            return Merged {
                body: Value::Null,
                chunks,
                bad_chunks,
            };
        }
        let mut top = Map::new();
        let mut choices: BTreeMap<u64, Choice> = BTreeMap::new();
        for event in parsed {
            for (key, value) in event {
                match (key.as_str(), value) {
                    ("choices", Value::Array(items)) => {
                        for (position, item) in items.iter().enumerate() {
                            merge_choice(&mut choices, position, choice_view(item));
                        }
                    }
                    ("choices", _) | (_, Value::Null) => {}
                    (_, value) => {
                        top.insert(key, value);
                    }
                }
            }
        }
        openai_merged(top, choices, chunks, bad_chunks)
    }

    /// Event text as servers send it and as they should not: repeated and escaped keys, nulls,
    /// numbers past f64, lone surrogates, deep nesting, non-objects, cut and trailing text.
    pub(in crate::normalize) fn random_event(rng: &mut crate::test_support::Xorshift) -> String {
        const KEYS: [&str; 10] = [
            "\"id\"",
            "\"object\"",
            "\"model\"",
            "\"created\"",
            "\"usage\"",
            "\"timings\"",
            "\"choices\"",
            "\"system_fingerprint\"",
            "\"mod\\u0065l\"",
            "\"x\\n\"",
        ];
        const VALUES: [&str; 22] = [
            "null",
            "1",
            "-7",
            "1.5",
            "1e400",
            "-1e400",
            "1e-400",
            "123456789012345678901234567890",
            "\"chatcmpl-1\"",
            "\"gemma\"",
            "\"esc\\\"aped \\u00e9\"",
            "\"lone \\ud800\"",
            "\"pair \\ud83d\\ude00\"",
            "\"bad \\x\"",
            "true",
            "[]",
            "[1,{\"a\":null}]",
            "{\"prompt_tokens\":3,\"completion_tokens\":null}",
            "{\"cache_n\":1e400}",
            "{}",
            "\"chat.completion.chunk\"",
            "\"text_completion\"",
        ];
        const CHOICES: [&str; 9] = [
            "[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}]",
            "[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]",
            "[{\"index\":0,\"delta\":{\"content\":\"lo \\ud800\"}}]",
            "[{\"index\":1,\"text\":\"t\"}]",
            "[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\"}}]}}]",
            "[{\"delta\":{\"reasoning_content\":\"r\"},\"finish_reason\":\"stop\"}]",
            "[{\"index\":0,\"delta\":{\"content\":\"x\"},\"n\":1e400}]",
            "null",
            "{}",
        ];
        match rng.below(12) {
            0 => [
                "5",
                "[1]",
                "\"s\"",
                "null",
                "{",
                "",
                "{\"a\":1} x",
                "{\"a\":1,}",
                "{} ",
            ][rng.below(9) as usize]
                .to_string(),
            1 => format!("{}{{\"id\":1}}{}", "[".repeat(130), "]".repeat(130)),
            _ => {
                let fields: Vec<String> = (0..rng.below(7))
                    .map(|_| {
                        let key = KEYS[rng.below(KEYS.len() as u64) as usize];
                        let value = if key == "\"choices\"" && rng.below(4) > 0 {
                            CHOICES[rng.below(CHOICES.len() as u64) as usize]
                        } else {
                            VALUES[rng.below(VALUES.len() as u64) as usize]
                        };
                        format!("{key}:{value}")
                    })
                    .collect();
                format!("{{{}}}", fields.join(","))
            }
        }
    }

    #[test]
    fn openai_merge_read_last_first_equals_every_event_as_a_value() {
        let mut rng = crate::test_support::Xorshift::new(16);
        for case in 0..30_000 {
            let events: Vec<String> = (0..rng.below(7)).map(|_| random_event(&mut rng)).collect();
            assert_eq!(
                merge_openai(&events),
                merge_openai_by_values(&events),
                "case {case}: {events:#?}"
            );
        }
        // Real shapes: the bench's llama.cpp stream and the tests' own.
        let stream = [
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1,"id":"c","model":"m","system_fingerprint":"b","object":"chat.completion.chunk"}"#,
            r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"It"}}],"created":1,"id":"c","model":"m","system_fingerprint":"b","object":"chat.completion.chunk"}"#,
            r#"{"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"created":2,"id":"c","model":"m","system_fingerprint":"b","object":"chat.completion.chunk","usage":{"completion_tokens":2,"prompt_tokens":9,"total_tokens":11},"timings":{"cache_n":0,"prompt_n":9}}"#,
        ]
        .map(String::from);
        assert_eq!(merge_openai(&stream), merge_openai_by_values(&stream));
    }

    #[test]
    fn openai_deltas_and_tool_calls_merge() {
        let raw = sse(&[
            json!({"object": "chat.completion.chunk", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "lo", "tool_calls": [{"index": 0, "id": "a", "type": "function", "function": {"name": "rf", "arguments": "{\"p"}}]}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "\":1}"}}]}, "finish_reason": "tool_calls"}], "timings": {"cache_n": 3}}),
        ]);
        let merged = merge(Api::OpenaiChat, StreamKind::Sse, &raw);
        assert_eq!((merged.chunks, merged.bad_chunks), (3, 0));
        let m = &merged.body["choices"][0]["message"];
        assert_eq!(m["content"], "Hello");
        assert_eq!(m["tool_calls"][0]["function"]["arguments"], "{\"p\":1}");
        assert_eq!(merged.body["object"], "chat.completion");
        assert_eq!(merged.body["timings"]["cache_n"], 3);
        assert_eq!(merged.body["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn bad_events_are_counted_and_all_bad_is_null() {
        let merged = merge(
            Api::OpenaiChat,
            StreamKind::Sse,
            b"data: {oops\n\ndata: {\"choices\":[]}\n\n",
        );
        assert_eq!((merged.chunks, merged.bad_chunks), (2, 1));
        let none = merge(Api::OpenaiChat, StreamKind::Sse, b"data: {oops\n\n");
        assert!(none.body.is_null());
    }

    #[test]
    fn anthropic_stream_has_the_non_streamed_shape() {
        let raw = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"x\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"cache_read_input_tokens\":58,\"input_tokens\":1,\"output_tokens\":0}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Ber\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"lin\"}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"ls\",\"input\":{}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"p\\\":\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"1}\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":7}}\n\n\
event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let merged = merge(Api::AnthropicMessages, StreamKind::Sse, raw.as_bytes());
        assert_eq!((merged.chunks, merged.bad_chunks), (9, 0));
        assert_eq!(
            merged.body["content"][0],
            json!({"type": "text", "text": "Berlin"})
        );
        assert_eq!(merged.body["content"][1]["input"], json!({"p": 1}));
        assert_eq!(merged.body["stop_reason"], "tool_use");
        assert_eq!(
            merged.body["usage"],
            json!({"cache_read_input_tokens": 58, "input_tokens": 1, "output_tokens": 7})
        );
    }

    #[test]
    fn completions_and_responses_merge() {
        let raw = sse(&[
            json!({"object": "text_completion", "choices": [{"index": 0, "text": "a"}]}),
            json!({"choices": [{"index": 0, "text": "b", "finish_reason": "stop"}]}),
        ]);
        let merged = merge(Api::OpenaiCompletions, StreamKind::Sse, &raw);
        assert_eq!(merged.body["choices"][0]["text"], "ab");
        let raw = sse(&[
            json!({"type": "response.output_text.delta", "delta": "x"}),
            json!({"type": "response.completed", "response": {"id": "r", "output_text": "x"}}),
        ]);
        assert_eq!(
            merge(Api::OpenaiResponses, StreamKind::Sse, &raw).body["id"],
            "r"
        );
    }

    #[test]
    fn ndjson_merges_like_ollama() {
        let raw = b"{\"message\":{\"role\":\"assistant\",\"content\":\"He\"},\"done\":false}\n{\"message\":{\"content\":\"llo\",\"thinking\":\"hm\"},\"done\":true,\"prompt_eval_count\":12}\n";
        let merged = merge(Api::OllamaChat, StreamKind::Ndjson, raw);
        assert_eq!(merged.body["message"]["content"], "Hello");
        assert_eq!(merged.body["message"]["thinking"], "hm");
        assert_eq!(merged.body["prompt_eval_count"], 12);
    }

    #[test]
    fn a_long_anthropic_stream_merges_in_linear_time() {
        // 200,000 one-character deltas: quadratic copying took seconds; this is milliseconds.
        let mut events = vec![
            "{\"type\":\"message_start\",\"message\":{\"role\":\"assistant\",\"content\":[]}}"
                .to_string(),
            "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}"
                .to_string(),
        ];
        for _ in 0..200_000 {
            events.push(
                "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}"
                    .to_string(),
            );
        }
        let merged = merge_anthropic(&events);
        assert_eq!(
            merged.body["content"][0]["text"].as_str().map(str::len),
            Some(200_000)
        );
    }
}
