//! The server probe end to end: against the simulated llama-server (probes recorded, analysis
//! unchanged by them), an upstream that answers 404 to everything (each path asked once), and
//! no upstream at all (one record, no retry loop, the binary exits as usual).

mod support;

use std::collections::BTreeMap;
use std::io::Read;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Response;
use serde_json::Value;

use prefixscope_capture::poll::{Poller, Schedule};
use prefixscope_capture::proxy::Upstream;
use prefixscope_capture::recorder::{Recorder, RecorderConfig};
use prefixscope_core::analysis::{self, Config};
use prefixscope_core::probe::{Endpoint, ServerInfo, ServerKind};
use prefixscope_core::record::{Record, read_jsonl, record_line};
use prefixscope_demo::server::{SimConfig, SimServer, Speed};
use support::{fake_upstream, full, handler};

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");

async fn sim_server(slots: usize) -> SocketAddr {
    let server = SimServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        SimConfig::new(slots, false),
        Arc::new(Speed::new(1000.0)),
    )
    .await
    .unwrap();
    let addr = server.local_addr().unwrap();
    tokio::spawn(server.run(std::future::pending()));
    addr
}

/// A poller recording into a recorder of its own; the records it wrote once `run_for` is over.
async fn poll(upstream: &str, schedule: Schedule, fast: bool, run_for: Duration) -> Vec<Record> {
    let (records_tx, records_rx) = crossbeam_channel::unbounded();
    let recorder: Recorder<Bytes> =
        Recorder::start(RecorderConfig::default(), vec![records_tx]).unwrap();
    let mut poller = Poller::new(
        Upstream::parse(upstream).unwrap(),
        recorder.sender(),
        schedule,
    );
    if fast {
        poller.interval = Duration::from_millis(100);
        poller.backoff = Duration::from_millis(200);
    }
    let task = tokio::spawn(poller.run());
    tokio::time::sleep(run_for).await;
    task.abort();
    let _ = task.await;
    tokio::task::spawn_blocking(move || recorder.finish())
        .await
        .unwrap();
    records_rx.try_iter().map(|r| (*r).clone()).collect()
}

fn info(records: &[Record]) -> ServerInfo {
    let mut info = ServerInfo::default();
    for record in records {
        assert!(info.apply_record(record), "{record:?}");
    }
    info
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulated_llama_server_is_probed_and_only_changes_are_recorded() {
    let sim = sim_server(3).await;
    let records = poll(
        &format!("http://{sim}"),
        Schedule::Watch,
        true,
        Duration::from_millis(800),
    )
    .await;
    assert!(records.iter().all(|r| r.probe && r.request.method == "GET"));
    assert!(
        records
            .iter()
            .all(|r| r.id >= prefixscope_core::probe::PROBE_ID_BASE)
    );
    assert!(records.iter().all(|r| {
        r.request.headers.get("user-agent").map(String::as_str)
            == Some(prefixscope_core::probe::USER_AGENT)
    }));
    // About eight rounds, nothing changed after the first: one record per path.
    let paths: Vec<&str> = records.iter().map(|r| r.request.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/props",
            "/slots",
            "/health",
            "/metrics",
            "/v1/models",
            "/api/ps"
        ],
        "{paths:?}"
    );
    let server = info(&records);
    assert_eq!(server.kind(), Some(ServerKind::LlamaCpp));
    assert_eq!(server.total_slots(), Some(3));
    assert_eq!(server.busy_slots(), Some(0));
    assert_eq!(server.n_ctx(), Some(32_768));
    assert!(server.unavailable.contains(&Endpoint::Metrics));
    assert_eq!(
        server.line(),
        "server: llama.cpp · 3 slots (0 busy) · n_ctx 32,768 · sim-coder-7b-q4_k_m.gguf"
    );
    // `record`'s set, once: no /slots, no /metrics.
    let once = poll(
        &format!("http://{sim}"),
        Schedule::Once,
        true,
        Duration::from_millis(500),
    )
    .await;
    let paths: Vec<&str> = once.iter().map(|r| r.request.path.as_str()).collect();
    assert_eq!(paths, ["/props", "/health", "/v1/models", "/api/ps"]);
}

