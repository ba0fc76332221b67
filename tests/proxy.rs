//! The proxy against a scripted fake upstream: bytes and headers pass unchanged, responses stream
//! frame by frame, every failure is a record, and no record is lost under load.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::{HeaderMap, Response, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use prefixscope_core::capture::BodyMode;
use prefixscope_core::record::Record;
use prefixscope_core::record::{ExchangeError, StreamKind};
use support::*;

const CHAT: &str = "/v1/chat/completions";

#[derive(Clone)]
struct Spec {
    status: u16,
    headers: Vec<(String, String)>,
    chunks: Vec<Vec<u8>>,
    streamed: bool,
}

#[derive(Clone, Default)]
struct Seen {
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

/// 40 random exchanges (statuses, headers, bodies up to 20 KB, streamed and not) through the
/// proxy: everything arrives unchanged both ways; the records.
async fn randomized_exchanges() -> Vec<Record> {
    let seed = 0x5eed_2026_u64;
    let mut rng = Rng(seed);
    let specs: Arc<Mutex<HashMap<String, Spec>>> = Arc::default();
    let seen: Arc<Mutex<HashMap<String, Seen>>> = Arc::default();
    let upstream = {
        let (specs, seen) = (Arc::clone(&specs), Arc::clone(&seen));
        fake_upstream(handler(move |req| {
            let (specs, seen) = (Arc::clone(&specs), Arc::clone(&seen));
            async move {
                let (parts, body) = req.into_parts();
                let id = parts.headers["x-test-id"].to_str().unwrap().to_string();
                let body = body.collect().await.unwrap().to_bytes();
                let path = parts.uri.path_and_query().unwrap().as_str().to_string();
                seen.lock().unwrap().insert(
                    id.clone(),
                    Seen {
                        path,
                        headers: parts.headers,
                        body,
                    },
                );
                let spec = specs.lock().unwrap()[&id].clone();
                let mut builder = Response::builder().status(spec.status);
                for (name, value) in &spec.headers {
                    builder = builder.header(name, value);
                }
                if spec.streamed {
                    let (tx, body) = channel_body();
                    for chunk in spec.chunks {
                        let _ = tx.send(Bytes::from(chunk));
                    }
                    builder
                        .header("content-type", "text/event-stream")
                        .body(body)
                        .unwrap()
                } else {
                    builder.body(full(spec.chunks.concat())).unwrap()
                }
            }
        }))
        .await
    };
    let proxy = start_proxy(upstream, "passthrough", Options::default()).await;
    let mut sent = BTreeMap::new();
    let mut client = client(proxy.addr).await;
    for i in 0..40 {
        let id = format!("req-{i}");
        let streamed = i % 2 == 1;
        let spec = Spec {
            status: [200, 201, 400, 404, 500, 503][rng.below(6) as usize],
            headers: (0..rng.below(6))
                .map(|_| (format!("x-resp-{}", rng.token(6)), rng.header_value(12)))
                .collect(),
            chunks: (0..1 + rng.below(5))
                .map(|_| {
                    let len = rng.below(3000) as usize;
                    rng.bytes(len)
                })
                .collect(),
            streamed,
        };
        specs.lock().unwrap().insert(id.clone(), spec.clone());
        let body_len = rng.below(20_000) as usize;
        let body = rng.bytes(body_len);
        let mut request = post(CHAT, body.clone());
        request
            .headers_mut()
            .insert("x-test-id", id.parse().unwrap());
        let mut request_headers = Vec::new();
        for _ in 0..rng.below(8) {
            let value_len = 1 + rng.below(40) as usize;
            let (name, value) = (
                format!("x-rand-{}", rng.token(5)),
                rng.header_value(value_len),
            );
            request.headers_mut().append(
                name.parse::<hyper::header::HeaderName>().unwrap(),
                value.parse().unwrap(),
            );
            request_headers.push((name, value));
        }
        // A repeated header keeps both values, in order.
        request
            .headers_mut()
            .append("x-twice", "first".parse().unwrap());
        request
            .headers_mut()
            .append("x-twice", "second".parse().unwrap());
        // Hop-by-hop: a header the client names in `connection` never reaches upstream.
        request
            .headers_mut()
            .insert("connection", "keep-alive, x-hop".parse().unwrap());
        request.headers_mut().insert("x-hop", "1".parse().unwrap());

        let response = send(&mut client, request).await;
        assert_eq!(
            response.status().as_u16(),
            spec.status,
            "seed {seed:#x} request {i}"
        );
        for (name, value) in &spec.headers {
            let got: Vec<_> = response
                .headers()
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect();
            assert!(
                got.contains(&value.as_str()),
                "seed {seed:#x} request {i}: response header {name}"
            );
        }
        let got = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            got.as_ref(),
            spec.chunks.concat().as_slice(),
            "seed {seed:#x} request {i}: response body"
        );

        let seen = seen.lock().unwrap()[&id].clone();
        assert_eq!(
            seen.body.as_ref(),
            body.as_slice(),
            "request {i}: request body"
        );
        assert_eq!(seen.path, CHAT);
        for (name, value) in &request_headers {
            let got: Vec<_> = seen
                .headers
                .get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect();
            assert!(got.contains(&value.as_str()), "request {i}: header {name}");
        }
        let twice: Vec<_> = seen
            .headers
            .get_all("x-twice")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(twice, vec!["first", "second"]);
        assert_eq!(seen.headers["user-agent"], "prefixscope-test/1");
        assert_eq!(seen.headers["content-type"], "application/json");
        assert_eq!(
            seen.headers["host"],
            format!("127.0.0.1:{}", upstream.port()).as_str()
        );
        assert!(seen.headers.get("x-hop").is_none() && seen.headers.get("connection").is_none());
        sent.insert(i as u64 + 1, (body.len() as u64, spec));
    }
    let records = proxy.stop().await;
    assert_eq!(records.len(), 40);
    for record in &records {
        let (request_bytes, spec) = &sent[&record.id];
        assert_eq!(record.request.body_bytes, *request_bytes);
        let response = record.response.as_ref().unwrap();
        assert_eq!(response.status, spec.status);
        assert_eq!(
            response.body_bytes,
            spec.chunks.iter().map(|c| c.len() as u64).sum::<u64>()
        );
        assert_eq!(response.stream, spec.streamed.then_some(StreamKind::Sse));
        assert_eq!(record.error, None);
        assert!(record.request.headers.keys().all(|k| {
            ["user-agent", "content-type", "content-length", "host"].contains(&k.as_str())
        }));
        // The Host the upstream saw: its own name, never the client's or a credential.
        assert_eq!(
            record.request.headers.get("host"),
            Some(&format!("127.0.0.1:{}", upstream.port()))
        );
    }
    records
}

/// Random exchanges pass unchanged, and each is recorded with its times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomized_bodies_and_headers_pass_unchanged_streamed_and_not() {
    let records = randomized_exchanges().await;
    assert_eq!(records.len(), 40);
    for record in &records {
        assert!(
            record.t_first_byte_ms.is_some()
                || record.response.as_ref().is_some_and(|r| r.body_bytes == 0)
        );
    }
}

