//! `prefixscope replay`: the TUI over saved recordings, paced by their timestamps; one line per
//! record and a final summary when stdout is not a terminal.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use crossbeam_channel::Sender;

use super::{EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE, status, tui};
use prefixscope::analysis::Config;
use prefixscope::cache::Request;
use prefixscope::input::{self, Format, InputOptions};
use prefixscope::live::{Engine, Input as EngineInput, LIVE_BLOCK_SIZE};
use prefixscope::record::Lines;
use prefixscope::tui::app::{Input, Source};
use prefixscope::tui::event::Event;
use prefixscope::tui::{Clock, Control, SystemClock};

#[derive(Args)]
pub struct ReplayArgs {
    /// Recordings (prefixscope's or llmp's JSON Lines), or traces / gateway logs (Mooncake,
    /// bailian, CSV; gzipped or not), whose requests carry no messages: those feed the
    /// hit-rate and prefix panes only.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// How much faster than recorded the records arrive (`+` / `-` change it while running).
    #[arg(long, default_value_t = 1.0, conflicts_with = "instant")]
    speed: f64,
    /// Every record at once, no pacing.
    #[arg(long)]
    instant: bool,
    /// Don't capture the mouse (keep the terminal's own selection).
    #[arg(long)]
    no_mouse: bool,
    /// One line per record and a summary, even on a terminal.
    #[arg(long)]
    headless: bool,
}

pub fn run(args: ReplayArgs) -> u8 {
    if !(args.speed > 0.0 && args.speed.is_finite()) {
        eprintln!("prefixscope: --speed must be a positive number");
        return EXIT_USAGE;
    }
    let files = args
        .files
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let formats: Vec<Option<Format>> = args.files.iter().map(|p| detect(p)).collect();
    let traces = formats
        .iter()
        .filter(|f| f.is_some_and(|f| f != Format::Recording))
        .count();
    if traces > 0 && traces < formats.len() {
        eprintln!(
            "prefixscope: replay either recordings or traces / gateway logs, not both at once"
        );
        return EXIT_USAGE;
    }
    let headless = args.headless || !std::io::stdout().is_terminal();
    let (events, receiver) = crossbeam_channel::unbounded();
    let pacer = Arc::new(Pacer {
        speed: AtomicU64::new(args.speed.to_bits()),
        stop: AtomicBool::new(false),
        paced: !args.instant,
        files: args.files.clone(),
    });
    let (feeder, input, block_size): (Box<dyn FnOnce(Sender<EngineInput>) + Send>, _, _) =
        if traces > 0 {
            let format = formats
                .iter()
                .flatten()
                .next()
                .copied()
                .unwrap_or(Format::Mooncake);
            let Some((requests, bad)) = read_trace(&args.files, format) else {
                return EXIT_UNREADABLE;
            };
            if headless {
                return headless_trace(&requests, format, bad);
            }
            if bad > 0 {
                let _ = events.send(Event::Warning(format!(
                    "{bad} bad line(s) skipped in {files}"
                )));
            }
            let pacer = Arc::clone(&pacer);
            let feeder = move |inputs: Sender<EngineInput>| {
                let items = requests.into_iter().map(|r| {
                    let due = r.t_ms.unwrap_or(0);
                    (due, Some(Arc::new(r)))
                });
                pacer.feed(items, &inputs, |request, now| {
                    EngineInput::Request(request, now)
                });
            };
            let input = Input::RequestsOnly(format.as_str().to_string());
            (Box::new(feeder), input, format.default_block_size())
        } else {
            let opened: Vec<(PathBuf, std::fs::File)> = args
                .files
                .iter()
                .filter_map(|path| match std::fs::File::open(path) {
                    Ok(file) => Some((path.clone(), file)),
                    Err(e) => {
                        eprintln!("prefixscope: cannot read {}: {e}", path.display());
                        None
                    }
                })
                .collect();
            if opened.is_empty() {
                return EXIT_UNREADABLE;
            }
            if headless {
                return headless_records(opened);
            }
            let pacer = Arc::clone(&pacer);
            let warnings = events.clone();
            let feeder = move |inputs: Sender<EngineInput>| {
                // Records are read as they are fed: the first screen never waits for the file.
                let items = opened.into_iter().flat_map(move |(path, file)| {
                    let warnings = warnings.clone();
                    Lines::new(std::io::BufReader::new(file)).map(move |item| match item {
                        Ok(record) => (
                            record.t_end_ms.max(record.t_start_ms),
                            Some(Arc::new(record)),
                        ),
                        Err(bad) => {
                            let _ = warnings.send(Event::Warning(format!(
                                "{}:{}: {}",
                                path.display(),
                                bad.line,
                                bad.error
                            )));
                            (i64::MIN, None)
                        }
                    })
                });
                pacer.feed(items, &inputs, EngineInput::Record);
            };
            (Box::new(feeder), Input::Exchanges, LIVE_BLOCK_SIZE)
        };
    let source = Source::Replay { files };
    let view = tui::View {
        source,
        input,
        block_size,
        speed: (!args.instant).then_some(args.speed),
        mouse: !args.no_mouse,
    };
    let feed = tui::Feed {
        records: None,
        feeder: Some(feeder),
    };
    tui::run_tui(view, events, receiver, feed, &*pacer)
}

