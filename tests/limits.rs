//! Hostile numbers are normal input: a token count past every context window, from a server or a
//! file, is a counted bad value on its record, never an allocation (issue #17, item 1). The
//! binaries run under a 2 GiB address-space limit (`prlimit --as`), so an allocation sized by
//! such a count fails the test instead of the machine.

use std::path::{Path, PathBuf};
use std::process::Command;

use prefixscope_core::analysis::{Config, analyze};
use prefixscope_core::input::{self, Format, InputOptions};
use prefixscope_core::record::read_jsonl;
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
        prefixscope_core::cache::Cutter::new(prefixscope_core::cache::BlockModel::default());
    let mut report = input::FileReport::new("live", Format::Recording);
    for record in &read.records {
        if let Some(request) = input::live_request(record, &mut cutter, &mut report) {
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
/// `export FILE --to mooncake -o OUT`: the exporter among every reader a limit is tried on.
fn export_args<'a>(file: &'a str, out: &'a std::path::Path) -> Vec<&'a str> {
    let out = out.to_str().unwrap();
    vec!["export", file, "--to", "mooncake", "-o", out]
}

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
        export_args(file, &export),
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
    let (code, stdout, stderr) = run_bounded(&export_args(file, &export));
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert_eq!(std::fs::read_to_string(&export).unwrap().lines().count(), 2);
}

// Lines past `MAX_LINE_BYTES` (issue #17, item 9): a counted bad line with a clear error, read
// without being held, gzipped or not; the rest of the file read.

/// `n` MiB of `byte`, gzipped as `n` copies of one member (MultiGzDecoder reads them as one
/// stream): a small file that unpacks to a line of any length.
fn gzip_run(byte: u8, mib: usize) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(&vec![byte; 1 << 20]).unwrap();
    let member = encoder.finish().unwrap();
    member.repeat(mib)
}

fn gzip(text: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(text).unwrap();
    encoder.finish().unwrap()
}