/// The upstream holds chunk 2 until the client has chunk 1: a proxy that buffered would hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chunk_reaches_the_client_before_the_upstream_sends_the_next() {
    let gate: Arc<Mutex<Option<oneshot::Receiver<()>>>> = Arc::default();
    let (open_gate, gate_rx) = oneshot::channel();
    *gate.lock().unwrap() = Some(gate_rx);
    let upstream = {
        let gate = Arc::clone(&gate);
        fake_upstream(handler(move |_req| {
            let gate = gate.lock().unwrap().take();
            async move {
                let (tx, body) = channel_body();
                let _ = tx.send(Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"one\"}}]}\n\n"));
                tokio::spawn(async move {
                    if let Some(gate) = gate {
                        let _ = gate.await;
                    }
                    let _ = tx.send(Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"two\"}}]}\n\ndata: [DONE]\n\n"));
                });
                Response::builder().header("content-type", "text/event-stream").body(body).unwrap()
            }
        }))
        .await
    };
    let proxy = start_proxy(upstream, "gate", Options::default()).await;
    let mut client = client(proxy.addr).await;
    let response = client
        .send_request(post(CHAT, r#"{"model":"m","stream":true,"messages":[]}"#))
        .await
        .unwrap();
    let mut body = response.into_body();
    let first = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("chunk 1 arrives while the upstream still holds chunk 2")
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(first.data_ref().unwrap()).contains("one"));
    open_gate.send(()).unwrap();
    let rest = body.collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&rest).contains("two"));
    let records = proxy.stop().await;
    let merged = records[0].response.as_ref().unwrap().body.clone().unwrap();
    assert_eq!(merged["choices"][0]["message"]["content"], "onetwo");
    assert_eq!(records[0].response.as_ref().unwrap().chunks, Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_upstream_is_a_record_and_a_502() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = start_proxy(port, "unreachable", Options::default()).await;
    let response = client(proxy.addr)
        .await
        .send_request(post(CHAT, "{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body).into_owned();
    assert!(body.contains("prefixscope"));
    assert!(body.contains("cannot connect to 127.0.0.1:"), "{body}");
    assert!(body.contains("refused"), "{body}");
    let records = proxy.stop().await;
    assert_eq!(records[0].error, Some(ExchangeError::UpstreamUnreachable));
    assert!(records[0].response.is_none());
    assert_eq!(records[0].request.body, Some(serde_json::json!({})));
}

/// A listener whose accept queue is full drops new SYNs, so connecting hangs: on loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_that_hangs_is_a_timeout_record() {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1).unwrap();
    let addr = listener.local_addr().unwrap();
    let mut held = Vec::new();
    let mut full = false;
    for _ in 0..64 {
        match tokio::time::timeout(
            Duration::from_millis(300),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        {
            Ok(Ok(stream)) => held.push(stream),
            _ => {
                full = true;
                break;
            }
        }
    }
    assert!(full, "the accept queue never filled");
    let options = Options {
        connect_timeout: Duration::from_millis(400),
        ..Options::default()
    };
    let proxy = start_proxy(addr, "timeout", options).await;
    let started = std::time::Instant::now();
    let response = client(proxy.addr)
        .await
        .send_request(post(CHAT, "{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert!(started.elapsed() >= Duration::from_millis(400));
    let records = proxy.stop().await;
    assert_eq!(records[0].error, Some(ExchangeError::Timeout));
    drop((held, listener));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_hangs_up_before_or_during_the_response_is_a_reset_record() {
    // Before: reads the request and closes.
    let before = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let before_addr = before.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = before.accept().await {
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf).await;
            drop(stream);
        }
    });
    let proxy = start_proxy(before_addr, "reset-before", Options::default()).await;
    let response = client(proxy.addr)
        .await
        .send_request(post(CHAT, "{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    let records = proxy.stop().await;
    assert_eq!(records[0].error, Some(ExchangeError::UpstreamReset));
    assert!(records[0].response.is_none());

    // During: a head promising 100 bytes, 11 of them, then a hang-up.
    let during = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let during_addr = during.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = during.accept().await {
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"partial\":")
                .await;
            let _ = stream.flush().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(stream);
        }
    });
    let proxy = start_proxy(during_addr, "reset-during", Options::default()).await;
    let response = client(proxy.addr)
        .await
        .send_request(post(CHAT, "{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.into_body().collect().await.is_err(),
        "the client sees a cut-off body"
    );
    let records = proxy.stop().await;
    assert_eq!(records[0].error, Some(ExchangeError::UpstreamReset));
    let response = records[0].response.as_ref().unwrap();
    assert_eq!((response.status, response.body_bytes), (200, 11));
    assert_eq!(response.body_text.as_deref(), Some("{\"partial\":"));
}

/// The proxy drives each upstream connection from the client connection's task: a server that
/// closes a kept-alive connection between two requests (saying so with `connection: close`, or
/// not) is seen closed when the next request comes, and that request goes out on a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_connection_closed_between_requests_is_reopened_for_the_next() {
    for says_close in [false, true] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let n = counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                tokio::spawn(async move {
                    // One request per connection: its head and its body (two bytes, "{}").
                    let mut seen = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !seen.ends_with(b"\r\n\r\n{}") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(k) => seen.extend_from_slice(&buf[..k]),
                        }
                    }
                    let body = format!("{{\"connection\":{n}}}");
                    let close = if says_close {
                        "connection: close\r\n"
                    } else {
                        ""
                    };
                    let head = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{close}content-length: {}\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(format!("{head}{body}").as_bytes()).await;
                    let _ = stream.flush().await;
                    drop(stream);
                });
            }
        });
        let proxy = start_proxy(addr, "reopened", Options::default()).await;
        let mut client = client(proxy.addr).await;
        let mut bodies = Vec::new();
        for _ in 0..3 {
            let response = client.send_request(post(CHAT, "{}")).await.unwrap();
            assert_eq!(
                response.status(),
                StatusCode::OK,
                "says close: {says_close}"
            );
            bodies.push(response.into_body().collect().await.unwrap().to_bytes());
            // The server's close reaches the proxy before the next request.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(
            bodies,
            [
                r#"{"connection":1}"#,
                r#"{"connection":2}"#,
                r#"{"connection":3}"#
            ]
            .map(Bytes::from),
            "says close: {says_close}"
        );
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
        let records = proxy.stop().await;
        assert_eq!(records.len(), 3);
        assert!(records.iter().all(|r| r.error.is_none()), "{records:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_is_a_client_disconnected_record() {
    let senders: Arc<Mutex<Vec<tokio::sync::mpsc::UnboundedSender<Bytes>>>> = Arc::default();
    let upstream = {
        let senders = Arc::clone(&senders);
        fake_upstream(handler(move |_req| {
            let senders = Arc::clone(&senders);
            async move {
                let (tx, body) = channel_body();
                let _ = tx.send(Bytes::from_static(
                    b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n",
                ));
                senders.lock().unwrap().push(tx);
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(body)
                    .unwrap()
            }
        }))
        .await
    };
    let proxy = start_proxy(upstream, "client-gone", Options::default()).await;
    {
        let mut client = client(proxy.addr).await;
        let response = client
            .send_request(post(CHAT, "{\"stream\":true}"))
            .await
            .unwrap();
        let mut body = response.into_body();
        body.frame().await.unwrap().unwrap();
    } // the client's connection is dropped here
    // The upstream goes on streaming into a closed client.
    for _ in 0..20 {
        for tx in senders.lock().unwrap().iter() {
            let _ = tx.send(Bytes::from_static(
                b"data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\n\n",
            ));
        }
        if !proxy.records.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let record = proxy.next_record().await;
    assert_eq!(record.error, Some(ExchangeError::ClientDisconnected));
    assert_eq!(record.response.as_ref().map(|r| r.status), Some(200));
    assert!(record.t_first_byte_ms.is_some());
    senders.lock().unwrap().clear();
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_forwarded_whole_and_not_stored() {
    let upstream = body_echo_upstream().await;
    let options = Options {
        max_body: 64,
        ..Options::default()
    };
    let proxy = start_proxy(upstream, "too-large", options).await;
    let big = format!("{{\"messages\":[],\"pad\":\"{}\"}}", "x".repeat(1000));
    let response = client(proxy.addr)
        .await
        .send_request(post(CHAT, big.clone()))
        .await
        .unwrap();
    let echoed = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        echoed.as_ref(),
        big.as_bytes(),
        "forwarded whole, both ways"
    );
    let records = proxy.stop().await;
    let record = &records[0];
    assert_eq!(record.error, Some(ExchangeError::BodyTooLarge));
    assert_eq!(
        (record.request.body.as_ref(), record.request.body_bytes),
        (None, big.len() as u64)
    );
    let response = record.response.as_ref().unwrap();
    assert!(response.truncated);
    assert_eq!(response.body_bytes, big.len() as u64);
}

/// An upstream that answers each request with its body, as JSON.
async fn body_echo_upstream() -> std::net::SocketAddr {
    fake_upstream(handler(|req| async move {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        Response::builder()
            .header("content-type", "application/json")
            .body(full(body))
            .unwrap()
    }))
    .await
}

async fn echo_upstream() -> std::net::SocketAddr {
    fake_upstream(handler(|req| async move {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let reply = format!(
            "{{\"choices\":[{{\"index\":0,\"message\":{{\"role\":\"assistant\",\"content\":\"ok\"}}}}],\"usage\":{{\"prompt_tokens\":{}}}}}",
            body.len()
        );
        Response::builder().header("content-type", "application/json").body(full(reply)).unwrap()
    }))
    .await
}

async fn load(clients: usize, requests: usize, options: Options, name: &str) {
    let upstream = echo_upstream().await;
    let proxy = start_proxy(upstream, name, options).await;
    let addr = proxy.addr;
    let mut tasks = Vec::new();
    for c in 0..clients {
        tasks.push(tokio::spawn(async move {
            let mut client = client(addr).await;
            let mut failures = 0;
            for r in 0..requests {
                let body = format!("{{\"model\":\"m\",\"messages\":[{{\"role\":\"user\",\"content\":\"client {c} request {r}\"}}]}}");
                if client.ready().await.is_err() {
                    failures += 1;
                    continue;
                }
                match client.send_request(post(CHAT, body)).await {
                    Ok(response) if response.status() == StatusCode::OK => {
                        if response.into_body().collect().await.is_err() {
                            failures += 1;
                        }
                    }
                    _ => failures += 1,
                }
            }
            failures
        }));
    }
    let mut failures = 0;
    for task in tasks {
        failures += task.await.unwrap();
    }
    assert_eq!(failures, 0, "client errors");
    let records = proxy.stop().await;
    assert_eq!(
        records.len(),
        clients * requests,
        "every exchange recorded exactly once"
    );
    let ids: std::collections::BTreeSet<u64> = records.iter().map(|r| r.id).collect();
    assert_eq!(ids.len(), clients * requests);
    let mut per_conn: HashMap<u64, usize> = HashMap::new();
    for r in &records {
        *per_conn.entry(r.conn).or_default() += 1;
        assert_eq!(r.error, None);
    }
    assert!(per_conn.values().all(|&n| n == requests));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_clients_times_fifty_requests_make_exactly_ten_thousand_records() {
    load(200, 50, Options::default(), "load").await;
}

/// With room for one capture, the recorder holds requests back; nothing is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_recorder_queue_holds_requests_back_and_loses_nothing() {
    load(
        50,
        20,
        Options {
            queue: Some(1),
            ..Options::default()
        },
        "backpressure",
    )
    .await;
}

/// Connections served on threads of their own, each with its own runtime (what `record` and
/// `watch` do): every exchange recorded exactly once, each connection's on one connection id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_served_on_three_threads_make_exactly_ten_thousand_records() {
    load(
        200,
        50,
        Options {
            serving_threads: 3,
            ..Options::default()
        },
        "load-threads",
    )
    .await;
}

