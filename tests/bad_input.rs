//! Issue #15: bad input is never silent. Each case: the exit code and the message that names
//! the line, the field or the format, and what was expected.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");

fn dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prefixscope-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir().join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn run(args: &[&str], path: &Path) -> (i32, String, String) {
    let output: Output = Command::new(BIN).args(args).arg(path).output().unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).to_string(),
        String::from_utf8_lossy(&output.stderr).to_string(),
    )
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

#[test]
fn a_truncated_gzip_is_an_error_with_its_byte_offset_after_the_rows_before_it() {
    let log = std::fs::read(repo("tests/data/gateway-logs/pydantic-ai-cassettes.csv.gz")).unwrap();
    let cut = file("cut.csv.gz", &log[..3000]);
    let (code, out, err) = run(&["profile"], &cut);
    assert_eq!(code, 1, "{err}");
    assert!(out.starts_with("23 requests · csv"), "{out}");
    assert!(
        err.contains("corrupt or truncated gzip at compressed byte 3000"),
        "{err}"
    );
    assert!(
        err.contains("the 23 requests before it are profiled"),
        "{err}"
    );
    // A recording cut the same way: analyze reads what came before, and fails.
    let recording = std::fs::read(repo("recordings/llmp/llama.cpp/parallel.jsonl")).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &recording).unwrap();
    let gz = gz.finish().unwrap();
    let cut = file("cut.jsonl.gz", &gz[..gz.len() / 2]);
    let (code, _, err) = run(&["analyze"], &cut);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("corrupt or truncated gzip at compressed byte"),
        "{err}"
    );
    assert!(err.contains("records before it are read"), "{err}");
}

#[test]
fn a_weka_file_is_unknown_and_forced_as_mooncake_says_why_nothing_came_out() {
    let weka = file(
        "weka.json",
        br#"{"id": "c1", "requests": [{"input_length": 10, "output_length": 2}]}
"#,
    );
    let (code, _, err) = run(&["profile"], &weka);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("cannot tell the format; give --format"),
        "{err}"
    );
    let (code, out, err) = run(&["profile", "--format", "mooncake"], &weka);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("no request: read as a Mooncake trace (--format mooncake); 1 skipped: no hash_ids; its rows hold a list of requests, as a WEKA trace does"),
        "{err}"
    );
}

/// A WEKA trace as prefixscope writes it (its requests carry hash ids, so it is told a Mooncake
/// trace): nothing comes out, and the message says why and what it looks like.
#[test]
fn our_own_weka_export_given_to_profile_says_what_it_is() {
    let weka = dir().join("export.weka.jsonl");
    let output = Command::new(BIN)
        .args(["export", "--to", "weka", "--salt-file"])
        .arg(dir().join("salt"))
        .arg("-o")
        .arg(&weka)
        .arg(repo("recordings/llmp/llama.cpp/parallel.jsonl"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (code, out, err) = run(&["profile"], &weka);
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty(), "{out}");
    assert!(
        err.contains("no request: read as a Mooncake trace (--format mooncake)"),
        "{err}"
    );
    assert!(err.contains("as a WEKA trace does"), "{err}");
}

#[test]
fn a_tab_separated_log_is_an_error_that_says_so() {
    let tsv = file(
        "log.tsv",
        b"timestamp\trequest_json\n1\t{\"messages\":[]}\n",
    );
    let (code, _, err) = run(&["profile", "--format", "csv"], &tsv);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("line 1: no request_json column"), "{err}");
    assert!(err.contains("its header is tab-separated"), "{err}");
    // `analyze` tells it a log by its request_json column, and says the same.
    let (code, _, err) = run(&["analyze"], &tsv);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no request: read as a gateway log"), "{err}");
    assert!(err.contains("its header is tab-separated"), "{err}");
}

#[test]
fn skipped_rows_are_counted_in_the_text_summary() {
    let trace = file(
        "nohash.jsonl",
        b"{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 5, \"hash_ids\": [1, 2]}\n\
          {\"timestamp\": 1, \"input_length\": 50, \"output_length\": 5}\n",
    );
    let (code, out, err) = run(&["profile"], &trace);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("skipped in "), "{out}");
    assert!(out.contains("nohash.jsonl: no hash_ids 1"), "{out}");
}

