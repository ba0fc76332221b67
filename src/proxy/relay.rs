//! The proxy's own HTTP/1.1 forwarding loop, for plain-HTTP upstreams: request and response
//! heads are parsed with httparse and rewritten (hop-by-hop headers out, our `Host`, the
//! upstream's path prefix), bodies are relayed as they arrive with their framing unchanged,
//! and a copy is kept for the record. hyper decodes each message into its own types and
//! encodes it again, on both sides: this loop forwards at about the cost nginx's does
//! (BENCHMARKS.md, "Our own forwarding loop").
//!
//! It takes the requests agents send: HTTP/1.1, a body of known length within `--max-body`, no
//! `Expect`, no upgrade. Any other request (a chunked or larger body, HTTP/1.0, a head it cannot
//! read or that hyper would refuse) goes to hyper, with the bytes already read, for the rest of
//! the connection: it is served, answered or refused there as before.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::forward::{self, Connection, InFlight};
use super::headers::{is_hop_by_hop_name, recorded_header_pairs};
use super::{ProxyStats, upstream};
use crate::capture::{ResponseCapture, stream_kind_of};
use crate::record::{ExchangeError, StreamKind};

/// At most this many headers in a message (hyper's default).
const MAX_HEADERS: usize = 100;
/// A request head not complete within this many bytes goes to hyper, which refuses it (431)
/// at its own limit or serves it.
const MAX_REQUEST_HEAD: usize = 64 * 1024;
/// A response head longer than this is not an answer (hyper's client reads at most about
/// 400 KiB for one).
const MAX_RESPONSE_HEAD: usize = 400 * 1024;
/// The trailer section of a chunked body, at most.
const MAX_TRAILERS: usize = 64 * 1024;
/// A chunk-size line, at most (the size, its extensions and the line's end).
const MAX_CHUNK_LINE: usize = 4 * 1024;
/// How much is read from a socket at a time, and so the most one write to the other carries.
const READ_SIZE: usize = 16 * 1024;

/// Serves one client connection until it closes (or is handed to hyper).
pub(super) async fn serve(
    client: TcpStream,
    connection: Arc<Connection>,
    stats: Arc<ProxyStats>,
    header_timeout: Duration,
    stop: watch::Receiver<bool>,
) {
    let mut relay = Relay {
        client,
        client_buf: BytesMut::with_capacity(READ_SIZE),
        client_done_sending: false,
        upstream: None,
        upstream_buf: BytesMut::new(),
        connection,
        stats,
        stop,
    };
    match relay.run(header_timeout).await {
        Ending::Closed => {}
        Ending::HandOff => {
            let Relay {
                client,
                client_buf,
                connection,
                stats,
                stop,
                ..
            } = relay;
            let client = Rewind {
                prefix: client_buf.freeze(),
                inner: client,
            };
            super::serve_connection(client, connection, stats, header_timeout, stop).await;
        }
    }
}

enum Ending {
    Closed,
    /// The request in the client's buffer is for hyper.
    HandOff,
}

struct Relay {
    client: TcpStream,
    /// What the client sent that is not yet handled (the next head, pipelined requests).
    client_buf: BytesMut,
    /// The client has shut its side while a request of its was still in `client_buf`: it waits
    /// for its answers (as hyper's server answers them), and is no longer watched.
    client_done_sending: bool,
    upstream: Option<TcpStream>,
    upstream_buf: BytesMut,
    connection: Arc<Connection>,
    stats: Arc<ProxyStats>,
    stop: watch::Receiver<bool>,
}

/// What became of an exchange, for the connection.
enum After {
    /// The connection takes the next request.
    KeepAlive,
    Close,
}

impl Relay {
    async fn run(&mut self, header_timeout: Duration) -> Ending {
        loop {
            let head = match self.read_request_head(header_timeout).await {
                HeadRead::Head(head, length) => {
                    self.client_buf.advance(length);
                    head
                }
                HeadRead::HandOff => return Ending::HandOff,
                HeadRead::Closed => return Ending::Closed,
            };
            match self.exchange(head).await {
                After::KeepAlive if !*self.stop.borrow() => {}
                _ => return Ending::Closed,
            }
        }
    }

    /// Waits (within the header timeout, unless the proxy stops) for a request head.
    async fn read_request_head(&mut self, header_timeout: Duration) -> HeadRead {
        let shared = Arc::clone(self.connection.shared());
        let deadline = tokio::time::Instant::now() + header_timeout;
        let mut scanned = 0;
        let mut first_line_read = false;
        loop {
            let buf = &self.client_buf[..];
            if buf.len() > scanned {
                // Also parsed once its first line is in, so a request line hyper refuses is
                // handed to it (and answered) without waiting for the rest.
                let first_line =
                    !first_line_read && memchr::memchr(b'\n', &buf[scanned..]).is_some();
                first_line_read |= first_line;
                if first_line || may_end_head(buf, scanned) || buf.len() > MAX_REQUEST_HEAD {
                    match parse_request(
                        buf,
                        &shared.upstream.prefix,
                        shared.host_header.as_bytes(),
                        shared.max_body,
                    ) {
                        ParsedRequest::Complete(head, length) => {
                            return HeadRead::Head(head, length);
                        }
                        ParsedRequest::HandOff => return HeadRead::HandOff,
                        ParsedRequest::Partial => {}
                    }
                }
                scanned = buf.len();
            }
            self.client_buf.reserve(READ_SIZE);
            tokio::select! {
                read = self.client.read_buf(&mut self.client_buf) => match read {
                    Ok(0) | Err(_) => return HeadRead::Closed,
                    Ok(_) => {}
                },
                () = tokio::time::sleep_until(deadline) => {
                    self.stats
                        .header_timeouts
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return HeadRead::Closed;
                }
                _ = self.stop.wait_for(|stopped| *stopped) => return HeadRead::Closed,
            }
        }
    }

