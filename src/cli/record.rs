//! `prefixscope record`: the proxy with a recorder and a one-line status per record on stderr.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use clap::Args;
use serde::Serialize;

use super::{EXIT_OK, EXIT_UNREADABLE, fail, parse_bytes};
use prefixscope::metrics::serve::Endpoint;
use prefixscope::session::capture::FiguresSender;
use prefixscope::session::capture::{CaptureConfig, LiveCapture, stop_on_signal};
use prefixscope::session::headless::record_line;
use prefixscope::session::shutdown::Shutdown;
use prefixscope_capture::proxy::DEFAULT_PORT;
use prefixscope_capture::recorder::{Consumer, RecorderStats};
use prefixscope_core::record::Record;

/// Where to listen, where to forward, what to record: shared by `record` and `watch`.
#[derive(Args)]
pub struct CaptureArgs {
    /// The model server: http://HOST:PORT[/prefix] or https://…
    #[arg(long)]
    pub upstream: String,
    /// Where agents connect (point their base URL here).
    #[arg(long, default_value_t = SocketAddr::from(([127, 0, 0, 1], DEFAULT_PORT)))]
    pub listen: SocketAddr,
    /// The recording (JSON Lines, mode 0600); default prefixscope-YYYYMMDD-HHMMSS.jsonl.
    #[arg(short, long)]
    pub out: Option<PathBuf>,
    /// Keep hashes, sizes and the server's counters, and no text (prompts, tool schemas,
    /// arguments and results stay out of the file).
    #[arg(long)]
    pub digest: bool,
    /// Keep at most this much of each body (e.g. 64MiB); larger ones are forwarded whole.
    #[arg(long, default_value = "64MiB", value_parser = parse_bytes)]
    pub max_body: u64,
    /// Hold at most this much of request bodies at once, all connections together (at least
    /// --max-body): a request finding no room waits for it up to 30 s, then gets a 503.
    #[arg(long, default_value = "256MiB", value_parser = parse_bytes)]
    pub body_budget: u64,
    /// Start a new file (rec.1.jsonl, rec.2.jsonl…) before one would grow past this size.
    #[arg(long, value_parser = parse_bytes)]
    pub max_size: Option<u64>,
    /// Seconds to wait for a connection to the server before recording a `timeout` (whole
    /// seconds, 1 to 86400).
    #[arg(long, default_value_t = 10, value_parser = super::parse_timeout_seconds)]
    pub connect_timeout: u64,
    /// Extra CA certificates (PEM) to trust for an https:// upstream.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
    /// Don't ask a llama.cpp upstream for each request's token layout (`/apply-template` and
    /// `/tokenize`, on the recorder's thread, never on the request path); without it, records
    /// from llama.cpp carry the exact token count of each message.
    #[arg(long)]
    pub no_layout: bool,
    /// Don't ask the server what it is (GET /props, /slots, /health, /metrics, /v1/models,
    /// /api/ps: once at the start of `record`, every 5 s in `watch`; recorded as probe records).
    #[arg(long)]
    pub no_probe: bool,
    /// Serve /metrics (Prometheus text format) and /healthz here, e.g. 127.0.0.1:9464: the live
    /// analysis's figures, for a fleet's Prometheus to scrape.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// --metrics: records per analysis window. The endpoint's figures equal `analyze` of each
    /// window's records and are summed over windows; its memory grows with the window
    /// (100 to 1,000,000; default 20,000 under `record`). `watch` has one analysis for its
    /// screen and the endpoint: it starts again at --memory-budget, and every this many
    /// records only when given.
    #[arg(long, value_name = "RECORDS",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
              .range(METRICS_WINDOW_MIN..=METRICS_WINDOW_MAX))]
    pub metrics_window: Option<usize>,
    /// The live analysis's memory at most (an estimate, e.g. 512MiB): past it the live engine
    /// (`watch`'s, a --metrics endpoint's) starts again, saying how many records it dropped.
    #[arg(long, value_name = "SIZE", default_value = "512MiB", value_parser = super::parse_memory_budget)]
    pub memory_budget: usize,
}

const METRICS_WINDOW_MIN: u64 = prefixscope::metrics::serve::MIN_WINDOW as u64;
const METRICS_WINDOW_MAX: u64 = prefixscope::metrics::serve::MAX_WINDOW as u64;

/// `--metrics`: its port, bound before the capture starts (a taken port fails at once, with
/// nothing created), and what it will read.
pub struct MetricsPlan {
    listener: std::net::TcpListener,
    feed: prefixscope::metrics::serve::EndpointFeed,
}