/// Counts the requests of each path, answering 404 to every one.
async fn not_found_upstream(asked: Arc<std::sync::Mutex<BTreeMap<String, u32>>>) -> SocketAddr {
    fake_upstream(handler(move |request| {
        let asked = Arc::clone(&asked);
        async move {
            *asked
                .lock()
                .unwrap()
                .entry(format!("{} {}", request.method(), request.uri().path()))
                .or_default() += 1;
            Response::builder()
                .status(404)
                .body(full("404 page not found"))
                .unwrap()
        }
    }))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_404s_is_asked_each_path_once() {
    let asked = Arc::new(std::sync::Mutex::new(BTreeMap::new()));
    let upstream = not_found_upstream(Arc::clone(&asked)).await;
    let records = poll(
        &format!("http://{upstream}"),
        Schedule::Watch,
        true,
        Duration::from_millis(800),
    )
    .await;
    let asked = asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 6, "{asked:?}");
    assert!(
        asked
            .iter()
            .all(|(path, n)| path.starts_with("GET ") && *n == 1),
        "{asked:?}"
    );
    assert_eq!(records.len(), 6);
    let server = info(&records);
    assert_eq!(server.kind(), None);
    assert_eq!(server.unavailable.len(), 6);
    assert_eq!(server.line(), "server: unknown kind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_upstream_is_recorded_once_and_asked_again_only_after_the_backoff() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Down for about five backoffs: one record, the first path's.
    let records = poll(
        &format!("http://127.0.0.1:{port}"),
        Schedule::Watch,
        true,
        Duration::from_millis(1100),
    )
    .await;
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].request.path, "/props");
    assert_eq!(
        records[0].error,
        Some(prefixscope_core::record::ExchangeError::UpstreamUnreachable)
    );
    let server = info(&records);
    assert!(
        server.line().starts_with("server: unreachable ("),
        "{}",
        server.line()
    );
}

/// Probe records interleaved in a real recording (ids of their own, times inside the window).
fn with_probes(records: &[Record]) -> Vec<Record> {
    let props = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/llama-server-samples/props.json"),
    )
    .unwrap();
    let slots = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/llama-server-samples/slots.json"),
    )
    .unwrap();
    let mut out = Vec::new();
    let next = AtomicU64::new(prefixscope_core::probe::PROBE_ID_BASE);
    for (i, record) in records.iter().enumerate() {
        out.push(record.clone());
        let (endpoint, body) = if i % 2 == 0 {
            (Endpoint::Props, &props)
        } else {
            (Endpoint::Slots, &slots)
        };
        let answer = prefixscope_core::probe::read_answer(endpoint, 200, body);
        let capture = prefixscope_core::probe::probe_capture::<Vec<u8>>(
            next.fetch_add(1, Ordering::Relaxed),
            (record.t_start_ms + 1, record.t_start_ms + 2),
            endpoint.path(),
            Some(200),
            &answer,
        );
        out.push(prefixscope_core::capture::build_record(
            capture,
            prefixscope_core::capture::BodyMode::Full,
        ));
    }
    // One before the first and one after the last: they must not widen the window either.
    for t in [
        records.iter().map(|r| r.t_start_ms).min().unwrap() - 60_000,
        records.iter().map(|r| r.t_end_ms).max().unwrap() + 60_000,
    ] {
        let answer = prefixscope_core::probe::Answer::Unreachable("refused".into());
        let capture = prefixscope_core::probe::probe_capture::<Vec<u8>>(
            next.fetch_add(1, Ordering::Relaxed),
            (t, t + 1),
            "/props",
            None,
            &answer,
        );
        out.push(prefixscope_core::capture::build_record(
            capture,
            prefixscope_core::capture::BodyMode::Full,
        ));
    }
    out
}

