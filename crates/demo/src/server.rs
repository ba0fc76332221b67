//! The simulated llama-server's HTTP edge (tokio + hyper, HTTP/1.1): `/v1/chat/completions`
//! (streamed or not), `/apply-template`, `/tokenize`, `/health`, `/v1/models`, `/slots`, `/props`. The decisions are the
//! pure modules' (`kv`, `text`, `model`); this file only queues, sleeps and writes JSON.
//!
//! Like llama-server, at most `slots` requests run at once; the others wait in arrival order
//! (a FIFO semaphore). A request holds its slot until its last byte is sent.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::model::{self, Reply};
use prefixscope_core::sim::{KvCache, KvConfig, Served, ServedLog, ms_for};
use prefixscope_core::sim::{pieces, render_chat, token_id, tokenize};

pub type SimBody = BoxBody<Bytes, Infallible>;

/// How the simulated server behaves.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub kv: KvConfig,
    /// Prompt evaluation speed, tokens per second.
    pub prefill_tps: f64,
    /// Generation speed, tokens per second.
    pub decode_tps: f64,
    /// The model name `/v1/models` and responses carry.
    pub model: String,
    pub n_ctx: usize,
    pub seed: u64,
    /// Words of reasoning before each reply (0: none), sent as `reasoning_content`: a
    /// thinking model's, which clients do not send back.
    pub reasoning_words: usize,
}

impl SimConfig {
    pub fn new(slots: usize, cache_ram: bool) -> SimConfig {
        SimConfig {
            kv: KvConfig::new(slots, cache_ram),
            prefill_tps: 1_500.0,
            decode_tps: 60.0,
            model: "sim-coder-7b-q4_k_m.gguf".into(),
            n_ctx: 32_768,
            seed: 0,
            reasoning_words: 0,
        }
    }
}

/// How much faster than real time the server runs; shared so it can change while running.
#[derive(Debug)]
pub struct Speed(AtomicU64);

impl Speed {
    pub fn new(speed: f64) -> Speed {
        Speed(AtomicU64::new(speed.to_bits()))
    }
    pub fn get(&self) -> f64 {
        let speed = f64::from_bits(self.0.load(Ordering::Relaxed));
        if speed > 0.0 && speed.is_finite() {
            speed
        } else {
            1.0
        }
    }
    pub fn set(&self, speed: f64) {
        self.0.store(speed.to_bits(), Ordering::Relaxed);
    }
    /// Wall time for `ms` of simulated time.
    pub fn wall(&self, ms: f64) -> Duration {
        Duration::from_secs_f64((ms / self.get()).max(0.0) / 1000.0)
    }
}

struct State {
    kv: KvCache,
    busy: Vec<bool>,
    next_number: u64,
    log: Vec<ServedLog>,
}

struct Shared {
    config: SimConfig,
    speed: Arc<Speed>,
    state: Mutex<State>,
    queue: Arc<Semaphore>,
}

/// A bound simulated server, not yet serving.
pub struct SimServer {
    listener: TcpListener,
    shared: Arc<Shared>,
}

/// Read access to the server's log while it runs.
#[derive(Clone)]
pub struct SimHandle {
    shared: Arc<Shared>,
}

impl SimHandle {
    pub fn log(&self) -> Vec<ServedLog> {
        self.shared
            .state
            .lock()
            .map(|s| s.log.clone())
            .unwrap_or_default()
    }
}

