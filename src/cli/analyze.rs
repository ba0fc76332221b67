//! `prefixscope analyze FILE...`: the report of one or more recordings (merged in time order).

use std::path::PathBuf;

use clap::Args;

use super::{EXIT_UNREADABLE, RecordSink};
use prefixscope_core::analysis::{Analyzer, Config, Prepared, analyze};
use prefixscope_core::record::Record;

/// Records handed, as they are read, to the thread that analyses them (`analyze` of one
/// recording): parsed and normalized on every core (`Prepared`), pushed in start order on one.
struct Analysing {
    batches: crossbeam_channel::Sender<Vec<Prepared>>,
    batch: Vec<Prepared>,
    max_id: u64,
}

impl Analysing {
    fn send_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(ANALYSIS_BATCH));
        // The analysing thread ends only when this channel closes (or it panicked, which
        // `join` passes on).
        let _ = self.batches.send(batch);
    }
}

impl RecordSink for Analysing {
    type Item = Prepared;

    fn prepare(record: Record) -> Prepared {
        Prepared::of(&record)
    }

    fn take(&mut self, id: u64, prepared: Prepared) {
        self.max_id = self.max_id.max(id);
        self.batch.push(prepared);
        if self.batch.len() >= ANALYSIS_BATCH {
            self.send_batch();
        }
    }

    fn file_done(&mut self) {
        self.send_batch();
    }

    fn max_id(&self) -> u64 {
        self.max_id
    }
}

impl Drop for Analysing {
    fn drop(&mut self) {
        self.send_batch();
    }
}

/// Records sent to the analysing thread together: one hand-over per batch, not per record.
const ANALYSIS_BATCH: usize = 256;

/// How many batches wait for the analysing thread at most: the readers run ahead of it by
/// that much and no more.
const ANALYSIS_QUEUE: usize = 2;

/// Records held back to be pushed in start order, at most.
const REORDER_WINDOW: usize = 4_096;

/// A prepared record ordered so a `BinaryHeap` gives the earliest start first.
struct InStartOrder(Prepared);

impl PartialEq for InStartOrder {
    fn eq(&self, other: &Self) -> bool {
        self.0.start_order() == other.0.start_order()
    }
}

impl Eq for InStartOrder {}

impl PartialOrd for InStartOrder {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InStartOrder {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.0.start_order().cmp(&self.0.start_order())
    }
}

/// `paths`' records analysed as they are read, in memory bounded by the analysis.
fn analyze_streamed(
    paths: &[std::path::PathBuf],
    config: &Config,
) -> Option<(super::Recordings, prefixscope_core::analysis::Report)> {
    std::thread::scope(|scope| {
        let (sender, receiver) = crossbeam_channel::bounded::<Vec<Prepared>>(ANALYSIS_QUEUE);
        // Pushed in start order within a window: a record that started before records
        // already pushed makes the engine derive them again (on agent traffic, replies finish
        // out of start order), so each is held back until `REORDER_WINDOW` records came after
        // it. The window bounds what is held.
        let analysing = scope.spawn(move || {
            let mut analyzer = Analyzer::new(config.clone());
            let mut held = std::collections::BinaryHeap::new();
            for prepared in receiver.into_iter().flatten() {
                held.push(InStartOrder(prepared));
                if held.len() > REORDER_WINDOW
                    && let Some(InStartOrder(first)) = held.pop()
                {
                    analyzer.push_prepared(first);
                }
            }
            while let Some(InStartOrder(prepared)) = held.pop() {
                analyzer.push_prepared(prepared);
            }
            analyzer.into_report()
        });
        let mut sink = Analysing {
            batches: sender,
            batch: Vec::with_capacity(ANALYSIS_BATCH),
            max_id: 0,
        };
        let read = super::read_recordings_into(paths, &mut sink);
        drop(sink);
        let report = analysing
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        read.map(|read| (read, report))
    })
}

