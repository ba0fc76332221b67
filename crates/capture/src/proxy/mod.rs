//! The recording proxy (tokio + hyper 1.x, HTTP/1.1): forwards every byte unchanged and hands one
//! capture per exchange to the recorder.
//!
//! One task per client connection, and one upstream connection per client connection, opened on
//! its first request. The request body is read whole up to `max_body`, then forwarded (a larger
//! one is streamed to the upstream as it arrives, not kept); the response streams back frame by
//! frame as it arrives, with a copy kept up to `max_body`.

mod body;
mod forward;
pub mod headers;
pub mod upstream;

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use hyper::server::conn::http1 as server_http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::task::JoinSet;

use crate::recorder::CaptureSender;
use prefixscope_core::capture::Capture;
pub use upstream::Upstream;

/// Default listen port: next to neither llama-server (8080) nor Ollama (11434).
pub const DEFAULT_PORT: u16 = 8787;
pub const DEFAULT_MAX_BODY: usize = 64 * 1024 * 1024;

/// Request bodies held at once, all connections together (`ProxyConfig::body_budget`): four
/// bodies of the largest kept size, or thousands of an agent's.
pub const DEFAULT_BODY_BUDGET: usize = 4 * DEFAULT_MAX_BODY;
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A client's request head must arrive within this, and a kept-alive connection is closed after
/// waiting this long for its next request: 30 s (hyper's default value; llama-server closes idle
/// connections after 5 s, so clients already reconnect). Slow-header clients held connections
/// and descriptors for ever before.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub listen: SocketAddr,
    pub upstream: Upstream,
    /// Bodies larger than this are forwarded whole but not kept.
    pub max_body: usize,
    /// Bytes of request bodies read and held at once, over every connection (at least
    /// `max_body`). A request whose body finds no room waits for it as long as a stalled body
    /// may (`header_timeout`), then is answered 503, counted in `ProxyStats::body_budget_refusals`.
    pub body_budget: usize,
    pub connect_timeout: Duration,
    /// PEM CA certificates trusted for `https://` upstreams, beside the Mozilla roots.
    pub extra_ca_pem: Option<Vec<u8>>,
    /// How long a client may take to send a request head, and how long a kept-alive
    /// connection may wait for its next request (`DEFAULT_HEADER_TIMEOUT`).
    pub header_timeout: Duration,
    /// Where each request goes as soon as its body is read, before the upstream answers (the
    /// live engine predicts what it will do to the server's slots). Never waited on: a full
    /// channel drops the start (counted in `ProxyStats::starts_dropped`).
    pub request_starts: Option<crossbeam_channel::Sender<Capture<Bytes>>>,
    /// Threads that serve connections, each with a runtime of its own (see [`Proxy::run`]); 0
    /// or 1 serves them on the runtime that runs the proxy.
    pub serving_threads: usize,
}

impl ProxyConfig {
    pub fn new(listen: SocketAddr, upstream: Upstream) -> ProxyConfig {
        ProxyConfig {
            listen,
            upstream,
            max_body: DEFAULT_MAX_BODY,
            body_budget: DEFAULT_BODY_BUDGET,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            extra_ca_pem: None,
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            request_starts: None,
            serving_threads: 1,
        }
    }
}

/// Counters shared with whoever shows status.
#[derive(Debug, Default)]
pub struct ProxyStats {
    pub exchanges: AtomicU64,
    /// Exchanges whose capture has not reached the recorder yet.
    pub in_flight: AtomicU64,
    pub connections: AtomicU64,
    pub upstream_failures: AtomicU64,
    /// Unix ms of the last exchange that got a response head from upstream, 0 if none.
    pub last_upstream_ok_ms: AtomicU64,
    /// Unix ms of the last exchange that could not reach upstream, 0 if none.
    pub last_upstream_failure_ms: AtomicU64,
    /// Why the last connection to the upstream failed (the TLS or OS error).
    pub last_upstream_error: std::sync::Mutex<Option<String>>,
    /// Requests the HTTP parser refused before they were exchanges (bad framing, headers too
    /// large, a URI too long: hyper answers 400, 431 or 414 itself): not forwarded, not
    /// recorded, counted here.
    pub rejected: AtomicU64,
    /// Why the last one was refused.
    pub last_rejection: std::sync::Mutex<Option<String>>,
    /// Connections closed because the request head did not arrive within the header timeout
    /// (slow or idle clients).
    pub header_timeouts: AtomicU64,
    /// Requests answered 408 because their body stalled (no byte for the header timeout)
    /// while it was being read.
    pub body_timeouts: AtomicU64,
    /// Requests answered 503 because their body found no room in the body budget in time.
    pub body_budget_refusals: AtomicU64,
    /// Connections that could not be accepted (out of descriptors, mostly), and why.
    pub accept_errors: AtomicU64,
    pub last_accept_error: std::sync::Mutex<Option<String>>,
    /// Request starts not handed to `ProxyConfig::request_starts` (its channel was full).
    pub starts_dropped: AtomicU64,
    idle: Notify,
}

