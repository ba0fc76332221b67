//! A person's-eye test: the real binary in a real terminal (tmux), keys sent as typed, the
//! screen read back after each. Needs tmux; CI installs it and sets PREFIXSCOPE_REQUIRE_TMUX=1
//! so the test fails there rather than skipping.

#[path = "support/tmux.rs"]
mod tmux;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tmux::{Tmux, have_tmux};

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");

fn recording(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("recordings")
        .join(name)
        .display()
        .to_string()
}

#[test]
fn replay_as_a_person_uses_it() {
    if !have_tmux() {
        return;
    }
    // The export's salt file goes to the test's folder, not the user's config.
    let command = format!(
        "XDG_CONFIG_HOME=$PWD/config {BIN} replay --speed 20 {}; echo EXITED $?; sleep 60",
        recording("llmp/llama.cpp/parallel-nocache.jsonl")
    );
    let tmux = Tmux::start("replay", &command);
    // The whole recording (24 s recorded, ×20) arrives, and the figures are on screen.
    let screen = tmux.wait_for(&["lost 8,604 tokens", "22 turns in 5 conversations", "done"]);
    assert!(
        screen.contains("Today is Monday.\" → \"…s. Today is Tuesday."),
        "{screen}"
    );
    for conversation in ["c1", "c2", "c3", "c4", "c5"] {
        assert!(screen.contains(conversation), "{conversation}:\n{screen}");
    }
    // The hit-rate pane's ceiling is the one `profile --warmup 0` prints first, to its digit.
    let profile = Command::new(BIN)
        .args(["profile", "--warmup", "0"])
        .arg(recording("llmp/llama.cpp/parallel-nocache.jsonl"))
        .output()
        .unwrap();
    let profile = String::from_utf8(profile.stdout).unwrap();
    let percent_after = |text: &str, word: &str| -> Option<f64> {
        let at = text.find(word)? + word.len();
        let number: String = text[at..]
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        number.parse().ok()
    };
    let headless = percent_after(&profile, "ceiling ").unwrap();
    let on_screen = percent_after(&screen, "ceiling ").unwrap();
    assert_eq!(
        format!("{on_screen:.1}"),
        format!("{headless:.1}"),
        "screen:\n{screen}\nprofile:\n{profile}"
    );

    // `s`: a snapshot, and the status bar says where.
    tmux.keys(&["s"]);
    let screen = tmux.wait_for(&["snapshot written"]);
    let json = tmux.files("prefixscope-snapshot-");
    assert_eq!(json.len(), 3, "{json:?}\n{screen}");
    for file in &json {
        assert_eq!(private_mode(file), 0o600, "{file:?}");
    }
    let json = json
        .iter()
        .find(|f| f.extension().is_some_and(|e| e == "json"))
        .unwrap()
        .clone();
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["time"]["lost_tokens"], 8604);
    let html = std::fs::read_to_string(json.with_extension("html")).unwrap();
    assert!(
        html.contains("data-lost-tokens=\"8604\""),
        "the page of the same report"
    );
    let text = std::fs::read_to_string(json.with_extension("txt")).unwrap();
    assert!(text.contains("8,604 tokens"), "{text}");
    // The snapshot's JSON holds what the panes show beside the report.
    assert!(report["hit_rate"]["points"].is_array(), "{report}");
    assert!(report["top_prefixes"].is_array(), "{report}");
    assert!(report["findings"].is_array(), "{report}");
    // Its text is the summary the headless replay of the same file prints at the end.
    let headless = Command::new(BIN)
        .args(["replay", "--headless", "--instant"])
        .arg(recording("llmp/llama.cpp/parallel-nocache.jsonl"))
        .output()
        .unwrap();
    let headless = String::from_utf8(headless.stdout).unwrap();
    assert!(
        headless.ends_with(&text),
        "snapshot text:\n{text}\nheadless:\n{headless}"
    );

    // `e`: the export dialog, mooncake first; Enter writes it.
    tmux.keys(&["e"]);
    tmux.wait_for(&["mooncake", "prefixscope-mooncake.jsonl"]);
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for(&["exported 23 requests"]);
    check_export(&tmux, &screen);
    assert!(tmux.dir.join("config/prefixscope/salt").exists());

    // `p` pauses the view, again resumes it.
    tmux.keys(&["p"]);
    tmux.wait_for(&["PAUSED"]);
    tmux.keys(&["p"]);
    tmux.wait_for(&["view resumed"]);

    // `/` filters: only the other agent's conversation stays.
    tmux.keys(&["/"]);
    tmux.keys(&["-l", "other-agent"]);
    tmux.keys(&["Enter"]);
    tmux.wait_for(&["filter: other-agent"]);
    // The filtered view is the engine's answer: it arrives as the next snapshot.
    tmux.wait_until("the other conversations to leave", |screen| {
        !screen.contains("llmp-drive #2 c3")
    });

    // `?` shows the keys; any key closes it.
    tmux.keys(&["?"]);
    tmux.wait_for(&["snapshot", "pause"]);
    tmux.keys(&["Escape"]);

    // `q` quits, the terminal comes back, and the summary is printed on it.
    tmux.keys(&["q"]);
    let screen = tmux.wait_for(&["EXITED 0"]);
    assert!(screen.contains("8,604 tokens"), "{screen}");
    assert!(
        !screen.contains("Prefix breaks"),
        "the TUI is still on screen:\n{screen}"
    );
}