/// Back-pressure from a serving thread: the capture waits in that thread's blocking pool, and
/// the proxy's stop waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_recorder_queue_holds_requests_back_on_serving_threads_too() {
    load(
        50,
        20,
        Options {
            queue: Some(1),
            serving_threads: 2,
            ..Options::default()
        },
        "backpressure-threads",
    )
    .await;
}

/// A stop while a serving thread has an exchange under way: the client gets the whole answer,
/// the record is written, and the proxy stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_finishes_the_exchange_under_way_on_a_serving_thread() {
    let upstream = fake_upstream(handler(|_req| async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        Response::builder()
            .header("content-type", "application/json")
            .body(full("{\"choices\":[]}"))
            .unwrap()
    }))
    .await;
    let proxy = start_proxy(
        upstream,
        "stop-threads",
        Options {
            serving_threads: 2,
            ..Options::default()
        },
    )
    .await;
    let mut client = client(proxy.addr).await;
    let answer = tokio::spawn(async move {
        let response = client
            .send_request(post(CHAT, "{\"model\":\"m\"}"))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.into_body().collect().await.unwrap().to_bytes()
    });
    let started = std::time::Instant::now();
    while proxy.stats.in_flight() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the request arrives"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let records = proxy.stop().await;
    assert_eq!(
        answer.await.unwrap(),
        Bytes::from_static(b"{\"choices\":[]}")
    );
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].error, None);
    assert_eq!(records[0].response.as_ref().map(|r| r.status), Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_path_prefix_is_added_and_the_record_keeps_the_clients_path() {
    let paths: Arc<Mutex<Vec<String>>> = Arc::default();
    let upstream = {
        let paths = Arc::clone(&paths);
        fake_upstream(handler(move |req| {
            paths.lock().unwrap().push(req.uri().to_string());
            async move { Response::new(full("{}")) }
        }))
        .await
    };
    let options = Options {
        prefix: "/base".into(),
        ..Options::default()
    };
    let proxy = start_proxy(upstream, "prefix", options).await;
    let mut c = client(proxy.addr).await;
    c.send_request(post("/v1/chat/completions?api-version=1&x=1", "{}"))
        .await
        .unwrap();
    let records = proxy.stop().await;
    assert_eq!(
        paths.lock().unwrap().as_slice(),
        ["/base/v1/chat/completions?api-version=1&x=1"]
    );
    // The record keeps the client's path; a value under a name not known to be harmless is not
    // kept (the upstream got it).
    assert_eq!(
        records[0].request.path,
        "/v1/chat/completions?api-version=1&x=REDACTED"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_is_reached_with_its_ca() {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let cert_der = certified.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(certified.key_pair.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server_config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert_der], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(
                        Response::builder()
                            .header("content-type", "application/json")
                            .body(full("{\"tls\":true}"))
                            .unwrap(),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    let options = Options {
        https_ca: Some(certified.cert.pem().into_bytes()),
        host: "localhost".into(),
        ..Options::default()
    };
    let proxy = start_proxy(addr, "https", options).await;
    let response = client(proxy.addr)
        .await
        .send_request(post(CHAT, "{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let records = proxy.stop().await;
    assert_eq!(
        records[0].response.as_ref().unwrap().body,
        Some(serde_json::json!({"tls": true}))
    );

    // A certificate nobody vouched for is refused: an unreachable upstream, recorded.
    let stranger = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let options = Options {
        https_ca: Some(stranger.cert.pem().into_bytes()),
        host: "localhost".into(),
        ..Options::default()
    };
    let proxy = start_proxy(addr, "https-untrusted", options).await;
    let response = client(proxy.addr)
        .await
        .send_request(post(CHAT, "{}"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    // The reason is said: in the proxy's 502 and in its stats (the status line).
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body).into_owned();
    assert!(body.contains("TLS handshake with localhost:"), "{body}");
    assert!(body.contains("certificate"), "{body}");
    let reason = proxy.stats.last_upstream_error().unwrap_or_default();
    assert!(reason.contains("TLS handshake"), "{reason}");
    let records = proxy.stop().await;
    assert_eq!(records[0].error, Some(ExchangeError::UpstreamUnreachable));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_mode_keeps_no_text() {
    let secrets = [
        "SYSTEM-SECRET-ALPHA",
        "USER-SECRET-BRAVO",
        "ARG-SECRET-CHARLIE",
        "RESULT-SECRET-DELTA",
        "DESC-SECRET-ECHO",
        "SCHEMA-SECRET-FOXTROT",
        "REPLY-SECRET-GOLF",
        "REPLYARG-SECRET-HOTEL",
        "THINK-SECRET-INDIA",
        "MODELS-SECRET-JULIET",
        "ERROR-SECRET-KILO",
        "VERBOSE-SECRET-LIMA",
        "LOGPROB-SECRET-MIKE",
    ];
    let upstream = fake_upstream(handler(|req| async move {
        let path = req.uri().path().to_string();
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let streamed = String::from_utf8_lossy(&body).contains("\"stream\":true");
        let json = |s: &str| Response::builder().header("content-type", "application/json").body(full(s.to_string())).unwrap();
        match path.as_str() {
            "/v1/models" => json(r#"{"data":[{"id":"MODELS-SECRET-JULIET"}]}"#),
            "/v1/fail" => Response::builder().status(500).body(full("ERROR-SECRET-KILO")).unwrap(),
            "/v1/messages" if streamed => Response::builder().header("content-type", "text/event-stream").body(full(
                "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"gemma-test\",\"usage\":{\"input_tokens\":5,\"cache_read_input_tokens\":40,\"output_tokens\":0}}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"THINK-SECRET-INDIA\"}}\n\n\
event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_9\",\"name\":\"read_file\",\"input\":{}}}\n\n\
event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"path\\\":\\\"REPLYARG-SECRET-HOTEL\\\"}\"}}\n\n\
event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":9}}\n\n",
            )).unwrap(),
            "/v1/messages" => json(r#"{"id":"msg","type":"message","role":"assistant","model":"gemma-test","content":[{"type":"text","text":"REPLY-SECRET-GOLF"}],"stop_reason":"end_turn","usage":{"input_tokens":5,"cache_read_input_tokens":40,"output_tokens":3}}"#),
            _ if streamed => Response::builder().header("content-type", "text/event-stream").body(full(
                "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"THINK-SECRET-INDIA\",\"content\":\"REPLY-SECRET-GOLF\",\"tool_calls\":[{\"index\":0,\"id\":\"call_7\",\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"arguments\":\"{\\\"path\\\":\\\"REPLYARG-SECRET-HOTEL\\\"}\"}}]}}]}\n\ndata: {\"choices\":[],\"timings\":{\"cache_n\":40,\"prompt_n\":5},\"__verbose\":{\"prompt\":\"VERBOSE-SECRET-LIMA\"},\"prompt_logprobs\":[{\"decoded_token\":\"LOGPROB-SECRET-MIKE\"}]}\n\ndata: [DONE]\n\n",
            )).unwrap(),
            _ => json(r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"REPLY-SECRET-GOLF","tool_calls":[{"id":"call_7","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"REPLYARG-SECRET-HOTEL\"}"}}]}}],"usage":{"prompt_tokens":45,"prompt_tokens_details":{"cached_tokens":40}},"timings":{"cache_n":40,"prompt_n":5},"__verbose":{"prompt":"VERBOSE-SECRET-LIMA","content":"VERBOSE-SECRET-LIMA"},"prompt_logprobs":[null,{"1":{"logprob":-1.5,"decoded_token":"LOGPROB-SECRET-MIKE"}}]}"#),
        }
    }))
    .await;
    let tools = serde_json::json!([{"type": "function", "function": {"name": "read_file", "description": "DESC-SECRET-ECHO",
        "parameters": {"type": "object", "properties": {"SCHEMA-SECRET-FOXTROT": {"type": "string"}}}}}]);
    let openai = |stream: bool| {
        serde_json::json!({
        "model": "gemma-test", "stream": stream, "tools": tools,
        "messages": [
            {"role": "system", "content": "SYSTEM-SECRET-ALPHA"},
            {"role": "user", "content": "USER-SECRET-BRAVO"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"ARG-SECRET-CHARLIE\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "RESULT-SECRET-DELTA"}
        ]})
    };
    let anthropic = |stream: bool| {
        serde_json::json!({
        "model": "gemma-test", "stream": stream, "max_tokens": 20,
        "system": [{"type": "text", "text": "SYSTEM-SECRET-ALPHA", "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "read_file", "description": "DESC-SECRET-ECHO", "input_schema": {"type": "object", "properties": {"SCHEMA-SECRET-FOXTROT": {"type": "string"}}}}],
        "messages": [
            {"role": "user", "content": "USER-SECRET-BRAVO"},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "THINK-SECRET-INDIA", "signature": "s"},
                {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "ARG-SECRET-CHARLIE"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "RESULT-SECRET-DELTA"}]}]}
        ]})
    };
    let options = Options {
        mode: BodyMode::Digest,
        ..Options::default()
    };
    let proxy = start_proxy(upstream, "digest", options).await;
    let mut c = client(proxy.addr).await;
    for body in [openai(false), openai(true)] {
        send(&mut c, post(CHAT, body.to_string()))
            .await
            .into_body()
            .collect()
            .await
            .unwrap();
    }
    for body in [anthropic(false), anthropic(true)] {
        send(&mut c, post("/v1/messages", body.to_string()))
            .await
            .into_body()
            .collect()
            .await
            .unwrap();
    }
    for path in ["/v1/models", "/v1/fail"] {
        let request = hyper::Request::get(path)
            .header("host", "x")
            .body(http_body_util::Full::new(Bytes::new()))
            .unwrap();
        send(&mut c, request)
            .await
            .into_body()
            .collect()
            .await
            .unwrap();
    }
    let records = proxy.stop().await;
    let text = std::fs::read_to_string(support::temp_file_path("digest.jsonl")).unwrap();
    for secret in secrets {
        assert!(
            !text.contains(secret),
            "{secret} leaked into the digest recording"
        );
    }
    for kept in [
        "gemma-test",
        "read_file",
        "call_1",
        "toolu_1",
        "call_7",
        "toolu_9",
        "cache_read_input_tokens",
    ] {
        assert!(text.contains(kept), "{kept} should be kept");
    }
    assert_eq!(records.len(), 6);
    let anthropic_stream = &records[3];
    let usage = &anthropic_stream
        .response
        .as_ref()
        .unwrap()
        .digest
        .as_ref()
        .unwrap()
        .usage;
    assert_eq!(usage["usage"]["cache_read_input_tokens"], 40);
    assert_eq!(usage["usage"]["output_tokens"], 9);
    let request = anthropic_stream.request.digest.as_ref().unwrap();
    assert_eq!(
        request
            .messages
            .iter()
            .map(|m| m.role.as_str())
            .collect::<Vec<_>>(),
        ["system", "user", "assistant", "tool"]
    );
    // Full and digest agree on identity: the OpenAI and Anthropic forms of one conversation hash alike
    // where they say the same thing (the user message).
    assert_eq!(
        request.messages[1].hash,
        records[0].request.digest.as_ref().unwrap().messages[1].hash
    );
}

/// Session headers are recorded by allowlist with id-shaped values; names that merely contain
/// `session` or `conversation` (signatures, JWTs, passphrases, bearer tokens) are forwarded and
/// never recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_headers_are_recorded_by_allowlist_with_id_shaped_values_only() {
    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let upstream = {
        let seen = Arc::clone(&seen);
        fake_upstream(handler(move |req| {
            seen.lock().unwrap().push(req.headers().clone());
            async move { Response::new(full("{}")) }
        }))
        .await
    };
    let proxy = start_proxy(upstream, "session-headers", Options::default()).await;
    let mut c = client(proxy.addr).await;
    let mut request = post(CHAT, "{}");
    let sent = [
        ("x-session-signature", "SIG-SECRET-1"),
        ("x-conversation-jwt", "JWT-SECRET-2"),
        ("x-session-passphrase", "PASS-SECRET-3"),
        ("x-session-bearer", "BEARER-SECRET-4"),
        ("x-session-id", "sess-42"),
        ("x-conversation-id", "Bearer SECRET-5"),
    ];
    for (name, value) in sent {
        request.headers_mut().insert(name, value.parse().unwrap());
    }
    c.send_request(request).await.unwrap();
    let records = proxy.stop().await;
    let forwarded = &seen.lock().unwrap()[0];
    for (name, value) in sent {
        assert_eq!(forwarded[name], value, "{name} is forwarded unchanged");
    }
    let recorded = &records[0].request.headers;
    assert_eq!(
        recorded.get("x-session-id").map(String::as_str),
        Some("sess-42")
    );
    let line = serde_json::to_string(&records[0]).unwrap();
    assert!(!line.contains("SECRET"), "{line}");
    for name in [
        "x-session-signature",
        "x-conversation-jwt",
        "x-session-passphrase",
        "x-session-bearer",
        // Allowed name, but the value is no id.
        "x-conversation-id",
    ] {
        assert!(!recorded.contains_key(name), "{name}: {recorded:?}");
    }
}

/// A request is handed over at its start, whole, before the upstream has answered (the live
/// slot predictions read it); a channel nobody empties drops starts and counts them, and
/// never holds a request back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_announced_at_its_start_and_a_full_channel_never_holds_it_back() {
    let gate: Arc<Mutex<Option<oneshot::Receiver<()>>>> = Arc::default();
    let (open_gate, gate_rx) = oneshot::channel();
    *gate.lock().unwrap() = Some(gate_rx);
    let upstream = {
        let gate = Arc::clone(&gate);
        fake_upstream(handler(move |_req| {
            let gate = gate.lock().unwrap().take();
            async move {
                if let Some(gate) = gate {
                    let _ = gate.await;
                }
                Response::new(full(r#"{"choices":[]}"#))
            }
        }))
        .await
    };
    let (starts_tx, starts) = crossbeam_channel::bounded(1);
    let options = Options {
        request_starts: Some(starts_tx),
        ..Options::default()
    };
    let proxy = start_proxy(upstream, "starts", options).await;
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let mut first = client(proxy.addr).await;
    let answered = tokio::spawn(async move { first.send_request(post(CHAT, body)).await });
    let start = tokio::task::spawn_blocking(move || {
        let start = starts.recv_timeout(Duration::from_secs(10));
        (start, starts)
    });
    let (start, starts) = start.await.unwrap();
    let start = start.expect("the start arrives while the upstream holds the response");
    assert!(!answered.is_finished());
    assert_eq!(start.path, CHAT);
    assert_eq!(start.request_body.as_deref(), Some(body.as_bytes()));
    assert!(start.response.is_none());
    open_gate.send(()).unwrap();
    assert_eq!(answered.await.unwrap().unwrap().status(), 200);
    // The channel holds one start and nobody takes it: the others are dropped and counted.
    for _ in 0..3 {
        let response = client(proxy.addr)
            .await
            .send_request(post(CHAT, body))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(
        proxy
            .stats
            .starts_dropped
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    assert_eq!(starts.len(), 1);
    assert_eq!(proxy.stop().await.len(), 4);
}

/// A scripted upstream that speaks HTTP/1.1 itself: for the n-th request (counted across its
/// connections from 1; a head and a `content-length` body) it writes `answer(n)`'s bytes, then
/// closes the connection if `answer` says so. Returns its address and how many connections it
/// accepted.
async fn raw_upstream(
    answer: impl Fn(usize) -> (Vec<u8>, bool) + Send + Sync + 'static,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let answer = Arc::new(answer);
    let counted = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let (answer, requests) = (Arc::clone(&answer), Arc::clone(&requests));
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let Some((_, body_end)) = read_message(&mut stream, &mut buf).await else {
                        return;
                    };
                    buf.drain(..body_end);
                    let n = requests.fetch_add(1, Ordering::SeqCst) + 1;
                    let (bytes, close) = answer(n);
                    if stream.write_all(&bytes).await.is_err() || close {
                        return;
                    }
                }
            });
        }
    });
    (addr, accepted)
}