/// A recording, gzipped: a good record, a line of `mib` MiB, the good records of the source.
fn recording_with_a_long_line(mib: usize) -> PathBuf {
    let text = std::fs::read(source()).unwrap();
    let first_end = text.iter().position(|&b| b == b'\n').unwrap() + 1;
    let mut bytes = gzip(&text[..first_end]);
    bytes.extend(gzip(b"{\"v\":1,\"id\":999999,\"note\":\""));
    bytes.extend(gzip_run(b'a', mib));
    bytes.extend(gzip(b"\"}\n"));
    bytes.extend(gzip(&text[first_end..]));
    let path = temp(&format!("long-line-{mib}.jsonl.gz"));
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn a_line_past_the_bound_is_a_bad_line_in_every_reader_command_and_the_rest_is_read() {
    // 1.2 GiB unpacked for `profile`: held whole, it needed a 2 GiB buffer (the address space
    // is 2 GiB). 100 MiB for the others (each unpacks the file once or twice).
    let huge = recording_with_a_long_line(1200);
    let long = recording_with_a_long_line(100);
    let records = source_records();
    let export = temp("long-line.mooncake.jsonl");
    let _ = std::fs::remove_file(&export);
    let (huge, long) = (huge.to_str().unwrap(), long.to_str().unwrap());
    for args in [
        vec!["profile", huge],
        vec!["analyze", long],
        vec!["records", long],
        export_args(long, &export),
    ] {
        let (code, stdout, stderr) = run_bounded(&args);
        assert_eq!(code, 0, "{args:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        assert!(stderr.contains(":2: line of "), "{args:?}: {stderr}");
        assert!(
            stderr.contains("bytes is past the 64 MiB line bound (skipped)"),
            "{args:?}: {stderr}"
        );
        if args[0] == "records" {
            assert!(
                stdout.contains(&format!("{records} records in 1 file(s), 1 bad lines")),
                "{stdout}"
            );
        }
    }
    assert!(std::fs::read_to_string(&export).unwrap().lines().count() > 0);
}

fn source_records() -> usize {
    std::fs::read_to_string(source()).unwrap().lines().count()
}

#[test]
fn replay_skips_a_line_past_the_bound() {
    // replay reads recordings unzipped: a plain file with a 65 MiB line.
    let text = std::fs::read_to_string(source()).unwrap();
    let mut bytes = format!("{{\"v\":1,\"note\":\"{}\"}}\n", "a".repeat(65 << 20)).into_bytes();
    bytes.extend(text.as_bytes());
    let path = temp("long-line-plain.jsonl");
    std::fs::write(&path, bytes).unwrap();
    let (code, stdout, stderr) =
        run_bounded(&["replay", "--headless", "--instant", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stderr.contains(":1: line of ") && stderr.contains("is past the 64 MiB line bound"),
        "{stderr}"
    );
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with('#')).count(),
        source_records(),
        "{stdout}"
    );
}

#[test]
fn a_trace_row_of_millions_of_hash_ids_or_a_long_line_is_a_bad_row() {
    let ids = vec!["7"; 3_000_000].join(",");
    let mut text = String::new();
    text.push_str(
        "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}\n",
    );
    text.push_str(&format!(
        "{{\"timestamp\": 1, \"input_length\": 1000, \"output_length\": 5, \"hash_ids\": [{ids}]}}\n"
    ));
    let mut bytes = gzip(text.as_bytes());
    bytes.extend(gzip(b"{\"timestamp\": 2, \"hash_ids\": [1"));
    bytes.extend(gzip_run(b'0', 100));
    bytes.extend(gzip(b"]}\n{\"timestamp\": 3, \"input_length\": 700, \"output_length\": 5, \"hash_ids\": [1, 2]}\n"));
    let path = temp("ids.mooncake.jsonl.gz");
    std::fs::write(&path, bytes).unwrap();
    let file = path.to_str().unwrap();
    for args in [
        vec!["profile", file],
        vec!["replay", "--headless", "--instant", file],
    ] {
        let (code, stdout, stderr) = run_bounded(&args);
        assert_eq!(code, 0, "{args:?}\n{stdout}\n{stderr}");
        assert!(
            stderr.contains(":2: more than 1048576 hash ids in one row"),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains(":3: line of "), "{args:?}: {stderr}");
        if args[0] == "profile" {
            assert!(stdout.contains("2 requests"), "{stdout}");
        }
    }
}

#[test]
fn a_gateway_log_record_past_the_bound_is_a_bad_row_and_the_rest_is_read() {
    let body = |text: &str| {
        format!(
            "\"{{\"\"model\"\":\"\"glm-5\"\",\"\"messages\"\":[{{\"\"role\"\":\"\"user\"\",\"\"content\"\":\"\"{text}\"\"}}]}}\""
        )
    };
    let mut bytes = gzip(
        format!(
            "timestamp,request_json,status_code\n1,{},200\n2,\"{{\"\"messages\"\": \"\"",
            body("first")
        )
        .as_bytes(),
    );
    // A quoted field of 100 MiB, newlines inside.
    bytes.extend(gzip_run(b'\n', 100));
    bytes.extend(gzip(
        format!("\"\"}}\",200\n3,{},200\n", body("third")).as_bytes(),
    ));
    let path = temp("long.csv.gz");
    std::fs::write(&path, bytes).unwrap();
    let (code, stdout, stderr) = run_bounded(&["profile", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(stderr.contains(":3: line of "), "{stderr}");
    assert!(stderr.contains("is past the 64 MiB line bound"), "{stderr}");
    assert!(stdout.contains("2 requests"), "{stdout}");
}

/// Tiny values cost every reader a bounded amount, each finishing under the 2 GiB address
/// space (analyze, profile, replay and whatif took 2.4 to 4.6 GB on an 8 MiB line before the
/// bounds): a record of 1.5 million messages (a 3 MiB line) is counted "too large to analyse";
/// a line of 4 million values (8 MiB) is a bad line, too many values to read.
#[test]
fn a_line_of_tiny_values_is_too_large_to_analyse_and_costs_little() {
    let real = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("recordings/llmp/llama.cpp/session.jsonl"),
    )
    .unwrap();
    let line = |messages: usize| {
        let mut record: serde_json::Value = serde_json::from_str(
            real.lines()
                .find(|l| l.contains("/v1/chat/completions"))
                .unwrap(),
        )
        .unwrap();
        record["request"]["body"] =
            serde_json::json!({"model": "m", "messages": vec![0u8; messages]});
        format!("{record}\n")
    };
    let many = temp("tiny-values-many.jsonl");
    std::fs::write(&many, line(1_500_000)).unwrap();
    let (code, stdout, stderr) = run_bounded(&["analyze", "--json", many.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["coverage"]["skipped"]["too_large"], 1, "{stdout}");
    let too_many = temp("tiny-values-too-many.jsonl");
    std::fs::write(&too_many, line(4 << 20)).unwrap();
    let (code, _, stderr) = run_bounded(&["analyze", too_many.to_str().unwrap()]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("JSON values: too many to read"), "{stderr}");
    for file in [&many, &too_many] {
        let file = file.to_str().unwrap();
        let export = temp("tiny-values.mooncake.jsonl");
        let _ = std::fs::remove_file(&export);
        for args in [
            vec!["profile", file],
            vec!["replay", "--headless", "--instant", file],
            vec!["whatif", file],
            export_args(file, &export),
        ] {
            let (code, _, stderr) = run_bounded(&args);
            assert!(code == 0 || code == 1, "{args:?}: {code}\n{stderr}");
            assert!(!stderr.contains("memory allocation"), "{args:?}: {stderr}");
        }
    }
}