impl ProxyStats {
    /// What a check at start found (`ok`, or why not), unless a request already told.
    pub fn note_upstream_at_start(&self, outcome: Result<(), String>) {
        let now = now_ms().max(1) as u64;
        let told = self.last_upstream_ok_ms.load(Ordering::Relaxed) > 0
            || self.last_upstream_failure_ms.load(Ordering::Relaxed) > 0;
        if told {
            return;
        }
        match outcome {
            Ok(()) => {
                let _ = self.last_upstream_ok_ms.compare_exchange(
                    0,
                    now,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            Err(reason) => {
                self.set_upstream_error(&reason);
                let _ = self.last_upstream_failure_ms.compare_exchange(
                    0,
                    now,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
        }
    }

    fn note_accept_error(&self, error: &io::Error) {
        self.accept_errors.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut last) = self.last_accept_error.lock() {
            *last = Some(error.to_string());
        }
    }

    pub fn last_upstream_error(&self) -> Option<String> {
        self.last_upstream_error.lock().ok().and_then(|e| e.clone())
    }

    pub(crate) fn set_upstream_error(&self, reason: &str) {
        if let Ok(mut last) = self.last_upstream_error.lock() {
            *last = Some(reason.to_string());
        }
    }

    pub fn last_rejection(&self) -> Option<String> {
        self.last_rejection.lock().ok().and_then(|e| e.clone())
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub(crate) fn exchange_done(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }

    async fn wait_idle(&self) {
        loop {
            let notified = self.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            // A capture handed over from the blocking pool signals too; poll as a backstop.
            let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
        }
    }
}

pub(crate) struct Shared {
    pub upstream: Upstream,
    /// How long a request body may go without a byte while it is read (the header timeout).
    pub body_timeout: Duration,
    pub host_header: hyper::header::HeaderValue,
    pub tls: Option<tokio_rustls::TlsConnector>,
    pub max_body: usize,
    /// The body budget's room, a permit a byte (`ProxyConfig::body_budget`).
    pub body_budget: Arc<tokio::sync::Semaphore>,
    pub connect_timeout: Duration,
    pub captures: CaptureSender<Bytes>,
    pub request_starts: Option<crossbeam_channel::Sender<Capture<Bytes>>>,
    pub next_id: AtomicU64,
    pub stats: Arc<ProxyStats>,
}

/// A bound proxy, not yet serving: bind first so callers (and tests) know the address.
pub struct Proxy {
    listener: TcpListener,
    shared: Arc<Shared>,
    header_timeout: Duration,
    serving_threads: usize,
}

impl Proxy {
    pub async fn bind(config: ProxyConfig, captures: CaptureSender<Bytes>) -> io::Result<Proxy> {
        let tls = if config.upstream.https {
            Some(
                upstream::tls_connector(config.extra_ca_pem.as_deref())
                    .map_err(io::Error::other)?,
            )
        } else {
            None
        };
        let host_header = hyper::header::HeaderValue::from_str(&config.upstream.authority())
            .map_err(|_| io::Error::other("upstream host is not a valid Host header"))?;
        let listener = TcpListener::bind(config.listen).await?;
        let shared = Arc::new(Shared {
            upstream: config.upstream,
            body_timeout: config.header_timeout,
            host_header,
            tls,
            max_body: config.max_body,
            body_budget: Arc::new(tokio::sync::Semaphore::new(
                config
                    .body_budget
                    .max(config.max_body)
                    .min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            connect_timeout: config.connect_timeout,
            captures,
            request_starts: config.request_starts,
            next_id: AtomicU64::new(1),
            stats: Arc::new(ProxyStats::default()),
        });
        Ok(Proxy {
            listener,
            shared,
            header_timeout: config.header_timeout,
            serving_threads: config.serving_threads.min(MAX_SERVING_THREADS),
        })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn stats(&self) -> Arc<ProxyStats> {
        Arc::clone(&self.shared.stats)
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets the exchanges under way
    /// finish, and returns once every one of them has reached the recorder.
    ///
    /// With more than one serving thread, this task only accepts: each connection is handed, in
    /// turn, to a thread that runs a current-thread runtime of its own and serves it there, the
    /// upstream connection included, until it closes (what nginx's worker processes do). A
    /// work-stealing runtime moves an exchange's halves between its workers, and each move wakes
    /// the other worker (a futex and an epoll wake-up, measured in BENCHMARKS.md).
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Proxy {
            listener,
            shared,
            header_timeout,
            serving_threads,
        } = self;
        let (stop_tx, stop_rx) = watch::channel(false);
        let serve = Serve {
            shared: Arc::clone(&shared),
            header_timeout,
            stop: stop_rx,
        };
        let mut shards = Vec::new();
        if serving_threads > 1 {
            for index in 0..serving_threads {
                match Shard::start(index, serve.clone()) {
                    Ok(shard) => shards.push(shard),
                    // No thread (out of memory or threads): the ones started, or this runtime,
                    // serve instead; said like a failed accept.
                    Err(e) => shared.stats.note_accept_error(&e),
                }
            }
        }
        let mut connections = JoinSet::new();
        let mut next_conn = 1u64;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        shared.stats.connections.fetch_add(1, Ordering::Relaxed);
                        let id = next_conn;
                        next_conn += 1;
                        let here = match shards.get((id % shards.len().max(1) as u64) as usize) {
                            Some(shard) => shard.take(stream, id, &shared.stats),
                            None => Some(stream),
                        };
                        if let Some(stream) = here {
                            connections.spawn(serve.clone().connection(stream, id));
                        }
                    }
                    // Out of file descriptors and the like: counted, then back off instead of
                    // spinning.
                    Err(e) => {
                        shared.stats.note_accept_error(&e);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                },
            }
        }
        drop(listener);
        let _ = stop_tx.send(true);
        for shard in shards {
            drop(shard.streams);
            let _ = shard.done.await;
        }
        while connections.join_next().await.is_some() {}
        shared.stats.wait_idle().await;
    }
}

/// At most this many serving threads, whatever the machine says it has: a proxy in front of one
/// server needs no more, and with [`BLOCKING_THREADS_PER_SERVING_THREAD`] the threads that can
/// wait for a recorder that is behind stay at tokio's default of 512 for one runtime.
pub const MAX_SERVING_THREADS: usize = 16;
/// Each serving thread's blocking pool: a capture waits there for a recorder that is behind
/// (one thread per waiting capture; more wait in the pool's queue).
const BLOCKING_THREADS_PER_SERVING_THREAD: usize = 32;

/// What serving a connection needs, wherever it runs.
#[derive(Clone)]
struct Serve {
    shared: Arc<Shared>,
    header_timeout: Duration,
    stop: watch::Receiver<bool>,
}

impl Serve {
    fn connection(self, stream: tokio::net::TcpStream, id: u64) -> impl Future<Output = ()> {
        let connection = Arc::new(forward::Connection::new(id, Arc::clone(&self.shared)));
        let stats = Arc::clone(&self.shared.stats);
        serve_connection(stream, connection, stats, self.header_timeout, self.stop)
    }
}

/// A serving thread: the connections handed to it, and when it has finished.
struct Shard {
    streams: mpsc::UnboundedSender<(std::net::TcpStream, u64)>,
    done: oneshot::Receiver<()>,
}

impl Shard {
    fn start(index: usize, serve: Serve) -> io::Result<Shard> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(BLOCKING_THREADS_PER_SERVING_THREAD)
            .thread_name(format!("prefixscope-serve-{index}-blocking"))
            .build()?;
        // Unbounded: each entry is an accepted connection, bounded by the descriptor limit.
        let (streams, mut incoming) = mpsc::unbounded_channel::<(std::net::TcpStream, u64)>();
        let (done_tx, done) = oneshot::channel();
        std::thread::Builder::new()
            .name(format!("prefixscope-serve-{index}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let mut connections = JoinSet::new();
                    loop {
                        tokio::select! {
                            Some(_) = connections.join_next(), if !connections.is_empty() => {}
                            received = incoming.recv() => match received {
                                Some((stream, id)) => match tokio::net::TcpStream::from_std(stream) {
                                    Ok(stream) => {
                                        connections.spawn(serve.clone().connection(stream, id));
                                    }
                                    Err(e) => serve.shared.stats.note_accept_error(&e),
                                },
                                None => break,
                            },
                        }
                    }
                    while connections.join_next().await.is_some() {}
                });
                // Dropping the runtime waits for its blocking pool: the captures it hands to a
                // recorder that was behind.
                drop(runtime);
                let _ = done_tx.send(());
            })?;
        Ok(Shard { streams, done })
    }

    /// Hands the connection to the thread; gives it back to be served here if the thread is
    /// gone. A connection that cannot move between runtimes is counted as not accepted.
    fn take(
        &self,
        stream: tokio::net::TcpStream,
        id: u64,
        stats: &ProxyStats,
    ) -> Option<tokio::net::TcpStream> {
        let moved = stream
            .into_std()
            .and_then(|stream| match self.streams.send((stream, id)) {
                Ok(()) => Ok(None),
                Err(returned) => tokio::net::TcpStream::from_std(returned.0.0).map(Some),
            });
        moved.unwrap_or_else(|e| {
            stats.note_accept_error(&e);
            None
        })
    }
}

async fn serve_connection<S>(
    stream: S,
    connection: Arc<forward::Connection>,
    stats: Arc<ProxyStats>,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| {
        let connection = Arc::clone(&connection);
        async move { Ok::<_, std::convert::Infallible>(forward::forward(connection, request).await) }
    });
    // hyper runs the header timeout whenever it waits for a request head: on a new connection
    // and between the requests of a kept-alive one, so it is the idle timeout too.
    // Header names go on in the case they came in (the case map rides in the request's and
    // response's extensions); no `date` is added to what the upstream said.
    let conn = server_http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(true)
        .preserve_header_case(true)
        .auto_date_header(false)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let finished = tokio::select! {
        result = conn.as_mut() => Some(result),
        _ = stop.wait_for(|stopped| *stopped) => None,
    };
    let result = match finished {
        Some(result) => result,
        None => {
            // Finish the exchange under way, then close; idle connections close at once.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        count_connection_error(&stats, &e);
    }
}

/// What a connection's end says about its client: a request hyper refused before it was an
/// exchange (answered 400, 431 or 414 by hyper itself, never forwarded, so no record), or a
/// client that sent no complete head within the header timeout.
fn count_connection_error(stats: &ProxyStats, error: &hyper::Error) {
    if error.is_timeout() {
        stats.header_timeouts.fetch_add(1, Ordering::Relaxed);
    } else if error.is_parse() || error.is_parse_too_large() {
        stats.rejected.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut last) = stats.last_rejection.lock() {
            *last = Some(error.to_string());
        }
    }
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The descriptor limit (`RLIMIT_NOFILE`) before and after [`raise_descriptor_limit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorLimit {
    pub before: u64,
    pub now: u64,
}

/// Raises the soft descriptor limit to the hard one: each client holds two descriptors (its own
/// connection and the upstream's), and at the common soft limit of 1,024 about 500 clients
/// exhausted it (new clients were not accepted, and connects to the upstream failed as if the
/// upstream were down). `None` if the limit cannot be read.
pub fn raise_descriptor_limit() -> Option<DescriptorLimit> {
    #[cfg(unix)]
    {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit and setrlimit only read and write the struct passed by pointer.
        if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
            return None;
        }
        let before: u64 = limit.rlim_cur;
        if limit.rlim_cur >= limit.rlim_max {
            return Some(DescriptorLimit {
                before,
                now: before,
            });
        }
        // An unlimited hard limit cannot be the soft one (the kernel's nr_open caps it): try it,
        // then 2^20, the usual nr_open.
        for target in [limit.rlim_max, (1 << 20).min(limit.rlim_max)] {
            let raised = libc::rlimit {
                rlim_cur: target,
                rlim_max: limit.rlim_max,
            };
            // SAFETY: as above.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
                return Some(DescriptorLimit {
                    before,
                    now: target,
                });
            }
        }
        Some(DescriptorLimit {
            before,
            now: before,
        })
    }
    #[cfg(not(unix))]
    None
}
