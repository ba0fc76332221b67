//! Proxy resources under hostile and heavy clients (issue #17, item 5), on loopback: slow-header
//! clients are cut off by the header timeout, idle connections by the same timeout, requests
//! hyper refuses are counted, and active clients are served while idle connections hold
//! descriptors. A quick variant (200 idle connections, a 1 s header timeout) and a full one (as
//! many idle connections as the descriptor limit allows, up to 10,000, and 100 active clients;
//! about 10 s on two cores).

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use hyper::Response;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use support::*;

const CHAT: &str = "/v1/chat/completions";

async fn echo_upstream() -> SocketAddr {
    fake_upstream(handler(
        |request: hyper::Request<hyper::body::Incoming>| async move {
            let body = request.into_body().collect().await.unwrap().to_bytes();
            Response::builder()
                .header("content-type", "application/json")
                .body(full(body))
                .unwrap()
        },
    ))
    .await
}

/// A client that sends a request head one byte at a time, `gap` apart, and never finishes it.
/// Returns how long the proxy kept the connection open.
async fn slowloris(proxy: SocketAddr, gap: Duration) -> Duration {
    let started = Instant::now();
    let Ok(mut stream) = TcpStream::connect(proxy).await else {
        return Duration::ZERO;
    };
    let head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ";
    for &byte in head.iter().chain(std::iter::repeat(&b'a')) {
        if stream.write_all(&[byte]).await.is_err() {
            break;
        }
        // A closed connection reads EOF (or an error) at once.
        let mut buf = [0u8; 256];
        match tokio::time::timeout(gap, stream.read(&mut buf)).await {
            Ok(Ok(_)) | Ok(Err(_)) => break,
            Err(_) => {}
        }
        if started.elapsed() > Duration::from_secs(60) {
            break;
        }
    }
    started.elapsed()
}

/// Opens `n` connections that send nothing.
async fn idle_connections(proxy: SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        match TcpStream::connect(proxy).await {
            Ok(stream) => held.push(stream),
            Err(e) => {
                eprintln!("stopped opening idle connections at {}: {e}", held.len());
                break;
            }
        }
    }
    held
}

/// `clients` clients, `requests` requests each; returns how many got a 200 with their body back.
async fn active_clients(proxy: SocketAddr, clients: usize, requests: usize) -> usize {
    let mut tasks = Vec::new();
    for c in 0..clients {
        tasks.push(tokio::spawn(async move {
            let mut ok = 0;
            let mut sender = client(proxy).await;
            for r in 0..requests {
                let body = format!("{{\"client\":{c},\"request\":{r}}}");
                let Ok(response) = sender.send_request(post(CHAT, body.clone())).await else {
                    break;
                };
                let status = response.status();
                let got = response.into_body().collect().await.unwrap().to_bytes();
                if status == 200 && got == body.as_bytes() {
                    ok += 1;
                }
            }
            ok
        }));
    }
    let mut ok = 0;
    for task in tasks {
        ok += task.await.unwrap_or(0);
    }
    ok
}

/// Whether the proxy closed an idle connection (EOF) within `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(within, stream.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