#[derive(Args)]
pub struct AnalyzeArgs {
    /// Recordings (prefixscope or llmp, full or digest); several merge in time order.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Print the JSON report on stdout instead of the text summary.
    #[arg(long)]
    json: bool,
    /// Write the JSON report to this file (the summary still goes to stdout) and the HTML page
    /// beside it; a device or FIFO is written as it is, `-` is stdout (the summary then goes to
    /// stderr).
    #[arg(short, long)]
    out: Option<PathBuf>,
    /// Write the HTML page here (instead of beside `-o`; with a device, FIFO or `-` as `-o`,
    /// the page is written only when asked for here).
    #[arg(long, value_name = "FILE", requires = "out")]
    html: Option<PathBuf>,
    /// A pause longer than this (per model) starts a new session (on a hosted API at least 30
    /// minutes: a pause there is what expires its cache, to be seen).
    #[arg(long, default_value_t = 60)]
    gap_seconds: u64,
    /// Count messages and tools with the server's tokenizer (llama-server /tokenize); without it,
    /// counts are estimates.
    #[arg(long, value_name = "URL")]
    tokenize: Option<String>,
    /// Write the report's metric families (those of `record --metrics`) to this file in the
    /// Prometheus text format, for the node exporter's textfile collector or a pushgateway.
    #[arg(long, value_name = "FILE")]
    prometheus: Option<PathBuf>,
    /// The `server` label of `--prometheus`'s samples (`record --metrics` labels with the
    /// upstream); default: the first recording's file name.
    #[arg(long, value_name = "NAME", requires = "prometheus")]
    server: Option<String>,
    /// Prices in dollars per million tokens (a JSON array of {"model", "input", "cache_read",
    /// "cache_write"}) over the dated default table of hosted models; a local server's model
    /// is priced only when named here.
    #[arg(long, value_name = "FILE")]
    prices: Option<PathBuf>,
}

pub fn run(args: AnalyzeArgs) -> u8 {
    for out in [&args.out, &args.prometheus, &args.html] {
        if let Err(code) = super::check_output(out.as_deref(), &args.files) {
            return code;
        }
    }
    let config = match super::analysis_config(args.prices.as_deref(), Some(args.gap_seconds)) {
        Ok(config) => config,
        Err(code) => return code,
    };
    // One recording, nothing that needs its records again: each record is analysed as it is
    // read and dropped, so memory is the analysis's, not the file's (issue #16). The incremental engine's
    // report equals the batch's (tests/incremental.rs).
    let streamed = args.tokenize.is_none() && args.prometheus.is_none() && args.files.len() == 1;
    let (read, records, mut report) = if streamed {
        let Some((read, report)) = analyze_streamed(&args.files, &config) else {
            return EXIT_UNREADABLE;
        };
        (read, Vec::new(), report)
    } else {
        let Some(mut read) = super::read_recordings(&args.files) else {
            return EXIT_UNREADABLE;
        };
        let mut records = std::mem::take(&mut read.records);
        if let Some(url) = &args.tokenize {
            let result = prefixscope_capture::tokenize::enrich(&mut records, url);
            for warning in &result.warnings {
                prefixscope_core::stderr_line!("prefixscope: warning: tokenize: {warning}");
            }
        }
        let report = analyze(&records, &config);
        (read, records, report)
    };
    let exit_code = read.exit_code();
    let bad_lines: u64 = read.files.iter().map(|f| f.bad_lines.len() as u64).sum();
    report.coverage.bad_lines = bad_lines;
    // Only when asked for: the text of 100,000 rows is hundreds of megabytes.
    let json = if args.out.is_some() || args.json {
        serde_json::to_string_pretty(&report).unwrap_or_default()
    } else {
        String::new()
    };
    if let Some(out) = &args.out {
        // `-o report.json` or `-o report`: report.json and report.html beside it.
        let (json_path, html_path) = super::report_paths(out, args.html.as_deref());
        if let Err(code) =
            super::write_output(&json_path, &args.files, format!("{json}\n").as_bytes())
        {
            return code;
        }
        if let Some(html_path) = html_path {
            let html = prefixscope::html_report::analysis_page(&report, &report.findings);
            if let Err(code) = super::write_output(&html_path, &args.files, html.as_bytes()) {
                return code;
            }
        }
    }
    if let Some(out) = &args.prometheus {
        let server = args.server.clone().unwrap_or_else(|| {
            args.files[0]
                .file_name()
                .map_or_else(String::new, |name| name.to_string_lossy().into_owned())
        });
        let text = prefixscope::metrics::of_recording(&records, &report, &config, &server);
        if let Err(code) = super::write_output(out, &args.files, text.as_bytes()) {
            return code;
        }
    }
    if args.json {
        super::print_json(&json);
    } else {
        super::print_stdout(&report.summary());
    }
    exit_code
}