/// The format of a file, from its first line (`None` when unreadable or unknown: read as a
/// recording, which reports what is wrong with it).
fn detect(path: &std::path::Path) -> Option<Format> {
    let file = std::fs::File::open(path).ok()?;
    let mut reader = input::decompressed(std::io::BufReader::new(file)).ok()?;
    input::detect(&mut reader).ok().flatten()
}

/// A trace's or gateway log's requests, in start order, and the bad rows skipped.
fn read_trace(paths: &[PathBuf], format: Format) -> Option<(Vec<Request>, usize)> {
    let options = InputOptions {
        block_size: format.default_block_size(),
        ..InputOptions::default()
    };
    let mut requests = Vec::new();
    let mut bad = 0;
    let mut opened = 0;
    for path in paths {
        let reader = std::fs::File::open(path)
            .map(std::io::BufReader::new)
            .and_then(input::decompressed);
        match reader {
            Ok(reader) => {
                opened += 1;
                let name = path.display().to_string();
                let file = input::read(reader, &name, format, &options);
                for row in &file.report.bad_rows {
                    eprintln!("prefixscope: {name}:{}: {}", row.line, row.error);
                }
                super::print_bad_values(&name, &file.report);
                bad += file.report.bad_rows.len();
                requests.extend(file.requests);
            }
            Err(e) => eprintln!("prefixscope: cannot read {}: {e}", path.display()),
        }
    }
    requests.sort_by_key(|r| r.t_ms.unwrap_or(0));
    (opened > 0).then_some((requests, bad))
}

/// No terminal, a trace: one line per request, then the hit rates of a cold replay (the live
/// engine's snapshot, as the panes would show it).
fn headless_trace(requests: &[Request], format: Format, bad: usize) -> u8 {
    let mut engine = Engine::with_block_size(Config::default(), format.default_block_size());
    for (i, request) in requests.iter().enumerate() {
        println!(
            "#{} t {} ms  input {} tokens  {} blocks",
            i + 1,
            request.t_ms.unwrap_or(0),
            request.input_tokens,
            request.blocks.len()
        );
        engine.push(EngineInput::Request(Arc::new(request.clone()), 0));
    }
    engine.push(EngineInput::SourceDone);
    let snapshot = engine.snapshot();
    if bad > 0 {
        println!("{bad} bad row(s) skipped");
    }
    if let Some(curve) = &snapshot.view.curve {
        let points: Vec<String> = curve
            .points
            .iter()
            .map(|(label, lru, _, _)| format!("{label} {:.1}%", lru * 100.0))
            .collect();
        println!(
            "{} requests of a {} input · {} · ceiling {:.1}% · LRU {}",
            requests.len(),
            format.as_str(),
            curve.label,
            curve.ceiling * 100.0,
            points.join(", ")
        );
    }
    EXIT_OK
}

