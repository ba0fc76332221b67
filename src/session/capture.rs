//! A capture session: the recording proxy (bound), its recorder and the runtime, from a plain
//! config; what `record`, `watch` and `demo` start from. The live controls the TUI asks of it,
//! the shutdown signals, and the headless printer live here too.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::Error;
use super::shutdown::Shutdown;
use prefixscope_capture::proxy::{Proxy, ProxyConfig, ProxyStats, Upstream};
use prefixscope_capture::recorder::{Recorder, RecorderConfig, RecorderStats};
use prefixscope_core::calendar::civil_from_days;
use prefixscope_core::capture::BodyMode;
use prefixscope_core::record::{ExchangeError, Record};

/// Where to listen, where to forward, what to record.
#[derive(Debug, Clone)]
pub struct CaptureConfig {
    /// The model server: http://HOST:PORT[/prefix] or https://…
    pub upstream: String,
    pub listen: SocketAddr,
    /// The recording; `None`: prefixscope-YYYYMMDD-HHMMSS.jsonl.
    pub out: Option<PathBuf>,
    /// Hashes, sizes and counters only, no text.
    pub digest: bool,
    /// Most bytes of each body kept.
    pub max_body: u64,
    /// Most bytes of request bodies held at once, all connections together.
    pub body_budget: u64,
    /// Rotate before a file would grow past this.
    pub max_size: Option<u64>,
    /// Whole seconds to wait for a connection to the server (1 to `MAX_CONNECT_TIMEOUT_SECS`).
    pub connect_timeout: u64,
    /// Extra CA certificates (PEM) for an https:// upstream.
    pub ca_file: Option<PathBuf>,
    /// Lay each record out as a llama.cpp upstream renders it (`tokenize::LiveLayout`).
    pub layout: bool,
    /// Ask the upstream what it is (`probe::poll`): once (`record`), or on and on (`watch`).
    pub probe: prefixscope_capture::poll::Schedule,
    /// Hand each request over as it starts (`LiveCapture::starts`), for the live slot predictions.
    pub announce_starts: bool,
}

/// A bound proxy and a running recorder, not yet serving.
pub struct LiveCapture {
    pub runtime: tokio::runtime::Runtime,
    pub proxy: Proxy,
    pub recorder: Recorder<bytes::Bytes>,
    pub path: PathBuf,
    pub listen: SocketAddr,
    pub upstream: Upstream,
    /// The descriptor limit, raised to the hard limit at the start.
    pub descriptors: Option<prefixscope_capture::proxy::DescriptorLimit>,
    /// What the token layout did (None: off, or an upstream it cannot ask).
    pub layout: Option<Arc<prefixscope_capture::tokenize::LiveLayoutStats>>,
    /// The server probe's task (`probe::poll`): it ends with the runtime, or earlier when a
    /// session stops the upstream itself (the demo), so no probe finds it gone.
    pub probe: tokio::task::AbortHandle,
    /// Each request as it starts, when `announce_starts` asked for them.
    pub starts: Option<RequestStarts>,
}

/// Requests as they start (the proxy's `request_starts`), and the mode their records are built
/// in, the recording's.
pub struct RequestStarts {
    pub receiver: crossbeam_channel::Receiver<prefixscope_core::capture::Capture<bytes::Bytes>>,
    pub mode: BodyMode,
}

/// Starts waiting for the live engine at most; past it they are dropped and counted (a start
/// only feeds a prediction, the record follows anyway).
const STARTS_QUEUE: usize = 256;

impl RequestStarts {
    /// Hands each start's record to `push` (the live engine's input) until the proxy ends.
    /// `push` must not block: the proxy never waits on a start.
    pub fn forward(self, push: impl Fn(Arc<Record>)) {
        let RequestStarts { receiver, mode } = self;
        for capture in receiver {
            push(Arc::new(prefixscope_core::capture::build_record(
                capture, mode,
            )));
        }
    }

    /// `forward` into the live engine, as a screen's feeder.
    pub fn into_feeder(
        self,
    ) -> Box<dyn FnOnce(crossbeam_channel::Sender<prefixscope_core::live::Input>) + Send> {
        Box::new(move |inputs| {
            self.forward(|record| {
                // Full: the engine is behind; the record follows anyway.
                let _ = inputs.try_send(prefixscope_core::live::Input::Started(record));
            });
        })
    }
}

