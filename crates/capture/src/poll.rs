//! The edge that asks: GET requests to the upstream on a task of the capture's runtime, never on
//! the proxy's request path, each answer read by the pure `probe` and recorded (through the
//! recorder) only when it changed. Feature `net`.
//!
//! Probe records have ids of their own (`PROBE_ID_BASE` on), so the exchanges' ids are the
//! same with or without probing.
//!
//! What a monitoring client would send and nothing else: `GET` only (never Ollama's `POST
//! /api/show`), our own user agent, a 2 s limit per request. A path that answers 404, 405, an
//! error or nothing in time is not asked again this session; an upstream that refuses the
//! connection is recorded once as unreachable and the whole set asked again 30 s later, with no
//! other word.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, header};

use crate::http1;
use crate::proxy::Upstream;
use crate::recorder::CaptureSender;
use prefixscope_core::probe::{
    Answer, Changes, Endpoint, MAX_PROBE_BODY_BYTES, USER_AGENT, probe_capture,
};

/// One request (connect included) gets this long.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// `watch` asks again this often.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(5);
/// After the upstream refused the connection, the whole set is asked again this much later.
pub const PROBE_BACKOFF: Duration = Duration::from_secs(30);

/// When to ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    /// Never (tests, an https upstream).
    #[default]
    Off,
    /// `record`: once at the start, what the server is (`Endpoint::AT_START`).
    Once,
    /// `watch`: every endpoint at the start, then every `PROBE_INTERVAL`.
    Watch,
}

/// Where the probe records go and how they are numbered.
pub struct Poller {
    pub upstream: Upstream,
    pub captures: CaptureSender<Bytes>,
    /// The next probe record's id (from `PROBE_ID_BASE`).
    pub next_id: AtomicU64,
    pub schedule: Schedule,
    /// `watch`'s pause between rounds (`PROBE_INTERVAL`) and after a round that found the
    /// upstream down (`PROBE_BACKOFF`); tests shorten them.
    pub interval: Duration,
    pub backoff: Duration,
}

impl Poller {
    /// A poller at the session's pace (`PROBE_INTERVAL`, `PROBE_BACKOFF`).
    pub fn new(upstream: Upstream, captures: CaptureSender<Bytes>, schedule: Schedule) -> Poller {
        Poller {
            upstream,
            captures,
            next_id: AtomicU64::new(prefixscope_core::probe::PROBE_ID_BASE),
            schedule,
            interval: PROBE_INTERVAL,
            backoff: PROBE_BACKOFF,
        }
    }
}

enum Failure {
    /// The upstream is not there (connection refused, no connection in time).
    Down(String),
    /// It was there, but this path did not answer (in time, or whole).
    NoAnswer(String),
}

impl Poller {
    /// Asks as the schedule says; returns when it is done (`Once`) or never (`Watch`: the
    /// runtime's end drops it).
    pub async fn run(self) {
        let endpoints: &[Endpoint] = match self.schedule {
            Schedule::Off => return,
            Schedule::Once => &Endpoint::AT_START,
            Schedule::Watch => &Endpoint::ALL,
        };
        if self.upstream.https {
            // The probe speaks plain HTTP only (as the tokenizer does); a TLS upstream is a
            // hosted API, which has none of these paths anyway.
            return;
        }
        let mut changes = Changes::default();
        let mut unavailable: BTreeSet<Endpoint> = BTreeSet::new();
        loop {
            let down = self.round(endpoints, &mut changes, &mut unavailable).await;
            let pause = match (self.schedule, down) {
                (Schedule::Watch, true) => self.backoff,
                (Schedule::Watch, false) => self.interval,
                _ => return,
            };
            tokio::time::sleep(pause).await;
        }
    }