fn private_mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn check_export(tmux: &Tmux, screen: &str) {
    let exported = tmux.files("prefixscope-mooncake");
    if screen.contains("export failed") {
        panic!("export failed:\n{screen}");
    }
    assert_eq!(exported.len(), 1, "{screen}");
    assert_eq!(private_mode(&exported[0]), 0o600);
    let text = std::fs::read_to_string(&exported[0]).unwrap();
    assert!(text.lines().count() > 0);
    for line in text.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(row["hash_ids"].is_array(), "{line}");
    }
}

#[test]
fn the_terminal_is_restored_after_a_panic() {
    if !have_tmux() {
        return;
    }
    let command = format!(
        "stty -a | grep -o -- '-\\?icanon' | sed 's/^/BEFORE /'; PREFIXSCOPE_TEST_PANIC=1 {BIN} replay {}; stty -a | grep -o -- '-\\?icanon' | sed 's/^/AFTER /'; echo EXITED; sleep 60",
        recording("llmp/llama.cpp/session.jsonl")
    );
    let tmux = Tmux::start("panic", &command);
    let screen = tmux.wait_for(&["EXITED"]);
    assert!(screen.contains("BEFORE icanon"), "{screen}");
    assert!(
        screen.contains("AFTER icanon"),
        "raw mode left on:\n{screen}"
    );
    assert!(screen.contains("PREFIXSCOPE_TEST_PANIC is set"), "{screen}");
    // Out of the alternate screen: what was printed before the TUI is visible again.
    assert!(screen.contains("BEFORE"), "{screen}");
}

#[test]
fn the_demo_shows_breaks_as_they_happen() {
    if !have_tmux() {
        return;
    }
    let command = format!("{BIN} demo --speed 20; echo EXITED $?; sleep 60");
    let tmux = Tmux::start("demo", &command);
    // The coder's date change, its new tool and the reviewer's eviction appear as they happen.
    let screen = tmux.wait_for(&[
        "\"…is 2026-03-14.\" → \"…is 2026-03-15.\"",
        "tools +web_fetch",
        "evicted by",
    ]);
    assert!(screen.contains("sim-review"), "{screen}");
    let screen = tmux.wait_for(&["demo finished"]);
    assert!(screen.contains("Prefix breaks"), "{screen}");
    tmux.keys(&["q"]);
    let screen = tmux.wait_for(&["EXITED 0"]);
    assert!(screen.contains("tokens"), "{screen}");
}

