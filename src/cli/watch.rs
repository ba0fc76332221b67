//! `prefixscope watch`: the recording proxy and the TUI in one process. The live engine reads
//! records from the recorder on a channel of its own: the view may lag behind the traffic, it
//! never holds the proxy back. When stdout is not a terminal it records, prints one line per
//! record and, when stopped, the summary. The work is `session::capture`'s.

use std::io::IsTerminal;
use std::sync::Arc;

use clap::Args;

use super::record::{CaptureArgs, MetricsPlan};
use super::{EXIT_OK, fail, print_stdout, screen_switches};
use prefixscope::session::capture::{LiveCapture, watch_headless, watch_screen};
use prefixscope::session::shutdown::Shutdown;
use prefixscope_core::record::Record;

#[derive(Args)]
pub struct WatchArgs {
    #[command(flatten)]
    capture: CaptureArgs,
    /// Don't capture the mouse (keep the terminal's own selection).
    #[arg(long)]
    no_mouse: bool,
    /// Prices in dollars per million tokens (a JSON array of {"model", "input", "cache_read",
    /// "cache_write"}) over the dated default table of hosted models; a local server's model
    /// is priced only when named here.
    #[arg(long, value_name = "FILE")]
    prices: Option<std::path::PathBuf>,
}

pub fn run(args: WatchArgs) -> u8 {
    let mut analysis = match super::analysis_config(args.prices.as_deref(), None) {
        Ok(config) => config,
        Err(code) => return code,
    };
    analysis.memory_budget = args.capture.memory_budget;
    analysis.window = args.capture.metrics.and(args.capture.metrics_window);
    let shutdown = Shutdown::listen();
    let (records_tx, records_rx) = crossbeam_channel::unbounded::<Arc<Record>>();
    let mut config = args.capture.config();
    if !args.capture.no_probe {
        config.probe = prefixscope_capture::poll::Schedule::Watch;
    }
    config.announce_starts = std::io::stdout().is_terminal();
    // With --metrics, the endpoint is sent this engine's figures: one analysis for both.
    let (consumer, metrics) = match MetricsPlan::bind_to_engine(&args.capture, records_tx) {
        Ok(bound) => bound,
        Err(code) => return code,
    };
    let (metrics, figures) = metrics.unzip();
    let capture = match LiveCapture::start(&config, vec![consumer]) {
        Ok(capture) => capture,
        Err(e) => return fail(e),
    };
    // Its thread ends when the recorder closes its channel, at the capture's end.
    let endpoint = match metrics.map(|plan| plan.start(&capture)).transpose() {
        Ok(endpoint) => endpoint,
        Err(code) => return code,
    };
    for notice in capture.notices() {
        prefixscope_core::stderr_line!("prefixscope: {notice}");
    }
    let layout = capture.layout.clone();
    let say_layout = move || {
        if let Some(line) = layout.as_ref().and_then(|l| l.summary()) {
            prefixscope_core::stderr_line!("prefixscope: {line}");
        }
    };
    if !std::io::stdout().is_terminal() {
        prefixscope_core::stderr_line!(
            "prefixscope: proxy http://{} -> {}, recording to {}; stdout is not a terminal, so one line per record. Ctrl-C stops.",
            capture.listen,
            capture.upstream.url(),
            capture.path.display()
        );
        let written = watch_headless(
            capture,
            records_rx,
            analysis,
            figures,
            std::io::stdout(),
            &shutdown,
        );
        if let Some(endpoint) = endpoint {
            endpoint.join();
        }
        say_layout();
        return report_written(&written, EXIT_OK);
    }
    let (result, written) = watch_screen(
        capture,
        records_rx,
        analysis,
        figures,
        screen_switches(!args.no_mouse),
        &shutdown,
    );
    if let Some(endpoint) = endpoint {
        endpoint.join();
    }
    let code = match result {
        Ok(snapshot) => {
            print_stdout(&snapshot.summary());
            EXIT_OK
        }
        Err(e) => fail(e),
    };
    say_layout();
    report_written(&written, code)
}

/// What was written, on stderr; exit 1 when every record failed to write.
fn report_written(written: &prefixscope::session::capture::Written, code: u8) -> u8 {
    if written.not_laid_out > 0 {
        prefixscope_core::stderr_line!(
            "prefixscope: {} records not laid out: captures were waiting, or the stop's second for it ran out (the layout never holds the proxy back)",
            written.not_laid_out
        );
    }
    prefixscope_core::stderr_line!(
        "prefixscope: {} written to {}{}",
        prefixscope_core::units::plural(written.records, "record"),
        written.path.display(),
        match written.failed {
            0 => String::new(),
            n => format!(
                ", {n} NOT written ({})",
                written.last_error.clone().unwrap_or_default()
            ),
        }
    );
    if written.all_failed() && code == EXIT_OK {
        super::EXIT_UNREADABLE
    } else {
        code
    }
}
