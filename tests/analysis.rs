//! The analysis against real recordings: llmp's own reports reproduced field for field, the
//! design's invariants on every file, full and digest recordings agreeing, the figures the
//! issue names, and golden reports of our own (`PREFIXSCOPE_UPDATE_GOLDEN=1` rewrites them;
//! say why in the commit).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prefixscope_core::analysis::Report;
use prefixscope_core::analysis::{BreakCause, Row};
use prefixscope_core::analysis::{Config, analyze};
use prefixscope_core::record::{Record, read_jsonl};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const RECORDINGS: [&str; 8] = [
    "llmp/llama.cpp/parallel-nocache",
    "llmp/llama.cpp/parallel",
    "llmp/llama.cpp/session",
    "llmp/llama.cpp/session.digest",
    "llmp/ollama/session",
    "llmp/ollama-openai/session",
    "xllamacpp/session",
    "xllamacpp/session.digest",
];

fn load(name: &str) -> Vec<Record> {
    let path = root().join("recordings").join(format!("{name}.jsonl"));
    let read = read_jsonl(std::fs::read(&path).unwrap().as_slice());
    assert!(read.bad_lines.is_empty(), "{name}: {:?}", read.bad_lines);
    read.records
}

fn report(name: &str) -> Report {
    analyze(&load(name), &Config::default())
}

/// Keeps only what `expected` has: our extensions are new fields, never changed ones.
fn project(actual: &Value, expected: &Value) -> Value {
    match (actual, expected) {
        (Value::Object(a), Value::Object(e)) => Value::Object(
            e.keys()
                .filter_map(|k| a.get(k).map(|v| (k.clone(), project(v, &e[k]))))
                .collect(),
        ),
        (Value::Array(a), Value::Array(e)) if a.len() == e.len() => {
            Value::Array(a.iter().zip(e).map(|(x, y)| project(x, y)).collect())
        }
        _ => actual.clone(),
    }
}

/// llmp's report with the evictions of `EVICTIONS_BY_THE_SERVERS_COUNT` charged as we charge
/// them, in the rows and in every total that sums them.
fn with_the_servers_counts(name: &str, report: &mut Value) {
    for &(_, id, theirs, mine) in EVICTIONS_BY_THE_SERVERS_COUNT
        .iter()
        .filter(|e| e.0 == name)
    {
        let less = u64::from(theirs - mine);
        let rows = report["rows"].as_array_mut().unwrap();
        let row = rows.iter_mut().find(|r| r["id"] == id).unwrap();
        row["lost_external"]["tokens"] = Value::from(mine);
        let cause = row["lost_external"]["cause"].as_str().unwrap().to_string();
        let minus = |v: &mut Value| *v = Value::from(v.as_u64().unwrap() - less);
        minus(&mut report["time"]["lost_tokens"]);
        minus(&mut report["time"]["by_cause"][&cause]["tokens"]);
        // An eviction's finding lists its turns; a side-call's lists the side-calls.
        for finding in report["findings"].as_array_mut().unwrap() {
            let lists = finding["rows"]
                .as_array()
                .is_some_and(|rows| rows.contains(&Value::from(id)));
            if lists
                || (cause == "side_call" && finding["kind"] == "side_call_on_conversation_model")
            {
                minus(&mut finding["lost_tokens"]);
            }
        }
    }
}

fn strip_ms(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|key, _| key != "ms" && key != "lost_ms");
            map.values_mut().for_each(strip_ms);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_ms),
        _ => {}
    }
}

#[test]
fn reports_equal_llmps_own_reports_of_its_recordings() {
    for name in &RECORDINGS[..6] {
        let golden = root()
            .join("tests/data/llmp-reports")
            .join(format!("{}.report.json", name.trim_start_matches("llmp/")));
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(&golden).unwrap()).unwrap();
        let mut expected = expected;
        let actual = serde_json::to_value(report(name)).unwrap();
        let mut projected = project(&actual, &expected);
        if EVICTIONS_BY_THE_SERVERS_COUNT.iter().any(|e| e.0 == *name) {
            with_the_servers_counts(name, &mut expected);
            // Milliseconds are tokens priced at the recording's rates: they move with them.
            strip_ms(&mut expected);
            strip_ms(&mut projected);
        }
        if projected != expected {
            let differing: Vec<&String> = expected
                .as_object()
                .unwrap()
                .keys()
                .filter(|key| projected[key.as_str()] != expected[key.as_str()])
                .collect();
            panic!("{name}: {differing:?} differ from llmp's report");
        }
    }
}

/// Rows whose loss differs from llmp's on purpose (#19): llmp counts the previous reply and
/// messages moved within the history as new content, though the server had processed them. Each
/// entry: recording, row, llmp's tokens, ours, and the server's prompt / reused / re-evaluated
/// tokens. What the server re-evaluated beyond our charge is the turn's new message.
const LOSSES_BEYOND_LLMP: [(&str, u64, u32, u32, [u32; 3]); 2] = [
    // The weekday changed at the end of the system prompt: 150 re-evaluated, of which the new
    // user message is 7; llmp left the re-sent reply (14) uncharged.
    ("xllamacpp/session", 6, 129, 143, [188, 38, 150]),
    // The same in digest mode: the edited system prompt counts only its unchanged 256-character
    // head and tail (llmp's digest rule), hence less.
    ("xllamacpp/session.digest", 6, 96, 110, [188, 38, 150]),
];

/// Evictions of appended turns that llmp overcharges: it weighs the previous prompt by the
/// characters of this one's messages, which comes out 4 to 18 tokens more than the server
/// counted for that very prompt (the slot cannot have held more). Ours is the server's count
/// (Gemma 4's replies began with reasoning, which the next turn does not send: no reply held).
/// Recording, row, llmp's tokens, ours.
const EVICTIONS_BY_THE_SERVERS_COUNT: [(&str, u64, u32, u32); 15] = [
    ("llmp/llama.cpp/parallel-nocache", 3, 466, 449),
    ("llmp/llama.cpp/parallel-nocache", 6, 379, 362),
    ("llmp/llama.cpp/parallel-nocache", 8, 403, 390),
    ("llmp/llama.cpp/parallel-nocache", 9, 470, 452),
    ("llmp/llama.cpp/parallel-nocache", 10, 460, 453),
    ("llmp/llama.cpp/parallel-nocache", 11, 541, 531),
    ("llmp/llama.cpp/parallel-nocache", 12, 464, 456),
    ("llmp/llama.cpp/parallel-nocache", 13, 547, 538),
    ("llmp/llama.cpp/parallel-nocache", 14, 518, 510),
    ("llmp/llama.cpp/parallel-nocache", 16, 491, 483),
    ("llmp/llama.cpp/parallel-nocache", 17, 570, 561),
    ("llmp/llama.cpp/parallel-nocache", 18, 541, 537),
    ("llmp/llama.cpp/parallel-nocache", 19, 604, 595),
    ("llmp/llama.cpp/parallel-nocache", 20, 518, 509),
    ("llmp/llama.cpp/parallel-nocache", 21, 592, 583),
];