impl SimServer {
    pub async fn bind(addr: SocketAddr, config: SimConfig, speed: Arc<Speed>) -> io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        Ok(SimServer::with_listener(listener, config, speed))
    }

    /// From a listener bound before the runtime started (call inside the runtime).
    pub fn from_std(
        listener: std::net::TcpListener,
        config: SimConfig,
        speed: Arc<Speed>,
    ) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(listener)?;
        Ok(SimServer::with_listener(listener, config, speed))
    }

    fn with_listener(listener: TcpListener, config: SimConfig, speed: Arc<Speed>) -> Self {
        let slots = config.kv.slots.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                kv: KvCache::new(config.kv.clone()),
                busy: vec![false; slots],
                next_number: 1,
                log: Vec::new(),
            }),
            queue: Arc::new(Semaphore::new(slots)),
            config,
            speed,
        });
        SimServer { listener, shared }
    }

    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn handle(&self) -> SimHandle {
        SimHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Serves until `shutdown` resolves; connections under way are dropped with it.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let SimServer { listener, shared } = self;
        let mut connections = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        let shared = Arc::clone(&shared);
                        connections.spawn(async move {
                            let service = service_fn(move |request| {
                                let shared = Arc::clone(&shared);
                                async move { Ok::<_, Infallible>(route(shared, request).await) }
                            });
                            let _ = http1::Builder::new()
                                .keep_alive(true)
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        });
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                },
            }
        }
    }
}

fn json_response(status: StatusCode, value: &Value) -> Response<SimBody> {
    let mut response = Response::new(Full::new(Bytes::from(value.to_string())).boxed());
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json; charset=utf-8"),
    );
    response
}

/// llama-server's error shape.
fn error(status: StatusCode, kind: &str, message: &str) -> Response<SimBody> {
    json_response(
        status,
        &json!({"error": {"code": status.as_u16(), "message": message, "type": kind}}),
    )
}

async fn route(shared: Arc<Shared>, request: Request<Incoming>) -> Response<SimBody> {
    let path = request.uri().path().to_string();
    match (request.method().clone(), path.as_str()) {
        (Method::GET, "/health" | "/v1/health") => {
            json_response(StatusCode::OK, &json!({"status": "ok"}))
        }
        (Method::GET, "/v1/models" | "/models") => {
            json_response(StatusCode::OK, &models(&shared.config))
        }
        (Method::GET, "/slots") => json_response(StatusCode::OK, &slots(&shared)),
        (Method::GET, "/props") => json_response(StatusCode::OK, &props(&shared.config)),
        // The prompt `chat` evaluates for these messages, as llama-server renders it.
        (Method::POST, "/apply-template") => match read_json(request).await {
            Ok(body) => json_response(StatusCode::OK, &json!({ "prompt": render_chat(&body) })),
            Err(e) => e,
        },
        (Method::POST, "/tokenize") => match read_json(request).await {
            Ok(body) => json_response(StatusCode::OK, &tokenize_response(&body)),
            Err(e) => e,
        },
        (Method::POST, "/v1/chat/completions" | "/chat/completions") => {
            match read_json(request).await {
                Ok(body) => chat(shared, body).await,
                Err(e) => e,
            }
        }
        _ => error(StatusCode::NOT_FOUND, "not_found_error", "File Not Found"),
    }
}

async fn read_json(request: Request<Incoming>) -> Result<Value, Response<SimBody>> {
    let bytes = request
        .into_body()
        .collect()
        .await
        .map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &e.to_string(),
            )
        })?
        .to_bytes();
    serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &format!("invalid JSON: {e}"),
        )
    })
}

fn models(config: &SimConfig) -> Value {
    json!({
        "models": [{"name": config.model, "model": config.model, "type": "model",
                    "capabilities": ["completion"], "details": {"format": "gguf"}}],
        "object": "list",
        "data": [{"id": config.model, "object": "model", "owned_by": "llamacpp",
                  "created": unix_seconds(),
                  "meta": {"n_vocab": prefixscope_core::sim::VOCAB, "n_ctx": config.n_ctx,
                           "n_ctx_train": config.n_ctx}}]
    })
}

