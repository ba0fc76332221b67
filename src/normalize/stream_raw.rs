//! An OpenAI stream (chat, completions) merged straight to the JSON text of its merged body,
//! for the recorder's lines when nothing else takes the record (`record -q`, as `record::raw`
//! does for JSON bodies): the merge through `Value`s, and their serialization, were most of the
//! recorder's work for a streamed exchange.
//!
//! The body read back is the `Value` of [`stream::merge`](super::stream::merge) (a test holds
//! the two equal): each event's `choices` are read into typed items that the one
//! `merge_choice` takes, its other fields kept as the text they were read from (compacted;
//! read last first, so the last non-null value of each is kept), everything checked as a
//! `Value` reads it. A stream this read does not take whole (a bad event, an item of another
//! shape) gives `None`, and the caller merges it through `Value`s as before.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::{MapAccess, Visitor};
use serde_json::Value;

use super::Api;
use super::stream::{
    CallView, Choice, ChoiceView, DeltaView, EventKey, REASONING_KEYS, finish_choice, merge_choice,
    merged_object, sse_events,
};
use crate::record::StreamKind;
use crate::record::raw::Checked;

/// The merged body's JSON (compact, one line) and the stream's event count (none of them bad);
/// `None` when the stream is left to [`super::stream::merge`]: another API's or kind's, or not
/// taken whole.
pub fn merge_raw(api: Api, kind: StreamKind, raw: &[u8]) -> Option<(Vec<u8>, u32)> {
    match (kind, api) {
        (StreamKind::Ndjson, _) | (_, Api::AnthropicMessages | Api::OpenaiResponses) => None,
        // The streams `stream::merge` merges the OpenAI way.
        (StreamKind::Sse, _) => merge_openai_sse(raw),
    }
}

fn merge_openai_sse(raw: &[u8]) -> Option<(Vec<u8>, u32)> {
    let events = sse_events(raw);
    if events.is_empty() {
        return None;
    }
    let chunks = u32::try_from(events.len()).unwrap_or(u32::MAX);
    // Read last first, as `stream::merge` does: a field a later event settled is only checked
    // in the earlier ones, not built.
    let mut top: BTreeMap<Cow<'_, str>, &str> = BTreeMap::new();
    let mut choices_of_events = Vec::with_capacity(events.len());
    for event in events.iter().rev() {
        // Each value is read (and checked) from where it starts, one level less deep than in
        // its event: an event that could be nested near a `Value`'s limit (128) is checked whole.
        if bracket_count(event) >= 100 {
            serde_json::from_str::<Checked>(event).ok()?;
        }
        let read = read_event(event, &top)?;
        for (key, value) in read.fields {
            // Checked as a `Value` reads it: `null` is spelt `null`.
            if value != "null" {
                top.entry(key).or_insert(value);
            }
        }
        choices_of_events.push(read.choices);
    }
    let mut choices: BTreeMap<u64, Choice> = BTreeMap::new();
    for items in choices_of_events.iter().rev() {
        for (position, item) in items.iter().flatten().enumerate() {
            merge_choice(&mut choices, position, item.view());
        }
    }
    let object = merged_object(&choices);
    let choices = Value::Array(
        choices
            .into_iter()
            .map(|(index, choice)| finish_choice(index, choice))
            .collect(),
    );
    // The fields in a `Value`'s order (its keys sorted), `choices` among them.
    let mut out = Vec::with_capacity(raw.len());
    out.push(b'{');
    let mut choices_written = false;
    let write_choices = |out: &mut Vec<u8>| {
        out.extend_from_slice(b"\"choices\":");
        // A `Value` to a Vec: cannot fail.
        let _ = serde_json::to_writer(&mut *out, &choices);
    };
    for (key, value) in &top {
        if !choices_written && key.as_ref() > "choices" {
            write_choices(&mut out);
            out.push(b',');
            choices_written = true;
        }
        let _ = serde_json::to_writer(&mut out, key.as_ref());
        out.push(b':');
        if key == "object" {
            out.push(b'"');
            out.extend_from_slice(object.as_bytes());
            out.push(b'"');
        } else {
            crate::record::raw::compact_into(value.as_bytes(), &mut out);
        }
        out.push(b',');
    }
    if choices_written {
        out.pop();
    } else {
        write_choices(&mut out);
    }
    out.push(b'}');
    Some((out, chunks))
}

