//! `--tokenize URL`: count every distinct message and tool of a recording with the server's own
//! tokenizer, so the analysis reads counts instead of estimates from characters.
//!
//! The texts are exactly the ones the analysis reads (`normalize::digest::message_text` of the chat-form
//! messages, canonical JSON of the tools), keyed by the same hashes. llama.cpp's
//! `POST /tokenize {"content", "add_special": false}` first, then Ollama's
//! `POST /api/tokenize {"model", "text"}` if that answers 404/405. Counts are raw, without the
//! chat template's tokens. Empty texts count 0 without a request; a text is sent once. A bad URL,
//! an unreachable server or a missing endpoint is a warning and the estimates stay; a lost
//! connection keeps what was counted; digest records have no text and are skipped with a warning.
//!
//! Against a llama.cpp that renders templates (`/apply-template`), each request is first laid out
//! as the server lays it out (`layout`): counts with the template's tokens, tools the template
//! drops at 0, checked against the server's prompt count. What cannot be laid out is counted text
//! by text as above.
//!
//! This is an edge (network) behind the `net` feature. `enrich` blocks: it runs a current-thread
//! tokio runtime on a thread of its own, so an async host can call it too.
//!
//! adapted from llmp 0.1.0 (MIT, see NOTICE)

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, Uri, header};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

mod layout;

pub use layout::{LiveLayout, LiveLayoutStats};

use crate::http1;
use prefixscope_core::normalize::{Api, digest};
use prefixscope_core::record::{self, Record, TokenCounts, hash};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Answers without tokens before any count, after which the endpoint is given up on (a server
/// that answers 200 to everything must not receive every text of the recording).
const MAX_EARLY_FAILURES: u64 = 3;

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TokenizeResult {
    /// Distinct texts that got a count (empty texts included, at 0).
    pub counted: u64,
    /// Records whose counts are the server's layout of the rendered prompt (`layout`).
    pub laid_out: u64,
    /// HTTP requests sent to the tokenizer.
    pub requests: u64,
    pub warnings: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Message,
    Tool,
}

struct Text {
    kind: Kind,
    hash: String,
    text: String,
}

type Counts = BTreeMap<(Kind, String), u32>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    LlamaCpp,
    Ollama,
}

#[derive(Debug)]
struct Endpoint {
    /// `host:port` to connect to.
    socket: String,
    /// The `Host` header.
    host: String,
    /// The URL's path without its trailing `/`, prefixed to the endpoint paths.
    base: String,
}

/// Counts, by hash, every message and tool of `records` that has no count yet, and stores them in
/// `record.tokens`. Never fails: what went wrong is in the warnings, and what was not counted
/// keeps its estimate.
pub fn enrich(records: &mut [Record], url: &str) -> TokenizeResult {
    let mut result = TokenizeResult::default();
    let endpoint = match Endpoint::parse(url) {
        Ok(endpoint) => endpoint,
        Err(warning) => {
            result.warnings.push(warning);
            return result;
        }
    };
    let laid = std::thread::scope(|scope| {
        let records = &mut *records;
        let endpoint = &endpoint;
        scope.spawn(move || lay_out(endpoint, records)).join()
    });
    match laid {
        Ok(laid) => {
            result.laid_out = laid.laid_out;
            result.requests += laid.requests;
            result.warnings.extend(laid.warnings);
            if let Some(e) = laid.unreachable {
                result.warnings.push(format!(
                    "cannot reach the tokenizer at {}: {e}; estimates are kept",
                    endpoint.socket
                ));
                return result;
            }
        }
        Err(_) => result
            .warnings
            .push("the layout thread panicked; the messages' own counts follow".to_string()),
    }
    let collected = collect(records);
    if collected.digest_records > 0 {
        result.warnings.push(format!(
            "{} records were recorded in digest mode and have no text to tokenize; they keep their estimates",
            collected.digest_records
        ));
    }
    if collected.models.len() > 1 {
        result.warnings.push(format!(
            "the recordings use {} models; every text was counted with the tokenizer of the model {url} serves",
            collected.models.len()
        ));
    }
    if collected.texts.is_empty() {
        return result;
    }
    let model = collected.models.into_iter().next().unwrap_or_default();
    let texts = collected.texts;
    let run =
        std::thread::scope(|scope| scope.spawn(|| count_all(&endpoint, &model, &texts)).join());
    let outcome = run.unwrap_or_else(|_| Outcome {
        warnings: vec!["the tokenize thread panicked; estimates are kept".to_string()],
        ..Outcome::default()
    });
    result.warnings.extend(outcome.warnings);
    result.counted = outcome.counts.len() as u64;
    result.requests += outcome.requests;
    apply(records, &outcome.counts);
    result
}

