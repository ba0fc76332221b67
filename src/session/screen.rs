//! What `replay`, `watch` and `demo` share: the live engine on its thread, and the TUI on the
//! real terminal around it.

use std::path::PathBuf;
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::Error;
use super::shutdown::Shutdown;
use crate::tui::app::{App, Input, Source};
use crate::tui::event::Event;
use crate::tui::theme::Theme;
use crate::tui::{Clock, Control, SystemClock, run, spawn_input, terminal};
use prefixscope_core::analysis::Config;
use prefixscope_core::live::{self, Command, Engine, Input as EngineInput, Snapshot};
use prefixscope_core::record::Record;

/// What the app shows and how.
pub struct ScreenConfig {
    pub source: Source,
    pub input: Input,
    /// A trace's tokens per block (its requests come with their blocks); `None` for records,
    /// whose block model the engine learns (`watch`, the demo) or is given by the replay's
    /// first pass.
    pub trace_block_size: Option<u32>,
    /// Replay speed (`None` live).
    pub speed: Option<f64>,
    pub switches: Switches,
    /// The server's slots and host cache, when known: the capacity view's slot residency is
    /// replayed with them (else with the setting nearest what the server reported, said).
    pub server_settings: Option<prefixscope_core::live::ServerSettings>,
    /// The analysis's settings (its prices).
    pub analysis: Config,
}

/// What the person (and the tests) choose about the screen itself.
#[derive(Debug, Clone, Default)]
pub struct Switches {
    /// Capture the mouse (off: the terminal's own selection works).
    pub mouse: bool,
    /// Write each key's latency (µs, one a line) here at exit.
    pub key_latency_file: Option<PathBuf>,
    /// Panic once the terminal is set up (the test that it is restored).
    pub panic_for_test: bool,
}

/// Where the engine's records come from: the recorder's consumer channel (`watch`, `demo`),
/// and/or a feeder given the engine's input channel (`replay`) on a thread of its own; and
/// where its figures also go (`watch --metrics`).
pub struct Feed {
    pub records: Option<Receiver<Arc<Record>>>,
    pub feeder: Option<Box<dyn FnOnce(Sender<EngineInput>) + Send>>,
    pub metrics: Option<super::capture::FiguresSender>,
}

/// The edge's controls, with commands going to the engine's thread.
struct WithEngine<'a> {
    edge: &'a dyn Control,
    engine: &'a live::Handle,
}

impl Control for WithEngine<'_> {
    fn set_speed(&self, speed: f64) {
        self.edge.set_speed(speed);
    }
    fn stop(&self) {
        self.edge.stop();
    }
    fn pause_source(&self, paused: bool) -> bool {
        self.edge.pause_source(paused)
    }
    fn step_source(&self, records: u64) {
        self.edge.step_source(records);
    }
    fn seek_source(&self, to: crate::tui::Seek) -> Result<String, String> {
        self.edge.seek_source(to)
    }
    fn in_flight(&self) -> u64 {
        self.edge.in_flight()
    }
    fn records_written(&self) -> Option<u64> {
        self.edge.records_written()
    }
    fn upstream_ok(&self) -> Option<bool> {
        self.edge.upstream_ok()
    }
    fn proxy_notes(&self) -> Vec<String> {
        self.edge.proxy_notes()
    }
    fn export(&self, format: &str, path: &str) -> Result<String, String> {
        self.edge.export(format, path)
    }
    fn command(&self, command: Command) -> Option<Arc<Snapshot>> {
        self.engine.command(command);
        None
    }
}

/// Runs the live engine on its thread and the app on the real terminal until it quits; the
/// terminal is restored on every way out (the guard's Drop, and the panic hook for panics).
/// Returns the snapshot on screen at exit (its summary is what the caller prints): a replay's
/// summary is of what was on screen. A signal quits as `q` does (`Event::Signal`); a second one
/// forces, restoring the terminal first.
pub fn run_screen(
    view: ScreenConfig,
    events: Sender<Event>,
    receiver: Receiver<Event>,
    feed: Feed,
    control: &dyn Control,
    shutdown: &Shutdown,
) -> Result<Arc<Snapshot>, Error> {
    run_app(view, events, &receiver, feed, control, shutdown).0
}