/// `[` and `{` in the event, strings included: at least its nesting depth.
fn bracket_count(event: &str) -> usize {
    memchr::memchr2_iter(b'[', b'{', event.as_bytes()).count()
}

/// One event: its top-level fields but `choices` (a repeated key keeps its last value, as in a
/// `Value`), and its `choices` typed.
struct Event<'a> {
    fields: Vec<(Cow<'a, str>, &'a str)>,
    choices: Option<Vec<ChoiceItem<'a>>>,
}

/// The event, if it reads whole; `settled` holds the fields later events gave.
///
/// The object's own braces, colons and commas are walked here, each value read by serde_json
/// from where it starts: a kept field's text is then the span it was read from. Only JSON's
/// four whitespace bytes are skipped, as serde_json does.
fn read_event<'a>(event: &'a str, settled: &BTreeMap<Cow<'a, str>, &'a str>) -> Option<Event<'a>> {
    let bytes = event.as_bytes();
    let skip = |mut at: usize| {
        while matches!(bytes.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            at += 1;
        }
        at
    };
    let mut read = Event {
        fields: Vec::new(),
        choices: None,
    };
    let mut at = skip(0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at = skip(at + 1);
    if bytes.get(at) == Some(&b'}') {
        return (skip(at + 1) == bytes.len()).then_some(read);
    }
    loop {
        if bytes.get(at) != Some(&b'"') {
            return None;
        }
        let (EventKey(key), length) = value_at::<EventKey<'a>>(event, at)?;
        at = skip(at + length);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip(at + 1);
        let length = if key == "choices" {
            let (choices, length) = value_at(event, at)?;
            read.choices = choices;
            length
        } else {
            let (Checked, length) = value_at::<Checked>(event, at)?;
            if !settled.contains_key(&key) {
                let value = event.get(at..at + length)?;
                match read.fields.iter_mut().find(|(known, _)| *known == key) {
                    Some(field) => field.1 = value,
                    None => read.fields.push((key, value)),
                }
            }
            length
        };
        at = skip(at + length);
        match bytes.get(at) {
            Some(b',') => at = skip(at + 1),
            Some(b'}') => break,
            _ => return None,
        }
    }
    (skip(at + 1) == bytes.len()).then_some(read)
}

/// The value that starts at `at` in `event`, and its length in bytes.
fn value_at<'a, T: Deserialize<'a>>(event: &'a str, at: usize) -> Option<(T, usize)> {
    let mut values = serde_json::Deserializer::from_str(event.get(at..)?).into_iter::<T>();
    let value = values.next()?.ok()?;
    Some((value, values.byte_offset()))
}

/// A string field, borrowed from the event's text unless it had escapes. Anything but a string
/// (or `null`, as `None`) fails the read: the `Value` merge takes that stream.
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Text<'a>, D::Error> {
        EventKey::deserialize(deserializer).map(|EventKey(text)| Text(text))
    }
}

fn text<'a>(field: &'a Option<Text<'_>>) -> Option<&'a str> {
    field.as_ref().map(|Text(text)| text.as_ref())
}

/// The fields of an object the merge reads, each read strictly into its type (a field of
/// another type fails the read); the others checked as a `Value` reads them (serde's derive
/// would skip them more leniently: an unpaired surrogate, `1e400`). A repeated field keeps
/// its last value, as in a `Value`.
trait Fields<'de>: Default {
    /// Reads `key`'s value into `self`; `false` when the key is not one of its fields.
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error>;
}