/// Reads one response (head and `content-length` body) from the proxy: head, body.
async fn read_response(stream: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> (String, Vec<u8>) {
    let (head, end) = tokio::time::timeout(Duration::from_secs(10), read_message(stream, buf))
        .await
        .expect("a response in time")
        .expect("a response");
    let body = buf[head.len()..end].to_vec();
    buf.drain(..end);
    (head, body)
}

/// Answers after an informational one, and an answer with no length (it ends when the upstream
/// closes): each reaches the client whole, the second chunked, and the next request reaches the
/// upstream on a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_without_a_length_or_after_an_informational_one_arrive_whole() {
    let (upstream, accepted) = raw_upstream(|n| match n {
        1 => (
            b"HTTP/1.1 103 Early Hints\r\nlink: </s>\r\n\r\nHTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"first\":1}".to_vec(),
            false,
        ),
        2 => (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{\"second\":2}".to_vec(),
            true,
        ),
        _ => (
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"third\":3}".to_vec(),
            false,
        ),
    })
    .await;
    let proxy = start_proxy(upstream, "until-close", Options::default()).await;
    let mut client_conn = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let request = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
    client_conn.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let (head, body) = read_response(&mut client_conn, &mut buf).await;
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert_eq!(body, b"{\"first\":1}");
    client_conn.write_all(request.as_bytes()).await.unwrap();
    // The answer without a length reaches the client chunked, on a connection kept open.
    let rest = tokio::time::timeout(Duration::from_secs(10), async {
        let mut chunk = [0u8; 4096];
        loop {
            if buf.ends_with(b"0\r\n\r\n") {
                return String::from_utf8(std::mem::take(&mut buf)).unwrap();
            }
            let n = client_conn.read(&mut chunk).await.unwrap();
            assert!(n > 0, "{}", String::from_utf8_lossy(&buf));
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .expect("the second answer whole");
    assert!(rest.starts_with("HTTP/1.1 200 OK\r\n"), "{rest}");
    assert!(rest.contains("\r\n{\"second\":2}\r\n"), "{rest}");
    let response = client(proxy.addr)
        .await
        .send_request(post(CHAT, "{}"))
        .await
        .unwrap();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, Bytes::from_static(b"{\"third\":3}"));
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    let records = proxy.stop().await;
    let bodies: Vec<_> = records
        .iter()
        .map(|r| r.response.as_ref().unwrap().body.clone().unwrap())
        .collect();
    assert_eq!(
        bodies,
        [
            serde_json::json!({"first": 1}),
            serde_json::json!({"second": 2}),
            serde_json::json!({"third": 3})
        ]
    );
    assert!(records.iter().all(|r| r.error.is_none()), "{records:?}");
}

/// Two requests sent at once, the second asking to close: both answered in order, the second
/// saying it closes, then the connection ends; each is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order_and_a_client_s_close_is_kept() {
    let upstream = body_echo_upstream().await;
    let proxy = start_proxy(upstream, "pipelined", Options::default()).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n{\"a\":1}POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\nConnection: close\r\n\r\n{\"b\":2}")
        .await
        .unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut all))
        .await
        .expect("the connection closes after the second answer")
        .unwrap();
    let all = String::from_utf8(all).unwrap();
    let (first, second) = all.split_at(all.rfind("HTTP/1.1 200").unwrap());
    assert!(
        first.starts_with("HTTP/1.1 200") && first.ends_with("{\"a\":1}"),
        "{all}"
    );
    assert!(!first.contains("connection: close"), "{all}");
    assert!(
        second.contains("connection: close\r\n") && second.ends_with("{\"b\":2}"),
        "{all}"
    );
    let records = proxy.stop().await;
    let bodies: Vec<_> = records
        .iter()
        .map(|r| r.request.body.clone().unwrap())
        .collect();
    assert_eq!(
        bodies,
        [serde_json::json!({"a": 1}), serde_json::json!({"b": 2})]
    );
    assert!(
        records
            .iter()
            .all(|r| r.error.is_none() && r.conn == records[0].conn)
    );
}

