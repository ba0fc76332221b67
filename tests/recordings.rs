//! The recording format against real recordings nobody here wrote (llmp's fixtures): read
//! unchanged, written back byte for byte, digests equal to llmp's own digest-mode recording.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use prefixscope_core::normalize::digest::apply_digest;
use prefixscope_core::record::{Record, read_jsonl, record_line};

const REAL: [&str; 7] = [
    "recordings/xllamacpp/session.jsonl",
    "recordings/xllamacpp/session.digest.jsonl",
    "recordings/llmp/llama.cpp/session.jsonl",
    "recordings/llmp/llama.cpp/session.digest.jsonl",
    "recordings/llmp/llama.cpp/parallel.jsonl",
    "recordings/llmp/llama.cpp/parallel-nocache.jsonl",
    "recordings/llmp/ollama/session.jsonl",
];

fn path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn read(relative: &str) -> (String, Vec<Record>) {
    let text = std::fs::read_to_string(path(relative)).unwrap();
    let result = read_jsonl(text.as_bytes());
    assert!(
        result.bad_lines.is_empty(),
        "{relative}: {:?}",
        result.bad_lines
    );
    (text, result.records)
}

#[test]
fn real_recordings_read_unchanged_and_write_back_byte_for_byte() {
    let mut files = REAL.to_vec();
    files.push("recordings/llmp/ollama-openai/session.jsonl");
    for file in files {
        let (text, records) = read(file);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(records.len(), lines.len(), "{file}");
        let by_id: BTreeMap<u64, &str> = records
            .iter()
            .map(|r| r.id)
            .zip(lines.iter().copied())
            .collect();
        assert_eq!(by_id.len(), records.len(), "{file}: duplicate ids");
        for line in &lines {
            let record = &read_jsonl(line.as_bytes()).records[0];
            let written = String::from_utf8(record_line(record)).unwrap();
            assert_eq!(
                written.trim_end(),
                *line,
                "{file}: record {} changed on the way through",
                record.id
            );
        }
    }
}

/// llmp's pair (its digest proxy in front of its full one) and ours (the same with prefixscope,
/// in front of a real llama.cpp server, OpenAI and Anthropic APIs).
#[test]
fn the_digest_of_a_full_recording_equals_the_digest_recording_of_the_same_traffic() {
    digest_pair(
        "recordings/llmp/llama.cpp/session.jsonl",
        "recordings/llmp/llama.cpp/session.digest.jsonl",
    );
    digest_pair(
        "recordings/xllamacpp/session.jsonl",
        "recordings/xllamacpp/session.digest.jsonl",
    );
}

fn digest_pair(full: &str, digest: &str) {
    let (_, full) = read(full);
    let (_, digest) = read(digest);
    assert_eq!(full.len(), digest.len());
    for (mut ours, theirs) in full.into_iter().zip(digest) {
        apply_digest(&mut ours);
        // A field added since the digest recording was made: absent there, not compared.
        if let (Some(ours), Some(theirs)) = (ours.request.digest.as_mut(), &theirs.request.digest)
            && theirs.params.cache_marks.is_none()
        {
            ours.params.cache_marks = None;
        }
        assert_eq!(
            ours.request.digest, theirs.request.digest,
            "request digest of record {}",
            ours.id
        );
        let ours_response = ours.response.as_ref().and_then(|r| r.digest.clone());
        let theirs_response = theirs.response.as_ref().and_then(|r| r.digest.clone());
        assert_eq!(
            ours_response, theirs_response,
            "response digest of record {}",
            ours.id
        );
    }
}

#[test]
fn a_damaged_real_recording_reports_each_bad_line_and_keeps_the_rest() {
    let text = std::fs::read_to_string(path("recordings/llmp/llama.cpp/session.jsonl")).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    let total = lines.len();
    lines.insert(2, "this is not json".into());
    lines[4] = lines[4].replacen("\"v\":1", "\"v\":9", 1);
    let last = lines.pop().unwrap();
    lines.push(last[..last.len() / 2].to_string());
    let damaged = lines.join("\n");
    let result = read_jsonl(damaged.as_bytes());
    let bad: Vec<usize> = result.bad_lines.iter().map(|b| b.line).collect();
    assert_eq!(bad, vec![3, 5, total + 1]);
    assert!(result.bad_lines[1].error.contains("version 9"));
    assert!(result.bad_lines[2].error.contains("truncated"));
    assert_eq!(result.records.len(), total - 2);
}

/// What prefixscope writes, llmp reads: run `llmp analyze` on our output when llmp is installed.
#[test]
fn llmp_reads_what_we_write() {
    let Some(llmp) = find_llmp() else {
        eprintln!("SKIPPED llmp_reads_what_we_write: `llmp` is not installed (cargo install llmp)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("prefixscope-llmp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut sources: Vec<PathBuf> = REAL.iter().map(|f| path(f)).collect();
    let ours = path("recordings/xllamacpp");
    if let Ok(entries) = std::fs::read_dir(&ours) {
        sources.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "jsonl")),
        );
    }
    for source in sources {
        let records = read_jsonl(std::fs::read(&source).unwrap().as_slice()).records;
        let out = dir.join(source.file_name().unwrap());
        let bytes: Vec<u8> = records.iter().flat_map(record_line).collect();
        std::fs::write(&out, bytes).unwrap();
        let output = std::process::Command::new(&llmp)
            .arg("analyze")
            .arg("--json")
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "llmp analyze {}: {}",
            out.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(
            report["coverage"]["records"],
            records.len(),
            "{}",
            source.display()
        );
        assert_eq!(report["coverage"]["bad_lines"], 0, "{}", source.display());
    }
}

fn find_llmp() -> Option<PathBuf> {
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin/llmp"));
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("llmp"))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    on_path.into_iter().chain(home).find(|p| p.is_file())
}
