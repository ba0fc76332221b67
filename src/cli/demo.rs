//! `prefixscope demo`: a simulated llama-server, the recording proxy in front of it, scripted
//! agents talking through the proxy, and the TUI on that traffic. No model, no GPU. When stdout
//! is not a terminal it runs headless and prints the analysis, and how many of the script's
//! events it names.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use clap::{Args, ValueEnum};

use super::record::{Capture, CaptureArgs, start_capture};
use super::watch::Live;
use super::{EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE, tui};
use prefixscope::analysis::{self, Config};
use prefixscope::live::LIVE_BLOCK_SIZE;
use prefixscope::record::{Record, read_jsonl};
use prefixscope::sim::agents::{SCENARIOS, default_slots, run_scenario};
use prefixscope::sim::script::{RunLog, check, evictions};
use prefixscope::sim::server::{SimConfig, SimServer, Speed};
use prefixscope::tui::Control;
use prefixscope::tui::app::{Input, Source};
use prefixscope::tui::event::Event;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Args)]
pub struct DemoArgs {
    /// What the agents do: mixed (a coding agent with a subagent, side-calls, a date change, a
    /// new tool and a compaction, next to a reviewer), side-calls, parallel (four agents),
    /// volatile-system (a nonce in front of the system prompt), compaction.
    #[arg(long, default_value = "mixed", value_parser = SCENARIOS)]
    scenario: String,
    /// The server's slots (`-np`); default 2 for mixed, 1 otherwise.
    #[arg(long)]
    slots: Option<usize>,
    /// The server's host-memory prompt cache (llama-server's `--cache-ram`).
    #[arg(long, value_enum, default_value = "off")]
    cache_ram: OnOff,
    /// How much faster than real time the agents and the server run (`+` / `-` change it).
    #[arg(long, default_value_t = 1.0)]
    speed: f64,
    /// The same seed gives the same requests in the same order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Keep the recording in this file (by default it goes to a temporary file, removed at the end).
    #[arg(short, long)]
    out: Option<PathBuf>,
    /// Where the proxy listens (port 0: any free port).
    #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], 0)))]
    listen: SocketAddr,
    /// The script's events, the server's log and the check, as JSON (for tests).
    #[arg(long, hide = true)]
    events: Option<PathBuf>,
    /// Don't capture the mouse (keep the terminal's own selection).
    #[arg(long)]
    no_mouse: bool,
    /// A line per record and the summary, even on a terminal.
    #[arg(long)]
    headless: bool,
}

