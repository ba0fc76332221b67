//! Real agent harnesses end to end: Claude Code, opencode, aider and Codex CLI, each run
//! non-interactively for three turns of one conversation through the real `prefixscope record`
//! binary in front of a real llama.cpp server (the `xllamacpp` wheel, SmolLM2-135M), then
//! `prefixscope analyze --json` of the recording.
//!
//! The harnesses come from `tests/harness/install.sh` (pinned versions, under
//! `$PREFIXSCOPE_HARNESS_HOME`, default `~/.cache/prefixscope-harnesses`; `.ci/setup` runs it).
//! A harness that is not installed is SKIPPED, unless `PREFIXSCOPE_REQUIRE_HARNESSES` is set (CI).
//! Each runs in a throwaway HOME with a dummy key, telemetry and update checks off. The tests take
//! turns (one llama.cpp server at a time on two cores).
//!
//! `PREFIXSCOPE_HARNESS_FIXTURES=DIR` copies each recording there (how `tests/data/harness/` was
//! made: Claude Code's in digest mode only).

mod support;
#[path = "support/tmux.rs"]
mod tmux;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use prefixscope_core::record::{Record, read_jsonl};

fn read(file: &Path) -> Vec<Record> {
    let file = std::fs::File::open(file).unwrap();
    let read = read_jsonl(std::io::BufReader::new(file));
    assert!(read.bad_lines.is_empty(), "bad lines: {:?}", read.bad_lines);
    read.records
}

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");

/// The three user turns every harness is given, one conversation.
const TURNS: [&str; 3] = [
    "What is a prefix cache? One sentence.",
    "Why does it help agents?",
    "Name one way to break it.",
];

/// One harness run at a time: each test starts its own llama.cpp server, and two cores hold one.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The server the harnesses talk to: 2 slots of 32,768 tokens (Claude Code's prompt alone is
/// 3.5K tokens, Codex's 4.6K), greedy sampling on one thread, and replies held to one short
/// sentence by a grammar: SmolLM2 under an agent's system prompt rarely stops by itself, and
/// Claude Code answers a reply cut at max_tokens with up to three "resume" requests.
fn server_config() -> support::llama::Config {
    support::llama::Config {
        slots: 2,
        ctx_per_slot: 32768,
        env: vec![
            ("PREFIXSCOPE_LLAMA_N_PREDICT", "64".into()),
            ("PREFIXSCOPE_LLAMA_TEMP", "0".into()),
            ("PREFIXSCOPE_LLAMA_THREADS", "1".into()),
            (
                "PREFIXSCOPE_LLAMA_GRAMMAR",
                r#"root ::= [A-Z] [a-z ,]{2,40} ".""#.into(),
            ),
        ],
    }
}

fn harness_home() -> PathBuf {
    match std::env::var_os("PREFIXSCOPE_HARNESS_HOME") {
        Some(home) => PathBuf::from(home),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/prefixscope-harnesses"),
    }
}

/// The installed harness binary, or None (after saying SKIPPED) when it is not installed.
fn harness(who: &str, name: &str) -> Option<PathBuf> {
    let bin = harness_home().join("bin").join(name);
    let runs = Command::new(&bin)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success());
    if runs {
        return Some(bin);
    }
    assert!(
        std::env::var_os("PREFIXSCOPE_REQUIRE_HARNESSES").is_none(),
        "PREFIXSCOPE_REQUIRE_HARNESSES is set but {} does not run (bash tests/harness/install.sh)",
        bin.display()
    );
    eprintln!(
        "SKIPPED {who}: {} is not installed (bash tests/harness/install.sh)",
        bin.display()
    );
    None
}

