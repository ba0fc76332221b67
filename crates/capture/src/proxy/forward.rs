//! One exchange: read the request, forward it, stream the response back through a recording body,
//! and hand the capture over when the exchange ends, however it ends.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri, Version};
use tokio::sync::oneshot;

use super::body::{RecordingBody, StreamedBody, StreamedCount};
use super::headers::{recorded_headers, strip_hop_by_hop};
use super::upstream::{self, UpstreamBody, UpstreamDriver, UpstreamSender};
use super::{Shared, now_ms};
use prefixscope_core::capture::{Capture, ResponseCapture, stream_kind_of};
use prefixscope_core::record::ExchangeError;

pub(crate) type ProxyBody = BoxBody<Bytes, hyper::Error>;

pub(crate) struct Connection {
    id: u64,
    shared: Arc<Shared>,
    upstream: tokio::sync::Mutex<Option<UpstreamSender>>,
    /// The upstream connection's work, polled here (`drive`) by this client connection's task.
    driver: std::sync::Mutex<Option<UpstreamDriver>>,
    /// Set when the previous exchange's capture is waiting for room in the recorder: the next
    /// request on this connection waits for it (back-pressure lands between exchanges, never
    /// inside a response).
    pending_delivery: std::sync::Mutex<Option<oneshot::Receiver<()>>>,
}

impl Connection {
    pub(crate) fn new(id: u64, shared: Arc<Shared>) -> Connection {
        Connection {
            id,
            shared,
            upstream: tokio::sync::Mutex::new(None),
            driver: std::sync::Mutex::new(None),
            pending_delivery: std::sync::Mutex::new(None),
        }
    }

    /// Back-pressure between exchanges: waits until the previous exchange's capture, if it
    /// waited for room in the recorder, has been handed over.
    pub(crate) async fn wait_for_previous_delivery(&self) {
        let previous = self.pending_delivery.lock().ok().and_then(|mut p| p.take());
        if let Some(previous) = previous {
            let _ = previous.await;
        }
    }

    /// Lets the upstream connection read and write what it can; it wakes this task when it can
    /// do more. Done once the connection has closed.
    pub(crate) fn drive(&self, cx: &mut std::task::Context<'_>) {
        if let Ok(mut slot) = self.driver.lock()
            && let Some(driver) = slot.as_mut()
            && driver.as_mut().poll(cx).is_ready()
        {
            *slot = None;
        }
    }

    /// Sends on this connection's upstream connection, opening it if needed. A reused connection
    /// found closed before the request went out is reopened and the request sent once more; a
    /// request that may have reached the server is never sent twice.
    async fn send(
        &self,
        request: Request<UpstreamBody>,
    ) -> Result<Response<Incoming>, ExchangeError> {
        let mut slot = self.upstream.lock().await;
        // What the upstream did since the last exchange (closed an idle connection) is seen now.
        std::future::poll_fn(|cx| {
            self.drive(cx);
            std::task::Poll::Ready(())
        })
        .await;
        let mut request = Some(request);
        for _ in 0..2 {
            let reused = slot.as_ref().is_some_and(|sender| !sender.is_closed());
            if !reused {
                let shared = &self.shared;
                match upstream::connect(
                    &shared.upstream,
                    shared.tls.as_ref(),
                    shared.connect_timeout,
                )
                .await
                {
                    Ok((sender, driver)) => {
                        *slot = Some(sender);
                        if let Ok(mut running) = self.driver.lock() {
                            *running = Some(driver);
                        }
                    }
                    Err(failure) => {
                        shared.stats.set_upstream_error(&failure.reason);
                        return Err(failure.kind);
                    }
                }
            }
            let Some(sender) = slot.as_mut() else {
                return Err(ExchangeError::UpstreamUnreachable);
            };
            let ready = std::future::poll_fn(|cx| {
                self.drive(cx);
                sender.poll_ready(cx)
            })
            .await;
            if ready.is_err() {
                *slot = None;
                if reused {
                    continue;
                }
                return Err(ExchangeError::UpstreamReset);
            }
            let Some(next) = request.take() else {
                return Err(ExchangeError::UpstreamReset);
            };
            let mut sent = std::pin::pin!(sender.try_send_request(next));
            let sent = std::future::poll_fn(|cx| {
                self.drive(cx);
                sent.as_mut().poll(cx)
            })
            .await;
            match sent {
                Ok(response) => return Ok(response),
                Err(mut e) => {
                    *slot = None;
                    // The request was not written (its body not read, streamed or not): it
                    // can go out on a fresh connection.
                    if reused && let Some(back) = e.take_message() {
                        request = Some(back);
                        continue;
                    }
                    return Err(ExchangeError::UpstreamReset);
                }
            }
        }
        Err(ExchangeError::UpstreamReset)
    }
}