impl LiveCapture {
    /// What the start-up line says beside the addresses: the descriptor limit, and a warning
    /// when the proxy listens beyond this machine.
    pub fn notices(&self) -> Vec<String> {
        let mut notices = Vec::new();
        if let Some(limit) = self.descriptors {
            notices.push(if limit.now > limit.before {
                format!(
                    "descriptors: {} (raised from {}); each client uses two",
                    limit.now, limit.before
                )
            } else {
                format!(
                    "descriptors: {} (the hard limit); each client uses two",
                    limit.now
                )
            });
        }
        if let Some(warning) = exposure_warning(self.listen) {
            notices.push(warning);
        }
        notices
    }
}

/// A warning when `listen` is reachable from other machines: anyone who reaches the port can
/// use the upstream through it, and what they send is recorded.
pub fn exposure_warning(listen: SocketAddr) -> Option<String> {
    (!listen.ip().is_loopback()).then(|| {
        format!(
            "WARNING: listening on {listen}, beyond this machine: anyone who can reach it can use the upstream through the proxy, and what they send is recorded (use 127.0.0.1 to stay local)"
        )
    })
}

impl LiveCapture {
    /// Checks the config, creates the recording and binds the listener; every record goes to
    /// `consumers` too (or each probe's, to a `Consumer::probes_only`).
    pub fn start(
        args: &CaptureConfig,
        consumers: Vec<impl Into<prefixscope_capture::recorder::Consumer>>,
    ) -> Result<LiveCapture, Error> {
        let upstream = Upstream::parse(&args.upstream).map_err(|e| Error::Usage(e.to_string()))?;
        if !(1..=prefixscope_core::limits::MAX_CONNECT_TIMEOUT_SECS).contains(&args.connect_timeout)
        {
            return Err(Error::Usage(format!(
                "--connect-timeout must be from 1 to {} seconds",
                prefixscope_core::limits::MAX_CONNECT_TIMEOUT_SECS
            )));
        }
        let path = args.out.clone().unwrap_or_else(default_recording_name);
        check_new_recording(&path, args.max_size).map_err(Error::Usage)?;
        let extra_ca_pem = match &args.ca_file {
            Some(ca) => {
                let pem = std::fs::read(ca).map_err(|e| {
                    Error::Unreadable(format!("cannot read --ca-file {}: {e}", ca.display()))
                })?;
                // Checked here, so a bad file is named as such (not "cannot listen").
                prefixscope_capture::proxy::upstream::tls_connector(Some(&pem))
                    .map_err(|e| Error::Unreadable(format!("--ca-file {}: {e}", ca.display())))?;
                Some(pem)
            }
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
        // The layout asks the upstream itself (plain http only), on the recorder's thread.
        let live_layout = args
            .layout
            .then(|| prefixscope_capture::tokenize::LiveLayout::new(&upstream.url()))
            .flatten();
        let layout = live_layout.as_ref().map(|l| Arc::clone(&l.stats));
        let enrich = live_layout
            .map(|live_layout| Box::new(live_layout) as prefixscope_capture::recorder::Enrich);
        let recorder = Recorder::start_enriched(recorder_config, consumers, enrich)
            .map_err(|e| Error::Unreadable(format!("cannot create {}: {e}", path.display())))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Unreadable(format!("cannot start the runtime: {e}")))?;
        let mut config = ProxyConfig::new(args.listen, upstream.clone());
        config.max_body = usize::try_from(args.max_body).unwrap_or(usize::MAX);
        config.body_budget = usize::try_from(args.body_budget).unwrap_or(usize::MAX);
        config.connect_timeout = Duration::from_secs(args.connect_timeout);
        config.extra_ca_pem = extra_ca_pem;
        config.serving_threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let starts = args.announce_starts.then(|| {
            let (sender, receiver) = crossbeam_channel::bounded(STARTS_QUEUE);
            config.request_starts = Some(sender);
            RequestStarts { receiver, mode }
        });
        let descriptors = prefixscope_capture::proxy::raise_descriptor_limit();
        let proxy = runtime
            .block_on(Proxy::bind(config, recorder.sender()))
            .map_err(|e| Error::Unreadable(format!("cannot listen on {}: {e}", args.listen)))?;
        let listen = proxy.local_addr().unwrap_or(args.listen);
        // Whether the upstream answers, said at once (the status bar, before the first request):
        // a TCP connect, nothing the server would not expect. The proxy serves either way; a
        // request to a server that is down gets a 502 saying why.
        let stats = proxy.stats();
        let (host, port) = (upstream.host.clone(), upstream.port);
        runtime.spawn(async move {
            let connect = tokio::net::TcpStream::connect((host.as_str(), port));
            let outcome = match tokio::time::timeout(START_PROBE_TIMEOUT, connect).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(format!("at start, {host}:{port}: {e}")),
                Err(_) => Err(format!(
                    "at start, {host}:{port}: no answer in {} s",
                    START_PROBE_TIMEOUT.as_secs()
                )),
            };
            stats.note_upstream_at_start(outcome);
        });
        // The server's own word on what it is, off the request path; recorded through the
        // recorder like an exchange, marked `probe`.
        let poller =
            prefixscope_capture::poll::Poller::new(upstream.clone(), recorder.sender(), args.probe);
        let probe = runtime.spawn(poller.run()).abort_handle();
        Ok(LiveCapture {
            runtime,
            proxy,
            recorder,
            path,
            listen,
            upstream,
            descriptors,
            layout,
            probe,
            starts,
        })
    }
}