impl MetricsPlan {
    /// `record`: binds `--metrics` when it is given, adding its consumer to `consumers`; the
    /// endpoint analyses the records itself.
    pub fn bind(
        args: &CaptureArgs,
        consumers: &mut Vec<Consumer>,
    ) -> Result<Option<MetricsPlan>, u8> {
        let Some(listener) = args.bind_metrics()? else {
            return Ok(None);
        };
        let (consumer, feed) =
            prefixscope::metrics::serve::counting_consumer(prefixscope_core::analysis::Config {
                memory_budget: args.memory_budget,
                window: Some(
                    args.metrics_window
                        .unwrap_or(prefixscope::metrics::serve::DEFAULT_WINDOW),
                ),
                ..Default::default()
            });
        consumers.push(consumer);
        Ok(Some(MetricsPlan { listener, feed }))
    }

    /// `watch`: binds `--metrics` when it is given; the endpoint reads the engine fed by
    /// `engine` (`watch`'s), whose figures go to the returned sender.
    pub fn bind_to_engine(
        args: &CaptureArgs,
        engine: crossbeam_channel::Sender<std::sync::Arc<prefixscope_core::record::Record>>,
    ) -> Result<(Consumer, Option<(MetricsPlan, FiguresSender)>), u8> {
        let Some(listener) = args.bind_metrics()? else {
            return Ok((Consumer::from(engine), None));
        };
        let (consumer, feed, figures) = prefixscope::metrics::serve::engine_feed(engine);
        Ok((consumer, Some((MetricsPlan { listener, feed }, figures))))
    }

    /// Serves the endpoint on the capture's runtime, said on stderr.
    pub fn start(self, capture: &LiveCapture) -> Result<Endpoint, u8> {
        let endpoint = Endpoint::start(
            self.listener,
            &capture.runtime,
            self.feed,
            capture.recorder.stats(),
            capture.upstream.url(),
        )
        .map_err(|e| fail(prefixscope::session::Error::Unreadable(e)))?;
        prefixscope_core::stderr_line!(
            "prefixscope: metrics on http://{}/metrics (and /healthz)",
            endpoint.addr
        );
        Ok(endpoint)
    }
}

impl CaptureArgs {
    fn bind_metrics(&self) -> Result<Option<std::net::TcpListener>, u8> {
        self.metrics
            .map(|addr| {
                prefixscope::metrics::serve::bind(addr)
                    .map_err(|e| fail(prefixscope::session::Error::Unreadable(e)))
            })
            .transpose()
    }

    /// `record`'s: the server probed once at the start (`watch` asks on and on).
    pub fn config(&self) -> CaptureConfig {
        CaptureConfig {
            upstream: self.upstream.clone(),
            listen: self.listen,
            out: self.out.clone(),
            digest: self.digest,
            max_body: self.max_body,
            body_budget: self.body_budget,
            max_size: self.max_size,
            connect_timeout: self.connect_timeout,
            ca_file: self.ca_file.clone(),
            layout: !self.no_layout,
            probe: if self.no_probe {
                prefixscope_capture::poll::Schedule::Off
            } else {
                prefixscope_capture::poll::Schedule::Once
            },
            // `watch`'s screen asks for them; `record` has no one to predict for.
            announce_starts: false,
        }
    }
}

#[derive(Args)]
pub struct RecordArgs {
    #[command(flatten)]
    capture: CaptureArgs,
    /// No per-record status lines.
    #[arg(short, long)]
    quiet: bool,
    /// Print a JSON summary on stdout when the proxy stops.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct RecordSummary {
    exchanges: u64,
    records: u64,
    written: u64,
    write_errors: u64,
    last_write_error: Option<String>,
    bodies_dropped: u64,
    files: Vec<PathBuf>,
    upstream_failures: u64,
    last_upstream_error: Option<String>,
    /// Requests hyper refused before they were exchanges (answered 400, 431, 414; no record).
    rejected: u64,
    /// Connections closed for sending no request head within the header timeout.
    header_timeouts: u64,
    /// Requests answered 408 because their body stalled for the header timeout.
    body_timeouts: u64,
    /// Requests answered 503 because the body budget had no room for theirs in time.
    body_budget_refusals: u64,
    accept_errors: u64,
}