/// No terminal: every record's status line as it is read, then the summary of the live
/// engine's snapshot (the one a TUI would have shown at the end).
fn headless_records(files: Vec<(PathBuf, std::fs::File)>) -> u8 {
    let mut engine = Engine::new(Config::default());
    let mut bad_lines = 0;
    for (path, file) in files {
        for item in Lines::new(std::io::BufReader::new(file)) {
            match item {
                Ok(record) => {
                    println!("{}", status::record_line(&record));
                    engine.push(EngineInput::Record(Arc::new(record), 0));
                }
                Err(bad) => {
                    eprintln!(
                        "prefixscope: {}:{}: {}",
                        path.display(),
                        bad.line,
                        bad.error
                    );
                    bad_lines += 1;
                }
            }
        }
    }
    engine.push(EngineInput::SourceDone);
    if bad_lines > 0 {
        println!("{bad_lines} bad line(s) skipped");
    }
    print!("{}", engine.snapshot().summary());
    EXIT_OK
}

/// Feeds the engine at the recorded pace (or at once), and is the app's control of it.
struct Pacer {
    speed: AtomicU64,
    stop: AtomicBool,
    paced: bool,
    files: Vec<PathBuf>,
}

impl Pacer {
    /// `items`: each thing to send with the recorded time it is due at (`None`: nothing to send,
    /// e.g. a bad line already reported), in file order; a time before the previous one's is
    /// sent at once. Ends with the source's end.
    fn feed<T>(
        &self,
        items: impl Iterator<Item = (i64, Option<T>)>,
        inputs: &Sender<EngineInput>,
        wrap: impl Fn(T, i64) -> EngineInput,
    ) {
        // Recorded time `anchor.1 + elapsed * speed` is due at wall time `anchor.0`; a speed
        // change re-anchors at the current item so nothing jumps.
        let mut anchor: Option<(Instant, i64)> = None;
        let mut speed = f64::from_bits(self.speed.load(Ordering::Relaxed));
        for (due_ms, item) in items {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let Some(item) = item else { continue };
            if self.paced {
                match anchor.as_mut() {
                    None => anchor = Some((Instant::now(), due_ms)),
                    Some(anchor) => self.wait_until(due_ms, anchor, &mut speed),
                }
            }
            if inputs.send(wrap(item, SystemClock.now_ms())).is_err() {
                return;
            }
        }
        let _ = inputs.send(EngineInput::SourceDone);
    }

    /// Sleeps until recorded time `due_ms` is due, in short steps so speed changes and
    /// quitting take effect at once.
    fn wait_until(&self, due_ms: i64, anchor: &mut (Instant, i64), speed: &mut f64) {
        loop {
            let now_speed = f64::from_bits(self.speed.load(Ordering::Relaxed));
            if now_speed != *speed {
                let recorded_now =
                    anchor.1 as f64 + anchor.0.elapsed().as_secs_f64() * 1000.0 * *speed;
                *anchor = (Instant::now(), recorded_now as i64);
                *speed = now_speed;
            }
            let wait_ms =
                (due_ms - anchor.1) as f64 / *speed - anchor.0.elapsed().as_secs_f64() * 1000.0;
            if wait_ms <= 0.0 || self.stop.load(Ordering::Relaxed) {
                return;
            }
            std::thread::sleep(Duration::from_secs_f64(wait_ms.min(100.0) / 1000.0));
        }
    }
}

impl Control for Pacer {
    fn set_speed(&self, speed: f64) {
        self.speed.store(speed.to_bits(), Ordering::Relaxed);
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    fn export(&self, format: &str, path: &str) -> Result<String, String> {
        super::tui::export_files(&self.files, format, path)
    }
}
