//! Exports from the real recordings and the Mooncake trace: golden files with a fixed salt
//! (`PREFIXSCOPE_UPDATE_GOLDEN=1` rewrites them; say why in the commit), the rules each consumer
//! enforces, no text or names in the anonymized formats, the same hit rates after a round trip,
//! subagents from generated agent traffic, and the command line (exit codes, the salt file).
//! Loading and replaying the exports with the real consumers: `tests/export_interop.rs`.

use std::collections::{BTreeSet, HashSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use prefixscope_core::cache::{Capacity, Policy, ProfileConfig, Request, profile};
use prefixscope_core::export::{self, ExportError, Inputs, Options, Salt, Summary, Target};
use prefixscope_core::input::{self, Format, InputOptions};
use prefixscope_core::record::{read_jsonl, write_jsonl};
use serde_json::{Value, json};
use workload::{WorkloadConfig, generate};

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");
const SALT: &str = "prefixscope golden export salt";
/// Recordings with golden exports (digest recordings have no OTel export).
const RECORDINGS: [&str; 4] = [
    "llmp/llama.cpp/parallel-nocache",
    "llmp/llama.cpp/session",
    "llmp/llama.cpp/session.digest",
    "xllamacpp/session",
];
const TRACE_ROWS: usize = 500;
const ID_LIMIT: u64 = 1 << 53;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn recording(name: &str) -> PathBuf {
    root().join("recordings").join(format!("{name}.jsonl"))
}

fn salt() -> Salt {
    Salt::from_text(SALT).expect("a non-empty salt")
}

/// Inputs held in memory.
struct Memory(Vec<(String, Vec<u8>)>);

impl Inputs for Memory {
    fn count(&self) -> usize {
        self.0.len()
    }
    fn name(&self, index: usize) -> String {
        self.0[index].0.clone()
    }
    fn open(&self, index: usize) -> std::io::Result<Box<dyn BufRead + '_>> {
        input::decompressed(self.0[index].1.as_slice())
    }
}

fn file(path: &Path) -> Memory {
    let bytes = std::fs::read(path).expect("the input reads");
    Memory(vec![(path.display().to_string(), bytes)])
}

/// The first `rows` lines of the Mooncake conversation trace.
fn mooncake_head(rows: usize) -> Vec<u8> {
    let gz = std::fs::File::open(root().join("tests/data/mooncake/conversation_trace.jsonl.gz"))
        .expect("the trace opens");
    let reader = input::decompressed(BufReader::new(gz)).expect("the trace reads");
    let mut out = Vec::new();
    for line in reader.lines().take(rows) {
        out.extend_from_slice(line.expect("a line").as_bytes());
        out.push(b'\n');
    }
    out
}

fn options(target: Target) -> Options {
    Options {
        target,
        block_size: target.default_block_size().unwrap_or(16),
        salt: salt(),
        tools_position: None,
        ts_column: None,
    }
}

fn run_export(
    inputs: &dyn Inputs,
    format: Format,
    options: &Options,
) -> Result<(String, Summary), ExportError> {
    let mut out = Vec::new();
    let summary = export::export(inputs, format, options, &mut out)?;
    Ok((String::from_utf8(out).expect("UTF-8"), summary))
}

fn exported(inputs: &dyn Inputs, format: Format, target: Target) -> (String, Summary) {
    run_export(inputs, format, &options(target)).expect("the export runs")
}

fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

/// Every golden export: (golden file name, text).
fn all_exports() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for name in RECORDINGS {
        let inputs = file(&recording(name));
        for target in Target::ALL {
            if target == Target::Otel && name.ends_with(".digest") {
                continue;
            }
            let (text, _) = exported(&inputs, Format::Recording, target);
            out.push((
                format!("{}.{}.jsonl", name.replace('/', "--"), target.as_str()),
                text,
            ));
        }
    }
    let trace = Memory(vec![(
        "conversation_trace".into(),
        mooncake_head(TRACE_ROWS),
    )]);
    let (text, _) = exported(&trace, Format::Mooncake, Target::Mooncake);
    out.push((
        format!("mooncake--conversation_trace-{TRACE_ROWS}.mooncake.jsonl"),
        text,
    ));
    out
}

