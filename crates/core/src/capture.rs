//! From what the proxy captured (raw bytes, times, errors) to a `Record`. Pure: the proxy's
//! clock readings come in as fields, so the same capture always gives the same record.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::RECORD_VERSION;
use crate::normalize::digest::apply_digest;
use crate::normalize::{Api, stream};
use crate::record::{ExchangeError, Record, RequestRecord, ResponseRecord, StreamKind};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BodyMode {
    #[default]
    Full,
    Digest,
}

/// One exchange as the proxy saw it. `B` is whatever holds bytes (`Vec<u8>`, `bytes::Bytes`),
/// so the proxy hands over its buffers without copying.
#[derive(Debug, Clone)]
pub struct Capture<B = Vec<u8>> {
    pub id: u64,
    pub conn: u64,
    pub t_start_ms: i64,
    pub t_first_byte_ms: Option<i64>,
    pub t_end_ms: i64,
    pub method: String,
    pub path: String,
    pub request_headers: BTreeMap<String, String>,
    pub request_body_bytes: u64,
    /// `None` when the body was over the recording limit (forwarded, not stored).
    pub request_body: Option<B>,
    pub response: Option<ResponseCapture>,
    pub error: Option<ExchangeError>,
    /// A probe of the upstream (`probe::poll`), not the traffic: its response body (the reading,
    /// JSON) is kept whatever the path and the mode, and the record is marked `probe`.
    pub probe: bool,
}

#[derive(Debug, Clone, Default)]
pub struct ResponseCapture {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub stream: Option<StreamKind>,
    /// What was kept, at most the recording limit.
    pub body: Vec<u8>,
    /// What the client was sent.
    pub body_bytes: u64,
    pub truncated: bool,
}

/// How a response body is streamed, from its content type.
pub fn stream_kind_of(content_type: &str) -> Option<StreamKind> {
    // Every exchange asks: compared in place, with no lowercased copy.
    let contains = |needle: &[u8]| {
        content_type
            .as_bytes()
            .windows(needle.len())
            .any(|window| window.eq_ignore_ascii_case(needle))
    };
    if contains(b"text/event-stream") {
        Some(StreamKind::Sse)
    } else if contains(b"ndjson") {
        Some(StreamKind::Ndjson)
    } else {
        None
    }
}

pub fn build_record<B: AsRef<[u8]>>(capture: Capture<B>, mode: BodyMode) -> Record {
    let api = Api::from_path(&capture.path);
    let probe = capture.probe;
    let keep = api.keeps_bodies() || probe;
    let too_large = capture.request_body.is_none() && capture.request_body_bytes > 0;
    let (body, body_text) = match (&capture.request_body, keep) {
        (Some(bytes), true) => stored_body(bytes.as_ref()),
        _ => (None, None),
    };
    let error = capture
        .error
        .or(too_large.then_some(ExchangeError::BodyTooLarge));
    let response = capture.response.map(|response| {
        let (body, body_text, chunks, bad_chunks) = match (response.stream, keep) {
            (_, false) => (None, None, None, None),
            (Some(kind), true) => merged_stream(api, kind, &response.body),
            (None, true) => {
                let (body, body_text) = stored_body(&response.body);
                (body, body_text, None, None)
            }
        };
        // Stream counters are about what arrived, so they stay even when bodies aren't kept.
        let (chunks, bad_chunks) = match (response.stream, keep) {
            (Some(kind), false) => {
                let merged = stream::merge(api, kind, &response.body);
                (Some(merged.chunks), Some(merged.bad_chunks))
            }
            _ => (chunks, bad_chunks),
        };
        ResponseRecord {
            status: response.status,
            headers: response.headers,
            stream: response.stream,
            chunks,
            bad_chunks,
            body_bytes: response.body_bytes,
            truncated: response.truncated,
            body,
            body_text,
            digest: None,
        }
    });
    let mut record = Record {
        v: RECORD_VERSION,
        id: capture.id,
        conn: capture.conn,
        t_start_ms: capture.t_start_ms,
        t_first_byte_ms: capture.t_first_byte_ms,
        t_end_ms: capture.t_end_ms,
        request: RequestRecord {
            method: capture.method,
            // The query's credentials stay out of the record (the upstream got them unchanged).
            path: crate::privacy::redact_query(&capture.path).into_owned(),
            headers: capture.request_headers,
            body_bytes: capture.request_body_bytes,
            body,
            body_text,
            digest: None,
        },
        response,
        error,
        tokens: None,
        probe,
    };
    apply_mode(&mut record, mode);
    record
}

/// A stream merged through `Value`s: its body (or its text when no event reads), its counts.
fn merged_stream(
    api: Api,
    kind: StreamKind,
    body: &[u8],
) -> (Option<Value>, Option<String>, Option<u32>, Option<u32>) {
    let merged = stream::merge(api, kind, body);
    let (body, body_text) = if merged.body.is_null() {
        (None, lossy_text(body))
    } else {
        (Some(merged.body), None)
    };
    (
        body,
        body_text,
        Some(merged.chunks),
        Some(merged.bad_chunks),
    )
}