fn recording(name: &str) -> Vec<Record> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("recordings/llmp/llama.cpp")
        .join(name);
    read_jsonl(std::io::BufReader::new(std::fs::File::open(path).unwrap())).records
}

#[test]
fn probes_interleaved_leave_the_analysis_and_the_live_engine_unchanged() {
    for name in ["parallel.jsonl", "parallel-nocache.jsonl", "session.jsonl"] {
        let plain = recording(name);
        let probed = with_probes(&plain);
        let probes = (probed.len() - plain.len()) as u64;
        let config = Config::default();
        let expected = analysis::analyze(&plain, &config);
        let mut got = analysis::analyze(&probed, &config);
        assert_eq!(got.coverage.probes, probes, "{name}");
        got.coverage.probes = 0;
        assert_eq!(got, expected, "{name}");
        let mut reference = analysis::analyze_reference(&probed, &config);
        reference.coverage.probes = 0;
        assert_eq!(reference, analysis::analyze_reference(&plain, &config));
        // The JSON analyze prints: the same but for `coverage.probes`.
        let mut json = serde_json::to_value(analysis::analyze(&probed, &config)).unwrap();
        assert_eq!(json["coverage"]["probes"], probes);
        json["coverage"].as_object_mut().unwrap().remove("probes");
        assert_eq!(json, serde_json::to_value(&expected).unwrap(), "{name}");

        // The live engine (watch, replay): the same report and hit rate, plus the server.
        let snapshot = |records: &[Record]| {
            let mut engine =
                prefixscope_core::live::Engine::for_records(Config::default(), records);
            for record in records {
                engine.push(prefixscope_core::live::Input::Record(
                    Arc::new(record.clone()),
                    record.t_end_ms,
                ));
            }
            engine.push(prefixscope_core::live::Input::SourceDone);
            engine.snapshot()
        };
        let (a, b) = (snapshot(&plain), snapshot(&probed));
        assert_eq!(b.probes, probes);
        assert_eq!(a.probes, 0);
        assert_eq!((a.requests, a.simulated), (b.requests, b.simulated));
        assert_eq!(a.not_simulated, b.not_simulated);
        let strip = |mut json: Value| {
            let object = json.as_object_mut().unwrap();
            object.remove("server");
            // The settings the predictions start from, and so the savings: the probes' /props
            // gives the slots (here a server of 4, interleaved into a 1-slot recording).
            object.remove("calibration");
            for fix in object["fixes"].as_array_mut().into_iter().flatten() {
                fix.as_object_mut().unwrap().remove("savings");
            }
            object["coverage"].as_object_mut().unwrap().remove("probes");
            json
        };
        assert_eq!(strip(a.to_json()), strip(b.to_json()), "{name}");
        assert_eq!(a.server.line(), "server: not probed");
        // The last probe said the server was unreachable, after it had said what it is.
        assert!(
            b.server
                .line()
                .starts_with("server: llama.cpp · 4 slots (0 busy) · n_ctx 2,048 · SmolLM2-135M-Instruct.Q4_1.gguf"),
            "{}",
            b.server.line()
        );
    }
}