#[test]
fn losses_differ_from_llmp_only_where_the_server_counts_justify_it() {
    let mut differences = Vec::new();
    for name in RECORDINGS {
        let llmp = root()
            .join("tests/data/llmp-reports")
            .join(format!("{}.report.json", name.trim_start_matches("llmp/")));
        let llmp: Value = serde_json::from_str(&std::fs::read_to_string(&llmp).unwrap()).unwrap();
        let ours = report(name);
        let lost = |value: &Value| {
            ["lost_client", "lost_external"]
                .iter()
                .filter_map(|key| value[key]["tokens"].as_u64())
                .sum::<u64>() as u32
        };
        for expected in llmp["rows"].as_array().unwrap() {
            let id = expected["id"].as_u64().unwrap();
            let row = ours.rows.iter().find(|r| r.id == id).unwrap();
            // Turns, conversations and break locations stay llmp's.
            let actual = serde_json::to_value(row).unwrap();
            for key in ["turn", "conversation", "break_cause", "prefix_tokens"] {
                assert_eq!(actual[key], expected[key], "{name} row {id}: {key}");
            }
            let (theirs, mine) = (lost(expected), lost(&actual));
            if theirs != mine {
                let c = &row.counts;
                let value = |m: Option<prefixscope_core::normalize::Measured<u32>>| {
                    m.map_or(0, |m| m.value)
                };
                differences.push((
                    name,
                    id,
                    theirs,
                    mine,
                    [
                        value(c.prompt_tokens),
                        value(c.reused_tokens),
                        value(c.evaluated_tokens),
                    ],
                ));
            }
        }
    }
    let by_count: Vec<_> = differences
        .iter()
        .filter(|d| d.0.starts_with("llmp/"))
        .map(|&(name, id, theirs, mine, _)| (name, id, theirs, mine))
        .collect();
    assert_eq!(by_count, EVICTIONS_BY_THE_SERVERS_COUNT);
    let beyond: Vec<_> = differences
        .into_iter()
        .filter(|d| !d.0.starts_with("llmp/"))
        .collect();
    assert_eq!(beyond, LOSSES_BEYOND_LLMP);
    for (name, id, theirs, mine, [prompt, reused, evaluated]) in LOSSES_BEYOND_LLMP {
        // More of what the server proved lost is accounted for, never more than it re-evaluated.
        assert!(theirs < mine && mine <= evaluated, "{name} row {id}");
        assert_eq!(prompt - reused, evaluated, "{name} row {id}");
    }
    for (name, id, theirs, mine) in EVICTIONS_BY_THE_SERVERS_COUNT {
        // Ours is the previous request's prompt as the server counted it; llmp's is more.
        let report = report(name);
        let row = report.rows.iter().find(|r| r.id == id).unwrap();
        let previous = report
            .rows
            .iter()
            .find(|r| Some(r.id) == row.linked_to)
            .unwrap();
        assert_eq!(
            previous.counts.prompt_tokens.map(|p| p.value),
            Some(mine),
            "{name} row {id}"
        );
        assert!(mine < theirs, "{name} row {id}");
    }
}