/// How long the check at start waits for the upstream to accept a connection.
const START_PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// What the TUI may ask of a live capture (`watch`, and `demo` around it).
pub struct LiveControl {
    pub proxy: Arc<ProxyStats>,
    pub recorder: Arc<RecorderStats>,
    pub stop: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    pub files: Vec<PathBuf>,
}

impl LiveControl {
    /// The controls of a capture's proxy and recorder, and the receiver its proxy waits on to
    /// stop (`stop` sends it).
    pub fn new(
        proxy: &Proxy,
        recorder: &Recorder<bytes::Bytes>,
        path: &Path,
    ) -> (LiveControl, tokio::sync::oneshot::Receiver<()>) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let control = LiveControl {
            proxy: proxy.stats(),
            recorder: recorder.stats(),
            stop: std::sync::Mutex::new(Some(stop)),
            files: vec![path.to_path_buf()],
        };
        (control, stopped)
    }

    /// Stops accepting; the proxy finishes what is in flight.
    pub fn stop(&self) {
        if let Some(stop) = self.stop.lock().ok().and_then(|mut s| s.take()) {
            let _ = stop.send(());
        }
    }

    pub fn upstream_ok(&self) -> Option<bool> {
        let ok = self.proxy.last_upstream_ok_ms.load(Ordering::Relaxed);
        let failed = self.proxy.last_upstream_failure_ms.load(Ordering::Relaxed);
        (ok > 0 || failed > 0).then_some(ok >= failed)
    }

    /// The status bar's notes: why the upstream is down, requests the HTTP parser refused
    /// (answered by hyper, never recorded), connections not accepted (out of descriptors).
    pub fn proxy_notes(&self) -> Vec<String> {
        let mut notes = Vec::new();
        if self.upstream_ok() == Some(false)
            && let Some(reason) = self.proxy.last_upstream_error()
        {
            let mut reason: String = reason.chars().take(80).collect();
            if reason.chars().count() == 80 {
                reason.push('…');
            }
            notes.push(reason);
        }
        let rejected = self.proxy.rejected.load(Ordering::Relaxed);
        if rejected > 0 {
            notes.push(format!("{rejected} refused (not recorded)"));
        }
        let over_budget = self.proxy.body_budget_refusals.load(Ordering::Relaxed);
        if over_budget > 0 {
            notes.push(format!("{over_budget} answered 503: body budget full"));
        }
        let accept = self.proxy.accept_errors.load(Ordering::Relaxed);
        if accept > 0 {
            notes.push(format!("{accept} not accepted"));
        }
        let unpredicted = self.proxy.starts_dropped.load(Ordering::Relaxed);
        if unpredicted > 0 {
            notes.push(format!(
                "{unpredicted} starts not predicted (the engine was behind)"
            ));
        }
        notes
    }
}

impl crate::tui::Control for LiveControl {
    fn stop(&self) {
        LiveControl::stop(self);
    }