/// The request as the upstream gets it: the client's, with hop-by-hop headers gone, our `Host`,
/// the upstream's path, HTTP/1.1.
fn upstream_request(
    mut parts: hyper::http::request::Parts,
    body: UpstreamBody,
) -> Request<UpstreamBody> {
    parts.version = Version::HTTP_11;
    Request::from_parts(parts, body)
}

/// The exchange's capture until it is handed over. Dropping it unfinished (the client went away
/// while we waited) still records the exchange.
pub(crate) struct InFlight {
    capture: Option<Capture<Bytes>>,
    connection: Arc<Connection>,
    /// A streamed request body's bytes so far (`StreamedBody`): the capture's size at the end.
    streamed: Option<Arc<StreamedCount>>,
}

impl InFlight {
    /// An exchange starts: counted, numbered, and its capture opened with the request's head.
    pub(crate) fn begin(
        connection: &Arc<Connection>,
        method: String,
        path: String,
        request_headers: std::collections::BTreeMap<String, String>,
    ) -> InFlight {
        let t_start_ms = now_ms();
        let shared = &connection.shared;
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        shared.stats.exchanges.fetch_add(1, Ordering::Relaxed);
        shared.stats.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight {
            capture: Some(Capture {
                id,
                conn: connection.id,
                t_start_ms,
                t_first_byte_ms: None,
                t_end_ms: t_start_ms,
                method,
                path,
                request_headers,
                request_body_bytes: 0,
                request_body: None,
                response: None,
                error: None,
                probe: false,
            }),
            connection: Arc::clone(connection),
            streamed: None,
        }
    }

    /// A piece of the response body on its way to the client: timed if first, counted, and
    /// kept up to `max_body`.
    pub(crate) fn record_data(&mut self, data: &[u8], max_body: usize) {
        let Some(capture) = self.capture.as_mut() else {
            return;
        };
        if capture.t_first_byte_ms.is_none() && !data.is_empty() {
            capture.t_first_byte_ms = Some(now_ms());
        }
        let Some(response) = capture.response.as_mut() else {
            return;
        };
        response.body_bytes += data.len() as u64;
        let room = max_body.saturating_sub(response.body.len());
        if data.len() > room {
            response.truncated = true;
        }
        response
            .body
            .extend_from_slice(&data[..data.len().min(room)]);
    }

    /// The upstream connection's work, done on the task that streams its response.
    pub(crate) fn drive_upstream(&self, cx: &mut std::task::Context<'_>) {
        self.connection.drive(cx);
    }

    pub(crate) fn capture_mut(&mut self) -> Option<&mut Capture<Bytes>> {
        self.capture.as_mut()
    }

    pub(crate) fn finish(&mut self, error: Option<ExchangeError>) {
        let Some(mut capture) = self.capture.take() else {
            return;
        };
        capture.t_end_ms = now_ms();
        capture.error = error;
        if let Some(streamed) = &self.streamed {
            capture.request_body_bytes = streamed.bytes.load(Ordering::Relaxed);
            if streamed.client_failed.load(Ordering::Relaxed)
                && matches!(capture.error, Some(ExchangeError::UpstreamReset))
            {
                // The upstream saw a cut body because the client's stopped.
                capture.error = Some(ExchangeError::ClientDisconnected);
            }
        }
        let shared = &self.connection.shared;
        let Some(capture) = shared.captures.try_send(capture) else {
            shared.stats.exchange_done();
            return;
        };
        // The recorder is behind: wait for it off the runtime, and make this connection's next
        // request wait for that.
        let (done_tx, done_rx) = oneshot::channel();
        if let Ok(mut pending) = self.connection.pending_delivery.lock() {
            *pending = Some(done_rx);
        }
        let captures = shared.captures.clone();
        let stats = Arc::clone(&shared.stats);
        let deliver = move || {
            captures.send_blocking(capture);
            stats.exchange_done();
            let _ = done_tx.send(());
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn_blocking(deliver);
            }
            Err(_) => deliver(),
        }
    }
}