    async fn exchange(&mut self, head: RequestHead) -> After {
        let shared = Arc::clone(self.connection.shared());
        let mut flight = InFlight::begin(&self.connection, head.method, head.path, head.recorded);
        self.connection.wait_for_previous_delivery().await;

        // The body, whole (its length is known and within `--max-body`). One past what is
        // buffered is read into its own buffer, so the connection's does not keep its size.
        let body = if self.client_buf.len() >= head.content_length {
            self.client_buf.split_to(head.content_length).freeze()
        } else {
            // Grown as bytes come (a length alone reserves little).
            let mut body = BytesMut::with_capacity(head.content_length.min(READ_SIZE * 4));
            body.extend_from_slice(&self.client_buf);
            self.client_buf.clear();
            while body.len() < head.content_length {
                let missing = head.content_length - body.len();
                body.reserve(missing.min(1 << 20));
                match (&mut self.client)
                    .take(missing as u64)
                    .read_buf(&mut body)
                    .await
                {
                    Ok(0) | Err(_) => {
                        flight.finish(Some(ExchangeError::ClientDisconnected));
                        return After::Close;
                    }
                    Ok(_) => {}
                }
            }
            body.freeze()
        };
        if let Some(capture) = flight.capture_mut() {
            capture.request_body_bytes = body.len() as u64;
            capture.request_body = Some(body.clone());
            forward::announce_start(&shared, capture);
        }

        if let Err(error) = self.send_upstream(&head.upstream_head, &body).await {
            return self
                .answer_failure(flight, error, head.close, head.is_head)
                .await;
        }
        let response = match self.read_response_head(head.is_head, head.close).await {
            Ok(response) => response,
            Err(HeadFailure::Upstream) => {
                self.upstream = None;
                return self
                    .answer_failure(
                        flight,
                        ExchangeError::UpstreamReset,
                        head.close,
                        head.is_head,
                    )
                    .await;
            }
            Err(HeadFailure::ClientGone) => {
                // Nobody to answer: the upstream's work for it is abandoned with its connection.
                self.upstream = None;
                flight.finish(Some(ExchangeError::ClientDisconnected));
                return After::Close;
            }
        };
        shared.stats.last_upstream_ok_ms.store(
            super::now_ms().max(0) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        if let Some(capture) = flight.capture_mut() {
            capture.response = Some(ResponseCapture {
                status: response.status,
                headers: response.recorded,
                stream: response.stream,
                ..ResponseCapture::default()
            });
        }
        let close = head.close || response.close_client || *self.stop.borrow();
        let mut out = response.client_head;
        if close && !response.close_client {
            // The head ends with the blank line: the client is told before it.
            out.truncate(out.len() - 2);
            out.extend_from_slice(b"connection: close\r\n\r\n");
        }
        let outcome = self
            .relay_body(response.framing, &mut out, &mut flight, shared.max_body)
            .await;
        match outcome {
            BodyEnd::Done { upstream_reusable } => {
                flight.finish(None);
                if !upstream_reusable || response.close_upstream {
                    self.upstream = None;
                }
                if close {
                    After::Close
                } else {
                    After::KeepAlive
                }
            }
            BodyEnd::Failed(error) => {
                self.upstream = None;
                flight.finish(Some(error));
                After::Close
            }
        }
    }

    /// Writes the request to the upstream connection, opening one if there is none or the one
    /// kept is found closed (an idle connection the server closed between exchanges): a request
    /// goes out once, never again on another connection.
    async fn send_upstream(&mut self, head: &[u8], body: &[u8]) -> Result<(), ExchangeError> {
        let shared = Arc::clone(self.connection.shared());
        if let Some(stream) = &self.upstream
            && !is_open_and_quiet(stream)
        {
            self.upstream = None;
        }
        let stream = match &mut self.upstream {
            Some(stream) => stream,
            None => match upstream::connect_tcp(&shared.upstream, shared.connect_timeout).await {
                Ok(stream) => {
                    self.upstream_buf.clear();
                    self.upstream.insert(stream)
                }
                Err(failure) => {
                    shared.stats.set_upstream_error(&failure.reason);
                    return Err(failure.kind);
                }
            },
        };
        let written = if head.len() + body.len() <= READ_SIZE {
            let mut message = Vec::with_capacity(head.len() + body.len());
            message.extend_from_slice(head);
            message.extend_from_slice(body);
            stream.write_all(&message).await
        } else {
            match stream.write_all(head).await {
                Ok(()) => stream.write_all(body).await,
                Err(e) => Err(e),
            }
        };
        if written.is_err() {
            self.upstream = None;
            return Err(ExchangeError::UpstreamReset);
        }
        Ok(())
    }

    /// Reads the upstream's answer head (informational ones skipped), watching the client: one
    /// that leaves while the upstream works (a long prefill) is seen at once, as hyper saw it.
    async fn read_response_head(
        &mut self,
        request_is_head: bool,
        client_close: bool,
    ) -> Result<ResponseHead, HeadFailure> {
        let Some(stream) = self.upstream.as_mut() else {
            return Err(HeadFailure::Upstream);
        };
        let mut scanned = 0;
        loop {
            let buf = &self.upstream_buf[..];
            if buf.len() > scanned {
                if may_end_head(buf, scanned) || buf.len() > MAX_RESPONSE_HEAD {
                    match parse_response(buf, request_is_head, client_close) {
                        ParsedResponse::Complete(head, length) => {
                            self.upstream_buf.advance(length);
                            return Ok(head);
                        }
                        ParsedResponse::Informational(length) => {
                            self.upstream_buf.advance(length);
                            scanned = 0;
                            continue;
                        }
                        ParsedResponse::Invalid => return Err(HeadFailure::Upstream),
                        ParsedResponse::Partial => {}
                    }
                }
                scanned = self.upstream_buf.len();
            }
            self.upstream_buf.reserve(READ_SIZE);
            let watch_client = watch_client(&mut self.client_buf, self.client_done_sending);
            tokio::select! {
                read = stream.read_buf(&mut self.upstream_buf) => match read {
                    Ok(0) | Err(_) => return Err(HeadFailure::Upstream),
                    Ok(_) => {}
                },
                read = self.client.read_buf(&mut self.client_buf), if watch_client => {
                    if client_gone(read, &self.client_buf, &mut self.client_done_sending) {
                        return Err(HeadFailure::ClientGone);
                    }
                }
            }
        }
    }

    /// Sends the response head (in `out`) and relays the body as it arrives, recording it. A
    /// client that goes away is seen while the upstream is waited for, not only at the next
    /// write.
    async fn relay_body(
        &mut self,
        framing: Framing,
        out: &mut Vec<u8>,
        flight: &mut InFlight,
        max_body: usize,
    ) -> BodyEnd {
        let mut body = BodyState::new(framing);
        loop {
            let parsed = body.take(&mut self.upstream_buf, out, |data| {
                flight.record_data(data, max_body);
            });
            if !out.is_empty() {
                if self.client.write_all(out).await.is_err() {
                    return BodyEnd::Failed(ExchangeError::ClientDisconnected);
                }
                out.clear();
            }
            if parsed.is_err() {
                return BodyEnd::Failed(ExchangeError::UpstreamReset);
            }
            if body.is_done() {
                // Bytes past the answer's end were never asked for: that connection is done.
                return BodyEnd::Done {
                    upstream_reusable: self.upstream_buf.is_empty()
                        && framing != Framing::UntilClose,
                };
            }
            let Some(stream) = self.upstream.as_mut() else {
                return BodyEnd::Failed(ExchangeError::UpstreamReset);
            };
            self.upstream_buf.reserve(READ_SIZE);
            let watch_client = watch_client(&mut self.client_buf, self.client_done_sending);
            tokio::select! {
                read = stream.read_buf(&mut self.upstream_buf) => match read {
                    Ok(0) if body.until_close() => {
                        body.close();
                    }
                    Ok(0) | Err(_) => return BodyEnd::Failed(ExchangeError::UpstreamReset),
                    Ok(_) => {}
                },
                // A pipelined request waits in the buffer; an end means the client has gone.
                read = self.client.read_buf(&mut self.client_buf), if watch_client => {
                    if client_gone(read, &self.client_buf, &mut self.client_done_sending) {
                        return BodyEnd::Failed(ExchangeError::ClientDisconnected);
                    }
                }
            }
        }
    }

    /// The proxy's own 502 for an exchange that got no answer, on a connection that stays
    /// open (as hyper's path answers).
    async fn answer_failure(
        &mut self,
        mut flight: InFlight,
        error: ExchangeError,
        close: bool,
        request_is_head: bool,
    ) -> After {
        let message = forward::note_upstream_failure(self.connection.shared(), error);
        flight.finish(Some(error));
        let close = close || *self.stop.borrow();
        let body = forward::error_body(&message);
        let connection = if close { "connection: close\r\n" } else { "" };
        // A HEAD's answer says the length it would have and has no body.
        let sent = if request_is_head { "" } else { body.as_str() };
        let answer = format!(
            "HTTP/1.1 502 Bad Gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{connection}\r\n{sent}",
            body.len()
        );
        if self.client.write_all(answer.as_bytes()).await.is_err() || close {
            return After::Close;
        }
        After::KeepAlive
    }
}

/// Whether the client is read while the upstream is waited for (to see it leave, and to take
/// pipelined requests), making room for that read.
fn watch_client(client_buf: &mut BytesMut, client_done_sending: bool) -> bool {
    let watch = !client_done_sending && client_buf.len() < MAX_REQUEST_HEAD;
    if watch {
        client_buf.reserve(1024);
    }
    watch
}

/// Whether a read from the client while its answer is awaited says it has gone: an error, or an
/// end with nothing of its in the buffer. An end after a pipelined request only says it sends
/// no more (hyper's server answers what it has, too).
fn client_gone(
    read: std::io::Result<usize>,
    client_buf: &BytesMut,
    client_done_sending: &mut bool,
) -> bool {
    match read {
        Ok(0) if !client_buf.is_empty() => {
            *client_done_sending = true;
            false
        }
        Ok(0) | Err(_) => true,
        Ok(_) => false,
    }
}

/// Whether an idle upstream connection is still open with nothing unasked-for to read: a
/// server that closed it (or wrote to it between exchanges) makes the next request go out on
/// a new one.
fn is_open_and_quiet(stream: &TcpStream) -> bool {
    let mut probe = [0u8; 1];
    matches!(stream.try_read(&mut probe), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

enum HeadRead {
    /// A head for this loop, and its length in the client's buffer.
    Head(RequestHead, usize),
    HandOff,
    Closed,
}

/// Why no answer head came.
enum HeadFailure {
    /// The upstream closed, failed, or sent something that is not an answer.
    Upstream,
    ClientGone,
}

enum BodyEnd {
    Done { upstream_reusable: bool },
    Failed(ExchangeError),
}

/// A request head this loop forwards.
#[derive(Debug)]
struct RequestHead {
    method: String,
    /// As the client sent it (recorded).
    path: String,
    /// What the upstream gets, to the blank line included.
    upstream_head: Vec<u8>,
    content_length: usize,
    recorded: BTreeMap<String, String>,
    /// The client asked to close after this exchange.
    close: bool,
    is_head: bool,
}

#[derive(Debug)]
enum ParsedRequest {
    Partial,
    /// Not for this loop: hyper serves it (or refuses it).
    HandOff,
    Complete(RequestHead, usize),
}

/// A request target hyper's server reads as it came: origin form (a path, perhaps a query) of
/// visible ASCII that `http`'s URI, which hyper reads it with, takes. Anything else (an
/// absolute URI, `*`, a fragment, `<` `>` or a backquote in the path, `"` `<` `>` in the query,
/// other bytes) is left to hyper, which answers or refuses it.
fn is_plain_target(target: &str) -> bool {
    target.starts_with('/')
        && target
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b'#')
        && hyper::http::uri::PathAndQuery::try_from(target).is_ok()
}

/// A length of digits only (what hyper's server takes as a request's).
fn parse_digits(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse().ok()
}

/// A response's `content-length` value: digits, or a list of equal ones (what hyper's client
/// accepts; anything else it refuses).
fn parse_length(value: &[u8]) -> Option<u64> {
    let mut length = None;
    for item in value.split(|&b| b == b',') {
        let n = parse_digits(item.trim_ascii())?;
        if length.is_some_and(|m| m != n) {
            return None;
        }
        length = Some(n);
    }
    length
}

/// Whether the bytes read since `scanned` (with the 3 before, where the end may have begun)
/// hold a blank line, the end of a head. A head is parsed again only then, so one sent a byte
/// at a time costs linear time, not quadratic (hyper's `is_complete_fast`).
fn may_end_head(buf: &[u8], scanned: usize) -> bool {
    let tail = &buf[scanned.saturating_sub(3).min(buf.len())..];
    memchr::memmem::find(tail, b"\n\n").is_some() || memchr::memmem::find(tail, b"\n\r\n").is_some()
}

/// The names a `connection` header lists (hop-by-hop for this message), and whether it says
/// `close`. A value that is not visible ASCII is passed over, as hyper passes over one its
/// `to_str` refuses.
fn connection_tokens<'a>(headers: &'a [httparse::Header<'a>]) -> (Vec<&'a str>, bool) {
    let mut listed = Vec::new();
    let mut close = false;
    for header in headers {
        if header.name.eq_ignore_ascii_case("connection")
            && let Some(value) = header_str(header.value)
        {
            for token in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
                close |= token.eq_ignore_ascii_case("close");
                listed.push(token);
            }
        }
    }
    (listed, close)
}

/// A header value as `http`'s `HeaderValue::to_str` reads it: visible ASCII and tabs only.
fn header_str(value: &[u8]) -> Option<&str> {
    if value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        std::str::from_utf8(value).ok()
    } else {
        None
    }
}

