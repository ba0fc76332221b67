//! Scripted agents: harnesses that talk to an OpenAI-compatible server (the simulated one, through
//! the proxy) the way coding agents do: a system prompt with today's date, tools and tool-call
//! loops, a subagent with a subset of the tools, title side-calls, a tool list that grows, a
//! compaction, and a second harness (another user-agent) at the same time.
//!
//! Runs are deterministic: the agents take turns in simulated time (a discrete-event scheduler,
//! one request at a time, the earliest-ready agent first), so with one seed the server sees the
//! same requests in the same order whatever the speed. Each agent logs the events it caused
//! (kind + the request's position and response id), so a test can hold the analysis of the
//! recording against the script.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::model::sentence;
use super::script::{EventKind, RequestLog, RunLog, ScriptEvent};
use super::server::Speed;
use prefixscope_capture::http1::{self, ConnectError};

pub const SCENARIOS: [&str; 6] = [
    "mixed",
    "side-calls",
    "parallel",
    "volatile-system",
    "compaction",
    "swa",
];

/// A scenario's own model, when it needs one: `swa` runs a Gemma 4–style thinking model whose
/// sliding-window cache (`kv::KvConfig::swa_window`) cannot serve a prefix that stops well
/// before the slot's end, and each turn's reasoning, which the client does not send back,
/// puts it there: full re-prefills the client did not cause.
pub fn scenario_model(scenario: &str) -> Option<ScenarioModel> {
    match scenario {
        "swa" => Some(ScenarioModel {
            name: "sim-gemma-4-e2b-it-q4_k_m.gguf",
            sliding_window: SWA_WINDOW,
            reasoning_words: SWA_REASONING_WORDS,
        }),
        _ => None,
    }
}

/// A scenario's model: its file name, sliding window and reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScenarioModel {
    pub name: &'static str,
    pub sliding_window: usize,
    pub reasoning_words: usize,
}

/// The `swa` scenario's window, in the simulated server's tokens: Gemma 4's, 512 (Gemma 3's
/// is 1,024, Gemma 2's 4,096, gpt-oss's 128).
pub const SWA_WINDOW: usize = 512;

/// The `swa` scenario's reasoning a turn: more tokens than the window layers keep past their
/// window (`kv::SWA_MARGIN`), so the next turn's prefix is out of their reach.
pub const SWA_REASONING_WORDS: usize = 300;

pub fn default_slots(scenario: &str) -> usize {
    match scenario {
        "mixed" => 2,
        _ => 1,
    }
}

/// Turns taken in simulated time: each agent says when it is next ready, and the earliest (then
/// the lowest id) runs once every other agent is waiting or done.
struct Scheduler {
    state: Mutex<SchedulerState>,
}

struct SchedulerState {
    running: usize,
    clock_ms: f64,
    waiting: BTreeMap<(u64, usize), oneshot::Sender<f64>>,
}

impl Scheduler {
    fn new(agents: usize) -> Scheduler {
        Scheduler {
            state: Mutex::new(SchedulerState {
                running: agents,
                clock_ms: 0.0,
                waiting: BTreeMap::new(),
            }),
        }
    }

    /// Waits for this agent's turn; returns the simulated ms to wait before acting.
    async fn turn(&self, agent: usize, ready_at_ms: f64) -> f64 {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut state) = self.state.lock() {
            state
                .waiting
                .insert((ready_at_ms.max(0.0) as u64, agent), tx);
            state.running -= 1;
            release(&mut state);
        }
        rx.await.unwrap_or(0.0)
    }

    fn done(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.running -= 1;
            release(&mut state);
        }
    }

    /// Simulated time passes (the server's work); returns the new time.
    fn advance(&self, ms: f64) -> f64 {
        self.state.lock().map_or(0.0, |mut state| {
            state.clock_ms += ms.max(0.0);
            state.clock_ms
        })
    }
}

fn release(state: &mut SchedulerState) {
    if state.running > 0 {
        return;
    }
    if let Some(((ready_at, _), tx)) = state.waiting.pop_first() {
        let wait = (ready_at as f64 - state.clock_ms).max(0.0);
        state.clock_ms += wait;
        state.running += 1;
        let _ = tx.send(wait);
    }
}