/// A HEAD, a chunked body, `Expect: 100-continue` and HTTP/1.0 are served, and the
/// connection goes on after each (a HEAD's answer has no body). Every exchange recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_left_to_hyper_are_served_and_recorded_on_the_same_connection() {
    let upstream = fake_upstream(handler(|req| async move {
        let is_head = req.method() == hyper::Method::HEAD;
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let body = if is_head {
            Bytes::from_static(b"{\"head\":1}")
        } else {
            body
        };
        Response::builder()
            .header("content-type", "application/json")
            .body(full(body))
            .unwrap()
    }))
    .await;
    let proxy = start_proxy(upstream, "hand-off", Options::default()).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let mut buf = Vec::new();
    // A HEAD (its answer says a length and has no body), then a POST.
    stream
        .write_all(b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (head, _) = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end + 4]).into_owned();
                buf.drain(..end + 4);
                return (head, ());
            }
            let mut chunk = [0u8; 4096];
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .unwrap();
    assert!(
        head.starts_with("HTTP/1.1 200") && head.contains("content-length: 10"),
        "{head}"
    );
    for (raw, expected) in [
        (&b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n{\"a\":1}"[..], &b"{\"a\":1}"[..]),
        // Chunked.
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"b\r\n4\r\n\":2}\r\n0\r\n\r\n", b"{\"b\":2}"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n{\"c\":3}", b"{\"c\":3}"),
    ] {
        stream.write_all(raw).await.unwrap();
        let (head, body) = read_response(&mut stream, &mut buf).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(body, expected);
    }
    assert!(buf.is_empty());
    // `Expect: 100-continue` on a new connection: hyper asks for the body, then answers.
    let mut expecting = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    expecting
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\nExpect: 100-continue\r\n\r\n")
        .await
        .unwrap();
    let mut interim = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), expecting.read(&mut interim))
        .await
        .unwrap()
        .unwrap();
    assert!(interim[..n].starts_with(b"HTTP/1.1 100 Continue"));
    expecting.write_all(b"{\"d\":4}").await.unwrap();
    let mut buf = Vec::new();
    let (_, body) = read_response(&mut expecting, &mut buf).await;
    assert_eq!(body, b"{\"d\":4}");
    // HTTP/1.0, which closes after its answer.
    let mut old = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    old.write_all(b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: 7\r\n\r\n{\"e\":5}")
        .await
        .unwrap();
    let mut all = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), old.read_to_end(&mut all))
        .await
        .unwrap()
        .unwrap();
    assert!(
        all.ends_with(b"{\"e\":5}"),
        "{}",
        String::from_utf8_lossy(&all)
    );

    let records = proxy.stop().await;
    assert_eq!(records.len(), 6);
    assert!(records.iter().all(|r| r.error.is_none()), "{records:?}");
    assert_eq!(records[0].request.method, "HEAD");
    assert_eq!(records[0].response.as_ref().unwrap().body_bytes, 0);
    let bodies: Vec<_> = records[1..]
        .iter()
        .map(|r| r.request.body.clone().unwrap())
        .collect();
    let expected: Vec<_> = ["a", "b", "c", "d", "e"]
        .iter()
        .enumerate()
        .map(|(i, k)| serde_json::json!({ *k: i + 1 }))
        .collect();
    assert_eq!(bodies, expected);
    assert!(records[..4].iter().all(|r| r.conn == records[0].conn));
}

