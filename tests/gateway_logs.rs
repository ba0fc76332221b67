//! Issue #15: a gateway log is a recording without a proxy. Each row of the real pydantic-ai
//! log (`tests/data/gateway-logs`, MIT) becomes the record the proxy would have written, so the
//! analysis (conversations inferred from the prompts, tool loops kept together), `profile`'s
//! same/other split, the exports' conversations, `analyze` and `replay --headless` run on it
//! exactly as on a recording.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use prefixscope_core::analysis::{Config, analyze};
use prefixscope_core::input::{self, Format, InputOptions, LogRecords, gateway_log_records};

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");

fn log_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gateway-logs/pydantic-ai-cassettes.csv.gz")
}

fn log_records() -> LogRecords {
    let reader = input::open_decompressed(&log_path()).unwrap();
    gateway_log_records(reader, "pydantic-ai", None)
}

#[test]
fn the_log_is_analysed_as_a_recording_with_its_tool_loops_kept_together() {
    let log = log_records();
    assert_eq!(
        log.records.len(),
        515,
        "every row that parses, non-2xx included"
    );
    assert!(log.report.bad_rows.is_empty(), "{:?}", log.report.bad_rows);
    assert!(!log.timed, "the cassettes keep no times: file order");
    let report = analyze(&log.records, &Config::default());
    let mut turns: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for row in &report.rows {
        if let Some(c) = row.conversation {
            turns.entry(c).or_default().push(row.id);
        }
    }
    let multi = turns.values().filter(|t| t.len() > 1).count();
    eprintln!(
        "{} conversations, {multi} with more than one turn, the longest {} turns",
        turns.len(),
        turns.values().map(Vec::len).max().unwrap()
    );
    assert!(multi >= 50, "{multi}");
    // A tool loop: a turn that sends a tool's result back is in the conversation of the turn
    // that asked for the call (its previous request, whose history it extends).
    let by_id: BTreeMap<u64, &prefixscope_core::record::Record> =
        log.records.iter().map(|r| (r.id, r)).collect();
    let sends_tool_result = |id: u64| {
        by_id[&id]
            .request
            .body
            .as_ref()
            .and_then(|b| b["messages"].as_array())
            .is_some_and(|m| m.last().is_some_and(|last| last["role"] == "tool"))
    };
    let loops: Vec<&Vec<u64>> = turns
        .values()
        .filter(|t| t.iter().skip(1).any(|&id| sends_tool_result(id)))
        .collect();
    assert!(loops.len() >= 20, "{} tool loops", loops.len());
    let tool_turns = report
        .rows
        .iter()
        .filter(|r| sends_tool_result(r.id))
        .count();
    let in_a_conversation = report
        .rows
        .iter()
        .filter(|r| sends_tool_result(r.id) && r.conversation.is_some() && r.linked_to.is_some())
        .count();
    eprintln!(
        "{in_a_conversation} of {tool_turns} turns sending a tool result continue their conversation"
    );
    assert!(in_a_conversation * 10 >= tool_turns * 9);
}