/// One agent's connection and clock.
struct Ctx {
    id: usize,
    name: String,
    user_agent: String,
    proxy: SocketAddr,
    sender: Option<http1::Sender>,
    scheduler: Arc<Scheduler>,
    speed: Arc<Speed>,
    log: Arc<Mutex<RunLog>>,
    ready_at_ms: f64,
    seed: u64,
}

/// What came back, merged from SSE when streamed.
#[derive(Debug, Clone, Default)]
struct Answer {
    id: String,
    content: Option<String>,
    tool_calls: Vec<Value>,
    server_ms: f64,
    prompt_tokens: u64,
    cached_tokens: u64,
}

impl Ctx {
    fn hash(&self, parts: &[&str]) -> u64 {
        parts
            .iter()
            .fold(self.seed, |h, part| xxh3_64_with_seed(part.as_bytes(), h))
    }

    /// Sends one chat request in this agent's turn; `then_ms` is the simulated time it needs
    /// before its next request (tools running, the user typing).
    async fn send(
        &mut self,
        body: &Value,
        conversation: Option<&str>,
        events: &[EventKind],
        then_ms: f64,
    ) -> Result<Answer, String> {
        let wait = self.scheduler.turn(self.id, self.ready_at_ms).await;
        tokio::time::sleep(self.speed.wall(wait)).await;
        let answer = self.post(body).await;
        let now = self
            .scheduler
            .advance(answer.as_ref().map_or(0.0, |a| a.server_ms));
        self.ready_at_ms = now + then_ms;
        let answer = answer?;
        if let Ok(mut log) = self.log.lock() {
            let order = log.requests.len() as u64 + 1;
            log.requests.push(RequestLog {
                order,
                agent: self.name.clone(),
                conversation: conversation.map(String::from),
                response_id: answer.id.clone(),
                // A compacted turn keeps its first messages: their loss is still an eviction.
                breaks: events
                    .iter()
                    .any(|e| matches!(e, EventKind::SystemChanged | EventKind::ToolsChanged)),
                prompt_tokens: answer.prompt_tokens,
                cached_tokens: answer.cached_tokens,
            });
            for &kind in events {
                log.events.push(ScriptEvent {
                    kind,
                    order,
                    response_id: answer.id.clone(),
                    agent: self.name.clone(),
                    evictors: Vec::new(),
                    share: None,
                });
            }
        }
        Ok(answer)
    }

    async fn post(&mut self, body: &Value) -> Result<Answer, String> {
        // One retry on a fresh connection: the proxy may have closed an idle one.
        for attempt in 0..2 {
            let sender = match self.sender.as_mut() {
                Some(sender) if !sender.is_closed() => sender,
                _ => {
                    let sender = http1::connect(self.proxy).await.map_err(|e| match e {
                        ConnectError::Connect(e) => {
                            format!("cannot connect to {}: {e}", self.proxy)
                        }
                        ConnectError::Handshake(e) => e.to_string(),
                    })?;
                    self.sender.insert(sender)
                }
            };
            let request = hyper::Request::post("/v1/chat/completions")
                .header("host", self.proxy.to_string())
                .header("content-type", "application/json")
                .header("user-agent", &self.user_agent)
                .body(Full::new(Bytes::from(body.to_string())))
                .map_err(|e| e.to_string())?;
            let response = match sender.send_request(request).await {
                Ok(response) => response,
                Err(e) if attempt == 0 && e.is_canceled() => {
                    self.sender = None;
                    continue;
                }
                Err(e) => return Err(e.to_string()),
            };
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            if !status.is_success() {
                return Err(format!(
                    "HTTP {status}: {}",
                    String::from_utf8_lossy(&bytes)
                ));
            }
            return parse_answer(&bytes);
        }
        Err("the connection closed twice".into())
    }
}

