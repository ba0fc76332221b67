//! Files prefixscope writes (issue #17, item 6): every whole-file output is private (0600),
//! replaces a symlink instead of writing through it, refuses the input's own inode (hard links
//! included) and leaves an existing file as it was when the write fails; recordings are always
//! new files, and rotation never writes into an earlier run's file.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");

fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prefixscope-files-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn recording(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("recordings")
        .join(name)
}

fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .output()
        .unwrap()
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o777
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect()
}

/// The commands with a whole-file `-o`, each given its input and the output path.
fn commands(input: &Path, out: &Path) -> Vec<Vec<String>> {
    let (i, o) = (input.display().to_string(), out.display().to_string());
    [
        vec!["records", &i, "-o", &o],
        vec!["analyze", &i, "-o", &o],
        vec!["profile", &i, "-o", &o],
        vec!["export", &i, "--to", "mooncake", "-o", &o],
        vec!["export", &i, "--to", "otel", "-o", &o],
    ]
    .into_iter()
    .map(|args| args.into_iter().map(str::to_string).collect())
    .collect()
}

#[test]
fn whole_file_outputs_are_private_and_replace_an_old_file_or_a_symlink() {
    let dir = dir("outputs");
    let input = dir.join("session.jsonl");
    std::fs::copy(recording("llmp/llama.cpp/session.jsonl"), &input).unwrap();
    let victim = dir.join("victim.txt");
    for (n, args) in commands(&input, &dir.join("placeholder"))
        .into_iter()
        .enumerate()
    {
        // `.json`: analyze and profile write their page beside it (`out-N.html`).
        let out = dir.join(format!("out-{n}.json"));
        let args: Vec<String> = args
            .into_iter()
            .map(|a| {
                if a.ends_with("placeholder") {
                    out.display().to_string()
                } else {
                    a
                }
            })
            .collect();
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        // New: 0600.
        let result = run(&dir, &argv);
        assert_eq!(
            result.status.code(),
            Some(0),
            "{argv:?}: {}",
            stderr(&result)
        );
        assert_eq!(mode(&out), 0o600, "{argv:?}");
        if argv[0] == "analyze" || argv[0] == "profile" {
            assert_eq!(mode(&out.with_extension("html")), 0o600, "{argv:?}");
        }
        let written = std::fs::read(&out).unwrap();
        assert!(!written.is_empty());
        // An old 0644 file: replaced, 0600.
        std::fs::write(&out, "old").unwrap();
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o644)).unwrap();
        let result = run(&dir, &argv);
        assert_eq!(
            result.status.code(),
            Some(0),
            "{argv:?}: {}",
            stderr(&result)
        );
        assert_eq!(mode(&out), 0o600, "{argv:?}");
        assert_eq!(
            std::fs::read(&out).unwrap().len(),
            written.len(),
            "{argv:?}"
        );
        // A symlink to an unrelated 0644 file: the link is replaced, the file untouched.
        std::fs::remove_file(&out).unwrap();
        std::fs::write(&victim, "not yours\n").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&victim, &out).unwrap();
        let result = run(&dir, &argv);
        assert_eq!(
            result.status.code(),
            Some(0),
            "{argv:?}: {}",
            stderr(&result)
        );
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "not yours\n",
            "{argv:?}"
        );
        assert_eq!(mode(&victim), 0o644);
        assert!(
            !std::fs::symlink_metadata(&out).unwrap().is_symlink(),
            "{argv:?}"
        );
        assert_eq!(mode(&out), 0o600, "{argv:?}");
    }
    assert!(temporaries(&dir).is_empty(), "{:?}", temporaries(&dir));
}

#[test]
fn an_output_that_is_the_input_a_hard_link_or_a_symlink_to_it_is_refused() {
    let dir = dir("inputs");
    let input = dir.join("session.jsonl");
    std::fs::copy(recording("llmp/llama.cpp/session.jsonl"), &input).unwrap();
    let original = std::fs::read(&input).unwrap();
    let hard = dir.join("hard.jsonl");
    std::fs::hard_link(&input, &hard).unwrap();
    let soft = dir.join("soft.jsonl");
    std::os::unix::fs::symlink(&input, &soft).unwrap();
    for out in [&input, &hard, &soft] {
        for args in commands(&input, out) {
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let result = run(&dir, &argv);
            assert_eq!(
                result.status.code(),
                Some(2),
                "{argv:?}: {}",
                stderr(&result)
            );
            assert!(
                stderr(&result).contains("is one of the inputs"),
                "{}",
                stderr(&result)
            );
            assert_eq!(std::fs::read(&input).unwrap(), original, "{argv:?}");
        }
    }
    assert!(temporaries(&dir).is_empty());
}

