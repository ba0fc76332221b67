//! `--metrics` and `analyze --prometheus`: the real binary's endpoint in front of the simulated
//! llama-server, checked by the real promtool and scraped by a real Prometheus (Debian's
//! `prometheus` package; CI installs it and sets PREFIXSCOPE_REQUIRE_PROMETHEUS=1), and the
//! Grafana dashboard in `assets/` held to the families the exporter writes.

#[path = "support/prometheus.rs"]
mod prometheus;
#[path = "support/tmux.rs"]
mod tmux;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use prefixscope_demo::agents::run_scenario;
use prefixscope_demo::script::RunLog;
use prefixscope_demo::server::{SimConfig, SimServer, Speed};
use prometheus::{Prometheus, free_port, get, have_prometheus, promtool_check, wait_ok};

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");
const OPENMETRICS: &str = "application/openmetrics-text;version=1.0.0";

fn temp_dir(name: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("prefixscope-metrics-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// `prefixscope record --metrics` in front of `upstream`; SIGTERM on drop.
struct Proxy {
    child: Child,
    listen: SocketAddr,
    metrics: SocketAddr,
    recording: PathBuf,
}

impl Proxy {
    fn start(dir: &Path, name: &str, upstream: SocketAddr) -> Proxy {
        let (listen, metrics) = (loopback(free_port()), loopback(free_port()));
        let recording = dir.join(format!("{name}.jsonl"));
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
        let child = Command::new(BIN)
            .args(["record", "-q", "--no-layout", "--upstream"])
            .arg(format!("http://{upstream}"))
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--metrics")
            .arg(metrics.to_string())
            .arg("-o")
            .arg(&recording)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let proxy = Proxy {
            child,
            listen,
            metrics,
            recording,
        };
        wait_ok(metrics, "/healthz", Duration::from_secs(20));
        proxy
    }

    /// Waits until `n` traffic records are on disk and the endpoint counted them.
    fn wait_for_records(&self, n: usize) {
        wait_for_records(self.metrics, &self.recording, n);
    }
}

/// Traffic records in `recording` so far.
fn traffic_records(recording: &Path) -> usize {
    std::fs::read_to_string(recording)
        .unwrap_or_default()
        .lines()
        .filter(|line| !line.contains("\"probe\":true"))
        .count()
}

/// Waits until `n` traffic records are in `recording` and the endpoint at `metrics` counted them,
/// then for the analysis of the last ones to be in its exposition.
fn wait_for_records(metrics: SocketAddr, recording: &Path, n: usize) {
    {
        let start = Instant::now();
        let counted = || {
            let (_, body) = get(metrics, "/metrics", None).unwrap_or_default();
            samples(&body)
                .iter()
                .filter(|(name, labels, _)| {
                    name == "prefixscope_records_total" && labels["kind"] == "traffic"
                })
                .map(|(_, _, v)| *v as usize)
                .sum::<usize>()
        };
        while traffic_records(recording) < n || counted() < n {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{} of {n} records written, {} counted",
                traffic_records(recording),
                counted()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // One refresh more, so the last records' analysis is in the exposition.
        std::thread::sleep(prefixscope::metrics::serve::REFRESH * 3);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // SAFETY: a signal to our own child, by its id.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

/// The simulated llama-server on a free port, serving on `runtime` until it is dropped.
fn sim_server(runtime: &tokio::runtime::Runtime, slots: usize, speed: &Arc<Speed>) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let _entered = runtime.enter();
    let server =
        SimServer::from_std(listener, SimConfig::new(slots, false), Arc::clone(speed)).unwrap();
    runtime.spawn(server.run(std::future::pending()));
    addr
}

/// `(name, labels, value)` of each sample of a classic exposition.
fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|l| !l.is_empty())
                .filter_map(|pair| {
                    let (key, value) = pair.split_once("=\"")?;
                    Some((key.to_string(), value.trim_end_matches('"').to_string()))
                })
                .collect();
            Some((name.to_string(), labels, value.parse().ok()?))
        })
        .collect()
}

fn sum_by(text: &str, name: &str, key: &str) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    for (n, labels, value) in samples(text) {
        if n == name {
            *sums.entry(labels[key].clone()).or_default() += value;
        }
    }
    sums
}