    /// One pass over the endpoints still asked; whether the upstream was down.
    async fn round(
        &self,
        endpoints: &[Endpoint],
        changes: &mut Changes,
        unavailable: &mut BTreeSet<Endpoint>,
    ) -> bool {
        let mut connection: Option<http1::Sender> = None;
        let asked: Vec<Endpoint> = endpoints
            .iter()
            .copied()
            .filter(|e| !unavailable.contains(e))
            .collect();
        for &endpoint in &asked {
            let started = crate::proxy::now_ms();
            let path = format!("{}{}", self.upstream.prefix, endpoint.path());
            let (status, answer) = match self.get(&mut connection, &path).await {
                Ok((status, body)) => (
                    Some(status),
                    prefixscope_core::probe::read_answer(endpoint, status, &body),
                ),
                Err(Failure::NoAnswer(why)) => (None, Answer::Unavailable(why)),
                Err(Failure::Down(why)) => {
                    // Said once (a record when it changed), under the first path asked: the
                    // first again next time, whose answer then says the upstream is back.
                    let first = asked[0];
                    let answer = Answer::Unreachable(why);
                    if changes.changed(first, &answer) {
                        let path = format!("{}{}", self.upstream.prefix, first.path());
                        self.record(first, &path, started, None, &answer, changes);
                    }
                    return true;
                }
            };
            if matches!(answer, Answer::Unavailable(_)) {
                unavailable.insert(endpoint);
            }
            // The upstream answered: a down state recorded earlier is over (the next recorded
            // answer says so; the first path's is asked first).
            if changes.changed(endpoint, &answer) {
                self.record(endpoint, &path, started, status, &answer, changes);
            }
        }
        false
    }

    fn record(
        &self,
        endpoint: Endpoint,
        path: &str,
        started: i64,
        status: Option<u16>,
        answer: &Answer,
        changes: &mut Changes,
    ) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let capture = probe_capture(id, (started, crate::proxy::now_ms()), path, status, answer);
        // Never wait for the recorder: a probe that finds it busy is recorded next time.
        if self.captures.try_send(capture).is_some() {
            changes.forget(endpoint);
        }
    }

    async fn get(
        &self,
        connection: &mut Option<http1::Sender>,
        path: &str,
    ) -> Result<(u16, Vec<u8>), Failure> {
        for attempt in 0..2 {
            let reused = connection.as_ref().is_some_and(|s| !s.is_closed());
            if !reused {
                *connection = Some(self.connect().await?);
            }
            let Some(sender) = connection.as_mut() else {
                return Err(Failure::Down("no connection".into()));
            };
            let request = Request::builder()
                .method(Method::GET)
                .uri(path)
                .header(header::HOST, self.upstream.authority())
                .header(header::USER_AGENT, USER_AGENT)
                .header(header::ACCEPT, "application/json, text/plain")
                .body(Full::new(Bytes::new()))
                .map_err(|e| Failure::NoAnswer(format!("{path}: {e}")))?;
            let sent = async {
                sender.ready().await?;
                let response = sender.send_request(request).await?;
                let status = response.status().as_u16();
                let body = Limited::new(response.into_body(), MAX_PROBE_BODY_BYTES)
                    .collect()
                    .await;
                Ok::<_, hyper::Error>((status, body.map(|b| b.to_bytes().to_vec())))
            };
            match tokio::time::timeout(PROBE_TIMEOUT, sent).await {
                Ok(Ok((status, Ok(body)))) => return Ok((status, body)),
                Ok(Ok((status, Err(_)))) => {
                    *connection = None;
                    return Err(Failure::NoAnswer(format!(
                        "{path} answered {status} with more than {MAX_PROBE_BODY_BYTES} bytes, or cut off"
                    )));
                }
                Ok(Err(e)) => {
                    *connection = None;
                    // A kept-alive connection the server closed meanwhile: once more, anew.
                    if reused && attempt == 0 {
                        continue;
                    }
                    return Err(Failure::NoAnswer(format!("{path}: {e}")));
                }
                Err(_) => {
                    *connection = None;
                    return Err(Failure::NoAnswer(format!(
                        "{path}: no answer in {} s",
                        PROBE_TIMEOUT.as_secs()
                    )));
                }
            }
        }
        Err(Failure::NoAnswer(format!("{path}: the connection closed")))
    }

    async fn connect(&self) -> Result<http1::Sender, Failure> {
        let address = (self.upstream.host.as_str(), self.upstream.port);
        match tokio::time::timeout(PROBE_TIMEOUT, http1::connect(address)).await {
            Ok(Ok(sender)) => Ok(sender),
            Ok(Err(e)) => Err(Failure::Down(format!("{}: {e}", self.upstream.authority()))),
            Err(_) => Err(Failure::Down(format!(
                "{}: no connection in {} s",
                self.upstream.authority(),
                PROBE_TIMEOUT.as_secs()
            ))),
        }
    }
}
