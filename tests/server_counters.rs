//! Every server's reuse counters, read from one response per server
//! (`tests/data/server-counters`): the analysis (`normalize`, full and digest recordings) and
//! the readers outside it (`input::server_counts`: profile, export, the headless printer) read
//! the same prompt and reused tokens, and "not reported" stays `None`, never 0.

use std::collections::BTreeMap;
use std::path::Path;

use prefixscope_core::capture::{BodyMode, Capture, ResponseCapture, build_record, stream_kind_of};
use prefixscope_core::normalize::{Exchange, normalize};
use serde_json::{Value, json};

struct Fixture {
    name: String,
    doc: Value,
}

fn fixtures() -> Vec<Fixture> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/server-counters");
    let mut fixtures: Vec<Fixture> = std::fs::read_dir(&dir)
        .expect("fixture directory")
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            (path.extension()? == "json").then_some(path)
        })
        .map(|path| Fixture {
            name: path.file_stem().unwrap().to_string_lossy().into_owned(),
            doc: serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap(),
        })
        .collect();
    fixtures.sort_by(|a, b| a.name.cmp(&b.name));
    fixtures
}

fn capture(fixture: &Fixture) -> Capture {
    let doc = &fixture.doc;
    let path = doc["path"].as_str().unwrap().to_string();
    let content_type = doc["content_type"].as_str().unwrap();
    let stream = stream_kind_of(content_type);
    // Ollama's /api/chat and the OpenAI chat API take the same request shape.
    let request = json!({"model": "m", "messages": [{"role": "user", "content": "2+2?"}], "stream": stream.is_some()});
    let request = serde_json::to_vec(&request).unwrap();
    let body = doc["body"].as_str().unwrap().as_bytes().to_vec();
    Capture {
        id: 1,
        conn: 1,
        t_start_ms: 1_000,
        t_first_byte_ms: Some(1_100),
        t_end_ms: 1_500,
        method: "POST".into(),
        path,
        request_headers: BTreeMap::from([("content-type".into(), "application/json".into())]),
        request_body_bytes: request.len() as u64,
        request_body: Some(request),
        response: Some(ResponseCapture {
            status: 200,
            headers: BTreeMap::from([("content-type".into(), content_type.into())]),
            stream,
            body_bytes: body.len() as u64,
            body,
            truncated: false,
        }),
        error: None,
        probe: false,
    }
}

fn expected(fixture: &Fixture, key: &str) -> Option<u64> {
    fixture.doc["expect"][key].as_u64()
}

fn normalized(fixture: &Fixture, mode: BodyMode) -> Exchange {
    let record = build_record(capture(fixture), mode);
    normalize(&record).unwrap_or_else(|e| panic!("{}: {e:?}", fixture.name))
}

#[test]
fn every_servers_counters_read_as_documented_in_full_and_digest_recordings() {
    let fixtures = fixtures();
    assert!(fixtures.len() >= 10, "{} fixtures", fixtures.len());
    for fixture in &fixtures {
        for mode in [BodyMode::Full, BodyMode::Digest] {
            let counts = normalized(fixture, mode).counts;
            let read = (
                counts.prompt_tokens.map(|m| u64::from(m.value)),
                counts.reused_tokens.map(|m| u64::from(m.value)),
                counts.evaluated_tokens.map(|m| u64::from(m.value)),
            );
            let want = (
                expected(fixture, "prompt"),
                expected(fixture, "reused"),
                expected(fixture, "evaluated"),
            );
            assert_eq!(read, want, "{} ({mode:?})", fixture.name);
            if let Some(ms) = fixture.doc["expect"]["prefill_ms"].as_f64() {
                let prefill = counts.prefill_ms.map(|m| m.value);
                assert_eq!(prefill, Some(ms), "{} ({mode:?})", fixture.name);
            }
        }
    }
}

#[test]
fn the_readers_outside_the_analysis_read_the_same_counts() {
    for fixture in fixtures() {
        let record = build_record(capture(&fixture), BodyMode::Full);
        let body = record.response.as_ref().and_then(|r| r.body.clone());
        let counts = prefixscope_core::input::server_counts(&body.unwrap_or(Value::Null));
        assert_eq!(
            (counts.prompt_tokens, counts.reused_tokens),
            (expected(&fixture, "prompt"), expected(&fixture, "reused")),
            "{}",
            fixture.name
        );
        assert_eq!(
            prefixscope::session::headless::prompt_and_reused(&record),
            (counts.prompt_tokens, counts.reused_tokens),
            "{}",
            fixture.name
        );
    }
}

#[test]
fn each_fixture_says_whether_a_real_server_or_only_its_documentation_backs_it() {
    for fixture in fixtures() {
        let verified = fixture.doc["verified"].as_str();
        let documented = fixture.doc["documented"].as_str();
        assert!(
            verified.is_some() != documented.is_some(),
            "{}: exactly one of verified / documented",
            fixture.name
        );
        if let Some(source) = verified {
            // A verified shape names the real response it was checked against.
            assert!(source.contains("tests/data") || source.contains("recordings/"));
        }
    }
}

/// An Ollama recording whose native responses carry `prompt_eval_cached_count` (the real
/// Ollama 0.32 session with the field added as 0.33 documents it): reuse is measured, and so
/// are the side-call's and the system prompt change's losses (the side-call's is what the
/// runner's cache held after the turn before it: that turn's prompt by the server's count, 523,
/// and its reply but the last token, 45).
#[test]
fn ollama_with_cached_counts_gives_measured_reuse_and_loss() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_prefixscope"))
        .args(["analyze", "tests/data/ollama-cached/session.jsonl"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("reuse reported on 6 of 6 turns"), "{text}");
    assert!(
        text.contains(
            "by cause: system prompt changes 90 ms (639 tokens) · side-calls 34 ms (568 tokens)"
        ),
        "{text}"
    );
    // The real recording without the field: nothing measured, and said so.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_prefixscope"))
        .args(["analyze", "recordings/llmp/ollama/session.jsonl"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("reuse reported on 0 of 6 turns"), "{text}");
    assert!(text.contains("not measured"), "{text}");
}