/// A fake upstream on its own thread: answers every request with `body` (plain HTTP/1.1, one
/// request per connection), and counts what it served.
fn fake_upstream(body: &'static str) -> (u16, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let (port, served, _) = slow_fake_upstream(body, Duration::ZERO);
    (port, served)
}

/// `fake_upstream` that waits `delay` between reading a request and answering it; also counts
/// the requests it has read (the second counter).
fn slow_fake_upstream(
    body: &'static str,
    delay: Duration,
) -> (
    u16,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let received = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = std::sync::Arc::clone(&served);
    let read_count = std::sync::Arc::clone(&received);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            // Headers, then as much body as Content-Length says.
            while let Ok(n) = stream.read(&mut buffer) {
                if n == 0 {
                    break;
                }
                request.extend_from_slice(&buffer[..n]);
                let text = String::from_utf8_lossy(&request);
                if let Some(end) = text.find("\r\n\r\n") {
                    let length = text[..end]
                        .lines()
                        .find_map(|l| {
                            let (name, value) = l.split_once(':')?;
                            name.eq_ignore_ascii_case("content-length")
                                .then(|| value.trim().parse::<usize>().ok())?
                        })
                        .unwrap_or(0);
                    if request.len() >= end + 4 + length {
                        break;
                    }
                }
            }
            // A connection that sent nothing (watch's check at start) is not a request.
            if request.is_empty() {
                continue;
            }
            read_count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::thread::sleep(delay);
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes());
            count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    (port, served, received)
}

/// One chat request to the proxy; the status line of its answer.
fn chat_through(port: u16, n: usize) -> String {
    use std::io::{Read, Write};
    let body = format!(
        "{{\"model\":\"m\",\"messages\":[{{\"role\":\"system\",\"content\":\"You are terse.\"}},{{\"role\":\"user\",\"content\":\"question {n}\"}}]}}"
    );
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\ncontent-type: application/json\r\nuser-agent: hostile-test/1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.lines().next().unwrap_or("").to_string()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn watch_keeps_serving_and_recording_when_the_upstream_claims_2_pow_63_prompt_tokens() {
    if !have_tmux() {
        return;
    }
    // One number from the upstream used to size an allocation of 2^59 blocks and abort the whole
    // process, proxy included (issue #17).
    let (upstream, served) = fake_upstream(
        r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9223372036854775808,"completion_tokens":1},"timings":{"cache_n":18446744073709551615,"prompt_n":3}}"#,
    );
    let listen = free_port();
    // `timings` say llama.cpp: without --no-layout, watch would also ask this fake for each
    // request's layout (and count its refusals), which is not what is tested here.
    let command = format!(
        "{BIN} watch --no-probe --no-layout --upstream http://127.0.0.1:{upstream} --listen 127.0.0.1:{listen} -o rec.jsonl; echo EXITED $?; sleep 60"
    );
    let tmux = Tmux::start("hostile-watch", &command);
    tmux.wait_for(&["Conversations"]);
    for n in 1..=3 {
        assert_eq!(chat_through(listen, n), "HTTP/1.1 200 OK", "request {n}");
    }
    assert_eq!(served.load(std::sync::atomic::Ordering::Relaxed), 3);
    tmux.wait_for(&["3 requests"]);
    tmux.keys(&["q"]);
    let screen = tmux.wait_for(&["EXITED 0"]);
    assert!(screen.contains("3 records written"), "{screen}");
    let recording = std::fs::read_to_string(tmux.dir.join("rec.jsonl")).unwrap();
    assert_eq!(recording.lines().count(), 3, "{recording}");
}

/// The shell's lines after the program: its exit code, then the terminal's line discipline.
const AFTER: &str = "echo EXITED $?; stty -a | tr ' ;' '\\n\\n' | grep -x -- '-\\?icanon\\|-\\?echo' | sed 's/^/AFTER /'; sleep 60";