/// A client that leaves while the upstream has not answered yet (a long prefill) is seen at
/// once: recorded as gone, and the upstream connection given up; a HEAD the upstream cannot
/// take gets a 502 without a body, so the next answer on the connection reads right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_before_the_answer_and_a_head_s_502_are_handled() {
    // Reads each request and never answers.
    let (slow, _) = raw_upstream(|_| (Vec::new(), false)).await;
    let proxy = start_proxy(slow, "gone-before-head", Options::default()).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        .await
        .unwrap();
    while proxy.stats.in_flight() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let left = std::time::Instant::now();
    drop(stream);
    let record = proxy.next_record().await;
    assert!(
        left.elapsed() < Duration::from_secs(2),
        "{:?}",
        left.elapsed()
    );
    assert_eq!(record.error, Some(ExchangeError::ClientDisconnected));
    assert!(record.response.is_none());
    proxy.stop().await;

    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let proxy = start_proxy(closed, "head-502", Options::default()).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let answers = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let text = String::from_utf8_lossy(&buf).into_owned();
            if text.matches("HTTP/1.1 502").count() == 2 && text.ends_with('}') {
                return text;
            }
            let n = stream.read(&mut chunk).await.unwrap();
            assert!(n > 0, "{text}");
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .unwrap();
    let second = answers.rfind("HTTP/1.1 502").unwrap();
    assert!(
        answers[..second].ends_with("\r\n\r\n"),
        "no body after the HEAD's head: {answers}"
    );
    assert!(answers[second..].contains("\"prefixscope: "), "{answers}");
    let records = proxy.stop().await;
    assert_eq!(records.len(), 2);
    assert!(
        records
            .iter()
            .all(|r| r.error == Some(ExchangeError::UpstreamUnreachable))
    );
}