async fn run_load(idle: usize, active: usize, requests: usize, header_timeout: Duration) {
    let upstream = echo_upstream().await;
    let options = Options {
        header_timeout,
        ..Options::default()
    };
    let proxy = start_proxy(upstream, &format!("load-{idle}"), options).await;
    let addr = proxy.addr;
    let started = Instant::now();

    // 20 slowloris clients, a byte every 100 ms: cut off at the header timeout.
    let slow: Vec<_> = (0..20)
        .map(|_| tokio::spawn(slowloris(addr, Duration::from_millis(100))))
        .collect();
    let mut held = idle_connections(addr, idle).await;
    eprintln!(
        "{} idle connections open after {:?}",
        held.len(),
        started.elapsed()
    );
    let served = active_clients(addr, active, requests).await;
    eprintln!(
        "{served} of {} requests served beside them after {:?}",
        active * requests,
        started.elapsed()
    );
    assert_eq!(served, active * requests);

    for task in slow {
        let kept = task.await.unwrap();
        assert!(
            kept < header_timeout + Duration::from_secs(5),
            "a slowloris client was kept {kept:?}"
        );
    }
    // Idle connections are closed by the same timeout.
    let mut closed = 0;
    for stream in held.iter_mut().take(50) {
        if closed_within(stream, header_timeout + Duration::from_secs(5)).await {
            closed += 1;
        }
    }
    assert_eq!(closed, held.len().min(50));
    drop(held);
    // A kept-alive connection idle after its request: closed by the same timeout.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
        .await
        .unwrap();
    let mut answer = [0u8; 4096];
    let n = kept.read(&mut answer).await.unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 200"));
    let idle_since = Instant::now();
    assert!(closed_within(&mut kept, header_timeout + Duration::from_secs(5)).await);
    let idle_for = idle_since.elapsed();
    eprintln!("a kept-alive connection closed after {idle_for:?} idle");
    assert!(
        idle_for + Duration::from_millis(100) >= header_timeout,
        "{idle_for:?}"
    );
    tokio::time::sleep(Duration::from_millis(200)).await;
    let timeouts = proxy.stats.header_timeouts.load(Ordering::Relaxed);
    eprintln!("{timeouts} connections closed by the header timeout");
    assert!(timeouts >= 20, "{timeouts}");
    let records = proxy.stop().await;
    assert_eq!(records.len(), active * requests + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_idle_clients_are_cut_off_and_active_ones_served() {
    run_load(200, 20, 5, Duration::from_secs(1)).await;
}

/// As many idle connections as the descriptor limit allows (two descriptors each in this
/// process: the client's and the proxy's), up to 10,000, plus 100 active clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_idle_connections_and_a_hundred_active_clients() {
    let limit = prefixscope_capture::proxy::raise_descriptor_limit().map_or(1024, |l| l.now);
    let idle = usize::try_from(limit.saturating_sub(1000) / 2)
        .unwrap_or(10_000)
        .min(10_000);
    eprintln!("descriptor limit {limit}: {idle} idle connections");
    run_load(idle, 100, 10, Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_hyper_refuses_are_counted_and_answered() {
    let upstream = echo_upstream().await;
    let proxy = start_proxy(upstream, "refused", Options::default()).await;
    let mut answers = Vec::new();
    let long_header = format!(
        "GET / HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "a".repeat(1 << 20)
    );
    for raw in [
        b"NOT HTTP AT ALL\r\n\r\n".to_vec(),
        long_header.into_bytes(),
    ] {
        let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
        let _ = stream.write_all(&raw).await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
        answers.push(String::from_utf8_lossy(&answer).into_owned());
    }
    assert!(answers[0].starts_with("HTTP/1.1 400"), "{}", answers[0]);
    assert!(answers[1].starts_with("HTTP/1.1 431"), "{}", answers[1]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(proxy.stats.rejected.load(Ordering::Relaxed), 2);
    assert!(proxy.stats.last_rejection().is_some());
    let stats = Arc::clone(&proxy.stats);
    let records = proxy.stop().await;
    assert!(records.is_empty());
    assert_eq!(stats.exchanges.load(Ordering::Relaxed), 0);
}

/// The header timeout is about request heads only: a response the upstream takes longer than it
/// to start (a long prefill) still arrives, on the same kept-alive connection as the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_response_outlives_the_header_timeout() {
    let upstream = fake_upstream(handler(
        |_request: hyper::Request<hyper::body::Incoming>| async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            Response::builder()
                .header("content-type", "application/json")
                .body(full("{\"slow\":true}"))
                .unwrap()
        },
    ))
    .await;
    let options = Options {
        header_timeout: Duration::from_millis(500),
        ..Options::default()
    };
    let proxy = start_proxy(upstream, "slow-response", options).await;
    let mut sender = client(proxy.addr).await;
    for _ in 0..2 {
        // The client's connection takes the next request once it has finished the last.
        sender.ready().await.unwrap();
        let response = sender.send_request(post(CHAT, "{}")).await.unwrap();
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, "{\"slow\":true}".as_bytes());
    }
    let records = proxy.stop().await;
    assert_eq!(records.len(), 2);
    assert!(records.iter().all(|r| r.error.is_none()));
}