pub fn run(args: DemoArgs) -> u8 {
    if !(args.speed > 0.0 && args.speed.is_finite()) {
        eprintln!("prefixscope: --speed must be a positive number");
        return EXIT_USAGE;
    }
    let slots = args.slots.unwrap_or_else(|| default_slots(&args.scenario));
    if slots == 0 || slots > 64 {
        eprintln!("prefixscope: --slots must be between 1 and 64");
        return EXIT_USAGE;
    }
    let cache_ram = args.cache_ram == OnOff::On;
    let sim_listener = match std::net::TcpListener::bind(("127.0.0.1", 0)) {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("prefixscope: cannot listen for the simulated server: {e}");
            return EXIT_UNREADABLE;
        }
    };
    let sim_addr = match sim_listener.local_addr() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("prefixscope: {e}");
            return EXIT_UNREADABLE;
        }
    };
    let keep = args.out.is_some();
    let path = args.out.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("prefixscope-demo-{}.jsonl", std::process::id()))
    });
    if !keep {
        let _ = std::fs::remove_file(&path);
    }
    let capture_args = CaptureArgs {
        upstream: format!("http://{sim_addr}"),
        listen: args.listen,
        out: Some(path.clone()),
        digest: false,
        max_body: 64 << 20,
        max_size: None,
        connect_timeout: 10.0,
        ca_file: None,
    };
    let (records_tx, records_rx) = crossbeam_channel::unbounded::<Arc<Record>>();
    let capture = match start_capture(&capture_args, vec![records_tx]) {
        Ok(capture) => capture,
        Err(code) => return code,
    };
    let speed = Arc::new(Speed::new(args.speed));
    let mut config = SimConfig::new(slots, cache_ram);
    config.seed = args.seed;
    let sim = {
        let _entered = capture.runtime.enter();
        match SimServer::from_std(sim_listener, config, Arc::clone(&speed)) {
            Ok(sim) => sim,
            Err(e) => {
                eprintln!("prefixscope: cannot start the simulated server: {e}");
                return EXIT_UNREADABLE;
            }
        }
    };
    let setting = format!(
        "simulated llama-server: scenario {}, {slots} slot{}, cache-ram {}, seed {}",
        args.scenario,
        if slots == 1 { "" } else { "s" },
        if cache_ram { "on" } else { "off" },
        args.seed
    );
    let run = DemoRun {
        scenario: args.scenario.clone(),
        seed: args.seed,
        speed,
        sim,
        setting,
    };
    let code = if args.headless || !std::io::stdout().is_terminal() {
        headless(capture, run, records_rx, args.events.as_ref(), slots == 1)
    } else {
        interactive(capture, run, records_rx, !args.no_mouse)
    };
    if keep {
        eprintln!("prefixscope: the recording is in {}", path.display());
    } else {
        let _ = std::fs::remove_file(&path);
    }
    code
}

struct DemoRun {
    scenario: String,
    seed: u64,
    speed: Arc<Speed>,
    sim: SimServer,
    setting: String,
}

/// No terminal: run the scenario to its end, then print the analysis and the script's check.
fn headless(
    capture: Capture,
    run: DemoRun,
    records: crossbeam_channel::Receiver<Arc<Record>>,
    events_out: Option<&PathBuf>,
    exact_evictor: bool,
) -> u8 {
    let Capture {
        runtime,
        proxy,
        recorder,
        path,
        listen,
        ..
    } = capture;
    eprintln!(
        "prefixscope: {}; agents -> proxy http://{listen} -> server; recording to {}",
        run.setting,
        path.display()
    );
    let collector = std::thread::spawn(move || records.iter().collect::<Vec<_>>());
    let handle = run.sim.handle();
    let (log, served) = runtime.block_on(async {
        let (stop_sim, sim_stopped) = tokio::sync::oneshot::channel::<()>();
        let sim_task = tokio::spawn(run.sim.run(async {
            let _ = sim_stopped.await;
        }));
        let (stop_proxy, proxy_stopped) = tokio::sync::oneshot::channel::<()>();
        let proxy_task = tokio::spawn(proxy.run(async {
            let _ = proxy_stopped.await;
        }));
        let log = tokio::select! {
            log = run_scenario(&run.scenario, listen, run.seed, run.speed) => log,
            _ = tokio::signal::ctrl_c() => Err("interrupted".to_string()),
        };
        let _ = stop_proxy.send(());
        let _ = proxy_task.await;
        let _ = stop_sim.send(());
        let _ = sim_task.await;
        (log, handle.log())
    });
    drop(runtime);
    let stats = recorder.finish();
    let records: Vec<Record> = collector
        .join()
        .unwrap_or_default()
        .into_iter()
        .map(|r| (*r).clone())
        .collect();
    let log = match log {
        Ok(log) => log,
        Err(e) => {
            eprintln!("prefixscope: the demo stopped: {e}");
            return EXIT_UNREADABLE;
        }
    };
    for error in &log.errors {
        eprintln!("prefixscope: agent error: {error}");
    }
    // Read back what was written: the recording is what the analysis is of.
    let written = std::fs::File::open(&path)
        .map(|f| read_jsonl(std::io::BufReader::new(f)).records)
        .unwrap_or(records);
    let report = analysis::analyze(&written, &Config::default());
    print!("{}", report.summary());
    let mut events = log.events.clone();
    events.extend(evictions(&log, &served));
    let checked = check(&report, &written, &log, &events, exact_evictor);
    println!(
        "script: {} requests, {} events, {} named by the analysis ({})",
        log.requests.len(),
        checked.events.len(),
        checked.named(),
        checked.summary()
    );
    if let Some(out) = events_out {
        let json = serde_json::json!({
            "requests": log.requests,
            "events": events,
            "errors": log.errors,
            "check": checked,
        });
        if let Err(e) = std::fs::write(out, json.to_string()) {
            eprintln!("prefixscope: cannot write {}: {e}", out.display());
        }
    }
    eprintln!(
        "prefixscope: {} records written",
        stats.written.load(Ordering::Relaxed)
    );
    if log.errors.is_empty() {
        EXIT_OK
    } else {
        EXIT_UNREADABLE
    }
}