impl Endpoint {
    fn parse(url: &str) -> Result<Endpoint, String> {
        let uri: Uri = url
            .parse()
            .map_err(|e| format!("{url}: not a URL: {e}; estimates are kept"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => {
                return Err(format!(
                    "{url}: only http:// is supported, not {other}://; estimates are kept"
                ));
            }
            None => return Err(format!("{url}: the URL needs http://; estimates are kept")),
        }
        let authority = uri
            .authority()
            .filter(|a| !a.host().is_empty())
            .ok_or_else(|| format!("{url}: the URL has no host; estimates are kept"))?;
        let host = match authority.port() {
            Some(port) => format!("{}:{port}", authority.host()),
            None => authority.host().to_string(),
        };
        Ok(Endpoint {
            socket: format!(
                "{}:{}",
                authority.host(),
                authority.port_u16().unwrap_or(80)
            ),
            host,
            base: uri.path().trim_end_matches('/').to_string(),
        })
    }
}

/// `layout::lay_out_all` on a current-thread runtime of its own.
fn lay_out(endpoint: &Endpoint, records: &mut [Record]) -> layout::LayoutOutcome {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(layout::lay_out_all(endpoint, records)),
        Err(e) => layout::LayoutOutcome {
            warnings: vec![format!("cannot start the layout runtime: {e}")],
            ..layout::LayoutOutcome::default()
        },
    }
}

#[derive(Default)]
struct Collected {
    texts: Vec<Text>,
    models: BTreeSet<String>,
    digest_records: usize,
}

/// The request's messages (chat form) and tools, with the digest that hashes them.
fn parts(api: Api, body: &Value) -> Option<(record::RequestDigest, Vec<Value>, Vec<Value>)> {
    let chat = prefixscope_core::normalize::chat_request(api, body)?;
    let digest = digest::request_digest_of(api, body, &chat, true);
    let (messages, tools) = chat;
    Some((digest, messages.into_owned(), tools.into_owned()))
}

fn collect(records: &[Record]) -> Collected {
    let mut collected = Collected::default();
    let mut seen = BTreeSet::new();
    for record in records {
        let api = Api::from_path(&record.request.path);
        if !api.is_chat() {
            continue;
        }
        if record.request.digest.is_some() {
            collected.digest_records += 1;
            continue;
        }
        let Some((digest, messages, tools)) =
            record.request.body.as_ref().and_then(|b| parts(api, b))
        else {
            continue;
        };
        if let Some(model) = digest.model {
            collected.models.insert(model);
        }
        let known = record.tokens.as_ref();
        for (message, value) in digest.messages.iter().zip(&messages) {
            let counted = known.is_some_and(|t| t.messages.contains_key(&message.hash));
            if !counted && seen.insert((Kind::Message, message.hash.clone())) {
                collected.texts.push(Text {
                    kind: Kind::Message,
                    hash: message.hash.clone(),
                    text: digest::message_text(value),
                });
            }
        }
        for (tool, value) in digest.tools.iter().zip(&tools) {
            let counted = known.is_some_and(|t| t.tools.contains_key(&tool.hash));
            if !counted && seen.insert((Kind::Tool, tool.hash.clone())) {
                collected.texts.push(Text {
                    kind: Kind::Tool,
                    hash: tool.hash.clone(),
                    text: hash::canonical_json(value),
                });
            }
        }
    }
    collected
}

