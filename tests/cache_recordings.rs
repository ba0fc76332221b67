//! The cache simulation on the real recordings in `recordings/`: the block count follows the
//! server's prompt_tokens, full and digest recordings of the same traffic agree, and the
//! profile shows its ceiling beside the reuse the server reported. A golden JSON report pins
//! the whole output (regenerate with `PREFIXSCOPE_UPDATE_GOLDEN=1`).

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::Command;

use prefixscope_core::analysis::{Config, analyze};
use prefixscope_core::cache::{BlockKeys, Cut, ProfileConfig, Request, profile};
use prefixscope_core::input::{self, FileInput, Format, InputOptions};
use prefixscope_core::record::read_jsonl;
use serde_json::Value;

mod support;

const RECORDINGS: [&str; 6] = [
    "recordings/llmp/llama.cpp/session.jsonl",
    "recordings/llmp/llama.cpp/session.digest.jsonl",
    "recordings/llmp/llama.cpp/parallel.jsonl",
    "recordings/llmp/llama.cpp/parallel-nocache.jsonl",
    "recordings/xllamacpp/session.jsonl",
    "recordings/xllamacpp/session.digest.jsonl",
];

/// Full and digest recordings of the same traffic.
const TWINS: [(&str, &str); 2] = [
    (
        "recordings/llmp/llama.cpp/session.jsonl",
        "recordings/llmp/llama.cpp/session.digest.jsonl",
    ),
    (
        "recordings/xllamacpp/session.jsonl",
        "recordings/xllamacpp/session.digest.jsonl",
    ),
];

fn path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn read(relative: &str, options: &InputOptions) -> FileInput {
    let file = File::open(path(relative)).expect("the recording opens");
    let input = input::read(BufReader::new(file), relative, Format::Recording, options);
    assert!(
        input.report.bad_rows.is_empty(),
        "{relative}: {:?}",
        input.report.bad_rows
    );
    input
}

/// A recording read once, keyed: with nothing to reopen, no budget stops it holding requests.
fn read_keyed(bytes: &[u8], name: &str, options: &InputOptions) -> FileInput {
    input::read_keyed_or_twice(bytes, None, usize::MAX, name, options)
}

/// What the server said, read straight from the raw records: (prompt tokens, reused tokens)
/// per 2xx chat exchange, in record order.
fn server_figures(relative: &str) -> Vec<(Option<u64>, Option<u64>)> {
    let file = File::open(path(relative)).expect("the recording opens");
    let records = read_jsonl(BufReader::new(file)).records;
    records
        .iter()
        .filter(|r| {
            r.request.path.ends_with("/completions") || r.request.path.ends_with("/messages")
        })
        .filter_map(|r| r.response.as_ref())
        .filter(|response| (200..300).contains(&response.status))
        .map(|response| {
            let body = response
                .body
                .clone()
                .or_else(|| {
                    response
                        .digest
                        .as_ref()
                        .map(|d| Value::Object(d.usage.clone()))
                })
                .unwrap_or(Value::Null);
            let n = |p: &str| body.pointer(p).and_then(Value::as_u64);
            let prompt = n("/usage/prompt_tokens")
                .or_else(|| Some(n("/timings/cache_n")? + n("/timings/prompt_n")?))
                .or_else(|| Some(n("/usage/input_tokens")? + n("/usage/cache_read_input_tokens")?));
            let reused = n("/timings/cache_n")
                .or_else(|| n("/usage/prompt_tokens_details/cached_tokens"))
                .or_else(|| n("/usage/cache_read_input_tokens"));
            (prompt, reused)
        })
        .collect()
}

fn ceiling(requests: &[Request]) -> u64 {
    let config = ProfileConfig {
        warmup: 0.0,
        policies: Vec::new(),
        ..ProfileConfig::default()
    };
    profile(requests, &config).ceiling.hit_tokens
}

/// 16-token blocks, whatever the server (llama.cpp's default is 1: it reuses to the token).
fn sixteen() -> InputOptions {
    InputOptions {
        block_size: Some(16),
        ..InputOptions::default()
    }
}