/// `analyze --json FILE`.
fn analyze_json(file: &Path) -> Value {
    let out = Command::new(BIN)
        .arg("analyze")
        .arg(file)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn tokens_by_cause(report: &Value) -> BTreeMap<String, u64> {
    report["time"]["by_cause"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(cause, total)| (cause.clone(), total["tokens"].as_u64().unwrap()))
        .collect()
}

fn drive(
    runtime: &tokio::runtime::Runtime,
    scenario: &str,
    proxy: SocketAddr,
    seed: u64,
) -> RunLog {
    let speed = Arc::new(Speed::new(1000.0));
    let log = runtime
        .block_on(run_scenario(scenario, proxy, seed, speed))
        .unwrap();
    assert_eq!(log.errors, Vec::<String>::new());
    log
}

#[test]
fn prometheus_sums_two_proxies_losses_by_cause_as_their_recordings_analyses() {
    if !have_prometheus("prometheus_sums_two_proxies_losses_by_cause") {
        return;
    }
    let dir = temp_dir("fleet");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let speed = Arc::new(Speed::new(1000.0));
    // Two servers, one proxy each, as a fleet runs them.
    let proxies: Vec<Proxy> = (0..2)
        .map(|i| {
            let upstream = sim_server(&runtime, 2, &speed);
            Proxy::start(&dir, &format!("proxy{i}"), upstream)
        })
        .collect();
    let prometheus = Prometheus::start(
        &dir.join("prometheus"),
        &proxies.iter().map(|p| p.metrics).collect::<Vec<_>>(),
    );
    for (i, proxy) in proxies.iter().enumerate() {
        let log = drive(&runtime, "mixed", proxy.listen, 3 + i as u64);
        proxy.wait_for_records(log.requests.len());
    }
    // The sum of the two recordings' analyses, by cause.
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for proxy in &proxies {
        for (cause, tokens) in tokens_by_cause(&analyze_json(&proxy.recording)) {
            *expected.entry(cause).or_default() += tokens;
        }
    }
    assert!(expected.len() > 1, "{expected:?}");
    // Prometheus scrapes every second: wait for a scrape of both after the last record.
    let query = "sum by (cause) (prefixscope_lost_tokens)";
    let start = Instant::now();
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    while got != expected {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{query}: {got:?}, the analyses: {expected:?}\n{}",
            prometheus.log()
        );
        std::thread::sleep(Duration::from_millis(500));
        got = prometheus
            .query(query)
            .as_array()
            .unwrap()
            .iter()
            .map(|series| {
                let cause = series["metric"]["cause"].as_str().unwrap().to_string();
                let value: f64 = series["value"][1].as_str().unwrap().parse().unwrap();
                (cause, value as u64)
            })
            .collect();
    }
    eprintln!("{query} = {got:?} = the two analyses' sum");
    // Both proxies are in it, each with its own instance.
    let instances = prometheus.query("count by (instance) (prefixscope_records_total)");
    assert_eq!(instances.as_array().unwrap().len(), 2, "{instances}");
}

#[test]
fn the_endpoint_and_analyze_prometheus_pass_promtool_and_agree() {
    if !have_prometheus("the_endpoint_and_analyze_prometheus_pass_promtool") {
        return;
    }
    let dir = temp_dir("promtool");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let speed = Arc::new(Speed::new(1000.0));
    let proxy = Proxy::start(&dir, "proxy", sim_server(&runtime, 1, &speed));

    // Before any request: every family, with HELP and TYPE.
    let (status, before) = get(proxy.metrics, "/metrics", None).unwrap();
    assert_eq!(status, 200);
    let (ok, said) = promtool_check(&before);
    assert!(ok, "promtool on the empty endpoint: {said}\n{before}");
    for family in ["prefixscope_lost_tokens", "prefixscope_requests_total"] {
        assert!(before.contains(&format!("# HELP {family} ")), "{before}");
        assert!(before.contains(&format!("# TYPE {family} ")), "{before}");
    }

    let log = drive(&runtime, "side-calls", proxy.listen, 5);
    proxy.wait_for_records(log.requests.len());
    let (status, body) = get(proxy.metrics, "/metrics", None).unwrap();
    assert_eq!(status, 200);
    let (ok, said) = promtool_check(&body);
    assert!(ok, "promtool on the endpoint: {said}\n{body}");
    // What Prometheus asks for: OpenMetrics, ending with its EOF.
    let (_, openmetrics) = get(proxy.metrics, "/metrics", Some(OPENMETRICS)).unwrap();
    assert!(openmetrics.ends_with("# EOF\n"), "{openmetrics}");
    assert_eq!(get(proxy.metrics, "/healthz", None).unwrap().0, 200);
    assert_eq!(get(proxy.metrics, "/nothing", None).unwrap().0, 404);

    // `analyze --prometheus` of the recording: promtool passes it, and its losses by cause
    // are the endpoint's and the JSON report's.
    let file = dir.join("recording.prom");
    let out = Command::new(BIN)
        .arg("analyze")
        .arg(&proxy.recording)
        .arg("--prometheus")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let batch = std::fs::read_to_string(&file).unwrap();
    let (ok, said) = promtool_check(&batch);
    assert!(ok, "promtool on analyze --prometheus: {said}\n{batch}");
    let live = sum_by(&body, "prefixscope_lost_tokens", "cause");
    assert!(!live.is_empty(), "{body}");
    assert_eq!(sum_by(&batch, "prefixscope_lost_tokens", "cause"), live);
    let report = analyze_json(&proxy.recording);
    let by_cause: BTreeMap<String, f64> = tokens_by_cause(&report)
        .into_iter()
        .map(|(cause, tokens)| (cause, tokens as f64))
        .collect();
    assert_eq!(live, by_cause);
    // The same families in both (the proxy-only ones without samples in the batch file).
    let families = |text: &str| -> BTreeSet<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(str::to_string)
            .collect()
    };
    assert_eq!(families(&batch), families(&body));
}