impl InFlight {
    /// An exchange the proxy refused before forwarding it (no room for its body): counted in
    /// the proxy's stats, not recorded, as hyper's own refusals are not.
    fn refused(&mut self) {
        if self.capture.take().is_some() {
            self.connection.shared.stats.exchange_done();
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.finish(Some(ExchangeError::ClientDisconnected));
    }
}

pub(crate) async fn forward(
    connection: Arc<Connection>,
    request: Request<Incoming>,
) -> Response<ProxyBody> {
    let shared = Arc::clone(&connection.shared);
    let (mut parts, body) = request.into_parts();
    let path = client_path(&parts.uri);
    parts.uri = upstream_uri(
        &shared.upstream.prefix,
        std::mem::take(&mut parts.uri),
        &path,
    );
    // The Host the upstream sees (its own name, set below): which server answered, and
    // so which provider's caching rules apply (`Provider::of_host`).
    let mut request_headers = recorded_headers(&parts.headers);
    if let Ok(host) = shared.host_header.to_str() {
        request_headers.insert("host".into(), host.to_string());
    }
    let mut flight = InFlight::begin(&connection, parts.method.to_string(), path, request_headers);
    connection.wait_for_previous_delivery().await;

    // Read whole up to `--max-body` (kept for the record, and sent whole); a body announced
    // or found larger is streamed to the upstream as it arrives, never held.
    let announced = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let limit = if announced.is_some_and(|n| n > shared.max_body as u64) {
        0
    } else {
        shared.max_body
    };
    let held = Held::new(&shared.body_budget, shared.body_timeout);
    let body = match read_up_to(body, limit, announced, shared.body_timeout, held).await {
        Ok(body) => body,
        Err(BodyFailure::OverBudget) => {
            shared
                .stats
                .body_budget_refusals
                .fetch_add(1, Ordering::Relaxed);
            flight.refused();
            return error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!(
                    "the request bodies held by the proxy filled its budget for {} s",
                    shared.body_timeout.as_secs()
                ),
            );
        }
        Err(BodyFailure::Broken) => {
            flight.finish(Some(ExchangeError::ClientDisconnected));
            return error_response(
                StatusCode::BAD_REQUEST,
                "the request body did not arrive whole",
            );
        }
        Err(BodyFailure::Stalled) => {
            shared.stats.body_timeouts.fetch_add(1, Ordering::Relaxed);
            flight.finish(Some(ExchangeError::ClientDisconnected));
            return error_response(
                StatusCode::REQUEST_TIMEOUT,
                &format!(
                    "the request body stalled: no byte for {} s",
                    shared.body_timeout.as_secs()
                ),
            );
        }
    };
    let upstream_body = match body {
        RequestBody::Whole(body) => {
            if let Some(capture) = flight.capture_mut() {
                capture.request_body_bytes = body.len() as u64;
                capture.request_body = Some(body.clone());
                announce_start(&shared, capture);
            }
            Full::new(body).map_err(|never| match never {}).boxed()
        }
        RequestBody::Streamed { head, rest } => {
            let count = Arc::new(StreamedCount::default());
            flight.streamed = Some(Arc::clone(&count));
            StreamedBody::new(head, rest, count).boxed()
        }
    };

    strip_hop_by_hop(&mut parts.headers);
    // The client addressed the proxy; the upstream (and its TLS name) expects its own name.
    parts
        .headers
        .insert(header::HOST, shared.host_header.clone());
    let upstream_request = upstream_request(parts, upstream_body);

    let response = match connection.send(upstream_request).await {
        Ok(response) => response,
        Err(error) => {
            let message = note_upstream_failure(&shared, error);
            flight.finish(Some(error));
            return error_response(StatusCode::BAD_GATEWAY, &message);
        }
    };
    shared
        .stats
        .last_upstream_ok_ms
        .store(now_ms().max(0) as u64, Ordering::Relaxed);