/// What a client sends, through the proxy: the answers it gets (status lines and bodies), the
/// records (method, target, status, error) and the requests hyper refused.
async fn through_the_proxy(name: &str, send: &[u8], half_close: bool) -> (Vec<String>, u64) {
    // Bodies echoed; `{"a":1}` after a while, so a client's end comes while it is awaited.
    let upstream = fake_upstream(handler(|req| async move {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        if &body[..] == b"{\"a\":1}" {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Response::builder()
            .header("content-type", "application/json")
            .body(full(body))
            .unwrap()
    }))
    .await;
    let proxy = start_proxy(upstream, name, Options::default()).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(send).await.unwrap();
    if half_close {
        stream.shutdown().await.unwrap();
    }
    let mut answers = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answers))
        .await
        .expect("the proxy closes the connection");
    let answers = String::from_utf8_lossy(&answers);
    let statuses: Vec<&str> = answers
        .lines()
        .filter(|l| l.starts_with("HTTP/1.1 "))
        .map(|l| &l[..12])
        .collect();
    let bodies: Vec<&str> = answers
        .match_indices("{\"")
        .map(|(i, _)| &answers[i..i + 7])
        .collect();
    // Read once the proxy has stopped, which waits for every connection: a refused request is
    // counted as its connection ends, which can be after the client has read the answer.
    let stats = std::sync::Arc::clone(&proxy.stats);
    let records = proxy.stop().await;
    let rejected = stats.rejected.load(std::sync::atomic::Ordering::Relaxed);
    let mut lines: Vec<String> = records
        .iter()
        .map(|r| {
            format!(
                "{} {} {:?} {:?}",
                r.request.method,
                r.request.path,
                r.response.as_ref().map(|x| x.status),
                r.error
            )
        })
        .collect();
    lines.insert(0, format!("answers {statuses:?} {bodies:?}"));
    (lines, rejected)
}

/// A client that pipelines two requests and then shuts its sending side while the first is
/// answered gets the first answer, and a record for it. Targets and lengths hyper's server
/// refuses are refused (400 or 414) and counted, with no record; a repeated equal length is
/// answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_pipeline_is_answered_and_requests_hyper_refuses_are_counted() {
    let pipelined: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n{\"a\":1}POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n{\"b\":2}";
    let (lines, _) = through_the_proxy("half-closed", pipelined, true).await;
    // hyper's server answers the second only when it has read it before the client's end (a
    // race; the lost one leaves no record).
    assert!(
        lines.len() >= 2 && lines[1] == "POST /v1/chat/completions Some(200) None",
        "{lines:#?}"
    );
    let long = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(70_000)).into_bytes();
    for (name, send) in [
        (
            "angle-target",
            &b"GET /v1/models<x> HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        ),
        (
            "quoted-query",
            b"GET /v1/models?q=\"a\" HTTP/1.1\r\nHost: x\r\n\r\n",
        ),
        (
            "length-list",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2, 2\r\n\r\n{}",
        ),
        ("long-target", &long),
    ] {
        let (lines, rejected) = through_the_proxy(name, send, false).await;
        assert_eq!(rejected, 1, "{name}: {lines:#?}");
        assert_eq!(lines.len(), 1, "{name}: recorded {lines:#?}");
        assert!(
            lines[0].contains("HTTP/1.1 400") || lines[0].contains("HTTP/1.1 414"),
            "{name}: {lines:#?}"
        );
    }
    let (lines, rejected) = through_the_proxy(
        "length-twice",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        false,
    )
    .await;
    assert_eq!(rejected, 0, "{lines:#?}");
    assert_eq!(
        lines[1], "POST /v1/chat/completions Some(200) None",
        "{lines:#?}"
    );
}

/// An upstream that answers each connection's first request with `answer`'s bytes (after
/// reading its head and, unless `read_body` is false, its `content-length` body) and closes;
/// the request head it read comes back on the channel.
async fn scripted_upstream(
    answer: &'static [u8],
    read_body: bool,
) -> (
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (heads_tx, heads) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let heads_tx = heads_tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let head = loop {
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break String::from_utf8_lossy(&buf[..end + 4]).into_owned();
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                };
                if read_body {
                    let _ = read_message(&mut stream, &mut buf).await;
                }
                let _ = heads_tx.send(head);
                let _ = stream.write_all(answer).await;
                let _ = stream.shutdown().await;
                // Whatever else comes is read and dropped until the client closes.
                while matches!(stream.read(&mut chunk).await, Ok(n) if n > 0) {}
            });
        }
    });
    (addr, heads)
}

/// Sends `request` through a proxy in front of `scripted_upstream(answer)`: what the client
/// read until the proxy closed, the head the upstream got, and the records.
async fn exchange_raw(
    name: &str,
    answer: &'static [u8],
    read_body: bool,
    request: &[u8],
) -> (String, String, Vec<Record>) {
    let (upstream, mut heads) = scripted_upstream(answer, read_body).await;
    let proxy = start_proxy(upstream, name, Options::default()).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let _ = stream.write_all(request).await;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{name}: the proxy never closed: {}",
                String::from_utf8_lossy(&got)
            )
        })
        .unwrap();
    let head = heads.try_recv().unwrap_or_default();
    let records = tokio::time::timeout(Duration::from_secs(10), proxy.stop())
        .await
        .unwrap_or_else(|_| panic!("{name}: the proxy did not stop"));
    (String::from_utf8_lossy(&got).into_owned(), head, records)
}

const CLOSING_POST: &[u8] = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Mixed-Case: 1\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";