fn read_object<'de, D: serde::Deserializer<'de>, T: Fields<'de>>(
    deserializer: D,
) -> Result<T, D::Error> {
    deserializer.deserialize_map(FieldsVisitor(std::marker::PhantomData))
}

struct FieldsVisitor<T>(std::marker::PhantomData<T>);

impl<'de, T: Fields<'de>> Visitor<'de> for FieldsVisitor<T> {
    type Value = T;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        let mut read = T::default();
        while let Some(EventKey(key)) = map.next_key::<EventKey<'de>>()? {
            if !read.field(&key, &mut map)? {
                map.next_value::<Checked>()?;
            }
        }
        Ok(read)
    }
}

/// Deserialize through `Fields`.
macro_rules! deserialize_fields {
    ($($item:ident),*) => {$(
        impl<'de: 'a, 'a> Deserialize<'de> for $item<'a> {
            fn deserialize<D: serde::Deserializer<'de>>(
                deserializer: D,
            ) -> Result<$item<'a>, D::Error> {
                read_object(deserializer)
            }
        }
    )*};
}

deserialize_fields!(ChoiceItem, DeltaItem, CallItem, FunctionItem);

#[derive(Default)]
struct ChoiceItem<'a> {
    index: Option<u64>,
    finish_reason: Option<Value>,
    text: Option<Text<'a>>,
    /// Present, even as `null` (`Some(None)`), against absent (`None`): an item's
    /// `delta: null` hides its `message`, as `Value::get` sees it.
    delta: Option<Option<DeltaItem<'a>>>,
    message: Option<Option<DeltaItem<'a>>>,
}

impl<'de: 'a, 'a> Fields<'de> for ChoiceItem<'a> {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
        match key {
            "index" => self.index = map.next_value()?,
            "finish_reason" => self.finish_reason = map.next_value()?,
            "text" => self.text = map.next_value()?,
            "delta" => self.delta = Some(map.next_value()?),
            "message" => self.message = Some(map.next_value()?),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

#[derive(Default)]
struct DeltaItem<'a> {
    role: Option<Text<'a>>,
    content: Option<Text<'a>>,
    reasoning_content: Option<Text<'a>>,
    reasoning: Option<Text<'a>>,
    tool_calls: Option<Vec<CallItem<'a>>>,
}

impl<'de: 'a, 'a> Fields<'de> for DeltaItem<'a> {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
        match key {
            "role" => self.role = map.next_value()?,
            "content" => self.content = map.next_value()?,
            "reasoning_content" => self.reasoning_content = map.next_value()?,
            "reasoning" => self.reasoning = map.next_value()?,
            "tool_calls" => self.tool_calls = map.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

#[derive(Default)]
struct CallItem<'a> {
    index: Option<u64>,
    id: Option<Text<'a>>,
    kind: Option<Text<'a>>,
    function: Option<FunctionItem<'a>>,
}

impl<'de: 'a, 'a> Fields<'de> for CallItem<'a> {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
        match key {
            "index" => self.index = map.next_value()?,
            "id" => self.id = map.next_value()?,
            "type" => self.kind = map.next_value()?,
            "function" => self.function = map.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

#[derive(Default)]
struct FunctionItem<'a> {
    name: Option<Text<'a>>,
    arguments: Option<Text<'a>>,
}

impl<'de: 'a, 'a> Fields<'de> for FunctionItem<'a> {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<bool, A::Error> {
        match key {
            "name" => self.name = map.next_value()?,
            "arguments" => self.arguments = map.next_value()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl ChoiceItem<'_> {
    fn view(&self) -> ChoiceView<'_> {
        let delta = match &self.delta {
            Some(delta) => Some(delta.as_ref()),
            None => self.message.as_ref().map(Option::as_ref),
        };
        ChoiceView {
            index: self.index,
            finish_reason: self.finish_reason.as_ref(),
            text: text(&self.text),
            delta: delta.map(|delta| delta.map(DeltaItem::view).unwrap_or_default()),
        }
    }
}