#[test]
fn profile_splits_the_logs_reuse_by_the_analysis_conversations() {
    let reader = input::open_decompressed(&log_path()).unwrap();
    let file = input::read(reader, "pydantic-ai", Format::Csv, &InputOptions::default());
    assert_eq!(file.report.conversation_source, "analysis");
    assert_eq!(file.report.requests, 498);
    assert_eq!(file.report.non_2xx, 17);
    let output = Command::new(BIN)
        .args(["profile", "--json"])
        .arg(log_path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let ceiling = &json["ceiling"];
    let (same, other) = (
        ceiling["same_conversation_tokens"].as_u64().unwrap(),
        ceiling["other_tokens"].as_u64().unwrap(),
    );
    eprintln!("ceiling: same conversation {same}, other {other} tokens");
    // The log is a test suite: hundreds of tests open with the same system prompts, tools and
    // first messages, one run each. Its reuse is mostly across runs (other conversations, 38,484
    // tokens), and within a run (16,480) only where a test went on: no run is taken for
    // another's continuation (`tests/hosted.rs`).
    assert!(same > 0 && other > same, "same {same}, other {other}");
}

#[test]
fn the_exports_conversations_are_the_analysis_conversations() {
    let log = log_records();
    let report = analyze(&log.records, &Config::default());
    let conversations: BTreeSet<u32> = report.rows.iter().filter_map(|r| r.conversation).collect();
    let alone = report
        .rows
        .iter()
        .filter(|r| r.conversation.is_none())
        .count();
    let dir = std::env::temp_dir().join(format!("prefixscope-gateway-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("pydantic.bailian.jsonl");
    let _ = std::fs::remove_file(&out);
    let status = Command::new(BIN)
        .args(["export", "--to", "bailian", "--salt-file"])
        .arg(dir.join("salt"))
        .arg("-o")
        .arg(&out)
        .arg(log_path())
        .status()
        .unwrap();
    assert!(status.success());
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 498);
    let roots = rows.iter().filter(|r| r["parent_chat_id"] == -1).count();
    eprintln!(
        "export: {roots} conversations; analysis: {} conversations and {alone} requests of none",
        conversations.len()
    );
    assert_eq!(roots, conversations.len() + alone);
}

#[test]
fn analyze_and_the_headless_replay_of_a_log_say_the_same() {
    let analyze_text = Command::new(BIN)
        .arg("analyze")
        .arg(log_path())
        .output()
        .unwrap();
    assert!(analyze_text.status.success());
    let stderr = String::from_utf8_lossy(&analyze_text.stderr);
    assert!(
        stderr.contains("a gateway log without timestamps: its rows in file order"),
        "{stderr}"
    );
    let summary = String::from_utf8_lossy(&analyze_text.stdout).to_string();
    assert!(
        summary.contains("472 turns in 301 conversations"),
        "{summary}"
    );
    let replay = Command::new(BIN)
        .args(["replay", "--headless"])
        .arg(log_path())
        .output()
        .unwrap();
    assert!(replay.status.success());
    let replayed = String::from_utf8_lossy(&replay.stdout);
    // The engine's summary after the records is analyze's, line for line, to the findings.
    let head: Vec<&str> = summary
        .lines()
        .take_while(|l| !l.starts_with("findings"))
        .collect();
    for line in &head {
        assert!(replayed.contains(line), "{line}\n{replayed}");
    }
    assert!(
        String::from_utf8_lossy(&replay.stderr)
            .contains("no timestamps: its rows replay in file order")
    );
}

/// The same log as JSON Lines (one object per exchange, the CSV's column names as keys, the
/// bodies as objects): the same records, and `analyze` says the same.
#[test]
fn a_json_lines_log_reads_as_its_csv_does() {
    let csv = log_records();
    let reader = input::open_decompressed(&log_path()).unwrap();
    let mut rows = csv::Reader::from_reader(reader);
    let headers = rows.headers().unwrap().clone();
    let mut jsonl = String::new();
    for row in rows.records() {
        let row = row.unwrap();
        let mut object = serde_json::Map::new();
        for (name, value) in headers.iter().zip(row.iter()) {
            let value = match name {
                "request_json" | "response_json" => {
                    serde_json::from_str(value).unwrap_or(serde_json::Value::Null)
                }
                _ => serde_json::Value::String(value.to_string()),
            };
            object.insert(name.to_string(), value);
        }
        jsonl.push_str(&serde_json::Value::Object(object).to_string());
        jsonl.push('\n');
    }
    let mut head = jsonl.as_bytes();
    assert_eq!(input::detect(&mut head).unwrap(), Some(Format::Csv));
    let json = gateway_log_records(jsonl.as_bytes(), "pydantic-ai.jsonl", None);
    assert_eq!(json.records.len(), csv.records.len());
    assert!(
        json.report.bad_rows.is_empty(),
        "{:?}",
        json.report.bad_rows
    );
    assert_eq!(json.records, csv.records);
    let dir =
        std::env::temp_dir().join(format!("prefixscope-gateway-jsonl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pydantic.jsonl");
    std::fs::write(&path, &jsonl).unwrap();
    let text = |path: &Path| {
        let output = Command::new(BIN).arg("analyze").arg(path).output().unwrap();
        assert!(output.status.success());
        String::from_utf8_lossy(&output.stdout).to_string()
    };
    assert_eq!(text(&path), text(&log_path()));
}