/// The terminal is as the shell left it: canonical mode and echo on, out of the alternate
/// screen (the line printed before the TUI is visible again), cursor shown, no mouse reporting.
fn assert_restored(tmux: &Tmux, screen: &str) {
    assert!(
        screen.contains("AFTER icanon"),
        "raw mode left on:\n{screen}"
    );
    assert!(screen.contains("AFTER echo"), "echo left off:\n{screen}");
    assert!(!screen.contains("AFTER -"), "{screen}");
    assert!(screen.contains("BEFORE THE TUI"), "{screen}");
    assert!(
        !screen.contains("Prefix breaks"),
        "the TUI is still on screen:\n{screen}"
    );
    assert_eq!(
        tmux.modes(),
        "0 1 0",
        "alternate screen, cursor, mouse:\n{screen}"
    );
}

#[test]
fn replay_stops_gracefully_on_sigterm_sigint_and_sighup() {
    if !have_tmux() {
        return;
    }
    for signal in ["TERM", "INT", "HUP"] {
        // At ×1 the recording takes 24 s: the signal lands mid-replay.
        let command = format!(
            "echo BEFORE THE TUI; {BIN} replay {}; {AFTER}",
            recording("llmp/llama.cpp/parallel-nocache.jsonl")
        );
        let tmux = Tmux::start(&format!("replay-sig{signal}"), &command);
        // The first records on screen (they follow the block model's first pass).
        tmux.wait_for(&["Conversations", "llmp-drive"]);
        assert_eq!(tmux.modes(), "1 0 1", "SIG{signal}: the TUI's modes");
        let pid = tmux.program_pid();
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(status.success());
        let screen = tmux.wait_for(&["EXITED 0", "AFTER"]);
        // The summary of what was on screen is printed, as after `q`.
        assert!(screen.contains("tokens"), "SIG{signal}:\n{screen}");
        assert_restored(&tmux, &screen);
    }
}

#[test]
fn watch_answers_and_records_the_exchange_in_flight_on_sigterm_sigint_and_sighup() {
    if !have_tmux() {
        return;
    }
    for signal in ["TERM", "INT", "HUP"] {
        let (upstream, served, received) = slow_fake_upstream(
            r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1}}"#,
            Duration::from_secs(3),
        );
        let listen = free_port();
        let command = format!(
            "echo BEFORE THE TUI; {BIN} watch --no-probe --upstream http://127.0.0.1:{upstream} --listen 127.0.0.1:{listen} -o rec.jsonl; {AFTER}"
        );
        let tmux = Tmux::start(&format!("watch-sig{signal}"), &command);
        tmux.wait_for(&["Conversations"]);
        let pid = tmux.program_pid();
        let client = std::thread::spawn(move || chat_through(listen, 1));
        // The exchange is in flight: the upstream has the request and the app counts it.
        tmux.wait_for(&["1 in flight"]);
        assert_eq!(received.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(served.load(std::sync::atomic::Ordering::Relaxed), 0);
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(status.success());
        assert_eq!(client.join().unwrap(), "HTTP/1.1 200 OK", "SIG{signal}");
        let screen = tmux.wait_for(&["EXITED 0", "AFTER"]);
        // The summary counts the exchange that was in flight, as "records written" does.
        assert!(
            screen.contains("1 record written"),
            "SIG{signal}:\n{screen}"
        );
        assert!(
            screen.contains("prefixscope: 1 request"),
            "SIG{signal}:\n{screen}"
        );
        assert_restored(&tmux, &screen);
        let recording = std::fs::read_to_string(tmux.dir.join("rec.jsonl")).unwrap();
        let records = prefixscope_core::record::read_jsonl(recording.as_bytes()).records;
        assert_eq!(records.len(), 1, "SIG{signal}: {recording}");
        assert_eq!(records[0].error, None, "SIG{signal}: {recording}");
        assert_eq!(
            records[0].response.as_ref().map(|r| r.status),
            Some(200),
            "SIG{signal}"
        );
    }
}