/// Header names reach the upstream and the client in the case they were sent, the upstream's
/// status line and body byte for byte, and no `date` is added to an answer that had none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_case_status_and_body_pass_as_sent_and_no_date_is_added() {
    let (got, head, records) = exchange_raw(
        "case",
        b"HTTP/1.1 201 Made It\r\nX-Upstream-Case: 2\r\nContent-Type: application/json\r\nContent-Length: 8\r\n\r\n{\"a\": 1}",
        true,
        CLOSING_POST,
    )
    .await;
    assert!(head.contains("X-Mixed-Case: 1\r\n"), "{head}");
    assert!(got.starts_with("HTTP/1.1 201 Made It\r\n"), "{got}");
    assert!(got.contains("X-Upstream-Case: 2\r\n"), "{got}");
    assert!(!got.to_ascii_lowercase().contains("\ndate:"), "{got}");
    assert!(got.ends_with("\r\n\r\n{\"a\": 1}"), "{got}");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].error, None);
}

/// An answer framed by chunks that also says a length (RFC 9112: the length is not the
/// body's) reaches the client whole, without that length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_answer_with_a_length_beside_it_is_forwarded_whole() {
    let (got, _, records) = exchange_raw(
        "length-and-chunks",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"ok\"\r\n4\r\n:1}\n\r\n0\r\n\r\n",
        true,
        CLOSING_POST,
    )
    .await;
    assert!(
        !got.to_ascii_lowercase().contains("content-length: 3"),
        "{got}"
    );
    assert!(got.contains("{\"ok\"") && got.contains(":1}"), "{got}");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].error, None);
    assert_eq!(
        records[0].response.as_ref().unwrap().body,
        Some(serde_json::json!({"ok": 1}))
    );
}

/// An answer with trailers is a complete exchange; one whose trailer line ends in a bare LF
/// ends when the upstream closes, recorded as cut with the body that came.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_with_trailers_are_complete_and_a_bare_lf_trailer_ends_the_exchange() {
    let (got, _, records) = exchange_raw(
        "trailers",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nTrailer: x-checksum\r\n\r\n8\r\n{\"a\": 1}\r\n0\r\nx-checksum: 7\r\n\r\n",
        true,
        CLOSING_POST,
    )
    .await;
    assert!(got.contains("{\"a\": 1}"), "{got}");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].error, None, "{records:?}");
    assert_eq!(records[0].response.as_ref().unwrap().status, 200);

    // hyper reads `x-checksum: 7\n` as the start of a trailer line and waits for its end; the
    // upstream's close ends the exchange, recorded as cut with what came.
    let (_, _, records) = exchange_raw(
        "bare-lf-trailer",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n{\"a\": 1}\r\n0\r\nx-checksum: 7\n\r\n",
        true,
        CLOSING_POST,
    )
    .await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].error, Some(ExchangeError::UpstreamReset));
    assert_eq!(
        records[0].response.as_ref().unwrap().body,
        Some(serde_json::json!({"a": 1}))
    );
}

/// An upstream that answers before it has read the body (a 413 for a body too large) and
/// closes: the client gets that answer, and the exchange is recorded with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_early_answer_before_the_body_is_read_is_delivered() {
    let mut request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 4000000\r\nConnection: close\r\n\r\n".to_vec();
    request.extend(std::iter::repeat_n(b' ', 4_000_000));
    let (got, _, records) = exchange_raw(
        "early-413",
        b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: application/json\r\nContent-Length: 17\r\nConnection: close\r\n\r\n{\"error\":\"big\"}\n\n",
        false,
        &request,
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 413"), "{got}");
    assert!(got.ends_with("{\"error\":\"big\"}\n\n"), "{got}");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].response.as_ref().map(|r| r.status), Some(413));
}

/// A client that sends part of a body and then nothing gets a 408 after the header timeout
/// (the connection is not held for ever), counted; the exchange is recorded as the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_request_body_is_answered_408_after_the_header_timeout() {
    let upstream = body_echo_upstream().await;
    let options = Options {
        header_timeout: Duration::from_millis(500),
        ..Options::default()
    };
    let proxy = start_proxy(upstream, "stalled-body", options).await;
    let mut stream = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"a\":",
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut got))
        .await
        .expect("the proxy answers and closes");
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("stalled"), "{got}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        proxy
            .stats
            .body_timeouts
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let records = proxy.stop().await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].error, Some(ExchangeError::ClientDisconnected));
}

/// An upstream that answers each request after `hold`, counting how many it holds at once.
async fn holding_upstream(
    hold: Duration,
    at_once: Arc<(
        std::sync::atomic::AtomicUsize,
        std::sync::atomic::AtomicUsize,
    )>,
) -> std::net::SocketAddr {
    fake_upstream(handler(move |req| {
        let at_once = Arc::clone(&at_once);
        async move {
            let _ = req.into_body().collect().await.unwrap();
            let now = at_once.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            at_once
                .1
                .fetch_max(now, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(hold).await;
            at_once.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            Response::builder()
                .header("content-type", "application/json")
                .body(full("{}"))
                .unwrap()
        }
    }))
    .await
}

/// The request bodies held at once stay within the body budget: with room for one 600 KiB
/// body, three sent together are read one at a time (each waits for the room the one before
/// gives back when its exchange ends), and all are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_wait_for_room_in_the_body_budget() {
    let at_once = Arc::new(Default::default());
    let upstream = holding_upstream(Duration::from_millis(300), Arc::clone(&at_once)).await;
    let options = Options {
        max_body: 1 << 20,
        body_budget: 1 << 20,
        header_timeout: Duration::from_secs(10),
        ..Options::default()
    };
    let proxy = start_proxy(upstream, "body-budget-wait", options).await;
    let addr = proxy.addr;
    let sends: Vec<_> = (0..3)
        .map(|_| tokio::spawn(async move { post_raw(addr, &vec![b' '; 600 << 10]).await }))
        .collect();
    for send in sends {
        let status = send.await.unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    }
    assert_eq!(at_once.1.load(std::sync::atomic::Ordering::SeqCst), 1);
    let records = proxy.stop().await;
    assert_eq!(records.len(), 3);
}

/// A request that finds no room in the body budget within the header timeout is answered 503,
/// counted, and not recorded (it never reached the server); the others go through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_with_no_room_in_the_body_budget_is_answered_503() {
    let at_once = Arc::new(Default::default());
    let upstream = holding_upstream(Duration::from_secs(3), Arc::clone(&at_once)).await;
    let options = Options {
        max_body: 1 << 20,
        body_budget: 1 << 20,
        header_timeout: Duration::from_millis(300),
        ..Options::default()
    };
    let proxy = start_proxy(upstream, "body-budget-full", options).await;
    let addr = proxy.addr;
    let first = tokio::spawn(async move { post_raw(addr, &vec![b' '; 600 << 10]).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = post_raw(addr, &vec![b' '; 600 << 10]).await;
    assert!(second.starts_with("HTTP/1.1 503"), "{second}");
    // A small body still fits beside the first.
    let small = post_raw(addr, &vec![b' '; 1_000]).await;
    assert!(small.starts_with("HTTP/1.1 200"), "{small}");
    assert!(first.await.unwrap().starts_with("HTTP/1.1 200"));
    assert_eq!(
        proxy
            .stats
            .body_budget_refusals
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let records = proxy.stop().await;
    assert_eq!(records.len(), 2);
}