    fn in_flight(&self) -> u64 {
        self.proxy.in_flight()
    }

    fn records_written(&self) -> Option<u64> {
        Some(self.recorder.written.load(Ordering::Relaxed))
    }

    fn upstream_ok(&self) -> Option<bool> {
        LiveControl::upstream_ok(self)
    }

    fn proxy_notes(&self) -> Vec<String> {
        LiveControl::proxy_notes(self)
    }

    fn export(&self, format: &str, path: &str) -> Result<String, String> {
        super::export::export_files(&self.files, format, path)
    }
}

/// Resolves on the first signal (SIGINT, SIGTERM, SIGHUP) after saying what is still in
/// flight; a second one exits at once (`shutdown`).
pub fn stop_on_signal(
    shutdown: &Shutdown,
    stats: Arc<ProxyStats>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let stopped = shutdown.stopped();
    async move {
        let signal = stopped.await;
        prefixscope_core::stderr_line!(
            "prefixscope: {}: stopping: finishing {} in flight (a second signal exits now)",
            signal.name(),
            prefixscope_core::units::plural(stats.in_flight(), "exchange")
        );
    }
}

/// A recording is always a new file: ids restart with every run, so appending to an old one
/// would mix two runs' ids, and an existing file keeps its own mode and owner. An existing
/// file (even empty) or a symlink at the path is refused; so is, when the recording rotates
/// (`max_size`), an earlier run's `NAME.N.EXT` beside it. A device or FIFO (`/dev/null`) is
/// written as it is. The recorder creates every file `O_EXCL | O_NOFOLLOW` anyway, so a file
/// made after this check is refused too, never appended to.
pub fn check_new_recording(path: &Path, max_size: Option<u64>) -> Result<(), String> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        let kind = meta.file_type();
        if kind.is_symlink() {
            return Err(format!(
                "{} is a symlink; a recording is created new, never through a link: choose a new file",
                path.display()
            ));
        }
        if kind.is_dir() {
            return Err(format!("{} is a directory", path.display()));
        }
        if kind.is_file() {
            return Err(if meta.len() > 0 {
                format!(
                    "{} already holds a recording; choose a new file (ids restart with every run)",
                    path.display()
                )
            } else {
                format!(
                    "{} already exists; a recording is created new (mode 0600): remove it or choose a new file",
                    path.display()
                )
            });
        }
    }
    if max_size.is_some()
        && let Some(old) = prefixscope_capture::recorder::rotation_leftover(path)
    {
        return Err(format!(
            "{} exists (an earlier run's rotated file?); remove it or choose a new name, so this run's files are not mixed with it",
            old.display()
        ));
    }
    Ok(())
}