/// `GET /props` in llama-server's shape (`props.json` of the samples), its settings the
/// simulated server's own; no chat template text (the stand-in tokenizer renders ChatML).
fn props(config: &SimConfig) -> Value {
    let path = format!("models/{}", config.model);
    json!({
        "default_generation_settings": {"n_ctx": config.n_ctx, "params": {"n_predict": -1}},
        "total_slots": config.kv.slots.max(1),
        "model_alias": path,
        "model_path": path,
        "modalities": {"vision": false, "video": false, "audio": false},
        "endpoint_slots": true,
        "endpoint_props": false,
        "endpoint_metrics": false,
        "chat_template": "",
        "build_info": "prefixscope-sim",
        "is_sleeping": false
    })
}

fn slots(shared: &Shared) -> Value {
    let Ok(state) = shared.state.lock() else {
        return json!([]);
    };
    // Each slot's last task, as llama-server's `id_task` (-1: none yet).
    let mut last_task = vec![-1i64; state.kv.slot_count()];
    for served in &state.log {
        if let Some(task) = last_task.get_mut(served.served.slot) {
            *task = i64::try_from(served.number).unwrap_or(i64::MAX);
        }
    }
    (0..state.kv.slot_count())
        .map(|i| {
            json!({
                "id": i,
                "n_ctx": shared.config.n_ctx,
                "speculative": false,
                "is_processing": state.busy.get(i).copied().unwrap_or(false),
                "id_task": last_task.get(i).copied().unwrap_or(-1),
                "n_prompt_tokens": state.kv.slot_tokens(i),
                "next_token": [{"has_next_token": false, "has_new_line": false,
                                "n_remain": -1, "n_decoded": 0}]
            })
        })
        .collect()
}

/// `{"content": "…"}` → `{"tokens": [ids]}`; with `"with_pieces": true`, `[{id, piece}]`.
fn tokenize_response(body: &Value) -> Value {
    let content = body
        .get("content")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let with_pieces = body
        .get("with_pieces")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let tokens: Vec<Value> = pieces(content)
        .into_iter()
        .map(|piece| {
            if with_pieces {
                json!({"id": token_id(piece), "piece": piece})
            } else {
                json!(token_id(piece))
            }
        })
        .collect();
    json!({ "tokens": tokens })
}

/// Frees the slot (and the queue's permit) when the response is done or dropped.
struct SlotGuard {
    shared: Arc<Shared>,
    slot: usize,
    _permit: OwnedSemaphorePermit,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        if let Ok(mut state) = self.shared.state.lock()
            && let Some(busy) = state.busy.get_mut(self.slot)
        {
            *busy = false;
        }
    }
}

/// Everything one completion needs to be written out.
struct Completion {
    id: String,
    model: String,
    created: u64,
    reply: Reply,
    /// Reasoning before the reply, if the model thinks.
    reasoning: Option<String>,
    reasoning_pieces: Vec<String>,
    /// The reply's token pieces (content, or the tool call as the template renders it).
    reply_pieces: Vec<String>,
    served: Served,
    prompt_ms: f64,
    predicted_ms: f64,
}