/// `run_screen` for a live capture (`watch`, `demo`): once the app quits, `finish` stops the
/// proxy and finishes the recorder (every exchange still in flight answered and written), and
/// the snapshot returned is the engine's last, taken after it has analysed every record the
/// recorder handed it. So the summary counts the requests "records written" counts, the one in
/// flight at quit included. Returns what `finish` returned beside it.
pub fn run_screen_live<T>(
    view: ScreenConfig,
    events: Sender<Event>,
    receiver: Receiver<Event>,
    feed: Feed,
    control: &dyn Control,
    shutdown: &Shutdown,
    finish: impl FnOnce() -> T,
) -> (Result<Arc<Snapshot>, Error>, T) {
    let (result, engine) = run_app(view, events, &receiver, feed, control, shutdown);
    let finished = finish();
    let result = result.map(|on_screen| last_snapshot(on_screen, engine, &receiver));
    (result, finished)
}

/// The newest snapshot once the engine has taken every input. Its sources must be closed (the
/// recorder finished, no feeder left): it then publishes a last snapshot if anything changed
/// and ends; `on_screen` (the app's newest) stands when nothing did.
pub fn last_snapshot(
    on_screen: Arc<Snapshot>,
    engine: live::Handle,
    events: &Receiver<Event>,
) -> Arc<Snapshot> {
    engine.join();
    events
        .try_iter()
        .fold(on_screen, |newest, event| match event {
            Event::Snapshot(snapshot) if snapshot.generation > newest.generation => snapshot,
            _ => newest,
        })
}

/// The app on the terminal until it quits: the app's newest snapshot, and the engine (still
/// running on its thread).
fn run_app(
    view: ScreenConfig,
    events: Sender<Event>,
    receiver: &Receiver<Event>,
    feed: Feed,
    control: &dyn Control,
    shutdown: &Shutdown,
) -> (Result<Arc<Snapshot>, Error>, live::Handle) {
    {
        let events = events.clone();
        shutdown.on_stop(move |signal| {
            let _ = events.send(Event::Signal(signal.name()));
        });
    }
    let mut engine = match view.trace_block_size {
        Some(block_size) => Engine::with_block_size(view.analysis.clone(), block_size),
        None => Engine::new(view.analysis.clone()),
    };
    engine.set_server_settings(view.server_settings.clone());
    let first = Arc::new(engine.snapshot());
    let publish = {
        let events = events.clone();
        let metrics = feed.metrics;
        move |snapshot: Arc<Snapshot>| {
            if let Some(metrics) = &metrics {
                let snapshot = Arc::clone(&snapshot);
                let _ = metrics.send(Box::new(move || {
                    crate::metrics::Figures::of_snapshot(&snapshot)
                }));
            }
            let _ = events.send(Event::Snapshot(snapshot));
        }
    };
    let clock: Arc<dyn Fn() -> i64 + Send + Sync> = Arc::new(|| SystemClock.now_ms());
    let handle = live::spawn(engine, feed.records, clock, publish);
    if let Some(feeder) = feed.feeder {
        let inputs = handle.sender();
        std::thread::spawn(move || feeder(inputs));
    }
    let mut app = App::new(view.source, first);
    app.input = view.input;
    app.speed = view.speed;
    app.mouse = view.switches.mouse;
    let latency_file = view.switches.key_latency_file;
    if latency_file.is_some() {
        app.key_latency_us = Some(Vec::new());
    }
    let mut guard = match terminal::enter(view.switches.mouse) {
        Ok(guard) => guard,
        Err(e) => {
            terminal::restore();
            return (
                Err(Error::Unreadable(format!(
                    "cannot set up the terminal: {e}"
                ))),
                handle,
            );
        }
    };
    spawn_input(events.clone());
    if view.switches.panic_for_test {
        // For the test that the terminal is restored after a panic.
        panic!("PREFIXSCOPE_TEST_PANIC is set");
    }
    drop(events);
    let result = {
        let control = WithEngine {
            edge: control,
            engine: &handle,
        };
        run(
            &mut guard.terminal,
            &mut app,
            receiver,
            &SystemClock,
            &control,
            &Theme::from_env(),
        )
    };
    drop(guard);
    if let (Some(path), Some(latencies)) = (latency_file, &app.key_latency_us) {
        let lines: String = latencies.iter().map(|us| format!("{us}\n")).collect();
        if let Err(e) = prefixscope_core::output_file::write_whole(&path, &[], lines.as_bytes()) {
            return (
                Err(Error::Unreadable(format!(
                    "cannot write {}: {e}",
                    path.display()
                ))),
                handle,
            );
        }
    }
    let result = match result {
        // The summary of what was on screen (or held while paused), not a second pass over the
        // input.
        Ok(()) => Ok(app.newest_snapshot()),
        Err(e) => Err(Error::Unreadable(format!("terminal error: {e}"))),
    };
    (result, handle)
}