#[test]
fn a_taken_metrics_port_is_a_clear_error_at_start() {
    let dir = temp_dir("taken");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let recording = dir.join("rec.jsonl");
    let out = Command::new(BIN)
        .args(["record", "--upstream", "http://127.0.0.1:9", "--listen"])
        .arg(loopback(free_port()).to_string())
        .arg("--metrics")
        .arg(addr.to_string())
        .arg("-o")
        .arg(&recording)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on --metrics {addr}")),
        "{stderr}"
    );
    assert!(stderr.contains("in use"), "{stderr}");
    // Refused before anything was created.
    assert!(!recording.exists());
}

/// Every `prefixscope_…` name in `expr`.
fn names_in(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("prefixscope_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.push(name);
    }
    names
}

#[test]
fn the_grafana_dashboard_is_valid_and_reads_only_families_the_exporter_writes() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/grafana-prefixscope.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    for key in [
        "title",
        "uid",
        "schemaVersion",
        "panels",
        "time",
        "templating",
    ] {
        assert!(dashboard.get(key).is_some(), "no {key}");
    }
    assert!(dashboard["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(
        dashboard["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty() && u.len() <= 40)
    );
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 30));
    // The sample names the exporter writes (counters as `X_total`), from an empty report.
    let report =
        prefixscope_core::analysis::analyze(&[], &prefixscope_core::analysis::Config::default());
    let text = prefixscope::metrics::of_recording(&[], &report, &Default::default(), "s");
    let written: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split(' ').next())
        .map(str::to_string)
        .collect();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(panels.len() >= 3);
    let mut ids = BTreeSet::new();
    let mut read = BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "{panel}");
        assert!(
            ids.insert(panel["id"].as_u64().unwrap()),
            "duplicate id: {title}"
        );
        assert!(panel["type"].as_str().is_some(), "{title}");
        let grid = &panel["gridPos"];
        for key in ["h", "w", "x", "y"] {
            assert!(grid[key].as_u64().is_some(), "{title}: gridPos.{key}");
        }
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}");
        for target in targets {
            let expr = target["expr"].as_str().unwrap();
            assert!(target["refId"].as_str().is_some(), "{title}");
            let names = names_in(expr);
            assert!(!names.is_empty(), "{title}: {expr}");
            for name in names {
                assert!(
                    written.contains(&name),
                    "{title}: {name} is not written ({expr})"
                );
                read.insert(name);
            }
        }
    }
    // What the issue asks the dashboard for.
    for name in [
        "prefixscope_lost_seconds",
        "prefixscope_lost_tokens",
        "prefixscope_cache_ceiling_ratio",
        "prefixscope_server_reuse_ratio",
    ] {
        assert!(read.contains(name), "no panel reads {name}");
    }
}

