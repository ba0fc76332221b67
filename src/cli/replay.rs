//! `prefixscope replay`: the TUI over saved recordings, paced by their timestamps; one line per
//! record and a final summary when stdout is not a terminal.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;

use super::{EXIT_OK, EXIT_UNREADABLE, fail, print_stdout, screen_switches};
use prefixscope::session::replay::{Replay, ReplayConfig};
use prefixscope::session::screen::{Feed, ScreenConfig, run_screen};
use prefixscope::session::shutdown::Shutdown;
use prefixscope::tui::app::{Input, Source};
use prefixscope::tui::event::Event;

#[derive(Args)]
pub struct ReplayArgs {
    /// Recordings (prefixscope's or llmp's JSON Lines), or traces / gateway logs (Mooncake,
    /// bailian, CSV; gzipped or not), whose requests carry no messages: those feed the
    /// hit-rate and prefix panes only.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// How much faster than recorded the records arrive, 0.01 to 1000 (`+` / `-` change it
    /// while running).
    #[arg(long, default_value_t = 1.0, conflicts_with = "instant", value_parser = super::parse_speed)]
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
    /// Prices in dollars per million tokens (a JSON array of {"model", "input", "cache_read",
    /// "cache_write"}) over the dated default table of hosted models; a local server's model
    /// is priced only when named here.
    #[arg(long, value_name = "FILE")]
    prices: Option<PathBuf>,
    /// The analysis's memory at most (an estimate, e.g. 512MiB): past it, the analysis starts
    /// again from the next record and every output says how many records it dropped.
    #[arg(long, value_name = "SIZE", default_value = "512MiB", value_parser = super::parse_memory_budget)]
    memory_budget: usize,
}

pub fn run(args: ReplayArgs) -> u8 {
    let shutdown = Shutdown::listen();
    let mut analysis = match super::analysis_config(args.prices.as_deref(), None) {
        Ok(config) => config,
        Err(code) => return code,
    };
    analysis.memory_budget = args.memory_budget;
    let config = ReplayConfig {
        files: args.files.clone(),
        speed: args.speed,
        instant: args.instant,
        analysis: analysis.clone(),
    };
    let replay = match Replay::open(&config) {
        Ok(replay) => replay,
        Err(e) => return fail(e),
    };
    for message in &replay.messages {
        prefixscope_core::stderr_line!("prefixscope: {message}");
    }
    if args.headless || !std::io::stdout().is_terminal() {
        // A signal stops the reading; the summary of what was read follows.
        let pacer = Arc::clone(&replay.pacer);
        shutdown.on_stop(move |_| pacer.stop());
        // A write error is stdout closed (a pipe into `head`): nothing more to say.
        let read = replay.headless(&mut std::io::stdout().lock(), &mut std::io::stderr());
        // An empty file is a warning (said already); files with bytes of which nothing could be
        // replayed are an input that could not be read.
        if matches!(read, Ok(0)) && super::had_bytes(&args.files) && shutdown.requested().is_none()
        {
            prefixscope_core::stderr_line!(
                "prefixscope: nothing in {} could be replayed",
                args.files
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            return EXIT_UNREADABLE;
        }
        return EXIT_OK;
    }
    let files = args
        .files
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let input = match replay.trace_format() {
        Some(format) => Input::RequestsOnly(format.as_str().to_string()),
        None => Input::Exchanges,
    };
    let trace_block_size = replay.trace_format().map(|_| replay.block_size());
    let pacer = Arc::clone(&replay.pacer);
    let (events, receiver) = crossbeam_channel::unbounded();
    // What reading found (bad rows, a log without timestamps), on the screen too.
    for message in &replay.messages {
        let _ = events.send(Event::Notice(message.clone()));
    }
    let warnings = events.clone();
    let feeder = replay.feeder(move |warning| {
        let _ = warnings.send(Event::Warning(warning));
    });
    let screen = ScreenConfig {
        source: Source::Replay { files },
        input,
        trace_block_size,
        speed: (!args.instant).then_some(args.speed),
        switches: screen_switches(!args.no_mouse),
        server_settings: None,
        analysis: analysis.clone(),
    };
    let feed = Feed {
        records: None,
        feeder: Some(feeder),
        metrics: None,
    };
    match run_screen(screen, events, receiver, feed, &*pacer, &shutdown) {
        Ok(snapshot) => {
            print_stdout(&snapshot.summary());
            EXIT_OK
        }
        Err(e) => fail(e),
    }
}