#[test]
fn analyze_records_and_profile_of_a_file_with_probes() {
    let plain = recording("parallel.jsonl");
    let dir = support::temp_file("probes-cli");
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, records: &[Record]| {
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        let bytes: Vec<u8> = records.iter().flat_map(record_line).collect();
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let plain_path = write("plain.jsonl", &plain);
    let probed = with_probes(&plain);
    let probed_path = write("probed.jsonl", &probed);
    let run = |args: &[&str]| {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let analyze = |path: &std::path::Path| -> Value {
        serde_json::from_str(&run(&["analyze", path.to_str().unwrap(), "--json"])).unwrap()
    };
    let (a, mut b) = (analyze(&plain_path), analyze(&probed_path));
    assert_eq!(b["coverage"]["probes"], (probed.len() - plain.len()) as u64);
    b["coverage"].as_object_mut().unwrap().remove("probes");
    assert_eq!(a["rows"], b["rows"]);
    assert_eq!(a["time"], b["time"]);
    assert_eq!(a, b);
    // analyze's coverage line says them apart from the records.
    let text = run(&["analyze", probed_path.to_str().unwrap()]);
    assert!(
        text.contains(&format!(
            "coverage: {} of {} records analysed (1 not chat), {} probes of the server not counted;",
            a["coverage"]["analysed"],
            plain.len(),
            probed.len() - plain.len()
        )),
        "{text}"
    );
    // records: probes listed as probes, counted apart.
    let text = run(&["records", probed_path.to_str().unwrap()]);
    let said = "s  llama.cpp · 4 slots · n_ctx 2,048 · SmolLM2-135M-Instruct.Q4_1.gguf";
    assert!(
        text.lines()
            .any(|l| l.starts_with("probe GET /props  200  ") && l.ends_with(&said)),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{} records in 1 file(s), 0 bad lines ({} of prefixscope's probes",
            plain.len(),
            probed.len() - plain.len()
        )),
        "{text}"
    );
    // profile: the same figures.
    let profile = |path: &std::path::Path| -> Value {
        serde_json::from_str(&run(&["profile", path.to_str().unwrap(), "--json"])).unwrap()
    };
    let (p, q) = (profile(&plain_path), profile(&probed_path));
    assert_eq!(p["points"], q["points"]);
    assert_eq!(p["ceiling"], q["ceiling"]);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `watch` without a terminal (one line per record) against `upstream`, stopped by SIGINT
/// after `run_for`: its exit code, stdout and stderr.
fn watch_headless(
    upstream: &str,
    out: &std::path::Path,
    run_for: Duration,
) -> (i32, String, String) {
    let port = free_port();
    let mut child = Command::new(BIN)
        .args([
            "watch",
            "--upstream",
            upstream,
            "--listen",
            &format!("127.0.0.1:{port}"),
            "-o",
            out.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(run_for);
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "watch never stopped"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (status.code().unwrap_or(-1), stdout, stderr)
}

#[test]
fn watch_with_no_upstream_says_so_once_and_exits_fine() {
    let dir = support::temp_file("probes-watch-down");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("rec.jsonl");
    let _ = std::fs::remove_file(&out);
    let dead = format!("http://127.0.0.1:{}", free_port());
    let (code, stdout, stderr) = watch_headless(&dead, &out, Duration::from_millis(1500));
    assert_eq!(code, 0, "{stderr}");
    let probe_lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("probe ")).collect();
    assert_eq!(probe_lines.len(), 1, "{stdout}");
    assert!(probe_lines[0].contains("upstream_unreachable"), "{stdout}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.lines().count() < 10, "{stderr}");
    let read = read_jsonl(std::fs::read(&out).unwrap().as_slice());
    assert_eq!(read.records.len(), 1);
    assert!(read.records[0].probe);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_against_the_simulated_server_records_its_props_and_the_traffic_is_unchanged() {
    let sim = sim_server(2).await;
    let dir = support::temp_file("probes-record-sim");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("rec.jsonl");
    let _ = std::fs::remove_file(&out);
    let port = free_port();
    let child = Command::new(BIN)
        .args([
            "record",
            "--upstream",
            &format!("http://{sim}"),
            "--listen",
            &format!("127.0.0.1:{port}"),
            "-o",
            out.to_str().unwrap(),
            "--no-layout",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let proxy: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let started = Instant::now();
    while tokio::net::TcpStream::connect(proxy).await.is_err() {
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let body = r#"{"model":"m","messages":[{"role":"system","content":"You help."},{"role":"user","content":"hi"}]}"#;
    for _ in 0..2 {
        let mut client = support::client(proxy).await;
        let response =
            support::send(&mut client, support::post("/v1/chat/completions", body)).await;
        assert_eq!(response.status(), 200);
        let _ = http_body_util::BodyExt::collect(response.into_body()).await;
    }
    // The probe at the start is done well within a second.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let output = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let read = read_jsonl(std::fs::read(&out).unwrap().as_slice());
    let (probes, exchanges): (Vec<Record>, Vec<Record>) =
        read.records.into_iter().partition(|r| r.probe);
    assert_eq!(
        exchanges.iter().map(|r| r.id).collect::<Vec<_>>(),
        [1, 2],
        "the exchanges' ids are the proxy's own"
    );
    let paths: Vec<&str> = probes.iter().map(|r| r.request.path.as_str()).collect();
    assert_eq!(paths, ["/props", "/health", "/v1/models", "/api/ps"]);
    let server = info(&probes);
    assert_eq!(server.total_slots(), Some(2));
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("probe GET /props  200  ")
                && l.contains("s  llama.cpp · 2 slots · n_ctx 32,768 · sim-coder-7b-q4_k_m.gguf")),
        "{stderr}"
    );
    // The exit line says what the server is.
    assert!(
        stderr.contains(
            "prefixscope: server: llama.cpp · 2 slots · n_ctx 32,768 · sim-coder-7b-q4_k_m.gguf\n"
        ),
        "{stderr}"
    );
    let report = analysis::analyze(&exchanges, &Config::default());
    let mut all = exchanges.clone();
    all.extend(probes.iter().cloned());
    let mut with = analysis::analyze(&all, &Config::default());
    assert_eq!(with.coverage.probes, 4);
    with.coverage.probes = 0;
    assert_eq!(with, report);
}

/// The slot view is llama-server's: when the probes say the server is another engine (Ollama
/// here, from its `/api/ps`), the capacity view's replay says it is what llama-server would
/// hold, not a reading of that server's cache.
#[test]
fn the_slot_view_says_when_the_server_is_not_llama_cpp() {
    let records = recording("parallel.jsonl");
    let ps = br#"{"models":[{"name":"qwen3:8b","model":"qwen3:8b","size":6000000000,"size_vram":6000000000,"context_length":8192,"expires_at":"2026-12-02T01:00:00Z"}]}"#;
    let answer = prefixscope_core::probe::read_answer(Endpoint::OllamaPs, 200, ps);
    let start = records[0].t_start_ms;
    let capture = prefixscope_core::probe::probe_capture::<Vec<u8>>(
        prefixscope_core::probe::PROBE_ID_BASE,
        (start - 2, start - 1),
        Endpoint::OllamaPs.path(),
        Some(200),
        &answer,
    );
    let probe =
        prefixscope_core::capture::build_record(capture, prefixscope_core::capture::BodyMode::Full);
    let slot_source = |probes: &[Record]| {
        let all: Vec<Record> = probes.iter().chain(&records).cloned().collect();
        let mut engine = prefixscope_core::live::Engine::for_records(Config::default(), &all);
        engine.push(prefixscope_core::live::Input::Command(
            prefixscope_core::live::Command::Capacity(true),
        ));
        for record in &all {
            engine.push(prefixscope_core::live::Input::Record(
                Arc::new(record.clone()),
                record.t_end_ms,
            ));
        }
        let snapshot = engine.snapshot();
        assert_eq!(
            snapshot.server.kind(),
            (!probes.is_empty()).then_some(ServerKind::Ollama)
        );
        Option::as_ref(&snapshot.slots)
            .map(|v| v.source.clone())
            .unwrap()
    };
    let plain = slot_source(&[]);
    assert_eq!(plain, "its own settings: /props and the traffic");
    let ollama = slot_source(&[probe]);
    assert!(
        ollama.ends_with(
            "; the server is Ollama, whose cache is not llama-server's slots: as llama-server would hold it"
        ),
        "{ollama}"
    );
}
