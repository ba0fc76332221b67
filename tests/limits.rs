//! Hostile numbers are normal input: a token count past every context window, from a server or a
//! file, is a counted bad value on its record, never an allocation (issue #17, item 1). The
//! binaries run under a 2 GiB address-space limit (`prlimit --as`), so an allocation sized by
//! such a count fails the test instead of the machine.

use std::path::{Path, PathBuf};
use std::process::Command;

use prefixscope::analysis::{Config, analyze};
use prefixscope::input::{self, Format, InputOptions};
use prefixscope::record::read_jsonl;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");
const ADDRESS_SPACE: &str = "--as=2147483648";

fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("recordings/xllamacpp/session.jsonl")
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prefixscope-limits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The real recording with four responses' counts replaced by hostile ones (2^32, 2^63, u64::MAX,
/// and an Anthropic `input_tokens` of 2^63); the other records untouched. Returns the path and
/// the ids of the records changed.
fn crafted_recording() -> (PathBuf, Vec<u64>) {
    let text = std::fs::read_to_string(source()).unwrap();
    let mut lines = Vec::new();
    let mut changed = Vec::new();
    let hostile: [(&str, Value); 4] = [
        ("/usage/prompt_tokens", json!(1u64 << 32)),
        ("/usage/prompt_tokens", json!(1u64 << 63)),
        ("/timings/cache_n", json!(u64::MAX)),
        ("/usage/input_tokens", json!(1u64 << 63)),
    ];
    let mut next = hostile.iter();
    let mut chat = 0;
    for line in text.lines() {
        let mut record: Value = serde_json::from_str(line).unwrap();
        let is_chat = record["response"]["body"].is_object();
        if is_chat {
            chat += 1;
        }
        // Every other chat exchange, so untouched ones remain between them.
        if is_chat
            && chat % 2 == 0
            && let Some((pointer, value)) = next.next()
        {
            let (parent, field) = pointer.rsplit_once('/').unwrap();
            let body = &mut record["response"]["body"];
            let target = if parent.is_empty() {
                body
            } else {
                let key = parent.trim_start_matches('/');
                if !body[key].is_object() {
                    body[key] = json!({});
                }
                &mut body[key]
            };
            target[field] = value.clone();
            changed.push(record["id"].as_u64().unwrap());
        }
        lines.push(serde_json::to_string(&record).unwrap());
    }
    assert_eq!(
        changed.len(),
        4,
        "the source recording has fewer chat exchanges"
    );
    let path = temp("crafted.jsonl");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    (path, changed)
}

#[test]
fn hostile_server_counts_are_bad_values_and_the_rest_is_read() {
    let (path, changed) = crafted_recording();
    let read = |p: &Path| {
        input::read(
            std::io::BufReader::new(std::fs::File::open(p).unwrap()),
            "crafted",
            Format::Recording,
            &InputOptions::default(),
        )
    };
    let crafted = read(&path);
    let original = read(&source());
    assert_eq!(crafted.report.requests, original.report.requests);
    assert!(
        crafted.report.bad_value_count >= 4,
        "{:?}",
        crafted.report.bad_values
    );
    for value in &crafted.report.bad_values {
        assert!(value.contains("(ignored)"), "{value}");
    }
    // No request claims more than its text can hold.
    for request in &crafted.requests {
        assert!(request.input_tokens < 1 << 20, "{}", request.input_tokens);
    }
    // The untouched records keep their server counts.
    for (a, b) in crafted.requests.iter().zip(&original.requests) {
        if !changed.contains(&a.record_id.unwrap()) {
            assert_eq!(a.input_tokens, b.input_tokens);
            assert_eq!(a.server_reused_tokens, b.server_reused_tokens);
        }
    }
    // The analysis reads the hostile counts as not reported, and the others as before.
    let records = |p: &Path| read_jsonl(std::io::BufReader::new(std::fs::File::open(p).unwrap()));
    let crafted = analyze(&records(&path).records, &Config::default());
    let original = analyze(&records(&source()).records, &Config::default());
    assert_eq!(crafted.rows.len(), original.rows.len());
    for (a, b) in crafted.rows.iter().zip(&original.rows) {
        if !changed.contains(&a.id) {
            assert_eq!(a.counts, b.counts, "row {}", a.id);
        }
    }
}