#[test]
fn a_failed_export_leaves_the_existing_file_as_it_was() {
    let dir = dir("failed");
    let out = dir.join("spans.jsonl");
    std::fs::write(&out, "yesterday's export\n").unwrap();
    // A digest recording cannot be exported as otel: found while reading, after the output
    // was opened.
    let digest = recording("llmp/llama.cpp/session.digest.jsonl");
    let result = run(
        &dir,
        &[
            "export",
            digest.to_str().unwrap(),
            "--to",
            "otel",
            "-o",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(result.status.code(), Some(2), "{}", stderr(&result));
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "yesterday's export\n"
    );
    assert!(temporaries(&dir).is_empty());
    // A directory that does not exist: exit 1, nothing created.
    let result = run(
        &dir,
        &[
            "analyze",
            digest.to_str().unwrap(),
            "-o",
            dir.join("missing/report.json").to_str().unwrap(),
        ],
    );
    assert_eq!(result.status.code(), Some(1), "{}", stderr(&result));
    assert!(
        stderr(&result).contains("cannot write"),
        "{}",
        stderr(&result)
    );
}

#[test]
fn the_tui_export_replaces_a_symlink_and_refuses_the_recording() {
    let dir = dir("tui-export");
    let input = dir.join("session.jsonl");
    std::fs::copy(recording("llmp/llama.cpp/session.jsonl"), &input).unwrap();
    let salt = dir.join("salt");
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "keep\n").unwrap();
    let out = dir.join("prefixscope-mooncake.jsonl");
    std::os::unix::fs::symlink(&victim, &out).unwrap();
    let export = |path: &Path| {
        prefixscope::session::export::export_files_salted(
            std::slice::from_ref(&input),
            "mooncake",
            path.to_str().unwrap(),
            &salt,
        )
    };
    let said = export(&out).unwrap();
    assert!(said.contains("exported"), "{said}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
    assert_eq!(mode(&out), 0o600);
    let hard = dir.join("hard.jsonl");
    std::fs::hard_link(&input, &hard).unwrap();
    let original = std::fs::read(&input).unwrap();
    for path in [&input, &hard] {
        let error = export(path).unwrap_err();
        assert!(error.contains("is one of the inputs"), "{error}");
    }
    assert_eq!(std::fs::read(&input).unwrap(), original);
    assert!(temporaries(&dir).is_empty());
}

#[test]
fn a_recording_is_always_a_new_file() {
    let dir = dir("record");
    let record = |out: &Path, extra: &[&str]| {
        let mut args = vec![
            "record",
            "--upstream",
            "http://127.0.0.1:9",
            "--listen",
            "127.0.0.1:0",
            "-o",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        run(&dir, &args)
    };
    // An existing empty 0644 file (it would have kept its mode).
    let empty = dir.join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    std::fs::set_permissions(&empty, std::fs::Permissions::from_mode(0o644)).unwrap();
    let result = record(&empty, &[]);
    assert_eq!(result.status.code(), Some(2), "{}", stderr(&result));
    assert!(
        stderr(&result).contains("already exists"),
        "{}",
        stderr(&result)
    );
    // A symlink to an unrelated file.
    let victim = dir.join("victim.txt");
    std::fs::write(&victim, "keep\n").unwrap();
    let link = dir.join("link.jsonl");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let result = record(&link, &[]);
    assert_eq!(result.status.code(), Some(2), "{}", stderr(&result));
    assert!(stderr(&result).contains("symlink"), "{}", stderr(&result));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
    // An earlier run's rotated file beside a new name, when this run rotates.
    std::fs::write(dir.join("rec.3.jsonl"), "an earlier run\n").unwrap();
    let result = record(&dir.join("rec.jsonl"), &["--max-size", "1M"]);
    assert_eq!(result.status.code(), Some(2), "{}", stderr(&result));
    assert!(
        stderr(&result).contains("rec.3.jsonl exists"),
        "{}",
        stderr(&result)
    );
    assert!(!dir.join("rec.jsonl").exists());
    assert_eq!(
        std::fs::read_to_string(dir.join("rec.3.jsonl")).unwrap(),
        "an earlier run\n"
    );
}
