//! `prefixscope record`: the proxy with a recorder and a one-line status per record on stderr.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use super::{EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE, parse_bytes, status};
use prefixscope::calendar::civil_from_days;
use prefixscope::capture::BodyMode;
use prefixscope::proxy::{DEFAULT_PORT, Proxy, ProxyConfig, ProxyStats, Upstream};
use prefixscope::record::Record;
use prefixscope::recorder::{Recorder, RecorderConfig, RecorderStats};

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
    /// Start a new file (rec.1.jsonl, rec.2.jsonl…) before one would grow past this size.
    #[arg(long, value_parser = parse_bytes)]
    pub max_size: Option<u64>,
    /// Seconds to wait for a connection to the server before recording a `timeout`.
    #[arg(long, default_value_t = 10.0)]
    pub connect_timeout: f64,
    /// Extra CA certificates (PEM) to trust for an https:// upstream.
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
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

/// A bound proxy and a running recorder, not yet serving.
pub struct Capture {
    pub runtime: tokio::runtime::Runtime,
    pub proxy: Proxy,
    pub recorder: Recorder<bytes::Bytes>,
    pub path: PathBuf,
    pub listen: SocketAddr,
    pub upstream: Upstream,
}

/// Checks the arguments, creates the recording and binds the listener; every record goes to
/// `consumers` too. On failure, the message is printed and the exit code returned.
pub fn start_capture(
    args: &CaptureArgs,
    consumers: Vec<crossbeam_channel::Sender<Arc<Record>>>,
) -> Result<Capture, u8> {
    let upstream = Upstream::parse(&args.upstream).map_err(|e| {
        eprintln!("prefixscope: {e}");
        EXIT_USAGE
    })?;
    if !(args.connect_timeout > 0.0 && args.connect_timeout.is_finite()) {
        eprintln!("prefixscope: --connect-timeout must be a positive number of seconds");
        return Err(EXIT_USAGE);
    }
    let path = args.out.clone().unwrap_or_else(default_recording_name);
    if let Err(e) = check_new_recording(&path) {
        eprintln!("prefixscope: {e}");
        return Err(EXIT_USAGE);
    }
    let extra_ca_pem = match &args.ca_file {
        Some(ca) => Some(std::fs::read(ca).map_err(|e| {
            eprintln!("prefixscope: cannot read {}: {e}", ca.display());
            EXIT_UNREADABLE
        })?),
        None => None,
    };
    let mode = if args.digest {
        BodyMode::Digest
    } else {
        BodyMode::Full
    };
    let recorder_config = RecorderConfig {
        path: Some(path.clone()),
        mode,
        max_size: args.max_size,
        queue: None,
    };
    let recorder = Recorder::start(recorder_config, consumers).map_err(|e| {
        eprintln!("prefixscope: cannot create {}: {e}", path.display());
        EXIT_UNREADABLE
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("prefixscope: cannot start the runtime: {e}");
            EXIT_UNREADABLE
        })?;
    let mut config = ProxyConfig::new(args.listen, upstream.clone());
    config.max_body = usize::try_from(args.max_body).unwrap_or(usize::MAX);
    config.connect_timeout = Duration::from_secs_f64(args.connect_timeout);
    config.extra_ca_pem = extra_ca_pem;
    let proxy = runtime
        .block_on(Proxy::bind(config, recorder.sender()))
        .map_err(|e| {
            eprintln!("prefixscope: cannot listen on {}: {e}", args.listen);
            EXIT_UNREADABLE
        })?;
    let listen = proxy.local_addr().unwrap_or(args.listen);
    Ok(Capture {
        runtime,
        proxy,
        recorder,
        path,
        listen,
        upstream,
    })
}

#[derive(Serialize)]
struct RecordSummary {
    exchanges: u64,
    records: u64,
    written: u64,
    write_errors: u64,
    last_write_error: Option<String>,
    files: Vec<PathBuf>,
    upstream_failures: u64,
}