/// A non-streamed body, or SSE merged: content pieces joined, tool calls whole, the counts from
/// the chunk that carries `timings`.
fn parse_answer(bytes: &[u8]) -> Result<Answer, String> {
    let text = String::from_utf8_lossy(bytes);
    let mut answer = Answer::default();
    let counts = |value: &Value, answer: &mut Answer| {
        if let Some(timings) = value.get("timings") {
            let ms = |key: &str| timings.get(key).and_then(Value::as_f64).unwrap_or(0.0);
            let n = |key: &str| timings.get(key).and_then(Value::as_u64).unwrap_or(0);
            answer.server_ms = ms("prompt_ms") + ms("predicted_ms");
            answer.cached_tokens = n("cache_n");
            answer.prompt_tokens = n("cache_n") + n("prompt_n");
        }
    };
    if text.trim_start().starts_with('{') {
        let value: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        answer.id = value["id"].as_str().unwrap_or_default().to_string();
        let message = &value["choices"][0]["message"];
        answer.content = message["content"].as_str().map(String::from);
        answer.tool_calls = message["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        counts(&value, &mut answer);
        return Ok(answer);
    }
    let mut content = String::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if let Some(id) = chunk["id"].as_str() {
            answer.id = id.to_string();
        }
        let delta = &chunk["choices"][0]["delta"];
        if let Some(piece) = delta["content"].as_str() {
            content.push_str(piece);
        }
        if let Some(calls) = delta["tool_calls"].as_array() {
            answer.tool_calls.extend(
                calls
                    .iter()
                    .map(|c| json!({"id": c["id"], "type": "function", "function": c["function"]})),
            );
        }
        counts(&chunk, &mut answer);
    }
    answer.content = (!content.is_empty()).then_some(content);
    Ok(answer)
}

fn tool(name: &str, description: &str, params: &[&str]) -> Value {
    let properties: serde_json::Map<String, Value> = params
        .iter()
        .map(|p| ((*p).to_string(), json!({"type": "string"})))
        .collect();
    json!({"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": params}}})
}

fn coding_tools() -> Vec<Value> {
    vec![
        tool(
            "read_file",
            "Read a file of the repository and return its text.",
            &["path"],
        ),
        tool(
            "grep",
            "Search the repository for a regular expression; returns matching lines with file and line number.",
            &["pattern", "path"],
        ),
        tool(
            "edit_file",
            "Replace the exact text old with new in a file.",
            &["path", "old", "new"],
        ),
        tool(
            "run_tests",
            "Run a shell test command and return its output.",
            &["command"],
        ),
        tool(
            "task",
            "Start a subagent with read-only tools on a self-contained research task; returns its final answer.",
            &["prompt"],
        ),
    ]
}

fn web_fetch() -> Value {
    tool(
        "web_fetch",
        "Fetch a documentation page and return it as text (from the docs MCP server).",
        &["url"],
    )
}

const CODING_SYSTEM: &str = "You are a coding agent working in a Rust repository. Read files before changing them, keep \
changes minimal and explain what you did in one or two sentences. Prefer the repository's own \
helpers over new dependencies. Run the tests after every change and report failures verbatim. \
Never invent file contents: read them. When a task needs broad searching, delegate it to a \
subagent with the task tool and continue with its answer.";

const SUBAGENT_SYSTEM: &str = "You are a research subagent. You have read-only tools. Answer the task you are given with \
file paths and line numbers, in a short list, and nothing else. Do not propose changes.";

const REVIEWER_SYSTEM: &str = "You are a code reviewer for a Rust project. Read the files named in the request, point out \
bugs, missing tests and unclear names, and rate the change from 1 to 5. Be specific and brief.";

const TESTER_SYSTEM: &str = "You are a test runner in a Rust workspace. Run the test command you are given, read the \
failing test's source, and explain the first failure in two sentences.";

const DOCS_SYSTEM: &str = "You are a documentation writer. Read the module you are pointed at and write its missing doc \
comments in the project's style: one line of what, one of why.";

/// A system prompt, with a date that changes and optionally a nonce in front.
#[derive(Clone)]
struct SystemPrompt {
    text: &'static str,
    day: u32,
    volatile: bool,
}

