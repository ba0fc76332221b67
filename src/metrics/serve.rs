//! `--metrics ADDR`: `/metrics` and `/healthz` over HTTP, an edge around the pure exposition.
//!
//! A thread of its own rebuilds the exposition at most every `REFRESH` (and every `REFRESH`
//! while idle, for the recorder's queue), or three times as long as the last rebuild took when
//! that is longer. Its figures are a live engine's (`Figures`): under `record`, the endpoint's
//! own, fed from the recorder (a bounded consumer channel, never the proxy's request path);
//! under `watch`, the one behind the screen or the summary, which sends them. A scrape only copies the
//! last text out, so scrapes cost the proxy nothing and a scrape storm costs one lock each.
//!
//! The analysis costs tens of microseconds a record (BENCHMARKS.md), more than the proxy spends
//! forwarding it, so this thread runs only on CPU time nothing else wants (`SCHED_IDLE`). Under
//! a load it cannot follow, its queue (`QUEUE` records) fills and the recorder skips it,
//! counted (`prefixscope_metrics_records_skipped_total`): the proxy never pays for the metrics.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};

use super::{Figures, Inputs, ProxyFigures, Traffic, classic, openmetrics, registry};
use prefixscope_capture::recorder::{Consumer, RecorderStats};
use prefixscope_core::analysis::Config;
use prefixscope_core::live::{Engine, Input};
use prefixscope_core::record::Record;

/// How often the exposition is rebuilt at most (and while idle).
pub const REFRESH: Duration = Duration::from_millis(250);
/// A rebuild waits at least this many times the last one's duration.
pub const COST_FACTOR: u32 = 3;
/// How long the thread sleeps when its queue is empty before it looks again.
const POLL: Duration = Duration::from_millis(20);
/// Records waiting for the endpoint's analysis at most: a burst's worth (half a second of a
/// busy proxy); beyond it the recorder skips the endpoint.
pub const QUEUE: usize = 8_192;

const OPENMETRICS_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const CLASSIC_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The last exposition, in both formats.
#[derive(Debug, Default)]
struct Exposition {
    openmetrics: Bytes,
    classic: Bytes,
}

/// Records per analysis window under `record` unless `--metrics-window` says otherwise (a
/// window also closes at `--memory-budget`).
pub const DEFAULT_WINDOW: usize = 20_000;
/// `--metrics-window`'s bounds.
pub const MIN_WINDOW: usize = 100;
pub const MAX_WINDOW: usize = 1_000_000;

/// `record --metrics`: the endpoint's own consumer, bounded to `QUEUE` (the recorder skips it,
/// counted, rather than queue without end), every record counted in the raw families, skipped
/// or not; its own engine runs with `analysis` (its window and memory budget).
pub fn counting_consumer(analysis: Config) -> (Consumer, EndpointFeed) {
    let (sender, records) = crossbeam_channel::bounded(QUEUE);
    let (consumer, traffic) = counted(sender);
    (
        consumer,
        EndpointFeed {
            source: FiguresFrom::Records(records, Box::new(Engine::new(analysis))),
            traffic,
        },
    )
}

/// `watch --metrics`: the endpoint reads the figures of `watch`'s own engine, sent to the
/// returned sender. `engine` is that engine's consumer channel, whose records the raw families
/// count.
pub fn engine_feed(
    engine: crossbeam_channel::Sender<Arc<Record>>,
) -> (
    Consumer,
    EndpointFeed,
    crossbeam_channel::Sender<LazyFigures>,
) {
    let (figures, source) = crossbeam_channel::unbounded();
    let (consumer, traffic) = counted(engine);
    (
        consumer,
        EndpointFeed {
            source: FiguresFrom::Engine(source),
            traffic,
        },
        figures,
    )
}