async fn chat(shared: Arc<Shared>, body: Value) -> Response<SimBody> {
    if !body.get("messages").is_some_and(Value::is_array) {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "'messages' is required",
        );
    }
    let Ok(permit) = Arc::clone(&shared.queue).acquire_owned().await else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            "shutting down",
        );
    };
    let prompt = tokenize(&render_chat(&body));
    let taken = {
        let Ok(mut state) = shared.state.lock() else {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "state poisoned",
            );
        };
        let state = &mut *state;
        let busy = state.busy.clone();
        state
            .kv
            .choose_slot(&prompt, |i| !busy.get(i).copied().unwrap_or(true))
            .map(|slot| {
                state.busy[slot] = true;
                let number = state.next_number;
                state.next_number += 1;
                let served = state.kv.serve(slot, &prompt, number);
                let response_id = format!("chatcmpl-sim{number:06}");
                state.log.push(ServedLog {
                    number,
                    response_id: response_id.clone(),
                    prompt_tokens: prompt.len(),
                    served,
                });
                (number, response_id, served)
            })
    };
    // The semaphore guarantees an idle slot; this is a guard against a broken invariant.
    let Some((number, id, served)) = taken else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            "no idle slot",
        );
    };
    let guard = SlotGuard {
        shared: Arc::clone(&shared),
        slot: served.slot,
        _permit: permit,
    };
    let reply = model::reply(&body, shared.config.seed, number);
    // The reply as the template renders it in the next turn, so a client that sends it back
    // unchanged continues what the slot holds (`render_chat`'s tool call form).
    let reply_text = match (&reply.content, reply.tool_calls.first()) {
        (Some(text), _) => text.clone(),
        (None, Some(call)) => format!(
            "\n<tool_call>\n{{\"name\": \"{}\", \"arguments\": {}}}\n</tool_call>",
            call.name, call.arguments
        ),
        (None, None) => String::new(),
    };
    let reasoning = (shared.config.reasoning_words > 0).then(|| {
        model::sentence(
            shared.config.seed ^ number.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            shared.config.reasoning_words,
        )
    });
    let reasoning_pieces: Vec<String> = reasoning
        .as_deref()
        .map(|text| pieces(text).into_iter().map(String::from).collect())
        .unwrap_or_default();
    let reply_pieces: Vec<String> = pieces(&reply_text).into_iter().map(String::from).collect();
    // The slot keeps what it generated, all but the last token (sampled, never evaluated).
    if let Ok(mut state) = shared.state.lock() {
        let mut held = prompt.clone();
        held.extend(tokenize(reasoning.as_deref().unwrap_or_default()));
        held.extend(tokenize(&reply_text));
        held.pop();
        state.kv.hold(served.slot, &held);
    }
    let generated = reasoning_pieces.len() + reply_pieces.len();
    let completion = Completion {
        id,
        model: shared.config.model.clone(),
        created: unix_seconds(),
        prompt_ms: ms_for(served.prompt_n, shared.config.prefill_tps),
        predicted_ms: ms_for(generated.max(1), shared.config.decode_tps),
        reply,
        reasoning,
        reasoning_pieces,
        reply_pieces,
        served,
    };
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = body
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let speed = Arc::clone(&shared.speed);
    if !stream {
        tokio::time::sleep(speed.wall(completion.prompt_ms + completion.predicted_ms)).await;
        drop(guard);
        return json_response(StatusCode::OK, &completion.whole());
    }
    let (tx, rx) = mpsc::unbounded_channel::<Bytes>();
    tokio::spawn(async move {
        let _guard = guard;
        let start = Instant::now();
        tokio::time::sleep(speed.wall(completion.prompt_ms)).await;
        for (elapsed_ms, chunk) in completion.chunks(include_usage) {
            // Paced against the start, so tiny per-token waits at high speed don't add up.
            tokio::time::sleep_until(start + speed.wall(elapsed_ms)).await;
            let frame = format!("data: {chunk}\n\n");
            if tx.send(Bytes::from(frame)).is_err() {
                return;
            }
        }
        let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n"));
    });
    let mut response = Response::new(ChannelBody { rx }.boxed());
    let headers = response.headers_mut();
    headers.insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    response
}

impl Completion {
    /// Tokens generated: the reasoning's and the reply's.
    fn generated(&self) -> usize {
        (self.reasoning_pieces.len() + self.reply_pieces.len()).max(1)
    }

    fn usage(&self) -> Value {
        let prompt = self.served.cache_n + self.served.prompt_n;
        let completion = self.generated();
        json!({
            "completion_tokens": completion,
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": self.served.cache_n}
        })
    }

    fn timings(&self) -> Value {
        let prompt_n = self.served.prompt_n;
        let predicted_n = self.generated();
        let per = |ms: f64, n: usize| (ms / n.max(1) as f64, n as f64 * 1000.0 / ms.max(1e-9));
        let (prompt_per_token_ms, prompt_per_second) = per(self.prompt_ms, prompt_n);
        let (predicted_per_token_ms, predicted_per_second) = per(self.predicted_ms, predicted_n);
        json!({
            "cache_n": self.served.cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": self.prompt_ms,
            "prompt_per_token_ms": prompt_per_token_ms,
            "prompt_per_second": prompt_per_second,
            "predicted_n": predicted_n,
            "predicted_ms": self.predicted_ms,
            "predicted_per_token_ms": predicted_per_token_ms,
            "predicted_per_second": predicted_per_second
        })
    }

