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

/// The TUI's export never replaces anything: a name that is taken (a symlink, the recording
/// being read, an earlier export) gets the next free numbered name, and what was there is
/// left as it was.
#[test]
fn the_tui_export_never_replaces_what_is_there() {
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
    let second = dir.join("prefixscope-mooncake-2.jsonl");
    assert!(said.contains(&second.display().to_string()), "{said}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep\n");
    assert!(
        std::fs::symlink_metadata(&out)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(mode(&second), 0o600);
    // The same name again: a third file, the second kept.
    let kept = std::fs::read(&second).unwrap();
    let said = export(&out).unwrap();
    assert!(said.contains("prefixscope-mooncake-3.jsonl"), "{said}");
    assert_eq!(std::fs::read(&second).unwrap(), kept);
    // The recording being read (or a hard link to it) is never written over.
    let hard = dir.join("hard.jsonl");
    std::fs::hard_link(&input, &hard).unwrap();
    let original = std::fs::read(&input).unwrap();
    for path in [&input, &hard] {
        let said = export(path).unwrap();
        assert!(said.contains("-2.jsonl"), "{said}");
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

/// A node made in `dir` with mknod(2): a character device with /dev/null's numbers (1, 3), a
/// FIFO, or a block device; `None` when this user may not make it (devices need root).
fn node(dir: &Path, name: &str, kind: libc::mode_t, device: (u32, u32)) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let path = dir.join(name);
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let dev = libc::makedev(device.0, device.1);
    // SAFETY: a valid NUL-terminated path; mknod reads nothing else of ours.
    let made = unsafe { libc::mknod(c_path.as_ptr(), kind | 0o600, dev) };
    (made == 0).then_some(path)
}

fn is_node(path: &Path, kind: libc::mode_t) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.mode() & libc::S_IFMT == kind)
}

/// Every command that writes a named output, pointed at `out`: the whole-file ones, analyze's
/// metrics file, and a recording (record, whose `-o` is a stream of lines).
fn writing_commands(input: &Path, out: &Path) -> Vec<Vec<String>> {
    let (i, o) = (input.display().to_string(), out.display().to_string());
    let mut all = commands(input, out);
    all.push(
        ["analyze", &i, "--prometheus", &o]
            .map(str::to_string)
            .to_vec(),
    );
    all.push(
        ["export", &i, "--to", "bailian", "-o", &o]
            .map(str::to_string)
            .to_vec(),
    );
    all
}

/// Reads a FIFO to its end on a thread of its own (a writer's open waits for a reader).
fn drain(fifo: &Path) -> std::thread::JoinHandle<Vec<u8>> {
    let fifo = fifo.to_path_buf();
    std::thread::spawn(move || std::fs::read(&fifo).unwrap_or_default())
}

#[test]
fn a_device_or_a_fifo_is_written_as_it_is_never_replaced() {
    let dir = dir("nodes");
    let input = dir.join("session.jsonl");
    std::fs::copy(recording("llmp/llama.cpp/session.jsonl"), &input).unwrap();
    let device = node(&dir, "null", libc::S_IFCHR, (1, 3));
    if device.is_none() {
        eprintln!("not root: the character device half is not run (mknod refused)");
    }
    let fifo = node(&dir, "fifo", libc::S_IFIFO, (0, 0)).expect("mkfifo");
    for args in writing_commands(&input, Path::new("OUT")) {
        if let Some(device) = &device {
            let argv: Vec<String> = args
                .iter()
                .map(|a| a.replace("OUT", device.to_str().unwrap()))
                .collect();
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            let result = run(&dir, &argv);
            assert_eq!(
                result.status.code(),
                Some(0),
                "{argv:?}: {}",
                stderr(&result)
            );
            assert!(
                is_node(device, libc::S_IFCHR),
                "{argv:?} replaced the device"
            );
        }
        let argv: Vec<String> = args
            .iter()
            .map(|a| a.replace("OUT", fifo.to_str().unwrap()))
            .collect();
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let reader = drain(&fifo);
        let result = run(&dir, &argv);
        let read = reader.join().unwrap();
        assert_eq!(
            result.status.code(),
            Some(0),
            "{argv:?}: {}",
            stderr(&result)
        );
        assert!(is_node(&fifo, libc::S_IFIFO), "{argv:?} replaced the FIFO");
        assert!(!read.is_empty(), "{argv:?} wrote nothing into the FIFO");
        if argv[0] == "analyze" && argv[2] == "-o" || argv[0] == "profile" {
            // The JSON report itself, and no page beside a FIFO.
            let report: serde_json::Value = serde_json::from_slice(&read).unwrap();
            assert!(report.is_object(), "{argv:?}");
        }
    }
    // Nothing was made beside them (the export's salt aside): no page, no `.json` next to the
    // FIFO, no temporary.
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut expected = vec!["config", "fifo", "session.jsonl"];
    if device.is_some() {
        expected.push("null");
    }
    expected.sort();
    assert_eq!(names, expected);
}

