//! One truth: after the last record, every figure of the live snapshot (what the TUI draws)
//! equals `profile --warmup 0` and `analyze` on the same file, through the same record → block
//! path the TUI's replay uses (the block model measured over the file first, then the records
//! one by one). Over every checked-in recording, every demo scenario and a generated workload.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use prefixscope_core::analysis::Config;
use prefixscope_core::live::{Command as EngineCommand, Engine, Input};
use prefixscope_core::record::{Lines, Record, write_jsonl};
use serde_json::Value;
use workload::{WorkloadConfig, generate};

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");

const RECORDINGS: [&str; 9] = [
    "recordings/llmp/llama.cpp/session.jsonl",
    "recordings/llmp/llama.cpp/session.digest.jsonl",
    "recordings/llmp/llama.cpp/parallel.jsonl",
    "recordings/llmp/llama.cpp/parallel-nocache.jsonl",
    "recordings/llmp/ollama/session.jsonl",
    "recordings/llmp/ollama-openai/session.jsonl",
    "recordings/xllamacpp/session.jsonl",
    "recordings/xllamacpp/session.digest.jsonl",
    "tests/data/hostile-escapes.jsonl",
];

const SCENARIOS: [&str; 5] = [
    "mixed",
    "side-calls",
    "parallel",
    "volatile-system",
    "compaction",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("prefixscope-parity-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn records_of(path: &Path) -> Vec<Record> {
    let file = std::fs::File::open(path).unwrap();
    Lines::new(std::io::BufReader::new(file))
        .filter_map(Result::ok)
        .collect()
}

fn json_of(args: &[&str]) -> Value {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The snapshot the TUI shows at the end of a replay of `path`, the chart open (so Belady's
/// optimal is worked out too).
fn live_snapshot(path: &Path) -> Value {
    let records = records_of(path);
    let mut engine = Engine::for_records(Config::default(), &records);
    for record in records {
        engine.push(Input::Record(Arc::new(record), 0));
    }
    engine.push(Input::SourceDone);
    engine.push(Input::Command(EngineCommand::Chart(true)));
    engine.snapshot().to_json()
}

fn share(hit: &Value, measured: &Value) -> f64 {
    let (hit, measured) = (hit.as_u64().unwrap(), measured.as_u64().unwrap());
    if measured == 0 {
        0.0
    } else {
        hit as f64 / measured as f64
    }
}

/// Compares every figure; returns how many were compared.
fn check(name: &str, path: &Path) -> usize {
    let file = path.to_str().unwrap();
    let live = live_snapshot(path);
    // The capacities the live axis chose (from one block up to the working set).
    let capacities: Vec<String> = live["hit_rate"]["points"]
        .as_array()
        .map(|points| {
            points
                .iter()
                .filter_map(|p| p["capacity"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_else(|| vec!["4K".to_string()]);
    let profile = json_of(&[
        "profile",
        file,
        "--warmup",
        "0",
        "--capacities",
        &capacities.join(","),
        "--json",
    ]);
    let analyze = json_of(&["analyze", file, "--json"]);
    let mut compared = 0;

    // The analysis: header totals, loss per client and cause, coverage, every row.
    for key in [
        "window",
        "coverage",
        "servers",
        "time",
        "composition",
        "clients",
        "tools",
        "rows",
    ] {
        assert_eq!(live[key], analyze[key], "{name}: {key}");
        compared += 1;
    }

    let curve = &live["hit_rate"];
    if profile["requests"] == 0 {
        assert!(curve.is_null(), "{name}: a curve without requests");
        return compared;
    }
    // The block model both used.
    let model = profile["inputs"][0]["block_model"].clone();
    let described = format!(
        "{}-token blocks ({})",
        model["block_size"],
        model["block_size_source"].as_str().unwrap_or_default()
    );
    assert!(
        curve["block_model"]
            .as_str()
            .is_some_and(|m| m.starts_with(&described)),
        "{name}: live {} against profile {described}",
        curve["block_model"]
    );
    // The ceiling, both semantics.
    assert_eq!(
        curve["ceiling"].as_f64(),
        profile["ceiling"]["hit_rate"].as_f64(),
        "{name}: ceiling"
    );
    assert_eq!(
        curve["ceiling_prompts_only"].as_f64(),
        profile["ceiling_prompts_only"]["hit_rate"].as_f64(),
        "{name}: ceiling, prompts only"
    );
    compared += 2;
    // Every policy at every capacity.
    for point in curve["points"].as_array().unwrap() {
        let label = point["capacity"].as_str().unwrap();
        for policy in ["lru", "fifo", "optimal"] {
            let twin = profile["points"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["policy"] == policy && p["capacity"] == format!("{label} tokens"))
                .unwrap_or_else(|| panic!("{name}: no {policy} at {label} in the profile"));
            assert_eq!(
                point[policy].as_f64(),
                twin["hit_rate"].as_f64(),
                "{name}: {policy} at {label}"
            );
            compared += 1;
        }
    }
    // The server's own reuse.
    let observed = &profile["server_observed"];
    let server = (!observed.is_null()).then(|| {
        share(
            &observed["server_reused_tokens"],
            &observed["prompt_tokens"],
        )
    });
    assert_eq!(curve["server"].as_f64(), server, "{name}: server reuse");
    compared += 1;
    // The top prefixes: each live item is one of the profile's, with its size, count and volume.
    let boards = &profile["top_prefixes"];
    let profile_items: Vec<(u64, u64, u64)> = ["by_count", "by_reusable_tokens"]
        .iter()
        .flat_map(|board| boards[*board].as_array().unwrap().iter())
        .map(|g| {
            (
                g["prefix_tokens"].as_u64().unwrap(),
                g["count"].as_u64().unwrap(),
                g["reusable_tokens"].as_u64().unwrap(),
            )
        })
        .collect();
    let live_items = live["top_prefixes"].as_array().unwrap();
    // The live list leaves out prefixes under `MIN_LISTED_PREFIX_TOKENS` (role markup).
    let listable = profile_items
        .iter()
        .any(|(tokens, _, _)| *tokens >= prefixscope_core::live::MIN_LISTED_PREFIX_TOKENS);
    assert_eq!(!live_items.is_empty(), listable, "{name}");
    for item in live_items {
        let key = (
            item["prefix_tokens"].as_u64().unwrap(),
            item["count"].as_u64().unwrap(),
            item["reusable_tokens"].as_u64().unwrap(),
        );
        assert!(
            profile_items.contains(&key),
            "{name}: live prefix {key:?} not in the profile's {profile_items:?}"
        );
        compared += 1;
    }
    compared
}

#[test]
fn every_checked_in_recording() {
    for relative in RECORDINGS {
        let compared = check(relative, &root().join(relative));
        eprintln!("{relative}: {compared} figures equal");
    }
}

#[test]
fn every_demo_scenario() {
    let dir = temp_dir("demo");
    for scenario in SCENARIOS {
        let path = dir.join(format!("{scenario}.jsonl"));
        let out = Command::new(BIN)
            .args([
                "demo",
                "--scenario",
                scenario,
                "--speed",
                "1000",
                "--seed",
                "7",
                "-o",
            ])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{scenario}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let compared = check(scenario, &path);
        eprintln!("demo {scenario}: {compared} figures equal");
        if scenario == "volatile-system" {
            // A request id in front of the system prompt: nothing is reusable, and the ceiling
            // says so (within 3 points of what the simulated server reused), not 26 points above.
            let profile = json_of(&["profile", path.to_str().unwrap(), "--json"]);
            let ceiling = profile["ceiling"]["hit_rate"].as_f64().unwrap();
            let observed = &profile["server_observed"];
            let server = share(
                &observed["server_reused_tokens"],
                &observed["prompt_tokens"],
            );
            assert!(
                (ceiling - server).abs() <= 0.03,
                "volatile-system: ceiling {ceiling}, server {server}"
            );
            eprintln!("volatile-system: ceiling {ceiling:.4}, server {server:.4}");
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_generated_workload() {
    let dir = temp_dir("workload");
    let path = dir.join("agents.jsonl");
    let config = WorkloadConfig {
        records: 400,
        context_chars: 6_000,
        ..WorkloadConfig::default()
    };
    let mut out = Vec::new();
    for record in generate(&config) {
        write_jsonl(&mut out, &record).unwrap();
    }
    std::fs::write(&path, out).unwrap();
    let compared = check("generated workload", &path);
    eprintln!("generated workload: {compared} figures equal");
    std::fs::remove_dir_all(&dir).ok();
}