fn is_forwarded(name: &str, listed: &[&str]) -> bool {
    !is_hop_by_hop_name(name) && !listed.iter().any(|l| l.eq_ignore_ascii_case(name))
}

fn parse_request(buf: &[u8], prefix: &str, host: &[u8], max_body: usize) -> ParsedRequest {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let length = match request.parse(buf) {
        // A longer head (its target past what hyper's URI holds, 414) is hyper's to answer.
        Ok(httparse::Status::Complete(length)) if length <= MAX_REQUEST_HEAD => length,
        Ok(httparse::Status::Partial) if buf.len() <= MAX_REQUEST_HEAD => {
            return ParsedRequest::Partial;
        }
        _ => return ParsedRequest::HandOff,
    };
    let (Some(method), Some(path), Some(1)) = (request.method, request.path, request.version)
    else {
        return ParsedRequest::HandOff;
    };
    if method == "CONNECT" || !is_plain_target(path) {
        return ParsedRequest::HandOff;
    }
    let headers = &*request.headers;
    let mut content_length: Option<u64> = None;
    for header in headers {
        let name = header.name;
        if name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("expect")
            || name.eq_ignore_ascii_case("upgrade")
        {
            return ParsedRequest::HandOff;
        }
        if name.eq_ignore_ascii_case("content-length") {
            // One length of digits (hyper's server refuses a list, and drops a repeated header
            // from what it forwards and records: both are left to it).
            match parse_digits(header.value) {
                Some(n) if content_length.is_none() => content_length = Some(n),
                _ => return ParsedRequest::HandOff,
            }
        }
    }
    let content_length = content_length.unwrap_or(0);
    let (listed, close) = connection_tokens(headers);
    let Some(content_length) = usize::try_from(content_length)
        .ok()
        .filter(|&n| n <= max_body)
    else {
        // Past `--max-body`: hyper's path streams it to the upstream without keeping it.
        return ParsedRequest::HandOff;
    };

    let mut upstream_head = Vec::with_capacity(length + prefix.len() + host.len() + 16);
    upstream_head.extend_from_slice(method.as_bytes());
    upstream_head.push(b' ');
    upstream_head.extend_from_slice(prefix.as_bytes());
    upstream_head.extend_from_slice(path.as_bytes());
    upstream_head.extend_from_slice(b" HTTP/1.1\r\n");
    let mut host_written = false;
    for header in headers {
        if header.name.eq_ignore_ascii_case("host") {
            // The client addressed the proxy; the upstream expects its own name (once).
            if !host_written {
                push_header(&mut upstream_head, header.name.as_bytes(), host);
                host_written = true;
            }
        } else if header.name.eq_ignore_ascii_case("content-length")
            || is_forwarded(header.name, &listed)
        {
            // The length is how the upstream finds the body's end: a `connection` header that
            // lists it does not take it away (hyper's client set it again).
            push_header(&mut upstream_head, header.name.as_bytes(), header.value);
        }
    }
    if !host_written {
        push_header(&mut upstream_head, b"host", host);
    }
    upstream_head.extend_from_slice(b"\r\n");
    ParsedRequest::Complete(
        RequestHead {
            method: method.to_string(),
            path: path.to_string(),
            upstream_head,
            content_length,
            recorded: recorded_header_pairs(headers.iter().map(|h| (h.name, h.value))),
            close,
            is_head: method == "HEAD",
        },
        length,
    )
}