fn counted(sender: crossbeam_channel::Sender<Arc<Record>>) -> (Consumer, Arc<Mutex<Traffic>>) {
    let traffic = Arc::new(Mutex::new(Traffic::default()));
    let tally = Arc::clone(&traffic);
    let consumer = Consumer::counted(
        sender,
        Arc::new(move |record: &Record| {
            if let Ok(mut traffic) = tally.lock() {
                traffic.add(record);
            }
        }),
    );
    (consumer, traffic)
}

/// What the endpoint reads: where its figures come from, and the counts of every record written.
pub struct EndpointFeed {
    source: FiguresFrom,
    traffic: Arc<Mutex<Traffic>>,
}

/// Figures `watch`'s engine sends, worked out on the endpoint's thread when it reads them: only
/// the newest is, and never on the engine's thread (the sums take 30 ms at 100,000 rows).
pub type LazyFigures = Box<dyn FnOnce() -> Figures + Send>;

enum FiguresFrom {
    /// The records, analysed by the endpoint's own engine.
    Records(crossbeam_channel::Receiver<Arc<Record>>, Box<Engine>),
    /// The figures of `watch`'s engine.
    Engine(crossbeam_channel::Receiver<LazyFigures>),
}

/// Binds `--metrics ADDR` before anything starts, so a taken port is a clear error at once.
pub fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, String> {
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| format!("cannot listen on --metrics {addr}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot listen on --metrics {addr}: {e}"))?;
    Ok(listener)
}