#[test]
fn blocks_number_ceil_prompt_tokens_over_16_where_the_server_counted() {
    for relative in RECORDINGS {
        let input = read(relative, &sixteen());
        let figures = server_figures(relative);
        assert_eq!(input.requests.len(), figures.len(), "{relative}");
        assert!(!figures.is_empty());
        for (request, (prompt_tokens, reused)) in input.requests.iter().zip(&figures) {
            let prompt_tokens = prompt_tokens.expect("llama.cpp counts every prompt");
            assert_eq!(request.cut, Some(Cut::ServerPromptTokens), "{relative}");
            assert_eq!(
                request.blocks.len() as u64,
                prompt_tokens.div_ceil(16),
                "{relative}"
            );
            let weight: u64 = request.blocks.iter().map(|b| u64::from(b.tokens)).sum();
            assert_eq!(weight, prompt_tokens, "{relative}");
            assert_eq!(request.input_tokens, prompt_tokens);
            assert_eq!(request.server_reused_tokens, *reused);
            assert!(request.blocks.iter().all(|b| b.id < 1 << 53));
        }
    }
    // Two figures from the recordings' READMEs: 79 reused of 124 on xllamacpp's turn 2 (a
    // streamed answer: timings only), 438 of 525 on llama.cpp's turn 2.
    let xllama = read("recordings/xllamacpp/session.jsonl", &sixteen());
    assert_eq!(
        (
            xllama.requests[1].input_tokens,
            xllama.requests[1].blocks.len()
        ),
        (124, 8)
    );
    let llama = read("recordings/llmp/llama.cpp/session.jsonl", &sixteen());
    assert_eq!(
        (
            llama.requests[1].input_tokens,
            llama.requests[1].blocks.len()
        ),
        (525, 33)
    );
}