/// `watch --metrics` in a real terminal: the TUI and the endpoint run side by side on one
/// recorder, and the endpoint's losses by cause equal `analyze` of what `watch` recorded, as
/// the screen's do (`tests/tui_tmux.rs` holds the screen to `analyze`).
#[test]
fn watch_serves_the_metrics_of_what_it_records_beside_its_screen() {
    if !tmux::have_tmux() || !have_prometheus("watch_serves_the_metrics") {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let speed = Arc::new(Speed::new(1000.0));
    let upstream = sim_server(&runtime, 2, &speed);
    let (listen, metrics) = (loopback(free_port()), loopback(free_port()));
    let command = format!(
        "{BIN} watch --no-layout --upstream http://{upstream} --listen {listen} --metrics {metrics} --metrics-window 1000 -o rec.jsonl; echo EXITED $?; sleep 60"
    );
    let tmux = tmux::Tmux::start("watch-metrics", &command);
    tmux.wait_for(&["Conversations"]);
    wait_ok(metrics, "/healthz", Duration::from_secs(20));
    let log = drive(&runtime, "mixed", listen, 5);
    let recording = tmux.dir.join("rec.jsonl");
    wait_for_records(metrics, &recording, log.requests.len());
    tmux.wait_for(&[&format!("{} requests", log.requests.len())]);

    let (_, text) = get(metrics, "/metrics", None).unwrap();
    let expected = tokens_by_cause(&analyze_json(&recording));
    assert!(expected.len() > 1, "{expected:?}");
    let got: BTreeMap<String, u64> = sum_by(&text, "prefixscope_lost_tokens", "cause")
        .into_iter()
        .map(|(cause, tokens)| (cause, tokens as u64))
        .collect();
    assert_eq!(got, expected, "{text}");
    // Fewer records than one window: nothing closed, nothing skipped.
    let total = |name: &str| sum_by(&text, name, "server").values().sum::<f64>();
    assert_eq!(
        total("prefixscope_metrics_windows_closed_total"),
        0.0,
        "{text}"
    );
    assert_eq!(
        total("prefixscope_metrics_records_skipped_total"),
        0.0,
        "{text}"
    );
    assert_eq!(
        total("prefixscope_metrics_window_records"),
        log.requests.len() as f64,
        "{text}"
    );
    let (valid, problems) = promtool_check(&text);
    assert!(valid, "{problems}");

    tmux.keys(&["q"]);
    let screen = tmux.wait_for(&["EXITED 0"]);
    assert!(screen.contains("records written"), "{screen}");
}

/// `watch --metrics` without a terminal has one analysis behind its summary and its endpoint:
/// past `--metrics-window` records it starts again, the endpoint's closed windows are the
/// summary's restarts, and its losses by cause are the sum of `analyze` of each window's records.
#[test]
fn watch_has_one_analysis_behind_its_summary_and_its_endpoint() {
    let dir = temp_dir("watch-one-analysis");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let speed = Arc::new(Speed::new(1000.0));
    let upstream = sim_server(&runtime, 2, &speed);
    let (listen, metrics) = (loopback(free_port()), loopback(free_port()));
    let recording = dir.join("rec.jsonl");
    let child = Command::new(BIN)
        .args([
            "watch",
            "--no-layout",
            "--no-probe",
            "--metrics-window",
            "100",
        ])
        .arg("--upstream")
        .arg(format!("http://{upstream}"))
        .arg("--listen")
        .arg(listen.to_string())
        .arg("--metrics")
        .arg(metrics.to_string())
        .arg("-o")
        .arg(&recording)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_ok(metrics, "/healthz", Duration::from_secs(20));
    let mut n = 0;
    for seed in 1.. {
        n += drive(&runtime, "mixed", listen, seed).requests.len();
        if n > 250 {
            break;
        }
    }
    wait_for_records(metrics, &recording, n);
    let (_, text) = get(metrics, "/metrics", None).unwrap();
    // SAFETY: a signal to our own child, by its id.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGINT);
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let records =
        prefixscope_core::record::read_jsonl(std::fs::read(&recording).unwrap().as_slice()).records;
    assert_eq!(records.len(), n);
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for window in records.chunks(100) {
        let report = prefixscope_core::analysis::analyze(window, &Default::default());
        for (cause, total) in report.time.by_cause {
            *expected.entry(cause).or_default() += total.tokens;
        }
    }
    expected.retain(|_, tokens| *tokens > 0);
    let got: BTreeMap<String, u64> = sum_by(&text, "prefixscope_lost_tokens", "cause")
        .into_iter()
        .map(|(cause, tokens)| (cause, tokens as u64))
        .filter(|(_, tokens)| *tokens > 0)
        .collect();
    assert!(expected.len() > 1, "{expected:?}");
    assert_eq!(got, expected, "{text}");
    let total = |name: &str| sum_by(&text, name, "server").values().sum::<f64>() as usize;
    let closed = n.div_ceil(100) - 1;
    assert_eq!(total("prefixscope_metrics_windows_closed_total"), closed);
    assert_eq!(
        total("prefixscope_metrics_window_records"),
        n - closed * 100
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "analysis window (100 records, or 512 MiB) full: the analysis started again {closed} times"
        )),
        "{stdout}"
    );
}
