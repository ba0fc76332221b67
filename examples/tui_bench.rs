//! The TUI at size, as `replay --instant FILE` runs it: a reader thread streams the file into the
//! live engine on its own thread, the engine publishes snapshots, and the real app loop runs on
//! a 120×40 `TestBackend` while a typist thread sends keys spread across the replay, then `q`.
//!
//! Measured in-process: key latency (the loop taking a key → the end of the draw showing it),
//! the first frame after start, `q` → the loop returning, snapshot build cost and the gaps
//! between snapshots on screen (how long a record waits to be seen), frame time, and peak RSS.
//! Then, separately, push cost per record and one snapshot build at the full size.
//!
//! `cargo run --release --example tui_bench -- FILE [KEYS]`; prints one JSON line. Used by
//! bench/tui.sh.

#[path = "support/proc_status.rs"]
mod proc_status;

use proc_status::status_kib;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use prefixscope::tui::app::{App, Source};
use prefixscope::tui::event::Event;
use prefixscope::tui::theme::Theme;
use prefixscope::tui::{Clock, Control, SystemClock, run, ui};
use prefixscope_core::analysis::Config;
use prefixscope_core::live::{self, Engine, Input};
use prefixscope_core::record::Lines;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

// The binary's allocator, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn pick(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p) as usize]
}

struct Commands(live::Handle);

impl Control for Commands {
    fn command(&self, command: live::Command) -> Option<Arc<live::Snapshot>> {
        self.0.command(command);
        None
    }
}

