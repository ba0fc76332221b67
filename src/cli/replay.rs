//! `prefixscope replay`: the TUI over saved recordings, paced by their timestamps; one line per
//! record and a final summary when stdout is not a terminal.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use crossbeam_channel::Sender;

use super::{EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE, read_recordings, status, tui};
use prefixscope::analysis::{Analyzer, Config};
use prefixscope::cache::Request;
use prefixscope::input::{self, Format, InputOptions};
use prefixscope::record::Record;
use prefixscope::tui::Control;
use prefixscope::tui::app::{App, Input, LIVE_BLOCK_SIZE, Source};
use prefixscope::tui::event::Event;

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
    let (items, input, block_size, warnings) = if traces > 0 {
        let format = formats
            .iter()
            .flatten()
            .next()
            .copied()
            .unwrap_or(Format::Mooncake);
        match read_trace(&args.files, format) {
            Some((requests, bad)) => {
                if headless {
                    return headless_trace(&requests, format, bad);
                }
                let items = requests
                    .into_iter()
                    .map(|r| (r.t_ms.unwrap_or(0), Event::Request(Arc::new(r))))
                    .collect::<Vec<_>>();
                let input = Input::RequestsOnly(format.as_str().to_string());
                (items, input, format.default_block_size(), bad)
            }
            None => return EXIT_UNREADABLE,
        }
    } else {
        let Some(read) = read_recordings(&args.files) else {
            return EXIT_UNREADABLE;
        };
        let bad_lines: usize = read.files.iter().map(|f| f.bad_lines.len()).sum();
        let mut records = read.records;
        // The order the proxy finished them in, which is the order a live view saw them.
        records.sort_by_key(|r| (r.t_end_ms.max(r.t_start_ms), r.id));
        if headless {
            return headless_records(&records, bad_lines);
        }
        let items = records
            .into_iter()
            .map(|r| (r.t_end_ms.max(r.t_start_ms), Event::Record(Arc::new(r))))
            .collect::<Vec<_>>();
        (items, Input::Exchanges, LIVE_BLOCK_SIZE, bad_lines)
    };
    let (events, receiver) = crossbeam_channel::unbounded();
    let feeder = Arc::new(Feeder {
        speed: AtomicU64::new(args.speed.to_bits()),
        stop: AtomicBool::new(false),
        files: args.files.clone(),
    });
    if warnings > 0 {
        let _ = events.send(Event::Warning(format!(
            "{warnings} bad line(s) skipped in {files}"
        )));
    }
    let pacing = (!args.instant).then_some(args.speed);
    {
        let feeder = Arc::clone(&feeder);
        let events = events.clone();
        std::thread::spawn(move || feeder.feed(items, pacing.is_some(), &events));
    }
    let source = Source::Replay { files };
    let view = tui::View {
        source,
        input,
        block_size,
        speed: pacing,
        mouse: !args.no_mouse,
    };
    tui::run_tui(view, events, receiver, &*feeder)
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
                bad += file.report.bad_rows.len();
                requests.extend(file.requests);
            }
            Err(e) => eprintln!("prefixscope: cannot read {}: {e}", path.display()),
        }
    }
    requests.sort_by_key(|r| r.t_ms.unwrap_or(0));
    (opened > 0).then_some((requests, bad))
}

/// No terminal, a trace: one line per request, then the hit rates of a cold replay.
fn headless_trace(requests: &[Request], format: Format, bad: usize) -> u8 {
    let mut app = App::with_block_size(
        Source::Replay {
            files: String::new(),
        },
        Config::default(),
        format.default_block_size(),
    );
    for (i, request) in requests.iter().enumerate() {
        println!(
            "#{} t {} ms  input {} tokens  {} blocks",
            i + 1,
            request.t_ms.unwrap_or(0),
            request.input_tokens,
            request.blocks.len()
        );
        app.handle(Event::Request(Arc::new(request.clone())), 0);
    }
    app.rebuild_view();
    if bad > 0 {
        println!("{bad} bad row(s) skipped");
    }
    if let Some(curve) = &app.view.curve {
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

/// No terminal: every record's status line, then the analysis summary.
fn headless_records(records: &[Record], bad_lines: usize) -> u8 {
    let mut engine = Analyzer::new(Config::default());
    for record in records {
        println!("{}", status::record_line(record));
        engine.push(record);
    }
    if bad_lines > 0 {
        println!("{bad_lines} bad line(s) skipped");
    }
    print!("{}", engine.report().summary());
    EXIT_OK
}

/// Sends the records on the app's channel at the recorded pace.
struct Feeder {
    speed: AtomicU64,
    stop: AtomicBool,
    files: Vec<PathBuf>,
}

impl Feeder {
    /// `items`: each event with the recorded time it is due at, in order.
    fn feed(&self, items: Vec<(i64, Event)>, paced: bool, events: &Sender<Event>) {
        let Some(&(first, _)) = items.first() else {
            let _ = events.send(Event::SourceDone);
            return;
        };
        // Recorded time `first + elapsed * speed` is due at wall time `anchor`; a speed change
        // re-anchors at the current item so nothing jumps.
        let mut anchor = (Instant::now(), first);
        let mut speed = f64::from_bits(self.speed.load(Ordering::Relaxed));
        for (due_ms, event) in items {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            if paced {
                self.wait_until(due_ms, &mut anchor, &mut speed);
            }
            if events.send(event).is_err() {
                return;
            }
        }
        let _ = events.send(Event::SourceDone);
    }
}

impl Feeder {
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

impl Control for Feeder {
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
