//! A record's line with its JSON bodies written as they were sent, not parsed into a
//! `serde_json::Value` and serialized again: the recorder's way when the line is all anyone
//! takes of the record (`record -q`), where the two `Value` steps were most of its work.
//!
//! A body goes in as sent exactly when `capture` would keep it as JSON: when
//! `serde_json::from_slice::<Value>` takes it and it is not `null`. The same deserializer walks
//! it (strings, escapes, numbers and depth checked alike), only nothing is built. Whitespace
//! outside strings is dropped, so the line stays one line. Keys keep the order they were sent
//! in (a `Value` sorts them) and numbers their spelling: a reader parses the same value from
//! either line.

use std::fmt;

use serde::Serialize;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use super::{Record, RequestRecord, ResponseRecord};

/// The body, compacted, when it is JSON that a `Value` holds and not `null`; `None` otherwise
/// (the record keeps it as text, as it would).
pub fn compact_json_body(bytes: &[u8]) -> Option<Vec<u8>> {
    serde_json::from_slice::<Checked>(bytes).ok()?;
    let compact = compact(bytes);
    // Valid JSON that starts with `n` is `null`.
    (compact.first() != Some(&b'n')).then_some(compact)
}

/// Accepts what a `Value` accepts, through the same `deserialize_any`, keeping nothing.
pub(crate) struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Checked, D::Error> {
        deserializer.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        // Keys are strings read as strictly as a `Value`'s (serde_json's map keys).
        while map.next_key::<Checked>()?.is_some() {
            map.next_value::<Checked>()?;
        }
        Ok(Checked)
    }
}

/// Valid JSON without the whitespace outside its strings. A string's bytes are found and copied
/// a run at a time (`memchr`): they are most of a prompt.
fn compact(json: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(json.len());
    compact_into(json, &mut out);
    out
}

/// [`compact`], appended to `out`.
pub(crate) fn compact_into(json: &[u8], out: &mut Vec<u8>) {
    let mut at = 0;
    while at < json.len() {
        let byte = json[at];
        at += 1;
        match byte {
            b' ' | b'\t' | b'\n' | b'\r' => {}
            b'"' => {
                out.push(b'"');
                at = copy_string_rest(json, at, out);
            }
            _ => out.push(byte),
        }
    }
}

/// Copies a string from just after its opening quote through its closing one; returns where
/// the JSON goes on.
fn copy_string_rest(json: &[u8], mut at: usize, out: &mut Vec<u8>) -> usize {
    while let Some(offset) = memchr::memchr2(b'"', b'\\', &json[at..]) {
        let stop = at + offset;
        if json[stop] == b'"' {
            out.extend_from_slice(&json[at..=stop]);
            return stop + 1;
        }
        // A backslash and the byte it escapes (a quote among them).
        let end = (stop + 2).min(json.len());
        out.extend_from_slice(&json[at..end]);
        at = end;
    }
    // Not reached for valid JSON: every string is closed.
    out.extend_from_slice(&json[at..]);
    json.len()
}

/// The line of `record` (`\n` included), with `request_body` and `response_body` (compacted
/// JSON from [`compact_json_body`]) written where the record's bodies go; the record's own
/// bodies are `None` where one is given. With neither given, the bytes of
/// [`super::record_line`].
pub fn record_line_with_bodies(
    record: &Record,
    request_body: Option<&[u8]>,
    response_body: Option<&[u8]>,
) -> Vec<u8> {
    // Every field named, so that a field added to the record fails to compile here until it is
    // written too; in the order serde writes them (a test holds the bytes equal).
    let Record {
        v,
        id,
        conn,
        t_start_ms,
        t_first_byte_ms,
        t_end_ms,
        request,
        response,
        error,
        tokens,
        probe,
    } = record;
    let mut line = Vec::with_capacity(
        512 + request_body.map_or(0, <[u8]>::len) + response_body.map_or(0, <[u8]>::len),
    );
    let mut object = Object::open(&mut line);
    object.field("v", v);
    object.field("id", id);
    object.field("conn", conn);
    object.field("t_start_ms", t_start_ms);
    object.field("t_first_byte_ms", t_first_byte_ms);
    object.field("t_end_ms", t_end_ms);
    object.key("request");
    request_object(object.out, request, request_body);
    object.key("response");
    match response {
        Some(response) => response_object(object.out, response, response_body),
        None => object.out.extend_from_slice(b"null"),
    }
    object.field("error", error);
    object.field("tokens", tokens);
    if *probe {
        object.field("probe", probe);
    }
    object.close();
    line.push(b'\n');
    line
}