/// A scratch directory outside any git repository (aider looks upwards for one), with `home/`
/// and `work/` in it.
fn scratch(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("prefixscope-harness-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("home")).unwrap();
    std::fs::create_dir_all(dir.join("work")).unwrap();
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    dir
}

/// Claude Code's turn `i` against `base_url`: print mode, `--continue` after the first, the
/// non-essential traffic and telemetry off, a dummy key.
fn claude_turn(bin: &Path, dir: &Path, base_url: &str, i: usize, turn: &str) -> Command {
    let mut c = command(bin, dir);
    c.env("ANTHROPIC_BASE_URL", base_url)
        .env("ANTHROPIC_API_KEY", "sk-ant-dummy")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("CLAUDE_CODE_MAX_OUTPUT_TOKENS", "64")
        .arg("-p");
    if i > 0 {
        c.arg("--continue");
    }
    c.arg(turn);
    c
}

/// A harness command with nothing of ours in its environment but PATH, a throwaway HOME (and
/// XDG dirs inside it) and TMPDIR (a Bun-built harness unpacks a 5 MB library there at every
/// start and leaves it), run in `dir/work` with no standard input.
fn command(bin: &Path, dir: &Path) -> Command {
    let home = dir.join("home");
    let mut c = Command::new(bin);
    c.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".local/share"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("XDG_STATE_HOME", home.join(".local/state"))
        .env("TMPDIR", dir.join("tmp"))
        .env("TERM", "dumb")
        .env("NO_COLOR", "1")
        .current_dir(dir.join("work"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs one harness turn to completion (at most `limit`), asserting it exits 0.
fn run_turn(who: &str, mut c: Command, limit: Duration) -> String {
    let started = Instant::now();
    let child = c.spawn().unwrap();
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = match rx.recv_timeout(limit) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("{who}: no answer in {limit:?}");
        }
    };
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(
        output.status.success(),
        "{who}: exit {:?}\nstdout: {stdout}\nstderr: {stderr}",
        output.status.code()
    );
    eprintln!(
        "{who}: {:.1} s: {}",
        started.elapsed().as_secs_f64(),
        stdout.trim().lines().last().unwrap_or("")
    );
    stdout
}

/// `prefixscope record` on a free port in front of `upstream`.
struct Recording {
    child: Child,
    port: u16,
    file: PathBuf,
}

impl Recording {
    async fn start(upstream: &str, file: PathBuf, extra: &[&str]) -> Recording {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let _ = std::fs::remove_file(&file);
        let child = Command::new(BIN)
            // Without the server probe: `check` counts the harness's records (tests/probe.rs and
            // llama_e2e.rs probe the servers).
            .args(["record", "--no-probe", "--upstream", upstream, "--listen"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("-o")
            .arg(&file)
            .args(extra)
            .args(["-q", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the recorder never listened"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Recording { child, port, file }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops it as Ctrl-C does (exchanges in flight finished and recorded) and returns its JSON
    /// summary.
    fn stop(self) -> Value {
        Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap();
        let output = self.child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "record: {stderr}");
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("record --json: {e}"))
    }
}

fn analyze(file: &Path) -> Value {
    let output = Command::new(BIN)
        .arg("analyze")
        .arg(file)
        .arg("--json")
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "analyze: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// What the server said about one chat exchange: (prompt tokens, tokens reused), from llama.cpp's
/// `timings` (OpenAI chat), or the usage of the Anthropic Messages or Responses API.
/// A digest record keeps them in `response.digest.usage` (the body less its content).
fn server_counts(record: &Record) -> Option<(u64, u64)> {
    let response = record.response.as_ref()?;
    let body = match (&response.body, &response.digest) {
        (Some(body), _) => body.clone(),
        (None, Some(digest)) => Value::Object(digest.usage.clone()),
        (None, None) => return None,
    };
    let (t, u) = (&body["timings"], &body["usage"]);
    if let (Some(cache), Some(evaluated)) = (t["cache_n"].as_u64(), t["prompt_n"].as_u64()) {
        return Some((cache + evaluated, cache));
    }
    if let (Some(input), Some(read)) = (
        u["input_tokens"].as_u64(),
        u["cache_read_input_tokens"].as_u64(),
    ) {
        return Some((input + read, read));
    }
    if let (Some(input), Some(cached)) = (
        u["input_tokens"].as_u64(),
        u["input_tokens_details"]["cached_tokens"].as_u64(),
    ) {
        return Some((input, cached));
    }
    None
}

/// What every harness test checks of its recording and of `analyze --json` on it; returns the
/// report.
///
/// - `chat_path`: the path the harness's model requests go to (query string aside);
/// - `chat_requests`: how many of them (turns plus the side-calls the harness makes itself);
/// - `analysed`: whether `analyze` reads that API (all four harnesses' APIs now).
fn check(who: &str, file: &Path, chat_path: &str, chat_requests: usize, analysed: bool) -> Value {
    let records = read(file);
    for r in &records {
        // Codex drops the connection as soon as `response.completed` arrives, before llama.cpp
        // ends the stream, and aider sometimes at `finish_reason`: recorded as
        // client_disconnected, with the whole response merged, and analysed.
        if prefixscope_core::normalize::closed_after_completion(r) {
            eprintln!("{who}: #{} client_disconnected after the reply ended", r.id);
        } else {
            assert!(r.error.is_none(), "{who}: #{} failed: {:?}", r.id, r.error);
        }
        let status = r.response.as_ref().map(|r| r.status);
        assert_eq!(status, Some(200), "{who}: #{} {}", r.id, r.request.path);
    }
    let chat: Vec<&Record> = records
        .iter()
        .filter(|r| r.request.path.split('?').next() == Some(chat_path))
        .collect();
    let others: Vec<String> = records
        .iter()
        .filter(|r| r.request.path.split('?').next() != Some(chat_path))
        .map(|r| format!("{} {}", r.request.method, r.request.path))
        .collect();
    assert_eq!(
        chat.len(),
        chat_requests,
        "{who}: {chat_path} requests (others: {others:?})"
    );
    for r in &chat {
        let counts = server_counts(r);
        assert!(
            counts.is_some(),
            "{who}: #{} has no server counters: {:?}",
            r.id,
            r.response.as_ref().and_then(|r| r.body.as_ref())
        );
        let (prompt, reused) = counts.unwrap_or_default();
        eprintln!(
            "{who}: #{} {} prompt {prompt} reused {reused} re-evaluated {}",
            r.id,
            r.request.path,
            prompt - reused
        );
    }

    let report = analyze(file);
    let coverage = &report["coverage"];
    assert_eq!(coverage["records"].as_u64(), Some(records.len() as u64));
    assert_eq!(coverage["bad_lines"], 0, "{who}: {coverage}");
    for skipped in ["non_2xx", "unparsed"] {
        assert_eq!(coverage["skipped"][skipped], 0, "{who}: {coverage}");
    }
    if !analysed {
        assert_eq!(coverage["analysed"], 0, "{who}: {coverage}");
        return report;
    }
    assert_eq!(coverage["skipped"]["error"], 0, "{who}: {coverage}");
    assert_eq!(
        coverage["analysed"].as_u64(),
        Some(chat_requests as u64),
        "{who}: {coverage}"
    );
    // The conversation's three turns, each with the server's own counters.
    let rows = report["rows"].as_array().cloned().unwrap_or_default();
    let mut conversations: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    for row in rows.iter().filter(|r| r["kind"] == "turn") {
        if let Some(c) = row["conversation"].as_u64() {
            conversations.entry(c).or_default().push(row);
        }
    }
    let longest = conversations.values().map(Vec::len).max().unwrap_or(0);
    assert!(
        longest >= TURNS.len(),
        "{who}: no conversation of {} turns: {conversations:?}",
        TURNS.len()
    );
    for turns in conversations.values() {
        for row in turns {
            for count in ["prompt_tokens", "reused_tokens", "evaluated_tokens"] {
                assert_eq!(
                    row["counts"][count]["source"], "server",
                    "{who}: #{} {count}: {row}",
                    row["id"]
                );
            }
        }
    }
    for row in &rows {
        eprintln!(
            "{who}: analyze #{} {} c{} t{} prompt {} reused {} cause {} lost {}",
            row["id"],
            row["kind"],
            row["conversation"],
            row["turn"],
            row["counts"]["prompt_tokens"]["value"],
            row["counts"]["reused_tokens"]["value"],
            row["cause"],
            row["lost_client"]
        );
    }
    eprintln!(
        "{who}: analyze: {} turns in {} conversation(s), lost {} tokens by cause {}",
        coverage["turns"],
        coverage["conversations"],
        report["time"]["lost_tokens"],
        report["time"]["by_cause"]
    );
    report
}

/// `row id: cause` of every break in a report.
fn breaks(report: &Value) -> Vec<String> {
    report["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| !r["break_cause"].is_null())
        .map(|r| format!("{}: {}", r["id"], r["break_cause"]))
        .collect()
}

/// Copies the recording to `$PREFIXSCOPE_HARNESS_FIXTURES/NAME` when asked.
fn keep_fixture(file: &Path, name: &str) {
    if let Some(dir) = std::env::var_os("PREFIXSCOPE_HARNESS_FIXTURES") {
        let target = PathBuf::from(dir).join(name);
        std::fs::copy(file, &target).unwrap();
        eprintln!("kept {}", target.display());
    }
}

const TURN_LIMIT: Duration = Duration::from_secs(240);

/// Claude Code 2.1.197 (Anthropic Messages API: llama.cpp serves `/v1/messages`): `claude -p`,
/// then `claude -p --continue` twice. Before each run it sends `HEAD /` (a connectivity check).
/// Two recorders in a row (digest in front of full) see the same traffic: the digest one is the
/// fixture (Claude Code's prompts are not ours to publish), and both must agree. Only the one
/// next to the server lays records out (the other's layout requests would go through it and be
/// recorded there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_three_turns_through_record() {
    let Some(bin) = harness("harness_e2e claude_code", "claude") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let Some((_server, upstream)) =
        support::llama::start_server_with("harness_e2e claude_code", &server_config()).await
    else {
        return;
    };
    let dir = scratch("claude");
    let full = Recording::start(
        &format!("http://{upstream}"),
        dir.join("claude-code.full.jsonl"),
        &[],
    )
    .await;
    let digest = Recording::start(
        &full.url(),
        dir.join("claude-code.digest.jsonl"),
        &["--digest", "--no-layout"],
    )
    .await;
    for (i, turn) in TURNS.iter().enumerate() {
        run_turn(
            "claude_code",
            claude_turn(&bin, &dir, &digest.url(), i, turn),
            TURN_LIMIT,
        );
    }
    let (digest_file, full_file) = (digest.file.clone(), full.file.clone());
    let summary = digest.stop();
    full.stop();
    assert_eq!(summary["written"], 6, "{summary}");
    for file in [&full_file, &digest_file] {
        let records = read(file);
        let heads = records
            .iter()
            .filter(|r| r.request.method == "HEAD")
            .count();
        assert_eq!(heads, TURNS.len(), "one HEAD / per run");
        let chat = check("claude_code", file, "/v1/messages", TURNS.len(), true);
        assert_eq!(chat["coverage"]["conversations"], 1);
        assert_eq!(
            chat["coverage"]["connectivity_checks"].as_u64(),
            Some(TURNS.len() as u64)
        );
        // The cache_control marker moves every turn; nothing else changes: no break.
        assert_eq!(breaks(&chat), Vec::<String>::new(), "claude_code: no break");
        assert_eq!(chat["clients"][0]["harness"], "Claude Code 2.1.197");
    }
    // The digest keeps the server's counters, and the session header.
    let (f, d) = (read(&full_file), read(&digest_file));
    // Next to llama.cpp, each turn is laid out as the server renders it: its counts add up to
    // the server's prompt, and the tool schemas SmolLM2's template drops weigh nothing (so no
    // "unused tool" finding quotes tokens the server never saw).
    for record in f.iter().filter(|r| r.request.method == "POST") {
        let tokens = record.tokens.as_ref();
        assert!(
            tokens.is_some_and(|t| t.layout),
            "#{}: {tokens:?}",
            record.id
        );
        let (messages, tools, prompt) = support::token_sums(record);
        assert_eq!(Some(messages + tools), prompt);
        assert_eq!(tools, 0, "#{}", record.id);
    }
    let laid_out = analyze(&full_file);
    let unused_tools = laid_out["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "unused_tool")
        .count();
    assert_eq!(unused_tools, 0, "tools the template drops cost nothing");
    for (f, d) in f.iter().zip(&d) {
        assert_eq!(server_counts(f), server_counts(d), "#{}", f.id);
        assert_eq!(
            f.request.headers.get("x-claude-code-session-id"),
            d.request.headers.get("x-claude-code-session-id")
        );
    }
    let sessions: std::collections::BTreeSet<_> = f
        .iter()
        .filter_map(|r| r.request.headers.get("x-claude-code-session-id"))
        .collect();
    assert_eq!(sessions.len(), 1, "--continue keeps the session id");
    keep_fixture(&digest_file, "claude-code.digest.jsonl");
    let _ = std::fs::remove_dir_all(&dir);
}

/// opencode 1.18.33 (OpenAI chat completions through `@ai-sdk/openai-compatible`):
/// `opencode run`, then `opencode run --continue` twice. The first run also asks for a title (a
/// side-call, on the other slot at the same time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_three_turns_through_record() {
    let Some(bin) = harness("harness_e2e opencode", "opencode") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let Some((_server, upstream)) =
        support::llama::start_server_with("harness_e2e opencode", &server_config()).await
    else {
        return;
    };
    let dir = scratch("opencode");
    let rec = Recording::start(
        &format!("http://{upstream}"),
        dir.join("opencode.jsonl"),
        &[],
    )
    .await;
    let config = json!({
        "$schema": "https://opencode.ai/config.json",
        "provider": {"llama": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "llama.cpp via prefixscope",
            "options": {"baseURL": format!("{}/v1", rec.url()), "apiKey": "dummy"},
            "models": {"smollm2": {"name": "SmolLM2-135M", "limit": {"context": 32768, "output": 64}}}
        }},
        "model": "llama/smollm2",
        "small_model": "llama/smollm2",
        "autoupdate": false,
        "share": "disabled"
    });
    std::fs::write(
        dir.join("work/opencode.json"),
        serde_json::to_string_pretty(&config).unwrap(),
    )
    .unwrap();
    for (i, turn) in TURNS.iter().enumerate() {
        let mut c = command(&bin, &dir);
        c.env("OPENCODE_DISABLE_AUTOUPDATE", "1")
            .env("OPENCODE_DISABLE_MODELS_FETCH", "1")
            .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1")
            .env("OPENCODE_DISABLE_DEFAULT_PLUGINS", "1")
            .arg("run");
        if i > 0 {
            c.arg("--continue");
        }
        c.arg(turn);
        run_turn("opencode", c, TURN_LIMIT);
    }
    let file = rec.file.clone();
    rec.stop();
    let report = check("opencode", &file, "/v1/chat/completions", 4, true);
    assert_eq!(breaks(&report), Vec::<String>::new(), "opencode: no break");
    assert_eq!(report["time"]["lost_tokens"], 0);
    assert_eq!(report["clients"][0]["harness"], "opencode 1.18.33");
    let side_calls = report["rows"]
        .as_array()
        .map(|rows| rows.iter().filter(|r| r["kind"] == "side_call").count());
    assert_eq!(side_calls, Some(1), "the title side-call");
    let records = read(&file);
    let sessions: std::collections::BTreeSet<_> = records
        .iter()
        .filter_map(|r| r.request.headers.get("x-session-id"))
        .collect();
    assert_eq!(sessions.len(), 1, "--continue keeps x-session-id");
    keep_fixture(&file, "opencode.jsonl");
    let _ = std::fs::remove_dir_all(&dir);
}

/// aider 0.86.2 (OpenAI chat completions through litellm) with a file in the chat: `aider
/// hello.py --message`, then twice with `--restore-chat-history`, which puts the earlier
/// exchanges back after the file's messages: the server re-evaluates from there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aider_three_turns_through_record() {
    let Some(bin) = harness("harness_e2e aider", "aider") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let Some((_server, upstream)) =
        support::llama::start_server_with("harness_e2e aider", &server_config()).await
    else {
        return;
    };
    let dir = scratch("aider");
    let rec = Recording::start(&format!("http://{upstream}"), dir.join("aider.jsonl"), &[]).await;
    std::fs::write(
        dir.join("work/hello.py"),
        "def greet(name):\n    return \"hello \" + name\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("home/model.settings.yml"),
        "- name: openai/smollm2\n  extra_params:\n    max_tokens: 64\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("home/model.metadata.json"),
        json!({"openai/smollm2": {"max_input_tokens": 32768, "max_output_tokens": 64,
            "input_cost_per_token": 0, "output_cost_per_token": 0,
            "litellm_provider": "openai", "mode": "chat"}})
        .to_string(),
    )
    .unwrap();
    for (i, turn) in TURNS.iter().enumerate() {
        let mut c = command(&bin, &dir);
        c.env("OPENAI_API_KEY", "sk-dummy")
            .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            .args(["--model", "openai/smollm2", "--openai-api-base"])
            .arg(format!("{}/v1", rec.url()))
            .arg("--model-settings-file")
            .arg(dir.join("home/model.settings.yml"))
            .arg("--model-metadata-file")
            .arg(dir.join("home/model.metadata.json"))
            .args([
                "--no-git",
                "--yes-always",
                "--no-check-update",
                "--analytics-disable",
                "--no-show-release-notes",
                "--no-show-model-warnings",
                "--no-pretty",
                "--no-fancy-input",
                "--map-tokens",
                "0",
                "--no-auto-lint",
                "--no-detect-urls",
                "--no-suggest-shell-commands",
                "--chat-history-file",
                ".aider.chat.history.md",
                "--input-history-file",
                ".aider.input.history",
                "hello.py",
            ]);
        if i > 0 {
            c.arg("--restore-chat-history");
        }
        c.args(["--message", turn]);
        run_turn("aider", c, TURN_LIMIT);
    }
    let file = rec.file.clone();
    rec.stop();
    let report = check("aider", &file, "/v1/chat/completions", TURNS.len(), true);
    assert_eq!(report["clients"][0]["harness"], "aider");
    // Charged as a reorder, never more than the server re-evaluated.
    for row in report["rows"].as_array().into_iter().flatten().skip(1) {
        assert_eq!(row["lost_client"]["cause"], "history_reordered", "{row}");
        let charged = row["lost_client"]["tokens"].as_u64().unwrap_or(0);
        let evaluated = row["counts"]["evaluated_tokens"]["value"]
            .as_u64()
            .unwrap_or(0);
        assert!(charged > 0 && charged <= evaluated, "{row}");
    }
    // The restored history goes in after the file's messages: the server re-evaluates them.
    let records = read(&file);
    for r in &records[1..] {
        let (prompt, reused) = server_counts(r).unwrap_or_default();
        assert!(
            reused < prompt.saturating_sub(64),
            "#{}: a restored history re-evaluates more than the new message: {prompt} {reused}",
            r.id
        );
    }
    keep_fixture(&file, "aider.jsonl");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Codex CLI 0.171.0 (the Responses API only: `wire_api = "chat"` is no longer accepted;
/// llama.cpp serves `/v1/responses`): `codex exec`, then `codex exec resume --last` twice.
/// `analyze` reads the Responses API in chat form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_three_turns_through_record() {
    let Some(bin) = harness("harness_e2e codex", "codex") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let Some((_server, upstream)) =
        support::llama::start_server_with("harness_e2e codex", &server_config()).await
    else {
        return;
    };
    let dir = scratch("codex");
    let rec = Recording::start(&format!("http://{upstream}"), dir.join("codex.jsonl"), &[]).await;
    std::fs::create_dir_all(dir.join("home/.codex")).unwrap();
    std::fs::write(
        dir.join("home/.codex/config.toml"),
        format!(
            "model = \"smollm2\"\nmodel_provider = \"llama\"\ncheck_for_update_on_startup = false\n\n\
             [model_providers.llama]\nname = \"llama.cpp via prefixscope\"\nbase_url = \"{}/v1\"\n\
             env_key = \"LLAMA_API_KEY\"\nwire_api = \"responses\"\n\n[analytics]\nenabled = false\n",
            rec.url()
        ),
    )
    .unwrap();
    for (i, turn) in TURNS.iter().enumerate() {
        let mut c = command(&bin, &dir);
        c.env("CODEX_HOME", dir.join("home/.codex"))
            .env("LLAMA_API_KEY", "dummy")
            .args(["exec", "--skip-git-repo-check"]);
        if i > 0 {
            c.args(["resume", "--last"]);
        }
        c.arg(turn);
        run_turn("codex", c, TURN_LIMIT);
    }
    let file = rec.file.clone();
    rec.stop();
    let report = check("codex", &file, "/v1/responses", TURNS.len(), true);
    assert_eq!(breaks(&report), Vec::<String>::new(), "codex: no break");
    assert_eq!(report["time"]["lost_tokens"], 0);
    assert_eq!(report["clients"][0]["harness"], "Codex 0.171.0");
    // One conversation as the server saw it: each turn reuses the previous one's prompt.
    let records = read(&file);
    let mut previous = 0;
    for r in &records {
        let (prompt, reused) = server_counts(r).unwrap_or_default();
        assert!(prompt > previous, "#{}: the conversation grows", r.id);
        if previous > 0 {
            assert!(reused + 64 >= previous, "#{}: {reused} of {previous}", r.id);
        }
        previous = prompt;
    }
    let sessions: std::collections::BTreeSet<_> = records
        .iter()
        .filter_map(|r| r.request.headers.get("session-id"))
        .collect();
    assert_eq!(sessions.len(), 1, "resume --last keeps the session id");
    keep_fixture(&file, "codex.jsonl");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Claude Code once through `watch` in a real terminal, as a user runs it: the screen names the
/// harness, counts its three turns in one conversation and the `HEAD /` checks out of them, and
/// shows the loss `analyze` gives for the recording `watch` wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_three_turns_through_watch_under_tmux() {
    let Some(bin) = harness("harness_e2e claude_code watch", "claude") else {
        return;
    };
    let _serial = SERIAL.lock().await;
    let Some((_server, upstream)) =
        support::llama::start_server_with("harness_e2e claude_code watch", &server_config()).await
    else {
        return;
    };
    let dir = scratch("claude-watch");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let file = dir.join("watch.jsonl");
    let shell = format!(
        "{BIN} watch --upstream http://{upstream} --listen 127.0.0.1:{port} --digest -o {}; sleep 60",
        file.display()
    );
    if !tmux::have_tmux() {
        return;
    }
    let mut tmux = tmux::Tmux::start("claude-watch", &shell);
    tmux.patience = Duration::from_secs(30);
    let started = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "watch never listened:\n{}",
            tmux.screen()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (i, turn) in TURNS.iter().enumerate() {
        run_turn(
            "claude_code watch",
            claude_turn(&bin, &dir, &format!("http://127.0.0.1:{port}"), i, turn),
            TURN_LIMIT,
        );
    }
    let screen = tmux.wait_for(&["Claude Code c1", "3 turns in 1 conversation"]);
    eprintln!("{screen}");
    tmux.keys(&["q"]);
    let start = Instant::now();
    while !tmux.screen().contains("sleep 60") && start.elapsed() < Duration::from_secs(15) {
        // The shell's command line shows once the TUI has given the terminal back.
        if read(&file).len() == 2 * TURNS.len() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let report = analyze(&file);
    assert_eq!(report["coverage"]["connectivity_checks"], TURNS.len());
    assert_eq!(report["coverage"]["conversations"], 1);
    let lost = report["time"]["lost_tokens"].as_u64().unwrap_or(u64::MAX);
    assert!(
        screen.contains(&format!("lost {lost} tokens")),
        "analyze says {lost} tokens lost; the screen:\n{screen}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