pub fn run(args: RecordArgs) -> u8 {
    let (status_tx, status_rx) = crossbeam_channel::unbounded::<Arc<Record>>();
    let consumers = vec![status_tx];
    let Capture {
        runtime,
        proxy,
        recorder,
        path,
        listen,
        upstream,
    } = match start_capture(&args.capture, consumers) {
        Ok(capture) => capture,
        Err(code) => return code,
    };
    let recorder_stats = recorder.stats();
    // Even with -q this thread runs: it reports write failures.
    let status_thread = {
        let stats = Arc::clone(&recorder_stats);
        let quiet = args.quiet;
        std::thread::spawn(move || print_status(status_rx, stats, quiet))
    };
    let proxy_stats = proxy.stats();
    eprintln!(
        "prefixscope: proxy http://{listen} -> {}, recording to {} ({}, mode 0600). Ctrl-C stops.",
        upstream.url(),
        path.display(),
        if args.capture.digest {
            "digest: no text"
        } else {
            "full bodies"
        }
    );
    eprintln!(
        "prefixscope: point your agent at http://{listen}/v1 (OpenAI), http://{listen} (Anthropic, Ollama)"
    );

    let shutdown = shutdown_signal(Arc::clone(&proxy_stats));
    runtime.block_on(proxy.run(shutdown));
    drop(runtime);
    let recorder_stats = recorder.finish();
    let _ = status_thread.join();

    let summary = RecordSummary {
        exchanges: proxy_stats.exchanges.load(Ordering::Relaxed),
        records: recorder_stats.records.load(Ordering::Relaxed),
        written: recorder_stats.written.load(Ordering::Relaxed),
        write_errors: recorder_stats.write_errors.load(Ordering::Relaxed),
        last_write_error: recorder_stats.last_error(),
        files: recorder_stats.files(),
        upstream_failures: proxy_stats.upstream_failures.load(Ordering::Relaxed),
    };
    eprintln!(
        "prefixscope: {} exchanges, {} records written to {}{}",
        summary.exchanges,
        summary.written,
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
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&summary).unwrap_or_default()
        );
    }
    EXIT_OK
}

/// Resolves on the first Ctrl-C (or SIGTERM) after saying what is still in flight; a second
/// Ctrl-C exits at once.
async fn shutdown_signal(stats: Arc<ProxyStats>) {
    wait_for_stop().await;
    eprintln!(
        "prefixscope: stopping: finishing {} exchange(s) in flight (Ctrl-C again to exit now)",
        stats.in_flight()
    );
    tokio::spawn(async {
        wait_for_stop().await;
        eprintln!("prefixscope: exiting now; exchanges still in flight are not recorded");
        std::process::exit(130);
    });
}

async fn wait_for_stop() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

fn print_status(
    records: crossbeam_channel::Receiver<Arc<Record>>,
    stats: Arc<RecorderStats>,
    quiet: bool,
) {
    let mut errors_seen = 0;
    for record in records {
        if !quiet {
            eprintln!("{}", status::record_line(&record));
        }
        let errors = stats.write_errors.load(Ordering::Relaxed);
        if errors > errors_seen {
            errors_seen = errors;
            eprintln!(
                "prefixscope: WRITE FAILED ({errors} record(s) not written, still forwarding): {}",
                stats.last_error().unwrap_or_default()
            );
        }
    }
}

/// Ids restart with every run, so appending to an old recording would mix two runs' ids.
fn check_new_recording(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() && meta.len() > 0 => Err(format!(
            "{} already holds a recording; choose a new file (ids restart with every run)",
            path.display()
        )),
        _ => Ok(()),
    }
}

fn default_recording_name() -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let t = secs % 86_400;
    PathBuf::from(format!(
        "prefixscope-{y:04}{m:02}{d:02}-{:02}{:02}{:02}.jsonl",
        t / 3600,
        t / 60 % 60,
        t % 60
    ))
}