/// Issue #13, as a person: over a real recording at 120×40 and 80×24, go to a chosen turn in the
/// middle of a chosen conversation (c2, turn 3 of 5), open it, and read its cause, its cost and
/// its fix on screen, with the saving `prefixscope whatif` predicts; Esc comes back.
#[test]
fn a_person_finds_a_middle_turn_and_reads_its_cause_cost_and_fix() {
    if !have_tmux() {
        return;
    }
    for (width, height) in [(120u16, 40u16), (80, 24)] {
        let command = format!(
            "{BIN} replay --instant {}; echo EXITED $?; sleep 60",
            recording("llmp/llama.cpp/parallel-nocache.jsonl")
        );
        let tmux = Tmux::start_sized(&format!("drill-{width}"), &command, width, height);
        tmux.wait_for(&["lost 8,604 tokens", "done"]);
        // c2 is the second lane; its newest turn is t5: two to the left is t3.
        tmux.keys(&["Down"]);
        tmux.wait_for(&["c2", "t5 lost 537 tok"]);
        tmux.keys(&["Left"]);
        tmux.wait_for(&["t4 lost 510 tok"]);
        tmux.keys(&["Left"]);
        tmux.wait_for(&["t3 lost 453 tok"]);
        tmux.keys(&["Enter"]);
        // Cause, cost, who evicted it, the fix and whatif's saving, all on the screen at once.
        tmux.wait_for(&[
            "c2 turn 3",
            "request #10",
            "other conversation: lost 453 tokens, 1",
            "evicted by #9",
            "fix: more conversations than slots",
            "--cache-ram on: −8,016 tokens",
            "-np 4: −7,486 tokens",
        ]);
        // `o` writes the view's whole text to a private file in the working directory.
        tmux.keys(&["o"]);
        tmux.wait_for(&["written: prefixscope-request-10-"]);
        let written = tmux.files("prefixscope-request-10-");
        assert_eq!(written.len(), 1, "{written:?}");
        assert_eq!(private_mode(&written[0]), 0o600);
        let text = std::fs::read_to_string(&written[0]).unwrap();
        assert!(
            text.contains("other conversation: lost 453 tokens"),
            "{text}"
        );
        assert!(
            text.contains("fix: more conversations than slots"),
            "{text}"
        );
        std::fs::remove_file(&written[0]).unwrap();
        // Esc: back to the panes, the turn still selected.
        tmux.keys(&["Escape"]);
        let screen = tmux.wait_until("the panes, the turn still selected", |screen| {
            screen.contains("Top prefixes")
                && screen.contains("t3 lost 453 tok")
                && !screen.contains("saving predicted")
        });
        // At 120 columns every visible break line shows its cause and cost whole.
        if width == 120 {
            let lines: Vec<&str> = screen
                .lines()
                .filter(|l| l.contains(" tok, ") && l.contains("conversation:"))
                .collect();
            assert!(lines.len() >= 8, "{screen}");
            for line in lines {
                let breaks = line.split('│').nth(3).unwrap_or("");
                let lead = breaks.split(" · ").next().unwrap_or("");
                assert!(lead.ends_with(" ms") || lead.ends_with(" s"), "{line}");
            }
        }
        tmux.keys(&["q"]);
        tmux.wait_for(&["EXITED 0"]);
    }
}