fn push_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    /// Until the upstream closes (no length, no chunked coding).
    UntilClose,
}

#[derive(Debug)]
struct ResponseHead {
    status: u16,
    /// What the client gets, to the blank line included.
    client_head: Vec<u8>,
    framing: Framing,
    recorded: BTreeMap<String, String>,
    stream: Option<StreamKind>,
    /// The upstream connection is not reused (it said `close`, or spoke HTTP/1.0).
    close_upstream: bool,
    /// The client's connection closes after this answer, and its head says so.
    close_client: bool,
}

#[derive(Debug)]
enum ParsedResponse {
    Partial,
    Invalid,
    /// A 1xx answer before the final one: skipped (as hyper's client does).
    Informational(usize),
    Complete(ResponseHead, usize),
}

fn parse_response(buf: &[u8], request_is_head: bool, client_close: bool) -> ParsedResponse {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let length = match response.parse(buf) {
        Ok(httparse::Status::Complete(length)) => length,
        Ok(httparse::Status::Partial) if buf.len() <= MAX_RESPONSE_HEAD => {
            return ParsedResponse::Partial;
        }
        _ => return ParsedResponse::Invalid,
    };
    let (Some(version), Some(status)) = (response.version, response.code) else {
        return ParsedResponse::Invalid;
    };
    if status == 101 || !(100..=999).contains(&status) {
        // No upgrade was asked for.
        return ParsedResponse::Invalid;
    }
    if status < 200 {
        return ParsedResponse::Informational(length);
    }
    let headers = &*response.headers;
    let (listed, upstream_says_close) = connection_tokens(headers);
    let mut chunked = None;
    let mut content_length: Option<u64> = None;
    let mut bad_length = false;
    for header in headers {
        if header.name.eq_ignore_ascii_case("transfer-encoding") {
            // The last coding of the last header says how the message ends (one hyper cannot
            // read is not chunked: the body ends with the connection).
            chunked = Some(header_str(header.value).is_some_and(|value| {
                let last = value.rsplit(',').next().unwrap_or("").trim();
                last.eq_ignore_ascii_case("chunked")
            }));
        } else if header.name.eq_ignore_ascii_case("content-length") {
            match parse_length(header.value) {
                Some(n) if content_length.is_none_or(|m| m == n) => content_length = Some(n),
                _ => bad_length = true,
            }
        }
    }
    // As hyper's client reads it: a coding on HTTP/1.0 is refused; beside a coding, the length
    // is not read at all.
    if (chunked.is_some() && version == 0) || (chunked.is_none() && bad_length) {
        return ParsedResponse::Invalid;
    }
    let framing = if request_is_head || status == 204 || status == 304 {
        Framing::Empty
    } else {
        match (chunked, content_length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::UntilClose,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::UntilClose,
        }
    };
    let close_client = client_close || framing == Framing::UntilClose;

    let reason = response.reason.unwrap_or("");
    let mut client_head = Vec::with_capacity(length + 32);
    client_head.extend_from_slice(b"HTTP/1.1 ");
    client_head.extend_from_slice(status.to_string().as_bytes());
    client_head.push(b' ');
    client_head.extend_from_slice(reason.as_bytes());
    client_head.extend_from_slice(b"\r\n");
    for header in headers {
        // The body's framing is relayed as it came, so its header stays; a length beside a
        // chunked coding does not (the coding wins).
        let keep = if header.name.eq_ignore_ascii_case("transfer-encoding") {
            true
        } else if header.name.eq_ignore_ascii_case("content-length") {
            chunked.is_none()
        } else {
            is_forwarded(header.name, &listed)
        };
        if keep {
            push_header(&mut client_head, header.name.as_bytes(), header.value);
        }
    }
    if close_client {
        client_head.extend_from_slice(b"connection: close\r\n");
    }
    client_head.extend_from_slice(b"\r\n");
    let content_type = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-type"))
        .and_then(|h| header_str(h.value))
        .unwrap_or_default();
    ParsedResponse::Complete(
        ResponseHead {
            status,
            client_head,
            framing,
            recorded: recorded_header_pairs(headers.iter().map(|h| (h.name, h.value))),
            stream: stream_kind_of(content_type),
            close_upstream: upstream_says_close || version == 0,
            close_client,
        },
        length,
    )
}