#[test]
fn golden_exports() {
    let update = std::env::var_os("PREFIXSCOPE_UPDATE_GOLDEN").is_some();
    let dir = root().join("tests/golden/export");
    let mut stale = Vec::new();
    for (name, text) in all_exports() {
        let golden = dir.join(&name);
        if update {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&golden, &text).unwrap();
        } else if std::fs::read_to_string(&golden).unwrap_or_default() != text {
            stale.push(golden.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "exports differ from {stale:?}; if intended, rerun with PREFIXSCOPE_UPDATE_GOLDEN=1 and say why in the commit"
    );
}

fn ids(row: &Value, key: &str) -> Vec<u64> {
    row[key]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

fn keys(row: &Value) -> BTreeSet<&str> {
    row.as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default()
}

/// Rows whose last block is partial: no id of a partial block stands for a full block anywhere.
fn assert_partial_ids_apart(rows: &[Value], length: &str, block_size: u64) {
    let mut full = HashSet::new();
    let mut partial = HashSet::new();
    for row in rows {
        let ids = ids(row, "hash_ids");
        let input = row[length].as_u64().unwrap_or(0);
        for (i, id) in ids.iter().enumerate() {
            if i + 1 == ids.len() && input % block_size != 0 {
                partial.insert(*id);
            } else {
                full.insert(*id);
            }
        }
    }
    assert!(partial.is_disjoint(&full));
}

#[test]
fn every_export_keeps_its_consumers_rules() {
    for (name, text) in all_exports() {
        let rows = lines(&text);
        assert!(!rows.is_empty(), "{name}");
        if name.ends_with(".mooncake.jsonl") {
            for row in &rows {
                assert_eq!(
                    keys(row),
                    BTreeSet::from(["hash_ids", "input_length", "output_length", "timestamp"])
                );
                let input = row["input_length"].as_u64().unwrap_or(0);
                assert_eq!(
                    ids(row, "hash_ids").len() as u64,
                    input.div_ceil(512),
                    "{name}"
                );
                assert!(row["output_length"].as_u64().unwrap_or(0) >= 1);
                assert!(ids(row, "hash_ids").iter().all(|&id| id < ID_LIMIT));
            }
            assert_partial_ids_apart(&rows, "input_length", 512);
        } else if name.ends_with(".bailian.jsonl") {
            let mut chats = HashSet::new();
            for row in &rows {
                let input = row["input_length"].as_u64().unwrap_or(0);
                assert_eq!(ids(row, "hash_ids").len() as u64, input.div_ceil(16));
                assert!(row["timestamp"].is_f64(), "seconds, as a float");
                assert_eq!(row["type"], "text");
                let parent = row["parent_chat_id"].as_i64().unwrap_or(-2);
                assert!(parent == -1 || chats.contains(&parent), "{name}: {row}");
                assert!(chats.insert(row["chat_id"].as_i64().unwrap_or(0)));
                assert!(row["turn"].as_u64().unwrap_or(0) >= 1);
            }
            assert_partial_ids_apart(&rows, "input_length", 16);
        } else if name.ends_with(".weka.jsonl") {
            // AIPerf rejects any field it does not know.
            let top = BTreeSet::from([
                "block_size",
                "hash_id_scope",
                "id",
                "models",
                "requests",
                "system_tokens",
                "tool_tokens",
            ]);
            let request = [
                "t",
                "type",
                "model",
                "in",
                "out",
                "hash_ids",
                "input_types",
                "output_types",
                "stop",
                "api_time",
                "think_time",
                "ttft",
            ];
            for row in &rows {
                assert_eq!(keys(row), top, "{name}");
                assert_eq!(row["hash_id_scope"], "local");
                assert_eq!(row["block_size"], 64);
                for r in row["requests"].as_array().into_iter().flatten() {
                    assert!(keys(r).iter().all(|k| request.contains(k)), "{name}: {r}");
                    let input = r["in"].as_u64().unwrap_or(0);
                    assert_eq!(
                        ids(r, "hash_ids").len() as u64,
                        input / 64,
                        "full blocks only"
                    );
                    assert!(
                        ids(r, "hash_ids")
                            .iter()
                            .all(|&id| (1..ID_LIMIT).contains(&id))
                    );
                    if r["type"] == "n" {
                        assert!(
                            r.get("ttft").is_none(),
                            "ttft is for streamed requests only"
                        );
                    }
                }
            }
        } else if name.ends_with(".trace_synthetic.jsonl") {
            for row in &rows {
                assert!(row["timestamp"].is_f64());
                assert!(row["output_length"].as_u64().unwrap_or(0) >= 1);
            }
        } else if name.ends_with(".otel.jsonl") {
            for row in &rows {
                for span in row["spans"].as_array().into_iter().flatten() {
                    assert!(
                        span["start_time"]
                            .as_str()
                            .is_some_and(|t| t.ends_with('Z'))
                    );
                    let a = &span["attributes"];
                    assert!(a["gen_ai.usage.input_tokens"].is_u64());
                    assert!(a["gen_ai.usage.output_tokens"].is_u64());
                    assert!(a["gen_ai.input.messages"].is_string());
                }
            }
        }
    }
}

/// Every string in a JSON value.
fn strings(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::String(s) => {
            out.insert(s.clone());
        }
        Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

#[test]
fn anonymized_exports_hold_no_text_model_or_tool_names() {
    // The formats' own field names and values, which a recording's JSON may also hold
    // (`length` is a finish reason, `tool_use` an Anthropic block type).
    let vocabulary = "timestamp input_length output_length hash_ids chat_id parent_chat_id type \
        text turn id models block_size hash_id_scope local tool_tokens system_tokens requests \
        model in out input_types output_types stop tool_use end_turn tool_result api_time \
        think_time ttft subagent agent_id subagent_type duration_ms total_tokens tool_use_count \
        status completed duration conv- agent- model-";
    for name in [
        "llmp/llama.cpp/parallel-nocache",
        "llmp/llama.cpp/session",
        "xllamacpp/session",
        "llmp/ollama/session",
    ] {
        let path = recording(name);
        let records = read_jsonl(BufReader::new(std::fs::File::open(&path).unwrap())).records;
        let mut secrets = BTreeSet::new();
        for record in &records {
            for body in [
                record.request.body.as_ref(),
                record.response.as_ref().and_then(|r| r.body.as_ref()),
            ]
            .into_iter()
            .flatten()
            {
                strings(body, &mut secrets);
            }
            secrets.extend(record.request.headers.values().cloned());
        }
        // Message text, system prompts, tool schemas, arguments, results, model and tool names
        // (long enough that a match is not a coincidence of digits or hex).
        let secrets: Vec<String> = secrets
            .into_iter()
            .filter(|s| s.chars().count() >= 5)
            .filter(|s| !s.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
            .filter(|s| !vocabulary.contains(s.as_str()))
            .collect();
        assert!(
            secrets.iter().any(|s| s.contains("read_file")),
            "{name}: the test sees the tool names"
        );
        for target in Target::ALL.into_iter().filter(|t| t.anonymous()) {
            let (text, _) = exported(&file(&path), Format::Recording, target);
            for secret in &secrets {
                assert!(
                    !text.contains(secret.as_str()),
                    "{name} → {}: the export holds {secret:?}",
                    target.as_str()
                );
            }
        }
        // The one export that is not anonymous holds them, which is why it says so.
        let (otel, _) = exported(&file(&path), Format::Recording, Target::Otel);
        assert!(otel.contains("read_file"));
    }
}

/// The figures an exported trace can reproduce: prompts only (a trace holds no replies).
fn profile_of(requests: &[Request], block_size: u32) -> (u64, u64, Option<f64>, Vec<u64>) {
    let config = ProfileConfig {
        block_size,
        warmup: 0.0,
        prompts_only: true,
        policies: vec![Policy::Fifo, Policy::Lru, Policy::Optimal],
        capacities: [2u64, 4, 8, 32, 128]
            .iter()
            .map(|&blocks| Capacity {
                blocks,
                label: format!("{blocks}b"),
            })
            .collect(),
        ..ProfileConfig::default()
    };
    let p = profile(requests, &config);
    (
        p.ceiling.hit_tokens,
        p.measured_tokens,
        p.aiperf_cache_hit_rate,
        p.points.iter().map(|x| x.hit_tokens).collect(),
    )
}

fn requests_of(bytes: &[u8], format: Format, block_size: u32) -> Vec<Request> {
    let options = InputOptions {
        block_size: Some(block_size),
        ..InputOptions::default()
    };
    let reader = input::decompressed(bytes).unwrap();
    let read = input::read(reader, "x", format, &options);
    assert!(
        read.report.bad_rows.is_empty(),
        "{:?}",
        read.report.bad_rows
    );
    read.requests
}

/// A CSV field holding `json` (quotes doubled).
fn csv_field(json: &Value) -> String {
    format!("\"{}\"", json.to_string().replace('"', "\"\""))
}

/// The same long prompt twice, the server counting it 300 then 310 tokens.
fn two_row_log() -> String {
    let request = json!({"model": "m", "messages": [
        {"role": "system", "content": "You review code. ".repeat(40)},
        {"role": "user", "content": "Is this fine?"}]});
    let mut csv = String::from("timestamp,request_json,response_json,status_code\n");
    for (t, tokens) in [(1, 300), (2, 310)] {
        let response = json!({"usage": {"prompt_tokens": tokens, "completion_tokens": 5},
            "choices": [{"message": {"role": "assistant", "content": "Yes."}}]});
        csv.push_str(&format!(
            "{t},{},{},200\n",
            csv_field(&request),
            csv_field(&response)
        ));
    }
    csv
}

/// One prompt to three models, twice each.
fn models_log() -> String {
    let mut csv = String::from("timestamp,request_json,response_json,status_code\n");
    let mut t = 0;
    for _ in 0..2 {
        for model in ["glm-5", "qwen3-coder", "kimi-k2"] {
            t += 1;
            let request = json!({"model": model, "messages": [
                {"role": "system", "content": "You are a helpful assistant. ".repeat(30)},
                {"role": "user", "content": "Summarise the repository."}]});
            let response = json!({"usage": {"prompt_tokens": 200, "completion_tokens": 9}});
            csv.push_str(&format!(
                "{t},{},{},200\n",
                csv_field(&request),
                csv_field(&response)
            ));
        }
    }
    csv
}

#[test]
fn profiling_an_export_gives_the_sources_hit_rates() {
    let mut cases: Vec<(String, Memory, Format)> = [
        "llmp/llama.cpp/parallel-nocache",
        "llmp/llama.cpp/session",
        "xllamacpp/session",
    ]
    .iter()
    .map(|name| (name.to_string(), file(&recording(name)), Format::Recording))
    .collect();
    cases.push((
        "mooncake trace".into(),
        Memory(vec![("trace".into(), mooncake_head(TRACE_ROWS))]),
        Format::Mooncake,
    ));
    // Gateway logs: two rows with the same prompt and different server counts (a partial last
    // block matched by its content), one prompt sent to several models (one cache each), and
    // the real log of 498 exchanges (pydantic-ai's recorded API calls, MIT).
    for (name, csv) in [
        ("two-row gateway log", two_row_log()),
        ("one prompt to three models", models_log()),
    ] {
        cases.push((
            name.into(),
            Memory(vec![("g.csv".into(), csv.into_bytes())]),
            Format::Csv,
        ));
    }
    cases.push((
        "pydantic-ai gateway log".into(),
        file(&root().join("tests/data/gateway-logs/pydantic-ai-cassettes.csv.gz")),
        Format::Csv,
    ));
    for (name, inputs, format) in cases {
        for (target, as_format) in [
            (Target::Mooncake, Format::Mooncake),
            (Target::Bailian, Format::Bailian),
        ] {
            if format == Format::Mooncake && target == Target::Bailian {
                continue; // 512-token ids cannot be cut into 16-token blocks
            }
            let bs = target.default_block_size().unwrap_or(16);
            let source = requests_of(&inputs.0[0].1, format, bs);
            let (text, summary) = exported(&inputs, format, target);
            assert_eq!(summary.requests as usize, source.len());
            let export = requests_of(text.as_bytes(), as_format, bs);
            let (expected, actual) = (profile_of(&source, bs), profile_of(&export, bs));
            assert_eq!(expected, actual, "{name} → {}", target.as_str());
            eprintln!(
                "{name} → {}: ceiling {} of {} tokens, LRU {:?}, equal",
                target.as_str(),
                expected.0,
                expected.1,
                expected.3
            );
        }
    }
}

#[test]
fn bailian_traces_regroup_into_mooncake_blocks_and_not_the_other_way() {
    // 16-token ids, 32 to a 512-token block: two requests sharing their first 40 ids share the
    // first 512-token block only.
    let row = |chat: i64, parent: i64, ids: &[u64], input: u64| {
        format!(
            "{{\"chat_id\": {chat}, \"parent_chat_id\": {parent}, \"timestamp\": {chat}.5, \"input_length\": {input}, \"output_length\": 3, \"type\": \"text\", \"turn\": 1, \"hash_ids\": {ids:?}}}\n"
        )
    };
    let a: Vec<u64> = (0..40).collect();
    let mut b: Vec<u64> = (0..64).collect();
    b[50] = 1000;
    let text = row(1, -1, &a, 640) + &row(2, 1, &b, 1024);
    let inputs = Memory(vec![("b".into(), text.into_bytes())]);
    let (mooncake, _) = exported(&inputs, Format::Bailian, Target::Mooncake);
    let rows = lines(&mooncake);
    let (first, second) = (ids(&rows[0], "hash_ids"), ids(&rows[1], "hash_ids"));
    assert_eq!((first.len(), second.len()), (2, 2));
    assert_eq!(first[0], second[0]);
    assert_ne!(first[1], second[1]);
    assert_eq!(rows[1]["timestamp"], 2500);
    // Bailian chains survive as conversations.
    let (bailian, _) = exported(&inputs, Format::Bailian, Target::Bailian);
    assert_eq!(lines(&bailian)[1]["parent_chat_id"], 1);
    let trace = Memory(vec![("t".into(), mooncake_head(3))]);
    match run_export(&trace, Format::Mooncake, &options(Target::Bailian)) {
        Err(ExportError::Usage(message)) => assert!(message.contains("--block-size 512")),
        other => panic!("expected a usage error, got {other:?}"),
    }
    match run_export(&trace, Format::Mooncake, &options(Target::Otel)) {
        Err(ExportError::Usage(message)) => assert!(message.contains("trace_synthetic")),
        other => panic!("expected a usage error, got {other:?}"),
    }
}

/// Generated agent traffic (a coding agent, its read-only subagent on the same SDK, a test
/// runner, a reviewer), as a recording in completion order.
fn agents_recording(records: usize) -> Vec<u8> {
    let config = WorkloadConfig {
        records,
        context_chars: 8_000,
        ..WorkloadConfig::default()
    };
    let mut out = Vec::new();
    for record in generate(&config) {
        write_jsonl(&mut out, &record).unwrap();
    }
    out
}

#[test]
fn weka_writes_subagents_and_tool_loops_of_generated_agents() {
    let inputs = Memory(vec![("agents".into(), agents_recording(300))]);
    let (text, summary) = exported(&inputs, Format::Recording, Target::Weka);
    assert_eq!(summary.requests, 300);
    assert!(summary.written.subagents > 0, "{summary:?}");
    assert!(summary.written.tool_results > 0);
    // Records arrive in completion order: some are read before their turn, never many.
    assert!(
        summary.read_ahead_max > 0 && summary.read_ahead_max < 20,
        "{summary:?}"
    );
    let mut requests = 0;
    let mut subagents = 0;
    for conversation in lines(&text) {
        for item in conversation["requests"].as_array().into_iter().flatten() {
            if item["type"] == "subagent" {
                subagents += 1;
                let inner = item["requests"].as_array().cloned().unwrap_or_default();
                assert!(!inner.is_empty());
                assert!(inner.iter().all(|r| r["type"] != "subagent"), "one level");
                assert!(inner[0]["t"].as_f64() >= item["t"].as_f64());
                requests += inner.len();
            } else {
                requests += 1;
            }
        }
    }
    assert_eq!(requests, 300);
    assert_eq!(subagents, summary.written.subagents);
    // They are the analysis' links, the ones the TUI shows (`u`), one per linked conversation.
    let records = read_jsonl(&agents_recording(300)[..]).records;
    let report = prefixscope_core::analysis::analyze(&records, &Default::default());
    let links = prefixscope_core::analysis::subagent_links(report.rows.iter());
    assert_eq!(links.len() as u64, summary.written.subagents);
}

#[test]
fn otel_carries_messages_and_the_servers_reuse_and_refuses_digests() {
    let inputs = file(&recording("llmp/llama.cpp/session"));
    let (text, _) = exported(&inputs, Format::Recording, Target::Otel);
    let spans: Vec<Value> = lines(&text)
        .iter()
        .flat_map(|t| t["spans"].as_array().cloned().unwrap_or_default())
        .collect();
    assert_eq!(spans.len(), 8);
    // llama.cpp reported cache_n on every turn.
    assert!(
        spans
            .iter()
            .all(|s| s["attributes"]["gen_ai.usage.cache_read.input_tokens"].is_u64())
    );
    let messages: Vec<Value> = serde_json::from_str(
        spans[0]["attributes"]["gen_ai.input.messages"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(messages[0]["role"], "system");
    let digest = file(&recording("llmp/llama.cpp/session.digest"));
    match run_export(&digest, Format::Recording, &options(Target::Otel)) {
        Err(ExportError::Usage(message)) => assert!(message.contains("digest recording")),
        other => panic!("expected a usage error, got {other:?}"),
    }
}

/// A gateway log exports as the recording a proxy would have written: conversations are the
/// analysis's (a turn that re-sends the history continues it), not the session ids, which
/// would join unrelated prompts of one user.
#[test]
fn gateway_logs_export_with_the_analysis_conversations() {
    let message = |role: &str, text: &str| {
        format!("{{\"\"role\"\":\"\"{role}\"\",\"\"content\"\":\"\"{text}\"\"}}")
    };
    let body = |user: &str, messages: &[String]| {
        format!(
            "\"{{\"\"model\"\":\"\"glm-5\"\",\"\"user\"\":\"\"{user}\"\",\"\"messages\"\":[{}]}}\"",
            messages.join(",")
        )
    };
    let usage = "\"{\"\"usage\"\":{\"\"prompt_tokens\"\":40,\"\"completion_tokens\"\":3},\"\"choices\"\":[{\"\"message\"\":{\"\"role\"\":\"\"assistant\"\",\"\"content\"\":\"\"an answer\"\"}}]}\"";
    let system = message(
        "system",
        &"You answer questions about the weather. ".repeat(8),
    );
    let first = [system.clone(), message("user", "first question")];
    let second = [
        system.clone(),
        message("user", "first question"),
        message("assistant", "an answer"),
        message("user", "second question"),
    ];
    let csv = format!(
        "timestamp,request_json,response_json,status_code\n\
         2,{},{usage},200\n\
         1,{},{usage},200\n\
         3,not json,,200\n\
         4,{},,200\n",
        body("alice", &second),
        body("alice", &first),
        body("alice", &[message("user", "unrelated question")]),
    );
    let inputs = Memory(vec![("g.csv".into(), csv.into_bytes())]);
    let (text, summary) = exported(&inputs, Format::Csv, Target::Bailian);
    assert_eq!(summary.requests, 3);
    assert_eq!(summary.bad_rows.len(), 1);
    assert_eq!(summary.bad_rows[0].row.line, 4);
    assert_eq!(summary.conversation_source, "the analysis");
    let rows = lines(&text);
    // Timestamp order; the second turn continues the first; the unrelated one stands alone.
    let chain: Vec<(i64, i64)> = rows
        .iter()
        .map(|r| {
            (
                r["parent_chat_id"].as_i64().unwrap_or(0),
                r["turn"].as_i64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(chain, vec![(-1, 1), (1, 2), (-1, 1)]);
    assert_eq!(rows[1]["timestamp"], 1.0);
    assert!(!text.contains("alice") && !text.contains("question"));
}

// ---------------------------------------------------------------------------------------------
// The command line

fn run(args: &[&str], config_home: &Path) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(root())
        .env("XDG_CONFIG_HOME", config_home)
        .output()
        .unwrap()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("prefixscope-export-{name}-{}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_salt_file_is_created_private_and_reused() {
    let home = temp_dir("salt");
    let session = "recordings/llmp/llama.cpp/session.jsonl";
    let first = run(&["export", session, "--to", "mooncake"], &home);
    assert_eq!(first.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(stderr.contains("hash ids of 512-token blocks"), "{stderr}");
    assert!(stderr.contains("(created)"), "{stderr}");
    let salt_file = home.join("prefixscope/salt");
    let text = std::fs::read_to_string(&salt_file).unwrap();
    assert_eq!(text.trim().len(), 64);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&salt_file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    let second = run(&["export", session, "--to", "mooncake"], &home);
    assert!(String::from_utf8_lossy(&second.stderr).contains("(reused)"));
    assert_eq!(first.stdout, second.stdout, "same salt, same ids");
    // Another salt, other ids.
    let other = home.join("other-salt");
    let third = run(
        &[
            "export",
            session,
            "--to",
            "mooncake",
            "--salt-file",
            other.to_str().unwrap(),
        ],
        &home,
    );
    assert_eq!(third.status.code(), Some(0));
    assert_ne!(first.stdout, third.stdout);
    std::fs::remove_dir_all(&home).ok();
}

#[test]
fn the_command_writes_what_the_library_writes() {
    let home = temp_dir("golden");
    let salt_file = home.join("salt");
    std::fs::write(&salt_file, format!("{SALT}\n")).unwrap();
    let out = home.join("out.jsonl");
    let result = run(
        &[
            "export",
            "recordings/llmp/llama.cpp/parallel-nocache.jsonl",
            "--to",
            "weka",
            "--salt-file",
            salt_file.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ],
        &home,
    );
    assert_eq!(result.status.code(), Some(0));
    let golden = root().join("tests/golden/export/llmp--llama.cpp--parallel-nocache.weka.jsonl");
    assert_eq!(
        std::fs::read_to_string(out).unwrap(),
        std::fs::read_to_string(golden).unwrap()
    );
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(
        stderr.contains("23 requests → 6 conversation objects"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&home).ok();
}

#[test]
fn exit_codes_bad_lines_and_the_otel_warning() {
    let home = temp_dir("codes");
    let code = |args: &[&str]| run(args, &home).status.code();
    // Unreadable input: 1.
    assert_eq!(
        code(&["export", "/nonexistent.jsonl", "--to", "mooncake"]),
        Some(1)
    );
    // Usage: 2.
    let session = "recordings/llmp/llama.cpp/session.jsonl";
    assert_eq!(code(&["export", session, "--to", "parquet"]), Some(2));
    assert_eq!(code(&["export", session]), Some(2));
    assert_eq!(
        code(&["export", session, "--to", "mooncake", "--block-size", "0"]),
        Some(2)
    );
    let trace = home.join("trace.jsonl");
    std::fs::write(&trace, mooncake_head(5)).unwrap();
    let mixed = run(
        &[
            "export",
            session,
            trace.to_str().unwrap(),
            "--to",
            "mooncake",
        ],
        &home,
    );
    assert_eq!(mixed.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&mixed.stderr).contains("one kind"));
    let out = home.join("digest.otel.jsonl");
    let digest = run(
        &[
            "export",
            "recordings/llmp/llama.cpp/session.digest.jsonl",
            "--to",
            "otel",
            "-o",
            out.to_str().unwrap(),
        ],
        &home,
    );
    assert_eq!(digest.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&digest.stderr).contains("digest recording"));
    assert!(!out.exists(), "no partial export is left behind");
    // The output is never one of the inputs.
    let copy = home.join("copy.jsonl");
    std::fs::copy(root().join(session), &copy).unwrap();
    let over = run(
        &[
            "export",
            copy.to_str().unwrap(),
            "--to",
            "mooncake",
            "-o",
            copy.to_str().unwrap(),
        ],
        &home,
    );
    assert_eq!(over.status.code(), Some(2));
    assert_eq!(
        std::fs::read(&copy).unwrap(),
        std::fs::read(root().join(session)).unwrap()
    );
    // Bad lines are reported and skipped.
    let damaged = home.join("damaged.jsonl");
    let mut text = std::fs::read_to_string(root().join(session)).unwrap();
    let first_line_end = text.find('\n').unwrap() + 1;
    text.insert_str(first_line_end, "not json\n");
    text.push_str("{\"v\":1,\"id\":");
    std::fs::write(&damaged, text).unwrap();
    let result = run(
        &["export", damaged.to_str().unwrap(), "--to", "bailian"],
        &home,
    );
    assert_eq!(result.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("damaged.jsonl:2:"), "{stderr}");
    assert!(stderr.contains("2 bad lines"), "{stderr}");
    assert_eq!(String::from_utf8_lossy(&result.stdout).lines().count(), 8);
    // OTel says it is not anonymous, in --help and when it runs; its file is private.
    let help = run(&["export", "--help"], &home);
    assert!(String::from_utf8_lossy(&help.stdout).contains("NOT anonymous"));
    let otel_out = home.join("session.otel.jsonl");
    let otel = run(
        &[
            "export",
            session,
            "--to",
            "otel",
            "-o",
            otel_out.to_str().unwrap(),
        ],
        &home,
    );
    assert_eq!(otel.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&otel.stderr).contains("NOT anonymous"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&otel_out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }
    assert!(std::fs::metadata(&otel_out).unwrap().len() > 0);
    std::fs::remove_dir_all(&home).ok();
}