#[test]
fn a_line_that_is_not_json_and_a_missing_field_are_named() {
    let trace = file(
        "mixed.jsonl",
        b"{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 5, \"hash_ids\": [1, 2]}\n\
          not json\n\
          {\"timestamp\": 1, \"input_tokens\": 50, \"output_length\": 5, \"hash_ids\": [1]}\n\
          {\"timestamp\": 2, \"input_length\": -3, \"output_length\": 5, \"hash_ids\": [1]}\n",
    );
    let (code, _, err) = run(&["profile"], &trace);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("mixed.jsonl:2: not a JSON object (expected ident"),
        "{err}"
    );
    assert!(
        err.contains(
            "mixed.jsonl:3: no input_length (the prompt's tokens); did you mean input_tokens?"
        ),
        "{err}"
    );
    assert!(
        err.contains("mixed.jsonl:4: input_length -3 must be a positive integer"),
        "{err}"
    );
}

#[test]
fn analyze_of_a_trace_says_what_reads_it() {
    let (code, out, err) = run(
        &["analyze"],
        &repo("tests/data/mooncake/conversation_trace.jsonl.gz"),
    );
    assert_eq!(code, 1, "{err}");
    assert!(out.is_empty() || out.contains("0 requests"), "{out}");
    assert!(
        err.contains("is a Mooncake trace (--format mooncake): it holds token counts and hash ids, not the messages this reads"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "one line, not one per row: {err}");
}

/// `replay` reads a gzipped recording as every other reader does: the same lines and summary
/// as the plain file, no bad line.
#[test]
fn a_gzipped_recording_replays_as_the_plain_one() {
    let plain = repo("recordings/llmp/llama.cpp/parallel-nocache.jsonl");
    let recording = std::fs::read(&plain).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &recording).unwrap();
    let gzipped = file("parallel-nocache.jsonl.gz", &gz.finish().unwrap());
    let args = ["replay", "--headless", "--instant"];
    let (code, out, err) = run(&args, &plain);
    let (gz_code, gz_out, gz_err) = run(&args, &gzipped);
    assert_eq!((code, gz_code), (0, 0), "{err}\n{gz_err}");
    assert!(
        !gz_out.contains("bad line") && !gz_err.contains("bad line"),
        "{gz_err}"
    );
    assert!(out.contains("8,604"), "{out}");
    assert_eq!(gz_out, out);
}

/// Every command exits 1 when nothing of a non-empty input could be used (an empty file stays a
/// warning, exit 0); `export` then leaves its target as it was.
#[test]
fn nothing_usable_is_exit_1_for_every_reader_and_export_writes_nothing() {
    let bad = file(
        "all-bad-trace.jsonl",
        b"{\"timestamp\":\"x\",\"input_length\":\"a\",\"output_length\":1,\"hash_ids\":\"q\"}\n{\"timestamp\":\"x\",\"input_length\":\"a\",\"output_length\":1,\"hash_ids\":\"q\"}\n",
    );
    let bad_lines = file("all-bad-lines.jsonl", b"{\"v\":7}\nnot json\n");
    let empty = file("empty.jsonl", b"");
    for (args, input) in [
        (&["replay", "--headless", "--instant"][..], &bad),
        (&["replay", "--headless", "--instant"], &bad_lines),
        (&["records"], &bad_lines),
        (&["analyze"], &bad_lines),
        (&["profile"], &bad),
    ] {
        let (code, _, err) = run(args, input);
        assert_eq!(code, 1, "{args:?} {input:?}: {err}");
    }
    for args in [
        &["replay", "--headless", "--instant"][..],
        &["records"],
        &["analyze"],
    ] {
        let (code, _, err) = run(args, &empty);
        assert_eq!(code, 0, "{args:?}: {err}");
    }
    let target = dir().join("trace.jsonl");
    std::fs::write(&target, "yesterday's trace\n").unwrap();
    let output = Command::new(BIN)
        .args(["export", "--to", "mooncake", "-o"])
        .arg(&target)
        .arg(&bad)
        .env("XDG_CONFIG_HOME", dir().join("config"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{err}");
    assert!(
        err.contains("nothing in the input could be exported"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "yesterday's trace\n"
    );
}