/// Where a response body stands as its bytes are relayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyState {
    /// This many bytes still to come.
    Length(u64),
    /// A chunked body, before a chunk-size line.
    ChunkSize,
    /// Inside a chunk: this many data bytes still to come.
    ChunkData(u64),
    /// After a chunk's data: its line end.
    ChunkEnd,
    /// After the last chunk: trailer fields, then a blank line (`scanned` bytes of them seen).
    Trailers {
        scanned: usize,
    },
    UntilClose,
    Done,
}

impl BodyState {
    fn new(framing: Framing) -> BodyState {
        match framing {
            Framing::Empty | Framing::Length(0) => BodyState::Done,
            Framing::Length(n) => BodyState::Length(n),
            Framing::Chunked => BodyState::ChunkSize,
            Framing::UntilClose => BodyState::UntilClose,
        }
    }

    fn is_done(&self) -> bool {
        *self == BodyState::Done
    }

    fn until_close(&self) -> bool {
        *self == BodyState::UntilClose
    }

    /// The upstream closed: the end of a body that lasts until then.
    fn close(&mut self) {
        if self.until_close() {
            *self = BodyState::Done;
        }
    }

    /// Moves what `buf` holds of the body to `out` as it came (framing included), handing its
    /// data to `data` as it goes; stops at the body's end (what follows stays in `buf`) or
    /// where more is needed. `Err` if the framing is broken.
    fn take(
        &mut self,
        buf: &mut BytesMut,
        out: &mut Vec<u8>,
        mut data: impl FnMut(&[u8]),
    ) -> Result<(), ()> {
        loop {
            match *self {
                BodyState::Done => return Ok(()),
                BodyState::Length(left) | BodyState::ChunkData(left) => {
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    if n == 0 {
                        return Ok(());
                    }
                    data(&buf[..n]);
                    out.extend_from_slice(&buf[..n]);
                    buf.advance(n);
                    let left = left - n as u64;
                    *self = match (*self, left) {
                        (BodyState::Length(_), 0) => BodyState::Done,
                        (BodyState::Length(_), _) => BodyState::Length(left),
                        (_, 0) => BodyState::ChunkEnd,
                        _ => BodyState::ChunkData(left),
                    };
                }
                BodyState::UntilClose => {
                    if buf.is_empty() {
                        return Ok(());
                    }
                    data(buf);
                    out.extend_from_slice(buf);
                    buf.clear();
                    return Ok(());
                }
                BodyState::ChunkSize => match httparse::parse_chunk_size(buf) {
                    // A size of at least one digit, on a line that ends with CRLF and nowhere
                    // before (httparse takes an empty size, and a bare LF in an extension,
                    // which hyper refused: a client must see the end the proxy sees).
                    _ if buf.first().is_some_and(|b| !b.is_ascii_hexdigit()) => return Err(()),
                    Ok(httparse::Status::Complete((line, _)))
                        if !buf[..line].ends_with(b"\r\n")
                            || memchr::memchr(b'\n', &buf[..line - 1]).is_some() =>
                    {
                        return Err(());
                    }
                    Ok(httparse::Status::Complete((line, size))) => {
                        out.extend_from_slice(&buf[..line]);
                        buf.advance(line);
                        *self = if size == 0 {
                            BodyState::Trailers { scanned: 0 }
                        } else {
                            BodyState::ChunkData(size)
                        };
                    }
                    Ok(httparse::Status::Partial) if buf.len() <= MAX_CHUNK_LINE => return Ok(()),
                    _ => return Err(()),
                },
                BodyState::ChunkEnd => {
                    if buf.len() < 2 {
                        return if buf.first().is_none_or(|&b| b == b'\r') {
                            Ok(())
                        } else {
                            Err(())
                        };
                    }
                    if &buf[..2] != b"\r\n" {
                        return Err(());
                    }
                    out.extend_from_slice(&buf[..2]);
                    buf.advance(2);
                    *self = BodyState::ChunkSize;
                }
                BodyState::Trailers { scanned } => {
                    // Trailer lines end with CRLF, the section with an empty one; the bytes
                    // already looked at are not looked at again.
                    if buf.is_empty() {
                        return Ok(());
                    }
                    if buf.starts_with(b"\r\n") {
                        out.extend_from_slice(&buf[..2]);
                        buf.advance(2);
                        *self = BodyState::Done;
                        continue;
                    }
                    let from = scanned.saturating_sub(3).min(buf.len());
                    let bare_lf = buf[from.max(1)..]
                        .iter()
                        .zip(&buf[from.max(1) - 1..])
                        .any(|(&b, &before)| b == b'\n' && before != b'\r');
                    if bare_lf || buf.first() == Some(&b'\n') {
                        return Err(());
                    }
                    match memchr::memmem::find(&buf[from..], b"\r\n\r\n") {
                        Some(at) => {
                            let end = from + at + 4;
                            out.extend_from_slice(&buf[..end]);
                            buf.advance(end);
                            *self = BodyState::Done;
                        }
                        None if buf.len() <= MAX_TRAILERS => {
                            *self = BodyState::Trailers { scanned: buf.len() };
                            return Ok(());
                        }
                        None => return Err(()),
                    }
                }
            }
        }
    }
}

