//! The recording proxy (tokio + hyper 1.x, HTTP/1.1): forwards every byte unchanged and hands one
//! capture per exchange to the recorder.
//!
//! One task per client connection, and one upstream connection per client connection, opened on
//! its first request. The request body is read whole, then forwarded; the response streams back
//! frame by frame as it arrives, with a copy kept up to `max_body`.

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
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;

use crate::recorder::CaptureSender;
pub use upstream::Upstream;

/// Default listen port: next to neither llama-server (8080) nor Ollama (11434).
pub const DEFAULT_PORT: u16 = 8787;
pub const DEFAULT_MAX_BODY: usize = 64 * 1024 * 1024;
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub listen: SocketAddr,
    pub upstream: Upstream,
    /// Bodies larger than this are forwarded whole but not kept.
    pub max_body: usize,
    pub connect_timeout: Duration,
    /// PEM CA certificates trusted for `https://` upstreams, beside the Mozilla roots.
    pub extra_ca_pem: Option<Vec<u8>>,
}

impl ProxyConfig {
    pub fn new(listen: SocketAddr, upstream: Upstream) -> ProxyConfig {
        ProxyConfig {
            listen,
            upstream,
            max_body: DEFAULT_MAX_BODY,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            extra_ca_pem: None,
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
    idle: Notify,
}

impl ProxyStats {
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
    pub host_header: hyper::header::HeaderValue,
    pub tls: Option<tokio_rustls::TlsConnector>,
    pub max_body: usize,
    pub connect_timeout: Duration,
    pub captures: CaptureSender<Bytes>,
    pub next_id: AtomicU64,
    pub stats: Arc<ProxyStats>,
}

/// A bound proxy, not yet serving: bind first so callers (and tests) know the address.
pub struct Proxy {
    listener: TcpListener,
    shared: Arc<Shared>,
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
            host_header,
            tls,
            max_body: config.max_body,
            connect_timeout: config.connect_timeout,
            captures,
            next_id: AtomicU64::new(1),
            stats: Arc::new(ProxyStats::default()),
        });
        Ok(Proxy { listener, shared })
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn stats(&self) -> Arc<ProxyStats> {
        Arc::clone(&self.shared.stats)
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets the exchanges under way
    /// finish, and returns once every one of them has reached the recorder.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let Proxy { listener, shared } = self;
        let (stop_tx, stop_rx) = watch::channel(false);
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
                        let connection = Arc::new(forward::Connection::new(next_conn, Arc::clone(&shared)));
                        next_conn += 1;
                        connections.spawn(serve_connection(stream, connection, stop_rx.clone()));
                    }
                    // Out of file descriptors and the like: back off instead of spinning.
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                },
            }
        }
        drop(listener);
        let _ = stop_tx.send(true);
        while connections.join_next().await.is_some() {}
        shared.stats.wait_idle().await;
    }
}

async fn serve_connection(
    stream: tokio::net::TcpStream,
    connection: Arc<forward::Connection>,
    mut stop: watch::Receiver<bool>,
) {
    let service = service_fn(move |request| {
        let connection = Arc::clone(&connection);
        async move { Ok::<_, std::convert::Infallible>(forward::forward(connection, request).await) }
    });
    let conn = server_http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => return,
        _ = stop.wait_for(|stopped| *stopped) => {}
    }
    // Finish the exchange under way, then close; idle connections close at once.
    conn.as_mut().graceful_shutdown();
    let _ = conn.await;
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