    let (mut parts, incoming) = response.into_parts();
    if let Some(capture) = flight.capture_mut() {
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        capture.response = Some(ResponseCapture {
            status: parts.status.as_u16(),
            headers: recorded_headers(&parts.headers),
            stream: stream_kind_of(content_type),
            ..ResponseCapture::default()
        });
    }
    // A length beside a transfer coding is not the body's (RFC 9112, 6.3): the coding framed
    // it, and hyper read it so; left in, the client would be sent a cut body.
    if parts.headers.contains_key(header::TRANSFER_ENCODING) {
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    strip_hop_by_hop(&mut parts.headers);
    let body = RecordingBody::new(incoming, flight, shared.max_body);
    Response::from_parts(parts, body.boxed())
}

/// An exchange that could not reach the upstream or got no answer from it: counted, and the
/// message of the proxy's 502.
pub(crate) fn note_upstream_failure(shared: &Shared, error: ExchangeError) -> String {
    shared
        .stats
        .upstream_failures
        .fetch_add(1, Ordering::Relaxed);
    shared
        .stats
        .last_upstream_failure_ms
        .store(now_ms().max(0) as u64, Ordering::Relaxed);
    let reason = shared.stats.last_upstream_error().unwrap_or_default();
    match error {
        ExchangeError::Timeout => format!("connecting to the upstream server timed out: {reason}"),
        ExchangeError::UpstreamUnreachable => {
            format!("the upstream server is unreachable: {reason}")
        }
        _ => "the upstream server closed the connection before answering".to_string(),
    }
}

/// The body of the proxy's own answers (never the upstream's), in a shape OpenAI clients
/// display.
pub(crate) fn error_body(message: &str) -> String {
    serde_json::json!({"error": {"message": format!("prefixscope: {message}"), "type": "proxy_error"}})
        .to_string()
}

/// The request, whole, to whoever predicts what it will do (`ProxyConfig::request_starts`),
/// before it goes upstream (no response yet): its head cloned, its body a shared handle;
/// never waited for.
pub(crate) fn announce_start(shared: &Shared, capture: &Capture<Bytes>) {
    // Disconnected: nobody reads them any more (a headless run), nothing lost.
    if let Some(starts) = &shared.request_starts
        && let Err(crossbeam_channel::TrySendError::Full(_)) = starts.try_send(capture.clone())
    {
        shared.stats.starts_dropped.fetch_add(1, Ordering::Relaxed);
    }
}

enum RequestBody {
    /// The whole body, at most the limit.
    Whole(Bytes),
    /// Past the limit: what was read so far, and the rest still to come.
    Streamed { head: Bytes, rest: Incoming },
}

/// Why a request body could not be read.
enum BodyFailure {
    /// The client's stream broke.
    Broken,
    /// No byte came for the body timeout: a slow client holds no connection for ever.
    Stalled,
    /// The bodies other requests hold left no room for this one's within the body timeout.
    OverBudget,
}

/// Room taken in the body budget for a body being read and held: given back when the last
/// copy of the body is dropped (its `Bytes` own it), after the upstream was sent it and the
/// recorder made its record.
struct Held {
    budget: Arc<tokio::sync::Semaphore>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    bytes: usize,
    wait: std::time::Duration,
}

impl Held {
    fn new(budget: &Arc<tokio::sync::Semaphore>, wait: std::time::Duration) -> Held {
        Held {
            budget: Arc::clone(budget),
            permit: None,
            bytes: 0,
            wait,
        }
    }

    /// Room for `bytes` in all, waiting for it at most `wait`.
    async fn grow_to(&mut self, bytes: usize) -> Result<(), BodyFailure> {
        while self.bytes < bytes {
            // One acquisition takes at most u32::MAX permits.
            let more = u32::try_from(bytes - self.bytes).unwrap_or(u32::MAX);
            let permit =
                tokio::time::timeout(self.wait, Arc::clone(&self.budget).acquire_many_owned(more))
                    .await
                    .map_err(|_| BodyFailure::OverBudget)?
                    .map_err(|_| BodyFailure::OverBudget)?;
            self.bytes += more as usize;
            match &mut self.permit {
                Some(held) => held.merge(permit),
                None => self.permit = Some(permit),
            }
        }
        Ok(())
    }