impl SystemPrompt {
    fn render(&self, nonce: u64) -> String {
        let date = format!("Today is 2026-03-{:02}.", self.day);
        if self.volatile {
            format!(
                "[request {nonce:016x}] {} Working directory: /work/repo. {date}",
                self.text
            )
        } else {
            format!("{} Working directory: /work/repo. {date}", self.text)
        }
    }
}

/// What a scripted agent does, in order.
#[derive(Clone)]
enum Step {
    /// A user message, then the tool-call loop until the model answers in text.
    User(&'static str),
    /// A title side-call about the conversation so far (max_tokens 12, no tools).
    Title,
    /// A commit-message side-call (max_tokens 24).
    CommitMessage,
    /// Midnight passes: the date in the system prompt changes.
    NextDay,
    /// A tool is added (an MCP server connects).
    AddTool(fn() -> Value),
    /// A summary side-call, then the history replaced by it.
    Compact,
}

#[derive(Clone)]
struct Script {
    name: &'static str,
    user_agent: &'static str,
    system: SystemPrompt,
    tools: Vec<Value>,
    stream: bool,
    /// Simulated ms before the first request.
    start_ms: f64,
    /// Tool results this many times longer than usual (a big repository).
    verbose: usize,
    steps: Vec<Step>,
}

/// The agents of a scenario.
fn scripts(scenario: &str) -> Result<Vec<Script>, String> {
    let coder = |steps: Vec<Step>| Script {
        name: "coder",
        user_agent: "sim-coder/1.4 (prefixscope demo)",
        system: SystemPrompt {
            text: CODING_SYSTEM,
            day: 14,
            volatile: false,
        },
        tools: coding_tools(),
        stream: true,
        start_ms: 0.0,
        verbose: 1,
        steps,
    };
    let other = |name, user_agent, system, tools: Vec<Value>, start_ms, steps| Script {
        name,
        user_agent,
        system: SystemPrompt {
            text: system,
            day: 14,
            volatile: false,
        },
        tools,
        stream: false,
        start_ms,
        verbose: 1,
        steps,
    };
    let read_only = || coding_tools().into_iter().take(2).collect::<Vec<_>>();
    use Step::*;
    Ok(match scenario {
        "mixed" => vec![
            coder(vec![
                User("Where does the config parser handle missing keys? Use grep to find it."),
                Title,
                User("Use the task tool to have a subagent list every call site of parse_line."),
                NextDay,
                User("Make the missing-key error name the key and the line number."),
                AddTool(web_fetch),
                User("Check the TOML spec with web_fetch and make sure empty values are allowed."),
                Compact,
                User("Run the tests with run_tests and fix what fails."),
            ]),
            other(
                "reviewer",
                "sim-review/2.1",
                REVIEWER_SYSTEM,
                read_only(),
                9_000.0,
                vec![
                    User("Review src/config.rs with read_file: the new error messages."),
                    User("And src/parser.rs: is parse_line tested for empty values?"),
                    User("Rate the change from 1 to 5."),
                ],
            ),
        ],
        "side-calls" => vec![coder(vec![
            User("Where does the config parser handle missing keys? Use grep to find it."),
            Title,
            User("Make the missing-key error name the key and the line number."),
            CommitMessage,
            User("Add a test for an empty value with edit_file."),
            Title,
            User("Run the tests with run_tests."),
            CommitMessage,
            User("Summarise what changed."),
        ])],
        "parallel" => {
            let turns = |a, b, c, d| vec![User(a), User(b), User(c), User(d)];
            vec![
                coder(turns(
                    "Where does the config parser handle missing keys? Use grep to find it.",
                    "Make the missing-key error name the key and the line number.",
                    "Add a test for it with edit_file.",
                    "Run the tests with run_tests.",
                )),
                other(
                    "tester",
                    "sim-coder/1.4 (prefixscope demo)",
                    TESTER_SYSTEM,
                    coding_tools()
                        .into_iter()
                        .filter(|t| t["function"]["name"] != "task")
                        .collect(),
                    700.0,
                    turns(
                        "Run cargo test -p config with run_tests.",
                        "Read the failing test with read_file.",
                        "Is the failure in the test or the code?",
                        "Run it again with run_tests.",
                    ),
                ),
                other(
                    "reviewer",
                    "sim-review/2.1",
                    REVIEWER_SYSTEM,
                    read_only(),
                    1_400.0,
                    turns(
                        "Review src/config.rs with read_file.",
                        "And src/parser.rs with read_file.",
                        "Are the error messages consistent?",
                        "Rate the change from 1 to 5.",
                    ),
                ),
                other(
                    "docs",
                    "sim-coder/1.4 (prefixscope demo)",
                    DOCS_SYSTEM,
                    read_only(),
                    2_100.0,
                    turns(
                        "Document src/config.rs; read_file it first.",
                        "Now src/parser.rs.",
                        "Which public items still lack docs? Use grep.",
                        "Write the module doc for src/lib.rs.",
                    ),
                ),
            ]
        }
        "volatile-system" => {
            let mut script = coder(vec![
                User("Where does the config parser handle missing keys? Use grep to find it."),
                User("Make the missing-key error name the key and the line number."),
                User("Run the tests with run_tests."),
            ]);
            script.system.volatile = true;
            vec![script]
        }
        "compaction" => {
            let mut script = coder(vec![
                User(
                    "Read src/config.rs and src/parser.rs with read_file and explain how they fit.",
                ),
                User("Now read_file src/lib.rs and src/error.rs too."),
                User("Where is parse_line called? Use grep."),
                Compact,
                User("Make the missing-key error name the key and the line number."),
                User("Read src/main.rs with read_file; is the error printed well?"),
                Compact,
                User("Run the tests with run_tests."),
            ]);
            script.verbose = 4;
            vec![script]
        }
        // One agent with the slot to itself and a prompt that only grows: every loss is the
        // engine's.
        "swa" => vec![coder(vec![
            User("Where does the config parser handle missing keys? Use grep to find it."),
            User("Make the missing-key error name the key and the line number."),
            User("Add a test for an empty value with edit_file."),
            User("Run the tests with run_tests."),
            User("Summarise what changed."),
        ])],
        other => {
            return Err(format!(
                "unknown scenario {other:?} (one of: {})",
                SCENARIOS.join(", ")
            ));
        }
    })
}

/// One conversation's state: what the next request will carry.
struct Conversation {
    key: String,
    system: SystemPrompt,
    tools: Vec<Value>,
    messages: Vec<Value>,
    stream: bool,
    /// Events the next request of this conversation will carry.
    pending: Vec<EventKind>,
    /// Requests so far (the nonce of a volatile system prompt).
    sent: u64,
}

impl Conversation {
    fn body(&self) -> Value {
        let mut messages =
            vec![json!({"role": "system", "content": self.system.render(self.sent)})];
        messages.extend(self.messages.iter().cloned());
        let mut body = json!({
            "model": "demo",
            "messages": messages,
            "max_tokens": 512,
            "temperature": 0.2,
            "stream": self.stream,
        });
        if !self.tools.is_empty() {
            body["tools"] = json!(self.tools);
        }
        if self.stream {
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    }

    /// A tool-call loop: request, run the tools the model called, until it answers in text.
    async fn run(
        &mut self,
        ctx: &mut Ctx,
        verbose: usize,
        subagent: Option<&Script>,
    ) -> Result<String, String> {
        loop {
            let mut events = std::mem::take(&mut self.pending);
            if self.system.volatile && self.sent > 0 {
                events.push(EventKind::SystemChanged);
            }
            let think = 300.0 + (ctx.hash(&[&self.key, &self.sent.to_string()]) % 1200) as f64;
            let answer = ctx
                .send(&self.body(), Some(&self.key), &events, think)
                .await?;
            self.sent += 1;
            let mut message = json!({"role": "assistant", "content": answer.content});
            if !answer.tool_calls.is_empty() {
                message["tool_calls"] = json!(answer.tool_calls);
            }
            self.messages.push(message);
            if answer.tool_calls.is_empty() {
                return Ok(answer.content.unwrap_or_default());
            }
            for call in &answer.tool_calls {
                let name = call["function"]["name"].as_str().unwrap_or_default();
                let arguments: Value = call["function"]["arguments"]
                    .as_str()
                    .and_then(|a| serde_json::from_str(a).ok())
                    .unwrap_or(Value::Null);
                let result = match (name, subagent) {
                    ("task", Some(spec)) => {
                        let prompt = arguments["prompt"].as_str().unwrap_or("Research the task.");
                        let mut sub = Conversation {
                            key: format!("{}/subagent-{}", self.key, self.sent),
                            system: spec.system.clone(),
                            tools: spec.tools.clone(),
                            messages: vec![json!({"role": "user", "content": prompt})],
                            stream: spec.stream,
                            pending: Vec::new(),
                            sent: 0,
                        };
                        Box::pin(sub.run(ctx, verbose, None)).await?
                    }
                    _ => tool_output(ctx, name, &arguments, verbose),
                };
                self.messages.push(json!({
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": result,
                }));
            }
        }
    }
}

/// What a tool returns: file texts, matches, test output; made up from the seed and arguments.
fn tool_output(ctx: &Ctx, name: &str, arguments: &Value, verbose: usize) -> String {
    let arg = |key: &str| arguments[key].as_str().unwrap_or("").to_string();
    let h = ctx.hash(&[name, &arguments.to_string()]);
    match name {
        "read_file" => {
            let path = arg("path");
            let lines = (20 + h % 40) as usize * verbose;
            let mut text = format!("// {path}\n");
            for i in 0..lines {
                let words = 4 + ((h >> (i % 48)) % 8) as usize;
                let body = sentence(h.wrapping_add(i as u64), words).to_lowercase();
                text.push_str(&format!(
                    "    let {} = {}; // {}\n",
                    body.split(' ').next().unwrap_or("x"),
                    i,
                    body
                ));
            }
            text
        }
        "grep" => (0..(3 + h % 6) * verbose as u64)
            .map(|i| {
                format!(
                    "src/{}.rs:{}: {}",
                    ["config", "parser", "lib", "error"][(i % 4) as usize],
                    10 + (h >> i) % 300,
                    sentence(h ^ i, 6).to_lowercase()
                )
            })
            .collect::<Vec<_>>()
            .join("\n"),
        "run_tests" => {
            let failing = h.is_multiple_of(3);
            let mut text = format!("$ {}\nrunning 24 tests\n", arg("command"));
            for i in 0..(24 * verbose as u64) {
                text.push_str(&format!("test tests::case_{i} ... ok\n"));
            }
            if failing {
                text.push_str("test tests::empty_value ... FAILED\n\nthread 'tests::empty_value' panicked at src/parser.rs:88:9:\nmissing key\n");
            }
            text.push_str(if failing {
                "test result: FAILED. 23 passed; 1 failed"
            } else {
                "test result: ok. 24 passed; 0 failed"
            });
            text
        }
        "edit_file" => format!("Applied the edit to {}.", arg("path")),
        "web_fetch" => (0..(8 * verbose))
            .map(|i| sentence(h.wrapping_add(i as u64), 14))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => format!("error: unknown tool {name}"),
    }
}

/// Runs one scripted agent to its end.
async fn run_script(script: Script, mut ctx: Ctx, subagent: Script) -> Result<(), String> {
    ctx.ready_at_ms = script.start_ms;
    let mut main = Conversation {
        key: format!("{}/main", script.name),
        system: script.system.clone(),
        tools: script.tools.clone(),
        messages: Vec::new(),
        stream: script.stream,
        pending: Vec::new(),
        sent: 0,
    };
    for step in &script.steps {
        match step {
            Step::User(text) => {
                main.messages.push(json!({"role": "user", "content": text}));
                main.run(&mut ctx, script.verbose, Some(&subagent)).await?;
                // The user reads the answer and types the next message.
                let typing = 3_000.0 + (ctx.hash(&[text]) % 5_000) as f64;
                ctx.ready_at_ms += typing;
            }
            Step::Title | Step::CommitMessage => {
                let (system, max_tokens) = match step {
                    Step::Title => (
                        "Write a five-word title for this conversation. Reply with the title only.",
                        12,
                    ),
                    _ => (
                        "Write a one-line commit message for the change discussed. Reply with the message only.",
                        24,
                    ),
                };
                let last_user = main
                    .messages
                    .iter()
                    .rev()
                    .find(|m| m["role"] == "user")
                    .cloned()
                    .unwrap_or_else(|| json!({"role": "user", "content": ""}));
                let body = json!({
                    "model": "demo",
                    "messages": [{"role": "system", "content": system}, last_user],
                    "max_tokens": max_tokens,
                    "stream": false,
                });
                ctx.send(&body, None, &[EventKind::SideCall], 200.0).await?;
            }
            Step::NextDay => {
                main.system.day += 1;
                main.pending.push(EventKind::SystemChanged);
            }
            Step::AddTool(make) => {
                main.tools.push(make());
                main.pending.push(EventKind::ToolsChanged);
            }
            Step::Compact => {
                let transcript: String = main
                    .messages
                    .iter()
                    .map(|m| {
                        format!(
                            "{}: {}\n",
                            m["role"].as_str().unwrap_or_default(),
                            m["content"].as_str().unwrap_or("(tool call)")
                        )
                    })
                    .collect();
                let body = json!({
                    "model": "demo",
                    "messages": [
                        {"role": "system", "content": "Summarise this coding session for a fresh context: the task, the files involved, what was changed and what is left. Be complete but short."},
                        {"role": "user", "content": transcript},
                    ],
                    "max_tokens": 400,
                    "stream": false,
                });
                let summary = ctx.send(&body, None, &[EventKind::SideCall], 500.0).await?;
                // The first request stays (the harness keeps the task), then the summary.
                let first = main.messages.first().cloned();
                main.messages = first.into_iter().collect();
                main.messages.push(json!({
                    "role": "user",
                    "content": format!(
                        "This session continues from an earlier conversation, summarised: {}",
                        summary.content.unwrap_or_default()
                    ),
                }));
                main.messages.push(json!({"role": "assistant", "content": "Understood. Continuing from the summary."}));
                main.pending.push(EventKind::Compaction);
            }
        }
    }
    Ok(())
}

/// Runs a scenario's agents against the server behind `proxy` until every script ends.
pub async fn run_scenario(
    scenario: &str,
    proxy: SocketAddr,
    seed: u64,
    speed: Arc<Speed>,
) -> Result<RunLog, String> {
    let scripts = scripts(scenario)?;
    let scheduler = Arc::new(Scheduler::new(scripts.len()));
    let log = Arc::new(Mutex::new(RunLog::default()));
    let subagent = Script {
        name: "subagent",
        user_agent: "",
        system: SystemPrompt {
            text: SUBAGENT_SYSTEM,
            day: 14,
            volatile: false,
        },
        tools: coding_tools().into_iter().take(2).collect(),
        stream: true,
        start_ms: 0.0,
        verbose: 1,
        steps: Vec::new(),
    };
    let mut tasks = tokio::task::JoinSet::new();
    for (id, script) in scripts.into_iter().enumerate() {
        let ctx = Ctx {
            id,
            name: script.name.to_string(),
            user_agent: script.user_agent.to_string(),
            proxy,
            sender: None,
            scheduler: Arc::clone(&scheduler),
            speed: Arc::clone(&speed),
            log: Arc::clone(&log),
            ready_at_ms: 0.0,
            seed: seed ^ (id as u64).wrapping_mul(0x9E37_79B9),
        };
        let scheduler = Arc::clone(&scheduler);
        let log = Arc::clone(&log);
        let subagent = subagent.clone();
        tasks.spawn(async move {
            let name = script.name;
            if let Err(e) = run_script(script, ctx, subagent).await
                && let Ok(mut log) = log.lock()
            {
                log.errors.push(format!("{name}: {e}"));
            }
            scheduler.done();
        });
    }
    while tasks.join_next().await.is_some() {}
    let log = log.lock().map(|l| l.clone()).unwrap_or_default();
    Ok(log)
}