/// Every record whose messages or tools were counted gets those counts (a text counted once
/// lands in every record that carries it).
fn apply(records: &mut [Record], counts: &Counts) {
    if counts.is_empty() {
        return;
    }
    for record in records.iter_mut() {
        let api = Api::from_path(&record.request.path);
        if !api.is_chat() || record.request.digest.is_some() {
            continue;
        }
        let Some(digest) = record
            .request
            .body
            .as_ref()
            .and_then(|body| digest::request_digest(api, body))
        else {
            continue;
        };
        let mut added = TokenCounts::default();
        for message in &digest.messages {
            if let Some(&n) = counts.get(&(Kind::Message, message.hash.clone())) {
                added.messages.insert(message.hash.clone(), n);
            }
        }
        for tool in &digest.tools {
            if let Some(&n) = counts.get(&(Kind::Tool, tool.hash.clone())) {
                added.tools.insert(tool.hash.clone(), n);
            }
        }
        if added.messages.is_empty() && added.tools.is_empty() {
            continue;
        }
        let tokens = record.tokens.get_or_insert_with(TokenCounts::default);
        tokens.messages.extend(added.messages);
        tokens.tools.extend(added.tools);
    }
}

#[derive(Default)]
struct Outcome {
    counts: Counts,
    requests: u64,
    warnings: Vec<String>,
}

fn count_all(endpoint: &Endpoint, model: &str, texts: &[Text]) -> Outcome {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            return Outcome {
                warnings: vec![format!(
                    "cannot start the tokenize runtime: {e}; estimates are kept"
                )],
                ..Outcome::default()
            };
        }
    };
    runtime.block_on(async {
        let mut client = Client::new(endpoint, REQUEST_TIMEOUT);
        let mut outcome = Outcome::default();
        let mut flavor = None;
        let mut failed = 0u64;
        let mut last_failure = String::new();
        let mut answered = false;
        // Two hashes can share a text (a system prompt as a string and as blocks): one request.
        let mut by_text: HashMap<&str, Option<u32>> = HashMap::new();
        for text in texts {
            let key = (text.kind, text.hash.clone());
            if text.text.is_empty() {
                outcome.counts.insert(key, 0);
                continue;
            }
            if let Some(known) = by_text.get(text.text.as_str()) {
                if let Some(n) = known {
                    outcome.counts.insert(key, *n);
                }
                continue;
            }
            let answer = match flavor {
                Some(flavor) => count(&mut client, flavor, model, &text.text).await,
                None => match detect(&mut client, model, &text.text).await {
                    Ok((detected, answer)) => {
                        flavor = Some(detected);
                        Ok(answer)
                    }
                    Err(e) => Err(e),
                },
            };
            match answer {
                Ok(Answer::Tokens(n)) => {
                    answered = true;
                    by_text.insert(&text.text, Some(n));
                    outcome.counts.insert(key, n);
                }
                Ok(Answer::Other(what)) => {
                    by_text.insert(&text.text, None);
                    failed += 1;
                    last_failure = what;
                    if !answered && failed >= MAX_EARLY_FAILURES {
                        outcome.warnings.push(format!(
                            "the tokenizer at {} answered {failed} requests without tokens (last: {last_failure}); estimates are kept",
                            endpoint.socket
                        ));
                        outcome.requests = client.requests;
                        return outcome;
                    }
                }
                Err(Failure::Unreachable(e)) => {
                    outcome.warnings.push(format!(
                        "cannot reach the tokenizer at {}: {e}; estimates are kept",
                        endpoint.socket
                    ));
                    outcome.requests = client.requests;
                    return outcome;
                }
                Err(Failure::NoEndpoint(statuses)) => {
                    outcome.warnings.push(format!(
                        "no tokenize endpoint at {} ({statuses}); estimates are kept",
                        endpoint.socket
                    ));
                    outcome.requests = client.requests;
                    return outcome;
                }
                Err(Failure::Lost(e)) => {
                    let left = texts.len().saturating_sub(outcome.counts.len());
                    outcome.warnings.push(format!(
                        "lost the tokenizer at {}: {e}; {} texts were counted, {left} keep their estimate",
                        endpoint.socket,
                        outcome.counts.len()
                    ));
                    outcome.requests = client.requests;
                    return outcome;
                }
            }
        }
        if failed > 0 {
            outcome.warnings.push(format!(
                "{failed} texts could not be tokenized (last: {last_failure}) and keep their estimate"
            ));
        }
        outcome.requests = client.requests;
        outcome
    })
}

enum Answer {
    Tokens(u32),
    /// The endpoint answered, without tokens (a status or a body that is not a token list).
    Other(String),
}