/// The TUI on the demo's live traffic; `q` stops it.
fn interactive(
    capture: Capture,
    run: DemoRun,
    records: crossbeam_channel::Receiver<Arc<Record>>,
    mouse: bool,
) -> u8 {
    let Capture {
        runtime,
        proxy,
        recorder,
        path,
        listen,
        ..
    } = capture;
    let (events, receiver) = crossbeam_channel::unbounded();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let control = DemoControl {
        live: Live {
            proxy: proxy.stats(),
            recorder: recorder.stats(),
            stop: std::sync::Mutex::new(Some(stop_tx)),
            files: vec![path.clone()],
        },
        speed: Arc::clone(&run.speed),
    };
    let speed = run.speed.get();
    let setting = run.setting.clone();
    let edge = {
        let events = events.clone();
        std::thread::spawn(move || {
            runtime.block_on(async {
                tokio::spawn(run.sim.run(std::future::pending()));
                let agents_events = events.clone();
                tokio::spawn(async move {
                    let message = match run_scenario(&run.scenario, listen, run.seed, run.speed)
                        .await
                    {
                        Ok(RunLog {
                            requests, errors, ..
                        }) if errors.is_empty() => {
                            format!("demo finished: {} requests; q quits", requests.len())
                        }
                        Ok(RunLog { errors, .. }) => format!("demo stopped: {}", errors.join("; ")),
                        Err(e) => format!("demo stopped: {e}"),
                    };
                    let _ = agents_events.send(Event::Notice(message));
                });
                proxy
                    .run(async {
                        let _ = stop_rx.await;
                    })
                    .await;
            });
            // The agents and the simulated server end with the runtime.
            drop(runtime);
            let _ = events.send(Event::ProxyStopped);
        })
    };
    let source = Source::Live {
        upstream: setting,
        listen: listen.to_string(),
        recording: path.display().to_string(),
    };
    let view = tui::View {
        source,
        input: Input::Exchanges,
        block_size: LIVE_BLOCK_SIZE,
        speed: Some(speed),
        mouse,
    };
    let feed = tui::Feed {
        records: Some(records),
        feeder: None,
    };
    let code = tui::run_tui(view, events, receiver, feed, &control);
    control.stop();
    let _ = edge.join();
    let _ = recorder.finish();
    code
}

/// The live controls, plus speed: `+` / `-` speed the agents and the server up or down.
struct DemoControl {
    live: Live,
    speed: Arc<Speed>,
}

impl Control for DemoControl {
    fn set_speed(&self, speed: f64) {
        self.speed.set(speed);
    }
    fn stop(&self) {
        self.live.stop();
    }
    fn in_flight(&self) -> u64 {
        self.live.in_flight()
    }
    fn records_written(&self) -> Option<u64> {
        self.live.records_written()
    }
    fn upstream_ok(&self) -> Option<bool> {
        self.live.upstream_ok()
    }
    fn export(&self, format: &str, path: &str) -> Result<String, String> {
        self.live.export(format, path)
    }
}
