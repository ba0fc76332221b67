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
use prefixscope::record::Record;
use prefixscope::tui::Control;
use prefixscope::tui::app::Source;
use prefixscope::tui::event::Event;

#[derive(Args)]
pub struct ReplayArgs {
    /// Recordings (prefixscope's or llmp's JSON Lines).
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
    let Some(read) = read_recordings(&args.files) else {
        return EXIT_UNREADABLE;
    };
    let bad_lines: usize = read.files.iter().map(|f| f.bad_lines.len()).sum();
    let mut records = read.records;
    // The order the proxy finished them in, which is the order a live view saw them.
    records.sort_by_key(|r| (r.t_end_ms.max(r.t_start_ms), r.id));
    let files = args
        .files
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if args.headless || !std::io::stdout().is_terminal() {
        return headless(&records, bad_lines);
    }
    let (events, receiver) = crossbeam_channel::unbounded();
    let feeder = Arc::new(Feeder {
        speed: AtomicU64::new(args.speed.to_bits()),
        stop: AtomicBool::new(false),
        files: args.files.clone(),
    });
    if bad_lines > 0 {
        let _ = events.send(Event::Warning(format!(
            "{bad_lines} bad line(s) skipped in {files}"
        )));
    }
    let pacing = (!args.instant).then_some(args.speed);
    {
        let feeder = Arc::clone(&feeder);
        let events = events.clone();
        std::thread::spawn(move || feeder.feed(records, pacing.is_some(), &events));
    }
    let source = Source::Replay { files };
    tui::run_tui(source, pacing, !args.no_mouse, events, receiver, &*feeder)
}

/// No terminal: every record's status line, then the analysis summary.
fn headless(records: &[Record], bad_lines: usize) -> u8 {
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
    fn feed(&self, records: Vec<Record>, paced: bool, events: &Sender<Event>) {
        let Some(first) = records.first().map(|r| r.t_end_ms.max(r.t_start_ms)) else {
            let _ = events.send(Event::SourceDone);
            return;
        };
        // Recorded time `first + elapsed * speed` is due at wall time `anchor`; a speed change
        // re-anchors at the current record so nothing jumps.
        let mut anchor = (Instant::now(), first);
        let mut speed = f64::from_bits(self.speed.load(Ordering::Relaxed));
        for record in records {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let due_ms = record.t_end_ms.max(record.t_start_ms);
            if paced {
                self.wait_until(due_ms, &mut anchor, &mut speed);
            }
            if events.send(Event::Record(Arc::new(record))).is_err() {
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