/// The record as `mode` keeps it: in digest mode its texts give way to their digests, except a
/// probe's body, which is our own reading (no prompt text). For a record built in full and
/// enriched first (the recorder's layout) as for one built in its mode.
pub fn apply_mode(record: &mut Record, mode: BodyMode) {
    if mode == BodyMode::Digest && !record.probe {
        apply_digest(record);
    }
}

/// JSON when it parses (and isn't `null`), else the text with invalid bytes replaced. JSON of
/// more values than `limits::MAX_JSON_VALUES` stays text: read into `Value`s it would cost
/// many times its bytes, and one such request must never stop the proxy.
fn stored_body(bytes: &[u8]) -> (Option<Value>, Option<String>) {
    if crate::limits::too_many_json_values(bytes) {
        return (None, lossy_text(bytes));
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(value) if !value.is_null() => (Some(value), None),
        _ => (None, lossy_text(bytes)),
    }
}

fn lossy_text(bytes: &[u8]) -> Option<String> {
    (!bytes.is_empty()).then(|| String::from_utf8_lossy(bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_stream_kind_is_found_in_any_case_anywhere_in_the_content_type() {
        for (content_type, kind) in [
            ("text/event-stream", Some(StreamKind::Sse)),
            ("Text/Event-Stream; charset=utf-8", Some(StreamKind::Sse)),
            ("application/x-ndjson", Some(StreamKind::Ndjson)),
            ("APPLICATION/NDJSON", Some(StreamKind::Ndjson)),
            ("application/json", None),
            ("text/event-strea", None),
            ("", None),
            ("é text/event-stream", Some(StreamKind::Sse)),
        ] {
            assert_eq!(stream_kind_of(content_type), kind, "{content_type}");
        }
    }

    fn capture(path: &str, request: &[u8], response: Option<ResponseCapture>) -> Capture {
        Capture {
            id: 3,
            conn: 1,
            t_start_ms: 100,
            t_first_byte_ms: Some(150),
            t_end_ms: 200,
            method: "POST".into(),
            path: path.into(),
            request_headers: BTreeMap::new(),
            request_body_bytes: request.len() as u64,
            request_body: Some(request.to_vec()),
            response,
            error: None,
            probe: false,
        }
    }

    fn stored_as_value(bytes: &[u8]) -> (Option<Value>, Option<String>) {
        stored_body(bytes)
    }

    #[test]
    fn stored_body_rules() {
        assert_eq!(stored_as_value(b""), (None, None));
        assert_eq!(stored_as_value(b"{\"a\":1}"), (Some(json!({"a": 1})), None));
        assert_eq!(stored_as_value(b"null"), (None, Some("null".into())));
        assert_eq!(
            stored_as_value(b"oops \xff"),
            (None, Some("oops \u{fffd}".into()))
        );
    }

    #[test]
    fn a_body_of_too_many_json_values_is_kept_as_text() {
        let body = format!(
            "{{\"messages\":[{}0]}}",
            "0,".repeat(crate::limits::MAX_JSON_VALUES)
        );
        let (value, text) = stored_body(body.as_bytes());
        assert_eq!(value, None);
        assert_eq!(text.map(|t| t.len()), Some(body.len()));
    }

    #[test]
    fn too_large_request_is_an_error_without_body() {
        let mut c = capture("/v1/chat/completions", b"{}", None);
        c.request_body = None;
        c.request_body_bytes = 10;
        let r = build_record(c, BodyMode::Full);
        assert_eq!(r.error, Some(ExchangeError::BodyTooLarge));
        assert_eq!(r.request.body, None);
        assert_eq!(r.request.body_bytes, 10);
    }

    #[test]
    fn other_paths_keep_no_body() {
        let response = ResponseCapture {
            status: 200,
            body: b"{\"data\":[]}".to_vec(),
            body_bytes: 11,
            ..Default::default()
        };
        let r = build_record(
            capture("/v1/models", b"{\"x\":1}", Some(response)),
            BodyMode::Full,
        );
        assert_eq!(r.request.body, None);
        assert_eq!(r.response.as_ref().and_then(|r| r.body.clone()), None);
        assert_eq!(r.response.map(|r| r.body_bytes), Some(11));
    }

    #[test]
    fn streamed_chat_is_merged_and_digest_drops_text() {
        let request =
            br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"secret words"}]}"#;
        let response = ResponseCapture {
            status: 200,
            stream: Some(StreamKind::Sse),
            body: b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hidden reply\"}}]}\n\ndata: [DONE]\n\n".to_vec(),
            body_bytes: 70,
            ..Default::default()
        };
        let full = build_record(
            capture("/v1/chat/completions", request, Some(response.clone())),
            BodyMode::Full,
        );
        let merged = full
            .response
            .as_ref()
            .and_then(|r| r.body.clone())
            .unwrap_or_default();
        assert_eq!(merged["choices"][0]["message"]["content"], "hidden reply");
        let digest = build_record(
            capture("/v1/chat/completions", request, Some(response)),
            BodyMode::Digest,
        );
        let line = String::from_utf8(crate::record::record_line(&digest)).unwrap();
        assert!(!line.contains("secret") && !line.contains("hidden"));
        assert_eq!(
            digest.request.digest.as_ref().map(|d| d.messages[0].chars),
            Some(12)
        );
        assert_eq!(digest.response.as_ref().and_then(|r| r.chunks), Some(1));
    }
}