#[test]
fn a_recording_goes_into_a_device_or_fifo_as_it_is() {
    let dir = dir("record-nodes");
    let fifo = node(&dir, "fifo", libc::S_IFIFO, (0, 0)).expect("mkfifo");
    let mut targets = vec![(fifo.clone(), libc::S_IFIFO)];
    if let Some(device) = node(&dir, "null", libc::S_IFCHR, (1, 3)) {
        targets.push((device, libc::S_IFCHR));
    }
    for (target, kind) in targets {
        let reader = (kind == libc::S_IFIFO).then(|| drain(&target));
        let mut child = Command::new(BIN)
            .args([
                "record",
                "--upstream",
                "http://127.0.0.1:9",
                "--listen",
                "127.0.0.1:0",
            ])
            .args(["--no-probe", "-o", target.to_str().unwrap()])
            .current_dir(&dir)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(500));
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait().unwrap();
        if let Some(reader) = reader {
            reader.join().unwrap();
        }
        assert_eq!(status.code(), Some(0), "{target:?}");
        assert!(is_node(&target, kind), "{target:?} replaced");
    }
}

#[test]
fn a_dash_is_stdout_and_the_summary_moves_to_stderr() {
    let dir = dir("dash");
    let input = recording("llmp/llama.cpp/session.jsonl");
    let i = input.to_str().unwrap();
    for argv in [vec!["analyze", i, "-o", "-"], vec!["profile", i, "-o", "-"]] {
        let result = run(&dir, &argv);
        assert_eq!(
            result.status.code(),
            Some(0),
            "{argv:?}: {}",
            stderr(&result)
        );
        let report: serde_json::Value = serde_json::from_slice(&result.stdout)
            .unwrap_or_else(|e| panic!("{argv:?}: stdout is not the report: {e}"));
        assert!(report.is_object());
        assert!(
            !stderr(&result).is_empty(),
            "{argv:?}: the summary went nowhere"
        );
    }
    let result = run(&dir, &["records", i, "-o", "-"]);
    assert_eq!(result.status.code(), Some(0), "{}", stderr(&result));
    let lines = String::from_utf8(result.stdout).unwrap();
    assert!(lines.lines().count() > 1);
    for line in lines.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap();
    }
    // Nothing named `-` was made.
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
}

#[test]
fn a_directory_or_a_block_device_is_refused_untouched() {
    let dir = dir("refused");
    let input = dir.join("session.jsonl");
    std::fs::copy(recording("llmp/llama.cpp/session.jsonl"), &input).unwrap();
    let sub = dir.join("sub.json");
    std::fs::create_dir(&sub).unwrap();
    let mut targets = vec![(sub, "is a directory")];
    // A loop device's numbers; refused before it is opened.
    if let Some(block) = node(&dir, "block", libc::S_IFBLK, (7, 250)) {
        targets.push((block, "is a block device"));
    }
    for (target, said) in &targets {
        for args in writing_commands(&input, target) {
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let result = run(&dir, &argv);
            assert_eq!(
                result.status.code(),
                Some(2),
                "{argv:?}: {}",
                stderr(&result)
            );
            assert!(
                stderr(&result).contains(said),
                "{argv:?}: {}",
                stderr(&result)
            );
        }
    }
    assert!(dir.join("sub.json").is_dir());
    if targets.len() > 1 {
        assert!(is_node(&dir.join("block"), libc::S_IFBLK));
    }
    assert!(temporaries(&dir).is_empty());
}

#[test]
fn an_export_stopped_by_a_signal_leaves_no_temporary_file() {
    use std::io::Write;
    let dir = dir("stopped");
    let input = node(&dir, "input.jsonl", libc::S_IFIFO, (0, 0)).expect("mkfifo");
    let out = dir.join("trace.jsonl");
    let mut child = Command::new(BIN)
        .args(["export", input.to_str().unwrap(), "--to", "mooncake", "-o"])
        .arg(&out)
        .current_dir(&dir)
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The export reads the FIFO and waits for more: its output is open, not yet whole.
    let mut writer = std::fs::OpenOptions::new()
        .write(true)
        .open(&input)
        .unwrap();
    let line = std::fs::read_to_string(recording("llmp/llama.cpp/session.jsonl")).unwrap();
    writer.write_all(line.as_bytes()).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while temporaries(&dir).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no temporary file appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    drop(writer);
    assert_eq!(status.code(), Some(130));
    assert!(temporaries(&dir).is_empty(), "{:?}", temporaries(&dir));
    assert!(!out.exists());
}