pub fn run(args: RecordArgs) -> u8 {
    let shutdown = Shutdown::listen();
    let (status_tx, status_rx) = crossbeam_channel::unbounded::<Arc<Record>>();
    let mut metrics_consumer = Vec::new();
    let metrics = match MetricsPlan::bind(&args.capture, &mut metrics_consumer) {
        Ok(metrics) => metrics,
        Err(code) => return code,
    };
    // With -q the status thread prints nothing per record: it needs only the probes' answers.
    let status = if args.quiet {
        Consumer::probes_only(status_tx)
    } else {
        Consumer::from(status_tx)
    };
    let consumers: Vec<Consumer> = std::iter::once(status).chain(metrics_consumer).collect();
    let capture = match LiveCapture::start(&args.capture.config(), consumers) {
        Ok(capture) => capture,
        Err(e) => return fail(e),
    };
    let endpoint = match metrics.map(|plan| plan.start(&capture)).transpose() {
        Ok(endpoint) => endpoint,
        Err(code) => return code,
    };
    let notices = capture.notices();
    let LiveCapture {
        runtime,
        proxy,
        recorder,
        path,
        listen,
        upstream,
        layout,
        ..
    } = capture;
    let recorder_stats = recorder.stats();
    // Even with -q this thread runs: it reports write failures.
    let proxy_stats = proxy.stats();
    let status_thread = {
        let stats = Arc::clone(&recorder_stats);
        let proxy = Arc::clone(&proxy_stats);
        let quiet = args.quiet;
        std::thread::spawn(move || print_status(status_rx, stats, proxy, quiet))
    };
    prefixscope_core::stderr_line!(
        "prefixscope: proxy http://{listen} -> {}, recording to {} ({}, mode 0600). Ctrl-C (or SIGTERM, SIGHUP) stops.",
        upstream.url(),
        path.display(),
        if args.capture.digest {
            "digest: no text"
        } else {
            "full bodies"
        }
    );
    prefixscope_core::stderr_line!(
        "prefixscope: point your agent at http://{listen}/v1 (OpenAI), http://{listen} (Anthropic, Ollama)"
    );
    for notice in &notices {
        prefixscope_core::stderr_line!("prefixscope: {notice}");
    }

    runtime.block_on(proxy.run(stop_on_signal(&shutdown, Arc::clone(&proxy_stats))));
    drop(runtime);
    let recorder_stats = recorder.finish();
    let server = status_thread.join().unwrap_or_default();
    if let Some(endpoint) = endpoint {
        endpoint.join();
    }

    let summary = RecordSummary {
        exchanges: proxy_stats.exchanges.load(Ordering::Relaxed),
        records: recorder_stats.records.load(Ordering::Relaxed),
        written: recorder_stats.written.load(Ordering::Relaxed),
        write_errors: recorder_stats.write_errors.load(Ordering::Relaxed),
        last_write_error: recorder_stats.last_error(),
        bodies_dropped: recorder_stats.bodies_dropped.load(Ordering::Relaxed),
        files: recorder_stats.files(),
        upstream_failures: proxy_stats.upstream_failures.load(Ordering::Relaxed),
        last_upstream_error: proxy_stats.last_upstream_error(),
        rejected: proxy_stats.rejected.load(Ordering::Relaxed),
        header_timeouts: proxy_stats.header_timeouts.load(Ordering::Relaxed),
        body_timeouts: proxy_stats.body_timeouts.load(Ordering::Relaxed),
        body_budget_refusals: proxy_stats.body_budget_refusals.load(Ordering::Relaxed),
        accept_errors: proxy_stats.accept_errors.load(Ordering::Relaxed),
    };
    prefixscope_core::stderr_line!(
        "prefixscope: {}, {} written to {}{}",
        prefixscope_core::units::plural(summary.exchanges, "exchange"),
        prefixscope_core::units::plural(summary.written, "record"),
        summary
            .files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        match summary.write_errors {
            0 => String::new(),
            n => format!(
                ", {n} NOT written ({})",
                summary.last_write_error.clone().unwrap_or_default()
            ),
        }
    );
    if let Some(line) = layout.and_then(|l| l.summary()) {
        prefixscope_core::stderr_line!("prefixscope: {line}");
    }
    if server.answers > 0 {
        prefixscope_core::stderr_line!(
            "prefixscope: {}",
            prefixscope_core::text::printable_line(&server.line())
        );
    }
    let not_laid_out = recorder_stats.not_enriched.load(Ordering::Relaxed);
    if not_laid_out > 0 {
        prefixscope_core::stderr_line!(
            "prefixscope: {not_laid_out} records not laid out: captures were waiting, or the stop's second for it ran out (the layout never holds the proxy back)"
        );
    }
    let refused = [
        (
            summary.rejected,
            "refused by the HTTP parser (not forwarded, not recorded)",
        ),
        (
            summary.header_timeouts,
            "connection(s) closed by the header timeout",
        ),
        (
            summary.body_timeouts,
            "request(s) answered 408: the body stalled for the header timeout",
        ),
        (
            summary.body_budget_refusals,
            "request(s) answered 503: the body budget had no room for 30 s (--body-budget)",
        ),
        (summary.accept_errors, "connection(s) not accepted"),
    ];
    for (count, what) in refused {
        if count > 0 {
            prefixscope_core::stderr_line!("prefixscope: {count} {what}");
        }
    }
    if args.json {
        prefixscope_core::stdout_line!(
            "{}",
            serde_json::to_string_pretty(&summary).unwrap_or_default()
        );
    }
    // Every record failed to write: what was asked (a recording) was not done.
    if summary.written == 0 && summary.write_errors > 0 {
        return EXIT_UNREADABLE;
    }
    EXIT_OK
}

