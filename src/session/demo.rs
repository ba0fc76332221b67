//! The demo as a library call: a simulated llama-server, the recording proxy in front of it,
//! scripted agents talking through the proxy, and the check of the analysis against what the
//! script did. `prefixscope demo` and the tests run the same code.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Error;
use super::capture::{CaptureConfig, LiveCapture};
use prefixscope_core::analysis::{self, Config, Report};
use prefixscope_core::record::{Record, read_jsonl};
use prefixscope_demo::agents::{default_slots, run_scenario, scenario_model};
use prefixscope_demo::script::{Check, RunLog, ScriptEvent, check, evictions};
use prefixscope_demo::server::{SimConfig, SimServer, Speed};

/// Where the demo's recording goes when none is named: a temporary file, removed at the end.
fn temporary_recording() -> PathBuf {
    std::env::temp_dir().join(format!(
        "prefixscope-demo-{}-{}.jsonl",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ))
}

#[derive(Debug, Clone)]
pub struct DemoConfig {
    /// One of `sim::agents::SCENARIOS`.
    pub scenario: String,
    /// The server's slots (`-np`); `None`: the scenario's default.
    pub slots: Option<usize>,
    /// The server's host-memory prompt cache (`--cache-ram`).
    pub cache_ram: bool,
    /// How much faster than real time.
    pub speed: f64,
    /// The same seed gives the same requests in the same order.
    pub seed: u64,
    /// Keep the recording here (`None`: a temporary file, removed at the end).
    pub out: Option<PathBuf>,
    /// Where the proxy listens (port 0: any free port).
    pub listen: SocketAddr,
    /// A sliding-window model (`swa` scenario) gets a full-size cache, as llama-server's
    /// `--swa-full` gives it: no forced re-prefills.
    pub swa_full: bool,
}

/// A demo ready to run: the simulated server bound, the proxy bound, the recorder running.
pub struct Demo {
    pub config: DemoConfig,
    pub slots: usize,
    pub capture: LiveCapture,
    pub sim: SimServer,
    pub speed: Arc<Speed>,
    /// `simulated llama-server: scenario …, N slots, cache-ram …, seed …`.
    pub setting: String,
}

/// What a demo run to its end did, and what the analysis made of it.
pub struct DemoOutcome {
    /// The recording's exchanges, as written (its probe records apart: `probes`).
    pub records: Vec<Record>,
    /// The recording's probe records (`probe`), in file order.
    pub probes: Vec<Record>,
    pub report: Report,
    pub log: RunLog,
    /// The script's events and the evictions from the server's log.
    pub events: Vec<ScriptEvent>,
    pub checked: Check,
    pub records_written: u64,
    /// Where the recording is (removed already when it was temporary).
    pub path: PathBuf,
}