#[test]
fn golden_reports() {
    let update = std::env::var_os("PREFIXSCOPE_UPDATE_GOLDEN").is_some();
    let mut stale = Vec::new();
    for name in RECORDINGS {
        let actual = serde_json::to_string_pretty(&report(name)).unwrap() + "\n";
        let golden = root()
            .join("tests/golden/analysis")
            .join(format!("{}.report.json", name.replace('/', "--")));
        if update {
            std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
            std::fs::write(&golden, &actual).unwrap();
        } else if std::fs::read_to_string(&golden).unwrap_or_default() != actual {
            stale.push(golden.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "reports differ from {stale:?}; if intended, rerun with PREFIXSCOPE_UPDATE_GOLDEN=1 and say why in the commit"
    );
}

#[test]
fn parallel_nocache_gives_the_figures_of_the_issue() {
    let r = report("llmp/llama.cpp/parallel-nocache");
    assert_eq!(
        (
            r.coverage.records,
            r.coverage.analysed,
            r.coverage.turns,
            r.coverage.conversations
        ),
        (24, 23, 22, 5)
    );
    let clients: Vec<(&str, u32, u32)> = r
        .clients
        .iter()
        .map(|c| (c.client.as_str(), c.requests, c.conversations))
        .collect();
    assert_eq!(
        clients,
        vec![
            ("llmp-drive/1 #1", 12, 3),
            ("llmp-drive/1 #2", 5, 1),
            ("other-agent/2", 5, 1),
            ("llmp-drive/1", 1, 0)
        ]
    );
    // llmp's 8,759 less the 155 its weights charge beyond the previous prompts' own counts
    // (`EVICTIONS_BY_THE_SERVERS_COUNT`).
    assert_eq!(r.time.lost_tokens, 8_604);
    let share = r.time.lost_ms.unwrap().value / r.time.prefill_ms.unwrap().value;
    assert_eq!((share * 100.0).round(), 76.0);
    let by_cause: BTreeMap<&str, u64> = r
        .time
        .by_cause
        .iter()
        .map(|(k, v)| (k.as_str(), v.tokens))
        .collect();
    assert_eq!(
        by_cause,
        BTreeMap::from([
            ("other_conversation", 7_630),
            ("system_changed", 584),
            ("side_call", 390)
        ])
    );
}

#[test]
fn parallel_agents_are_linked_to_their_own_conversations() {
    for name in ["llmp/llama.cpp/parallel", "llmp/llama.cpp/parallel-nocache"] {
        let records = load(name);
        let r = analyze(&records, &Config::default());
        let agent_of: BTreeMap<u64, String> = records
            .iter()
            .filter_map(|rec| {
                Some((
                    rec.id,
                    rec.request.body.as_ref()?["messages"][0]["content"]
                        .as_str()?
                        .chars()
                        .take(60)
                        .collect(),
                ))
            })
            .collect();
        let mut conversations: BTreeMap<String, BTreeMap<u32, usize>> = BTreeMap::new();
        for row in r.rows.iter().filter(|r| r.conversation.is_some()) {
            *conversations
                .entry(agent_of[&row.id].clone())
                .or_default()
                .entry(row.conversation.unwrap())
                .or_default() += 1;
        }
        assert_eq!(conversations.len(), 5, "{name}");
        assert!(
            conversations.values().all(|ids| ids.len() == 1),
            "{name}: an agent split in two"
        );
        assert!(
            r.rows.iter().all(
                |r| r.break_cause.is_none() || r.break_cause == Some(BreakCause::SystemChanged)
            ),
            "{name}: a false break"
        );
    }
}

fn rows_of(name: &str) -> Vec<Row> {
    report(name).rows
}

#[test]
fn invariants_hold_on_every_recording() {
    for name in RECORDINGS {
        let r = report(name);
        let text = serde_json::to_string(&r).unwrap();
        assert!(!text.contains("NaN") && !text.contains("-0.0"), "{name}");
        for row in &r.rows {
            let evaluated = row.counts.evaluated_tokens.map_or(0, |e| e.value);
            let lost: u32 = [&row.lost_client, &row.lost_external]
                .into_iter()
                .flatten()
                .map(|l| l.tokens)
                .sum();
            assert!(
                lost <= evaluated,
                "{name} row {}: lost {lost} > evaluated {evaluated}",
                row.id
            );
            // A break whose two sides read the same is a defect: the server renders them alike.
            if let Some(location) = &row.break_location
                && location.before.is_some()
            {
                assert_ne!(
                    location.before, location.after,
                    "{name} row {}: a break with nothing changed",
                    row.id
                );
            }
            let c = &row.counts;
            if row.loss_measured {
                assert!(
                    c.prompt_tokens.is_some()
                        && c.reused_tokens.is_some()
                        && c.evaluated_tokens.is_some()
                        && c.prefill_ms.is_some(),
                    "{name} row {}",
                    row.id
                );
            } else {
                assert!(
                    row.lost_client.is_none() && row.lost_external.is_none(),
                    "{name} row {}",
                    row.id
                );
            }
        }
    }
}

#[test]
fn full_and_digest_recordings_of_the_same_traffic_agree() {
    for (full, digest) in [
        ("llmp/llama.cpp/session", "llmp/llama.cpp/session.digest"),
        ("xllamacpp/session", "xllamacpp/session.digest"),
    ] {
        let (a, b) = (report(full), report(digest));
        assert_eq!(a.rows.len(), b.rows.len(), "{full}");
        assert_eq!(a.tools, b.tools, "{full}");
        for (x, y) in a.rows.iter().zip(&b.rows) {
            assert_eq!(
                (x.id, x.kind, x.session, x.turn, x.conversation),
                (y.id, y.kind, y.session, y.turn, y.conversation),
                "{full}"
            );
            assert_eq!(
                (x.counts.prompt_tokens, x.counts.reused_tokens),
                (y.counts.prompt_tokens, y.counts.reused_tokens),
                "{full} row {}",
                x.id
            );
            assert_eq!(
                (x.prefix_tokens, x.break_cause, x.cause),
                (y.prefix_tokens, y.break_cause, y.cause),
                "{full} row {}",
                x.id
            );
            assert_eq!(x.composition, y.composition, "{full} row {}", x.id);
            assert_eq!(x.lost_external, y.lost_external, "{full} row {}", x.id);
            assert_eq!(
                x.lost_client.is_some(),
                y.lost_client.is_some(),
                "{full} row {}",
                x.id
            );
        }
    }
    let _ = rows_of;
    let _ = Path::new("");
}

#[test]
fn the_weekday_break_is_located_with_its_text_and_in_digest_mode_by_head_and_tail() {
    let full = report("llmp/llama.cpp/session");
    let row = full.rows.iter().find(|r| r.turn == Some(4)).unwrap();
    assert_eq!(row.break_cause, Some(BreakCause::SystemChanged));
    let at = row.break_location.as_ref().unwrap();
    assert_eq!((at.message, at.role.as_deref()), (Some(0), Some("system")));
    assert_eq!(at.before.as_deref(), Some("sentences. Today is Monday."));
    assert_eq!(at.after.as_deref(), Some("sentences. Today is Tuesday."));
    assert_eq!(at.char_offset, Some(1321));
    let digest = report("llmp/llama.cpp/session.digest");
    let at = digest
        .rows
        .iter()
        .find(|r| r.turn == Some(4))
        .unwrap()
        .break_location
        .clone()
        .unwrap();
    assert_eq!(
        (at.head_matched, at.tail_matched, at.before),
        (Some(true), Some(false), None)
    );
}

#[test]
fn every_eviction_names_the_request_that_most_likely_caused_it() {
    let r = report("llmp/llama.cpp/parallel-nocache");
    let client_of: BTreeMap<u64, &str> = r.rows.iter().map(|r| (r.id, r.client.as_str())).collect();
    let mut named = 0;
    for row in &r.rows {
        let expected = match row.cause {
            Some(prefixscope_core::analysis::Cause::OtherConversation) => "other_conversation",
            Some(prefixscope_core::analysis::Cause::SideCall) => "side_call",
            Some(prefixscope_core::analysis::Cause::OtherModel) => "other_model",
            _ => {
                assert!(row.evicted_by.is_none());
                continue;
            }
        };
        let by = row
            .evicted_by
            .as_ref()
            .unwrap_or_else(|| panic!("row {} names no evictor", row.id));
        assert_eq!(by.kind, expected);
        assert!(
            row.side_calls_between.contains(&by.row)
                || row.other_conversations_between.contains(&by.row)
                || row.other_domains_between.contains(&by.row)
        );
        assert_eq!(by.client, client_of[&by.row]);
        named += 1;
    }
    assert_eq!(named, 16);
}

/// The real llama.cpp session's first two turns, the server made to reuse 5 tokens of the
/// second (which continues the first exactly), and that prompt's tokens.
fn cold_second_turn() -> (Vec<Record>, u64) {
    let mut records = load("llmp/llama.cpp/session");
    records.truncate(2);
    let second = records[1].response.as_mut().unwrap().body.as_mut().unwrap();
    let prompt = second["usage"]["prompt_tokens"].as_u64().unwrap();
    second["timings"]["cache_n"] = serde_json::json!(5);
    second["timings"]["prompt_n"] = serde_json::json!(prompt - 5);
    second["usage"]["prompt_tokens_details"]["cached_tokens"] = serde_json::json!(5);
    (records, prompt)
}

/// Two turns: the second continues the first exactly, nothing runs in between, and the server
/// reports (almost) no reuse: the server's loss, never the client's.
#[test]
fn a_cold_server_on_an_unchanged_prefix_is_charged_to_the_server() {
    let (records, _) = cold_second_turn();
    let r = analyze(&records, &Config::default());
    let row = &r.rows[1];
    assert_eq!((row.break_cause, row.lost_client.as_ref()), (None, None));
    assert_eq!(
        row.lost_external.as_ref().map(|l| l.cause.as_str()),
        Some("server_empty")
    );
    assert!(
        r.summary()
            .contains("the server itself dropped cached prefixes on 1 turn"),
        "{}",
        r.summary()
    );
}

fn chat_record(id: u64, system: &str, turns: usize, reused: u64) -> Record {
    let mut messages = vec![serde_json::json!({"role": "system", "content": system})];
    for t in 0..turns {
        messages.push(serde_json::json!({"role": "user", "content": format!("question {t}")}));
        if t + 1 < turns {
            messages
                .push(serde_json::json!({"role": "assistant", "content": format!("answer {t}")}));
        }
    }
    let line = serde_json::json!({
        "v": 1, "id": id, "conn": 1, "t_start_ms": 1_000 * id, "t_first_byte_ms": 1_000 * id + 50, "t_end_ms": 1_000 * id + 90,
        "request": {"method": "POST", "path": "/v1/chat/completions", "headers": {"user-agent": "nonce-agent/1"}, "body_bytes": 1,
            "body": {"model": "m", "messages": messages}, "body_text": null, "digest": null},
        "response": {"status": 200, "headers": {}, "stream": null, "chunks": null, "bad_chunks": null, "body_bytes": 1, "truncated": false,
            "body": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                "timings": {"cache_n": reused, "prompt_n": 40 + 10 * turns as u64 - reused, "prompt_ms": 100.0, "predicted_n": 1, "predicted_ms": 5.0}},
            "body_text": null, "digest": null},
        "error": null, "tokens": null});
    serde_json::from_value(line).unwrap()
}

#[test]
fn a_nonce_in_the_system_prompt_is_named_with_an_example() {
    let records: Vec<Record> = (1..=5)
        .map(|i| {
            chat_record(
                i,
                &format!(
                    "x-billing-header: cc_version=1.0.{i}; nonce={}\nYou are a helpful agent.",
                    1000 + i * 37
                ),
                i as usize,
                3,
            )
        })
        .collect();
    let r = analyze(&records, &Config::default());
    let finding = r
        .findings
        .iter()
        .find(|f| f.kind == prefixscope_core::analysis::FindingKind::VolatileSystemPrompt)
        .expect("a volatile finding");
    assert_eq!(finding.client.as_deref(), Some("nonce-agent/1"));
    assert_eq!(finding.evidence["changed"], 4);
    assert_eq!(finding.evidence["char_offset"], 33);
    assert!(
        finding.evidence["before"]
            .as_str()
            .unwrap()
            .contains("nonce=1")
    );
    assert!(
        r.summary()
            .contains("system prompt changes at character 33 on 4 of 4 turns"),
        "{}",
        r.summary()
    );
}

/// Claude Code's turns: the `cache_control` marker sits on the newest user message, which on
/// the next turn comes back as a plain string with the same text.
fn claude_code_turn(id: u64, turns: usize, cached: u64, fresh: u64) -> Record {
    let mut messages = Vec::new();
    for t in 0..turns {
        let text = format!("question {t}: split this into smaller pieces.");
        if t + 1 == turns {
            messages.push(serde_json::json!({"role": "user", "content": [
                {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]}));
        } else {
            messages.push(serde_json::json!({"role": "user", "content": text}));
            messages.push(serde_json::json!({"role": "assistant", "content": [
                {"type": "text", "text": format!("answer {t}")}]}));
        }
    }
    let line = serde_json::json!({
        "v": 1, "id": id, "conn": 1, "t_start_ms": 1_000 * id, "t_first_byte_ms": 1_000 * id + 50, "t_end_ms": 1_000 * id + 90,
        "request": {"method": "POST", "path": "/v1/messages", "headers": {"user-agent": "claude-cli/2.1.197 (external, sdk-cli)"}, "body_bytes": 1,
            "body": {"model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}], "messages": messages},
            "body_text": null, "digest": null},
        "response": {"status": 200, "headers": {}, "stream": null, "chunks": null, "bad_chunks": null, "body_bytes": 1, "truncated": false,
            "body": {"type": "message", "role": "assistant", "content": [{"type": "text", "text": format!("answer {}", turns - 1)}],
                "usage": {"input_tokens": fresh, "cache_read_input_tokens": cached, "output_tokens": 3}},
            "body_text": null, "digest": null},
        "error": null, "tokens": null});
    serde_json::from_value(line).unwrap()
}

#[test]
fn a_moved_cache_control_marker_is_not_a_break() {
    let records: Vec<Record> = (1..=4)
        .map(|i| claude_code_turn(i, i as usize, 20 * (i - 1), 20))
        .collect();
    let mut digested = records.clone();
    for record in &mut digested {
        prefixscope_core::normalize::digest::apply_digest(record);
    }
    for (mode, records) in [("full", &records), ("digest", &digested)] {
        let r = analyze(records, &Config::default());
        let turns: Vec<&Row> = r.rows.iter().filter(|row| row.turn.is_some()).collect();
        assert_eq!(turns.len(), 4, "{mode}");
        assert!(
            r.rows.iter().all(|row| row.break_cause.is_none()),
            "{mode}: {:?}",
            r.rows
                .iter()
                .map(|row| (row.id, row.break_cause, row.break_location.clone()))
                .collect::<Vec<_>>()
        );
        let conversations: std::collections::BTreeSet<u32> =
            r.rows.iter().filter_map(|row| row.conversation).collect();
        assert_eq!(conversations.len(), 1, "{mode}: one conversation");
    }
}

#[test]
fn a_single_text_part_and_a_string_are_one_message() {
    // OpenAI's chat API takes either shape for the same text.
    let mut first = chat_record(1, "You are terse.", 1, 0);
    let mut second = chat_record(2, "You are terse.", 2, 40);
    first.request.body.as_mut().unwrap()["messages"][1]["content"] =
        serde_json::json!([{"type": "text", "text": "question 0"}]);
    // The second turn re-sends the first question as a plain string.
    assert_eq!(
        second.request.body.as_ref().unwrap()["messages"][1]["content"],
        "question 0"
    );
    second.request.body.as_mut().unwrap()["messages"][3]["content"] = serde_json::json!([{"type": "text", "text": "question 1", "cache_control": {"type": "ephemeral"}}]);
    let r = analyze(&[first, second], &Config::default());
    assert!(
        r.rows.iter().all(|row| row.break_cause.is_none()),
        "{:?}",
        r.rows
            .iter()
            .map(|row| (row.id, row.break_cause))
            .collect::<Vec<_>>()
    );
    assert_eq!(r.rows[1].linked_to, Some(1));
    assert_eq!(
        (
            r.rows[1].conversation,
            r.rows[1].turn,
            r.rows[1].new_conversation
        ),
        (r.rows[0].conversation, Some(2), false),
        "{:?}",
        r.rows[1]
    );
}

fn harness_report(name: &str) -> Report {
    let path = root().join("tests/data/harness").join(name);
    let read = read_jsonl(std::fs::read(&path).unwrap().as_slice());
    assert!(read.bad_lines.is_empty(), "{name}: {:?}", read.bad_lines);
    analyze(&read.records, &Config::default())
}

/// #19's Claude Code `--continue` rewrite, laid out by the server (`claude-code-continue`, see
/// tests/data/harness/README.md): after replies cut at `max_tokens` Claude Code asks again with
/// "Output token limit hit" notes; `--continue` drops the notes and re-sends the partial replies
/// as consecutive assistant messages. The server re-evaluated everything after the first reply;
/// the charge (a reorder: the replies moved) plus the new question equals it, to the token.
#[test]
fn claude_codes_continue_rewrite_is_charged_what_the_server_re_evaluated() {
    let r = harness_report("claude-code-continue.digest.jsonl");
    assert_eq!((r.coverage.turns, r.coverage.conversations), (9, 1));
    assert_eq!(r.coverage.connectivity_checks, 3);
    let rewrites: Vec<&Row> = r
        .rows
        .iter()
        .filter(|row| row.break_cause.is_some())
        .collect();
    assert_eq!(
        rewrites.iter().map(|row| row.id).collect::<Vec<_>>(),
        vec![7, 12]
    );
    let path = root().join("tests/data/harness/claude-code-continue.digest.jsonl");
    let records = read_jsonl(std::fs::read(&path).unwrap().as_slice()).records;
    for row in rewrites {
        assert_eq!(row.break_cause, Some(BreakCause::HistoryRewritten));
        let charged = row.lost_client.as_ref().unwrap();
        // --continue re-sends the replies without the resume notes between them: dropped.
        assert_eq!(charged.cause, "history_dropped");
        assert_eq!(
            row.composition.new_content.source,
            prefixscope_core::normalize::Source::Tokenizer
        );
        let record = records.iter().find(|x| x.id == row.id).unwrap();
        let digest = record.request.digest.as_ref().unwrap();
        let tokens = record.tokens.as_ref().unwrap();
        assert!(tokens.layout);
        let question = tokens.messages[&digest.messages.last().unwrap().hash];
        let evaluated = row.counts.evaluated_tokens.unwrap().value;
        eprintln!(
            "#{}: charged {} + new question {question} vs re-evaluated {evaluated}",
            row.id, charged.tokens
        );
        if row.id == 7 {
            // The first --continue: the question is all that is new.
            assert_eq!(charged.tokens + question, evaluated);
        }
        assert!(charged.tokens + question <= evaluated);
    }
}

/// The real harnesses' recordings (`tests/data/harness`, made by `tests/harness_e2e.rs` against
/// a real llama.cpp server): what the analysis says of each agrees with the server's counts.
#[test]
fn the_harness_recordings_agree_with_the_server() {
    // Claude Code: it moves its cache_control marker every turn; nothing broke (the server
    // re-evaluated 18 tokens per turn, the new message); the HEAD / checks are counted as such.
    let r = harness_report("claude-code.digest.jsonl");
    assert_eq!((r.coverage.turns, r.coverage.conversations), (3, 1));
    assert_eq!(r.coverage.connectivity_checks, 3);
    assert!(r.rows.iter().all(|row| row.break_cause.is_none()));
    assert_eq!(r.time.lost_tokens, 0);
    assert_eq!(r.clients[0].harness.as_deref(), Some("Claude Code 2.1.197"));

    // opencode: a title side-call, then one conversation that grows: nothing lost.
    let r = harness_report("opencode.jsonl");
    assert_eq!((r.coverage.turns, r.coverage.conversations), (3, 1));
    assert_eq!(
        r.rows[0].kind,
        prefixscope_core::analysis::RowKind::SideCall
    );
    assert!(r.rows.iter().all(|row| row.break_cause.is_none()));
    assert_eq!(r.time.lost_tokens, 0);
    assert_eq!(r.clients[0].harness.as_deref(), Some("opencode 1.18.33"));

    // aider with --restore-chat-history: the earlier exchange comes back before its "I have
    // added these files" message. The server re-evaluated everything from there; only the new
    // question (with the reminder aider appends) is new, the rest is the reorder's cost.
    let path = root().join("tests/data/harness/aider.jsonl");
    let records = read_jsonl(std::fs::read(&path).unwrap().as_slice()).records;
    let r = harness_report("aider.jsonl");
    assert_eq!(r.clients[0].harness.as_deref(), Some("aider"));
    assert_eq!((r.coverage.turns, r.coverage.conversations), (3, 1));
    for (row, record) in r.rows.iter().zip(&records).skip(1) {
        assert_eq!(
            row.break_cause,
            Some(BreakCause::HistoryRewritten),
            "{}",
            row.id
        );
        let charged = row.lost_client.as_ref().unwrap();
        assert_eq!(charged.cause, "history_reordered", "{}", row.id);
        // The new message's share of the prompt, by the same character weights.
        let chars = |m: &Value| m["content"].as_str().unwrap().chars().count() as f64;
        let messages = record.request.body.as_ref().unwrap()["messages"]
            .as_array()
            .unwrap();
        let total: f64 = messages.iter().map(chars).sum();
        let prompt = f64::from(row.counts.prompt_tokens.unwrap().value);
        let new = chars(messages.last().unwrap()) * prompt / total;
        let evaluated = f64::from(row.counts.evaluated_tokens.unwrap().value);
        assert!(
            (f64::from(charged.tokens) + new - evaluated).abs() <= 1.0,
            "row {}: charged {} + new {new:.1} vs re-evaluated {evaluated}",
            row.id,
            charged.tokens
        );
    }
    assert!(
        r.summary().contains("messages moved or inserted"),
        "{}",
        r.summary()
    );

    // Codex (the Responses API): one conversation that grows, nothing lost; in digest mode too
    // (the recorder digests Responses requests and keeps their counters).
    let path = root().join("tests/data/harness/codex.jsonl");
    let mut digested = read_jsonl(std::fs::read(&path).unwrap().as_slice()).records;
    for record in &mut digested {
        prefixscope_core::normalize::digest::apply_digest(record);
        assert!(record.request.body.is_none() && record.request.digest.is_some());
    }
    let from_digest = analyze(&digested, &Config::default());
    let r = harness_report("codex.jsonl");
    let shape = |r: &Report| {
        r.rows
            .iter()
            .map(|row| (row.conversation, row.turn, row.break_cause, row.counts))
            .collect::<Vec<_>>()
    };
    assert_eq!(shape(&from_digest), shape(&r));
    assert_eq!((r.coverage.turns, r.coverage.conversations), (3, 1));
    assert!(r.rows.iter().all(|row| row.break_cause.is_none()));
    assert_eq!(r.time.lost_tokens, 0);
    assert_eq!(r.clients[0].harness.as_deref(), Some("Codex 0.171.0"));
    for row in &r.rows[1..] {
        let c = &row.counts;
        assert!(c.reused_tokens.unwrap().value > 4_600, "{}", row.id);
        assert!(c.evaluated_tokens.unwrap().value < 20, "{}", row.id);
    }
}

/// The cache ceiling on the harnesses' recordings, against what the real llama.cpp reused. The
/// responses of its Anthropic and Responses APIs carry no `timings`; the model's `.gguf` path
/// names the server, hence 1-token blocks.
#[test]
fn the_harness_ceilings_bound_what_the_server_reused() {
    for (name, short_by) in [
        ("codex.jsonl", 0),
        ("opencode.jsonl", 0),
        // The restored history's cut positions come from character weights: a few tokens off
        // per turn without the server's tokenizer.
        ("aider.jsonl", 9),
        // Digest mode keeps no reply, so the replies the server cached are not in the ceiling.
        ("claude-code.digest.jsonl", 18),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_prefixscope"))
            .args(["profile", "--warmup", "0", "--json"])
            .arg(root().join("tests/data/harness").join(name))
            .output()
            .unwrap();
        assert!(output.status.success(), "{name}");
        let profile: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(profile["block_size"], 1, "{name}");
        let observed = &profile["server_observed"];
        let ceiling = observed["ceiling_hit_tokens"].as_i64().unwrap();
        let reused = observed["server_reused_tokens"].as_i64().unwrap();
        assert!(
            ceiling >= reused - short_by,
            "{name}: ceiling {ceiling} < server {reused} - {short_by}"
        );
    }
}

fn named_causes(name: &str) -> (Report, String) {
    let path = root().join("tests/data/named-causes").join(name);
    let read = read_jsonl(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    assert!(read.bad_lines.is_empty());
    let report = analyze(&read.records, &Config::default());
    let summary = report.summary();
    (report, summary)
}

/// Claude Code's attribution line (`cch=` changes on every request) is named as its own cause
/// beside llmp's `system_changed`, with the fix in the finding, in JSON and in the text.
#[test]
fn claude_codes_attribution_header_is_named_with_its_fix() {
    let (report, summary) = named_causes("claude-code-attribution.jsonl");
    let broken: Vec<&Row> = report.rows.iter().filter(|r| r.turn > Some(1)).collect();
    assert_eq!(broken.len(), 3);
    for row in &broken {
        assert_eq!(
            row.break_cause,
            Some(BreakCause::SystemChanged),
            "llmp's cause stays"
        );
        assert_eq!(row.client_cause.as_deref(), Some("attribution_header"));
    }
    let json = serde_json::to_value(&report).unwrap();
    let finding = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["evidence"]["client_cause"] == "attribution_header")
        .expect("a finding naming the attribution header");
    assert_eq!(finding["fix"]["owner"], "client");
    assert!(
        finding["fix"]["change"]
            .as_str()
            .unwrap()
            .contains("CLAUDE_CODE_ATTRIBUTION_HEADER=0")
    );
    assert_eq!(json["rows"][1]["client_cause"], "attribution_header");
    assert!(
        summary.contains("fix (client): Claude Code's attribution header (x-anthropic-billing-header … cch=) changes on every request: set CLAUDE_CODE_ATTRIBUTION_HEADER=0"),
        "{summary}"
    );
}

/// The same tools in another order are `tools_reordered`, apart from tools added or removed,
/// and the fix says to keep their order.
#[test]
fn reordered_tools_are_named_apart_from_added_ones() {
    let (report, summary) = named_causes("tools-reordered.jsonl");
    let third = report.rows.iter().find(|r| r.id == 3).unwrap();
    assert_eq!(third.break_cause, Some(BreakCause::ToolsChanged));
    assert_eq!(third.client_cause.as_deref(), Some("tools_reordered"));
    assert!(third.lost_client.as_ref().is_some_and(|l| l.tokens > 1_000));
    let location = third.break_location.as_ref().unwrap();
    assert!(location.tools_added.is_empty() && location.tools_removed.is_empty());
    assert!(
        report
            .rows
            .iter()
            .filter(|r| r.id != 3)
            .all(|r| r.client_cause.is_none())
    );
    assert!(
        summary.contains("fix (client): the same tools came in another order"),
        "{summary}"
    );
}

/// A client that sends earlier replies back without their `reasoning_content`: llmp's
/// message identities match (they leave reasoning out), the server re-evaluates nearly all of
/// it; llmp calls that `server_empty`, and it stays so in `time.by_cause`, but prefixscope names
/// it the client's (`client_cause` `reasoning_changed`, its own finding and fix), with no
/// engine cause guessed.
#[test]
fn reasoning_sent_back_changed_is_the_clients_not_the_servers() {
    let (report, summary) = named_causes("reasoning-dropped.jsonl");
    let third = report.rows.iter().find(|r| r.id == 3).unwrap();
    assert_eq!(third.break_cause, None, "llmp sees no break");
    assert_eq!(
        third.lost_external.as_ref().map(|l| l.cause.as_str()),
        Some("server_empty"),
        "llmp's cause stays"
    );
    assert_eq!(third.client_cause.as_deref(), Some("reasoning_changed"));
    assert_eq!(third.engine_cause, None);
    assert!(report.time.by_cause.contains_key("server_empty"));
    assert!(
        !report
            .findings
            .iter()
            .any(|f| f.kind == prefixscope_core::analysis::FindingKind::ServerCacheLoss)
    );
    let finding = report
        .findings
        .iter()
        .find(|f| f.kind == prefixscope_core::analysis::FindingKind::ReasoningChanged)
        .expect("its own finding");
    assert_eq!(finding.rows, vec![3]);
    // The turn before's prompt as the server counted it (260) less the 40 reused: llmp's
    // weights charge 274, more than that prompt held.
    assert_eq!(finding.lost_tokens, Some(220));
    assert!(
        summary.contains(
            "the client sent earlier replies' reasoning back changed on 1 turn: 440 ms (220 tokens)"
        ),
        "{summary}"
    );
    assert!(!summary.contains("the server itself"), "{summary}");
    assert!(
        summary.contains("fix (client): earlier replies' reasoning was dropped"),
        "{summary}"
    );
}

/// Issue #14: what the server's own probes saw between two turns explains its loss: found
/// down (a restart), or the prompt filling the slot's context (`/slots` `n_ctx`); without such
/// a probe the cause stays the one from the model's name (Gemma: a sliding window). The batch
/// engine, the reference and an engine fed in another order (the probe last) agree.
#[test]
fn the_servers_probes_explain_its_own_losses() {
    use prefixscope_core::analysis::Analyzer;
    use prefixscope_core::analysis::EngineKind;
    use prefixscope_core::capture::{BodyMode, build_record};
    use prefixscope_core::probe::{Answer, Reading, Slot, Slots, probe_capture};
    let (records, prompt) = cold_second_turn();
    let between = (records[0].t_end_ms + records[1].t_start_ms) / 2;
    let probe = |path: &str, answer: Answer| {
        build_record(
            probe_capture::<Vec<u8>>(1 << 48, (between - 5, between), path, Some(200), &answer),
            BodyMode::Full,
        )
    };
    let down = probe("/health", Answer::Unreachable("no connection".into()));
    let full = probe(
        "/slots",
        Answer::Read(Reading::Slots(Slots {
            slots: vec![Slot {
                id: 0,
                id_task: Some(7),
                is_processing: false,
                n_ctx: Some(prompt),
            }],
        })),
    );
    let engine_of = |records: &[Record]| -> Vec<Option<EngineKind>> {
        let batch = analyze(records, &Config::default());
        let reference = prefixscope_core::analysis::analyze_reference(records, &Config::default());
        let mut live = Analyzer::new(Config::default());
        let mut completion_order: Vec<&Record> = records.iter().collect();
        completion_order.sort_by_key(|r| std::cmp::Reverse(r.probe));
        completion_order.reverse();
        for record in completion_order {
            live.push(record);
        }
        let live = live.report();
        let kinds = |r: &Report| -> Vec<Option<EngineKind>> {
            r.rows
                .iter()
                .map(|row| row.engine_cause.as_ref().map(|e| e.kind))
                .collect()
        };
        assert_eq!(kinds(&batch), kinds(&reference));
        assert_eq!(batch.rows, live.rows, "the probe last, the same rows");
        kinds(&batch)
    };
    assert_eq!(
        engine_of(&records),
        vec![None, Some(EngineKind::SlidingWindow)]
    );
    let mut with_down = records.clone();
    with_down.push(down);
    assert_eq!(engine_of(&with_down), vec![None, Some(EngineKind::Restart)]);
    let mut with_full = records.clone();
    with_full.push(full);
    assert_eq!(
        engine_of(&with_full),
        vec![None, Some(EngineKind::ContextShift)]
    );
    let report = analyze(&with_full, &Config::default());
    let evidence = &report.rows[1].engine_cause.as_ref().unwrap().evidence;
    assert!(
        evidence.contains(&format!("fills the slot's context ({prompt}")),
        "{evidence}"
    );
    assert!(
        report.summary().contains("likely context full on 1"),
        "{}",
        report.summary()
    );
}

/// Issue #14: an earlier turn the chat template renders anew (the server's own layout counts
/// the same message with other tokens once it is no longer the last) is the cause llmp cannot
/// see: `template_rerendered`, its own line, finding and fix, and no engine cause guessed.
#[test]
fn an_earlier_turn_rendered_anew_is_named_from_the_servers_layout() {
    use prefixscope_core::normalize::digest::message_digest;
    use prefixscope_core::record::TokenCounts;
    let system = serde_json::json!({"role": "system", "content": "You are a careful assistant. ".repeat(12)});
    let turn = |n: usize| serde_json::json!({"role": "user", "content": format!("question {n}")});
    let reply =
        |n: usize| serde_json::json!({"role": "assistant", "content": format!("answer {n}")});
    let histories = [
        vec![system.clone(), turn(1)],
        vec![system.clone(), turn(1), reply(1), turn(2)],
        vec![
            system.clone(),
            turn(1),
            reply(1),
            turn(2),
            reply(2),
            turn(3),
        ],
    ];
    // The first reply weighs 30 tokens while it is the last assistant turn, 22 after (its
    // reasoning dropped by the template); everything else keeps its count.
    let weights = [
        vec![100, 10],
        vec![100, 10, 30, 10],
        vec![100, 10, 22, 30, 10],
    ];
    let reused = [0u32, 149, 110];
    let records: Vec<Record> = histories
        .iter()
        .zip(&weights)
        .zip(reused)
        .enumerate()
        .map(|(i, ((messages, weights), reused))| {
            let id = i as u64 + 1;
            let prompt: u32 = weights.iter().sum::<u32>() + 1;
            let tokens = TokenCounts {
                messages: messages
                    .iter()
                    .zip(weights)
                    .map(|(m, w)| (message_digest(m).hash, *w))
                    .collect(),
                tools: Default::default(),
                layout: true,
                lead: None,
            };
            let line = serde_json::json!({
                "v": 1, "id": id, "conn": 1, "t_start_ms": 10_000 * id, "t_first_byte_ms": 10_000 * id + 50, "t_end_ms": 10_000 * id + 900,
                "request": {"method": "POST", "path": "/v1/chat/completions", "headers": {"user-agent": "agent/1"}, "body_bytes": 1,
                    "body": {"model": "qwen3", "messages": messages}, "body_text": null, "digest": null},
                "response": {"status": 200, "headers": {}, "stream": null, "chunks": null, "bad_chunks": null, "body_bytes": 1, "truncated": false,
                    "body": {"model": "/models/Qwen3-8B-Q4_K_M.gguf", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                        "timings": {"cache_n": reused, "prompt_n": prompt - reused, "prompt_ms": f64::from(prompt - reused) * 2.0, "predicted_n": 1, "predicted_ms": 5.0}},
                    "body_text": null, "digest": null},
                "error": null, "tokens": tokens});
            serde_json::from_value(line).unwrap()
        })
        .collect();
    let report = analyze(&records, &Config::default());
    let third = &report.rows[2];
    assert_eq!(third.break_cause, None, "llmp sees no break");
    assert_eq!(third.client_cause.as_deref(), Some("template_rerendered"));
    assert_eq!(third.engine_cause, None);
    assert!(report.rows[1].client_cause.is_none());
    let finding = report
        .findings
        .iter()
        .find(|f| f.kind == prefixscope_core::analysis::FindingKind::TemplateRerendered)
        .expect("its own finding");
    assert_eq!(finding.rows, vec![3]);
    assert_eq!(finding.fix.as_ref().unwrap().owner, "setup");
    let summary = report.summary();
    assert!(
        summary.contains("the chat template rendered earlier turns anew on 1 turn"),
        "{summary}"
    );
    assert!(!summary.contains("the server itself"), "{summary}");
}

/// Issue #14, the model's architecture from `/props`: a loss the response's model name
/// (an alias) leaves unexplained is named the sliding window's when the server's `/props`
/// names a Gemma file, or says the window itself; the batch, reference and live engines agree.
#[test]
fn the_model_props_names_explains_what_an_alias_hid() {
    use prefixscope_core::analysis::EngineKind;
    use prefixscope_core::capture::{BodyMode, build_record};
    use prefixscope_core::probe::{Answer, Props, Reading, probe_capture};
    let (mut records, _) = cold_second_turn();
    for record in &mut records {
        let body = record.response.as_mut().unwrap().body.as_mut().unwrap();
        body["model"] = serde_json::json!("gpt-4o-mini");
    }
    let before = records[0].t_start_ms - 10;
    let props = |props: Props| {
        build_record(
            probe_capture::<Vec<u8>>(
                1 << 48,
                (before - 5, before),
                "/props",
                Some(200),
                &Answer::Read(Reading::Props(props)),
            ),
            BodyMode::Full,
        )
    };
    let kind = |records: &[Record]| {
        let batch = analyze(records, &Config::default());
        let reference = prefixscope_core::analysis::analyze_reference(records, &Config::default());
        let mut live = prefixscope_core::analysis::Analyzer::new(Config::default());
        for record in records {
            live.push(record);
        }
        assert_eq!(batch.rows, live.report().rows);
        assert_eq!(batch.rows[1].engine_cause, reference.rows[1].engine_cause);
        batch.rows[1].engine_cause.clone().unwrap()
    };
    assert_eq!(kind(&records).kind, EngineKind::Unexplained);
    let mut named = records.clone();
    named.push(props(Props {
        model: Some("/models/gemma-3-4b-it-Q4_K_M.gguf".into()),
        ..Props::default()
    }));
    let cause = kind(&named);
    assert_eq!(cause.kind, EngineKind::SlidingWindow);
    assert!(
        cause.evidence.contains(
            "from the model the server's /props names, /models/gemma-3-4b-it-Q4_K_M.gguf"
        ),
        "{}",
        cause.evidence
    );
    let mut windowed = records.clone();
    windowed.push(props(Props {
        model: Some("/models/custom.gguf".into()),
        sliding_window: Some(1024),
        ..Props::default()
    }));
    let cause = kind(&windowed);
    assert_eq!(cause.kind, EngineKind::SlidingWindow);
    assert!(
        cause.evidence.contains("1024-token sliding window"),
        "{}",
        cause.evidence
    );
}

/// Issue #14, `/slots` task ids: llama-server numbers its tasks from 0 at each start, so a
/// task id lower between two turns than before them means the server restarted, though every
/// probe answered: the loss is `restart`, with the ids as evidence.
#[test]
fn task_ids_going_back_in_slots_are_a_restart() {
    use prefixscope_core::analysis::EngineKind;
    use prefixscope_core::capture::{BodyMode, build_record};
    use prefixscope_core::probe::{Answer, Reading, Slot, Slots, probe_capture};
    let (records, _) = cold_second_turn();
    let slots_at = |id: u64, at: i64, task: u64| {
        build_record(
            probe_capture::<Vec<u8>>(
                id,
                (at - 5, at),
                "/slots",
                Some(200),
                &Answer::Read(Reading::Slots(Slots {
                    slots: vec![Slot {
                        id: 0,
                        id_task: Some(task),
                        is_processing: false,
                        n_ctx: Some(100_000),
                    }],
                })),
            ),
            BodyMode::Full,
        )
    };
    let between = (records[0].t_end_ms + records[1].t_start_ms) / 2;
    let kind_with = |tasks: [u64; 2]| {
        let mut all = records.clone();
        all.push(slots_at(1 << 48, records[0].t_start_ms - 1_000, tasks[0]));
        all.push(slots_at((1 << 48) + 1, between, tasks[1]));
        let report = analyze(&all, &Config::default());
        let live = {
            let mut live = prefixscope_core::analysis::Analyzer::new(Config::default());
            for record in all.iter().rev() {
                live.push(record);
            }
            live.report()
        };
        assert_eq!(report.rows, live.rows);
        report.rows[1].engine_cause.clone().unwrap()
    };
    let restarted = kind_with([41, 2]);
    assert_eq!(restarted.kind, EngineKind::Restart);
    assert!(
        restarted.evidence.contains("went back from 41 to 2"),
        "{}",
        restarted.evidence
    );
    // Counting on: the name's guess stands (the session's model is a Gemma).
    assert_eq!(kind_with([41, 57]).kind, EngineKind::SlidingWindow);
}

/// A request that names no model (llama-server serves its one model whatever is asked): the
/// findings say so instead of an empty "()" (seen by eye on a real llama.cpp, session 9).
#[test]
fn findings_on_requests_that_name_no_model_say_so() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/llama-no-model/system-date-change.jsonl");
    let read = prefixscope_core::record::read_jsonl(std::io::BufReader::new(
        std::fs::File::open(path).unwrap(),
    ));
    let report = prefixscope_core::analysis::analyze(&read.records, &Default::default());
    assert_eq!(report.time.lost_tokens, 111);
    let summary = report.summary();
    assert!(summary.contains("links (no model named)"), "{summary}");
    assert!(!summary.contains("()"), "{summary}");
    assert!(!summary.contains("model ,"), "{summary}");
}

/// A turn whose slot another conversation took before it came, and which also rewrote its
/// history: the loss is the eviction's, whole; the break is on the row, costing nothing.
#[test]
fn a_break_on_a_turn_whose_slot_was_taken_costs_nothing() {
    let system = "You are agent A. ".repeat(40);
    let first = chat_record(1, &system, 2, 0);
    let mut other = chat_record(2, "You are B, a reviewer with rules of its own.", 1, 0);
    other.request.body.as_mut().unwrap()["messages"][1]["content"] =
        serde_json::json!("review the change");
    let mut second = chat_record(3, &system, 3, 0);
    second.request.body.as_mut().unwrap()["messages"][2]["content"] =
        serde_json::json!("a rewritten answer");
    let r = analyze(&[first, other, second], &Config::default());
    let row = &r.rows[2];
    assert_eq!(row.linked_to, Some(1));
    assert_eq!(row.break_cause, Some(BreakCause::HistoryRewritten));
    assert_eq!(
        row.cause,
        Some(prefixscope_core::analysis::Cause::OtherConversation)
    );
    assert_eq!(row.lost_client, None);
    let lost = row.lost_external.as_ref().unwrap();
    assert_eq!(lost.cause, "other_conversation");
    assert_eq!(r.time.lost_tokens, u64::from(lost.tokens));
}

/// An Anthropic request's `system` is not one of its `messages`: a break there has no message
/// index (its role says `system`), and a break in the messages counts as the request does,
/// from its first message, not from the system prompt the chat form puts first.
#[test]
fn anthropic_break_locations_count_the_requests_own_messages() {
    let path = root().join("tests/data/named-causes/claude-code-attribution.jsonl");
    let read = read_jsonl(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let report = analyze(&read.records, &Config::default());
    let at = report.rows[1].break_location.as_ref().unwrap();
    assert_eq!((at.message, at.role.as_deref()), (None, Some("system")));
    // The third request with the second's system prompt and its third message (the second
    // user message, `messages[2]`) edited.
    let mut records = read.records.clone();
    let system = records[1].request.body.as_ref().unwrap()["system"].clone();
    let third = records[2].request.body.as_mut().unwrap();
    third["system"] = system;
    third["messages"][2]["content"][0]["text"] = serde_json::json!("Make it faster instead.");
    let report = analyze(&records[..3], &Config::default());
    let row = &report.rows[2];
    assert_eq!(row.break_cause, Some(BreakCause::HistoryRewritten));
    let at = row.break_location.as_ref().unwrap();
    assert_eq!((at.message, at.role.as_deref()), (Some(2), Some("user")));
}

/// Two agents open with the same user message under their own system prompts; the first
/// one's next turn goes on from its own request, not from the other agent's later one (seen on
/// real traffic: two tests of one suite running at once).
#[test]
fn a_turn_goes_on_from_the_request_with_its_own_system_prompt() {
    let question = |id: u64, system: &str, turns: usize| {
        let mut r = chat_record(id, system, turns, 0);
        r.request.body.as_mut().unwrap()["messages"][1]["content"] =
            serde_json::json!("What is 2 + 2?");
        r
    };
    let first = question(1, "You are agent A, a careful calculator.", 1);
    let other = question(2, "You are agent B, who answers in French.", 1);
    let second = question(3, "You are agent A, a careful calculator.", 2);
    let report = analyze(&[first, other, second], &Config::default());
    let row = &report.rows[2];
    assert_eq!(row.linked_to, Some(1));
    assert_eq!(row.break_cause, None);
    assert_eq!(row.conversation, report.rows[0].conversation);
}