fn request_object(out: &mut Vec<u8>, request: &RequestRecord, raw_body: Option<&[u8]>) {
    let RequestRecord {
        method,
        path,
        headers,
        body_bytes,
        body,
        body_text,
        digest,
    } = request;
    let mut object = Object::open(out);
    object.field("method", method);
    object.field("path", path);
    object.field("headers", headers);
    object.field("body_bytes", body_bytes);
    object.body(body, raw_body);
    object.field("body_text", body_text);
    object.field("digest", digest);
    object.close();
}

fn response_object(out: &mut Vec<u8>, response: &ResponseRecord, raw_body: Option<&[u8]>) {
    let ResponseRecord {
        status,
        headers,
        stream,
        chunks,
        bad_chunks,
        body_bytes,
        truncated,
        body,
        body_text,
        digest,
    } = response;
    let mut object = Object::open(out);
    object.field("status", status);
    object.field("headers", headers);
    object.field("stream", stream);
    object.field("chunks", chunks);
    object.field("bad_chunks", bad_chunks);
    object.field("body_bytes", body_bytes);
    object.field("truncated", truncated);
    object.body(body, raw_body);
    object.field("body_text", body_text);
    object.field("digest", digest);
    object.close();
}

/// A JSON object being written field by field, compact, as `serde_json::to_vec` writes one.
struct Object<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Object<'a> {
    fn open(out: &'a mut Vec<u8>) -> Object<'a> {
        out.push(b'{');
        Object { out, first: true }
    }

    fn key(&mut self, name: &str) {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        self.out.push(b'"');
        // Our own field names: nothing to escape.
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    fn field(&mut self, name: &str, value: &impl Serialize) {
        self.key(name);
        // Writing our own types to a Vec cannot fail: every map key is a string.
        let _ = serde_json::to_writer(&mut *self.out, value);
    }

    /// `"body":` and the raw body when there is one, else the record's.
    fn body(&mut self, body: &Option<serde_json::Value>, raw: Option<&[u8]>) {
        match raw {
            Some(raw) => {
                self.key("body");
                self.out.extend_from_slice(raw);
            }
            None => self.field("body", body),
        }
    }

    fn close(self) {
        self.out.push(b'}');
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::Value;

    /// What `capture` keeps as JSON: the `Value` when it parses and is not `null`.
    fn as_value(bytes: &[u8]) -> Option<Value> {
        serde_json::from_slice::<Value>(bytes)
            .ok()
            .filter(|v| !v.is_null())
    }

    #[test]
    fn a_body_is_taken_exactly_when_a_value_is_and_reads_back_the_same() {
        let deep_ok = format!("{}{}", "[".repeat(100), "]".repeat(100));
        let too_deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let cases: Vec<Vec<u8>> = [
            r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#,
            "{ \"b\" : [ 1 , 2.50 , -0 , 1e2 , true , null ] ,\n\t\"a\" : \"x y\\n\\\" \\\\ \" }\r\n",
            r#"{"z":1,"a":2,"z":3}"#,
            r#"{"text":"caf\u00e9 \ud83d\ude00 é"}"#,
            r#"{"lone":"\ud800"}"#,
            r#"{"bad escape":"\x"}"#,
            "{\"control\":\"a\u{1}b\"}",
            r#"{"big":123456789012345678901234567890,"small":1e-400}"#,
            r#"{"huge":1e400}"#,
            r#""just a string""#,
            "42",
            "null",
            " null ",
            "",
            "   ",
            "not json",
            r#"{"a":1} trailing"#,
            r#"{"a":1}{"b":2}"#,
            r#"{"a":}"#,
            r#"[1,2,]"#,
            r#"{"key with \"quote\" and \\ and \/":"v"}"#,
            deep_ok.as_str(),
            too_deep.as_str(),
        ]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .chain([
            b"{\"bytes\":\"\xff\xfe\"}".to_vec(),
            b"{\"ok\":\"\xc3\xa9\"}".to_vec(),
        ])
        .collect();
        for bytes in &cases {
            let text = String::from_utf8_lossy(bytes);
            let compact = compact_json_body(bytes);
            assert_eq!(
                compact.is_some(),
                as_value(bytes).is_some(),
                "taken alike: {text}"
            );
            if let Some(compact) = compact {
                let read: Value = serde_json::from_slice(&compact).expect("reads back");
                assert_eq!(Some(read), as_value(bytes), "same value: {text}");
                assert!(!compact.contains(&b'\n'), "one line: {text}");
            }
        }
    }

    /// Every record of the real recordings in the repository (prefixscope's and llmp's, full
    /// and digest, probes, harness traffic, hostile escapes).
    pub(crate) fn real_records() -> Vec<Record> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let files = [
            "recordings/llmp/llama.cpp/parallel-nocache.jsonl",
            "recordings/llmp/llama.cpp/parallel.jsonl",
            "recordings/llmp/llama.cpp/session.jsonl",
            "recordings/llmp/llama.cpp/session.digest.jsonl",
            "recordings/llmp/ollama/session.jsonl",
            "recordings/llmp/ollama-openai/session.jsonl",
            "recordings/xllamacpp/session.jsonl",
            "recordings/xllamacpp/session.digest.jsonl",
            "tests/data/harness/aider.jsonl",
            "tests/data/harness/codex.jsonl",
            "tests/data/harness/opencode.jsonl",
            "tests/data/harness/claude-code.digest.jsonl",
            "tests/data/hostile-escapes.jsonl",
        ];
        let mut records = Vec::new();
        for file in files {
            let text = std::fs::read(root.join(file)).expect(file);
            let read = super::super::read_jsonl(&text[..]);
            assert!(!read.records.is_empty(), "{file}");
            records.extend(read.records);
        }
        records
    }

    #[test]
    fn without_raw_bodies_the_line_is_serdes_byte_for_byte() {
        let mut records = real_records();
        // None of them is a probe (the only field serde may leave out): one made of the first.
        let mut probe = records[0].clone();
        probe.probe = true;
        records.push(probe);
        let mut unanswered = records[1].clone();
        unanswered.response = None;
        unanswered.error = Some(super::super::ExchangeError::UpstreamUnreachable);
        records.push(unanswered);
        assert!(
            records.iter().any(|r| r.request.digest.is_some()),
            "a digest"
        );
        assert!(records.iter().any(|r| r.response.is_none()), "no response");
        for record in &records {
            assert_eq!(
                record_line_with_bodies(record, None, None),
                super::super::record_line(record),
                "record {}",
                record.id
            );
        }
    }

    /// A seeded xorshift: the same cases on every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// Random bytes from JSON's alphabet (most are not JSON), and random JSON values written
    /// with random whitespace between their tokens (all are): taken exactly when a `Value` is,
    /// read back as the same `Value`.
    #[test]
    fn fuzzed_bodies_are_taken_as_a_value_takes_them() {
        const PIECES: &[&[u8]] = &[
            b"{",
            b"}",
            b"[",
            b"]",
            b",",
            b":",
            b"\"",
            b"\\",
            b"u",
            b"d800",
            b"00e9",
            b"0",
            b"9",
            b"-",
            b"+",
            b".",
            b"e",
            b"E",
            b"1e400",
            b"n",
            b"null",
            b"true",
            b"fals",
            b"a",
            b" ",
            b"\n",
            b"\t",
            b"\r",
            b"\x01",
            b"\xc3\xa9",
            b"\xff",
            b"/",
            b"b",
        ];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut taken, mut total) = (0, 0);
        for _ in 0..20_000 {
            let mut bytes = Vec::new();
            for _ in 0..rng.below(24) {
                bytes.extend_from_slice(PIECES[rng.below(PIECES.len())]);
            }
            // Half of them start as an object, so more get deep enough to matter.
            if rng.below(2) == 0 {
                bytes.insert(0, b'{');
            }
            total += 1;
            let compact = compact_json_body(&bytes);
            assert_eq!(compact.is_some(), as_value(&bytes).is_some(), "{bytes:?}");
            if let Some(compact) = compact {
                taken += 1;
                let read: Value = serde_json::from_slice(&compact).expect("reads back");
                assert_eq!(Some(read), as_value(&bytes), "{bytes:?}");
            }
        }
        assert!(taken > 50 && taken < total, "{taken} of {total}");
        let mut spaced_taken = 0;
        for _ in 0..2_000 {
            let value = random_value(&mut rng, 4);
            let mut bytes = Vec::new();
            spaced(
                &serde_json::to_vec(&value).expect("writes"),
                &mut rng,
                &mut bytes,
            );
            let compact = compact_json_body(&bytes);
            spaced_taken += usize::from(compact.is_some());
            let read = compact.map(|c| serde_json::from_slice::<Value>(&c).expect("reads back"));
            assert_eq!(
                read,
                as_value(&bytes),
                "{}",
                String::from_utf8_lossy(&bytes)
            );
        }
        // All but the `null`s.
        assert!(spaced_taken > 1_500, "{spaced_taken}");
    }

    fn random_value(rng: &mut Rng, depth: usize) -> Value {
        match rng.below(if depth == 0 { 5 } else { 7 }) {
            0 => Value::Null,
            1 => Value::Bool(rng.below(2) == 0),
            2 => serde_json::json!(rng.next() as i64),
            3 => serde_json::json!((rng.next() as f64) / 7.0),
            4 => {
                let chars = ['a', ' ', '"', '\\', '\n', 'é', '😀', '\u{1}', ':', '{'];
                Value::String(
                    (0..rng.below(12))
                        .map(|_| chars[rng.below(chars.len())])
                        .collect(),
                )
            }
            5 => Value::Array(
                (0..rng.below(4))
                    .map(|_| random_value(rng, depth - 1))
                    .collect(),
            ),
            _ => Value::Object(
                (0..rng.below(4))
                    .map(|i| {
                        (
                            format!("k{i} \"{}", rng.below(3)),
                            random_value(rng, depth - 1),
                        )
                    })
                    .collect(),
            ),
        }
    }

    /// `json` with random whitespace added between its tokens.
    fn spaced(json: &[u8], rng: &mut Rng, out: &mut Vec<u8>) {
        let (mut in_string, mut escaped) = (false, false);
        for &byte in json {
            // Around structural bytes only: inside a number or `true` it would split a token.
            if !in_string && b"{}[],:\"".contains(&byte) && rng.below(2) == 0 {
                out.extend_from_slice([&b" "[..], b"\n", b"\t", b"\r\n"][rng.below(4)]);
            }
            out.push(byte);
            if in_string {
                if escaped {
                    escaped = false;
                } else if byte == b'\\' {
                    escaped = true;
                } else if byte == b'"' {
                    in_string = false;
                }
            } else if byte == b'"' {
                in_string = true;
            }
        }
        out.push(b'\n');
    }

    #[test]
    fn whitespace_inside_strings_is_kept_and_outside_dropped() {
        let body = b" { \"a b\" : \" c\\\" d \" , \"e\" : [ 1 , 2 ] } ";
        assert_eq!(
            compact_json_body(body).as_deref(),
            Some(&b"{\"a b\":\" c\\\" d \",\"e\":[1,2]}"[..])
        );
    }
}
