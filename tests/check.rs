//! `prefixscope check`, the guard for CI, on real recordings: a recording that loses a third of
//! its prefill to evictions fails `--max-lost 10%` and names the fix; one that loses nothing
//! passes; against a baseline, a new cause fails; input it cannot judge exits 2.

use std::path::PathBuf;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");

fn recording(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("recordings")
        .join(name)
}

fn check(args: &[&str]) -> Output {
    Command::new(BIN).arg("check").args(args).output().unwrap()
}

fn path(name: &str) -> String {
    recording(name).display().to_string()
}

#[test]
fn a_recording_that_loses_too_much_fails_and_names_the_fix() {
    let out = check(&[
        &path("llmp/llama.cpp/parallel-nocache.jsonl"),
        "--max-lost",
        "10%",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL, over --max-lost 10%"), "{stdout}");
    assert!(stdout.contains("more conversations than slots"), "{stdout}");
    // The same losses by time: a share of the prefill seconds.
    let out = check(&[
        &path("llmp/llama.cpp/parallel-nocache.jsonl"),
        "--max-lost",
        "90",
        "--by",
        "time",
    ]);
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn a_recording_that_loses_nothing_passes() {
    let out = check(&[
        &path("xllamacpp/scenarios/append.jsonl"),
        "--max-lost",
        "1%",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    assert!(stdout.starts_with("lost 0.0% of the prefill"), "{stdout}");
}

#[test]
fn a_cause_the_baseline_did_not_have_fails() {
    let dir = std::env::temp_dir().join(format!("prefixscope-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let baseline = dir.join("baseline.json");
    // The baseline: the same agents with the host cache on, which lost only to a system
    // prompt change.
    let analyzed = Command::new(BIN)
        .args(["analyze", "--json"])
        .arg(recording("llmp/llama.cpp/parallel.jsonl"))
        .output()
        .unwrap();
    assert!(analyzed.status.success());
    std::fs::write(&baseline, &analyzed.stdout).unwrap();
    let baseline = baseline.display().to_string();

    let same = check(&[
        &path("llmp/llama.cpp/parallel.jsonl"),
        "--baseline",
        &baseline,
    ]);
    assert_eq!(
        same.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&same.stdout)
    );

    let out = check(&[
        &path("llmp/llama.cpp/parallel-nocache.jsonl"),
        "--baseline",
        &baseline,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("other_conversation: ") && stdout.contains("FAIL, a new cause"),
        "{stdout}"
    );
    assert!(stdout.contains("more conversations than slots"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn input_it_cannot_judge_exits_2() {
    // Nothing to check against.
    let out = check(&[&path("llmp/llama.cpp/parallel.jsonl")]);
    assert_eq!(out.status.code(), Some(2));
    // A file that is not there.
    let out = check(&["/nonexistent/recording.jsonl", "--max-lost", "10%"]);
    assert_eq!(out.status.code(), Some(2));
    // A digest recording of Ollama's native API: no reuse reported, so no loss measured.
    let out = check(&[&path("llmp/ollama/session.jsonl"), "--max-lost", "10%"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("loss not measured"), "{stderr}");
}
