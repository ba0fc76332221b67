//! Test harness: a scripted fake upstream, a plain HTTP/1.1 client, and the proxy with its
//! recorder, all in-process on 127.0.0.1.
#![allow(dead_code)]

pub mod bound;
pub mod llama;
pub mod server_model;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};

use prefixscope_capture::proxy::{Proxy, ProxyConfig, ProxyStats, Upstream};
use prefixscope_capture::recorder::{Recorder, RecorderConfig};
use prefixscope_core::capture::BodyMode;
use prefixscope_core::record::{Record, read_jsonl};

pub type TestBody = BoxBody<Bytes, Infallible>;
pub type Handler = Arc<
    dyn Fn(Request<Incoming>) -> Pin<Box<dyn Future<Output = Response<TestBody>> + Send>>
        + Send
        + Sync,
>;

pub fn full(bytes: impl Into<Bytes>) -> TestBody {
    Full::new(bytes.into()).boxed()
}

/// A body whose frames the test sends one by one.
pub struct ChannelBody {
    rx: mpsc::UnboundedReceiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b))))
    }
}

pub fn channel_body() -> (mpsc::UnboundedSender<Bytes>, TestBody) {
    let (tx, rx) = mpsc::unbounded_channel();
    (tx, ChannelBody { rx }.boxed())
}

/// Serves every connection with `handler` until the test ends.
pub async fn fake_upstream(handler: Handler) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let handler = Arc::clone(&handler);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let handler = Arc::clone(&handler);
                    async move { Ok::<_, Infallible>(handler(req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

pub fn handler<F, Fut>(f: F) -> Handler
where
    F: Fn(Request<Incoming>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Response<TestBody>> + Send + 'static,
{
    Arc::new(move |req| Box::pin(f(req)))
}

pub async fn client(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    prefixscope_capture::http1::connect(addr).await.unwrap()
}

pub fn post(path: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("host", "proxy.test")
        .header("content-type", "application/json")
        .header("user-agent", "prefixscope-test/1")
        .body(Full::new(body.into()))
        .unwrap()
}

pub struct Options {
    pub mode: BodyMode,
    pub max_body: usize,
    pub connect_timeout: Duration,
    pub queue: Option<usize>,
    pub prefix: String,
    pub https_ca: Option<Vec<u8>>,
    pub host: String,
    pub header_timeout: Duration,
    /// Where each request goes as it starts (`ProxyConfig::request_starts`).
    pub request_starts:
        Option<crossbeam_channel::Sender<prefixscope_core::capture::Capture<Bytes>>>,
    /// `ProxyConfig::serving_threads`: 1 serves on the test's runtime.
    pub serving_threads: usize,
    /// `ProxyConfig::body_budget`.
    pub body_budget: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            mode: BodyMode::Full,
            max_body: prefixscope_capture::proxy::DEFAULT_MAX_BODY,
            connect_timeout: Duration::from_secs(10),
            queue: None,
            prefix: String::new(),
            https_ca: None,
            host: "127.0.0.1".into(),
            header_timeout: prefixscope_capture::proxy::DEFAULT_HEADER_TIMEOUT,
            request_starts: None,
            serving_threads: 1,
            body_budget: prefixscope_capture::proxy::DEFAULT_BODY_BUDGET,
        }
    }
}

pub struct Harness {
    pub addr: SocketAddr,
    pub file: PathBuf,
    pub records: crossbeam_channel::Receiver<Arc<Record>>,
    pub stats: Arc<ProxyStats>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    recorder: Option<Recorder<Bytes>>,
}

pub fn temp_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("prefixscope-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(name);
    let _ = std::fs::remove_file(&file);
    file
}

pub async fn start_proxy(upstream: SocketAddr, name: &str, options: Options) -> Harness {
    let file = temp_file(&format!("{name}.jsonl"));
    let (tx, records) = crossbeam_channel::unbounded();
    let config = RecorderConfig {
        path: Some(file.clone()),
        mode: options.mode,
        max_size: None,
        queue: options.queue,
    };
    let recorder = Recorder::start(config, vec![tx]).unwrap();
    let scheme = if options.https_ca.is_some() {
        "https"
    } else {
        "http"
    };
    let url = format!(
        "{scheme}://{}:{}{}",
        options.host,
        upstream.port(),
        options.prefix
    );
    let mut config = ProxyConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        Upstream::parse(&url).unwrap(),
    );
    config.max_body = options.max_body;
    config.connect_timeout = options.connect_timeout;
    config.extra_ca_pem = options.https_ca;
    config.header_timeout = options.header_timeout;
    config.request_starts = options.request_starts;
    config.serving_threads = options.serving_threads;
    config.body_budget = options.body_budget;
    let proxy = Proxy::bind(config, recorder.sender()).await.unwrap();
    let addr = proxy.local_addr().unwrap();
    let stats = proxy.stats();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(proxy.run(async move {
        let _ = stop_rx.await;
    }));
    Harness {
        addr,
        file,
        records,
        stats,
        stop: Some(stop_tx),
        task: Some(task),
        recorder: Some(recorder),
    }
}

impl Harness {
    /// Stops the proxy as Ctrl-C does, waits for the recorder, and reads the file back.
    pub async fn stop(mut self) -> Vec<Record> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            tokio::time::timeout(Duration::from_secs(30), task)
                .await
                .expect("proxy stops")
                .unwrap();
        }
        if let Some(recorder) = self.recorder.take() {
            tokio::task::spawn_blocking(move || recorder.finish())
                .await
                .unwrap();
        }
        let bytes = std::fs::read(&self.file).unwrap();
        let read = read_jsonl(bytes.as_slice());
        assert!(read.bad_lines.is_empty(), "{:?}", read.bad_lines);
        read.records
    }

    /// The next record handed to consumers, within a few seconds.
    pub async fn next_record(&self) -> Arc<Record> {
        let rx = self.records.clone();
        tokio::task::spawn_blocking(move || {
            rx.recv_timeout(Duration::from_secs(10))
                .expect("a record arrives")
        })
        .await
        .unwrap()
    }
}