impl Demo {
    /// Binds the simulated server and the proxy, and starts the recorder; every record goes to
    /// `consumers` too.
    pub fn start(
        config: DemoConfig,
        consumers: Vec<impl Into<prefixscope_capture::recorder::Consumer>>,
    ) -> Result<Demo, Error> {
        prefixscope_core::limits::check_speed(config.speed)
            .map_err(|why| Error::Usage(format!("--speed {why}")))?;
        let slots = config
            .slots
            .unwrap_or_else(|| default_slots(&config.scenario));
        if slots == 0 || slots > prefixscope_core::limits::MAX_SIM_SLOTS {
            return Err(Error::Usage(format!(
                "--slots must be between 1 and {}",
                prefixscope_core::limits::MAX_SIM_SLOTS
            )));
        }
        let sim_listener = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(|e| {
            Error::Unreadable(format!("cannot listen for the simulated server: {e}"))
        })?;
        let sim_addr = sim_listener
            .local_addr()
            .map_err(|e| Error::Unreadable(e.to_string()))?;
        let path = config.out.clone().unwrap_or_else(temporary_recording);
        let capture = LiveCapture::start(
            &CaptureConfig {
                upstream: format!("http://{sim_addr}"),
                listen: config.listen,
                out: Some(path),
                digest: false,
                max_body: 64 << 20,
                body_budget: prefixscope_capture::proxy::DEFAULT_BODY_BUDGET as u64,
                max_size: None,
                connect_timeout: 10,
                ca_file: None,
                // The simulated server renders its template and tokenizes as llama-server does.
                layout: true,
                // The simulated server answers `/props` as llama-server does.
                probe: prefixscope_capture::poll::Schedule::Watch,
                // For the slot predictions on screen; a headless demo lets them go.
                announce_starts: true,
            },
            consumers,
        )?;
        let speed = Arc::new(Speed::new(config.speed));
        let mut sim_config = SimConfig::new(slots, config.cache_ram);
        sim_config.seed = config.seed;
        let model = scenario_model(&config.scenario);
        if let Some(model) = model {
            sim_config.model = model.name.to_string();
            sim_config.kv.swa_window = (!config.swa_full).then_some(model.sliding_window);
            sim_config.reasoning_words = model.reasoning_words;
        }
        let sim = {
            let _entered = capture.runtime.enter();
            SimServer::from_std(sim_listener, sim_config, Arc::clone(&speed))
                .map_err(|e| Error::Unreadable(format!("cannot start the simulated server: {e}")))?
        };
        let mut setting = format!(
            "simulated llama-server: scenario {}, {slots} slot{}, cache-ram {}, seed {}",
            config.scenario,
            if slots == 1 { "" } else { "s" },
            if config.cache_ram { "on" } else { "off" },
            config.seed
        );
        if let Some(model) = model {
            let name = model.name;
            setting.push_str(&match config.swa_full {
                false => format!(
                    ", {name} (sliding window {} tokens, thinking)",
                    model.sliding_window
                ),
                true => format!(", {name} with --swa-full"),
            });
        }
        Ok(Demo {
            config,
            slots,
            capture,
            sim,
            speed,
            setting,
        })
    }