pub fn default_recording_name() -> PathBuf {
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

/// How a capture's records are written and what became of them.
pub struct Written {
    pub records: u64,
    /// Records that could not be written (a full disk), with the last error.
    pub failed: u64,
    pub last_error: Option<String>,
    pub path: PathBuf,
    /// Records not laid out because captures were waiting (`RecorderStats::not_enriched`).
    pub not_laid_out: u64,
}

impl Written {
    fn of(stats: &RecorderStats, path: PathBuf) -> Written {
        Written {
            records: stats.written.load(Ordering::Relaxed),
            failed: stats.write_errors.load(Ordering::Relaxed),
            last_error: stats.last_error(),
            path,
            not_laid_out: stats.not_enriched.load(Ordering::Relaxed),
        }
    }

    /// Every record failed to write (there was at least one): the command's exit is 1.
    pub fn all_failed(&self) -> bool {
        self.records == 0 && self.failed > 0
    }
}

/// Where the figures of `watch`'s engine also go (`--metrics`).
pub type FiguresSender = crossbeam_channel::Sender<crate::metrics::serve::LazyFigures>;

/// `watch` on a terminal: the proxy on its runtime's thread, the live engine on the recorder's
/// consumer channel (`records`), the TUI until the user quits. Returns the snapshot on screen
/// at exit and what was written.
pub fn watch_screen(
    capture: LiveCapture,
    records: crossbeam_channel::Receiver<Arc<Record>>,
    analysis: prefixscope_core::analysis::Config,
    metrics: Option<FiguresSender>,
    switches: super::screen::Switches,
    shutdown: &Shutdown,
) -> (
    Result<Arc<prefixscope_core::live::Snapshot>, Error>,
    Written,
) {
    use super::screen::{Feed, ScreenConfig, run_screen_live};
    use crate::tui::app::{Input, Source};
    use crate::tui::event::Event;

    let LiveCapture {
        runtime,
        proxy,
        recorder,
        path,
        listen,
        upstream,
        starts,
        ..
    } = capture;
    let (events, receiver) = crossbeam_channel::unbounded();
    let (control, stop_rx) = LiveControl::new(&proxy, &recorder, &path);
    let proxy_thread = {
        let events = events.clone();
        std::thread::spawn(move || {
            runtime.block_on(proxy.run(async {
                let _ = stop_rx.await;
            }));
            let _ = events.send(Event::ProxyStopped);
        })
    };
    let screen = ScreenConfig {
        source: Source::Live {
            upstream: upstream.url(),
            listen: listen.to_string(),
            recording: path.display().to_string(),
        },
        input: Input::Exchanges,
        trace_block_size: None,
        speed: None,
        switches,
        server_settings: None,
        analysis,
    };
    // The recorder's consumer channel goes straight into the live engine.
    let feed = Feed {
        records: Some(records),
        feeder: starts.map(RequestStarts::into_feeder),
        metrics,
    };
    // Once the app quits: the proxy stops (answering what is in flight), the recorder writes
    // the last records and closes the engine's channel; the summary is the engine's snapshot
    // after it took them all, so it counts what "records written" counts.
    let (result, stats) =
        run_screen_live(screen, events, receiver, feed, &control, shutdown, || {
            control.stop();
            let _ = proxy_thread.join();
            recorder.finish()
        });
    (result, Written::of(&stats, path))
}

/// `watch` with no terminal: records as `record` does, a line per record on `out` as it
/// arrives, and at the end (the first signal) the summary of the live engine's snapshot.
pub fn watch_headless(
    capture: LiveCapture,
    records: crossbeam_channel::Receiver<Arc<Record>>,
    analysis: prefixscope_core::analysis::Config,
    metrics: Option<FiguresSender>,
    mut out: impl std::io::Write + Send + 'static,
    shutdown: &Shutdown,
) -> Written {
    use crate::metrics::Figures;
    use crate::metrics::serve::{COST_FACTOR, REFRESH};
    use crossbeam_channel::RecvTimeoutError;
    use prefixscope_core::live::{Engine, Input};
    let LiveCapture {
        runtime,
        proxy,
        recorder,
        path,
        ..
    } = capture;
    let proxy_stats = proxy.stats();
    let printer = std::thread::spawn(move || {
        let mut engine = Engine::new(analysis);
        // `--metrics` is sent this engine's figures as often as the endpoint rebuilds.
        let (mut due, mut changed) = (std::time::Instant::now(), false);
        loop {
            match records.recv_timeout(REFRESH) {
                Ok(record) => {
                    let _ = writeln!(out, "{}", super::headless::record_line(&record));
                    if matches!(
                        record.error,
                        Some(ExchangeError::UpstreamUnreachable | ExchangeError::Timeout)
                    ) {
                        // Why, on stderr beside the line (`record` does the same).
                        prefixscope_core::stderr_line!(
                            "prefixscope: upstream failed: {}",
                            proxy_stats.last_upstream_error().unwrap_or_default()
                        );
                    }
                    engine.push(Input::Record(record, crate::clock::wall_clock_ms()));
                    changed = true;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            if let Some(metrics) = metrics.as_ref().filter(|_| changed)
                && std::time::Instant::now() >= due
            {
                let started = std::time::Instant::now();
                let figures = Figures::of_engine(&mut engine);
                let _ = metrics.send(Box::new(move || figures));
                due = std::time::Instant::now() + REFRESH.max(started.elapsed() * COST_FACTOR);
                changed = false;
            }
        }
        let _ = write!(
            out,
            "{}",
            prefixscope_core::text::printable(&engine.snapshot().summary())
        );
    });
    let stats = proxy.stats();
    runtime.block_on(proxy.run(stop_on_signal(shutdown, stats)));
    drop(runtime);
    let stats = recorder.finish();
    let _ = printer.join();
    Written::of(&stats, path)
}