    fn tool_calls(&self) -> Vec<Value> {
        self.reply
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, call)| {
                json!({"index": i, "id": call.id, "type": "function",
                       "function": {"name": call.name, "arguments": call.arguments}})
            })
            .collect()
    }

    fn envelope(&self, object: &str, choices: Value) -> serde_json::Map<String, Value> {
        let mut out = serde_json::Map::new();
        out.insert("choices".into(), choices);
        out.insert("created".into(), json!(self.created));
        out.insert("id".into(), json!(self.id));
        out.insert("model".into(), json!(self.model));
        out.insert("system_fingerprint".into(), json!("b0-prefixscope-sim"));
        out.insert("object".into(), json!(object));
        out
    }

    /// The non-streamed response.
    fn whole(&self) -> Value {
        let mut message = serde_json::Map::new();
        message.insert("role".into(), json!("assistant"));
        message.insert("content".into(), json!(self.reply.content));
        if let Some(reasoning) = &self.reasoning {
            message.insert("reasoning_content".into(), json!(reasoning));
        }
        if !self.reply.tool_calls.is_empty() {
            message.insert("tool_calls".into(), json!(self.tool_calls()));
        }
        let mut out = self.envelope(
            "chat.completion",
            json!([{"finish_reason": self.reply.finish_reason, "index": 0, "message": message}]),
        );
        out.insert("usage".into(), self.usage());
        out.insert("timings".into(), self.timings());
        Value::Object(out)
    }

    /// The SSE chunks, each with the simulated ms since the request started when it is due:
    /// the role, the content piece by piece (or the tool call whole), the finish reason with
    /// `timings`, and with `include_usage` a last chunk with no choices, `usage` and `timings`.
    fn chunks(&self, include_usage: bool) -> Vec<(f64, Value)> {
        let chunk = |delta: Value, finish: Option<&str>| {
            Value::Object(self.envelope(
                "chat.completion.chunk",
                json!([{"finish_reason": finish, "index": 0, "delta": delta}]),
            ))
        };
        let per_token = self.predicted_ms / self.generated() as f64;
        let mut out = vec![(
            self.prompt_ms,
            chunk(json!({"role": "assistant", "content": null}), None),
        )];
        for (i, piece) in self.reasoning_pieces.iter().enumerate() {
            let due = self.prompt_ms + per_token * (i + 1) as f64;
            out.push((due, chunk(json!({"reasoning_content": piece}), None)));
        }
        let thought = self.reasoning_pieces.len();
        if self.reply.tool_calls.is_empty() {
            for (i, piece) in self.reply_pieces.iter().enumerate() {
                let due = self.prompt_ms + per_token * (thought + i + 1) as f64;
                out.push((due, chunk(json!({"content": piece}), None)));
            }
        } else {
            out.push((
                self.prompt_ms + self.predicted_ms,
                chunk(json!({"tool_calls": self.tool_calls()}), None),
            ));
        }
        let end = self.prompt_ms + self.predicted_ms;
        let mut last = chunk(json!({}), Some(self.reply.finish_reason));
        if let Value::Object(map) = &mut last {
            map.insert("timings".into(), self.timings());
        }
        out.push((end, last));
        if include_usage {
            let mut usage = self.envelope("chat.completion.chunk", json!([]));
            usage.insert("usage".into(), self.usage());
            usage.insert("timings".into(), self.timings());
            out.push((end, Value::Object(usage)));
        }
        out
    }
}

/// A streamed body fed from a channel.
struct ChannelBody {
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

fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