#[test]
fn full_and_digest_recordings_of_the_same_traffic_give_the_same_ceiling() {
    for (full_path, digest_path) in TWINS {
        let digest = read(digest_path, &InputOptions::default());
        assert!(
            digest
                .requests
                .iter()
                .all(|r| r.keys == Some(BlockKeys::MessageDigest))
        );
        // Keyed the digest way (and without its replies, which a digest does not keep), the
        // full recording gives the same blocks, hence the same ceiling.
        let by_messages = InputOptions {
            keys_from_messages: true,
            replies: false,
            ..InputOptions::default()
        };
        let full_by_messages = read(full_path, &by_messages);
        let blocks = |input: &FileInput| {
            input
                .requests
                .iter()
                .map(|r| r.blocks.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(blocks(&full_by_messages), blocks(&digest), "{full_path}");
        assert_eq!(
            ceiling(&full_by_messages.requests),
            ceiling(&digest.requests)
        );
        // Keyed by its text (the default), the full recording also finds the shared start of a
        // message that changed (the system prompt whose last word is the weekday), and caches
        // its replies: never less.
        let full = read(full_path, &InputOptions::default());
        assert!(
            full.requests
                .iter()
                .all(|r| r.keys == Some(BlockKeys::Content))
        );
        assert!(
            ceiling(&full.requests) >= ceiling(&digest.requests),
            "{full_path}"
        );
    }
}

fn run_profile(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_prefixscope"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("profile")
        .args(args)
        .output()
        .expect("the binary runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[test]
fn the_profile_shows_the_ceiling_beside_the_servers_reuse() {
    for relative in RECORDINGS {
        let figures = server_figures(relative);
        let reused: u64 = figures.iter().filter_map(|f| f.1).sum();
        let prompt: u64 = figures
            .iter()
            .filter(|f| f.1.is_some())
            .filter_map(|f| f.0)
            .sum();
        let (_, json) = run_profile(&[relative, "--json"]);
        let report: Value = serde_json::from_str(&json).expect("JSON");
        let observed = &report["server_observed"];
        assert_eq!(observed["server_reused_tokens"], reused, "{relative}");
        assert_eq!(observed["prompt_tokens"], prompt, "{relative}");
        assert!(observed["ceiling_hit_tokens"].as_u64().is_some());

        let (_, text) = run_profile(&[relative]);
        let line = text
            .lines()
            .find(|l| l.contains("server reported reuse"))
            .unwrap_or_default()
            .to_string();
        let thousands = |n: u64| {
            let digits = n.to_string();
            let mut out = String::new();
            for (i, c) in digits.chars().enumerate() {
                if i > 0 && (digits.len() - i).is_multiple_of(3) {
                    out.push(',');
                }
                out.push(c);
            }
            out
        };
        assert!(
            line.contains(&format!(
                "reuse {} of {}",
                thousands(reused),
                thousands(prompt)
            )),
            "{line}"
        );
        assert!(line.contains("ceiling on the same requests"), "{line}");
    }
}

#[test]
fn the_split_finds_the_conversations_the_analysis_found() {
    let config = ProfileConfig {
        warmup: 0.0,
        ..ProfileConfig::default()
    };
    // The xllamacpp recording holds an OpenAI and an Anthropic conversation; parallel-nocache
    // four interleaved agents (five conversations) and a tool-less side-call in none.
    for (relative, conversations) in [
        ("recordings/xllamacpp/session.jsonl", 2),
        ("recordings/llmp/llama.cpp/parallel-nocache.jsonl", 5),
    ] {
        let input = read(relative, &InputOptions::default());
        assert_eq!(input.report.conversation_source, "analysis");
        let records = read_jsonl(std::fs::read(path(relative)).unwrap().as_slice()).records;
        let analysis = analyze(&records, &Config::default());
        for request in &input.requests {
            let row = analysis
                .rows
                .iter()
                .find(|r| Some(r.id) == request.record_id)
                .unwrap();
            let expected = row.conversation.map(|c| format!("{relative}#c{c}"));
            assert_eq!(
                request.conversation, expected,
                "{relative} record {}",
                row.id
            );
        }
        let report = profile(&input.requests, &config);
        assert_eq!(
            report.conversations.conversations, conversations,
            "{relative}"
        );
        // Turns reuse their own conversation's blocks, and the agents' shared system prompt
        // is reused across conversations.
        assert!(report.ceiling.same_conversation_tokens > 0, "{relative}");
    }
    let parallel = read(
        "recordings/llmp/llama.cpp/parallel-nocache.jsonl",
        &InputOptions::default(),
    );
    assert!(profile(&parallel.requests, &config).ceiling.other_tokens > 0);
}

#[test]
fn the_ceiling_bounds_what_the_server_reused() {
    // Every real llama.cpp recording with its text, at profile's defaults (1-token blocks:
    // llama.cpp reuses to the token; replies cached after their prompts). Digest recordings
    // keep neither the replies nor the text, so a message that changed in its middle (the
    // system prompt's weekday) shares nothing there while the server reused its start: they
    // bound the server only where messages repeat whole.
    for relative in RECORDINGS.iter().filter(|r| !r.contains(".digest.")) {
        let bytes = std::fs::read(path(relative)).unwrap();
        let bound = support::bound::ceiling_bound(&bytes, relative);
        assert!(bound.over.is_empty(), "{relative}: {:#?}", bound.over);
        assert!(
            bound.ceiling_total >= bound.server_total,
            "{relative}: ceiling {} < server {}",
            bound.ceiling_total,
            bound.server_total
        );
        // The profile reports the same totals.
        let (_, json) = run_profile(&[relative, "--json"]);
        let report: Value = serde_json::from_str(&json).expect("JSON");
        let observed = &report["server_observed"];
        assert_eq!(
            observed["ceiling_hit_tokens"], bound.ceiling_total,
            "{relative}"
        );
        assert_eq!(
            observed["server_reused_tokens"], bound.server_total,
            "{relative}"
        );
        eprintln!(
            "{relative}: ceiling {} ≥ server {} ({}-token blocks)",
            bound.ceiling_total, bound.server_total, bound.block_size
        );
    }
}

#[test]
fn golden_profile_of_the_parallel_recording() {
    let golden = path("tests/data/profile/parallel.profile.json");
    let (_, json) = run_profile(&["recordings/llmp/llama.cpp/parallel.jsonl", "--json"]);
    if std::env::var_os("PREFIXSCOPE_UPDATE_GOLDEN").is_some() {
        std::fs::create_dir_all(golden.parent().expect("a folder")).expect("the folder");
        std::fs::write(&golden, &json).expect("the golden file is written");
    }
    let expected = std::fs::read_to_string(&golden)
        .expect("tests/data/profile/parallel.profile.json (PREFIXSCOPE_UPDATE_GOLDEN=1 writes it)");
    assert_eq!(
        json, expected,
        "regenerate with PREFIXSCOPE_UPDATE_GOLDEN=1 if the change is intended"
    );
}

/// The recording as `profile` reads it, one record at a time, against the whole file read and
/// keyed by the batch analysis: requests, report and analysis equal on every real recording,
/// and on one read backwards with a broken line and two implausible counts (bad values are
/// reported in id order, whatever order the file holds them in).
#[test]
fn a_recording_read_record_by_record_equals_the_whole_file_read() {
    let mut files: Vec<String> = RECORDINGS.iter().map(|s| s.to_string()).collect();
    files.extend(
        [
            "recordings/llmp/ollama/session.jsonl",
            "recordings/llmp/ollama-openai/session.jsonl",
            "tests/data/hostile-escapes.jsonl",
            "tests/data/ollama-cached/session.jsonl",
            "tests/data/harness/opencode.jsonl",
            "tests/data/harness/aider.jsonl",
            "tests/data/harness/codex.jsonl",
            "tests/data/harness/claude-code.digest.jsonl",
            "tests/data/harness/claude-code-continue.digest.jsonl",
            "tests/data/llama-no-model/system-date-change.jsonl",
            "tests/data/named-causes/claude-code-attribution.jsonl",
        ]
        .map(String::from),
    );
    let options = InputOptions {
        keep_analysis: true,
        ..InputOptions::default()
    };
    let both_ways = |bytes: &[u8], name: &str| {
        let streamed = read_keyed(bytes, name, &options);
        let whole = input::keyed_by_analysis(input::read_recording(bytes, name, &options), name);
        // Not kept, the analysis is dropped before the cut, and the requests are the same.
        let unkept = read_keyed(bytes, name, &InputOptions::default());
        assert!(unkept.analysis.is_none());
        assert_eq!(unkept.requests, streamed.requests);
        // Read twice (past a budget of nothing, or once a few texts are held), the same.
        let owned = bytes.to_vec();
        let reopen = move || -> std::io::Result<Box<dyn std::io::BufRead>> {
            Ok(Box::new(std::io::Cursor::new(owned.clone())))
        };
        for budget in [0, 20_000] {
            for options in [&options, &InputOptions::default()] {
                let twice = input::read_keyed_or_twice(bytes, Some(&reopen), budget, name, options);
                let once = if options.keep_analysis {
                    &streamed
                } else {
                    &unkept
                };
                assert_eq!(&twice, once, "{name}, read twice past {budget} bytes");
            }
        }
        (streamed, whole)
    };
    for file in &files {
        let bytes = std::fs::read(path(file)).unwrap();
        let (streamed, whole) = both_ways(&bytes, file);
        assert!(!whole.requests.is_empty(), "{file}");
        assert_eq!(streamed, whole, "{file}");
    }

    // Backwards, with implausible counts on early, middle and late records, and a broken line.
    let text = std::fs::read_to_string(path("recordings/llmp/llama.cpp/parallel.jsonl")).unwrap();
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let last = lines.len() - 1;
    for index in [1, lines.len() / 2, last - 2] {
        let mut record: Value = serde_json::from_str(&lines[index]).unwrap();
        zero_prompt_counts(&mut record);
        lines[index] = record.to_string();
    }
    lines.reverse();
    lines.insert(3, "{not json".to_string());
    let backwards = lines.join("\n");
    let (streamed, whole) = both_ways(backwards.as_bytes(), "backwards");
    assert!(
        whole.report.bad_values.len() >= 2,
        "{:?}",
        whole.report.bad_values
    );
    assert_eq!(whole.report.bad_rows.len(), 1);
    assert_eq!(streamed, whole);
}

/// A second read that does not give the first's requests ends them there, said as the read's
/// error; records appended between the reads are not read.
#[test]
fn a_recording_read_twice_says_when_the_second_read_differs() {
    let text = std::fs::read_to_string(path("recordings/llmp/llama.cpp/parallel.jsonl")).unwrap();
    let once = read_keyed(text.as_bytes(), "f", &InputOptions::default());
    assert!(once.requests.len() > 4);
    let twice_from = |second: String| {
        let reopen = move || -> std::io::Result<Box<dyn std::io::BufRead>> {
            Ok(Box::new(std::io::Cursor::new(second.clone().into_bytes())))
        };
        input::read_keyed_or_twice(
            text.as_bytes(),
            Some(&reopen),
            0,
            "f",
            &InputOptions::default(),
        )
    };
    let appended = twice_from(format!("{text}\n{}", text.lines().last().unwrap()));
    assert_eq!(appended, once);

    let lines: Vec<&str> = text.lines().collect();
    let truncated = twice_from(lines[..lines.len() / 2].join("\n"));
    let error = truncated.report.read_error.clone().unwrap();
    assert!(
        error.contains("second read") && error.contains("changed between the reads"),
        "{error}"
    );
    assert!(truncated.requests.len() < once.requests.len());
    assert_eq!(truncated.report.requests, truncated.requests.len() as u64);
    assert_eq!(
        truncated.requests[..],
        once.requests[..truncated.requests.len()]
    );

    let reopen =
        || -> std::io::Result<Box<dyn std::io::BufRead>> { Err(std::io::Error::other("gone")) };
    let gone = input::read_keyed_or_twice(
        text.as_bytes(),
        Some(&reopen),
        0,
        "f",
        &InputOptions::default(),
    );
    assert!(gone.requests.is_empty());
    let error = gone.report.read_error.unwrap();
    assert!(error.contains("cannot open it again: gone"), "{error}");
}

/// Every prompt count in `value` set to 0: a prompt with text is never 0 tokens, so the reader
/// reports each as a bad value.
fn zero_prompt_counts(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map.iter_mut() {
                if matches!(
                    key.as_str(),
                    "prompt_tokens" | "prompt_n" | "cache_n" | "prompt_eval_count"
                ) {
                    *inner = Value::from(0);
                } else {
                    zero_prompt_counts(inner);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(zero_prompt_counts),
        _ => {}
    }
}
