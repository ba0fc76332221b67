//! `prefixscope demo`: a simulated llama-server, the recording proxy in front of it, scripted
//! agents talking through the proxy, and the TUI on that traffic. No model, no GPU. When stdout
//! is not a terminal it runs headless and prints the analysis, and how many of the script's
//! events it names. The work is `session::demo`'s; this parses and prints.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::{EXIT_OK, EXIT_UNREADABLE, fail, print_stdout, screen_switches};
use prefixscope::session::demo::{self, Demo, DemoConfig};
use prefixscope::session::shutdown::Shutdown;
use prefixscope_core::record::Record;
use prefixscope_core::units::plural;
use prefixscope_demo::agents::SCENARIOS;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Args)]
pub struct DemoArgs {
    /// What the agents do: mixed (a coding agent with a subagent, side-calls, a date change, a
    /// new tool and a compaction, next to a reviewer), side-calls, parallel (four agents),
    /// volatile-system (a nonce in front of the system prompt), compaction, swa (one agent on
    /// a sliding-window model: every loss is the engine's).
    #[arg(long, default_value = "mixed", value_parser = SCENARIOS)]
    scenario: String,
    /// The server's slots (`-np`), 1 to 64; default 2 for mixed, 1 otherwise.
    #[arg(long, value_parser = super::parse_sim_slots)]
    slots: Option<usize>,
    /// The server's host-memory prompt cache (llama-server's `--cache-ram`).
    #[arg(long, value_enum, default_value = "off")]
    cache_ram: OnOff,
    /// How much faster than real time the agents and the server run, 0.01 to 1000 (`+` / `-`
    /// change it).
    #[arg(long, default_value_t = 1.0, value_parser = super::parse_speed)]
    speed: f64,
    /// The same seed gives the same requests in the same order.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Give a sliding-window model (`--scenario swa`) a full-size cache, as llama-server's own
    /// `--swa-full` does.
    #[arg(long)]
    swa_full: bool,
    /// Keep the recording in this file (by default it goes to a temporary file, removed at the end).
    #[arg(short, long)]
    out: Option<PathBuf>,
    /// Where the proxy listens (port 0: any free port).
    #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], 0)))]
    listen: SocketAddr,
    /// Don't capture the mouse (keep the terminal's own selection).
    #[arg(long)]
    no_mouse: bool,
    /// A line per record and the summary, even on a terminal.
    #[arg(long)]
    headless: bool,
}

pub fn run(args: DemoArgs) -> u8 {
    let shutdown = Shutdown::listen();
    let config = DemoConfig {
        scenario: args.scenario.clone(),
        slots: args.slots,
        cache_ram: args.cache_ram == OnOff::On,
        speed: args.speed,
        seed: args.seed,
        out: args.out.clone(),
        listen: args.listen,
        swa_full: args.swa_full,
    };
    let (records_tx, records_rx) = crossbeam_channel::unbounded::<std::sync::Arc<Record>>();
    let headless = args.headless || !std::io::stdout().is_terminal();
    // Headless, nobody reads the records as they come: the outcome reads the recording back.
    let consumers = if headless {
        Vec::new()
    } else {
        vec![records_tx]
    };
    let demo = match Demo::start(config, consumers) {
        Ok(demo) => demo,
        Err(e) => return fail(e),
    };
    let keep = demo.config.out.clone();
    let code = if headless {
        prefixscope_core::stderr_line!(
            "prefixscope: {}; agents -> proxy http://{} -> server; recording to {}",
            demo.setting,
            demo.capture.listen,
            demo.capture.path.display()
        );
        let stopped = shutdown.stopped();
        match demo.run_to_end(async move {
            stopped.await;
        }) {
            Ok(outcome) => {
                for error in &outcome.log.errors {
                    prefixscope_core::stderr_line!("prefixscope: agent error: {error}");
                }
                // The summary `replay` and the TUI end with, fixes and savings included.
                let recorded: Vec<_> = outcome
                    .probes
                    .iter()
                    .chain(&outcome.records)
                    .cloned()
                    .collect();
                print_stdout(&prefixscope::session::replay::summary_of(
                    &recorded,
                    prefixscope_core::analysis::Config::default(),
                ));
                prefixscope_core::stdout_line!(
                    "script: {}, {}, {} named by the analysis ({})",
                    plural(outcome.log.requests.len() as u64, "request"),
                    plural(outcome.checked.events.len() as u64, "event"),
                    outcome.checked.named(),
                    outcome.checked.summary()
                );
                prefixscope_core::stderr_line!(
                    "prefixscope: {} written",
                    plural(outcome.records_written, "record")
                );
                if outcome.log.errors.is_empty() {
                    EXIT_OK
                } else {
                    EXIT_UNREADABLE
                }
            }
            Err(e) => fail(e),
        }
    } else {
        match demo::run_screen(demo, records_rx, screen_switches(!args.no_mouse), &shutdown) {
            Ok(snapshot) => {
                print_stdout(&snapshot.summary());
                EXIT_OK
            }
            Err(e) => fail(e),
        }
    };
    if let Some(path) = keep {
        prefixscope_core::stderr_line!("prefixscope: the recording is in {}", path.display());
    }
    code
}