#[test]
fn the_live_path_cuts_hostile_records_without_allocating_by_their_counts() {
    let (path, _) = crafted_recording();
    let read = read_jsonl(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
    let mut cutter =
        prefixscope::cache::blocks::Cutter::new(prefixscope::cache::blocks::BlockModel::default());
    let mut report = input::FileReport::new("live", Format::Recording);
    for record in &read.records {
        if let Some(request) = input::recording::live_request(record, &mut cutter, &mut report) {
            assert!(request.blocks.len() < 1 << 16);
        }
    }
    assert!(report.bad_value_count >= 4);
}

fn have_prlimit() -> bool {
    Command::new("prlimit")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs the binary under the address-space limit; returns (exit code, stdout, stderr).
fn run_bounded(args: &[&str]) -> (i32, String, String) {
    let mut command = if have_prlimit() {
        let mut c = Command::new("prlimit");
        c.arg(ADDRESS_SPACE).arg(BIN);
        c
    } else {
        eprintln!("prlimit is missing: running without the address-space limit");
        Command::new(BIN)
    };
    let out = command
        .args(args)
        .env("XDG_CONFIG_HOME", temp("config"))
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn every_reader_command_survives_hostile_counts_in_a_recording() {
    let (path, _) = crafted_recording();
    let file = path.to_str().unwrap();
    let export = temp("crafted.mooncake.jsonl");
    let _ = std::fs::remove_file(&export);
    for args in [
        vec!["profile", file],
        vec!["analyze", file],
        vec!["replay", "--headless", "--instant", file],
        vec![
            "export",
            file,
            "--to",
            "mooncake",
            "-o",
            export.to_str().unwrap(),
        ],
    ] {
        let (code, stdout, stderr) = run_bounded(&args);
        assert_eq!(code, 0, "{args:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        if args[0] == "profile" {
            assert!(stdout.contains("bad values: "), "{stdout}");
            assert!(stderr.contains("bad value:"), "{stderr}");
        }
        if args[0] == "export" {
            assert!(
                stderr.contains("implausible server counts ignored"),
                "{stderr}"
            );
        }
    }
    assert!(std::fs::read_to_string(&export).unwrap().lines().count() > 0);
}

#[test]
fn a_trace_row_past_every_context_window_is_a_bad_row_and_the_rest_is_read() {
    let path = temp("crafted.mooncake.trace.jsonl");
    std::fs::write(
        &path,
        "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}\n\
         {\"timestamp\": 1, \"input_length\": 1000000000000, \"output_length\": 5, \"hash_ids\": [1, 2]}\n\
         {\"timestamp\": 2, \"input_length\": 18446744073709551615, \"output_length\": 5, \"hash_ids\": [1]}\n\
         {\"timestamp\": 3, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [1, 2]}\n",
    )
    .unwrap();
    let file = path.to_str().unwrap();
    let (code, stdout, stderr) = run_bounded(&["profile", file]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stdout.contains("2 requests"), "{stdout}");
    assert!(
        stderr.contains(":2: input_length 1000000000000 is past"),
        "{stderr}"
    );
    assert!(stderr.contains(":3: input_length"), "{stderr}");
    let export = temp("crafted.trace.out.jsonl");
    let _ = std::fs::remove_file(&export);
    let (code, stdout, stderr) = run_bounded(&[
        "export",
        file,
        "--to",
        "mooncake",
        "-o",
        export.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(std::fs::read_to_string(&export).unwrap().lines().count(), 2);
}