impl DeltaItem<'_> {
    fn view(&self) -> DeltaView<'_> {
        let [first, second] = REASONING_KEYS;
        DeltaView {
            role: text(&self.role),
            content: text(&self.content),
            reasoning: text(&self.reasoning_content)
                .map(|r| (first, r))
                .or_else(|| text(&self.reasoning).map(|r| (second, r))),
            tool_calls: self
                .tool_calls
                .iter()
                .flatten()
                .map(|call| CallView {
                    index: call.index,
                    id: text(&call.id),
                    kind: text(&call.kind),
                    name: call.function.as_ref().and_then(|f| text(&f.name)),
                    arguments: call.function.as_ref().and_then(|f| text(&f.arguments)),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize::stream::{merge, tests::random_event};
    use crate::test_support::Xorshift;

    /// The first of `items` (a value of the right type) three times in four, else any.
    fn pick<'a>(rng: &mut Xorshift, items: &[&'a str]) -> &'a str {
        match rng.below(4) {
            1..=3 => items[0],
            _ => items[rng.below(items.len() as u64) as usize],
        }
    }

    /// An object of up to `most` of `fields` (key, then its candidate values), keys repeated
    /// now and then, with an unknown field now and then, some of a kind serde skips more
    /// leniently than a `Value` reads it.
    fn object(rng: &mut Xorshift, fields: &[(&str, &[&str])], most: u64) -> String {
        const UNKNOWN: [&str; 7] = [
            "1",
            "\"lone \\ud800\"",
            "1e400",
            "[{\"logprob\":-0.5}]",
            "\"\\u00e9\\n\"",
            "123456789012345678901234567890",
            "[[[[[[[[[[1]]]]]]]]]]",
        ];
        let mut parts = Vec::new();
        for _ in 0..rng.below(most + 1) {
            if rng.below(8) == 0 {
                // `Value`s' own reserved key too: an ordinary key to every reader here.
                let key = pick(rng, &["logprobs", "$serde_json::private::RawValue"]);
                parts.push(format!("\"{key}\":{}", pick(rng, &UNKNOWN)));
                continue;
            }
            let (key, values) = fields[rng.below(fields.len() as u64) as usize];
            parts.push(format!("\"{key}\":{}", pick(rng, values)));
        }
        let space = if rng.below(4) == 0 { " \n " } else { "" };
        format!("{{{space}{}{space}}}", parts.join(&format!(",{space}")))
    }

    fn random_choices(rng: &mut Xorshift) -> String {
        const TEXT: [&str; 7] = [
            "\"Hel\"",
            "\"lo \\\"q\\\" \\u00e9\"",
            "null",
            "5",
            "\"\"",
            "\"pair \\ud83d\\ude00\"",
            "\"\\ud800\"",
        ];
        const INDEX: [&str; 7] = ["0", "1", "2", "null", "\"0\"", "-1", "1.0"];
        let function = object(
            rng,
            &[
                ("name", &TEXT),
                ("arguments", &["\"{\\\"a\"", "\":1}\"", "null", "7"]),
            ],
            3,
        );
        let call = object(
            rng,
            &[
                ("index", &INDEX),
                ("id", &["\"call_1\"", "null", "3"]),
                ("type", &["\"function\"", "null"]),
                ("function", &[&function, "null", "\"f\""]),
            ],
            4,
        );
        let calls = format!("[{call},{call}]");
        let delta = object(
            rng,
            &[
                ("role", &["\"assistant\"", "null", "1"]),
                ("content", &TEXT),
                ("reasoning_content", &TEXT),
                ("reasoning", &TEXT),
                ("tool_calls", &[&calls, "[]", "null", "{}"]),
            ],
            5,
        );
        let item = object(
            rng,
            &[
                ("index", &INDEX),
                ("finish_reason", &["null", "\"stop\"", "{\"a\":1e400}", "5"]),
                ("text", &TEXT),
                ("delta", &[&delta, "null", "{}", "\"d\""]),
                ("message", &[&delta, "null"]),
            ],
            5,
        );
        match rng.below(8) {
            0 => "null".into(),
            1 => "[]".into(),
            2 => format!("[{item},{item}]"),
            3 => "[5]".into(),
            _ => format!("[{item}]"),
        }
    }

    fn random_stream(rng: &mut Xorshift) -> Vec<u8> {
        let mut out = String::new();
        for _ in 0..rng.below(6) {
            let event = match rng.below(12) {
                0 => random_event(rng),
                _ => {
                    let choices = random_choices(rng);
                    object(
                        rng,
                        &[
                            ("id", &["\"chatcmpl-1\"", "null", "\"id \\ud800\""]),
                            ("object", &["\"chat.completion.chunk\"", "null"]),
                            ("model", &["\"gemma\"", "null"]),
                            ("usage", &["{\"prompt_tokens\":3}", "null", "{\"n\":1e400}"]),
                            (
                                "timings",
                                &["{\"cache_n\":1.5e2}", "{\"prompt_ms\":41.873}"],
                            ),
                            ("choices", &[&choices, &choices, "null"]),
                        ],
                        6,
                    )
                }
            };
            // `data:` with and without its space, and the event over several lines.
            let event = if rng.below(5) == 0 {
                event.replace(" \n ", "\ndata: ")
            } else {
                event
            };
            let colon = if rng.below(3) == 0 { "data:" } else { "data: " };
            out.push_str(&format!("{colon}{event}\n\n"));
        }
        if rng.below(2) == 0 {
            out.push_str("data: [DONE]\n\n");
        }
        out.into_bytes()
    }

    #[test]
    fn the_raw_merge_reads_as_the_value_merge_or_leaves_the_stream_to_it() {
        let mut rng = Xorshift::new(1605);
        let (mut taken, mut left, mut raw_bytes_equal) = (0, 0, 0);
        let mut bodies = Vec::new();
        for case in 0..40_000 {
            let raw = random_stream(&mut rng);
            let api = [Api::OpenaiChat, Api::OpenaiCompletions, Api::OllamaChat][case % 3];
            let merged = merge(api, StreamKind::Sse, &raw);
            let Some((body, chunks)) = merge_raw(api, StreamKind::Sse, &raw) else {
                left += 1;
                continue;
            };
            taken += 1;
            let text = String::from_utf8_lossy(&raw);
            assert!(!body.contains(&b'\n'), "case {case}: {text}");
            let read: Value = serde_json::from_slice(&body).expect("the raw merge is JSON");
            assert_eq!(read, merged.body, "case {case}: {text}");
            assert_eq!(
                (chunks, 0),
                (merged.chunks, merged.bad_chunks),
                "case {case}"
            );
            raw_bytes_equal += usize::from(body == serde_json::to_vec(&read).unwrap_or_default());
            bodies.push(String::from_utf8_lossy(&body).into_owned());
        }
        // Both ways are taken, often, and the taken bodies have every shape.
        assert!(taken > 5_000 && left > 10_000, "{taken} taken, {left} left");
        for shape in [
            "tool_calls",
            "reasoning_content",
            "\"reasoning\"",
            "text_completion",
        ] {
            let seen = bodies.iter().filter(|body| body.contains(shape)).count();
            assert!(seen > 100, "{shape}: {seen}");
        }
        // Keys in a `Value`'s order: most bodies are its bytes (not those with a number
        // spelled otherwise, or a field kept as sent with its keys in another order).
        assert!(raw_bytes_equal > taken / 2, "{raw_bytes_equal} of {taken}");
    }

    #[test]
    fn what_serde_skips_more_leniently_than_a_value_reads_leaves_the_stream_to_it() {
        let deep = format!("{}1{}", "[".repeat(127), "]".repeat(127));
        for field in [
            r#""logprobs":"\ud800""#.to_string(),
            r#""logprobs":1e400"#.to_string(),
            format!(r#""logprobs":{deep}"#),
        ] {
            for event in [
                format!(r#"{{"id":"c",{field},"choices":[{{"delta":{{"content":"a"}}}}]}}"#),
                format!(r#"{{"choices":[{{{field},"delta":{{"content":"a"}}}}]}}"#),
                format!(r#"{{"choices":[{{"delta":{{{field},"content":"a"}}}}]}}"#),
            ] {
                let raw = format!("data: {event}\n\ndata: [DONE]\n\n");
                let merged = merge(Api::OpenaiChat, StreamKind::Sse, raw.as_bytes());
                assert_eq!((merged.chunks, merged.bad_chunks), (1, 1), "{event}");
                assert_eq!(
                    merge_raw(Api::OpenaiChat, StreamKind::Sse, raw.as_bytes()),
                    None
                );
            }
        }
    }

    /// The event's object is walked here, not by serde_json: each way to get its punctuation
    /// or whitespace wrong, in front of a good event, is read as the `Value` merge reads it.
    #[test]
    fn an_event_object_is_read_as_a_value_reads_it() {
        let choices = r#""choices":[{"delta":{"content":"a"}}]"#;
        let objects = [
            format!("{{{choices}}}"),
            format!(" \t{{ {choices} , \"id\" : \"x\" }}\r"),
            format!("{{{choices},\"id\" \"x\"}}"),
            format!("{{{choices},\"id\"::\"x\"}}"),
            format!("{{{choices},\"id\":\"x\" \"m\":1}}"),
            format!("{{,{choices}}}"),
            format!("{{{choices},}}"),
            format!("{{{choices}}}}}"),
            format!("{{{choices},\"id\"}}"),
            format!("{{{choices},\"id\":}}"),
            format!("{{{choices}"),
            format!("\u{c}{{{choices}}}"),
            format!("{{\u{c}{choices}}}"),
            format!("{{{choices},\"id\":\u{c}1}}"),
            format!("{{{choices}}}\u{c}"),
            format!("{{{choices},\"id\":1}}x"),
            format!("{{{choices},id:1}}"),
            format!("{{{choices},\"id\":1.}}"),
            format!("{{{choices},\"id\":01}}"),
            format!("{{{choices},\"id\":1e400}}"),
            format!("{{{choices},\"id\":[1,]}}"),
            format!("{{{choices},\"id\":1,\"id\":null}}"),
            format!("{{{choices},\"id\"x1}}"),
            format!("{{{choices},,\"id\":1}}"),
            "{}x".to_string(),
            "{}".to_string(),
            " {} ".to_string(),
            "{".to_string(),
            String::new(),
        ];
        let good = r#"{"id":"y","choices":[{"delta":{"content":"b"}}]}"#;
        let mut taken = 0;
        for object in objects {
            let raw = format!("data: {good}\n\ndata:{object}\n\n");
            let merged = merge(Api::OpenaiChat, StreamKind::Sse, raw.as_bytes());
            if let Some((body, chunks)) =
                merge_raw(Api::OpenaiChat, StreamKind::Sse, raw.as_bytes())
            {
                taken += 1;
                let read = serde_json::from_slice::<Value>(&body).ok();
                assert_eq!(read, Some(merged.body), "{object:?}");
                assert_eq!(
                    (chunks, 0),
                    (merged.chunks, merged.bad_chunks),
                    "{object:?}"
                );
            } else {
                assert!(merged.bad_chunks > 0, "a good event left: {object:?}");
            }
        }
        assert_eq!(taken, 5);
    }

    /// serde_json's `raw_value` feature makes a `Value` read an object whose first key is this
    /// one as the JSON in its string: a reader would then see another body than was sent, and
    /// this merge's checks would no longer be what a `Value` accepts. Nothing here enables it.
    #[test]
    fn serde_jsons_raw_value_key_is_an_ordinary_key() {
        let token = r#"{"$serde_json::private::RawValue":"{\"a\":1}"}"#;
        let value: Value = serde_json::from_str(token).expect("an object");
        assert!(value.is_object(), "{value}");
        let events = [
            format!(r#"{{"choices":[{{"delta":{token}}}],"usage":{token}}}"#),
            format!(r#"{{"choices":[{{"delta":{{"content":"a"}},"finish_reason":{token}}}]}}"#),
            format!(r#"{{"id":{token},"choices":[{{"$serde_json::private::RawValue":1}}]}}"#),
        ];
        for event in events {
            let raw = format!("data: {event}\n\n");
            let merged = merge(Api::OpenaiChat, StreamKind::Sse, raw.as_bytes());
            let (body, _) =
                merge_raw(Api::OpenaiChat, StreamKind::Sse, raw.as_bytes()).expect("taken");
            assert_eq!(
                serde_json::from_slice::<Value>(&body).ok(),
                Some(merged.body)
            );
        }
    }

    #[test]
    fn other_streams_are_left_to_the_value_merge() {
        let sse = b"data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\"}}\n\n";
        for api in [Api::AnthropicMessages, Api::OpenaiResponses] {
            assert_eq!(merge_raw(api, StreamKind::Sse, sse), None);
        }
        let ndjson = b"{\"message\":{\"content\":\"a\"},\"done\":true}\n";
        assert_eq!(merge_raw(Api::OllamaChat, StreamKind::Ndjson, ndjson), None);
        // No event, or an event that is not an object: the `Value` merge counts it.
        assert_eq!(merge_raw(Api::OpenaiChat, StreamKind::Sse, b""), None);
        assert_eq!(
            merge_raw(Api::OpenaiChat, StreamKind::Sse, b"data: 5\n\n"),
            None
        );
    }

    #[test]
    fn the_bench_stream_is_taken_and_reads_the_same() {
        let raw = concat!(
            "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}],\"created\":1789988971,\"id\":\"chatcmpl-A1wH\",\"model\":\"gemma\",\"system_fingerprint\":\"b10015\",\"object\":\"chat.completion.chunk\"}\n\n",
            "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\"It prints the number.\"}}],\"created\":1789988971,\"id\":\"chatcmpl-A1wH\",\"model\":\"gemma\",\"system_fingerprint\":\"b10015\",\"object\":\"chat.completion.chunk\"}\n\n",
            "data: {\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"delta\":{}}],\"created\":1789988971,\"id\":\"chatcmpl-A1wH\",\"model\":\"gemma\",\"system_fingerprint\":\"b10015\",\"object\":\"chat.completion.chunk\",\"usage\":{\"completion_tokens\":30,\"prompt_tokens\":262},\"timings\":{\"cache_n\":198,\"prompt_ms\":41.873,\"prompt_per_token_ms\":0.654265625}}\n\n",
            "data: [DONE]\n\n"
        );
        let (body, chunks) =
            merge_raw(Api::OpenaiChat, StreamKind::Sse, raw.as_bytes()).expect("taken");
        let merged = merge(Api::OpenaiChat, StreamKind::Sse, raw.as_bytes());
        assert_eq!(chunks, 3);
        assert_eq!(
            serde_json::from_slice::<Value>(&body).ok(),
            Some(merged.body)
        );
        let body = String::from_utf8_lossy(&body);
        assert!(
            body.contains(
                r#""message":{"content":"It prints the number.","role":"assistant"}}],"created":1789988971"#
            ),
            "{body}"
        );
    }
}