/// How long the status thread sleeps when no record came.
const STATUS_POLL: std::time::Duration = std::time::Duration::from_millis(50);

fn print_status(
    records: crossbeam_channel::Receiver<Arc<Record>>,
    stats: Arc<RecorderStats>,
    proxy: Arc<prefixscope_capture::proxy::ProxyStats>,
    quiet: bool,
) -> prefixscope_core::probe::ServerInfo {
    // What the server's probes said, for the exit line (said even with -q).
    let mut server = prefixscope_core::probe::ServerInfo::default();
    let mut errors_seen = 0;
    let mut dropped_seen = 0;
    let (mut rejected_seen, mut accept_seen, mut upstream_seen) = (0, 0, 0);
    let mut open = true;
    while open {
        // Polled, never waited on: a thread blocked in `recv` would make the recorder wake it
        // (a futex call on the recorder's thread) for every record. Refused requests and accept
        // errors make no record, so they are looked at on every round too.
        let mut seen = 0usize;
        loop {
            match records.try_recv() {
                Ok(record) => {
                    seen += 1;
                    server.apply_record(&record);
                    if !quiet {
                        prefixscope_core::stderr_line!("{}", record_line(&record));
                    }
                }
                Err(crossbeam_channel::TryRecvError::Empty) => break,
                Err(crossbeam_channel::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        if seen == 0 && open {
            std::thread::sleep(STATUS_POLL);
        }
        let failures = proxy.upstream_failures.load(Ordering::Relaxed);
        if failures > upstream_seen {
            upstream_seen = failures;
            prefixscope_core::stderr_line!(
                "prefixscope: upstream failed ({failures} so far): {}",
                proxy.last_upstream_error().unwrap_or_default()
            );
        }
        let rejected = proxy.rejected.load(Ordering::Relaxed);
        if rejected > rejected_seen {
            rejected_seen = rejected;
            prefixscope_core::stderr_line!(
                "prefixscope: {rejected} request(s) refused by the HTTP parser, answered by it and not recorded (last: {})",
                proxy.last_rejection().unwrap_or_default()
            );
        }
        let accept = proxy.accept_errors.load(Ordering::Relaxed);
        if accept > accept_seen {
            accept_seen = accept;
            prefixscope_core::stderr_line!(
                "prefixscope: {accept} connection(s) could not be accepted (last: {})",
                proxy
                    .last_accept_error
                    .lock()
                    .ok()
                    .and_then(|e| e.clone())
                    .unwrap_or_default()
            );
        }
        let dropped = stats.bodies_dropped.load(Ordering::Relaxed);
        if dropped > dropped_seen {
            dropped_seen = dropped;
            prefixscope_core::stderr_line!(
                "prefixscope: {dropped} record(s) written without their bodies: with them the line would pass the {} MiB that readers take",
                prefixscope_core::limits::MAX_LINE_BYTES >> 20
            );
        }
        let errors = stats.write_errors.load(Ordering::Relaxed);
        if errors > errors_seen {
            errors_seen = errors;
            prefixscope_core::stderr_line!(
                "prefixscope: WRITE FAILED ({errors} record(s) not written, still forwarding): {}",
                stats.last_error().unwrap_or_default()
            );
        }
    }
    server
}