    /// Runs the scenario to its end (or `stop`), then analyses the recording and checks the
    /// analysis against the script's events and the server's evictions.
    pub fn run_to_end(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<DemoOutcome, Error> {
        let LiveCapture {
            runtime,
            proxy,
            recorder,
            path,
            listen,
            probe,
            ..
        } = self.capture;
        let handle = self.sim.handle();
        let sim = self.sim;
        let (scenario, seed, speed) = (self.config.scenario.clone(), self.config.seed, self.speed);
        let (log, served, stats) = runtime.block_on(async move {
            let (stop_sim, sim_stopped) = tokio::sync::oneshot::channel::<()>();
            let sim_task = tokio::spawn(sim.run(async {
                let _ = sim_stopped.await;
            }));
            let (stop_proxy, proxy_stopped) = tokio::sync::oneshot::channel::<()>();
            let proxy_task = tokio::spawn(proxy.run(async {
                let _ = proxy_stopped.await;
            }));
            let log = tokio::select! {
                log = run_scenario(&scenario, listen, seed, speed) => log,
                () = stop => Err("interrupted".to_string()),
            };
            let _ = stop_proxy.send(());
            let _ = proxy_task.await;
            probe.abort();
            // The recorder lays out the last records by asking the simulated server: it
            // stops once they are written.
            let stats = tokio::task::spawn_blocking(move || recorder.finish_enriched()).await;
            let _ = stop_sim.send(());
            let _ = sim_task.await;
            (log, handle.log(), stats)
        });
        drop(runtime);
        let stats = stats.map_err(|e| Error::Unreadable(format!("the recorder stopped: {e}")))?;
        let log = log.map_err(|e| Error::Unreadable(format!("the demo stopped: {e}")))?;
        // Read back what was written: the recording is what the analysis is of.
        let records = std::fs::File::open(&path)
            .map(|f| read_jsonl(std::io::BufReader::new(f)).records)
            .map_err(|e| Error::Unreadable(format!("cannot read {}: {e}", path.display())))?;
        if self.config.out.is_none() {
            let _ = std::fs::remove_file(&path);
        }
        let report = analysis::analyze(&records, &Config::default());
        let (probes, records): (Vec<Record>, Vec<Record>) =
            records.into_iter().partition(|r| r.probe);
        let mut events = log.events.clone();
        events.extend(evictions(&log, &served));
        let checked = check(&report, &records, &log, &events, self.slots == 1);
        Ok(DemoOutcome {
            records,
            probes,
            report,
            log,
            events,
            checked,
            records_written: stats.written.load(Ordering::Relaxed),
            path,
        })
    }
}

/// The demo on the TUI: the agents, the server and the proxy on their runtime's thread, the
/// live engine on `records`, until the user quits. Returns the snapshot on screen at exit.
pub fn run_screen(
    demo: Demo,
    records: crossbeam_channel::Receiver<Arc<Record>>,
    switches: super::screen::Switches,
    shutdown: &super::shutdown::Shutdown,
) -> Result<Arc<prefixscope_core::live::Snapshot>, Error> {
    use super::capture::LiveControl;
    use super::screen::{Feed, ScreenConfig, run_screen_live};
    use crate::tui::app::{Input, Source};
    use crate::tui::event::Event;

    let LiveCapture {
        runtime,
        proxy,
        recorder,
        path,
        listen,
        starts,
        ..
    } = demo.capture;
    let (events, receiver) = crossbeam_channel::unbounded();
    let (live, stop_rx) = LiveControl::new(&proxy, &recorder, &path);
    let control = DemoControl {
        live,
        speed: Arc::clone(&demo.speed),
    };
    let speed = demo.speed.get();
    let (scenario, seed, agents_speed) =
        (demo.config.scenario.clone(), demo.config.seed, demo.speed);
    let sim = demo.sim;
    let edge = {
        let events = events.clone();
        std::thread::spawn(move || {
            runtime.block_on(async {
                tokio::spawn(sim.run(std::future::pending()));
                let agents_events = events.clone();
                tokio::spawn(async move {
                    let ran = run_scenario(&scenario, listen, seed, agents_speed).await;
                    let _ = agents_events.send(end_of_demo(&ran));
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
    let screen = ScreenConfig {
        source: Source::Live {
            upstream: demo.setting,
            listen: listen.to_string(),
            recording: path.display().to_string(),
        },
        input: Input::Exchanges,
        trace_block_size: None,
        speed: Some(speed),
        switches,
        server_settings: Some(prefixscope_core::live::ServerSettings {
            slots: demo.slots,
            cache_ram: demo.config.cache_ram,
            source: "the simulated server's own settings".into(),
        }),
        analysis: Config::default(),
    };
    let feed = Feed {
        records: Some(records),
        feeder: starts.map(super::capture::RequestStarts::into_feeder),
        metrics: None,
    };
    // As `watch`: the summary is the engine's snapshot after the last record was written.
    let (result, _) = run_screen_live(screen, events, receiver, feed, &control, shutdown, || {
        control.live.stop();
        let _ = edge.join();
        recorder.finish()
    });
    if demo.config.out.is_none() {
        let _ = std::fs::remove_file(&path);
    }
    result
}

/// What the screen says when the agents are done: a status (`demo finished: 24 requests`), not
/// a warning: nothing went wrong. Agents' errors are warnings.
pub fn end_of_demo(ran: &Result<RunLog, String>) -> crate::tui::event::Event {
    use crate::tui::event::Event;
    match ran {
        Ok(RunLog {
            requests, errors, ..
        }) if errors.is_empty() => Event::Notice(format!(
            "demo finished: {}; q quits",
            prefixscope_core::units::plural(requests.len() as u64, "request")
        )),
        Ok(RunLog { errors, .. }) => Event::Warning(format!("demo stopped: {}", errors.join("; "))),
        Err(e) => Event::Warning(format!("demo stopped: {e}")),
    }
}

/// The live controls, plus speed: `+` / `-` speed the agents and the server up or down.
struct DemoControl {
    live: super::capture::LiveControl,
    speed: Arc<Speed>,
}

impl crate::tui::Control for DemoControl {
    fn set_speed(&self, speed: f64) {
        self.speed.set(speed);
    }
    fn stop(&self) {
        self.live.stop();
    }
    fn in_flight(&self) -> u64 {
        crate::tui::Control::in_flight(&self.live)
    }
    fn records_written(&self) -> Option<u64> {
        crate::tui::Control::records_written(&self.live)
    }
    fn upstream_ok(&self) -> Option<bool> {
        self.live.upstream_ok()
    }
    fn proxy_notes(&self) -> Vec<String> {
        self.live.proxy_notes()
    }
    fn export(&self, format: &str, path: &str) -> Result<String, String> {
        crate::tui::Control::export(&self.live, format, path)
    }
}