enum Failure {
    /// The first request could not be sent: nothing to count with.
    Unreachable(String),
    /// Both endpoints answered 404/405.
    NoEndpoint(String),
    /// The connection broke after the endpoint was found.
    Lost(String),
}

/// The first non-empty text finds the endpoint: llama.cpp's, then Ollama's if that one is missing
/// (404/405).
async fn detect(
    client: &mut Client<'_>,
    model: &str,
    text: &str,
) -> Result<(Flavor, Answer), Failure> {
    let mut statuses = Vec::new();
    for flavor in [Flavor::LlamaCpp, Flavor::Ollama] {
        let (path, body) = request(client.endpoint, flavor, model, text);
        let (status, reply) = client
            .post(&path, &body)
            .await
            .map_err(Failure::Unreachable)?;
        if status == 404 || status == 405 {
            statuses.push(format!("{path} answered {status}"));
            continue;
        }
        return Ok((flavor, answer(&path, status, &reply)));
    }
    Err(Failure::NoEndpoint(statuses.join(", ")))
}

async fn count(
    client: &mut Client<'_>,
    flavor: Flavor,
    model: &str,
    text: &str,
) -> Result<Answer, Failure> {
    let (path, body) = request(client.endpoint, flavor, model, text);
    let (status, reply) = client.post(&path, &body).await.map_err(Failure::Lost)?;
    Ok(answer(&path, status, &reply))
}

fn request(endpoint: &Endpoint, flavor: Flavor, model: &str, text: &str) -> (String, Value) {
    match flavor {
        Flavor::LlamaCpp => (
            format!("{}/tokenize", endpoint.base),
            json!({ "content": text, "add_special": false }),
        ),
        Flavor::Ollama => (
            format!("{}/api/tokenize", endpoint.base),
            json!({ "model": model, "text": text }),
        ),
    }
}

fn answer(path: &str, status: u16, reply: &Value) -> Answer {
    match tokens(status, reply) {
        Some(n) => Answer::Tokens(n),
        None if (200..300).contains(&status) => {
            Answer::Other(format!("{path} answered {status} without a token list"))
        }
        None => Answer::Other(format!("{path} answered {status}")),
    }
}

/// The number of tokens of a 2xx `{"tokens": [...]}` reply.
fn tokens(status: u16, reply: &Value) -> Option<u32> {
    if !(200..300).contains(&status) {
        return None;
    }
    let tokens = reply.get("tokens")?.as_array()?;
    u32::try_from(tokens.len()).ok()
}

/// One kept-alive HTTP/1.1 connection, reopened when the server closed it.
struct Client<'a> {
    endpoint: &'a Endpoint,
    sender: Option<http1::Sender>,
    requests: u64,
    /// How long one answer may take.
    timeout: Duration,
}