/// xorshift64*: reproducible randomness without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
    pub fn token(&mut self, len: usize) -> String {
        (0..len)
            .map(|_| (b'a' + self.below(26) as u8) as char)
            .collect()
    }
    pub fn header_value(&mut self, len: usize) -> String {
        let mut v: String = (0..len)
            .map(|_| (0x21 + self.below(0x7e - 0x21) as u8) as char)
            .collect();
        if len > 4 {
            v.insert(len / 2, ' ');
        }
        v
    }
}

/// Where `start_proxy(…, name, …)` writes: `temp_file_path("NAME.jsonl")`.
pub fn temp_file_path(name: &str) -> PathBuf {
    std::env::temp_dir()
        .join(format!("prefixscope-test-{}", std::process::id()))
        .join(name)
}

/// Sends on a kept-alive connection once it is ready for the next request.
pub async fn send(
    client: &mut SendRequest<Full<Bytes>>,
    request: Request<Full<Bytes>>,
) -> Response<Incoming> {
    client.ready().await.expect("the connection stays open");
    client.send_request(request).await.expect("a response")
}

/// What a record's token counts add up to, by message and by tool, with the server's prompt
/// count beside them (a laid-out record's two sums equal the third).
pub fn token_sums(record: &Record) -> (u32, u32, Option<u32>) {
    let exchange = prefixscope_core::normalize::normalize(record).unwrap();
    let sum = |counts: Vec<Option<u32>>| counts.into_iter().map(|n| n.unwrap()).sum::<u32>();
    (
        sum(exchange
            .messages
            .iter()
            .map(|m| m.tokens.map(|t| t.value))
            .collect()),
        sum(exchange
            .tools
            .iter()
            .map(|t| t.tokens.map(|t| t.value))
            .collect()),
        exchange.counts.prompt_tokens.map(|p| p.value),
    )
}

/// Reads one message with a `content-length` body (or none) from `stream` into `buf`: its head
/// as text and where its body ends in `buf`. `None` at the end of the stream.
pub async fn read_message(
    stream: &mut tokio::net::TcpStream,
    buf: &mut Vec<u8>,
) -> Option<(String, usize)> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (name, value) = l.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return Some((head, end + 4 + length));
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Sends one `POST /v1/chat/completions` of `body` on a connection of its own (closed after)
/// and returns the answer's status line.
pub async fn post_raw(addr: SocketAddr, body: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut got = Vec::new();
    let _ = stream.read_to_end(&mut got).await;
    String::from_utf8_lossy(&got)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}