    /// The body read, owning its room: the room is given back with the last copy.
    fn into_bytes(self, data: Vec<u8>) -> Bytes {
        match self.permit {
            Some(permit) => Bytes::from_owner(HeldBody {
                data,
                _room: permit,
            }),
            None => Bytes::from(data),
        }
    }
}

/// A request body and its room in the body budget.
struct HeldBody {
    data: Vec<u8>,
    _room: tokio::sync::OwnedSemaphorePermit,
}

impl AsRef<[u8]> for HeldBody {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// Reads `body` whole if it ends within `limit` bytes; else stops at the frame that passes it.
/// Each frame must come within `idle`. The room the body takes in the budget is taken in `held` (the announced length before a
/// byte is read, then whatever more arrives) and owned by the bytes read.
async fn read_up_to(
    mut body: Incoming,
    limit: usize,
    announced: Option<u64>,
    idle: std::time::Duration,
    mut held: Held,
) -> Result<RequestBody, BodyFailure> {
    if limit == 0 {
        // Announced past the limit: nothing read here, all of it streamed.
        return Ok(RequestBody::Streamed {
            head: Bytes::new(),
            rest: body,
        });
    }
    let announced = announced.map(|n| usize::try_from(n).unwrap_or(limit).min(limit));
    if let Some(announced) = announced {
        held.grow_to(announced).await?;
    }
    let mut head = Vec::with_capacity(announced.unwrap_or(0));
    loop {
        let frame = tokio::time::timeout(idle, body.frame())
            .await
            .map_err(|_| BodyFailure::Stalled)?;
        match frame {
            None => return Ok(RequestBody::Whole(held.into_bytes(head))),
            Some(Err(_)) => return Err(BodyFailure::Broken),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    held.grow_to(head.len() + data.len()).await?;
                    head.extend_from_slice(&data);
                }
                if head.len() > limit {
                    return Ok(RequestBody::Streamed {
                        head: held.into_bytes(head),
                        rest: body,
                    });
                }
            }
        }
    }
}

/// The client's path and query, as recorded and as forwarded (after the upstream's prefix).
fn client_path(uri: &Uri) -> String {
    uri.path_and_query()
        .map_or_else(|| uri.path().to_string(), |pq| pq.as_str().to_string())
}

/// The URI the upstream gets: the upstream's prefix, then the client's path and query (`path`).
/// A client URI that is already that (a path, no prefix to add) is kept as it came, not built
/// and parsed again.
fn upstream_uri(prefix: &str, client: Uri, path: &str) -> Uri {
    if prefix.is_empty()
        && client.scheme().is_none()
        && client.authority().is_none()
        && client.path().starts_with('/')
    {
        return client;
    }
    let path = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("/{path}")
    };
    format!("{prefix}{path}")
        .parse()
        .unwrap_or_else(|_| Uri::from_static("/"))
}

/// The proxy's own answers (never the upstream's) say so, in a shape OpenAI clients display.
fn error_response(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(error_body(message)))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstream(prefix: &str, client: &str) -> Uri {
        let client: Uri = client.parse().unwrap();
        let path = client_path(&client);
        upstream_uri(prefix, client, &path)
    }

    #[test]
    fn upstream_uri_keeps_the_query_and_adds_the_prefix() {
        assert_eq!(upstream("", "/v1/x?a=1"), "/v1/x?a=1");
        assert_eq!(upstream("/openai", "/v1/x"), "/openai/v1/x");
        assert_eq!(upstream("/openai", "/v1/x?a=1"), "/openai/v1/x?a=1");
    }

    #[test]
    fn upstream_uri_drops_the_client_s_scheme_and_authority() {
        assert_eq!(upstream("", "http://host:1/v1/x?a=1"), "/v1/x?a=1");
        assert_eq!(upstream("", "/"), "/");
        let absolute = upstream("", "http://host:1/v1");
        assert!(absolute.scheme().is_none() && absolute.authority().is_none());
    }
}
