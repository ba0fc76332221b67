//! What `replay`, `watch` and `demo` share: the live engine on its thread, the terminal set-up
//! around the app loop, and the export the `e` key asks for.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender};

use super::{EXIT_OK, EXIT_UNREADABLE};
use prefixscope::analysis::Config;
use prefixscope::live::{self, Command, Engine, Input as EngineInput, Snapshot};
use prefixscope::record::Record;
use prefixscope::tui::app::{App, Input, Source};
use prefixscope::tui::event::Event;
use prefixscope::tui::theme::Theme;
use prefixscope::tui::{Clock, Control, SystemClock, run, spawn_input, terminal};

/// What the app shows and how.
pub struct View {
    pub source: Source,
    pub input: Input,
    /// Tokens per block of the hit-rate simulation.
    pub block_size: u32,
    /// Replay speed (`None` live).
    pub speed: Option<f64>,
    pub mouse: bool,
}

/// Where the engine's records come from: the recorder's consumer channel (`watch`, `demo`),
/// and/or a feeder given the engine's input channel (`replay`) on a thread of its own.
pub struct Feed {
    pub records: Option<Receiver<Arc<Record>>>,
    pub feeder: Option<Box<dyn FnOnce(Sender<EngineInput>) + Send>>,
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
    fn in_flight(&self) -> u64 {
        self.edge.in_flight()
    }
    fn records_written(&self) -> Option<u64> {
        self.edge.records_written()
    }
    fn upstream_ok(&self) -> Option<bool> {
        self.edge.upstream_ok()
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
/// At exit it prints the summary of the snapshot on screen.
pub fn run_tui(
    view: View,
    events: Sender<Event>,
    receiver: Receiver<Event>,
    feed: Feed,
    control: &dyn Control,
) -> u8 {
    let mut engine = Engine::with_block_size(Config::default(), view.block_size);
    let first = Arc::new(engine.snapshot());
    let publish = {
        let events = events.clone();
        move |snapshot: Arc<Snapshot>| {
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
    app.mouse = view.mouse;
    let latency_file = std::env::var_os("PREFIXSCOPE_KEY_LATENCY").map(PathBuf::from);
    if latency_file.is_some() {
        app.key_latency_us = Some(Vec::new());
    }
    let mut guard = match terminal::enter(view.mouse) {
        Ok(guard) => guard,
        Err(e) => {
            terminal::restore();
            eprintln!("prefixscope: cannot set up the terminal: {e}");
            return EXIT_UNREADABLE;
        }
    };
    spawn_input(events.clone());
    if std::env::var_os("PREFIXSCOPE_TEST_PANIC").is_some() {
        // For the test that the terminal is restored after a panic.
        panic!("PREFIXSCOPE_TEST_PANIC is set");
    }
    drop(events);
    let control = WithEngine {
        edge: control,
        engine: &handle,
    };
    let result = run(
        &mut guard.terminal,
        &mut app,
        &receiver,
        &SystemClock,
        &control,
        &Theme::from_env(),
    );
    drop(guard);
    if let (Some(path), Some(latencies)) = (latency_file, &app.key_latency_us) {
        let lines: String = latencies.iter().map(|us| format!("{us}\n")).collect();
        if let Err(e) = std::fs::write(&path, lines) {
            eprintln!("prefixscope: cannot write {}: {e}", path.display());
        }
    }
    match result {
        Ok(()) => {
            // The summary of what was on screen, not a second pass over the input.
            print!("{}", app.snapshot.summary());
            EXIT_OK
        }
        Err(e) => {
            eprintln!("prefixscope: terminal error: {e}");
            EXIT_UNREADABLE
        }
    }
}

/// The `e` key: exports the recordings (read again from disk: the app keeps no bodies) to
/// `path`.
pub fn export_files(files: &[PathBuf], format: &str, path: &str) -> Result<String, String> {
    if path.trim().is_empty() {
        return Err("no file name".into());
    }
    super::export::export_recordings(files, format, Path::new(path.trim()))
}