/// The client's connection for hyper: what this loop read and did not use comes first.
struct Rewind {
    prefix: Bytes,
    inner: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &[u8] = b"127.0.0.1:8080";

    fn request(raw: &str) -> ParsedRequest {
        parse_request(raw.as_bytes(), "", HOST, 1 << 20)
    }

    fn complete(parsed: ParsedRequest) -> (RequestHead, usize) {
        match parsed {
            ParsedRequest::Complete(head, length) => (head, length),
            other => panic!("not complete: {other:?}"),
        }
    }

    #[test]
    fn a_request_head_goes_upstream_with_our_host_and_without_hop_by_hop_headers() {
        let raw = "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: localhost:8787\r\nUser-Agent: a/1\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nContent-Type: application/json\r\nX-Twice: first\r\nContent-Length: 2\r\nx-twice: second\r\nAuthorization: Bearer k\r\n\r\n{}";
        let (head, length) = complete(request(raw));
        assert_eq!(length, raw.len() - 2);
        assert_eq!(
            String::from_utf8(head.upstream_head).unwrap(),
            "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: a/1\r\nContent-Type: application/json\r\nX-Twice: first\r\nContent-Length: 2\r\nx-twice: second\r\nAuthorization: Bearer k\r\n\r\n"
        );
        assert_eq!(
            (head.method.as_str(), head.path.as_str()),
            ("POST", "/v1/chat/completions?x=1")
        );
        assert_eq!(
            (head.content_length, head.close, head.is_head),
            (2, false, false)
        );
        let recorded: Vec<(&str, &str)> = head
            .recorded
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            recorded,
            [
                ("content-length", "2"),
                ("content-type", "application/json"),
                ("user-agent", "a/1")
            ]
        );
    }

    #[test]
    fn the_prefix_is_added_a_missing_host_is_supplied_and_close_is_seen() {
        let raw = "GET /v1/models HTTP/1.1\r\nconnection: close\r\n\r\n";
        let (head, _) = complete(parse_request(raw.as_bytes(), "/base", HOST, 0));
        assert_eq!(
            String::from_utf8(head.upstream_head).unwrap(),
            "GET /base/v1/models HTTP/1.1\r\nhost: 127.0.0.1:8080\r\n\r\n"
        );
        assert_eq!(
            (head.path.as_str(), head.close, head.content_length),
            ("/v1/models", true, 0)
        );
        let (head, _) = complete(request("HEAD / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"));
        assert!(head.is_head);
        assert_eq!(
            String::from_utf8(head.upstream_head).unwrap(),
            "HEAD / HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"
        );
    }

    #[test]
    fn requests_this_loop_does_not_take_on_go_to_hyper() {
        for raw in [
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n",
            "GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            "GET / HTTP/1.0\r\n\r\n",
            "CONNECT host:443 HTTP/1.1\r\n\r\n",
            "GET http://host/x HTTP/1.1\r\n\r\n",
            "GET * HTTP/1.1\r\n\r\n",
            "GET /a#b HTTP/1.1\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: +2\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 1048577\r\n\r\n",
            "NOT HTTP AT ALL\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
            // What hyper's server refuses (400) or reads its own way, it answers itself.
            "GET /v1/models<x> HTTP/1.1\r\n\r\n",
            "GET /a`b HTTP/1.1\r\n\r\n",
            "GET /v1/models?q=\"a\" HTTP/1.1\r\n\r\n",
            "GET /?a>b HTTP/1.1\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 2, 2\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n",
        ] {
            assert!(
                matches!(request(raw), ParsedRequest::HandOff),
                "{raw:?}: {:?}",
                request(raw)
            );
        }
        // What hyper's URI takes unescaped stays here: JSON in a path, a backquote in a query.
        for raw in [
            "GET /a{\"b\"}|~!$&'()*+,;=:@ HTTP/1.1\r\n\r\n",
            "GET /a?b=`{}|~'?/ HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                matches!(request(raw), ParsedRequest::Complete(..)),
                "{raw:?}"
            );
        }
        // A `connection` value hyper cannot read is passed over, as hyper passes it over.
        let not_utf8 = b"GET / HTTP/1.1\r\nConnection: close, \xff\r\nX-A: 1\r\n\r\n";
        let (head, _) = complete(parse_request(not_utf8, "", HOST, 0));
        assert!(!head.close);
        assert!(head.upstream_head.windows(5).any(|w| w == b"X-A: "));
        // A head that completes past 64 KiB in one read (a target past hyper's URI limit) is
        // hyper's, which answers 414.
        let long = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000));
        assert!(matches!(request(&long), ParsedRequest::HandOff));
        // Too many headers, and a head that does not end.
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: 1\r\n")).collect();
        assert!(matches!(
            request(&format!("GET / HTTP/1.1\r\n{many}\r\n")),
            ParsedRequest::HandOff
        ));
        let endless = format!("GET / HTTP/1.1\r\nX-Slow: {}", "a".repeat(MAX_REQUEST_HEAD));
        assert!(matches!(request(&endless), ParsedRequest::HandOff));
        assert!(matches!(
            request("GET / HTTP/1.1\r\nX-Slow: aaa"),
            ParsedRequest::Partial
        ));
    }

    #[test]
    fn a_connection_header_that_lists_the_length_does_not_take_it_away() {
        let (head, _) = complete(request(
            "POST / HTTP/1.1\r\nConnection: content-length, host\r\nContent-Length: 2\r\nHost: a\r\n\r\n{}",
        ));
        assert_eq!(
            String::from_utf8(head.upstream_head).unwrap(),
            "POST / HTTP/1.1\r\nContent-Length: 2\r\nHost: 127.0.0.1:8080\r\n\r\n"
        );
        let (head, _) = response(
            "HTTP/1.1 200 OK\r\nConnection: content-length, transfer-encoding\r\nContent-Length: 2\r\n\r\n",
            false,
            false,
        );
        assert_eq!(head.framing, Framing::Length(2));
        assert_eq!(
            String::from_utf8(head.client_head).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
        );
    }

    #[test]
    fn lengths_are_digits_or_lists_of_equal_ones() {
        assert_eq!(parse_length(b"12"), Some(12));
        assert_eq!(parse_length(b"5, 5,5"), Some(5));
        for bad in [
            &b""[..],
            b"5, 6",
            b"5,",
            b"-1",
            b"1e3",
            b" ",
            b"99999999999999999999",
        ] {
            assert_eq!(parse_length(bad), None, "{bad:?}");
        }
        let (head, _) = response(
            "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n",
            false,
            false,
        );
        assert_eq!(head.framing, Framing::Length(5));
        // Requests take one length of digits; lists and repeats are hyper's to read.
        assert_eq!(parse_digits(b"12"), Some(12));
        assert_eq!(parse_digits(b"5, 5"), None);
    }

    #[test]
    fn a_response_head_is_read_as_hyper_s_client_reads_it() {
        // Beside a coding, a length is not read.
        let (head, _) = response(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: abc\r\n\r\n",
            false,
            false,
        );
        assert_eq!(head.framing, Framing::Chunked);
        assert!(!String::from_utf8_lossy(&head.client_head).contains("abc"));
        // A coding hyper cannot read is not chunked: the body ends with the connection.
        let (head, _) = response(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\u{e9}\r\n\r\n",
            false,
            false,
        );
        assert_eq!(head.framing, Framing::UntilClose);
        // HTTP/1.0 with a coding is refused.
        assert!(matches!(
            parse_response(
                b"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                false,
                false
            ),
            ParsedResponse::Invalid
        ));
        // A content type that is not visible ASCII is no stream's (hyper's `to_str` refuses it).
        let (head, _) = response(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; x=\u{e9}\r\nContent-Length: 0\r\n\r\n",
            false,
            false,
        );
        assert_eq!(head.stream, None);
        // A `connection` value it cannot read is passed over: the answer is relayed.
        let (head, _) = match parse_response(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive, x\xff\r\nContent-Length: 0\r\n\r\n",
            false,
            false,
        ) {
            ParsedResponse::Complete(head, length) => (head, length),
            other => panic!("{other:?}"),
        };
        assert!(!head.close_upstream);
        assert_eq!(head.framing, Framing::Length(0));
    }

    #[test]
    fn a_head_is_parsed_again_only_once_a_blank_line_may_have_come() {
        let head = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
        // A byte at a time: the end is seen with the byte that completes it, not before.
        let ends: Vec<usize> = (1..=head.len())
            .filter(|&n| may_end_head(&head[..n], n - 1))
            .collect();
        assert_eq!(ends, [head.len()]);
        assert!(may_end_head(b"GET / HTTP/1.1\n\n", 0));
        assert!(may_end_head(b"GET / HTTP/1.1\r\n\n", 15));
        assert!(!may_end_head(b"GET / HTTP/1.1\r\nX: 1\r\n", 0));
    }

    fn response(raw: &str, is_head: bool, close: bool) -> (ResponseHead, usize) {
        match parse_response(raw.as_bytes(), is_head, close) {
            ParsedResponse::Complete(head, length) => (head, length),
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    #[test]
    fn a_response_head_keeps_its_framing_and_loses_hop_by_hop_headers() {
        let (head, _) = response(
            "HTTP/1.1 200 Fine\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nX-Kept: 1\r\n\r\n",
            false,
            false,
        );
        assert_eq!(
            String::from_utf8(head.client_head).unwrap(),
            "HTTP/1.1 200 Fine\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nX-Kept: 1\r\n\r\n"
        );
        assert_eq!(head.framing, Framing::Chunked);
        assert_eq!(head.stream, Some(StreamKind::Sse));
        assert!(!head.close_upstream && !head.close_client);
        assert_eq!(head.recorded["transfer-encoding"], "chunked");

        let cases = [
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                false,
                Framing::Length(5),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
                true,
                Framing::Empty,
            ),
            ("HTTP/1.1 204 No Content\r\n\r\n", false, Framing::Empty),
            (
                "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
                false,
                Framing::Empty,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
                false,
                Framing::UntilClose,
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                false,
                Framing::Chunked,
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", false, Framing::UntilClose),
        ];
        for (raw, is_head, framing) in cases {
            let (head, _) = response(raw, is_head, false);
            assert_eq!(head.framing, framing, "{raw:?}");
            let says_close =
                String::from_utf8_lossy(&head.client_head).contains("connection: close");
            assert_eq!(says_close, framing == Framing::UntilClose, "{raw:?}");
            assert_eq!(head.close_client, framing == Framing::UntilClose, "{raw:?}");
        }
        let (head, _) = response("HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", false, true);
        assert!(head.close_upstream && head.close_client);
        assert!(String::from_utf8_lossy(&head.client_head).starts_with("HTTP/1.1 200 OK\r\n"));
        let (head, _) = response(
            "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            false,
            false,
        );
        assert!(head.close_upstream && !head.close_client);
    }

    #[test]
    fn informational_answers_are_skipped_and_broken_heads_refused() {
        let raw = "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n";
        assert!(matches!(
            parse_response(raw.as_bytes(), false, false),
            ParsedResponse::Informational(n) if n == raw.len()
        ));
        for raw in [
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            "NOT HTTP\r\n\r\n",
        ] {
            assert!(
                matches!(
                    parse_response(raw.as_bytes(), false, false),
                    ParsedResponse::Invalid
                ),
                "{raw:?}"
            );
        }
        // A coding hyper cannot read is not chunked (the body ends with the connection).
        assert!(matches!(
            parse_response(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: \xff\r\n\r\n",
                false,
                false
            ),
            ParsedResponse::Complete(
                ResponseHead {
                    framing: Framing::UntilClose,
                    ..
                },
                _
            )
        ));
        assert!(matches!(
            parse_response(b"HTTP/1.1 200 OK\r\nX: ", false, false),
            ParsedResponse::Partial
        ));
    }

    /// Feeds `wire` to a body state in the pieces `cuts` makes: what comes out, the data seen,
    /// what stayed in the buffer, and how it ended.
    fn relay_in_pieces(
        framing: Framing,
        wire: &[u8],
        cuts: &[usize],
    ) -> (Vec<u8>, Vec<u8>, Vec<u8>, Result<bool, ()>) {
        let mut state = BodyState::new(framing);
        let mut buf = BytesMut::new();
        let (mut out, mut data) = (Vec::new(), Vec::new());
        let mut at = 0;
        for &cut in cuts.iter().chain(std::iter::once(&wire.len())) {
            let cut = cut.clamp(at, wire.len());
            buf.extend_from_slice(&wire[at..cut]);
            at = cut;
            if state
                .take(&mut buf, &mut out, |d| data.extend_from_slice(d))
                .is_err()
            {
                return (out, data, buf.to_vec(), Err(()));
            }
        }
        (out, data, buf.to_vec(), Ok(state.is_done()))
    }

    #[test]
    fn chunked_bodies_pass_as_they_came_in_any_pieces() {
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n.max(1)
        };
        for round in 0..3000 {
            let mut wire = Vec::new();
            let mut expected = Vec::new();
            for _ in 0..next(5) {
                let size = 1 + next(300) as usize;
                let chunk: Vec<u8> = (0..size).map(|i| (i as u8) ^ (round as u8)).collect();
                let extension = if next(4) == 0 { ";name=value" } else { "" };
                let hex = if next(2) == 0 {
                    format!("{size:x}")
                } else {
                    format!("{size:X}")
                };
                wire.extend_from_slice(format!("{hex}{extension}\r\n").as_bytes());
                wire.extend_from_slice(&chunk);
                wire.extend_from_slice(b"\r\n");
                expected.extend_from_slice(&chunk);
            }
            wire.extend_from_slice(b"0\r\n");
            if next(3) == 0 {
                wire.extend_from_slice(b"X-Checksum: 1\r\nX-More: 2\r\n");
            }
            wire.extend_from_slice(b"\r\n");
            let after = if next(4) == 0 {
                b"HTTP/1.1 200".to_vec()
            } else {
                Vec::new()
            };
            let mut full = wire.clone();
            full.extend_from_slice(&after);
            let mut cuts: Vec<usize> = (0..next(12))
                .map(|_| next(full.len() as u64 + 1) as usize)
                .collect();
            cuts.sort_unstable();
            let (out, data, left, ended) = relay_in_pieces(Framing::Chunked, &full, &cuts);
            assert_eq!(ended, Ok(true), "round {round}");
            assert_eq!(out, wire, "round {round}");
            assert_eq!(data, expected, "round {round}");
            assert_eq!(left, after, "round {round}");
        }
    }

    #[test]
    fn lengths_and_closes_end_where_they_say() {
        let (out, data, left, ended) = relay_in_pieces(Framing::Length(5), b"hello world", &[2, 3]);
        assert_eq!(
            (out.as_slice(), data.as_slice(), left.as_slice(), ended),
            (&b"hello"[..], &b"hello"[..], &b" world"[..], Ok(true))
        );
        let (out, _, _, ended) = relay_in_pieces(Framing::Length(50), b"short", &[1]);
        assert_eq!((out.as_slice(), ended), (&b"short"[..], Ok(false)));
        let (out, data, left, ended) = relay_in_pieces(Framing::UntilClose, b"all of it", &[3]);
        assert_eq!(
            (out.as_slice(), data.as_slice(), left.len(), ended),
            (&b"all of it"[..], &b"all of it"[..], 0, Ok(false))
        );
        let mut state = BodyState::new(Framing::UntilClose);
        state.close();
        assert!(state.is_done());
        let (_, _, left, ended) = relay_in_pieces(Framing::Empty, b"extra", &[]);
        assert_eq!((left.as_slice(), ended), (&b"extra"[..], Ok(true)));
    }

    #[test]
    fn broken_chunked_framing_is_refused() {
        for wire in [
            &b"zz\r\nab\r\n0\r\n\r\n"[..],
            b"2\r\nabXY0\r\n\r\n",
            b"2\r\nab\rX",
            b"ffffffffffffffffff\r\n",
        ] {
            assert_eq!(
                relay_in_pieces(Framing::Chunked, wire, &[]).3,
                Err(()),
                "{wire:?}"
            );
        }
        let long_line = format!("1;{}", "e".repeat(MAX_CHUNK_LINE));
        assert_eq!(
            relay_in_pieces(Framing::Chunked, long_line.as_bytes(), &[]).3,
            Err(())
        );
        let endless_trailers = format!("0\r\nX: {}", "t".repeat(MAX_TRAILERS));
        assert_eq!(
            relay_in_pieces(Framing::Chunked, endless_trailers.as_bytes(), &[]).3,
            Err(())
        );
        // What httparse takes and hyper refused: no size digit, a bare LF in an extension or
        // a trailer.
        for wire in [
            &b"\r\n\r\n"[..],
            b";x\r\n\r\n",
            b"2;a\nb\r\nab\r\n0\r\n\r\n",
            b"2\nab\r\n0\r\n\r\n",
            b"0\r\nX: 1\nY: 2\r\n\r\n",
            b"0\r\n\n",
        ] {
            let cuts: Vec<usize> = (0..wire.len()).collect();
            assert_eq!(
                relay_in_pieces(Framing::Chunked, wire, &[]).3,
                Err(()),
                "{wire:?}"
            );
            assert_eq!(
                relay_in_pieces(Framing::Chunked, wire, &cuts).3,
                Err(()),
                "{wire:?} a byte at a time"
            );
        }
        // Waiting for more is not an error.
        assert_eq!(
            relay_in_pieces(Framing::Chunked, b"2\r\nab\r", &[]).3,
            Ok(false)
        );
        assert_eq!(relay_in_pieces(Framing::Chunked, b"2", &[]).3, Ok(false));
    }
}