fn open(path: &str) -> std::io::BufReader<std::fs::File> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| {
        eprintln!("cannot read {path}: {e}");
        std::process::exit(1);
    });
    std::io::BufReader::new(file)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: tui_bench FILE [KEYS]");
        std::process::exit(2);
    };
    let keys: usize = args.next().and_then(|k| k.parse().ok()).unwrap_or(300);
    let start = Instant::now();

    // The engine, fed by a reader thread as `replay --instant` feeds it.
    let (events, receiver) = crossbeam_channel::unbounded::<Event>();
    let mut engine = Engine::new(Config::default());
    let first = Arc::new(engine.snapshot());
    let snapshot_costs = Arc::new(std::sync::Mutex::new(Vec::<(u64, u64, u64)>::new()));
    let publish = {
        let events = events.clone();
        let costs = Arc::clone(&snapshot_costs);
        move |snapshot: Arc<live::Snapshot>| {
            if let Ok(mut costs) = costs.lock() {
                costs.push((snapshot.requests, snapshot.build_us, snapshot.waited_us));
            }
            let _ = events.send(Event::Snapshot(snapshot));
        }
    };
    let clock: Arc<dyn Fn() -> i64 + Send + Sync> = Arc::new(|| SystemClock.now_ms());
    let handle = live::spawn(engine, None, clock, publish);
    let done_reading = Arc::new(AtomicBool::new(false));
    {
        let inputs = handle.sender();
        let path = path.clone();
        let done = Arc::clone(&done_reading);
        std::thread::spawn(move || {
            // The first pass, as `replay` makes it: the block model before the records.
            let t = Instant::now();
            let measured = live::FirstPass::of(Lines::new(open(&path)).flatten());
            eprintln!(
                "first pass (block model): {:.2} s, {}",
                t.elapsed().as_secs_f64(),
                measured.choice.describe()
            );
            if inputs.send(Input::BlockModel(Box::new(measured))).is_err() {
                return;
            }
            for record in Lines::new(open(&path)).flatten() {
                if inputs
                    .send(Input::Record(Arc::new(record), SystemClock.now_ms()))
                    .is_err()
                {
                    return;
                }
            }
            let _ = inputs.send(Input::SourceDone);
            done.store(true, Ordering::Relaxed);
        });
    }
    // The typist: a key every 20 ms while the file is read (Down / Up / Tab / ?, Esc), at
    // least `keys` of them, then `q`.
    let q_sent = Arc::new(std::sync::Mutex::new(None::<Instant>));
    {
        let events = events.clone();
        let done = Arc::clone(&done_reading);
        let q_sent = Arc::clone(&q_sent);
        std::thread::spawn(move || {
            let codes = [
                KeyCode::Down,
                KeyCode::Up,
                KeyCode::Tab,
                KeyCode::Down,
                KeyCode::BackTab,
            ];
            let mut sent = 0;
            while sent < keys || !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(20));
                let code = codes[sent % codes.len()];
                if events
                    .send(Event::Key(KeyEvent::new(code, KeyModifiers::NONE)))
                    .is_err()
                {
                    return;
                }
                sent += 1;
            }
            std::thread::sleep(Duration::from_millis(500));
            if let Ok(mut at) = q_sent.lock() {
                *at = Some(Instant::now());
            }
            let _ = events.send(Event::Key(KeyEvent::new(
                KeyCode::Char('q'),
                KeyModifiers::NONE,
            )));
        });
    }
    drop(events);

    let mut app = App::new(
        Source::Replay {
            files: path.clone(),
        },
        first,
    );
    app.key_latency_us = Some(Vec::new());
    let mut terminal = Terminal::new(TestBackend::new(120, 40)).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1);
    });
    let control = Commands(handle);
    let result = run(
        &mut terminal,
        &mut app,
        &receiver,
        &SystemClock,
        &control,
        &Theme::from_env(),
    );
    let returned = Instant::now();
    if let Err(e) = result {
        eprintln!("{e}");
        std::process::exit(1);
    }
    let replay_s = start.elapsed().as_secs_f64();
    let quit_ms = q_sent
        .lock()
        .ok()
        .and_then(|at| *at)
        .map_or(-1.0, |at| (returned - at).as_secs_f64() * 1000.0);
    let mut latencies = app.key_latency_us.clone().unwrap_or_default();
    latencies.sort_unstable();
    let costs = snapshot_costs.lock().map(|c| c.clone()).unwrap_or_default();
    let mut build: Vec<u64> = costs.iter().map(|c| c.1).collect();
    build.sort_unstable();
    let mut waited: Vec<u64> = costs.iter().map(|c| c.2).collect();
    waited.sort_unstable();
    let rss_peak = status_kib("VmHWM:") as f64 / 1024.0;
    let requests = app.snapshot.requests;

    // Frames of the final screen.
    let theme = Theme::from_env();
    let mut frames_us = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let _ = terminal.draw(|frame| ui::draw(frame, &app, &theme));
        frames_us.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX));
    }
    frames_us.sort_unstable();
    drop(app);
    drop(control);

    // Push cost per record and one snapshot at the full size, on this thread alone.
    let mut engine = Engine::new(Config::default());
    engine.push(Input::BlockModel(Box::new(live::FirstPass::of(
        Lines::new(open(&path)).flatten(),
    ))));
    let mut count = 0u64;
    let mut push_s = 0.0;
    for record in Lines::new(open(&path)).flatten() {
        let record = Arc::new(record);
        let t = Instant::now();
        engine.push(Input::Record(record, 0));
        push_s += t.elapsed().as_secs_f64();
        count += 1;
    }
    let t = Instant::now();
    let snapshot = engine.snapshot();
    let snapshot_s = t.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::json!({
            "file": path, "records": count, "requests_on_screen_at_quit": requests,
            "replay_wall_s": replay_s,
            "keys": latencies.len(),
            "key_latency_ms_p50": pick(&latencies, 0.5) as f64 / 1000.0,
            "key_latency_ms_p99": pick(&latencies, 0.99) as f64 / 1000.0,
            "key_latency_ms_max": pick(&latencies, 1.0) as f64 / 1000.0,
            "quit_ms": quit_ms,
            "snapshots": costs.len(),
            "snapshot_build_ms_p50": pick(&build, 0.5) as f64 / 1000.0,
            "snapshot_build_ms_max": pick(&build, 1.0) as f64 / 1000.0,
            "record_to_snapshot_ms_p50": pick(&waited, 0.5) as f64 / 1000.0,
            "record_to_snapshot_ms_max": pick(&waited, 1.0) as f64 / 1000.0,
            "frame_us_p50": pick(&frames_us, 0.5), "frame_us_p99": pick(&frames_us, 0.99),
            "rss_peak_mib": rss_peak,
            "push_us_per_record": push_s * 1e6 / count.max(1) as f64,
            "snapshot_at_full_size_ms": snapshot_s * 1000.0,
            "snapshot_us_per_record": snapshot_s * 1e6 / count.max(1) as f64,
            "rows": snapshot.report.rows.len(),
        })
    );
}