/// The running endpoint: its consumer thread ends when the recorder closes the channel.
pub struct Endpoint {
    pub addr: SocketAddr,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Endpoint {
    /// Serves `listener` on `runtime` and starts the thread that reads `feed`. `server` is the
    /// `server` label (the upstream).
    pub fn start(
        listener: std::net::TcpListener,
        runtime: &tokio::runtime::Runtime,
        feed: EndpointFeed,
        recorder: Arc<RecorderStats>,
        server: String,
    ) -> Result<Endpoint, String> {
        let addr = listener
            .local_addr()
            .map_err(|e| format!("--metrics: {e}"))?;
        let shared = Arc::new(Mutex::new(Exposition::default()));
        let connection_errors = Arc::new(AtomicU64::new(0));
        let listener = {
            let _entered = runtime.enter();
            tokio::net::TcpListener::from_std(listener)
                .map_err(|e| format!("cannot listen on --metrics {addr}: {e}"))?
        };
        let mut builder = Builder {
            traffic: feed.traffic,
            recorder,
            connection_errors: Arc::clone(&connection_errors),
            server,
            shared: Arc::clone(&shared),
        };
        // The families are there, with HELP and TYPE, before the first scrape.
        let empty = Figures::of_engine(&mut Engine::new(Config::default()));
        builder.publish(&empty);
        runtime.spawn(serve(listener, shared, connection_errors));
        let thread = std::thread::Builder::new()
            .name("prefixscope-metrics".into())
            .spawn(move || match feed.source {
                FiguresFrom::Records(records, engine) => builder.analyse(*engine, records),
                FiguresFrom::Engine(figures) => builder.read(figures, empty),
            })
            .map_err(|e| format!("--metrics: cannot start its thread: {e}"))?;
        Ok(Endpoint {
            addr,
            thread: Some(thread),
        })
    }

    /// Waits for the consumer thread (after the recorder finished).
    pub fn join(mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Builder {
    /// Every record the recorder wrote, counted on its thread (`Consumer::counted`), so the
    /// raw counters hold while the analysis steps aside and its queue is skipped.
    traffic: Arc<Mutex<Traffic>>,
    recorder: Arc<RecorderStats>,
    connection_errors: Arc<AtomicU64>,
    server: String,
    shared: Arc<Mutex<Exposition>>,
}

impl Builder {
    /// `record`: the records analysed here, stepping aside while they come too fast.
    fn analyse(&mut self, mut engine: Engine, records: crossbeam_channel::Receiver<Arc<Record>>) {
        lower_priority();
        let mut figures = Figures::of_engine(&mut engine);
        let mut changed = false;
        let mut built = Instant::now();
        let mut interval = REFRESH;
        let mut pace = StepAside::default();
        let mut counted = (
            self.recorder.records.load(Ordering::Relaxed),
            Instant::now(),
        );
        loop {
            let elapsed = counted.1.elapsed();
            if elapsed >= REFRESH {
                let now = self.recorder.records.load(Ordering::Relaxed);
                pace.arrivals(now.saturating_sub(counted.0) as f64 / elapsed.as_secs_f64());
                counted = (now, Instant::now());
            }
            if pace.aside {
                // The records wait in the queue (the recorder skips it while it is full) and
                // are analysed once the load drops: the recorder stopping is such a drop.
                std::thread::sleep(REFRESH);
            } else {
                // Polled, never waited on: a receiver blocked in `recv` would make the recorder
                // wake it (a futex call on the recorder's thread) for every record.
                match records.try_recv() {
                    Ok(record) => {
                        let started = Instant::now();
                        engine.push(Input::Record(record, crate::clock::wall_clock_ms()));
                        pace.analysed(started.elapsed());
                        changed = true;
                    }
                    Err(crossbeam_channel::TryRecvError::Empty) => std::thread::sleep(POLL),
                    Err(crossbeam_channel::TryRecvError::Disconnected) => break,
                }
            }
            if built.elapsed() >= interval {
                let started = Instant::now();
                if changed {
                    figures = Figures::of_engine(&mut engine);
                    changed = false;
                }
                figures.window.stepped_aside = pace.aside;
                self.publish(&figures);
                built = Instant::now();
                // Never more than a third of this thread's time on rebuilding (a snapshot of
                // 100,000 rows takes over 100 ms).
                interval = REFRESH.max(started.elapsed() * COST_FACTOR);
            }
        }
    }

    /// `watch`: the newest figures of the engine behind the screen (or the headless summary),
    /// at most every `REFRESH`.
    fn read(
        &mut self,
        figures_sent: crossbeam_channel::Receiver<LazyFigures>,
        mut figures: Figures,
    ) {
        lower_priority();
        loop {
            let started = Instant::now();
            match figures_sent.recv_timeout(REFRESH) {
                Ok(first) => figures = figures_sent.try_iter().last().unwrap_or(first)(),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
            }
            self.publish(&figures);
            std::thread::sleep(REFRESH.saturating_sub(started.elapsed()));
        }
    }

    fn publish(&self, figures: &Figures) {
        let proxy = ProxyFigures {
            records_not_written: self.recorder.write_errors.load(Ordering::Relaxed),
            recorder_queue_depth: self.recorder.queued.load(Ordering::Relaxed),
            metrics_connection_errors: self.connection_errors.load(Ordering::Relaxed),
        };
        let mut window = figures.window;
        window.records_skipped = self
            .recorder
            .consumer_records_skipped
            .load(Ordering::Relaxed);
        let traffic = self
            .traffic
            .lock()
            .map_or_else(|poisoned| poisoned.into_inner().clone(), |t| t.clone());
        let inputs = Inputs {
            totals: &figures.totals,
            traffic: &traffic,
            cache: figures.cache,
            proxy: Some(proxy),
            window: Some(window),
            server: &self.server,
        };
        let text = openmetrics(&registry(&inputs));
        let exposition = Exposition {
            classic: Bytes::from(classic(&text)),
            openmetrics: Bytes::from(text),
        };
        if let Ok(mut shared) = self.shared.lock() {
            *shared = exposition;
        }
    }
}

/// Whether the analysis steps aside: while records arrive faster than it analyses them it could
/// not keep up anyway (the recorder skips it, counted), and every record it took would take CPU
/// and cache from a proxy that has none to spare, even at `SCHED_IDLE`. It comes back once they
/// arrive at under half its rate.
#[derive(Debug, Default)]
struct StepAside {
    /// Wall time per record analysed, a moving average (µs); 0 before the first.
    cost_us: f64,
    aside: bool,
}

impl StepAside {
    fn analysed(&mut self, took: Duration) {
        let us = took.as_secs_f64() * 1e6;
        self.cost_us = if self.cost_us == 0.0 {
            us
        } else {
            0.98 * self.cost_us + 0.02 * us
        };
    }

    /// Records a second the analysis takes (unbounded before it has measured one).
    fn rate(&self) -> f64 {
        if self.cost_us > 0.0 {
            1e6 / self.cost_us
        } else {
            f64::INFINITY
        }
    }

    /// The recorder's records per second over the last interval.
    fn arrivals(&mut self, per_second: f64) {
        if self.aside {
            self.aside = per_second >= self.rate() / 2.0;
        } else {
            self.aside = per_second > self.rate();
        }
    }
}

/// The analysis of every record costs tens of microseconds (BENCHMARKS.md): at thousands of
/// requests a second on a busy machine it would take CPU from the proxy. `SCHED_IDLE` runs this
/// thread only when no other thread wants the CPU (a nice value of 19 still takes a share); where
/// that is refused, nice 19. Under a load it cannot follow, its queue fills and the recorder
/// skips it, counted.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid, sched_setscheduler and setpriority read and set this thread's own
        // scheduling policy; `param` lives across the call. Linux applies a thread id's policy
        // and nice value to that thread alone. Failing leaves the priority as it was, which is
        // only slower under load.
        unsafe {
            let thread = libc::gettid();
            let param = libc::sched_param { sched_priority: 0 };
            if libc::sched_setscheduler(thread, libc::SCHED_IDLE, &param) != 0 {
                let _ = libc::setpriority(libc::PRIO_PROCESS, thread as libc::id_t, 19);
            }
        }
    }
}

async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Mutex<Exposition>>,
    connection_errors: Arc<AtomicU64>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of descriptors, most likely: counted, and tried again shortly.
                connection_errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let shared = Arc::clone(&shared);
        let errors = Arc::clone(&connection_errors);
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, Infallible>(answer(&shared, &request)) }
            });
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if served.is_err() {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

fn answer<B>(shared: &Mutex<Exposition>, request: &Request<B>) -> Response<Full<Bytes>> {
    let reply = |status: StatusCode, content_type: &str, body: Bytes| {
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
            response
                .headers_mut()
                .insert(hyper::header::CONTENT_TYPE, value);
        }
        response
    };
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"GET only\n"),
        );
    }
    match request.uri().path() {
        "/metrics" => {
            // Prometheus asks for OpenMetrics first; anything else gets the classic format.
            let wants_openmetrics = request
                .headers()
                .get(hyper::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|accept| accept.contains("application/openmetrics-text"));
            let (content_type, body) = match shared.lock() {
                Ok(exposition) if wants_openmetrics => {
                    (OPENMETRICS_TYPE, exposition.openmetrics.clone())
                }
                Ok(exposition) => (CLASSIC_TYPE, exposition.classic.clone()),
                Err(_) => {
                    return reply(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "text/plain; charset=utf-8",
                        Bytes::from_static(b"the metrics thread failed\n"),
                    );
                }
            };
            reply(StatusCode::OK, content_type, body)
        }
        "/healthz" => reply(
            StatusCode::OK,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"ok\n"),
        ),
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            Bytes::from_static(b"not found: /metrics or /healthz\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_analysis_steps_aside_while_records_come_faster_than_it_takes_them() {
        let mut pace = StepAside::default();
        pace.arrivals(1e9);
        assert!(!pace.aside, "nothing measured yet: it keeps analysing");
        pace.analysed(Duration::from_micros(100)); // 10,000 records a second
        pace.arrivals(9_000.0);
        assert!(!pace.aside);
        pace.arrivals(20_000.0);
        assert!(pace.aside);
        pace.arrivals(6_000.0);
        assert!(pace.aside, "back only under half its rate");
        pace.arrivals(4_000.0);
        assert!(!pace.aside);
        pace.arrivals(0.0);
        assert!(!pace.aside);
    }
}