impl<'a> Client<'a> {
    fn new(endpoint: &'a Endpoint, timeout: Duration) -> Client<'a> {
        Client {
            endpoint,
            sender: None,
            requests: 0,
            timeout,
        }
    }

    async fn post(&mut self, path: &str, body: &Value) -> Result<(u16, Value), String> {
        let bytes = Bytes::from(body.to_string());
        self.requests += 1;
        for attempt in 0..2 {
            let reused = self.sender.as_ref().is_some_and(|s| !s.is_closed());
            if !reused {
                self.sender = Some(self.connect().await?);
            }
            let Some(sender) = self.sender.as_mut() else {
                return Err("no connection".into());
            };
            let request = Request::builder()
                .method(Method::POST)
                .uri(path)
                .header(header::HOST, &self.endpoint.host)
                .header(header::CONTENT_TYPE, "application/json")
                .header(
                    header::USER_AGENT,
                    concat!("prefixscope/", env!("CARGO_PKG_VERSION")),
                )
                .body(Full::new(bytes.clone()))
                .map_err(|e| e.to_string())?;
            let sent = async {
                sender.ready().await?;
                let response = sender.send_request(request).await?;
                let status = response.status().as_u16();
                let body = response.into_body().collect().await?.to_bytes();
                Ok::<_, hyper::Error>((status, body))
            };
            match tokio::time::timeout(self.timeout, sent).await {
                Ok(Ok((status, body))) => {
                    let reply = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    return Ok((status, reply));
                }
                Ok(Err(e)) => {
                    self.sender = None;
                    // A kept-alive connection the server closed meanwhile: once more, anew.
                    if reused && attempt == 0 {
                        continue;
                    }
                    return Err(e.to_string());
                }
                Err(_) => {
                    self.sender = None;
                    return Err(format!("no answer within {} s", self.timeout.as_secs()));
                }
            }
        }
        Err("the connection closed".into())
    }

    async fn connect(&self) -> Result<http1::Sender, String> {
        tokio::time::timeout(CONNECT_TIMEOUT, http1::connect(&self.endpoint.socket))
            .await
            .map_err(|_| format!("connecting took more than {} s", CONNECT_TIMEOUT.as_secs()))?
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_urls() {
        let e = Endpoint::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(
            (e.socket.as_str(), e.host.as_str(), e.base.as_str()),
            ("127.0.0.1:8080", "127.0.0.1:8080", "")
        );
        let e = Endpoint::parse("http://localhost/llama/").unwrap();
        assert_eq!(
            (e.socket.as_str(), e.host.as_str(), e.base.as_str()),
            ("localhost:80", "localhost", "/llama")
        );
        let e = Endpoint::parse("http://user:pw@[::1]:9/a/b").unwrap();
        assert_eq!(
            (e.socket.as_str(), e.host.as_str(), e.base.as_str()),
            ("[::1]:9", "[::1]:9", "/a/b")
        );
        assert!(
            Endpoint::parse("https://example.com")
                .unwrap_err()
                .contains("only http://")
        );
        assert!(Endpoint::parse("127.0.0.1:8080").is_err());
        assert!(Endpoint::parse("not a url").is_err());
        assert!(Endpoint::parse("").is_err());
    }

    #[test]
    fn token_replies() {
        assert_eq!(tokens(200, &json!({"tokens": [1, 2, 3]})), Some(3));
        assert_eq!(tokens(200, &json!({"tokens": []})), Some(0));
        assert_eq!(tokens(404, &json!({"tokens": [1]})), None);
        assert_eq!(tokens(200, &json!({"error": "x"})), None);
        assert_eq!(tokens(200, &Value::Null), None);
    }

    fn chat(path: &str, body: Value) -> Record {
        let line = json!({"v": 1, "id": 1, "conn": 1, "t_start_ms": 0, "t_first_byte_ms": null,
            "t_end_ms": 0, "request": {"method": "POST", "path": path, "headers": {},
            "body_bytes": 0, "body": body, "body_text": null, "digest": null},
            "response": null, "error": null, "tokens": null});
        serde_json::from_value(line).unwrap()
    }

    #[test]
    fn texts_are_the_analysis_texts_once_each() {
        let tool = json!({"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}});
        let a = chat(
            "/v1/chat/completions",
            json!({"model": "m", "tools": [tool], "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}),
        );
        let mut b = a.clone();
        b.request.body.as_mut().unwrap()["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "user", "content": ""}));
        let anthropic = chat(
            "/v1/messages",
            json!({"model": "m", "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
                "tools": [{"name": "ls", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
                "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]}),
        );
        let mut digest = a.clone();
        digest::apply_digest(&mut digest);
        let other = chat("/v1/embeddings", json!({"input": "x"}));
        let c = collect(&[a, b, anthropic, digest, other]);
        let texts: Vec<(Kind, &str)> = c.texts.iter().map(|t| (t.kind, t.text.as_str())).collect();
        let calls = r#"[{"function":{"arguments":"{}","name":"ls"},"id":"1","type":"function"}]"#;
        assert_eq!(
            texts,
            vec![
                (Kind::Message, "Be brief."),
                (Kind::Message, calls),
                (Kind::Message, "ab"),
                (
                    Kind::Tool,
                    r#"{"function":{"name":"ls","parameters":{"type":"object"}},"type":"function"}"#
                ),
                (Kind::Message, ""),
                // Anthropic: the system message has blocks, so another hash than the string.
                (Kind::Message, "Be brief."),
                (Kind::Message, "x"),
                (
                    Kind::Tool,
                    r#"{"input_schema":{"type":"object"},"name":"ls"}"#
                ),
            ]
        );
        assert_eq!(c.digest_records, 1);
        assert_eq!(c.models.len(), 1);
    }
}