/// Issue #13, replay controls: `p` in a replay stops reading the file (the request counter
/// stands still and the status bar says so), `.` reads one record, `g` seeks forward to a
/// record and holds there, `p` again goes on.
#[test]
fn pausing_a_replay_stops_reading_and_dot_steps_one_record() {
    if !have_tmux() {
        return;
    }
    let command = format!(
        "{BIN} replay --speed 1 {}; echo EXITED $?; sleep 60",
        recording("llmp/llama.cpp/parallel-nocache.jsonl")
    );
    let tmux = Tmux::start("pause", &command);
    tmux.wait_for(&["Conversations", " req "]);
    tmux.keys(&["p"]);
    tmux.wait_for(&["REPLAY PAUSED"]);
    // The record on its way when `p` was pressed reaches the screen with the next snapshot.
    std::thread::sleep(Duration::from_millis(600));
    let screen = tmux.screen();
    let count = |screen: &str| -> u64 {
        let bar = screen
            .lines()
            .rev()
            .find(|l| l.contains(" req "))
            .unwrap_or("");
        bar.split(" req ")
            .next()
            .and_then(|s| s.split_whitespace().last())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let held = count(&screen);
    assert!(held < 24, "{screen}");
    std::thread::sleep(Duration::from_millis(2500));
    let screen = tmux.screen();
    assert_eq!(
        count(&screen),
        held,
        "reading went on while paused:\n{screen}"
    );
    // `.` and `]` read at once, not at the recorded pace (ten records span seconds here).
    let stepped = Instant::now();
    tmux.keys(&["."]);
    let screen = tmux.wait_until("one more record", |s| count(s) == held + 1);
    assert!(screen.contains("REPLAY PAUSED"), "{screen}");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(count(&tmux.screen()), held + 1);
    let stepped_ten = Instant::now();
    tmux.keys(&["]"]);
    tmux.wait_until("ten more records", |s| count(s) == held + 11);
    assert!(
        stepped_ten.elapsed() < Duration::from_secs(2),
        "] took {:?}",
        stepped_ten.elapsed()
    );
    assert!(stepped.elapsed() < Duration::from_secs(4));
    // `g` seeks forward: it reads on to that record at once and holds there.
    let mut at = held + 11;
    if held + 12 < 24 {
        at = held + 12;
        tmux.keys(&["g"]);
        tmux.wait_for(&["seek: read on to a record or a time"]);
        tmux.keys(&[&at.to_string(), "Enter"]);
        let screen = tmux.wait_until("the seek", |s| count(s) == at);
        assert!(screen.contains("REPLAY PAUSED"), "{screen}");
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(count(&tmux.screen()), at);
    }
    tmux.keys(&["p"]);
    tmux.wait_for(&["replay resumed"]);
    tmux.wait_until("reading to go on", |s| count(s) > at);
    tmux.keys(&["q"]);
    tmux.wait_for(&["EXITED 0"]);
}

/// Issue #13, the first screen of `watch`: the upstream's state before any request (a connect
/// at start), and a proxy that serves anyway when the upstream is down, saying why.
#[test]
fn watch_says_at_once_whether_the_upstream_answers() {
    if !have_tmux() {
        return;
    }
    let down = free_port();
    let listen = free_port();
    let command = format!(
        "{BIN} watch --no-probe --upstream http://127.0.0.1:{down} --listen 127.0.0.1:{listen} -o rec.jsonl; sleep 60"
    );
    let tmux = Tmux::start("upstream-down", &command);
    tmux.wait_for(&["UPSTREAM DOWN", &format!("at start, 127.0.0.1:{down}")]);
    // Still serving: the agent gets a 502 that says why, and the exchange is recorded.
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", listen)).unwrap();
    std::io::Write::write_all(
        &mut stream,
        b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut stream, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 502"), "{answer}");
    assert!(answer.contains("unreachable"), "{answer}");
    tmux.wait_for(&["1 req", "1 written"]);

    let (upstream, _served) = fake_upstream(r#"{"object":"list","data":[]}"#);
    let listen = free_port();
    let command = format!(
        "{BIN} watch --no-probe --upstream http://127.0.0.1:{upstream} --listen 127.0.0.1:{listen} -o rec.jsonl; sleep 60"
    );
    let tmux = Tmux::start("upstream-up", &command);
    tmux.wait_for(&["0 req", "upstream ok"]);
}

/// The terminal goes away under `watch` (its window closed: here the tmux server killed) while an
/// exchange is in flight: the client still gets its answer, the exchange is recorded, and the
/// process ends as after `q` instead of spinning on the dead terminal (it used to keep running
/// at 17–60% CPU, deaf to SIGTERM, because a print to the gone terminal panicked).
#[test]
fn watch_shuts_down_as_q_does_when_its_terminal_disappears() {
    if !have_tmux() {
        return;
    }
    let (upstream, served, received) = slow_fake_upstream(
        r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1}}"#,
        Duration::from_secs(2),
    );
    let listen = free_port();
    let tmux = Tmux::start(
        "watch-lost-terminal",
        &format!(
            "{BIN} watch --no-probe --upstream http://127.0.0.1:{upstream} --listen 127.0.0.1:{listen} -o rec.jsonl; {AFTER}"
        ),
    );
    tmux.wait_for(&["Conversations"]);
    let pid = tmux.program_pid();
    let client = std::thread::spawn(move || chat_through(listen, 1));
    tmux.wait_for(&["1 in flight"]);
    assert_eq!(received.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_eq!(served.load(std::sync::atomic::Ordering::Relaxed), 0);
    tmux.kill_server();
    assert_eq!(client.join().unwrap(), "HTTP/1.1 200 OK");
    let start = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "watch (pid {pid}) still runs 15 s after its terminal went away"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let recording = std::fs::read_to_string(tmux.dir.join("rec.jsonl")).unwrap();
    let records = prefixscope_core::record::read_jsonl(recording.as_bytes()).records;
    assert_eq!(records.len(), 1, "{recording}");
    assert_eq!(records[0].response.as_ref().map(|r| r.status), Some(200));
}

/// The answer first, at the two sizes people use: on a real recording in a real terminal, the
/// header's totals, the server's reuse and the ceiling, every break's cause and cost on screen,
/// every client's suffered and caused figures and the key bar are there whole, never cut by `…`.
#[test]
fn the_answer_is_readable_in_full_at_120x40_and_80x24() {
    use prefixscope_core::analysis::Config;
    use prefixscope_core::live::view::{duration, tokens};
    use prefixscope_core::live::{Engine, Input};
    use prefixscope_core::record::read_jsonl;
    use std::sync::Arc;
    if !have_tmux() {
        return;
    }
    let file = recording("llmp/llama.cpp/parallel-nocache.jsonl");
    let mut records = read_jsonl(std::fs::read(&file).unwrap().as_slice()).records;
    records.sort_by_key(|r| (r.t_end_ms.max(r.t_start_ms), r.id));
    let mut engine = Engine::for_records(Config::default(), &records);
    for record in records {
        engine.push(Input::Record(Arc::new(record), 0));
    }
    engine.push(Input::SourceDone);
    let snapshot = engine.snapshot();
    let view = &snapshot.view;
    for (width, height, breaks_shown) in [(120u16, 40u16, 10usize), (80, 24, 5)] {
        let command = format!("{BIN} replay --instant {file}; sleep 60");
        let tmux = Tmux::start_sized(&format!("readable-{width}"), &command, width, height);
        let screen = tmux.wait_for(&["done"]);
        let lines: Vec<&str> = screen.lines().collect();
        let whole = |text: &str| {
            assert!(
                screen.contains(text),
                "{width}×{height}: {text:?} is not whole on\n{screen}"
            )
        };
        whole(" prefixscope · lost 8,604 tokens, 2.3 s (76% of prefill)");
        whole("server 0.0%");
        whole("ceiling 74.8%");
        for b in view.breaks.iter().take(breaks_shown) {
            let ms =
                b.ms.map_or(String::new(), |ms| format!(", {}", duration(ms)));
            whole(&format!(
                "{}: {} tok{ms} · c{} t{}",
                b.cause,
                tokens(u64::from(b.tokens)),
                b.conversation.unwrap(),
                b.turn.unwrap()
            ));
        }
        for client in &view.losses {
            let figures = format!(
                "{:>8} {:>8}",
                tokens(client.tokens),
                tokens(client.caused_tokens)
            );
            assert!(
                lines.iter().any(|l| l.contains(&figures)),
                "{width}×{height}: {} {figures:?} is not whole on\n{screen}",
                client.alias
            );
        }
        let keys = lines.iter().rev().find(|l| !l.trim().is_empty()).unwrap();
        assert!(
            keys.contains("? help") && keys.contains("q quit") && !keys.contains('…'),
            "{width}×{height}: the key bar {keys:?}"
        );
        tmux.keys(&["q"]);
    }
}
