//! The prompt's token layout from llama.cpp itself: `POST /apply-template` renders a request's
//! messages and tools with the server's chat template, `POST /tokenize` (`with_pieces`) gives the
//! rendered prompt's tokens and the text of each. Each message is given the tokens from the start
//! of its content to the start of the next message's content, so the prefix through message `k`
//! ends where the server's reuse ends when message `k + 1` is a new message of the same role (its
//! role header included). The first message also carries what comes before it (BOS, a default
//! system prompt), the last one the generation prompt: the counts add up to the rendered prompt,
//! which is checked against the server's own prompt count before it is used. Tools weigh what
//! rendering them adds (0 where the template drops them).
//!
//! One render and one tokenize per distinct request (two renders when the template renders
//! tools), off the proxy's request path: `analyze --tokenize` runs it over a recording.

use std::collections::HashMap;

use serde_json::{Value, json};

use std::time::Duration;

use super::{Client, Endpoint};
use crate::http1;
use prefixscope_core::normalize::{Api, chat_request, digest};
use prefixscope_core::record::{Record, TokenCounts};

/// What the layout pass did.
#[derive(Debug, Default)]
pub(super) struct LayoutOutcome {
    /// The server renders templates (`/apply-template` answered a request).
    pub available: bool,
    /// Records whose counts are the server's layout.
    pub laid_out: u64,
    /// Rendered, but the rendered prompt's tokens differ from the server's prompt count (the
    /// request was rendered from a converted form, or the server changed): left to estimates.
    pub mismatched: u64,
    /// Rendered, but a message's content could not be found in the rendered prompt.
    pub unlocated: u64,
    pub requests: u64,
    /// The server could not be reached at all (the pass stopped at once).
    pub unreachable: Option<String>,
    pub warnings: Vec<String>,
}

/// Lays out every full-mode chat record without counts yet; records it lays out get
/// `TokenCounts { layout: true, .. }`.
pub(super) async fn lay_out_all(endpoint: &Endpoint, records: &mut [Record]) -> LayoutOutcome {
    let mut client = Client::new(endpoint, super::REQUEST_TIMEOUT);
    let mut outcome = LayoutOutcome::default();
    // The same request twice (a retry, a replayed file) is rendered once.
    let mut known: HashMap<u64, Laid> = HashMap::new();
    let mut failures = 0u64;
    let mut last_failure = String::new();
    let mut first_unlocated = String::new();
    let mut first_mismatched = String::new();
    for record in records.iter_mut() {
        match lay_out_record(&mut client, record, &mut known).await {
            Ok(Verdict::LaidOut) => {
                outcome.available = true;
                outcome.laid_out += 1;
            }
            Ok(Verdict::Mismatched(which)) => {
                outcome.available = true;
                if outcome.mismatched == 0 {
                    first_mismatched = which;
                }
                outcome.mismatched += 1;
            }
            Ok(Verdict::Unlocated(which)) => {
                outcome.available = true;
                if outcome.unlocated == 0 {
                    first_unlocated = which;
                }
                outcome.unlocated += 1;
            }
            Ok(Verdict::Skipped) => {}
            Err(LayoutFailure::Unreachable(e)) if client.requests <= 1 => {
                outcome.unreachable = Some(e);
                break;
            }
            // Not a llama.cpp that renders: the messages' own counts follow.
            Err(LayoutFailure::NoEndpoint) if !outcome.available => break,
            Err(failure) => {
                failures += 1;
                last_failure = match failure {
                    LayoutFailure::Refused(why) | LayoutFailure::Unreachable(why) => why,
                    LayoutFailure::NoEndpoint => "/apply-template answered 404".to_string(),
                };
                if !outcome.available && failures >= super::MAX_EARLY_FAILURES {
                    break;
                }
            }
        }
    }
    if failures > 0 {
        outcome.warnings.push(format!(
            "{failures} requests could not be rendered by /apply-template (last: {last_failure}) and keep the messages' own counts"
        ));
    }
    if outcome.mismatched > 0 {
        outcome.warnings.push(format!(
            "{} rendered requests did not add up to the server's prompt count (first: {first_mismatched}; rendered from a converted form, or another template): they keep the messages' own counts",
            outcome.mismatched
        ));
    }
    if outcome.unlocated > 0 {
        outcome.warnings.push(format!(
            "{} rendered requests had a message whose content is not in the rendered prompt (first: {first_unlocated}): they keep the messages' own counts",
            outcome.unlocated
        ));
    }
    outcome.requests = client.requests;
    outcome
}

/// What became of one record.
enum Verdict {
    LaidOut,
    /// Rendered, but not adding up to the server's prompt count (what the two were).
    Mismatched(String),
    /// Rendered, but a message (named) is not in the rendered prompt.
    Unlocated(String),
    /// Not a full-mode chat request, or counted already.
    Skipped,
}

/// Lays out one record (a request rendered before, by `known`, is not rendered again) and
/// stores its counts when they add up to the rendered prompt and to the server's count.
async fn lay_out_record(
    client: &mut Client<'_>,
    record: &mut Record,
    known: &mut HashMap<u64, Laid>,
) -> Result<Verdict, LayoutFailure> {
    let api = Api::from_path(&record.request.path);
    if !api.is_chat() || record.request.digest.is_some() || record.tokens.is_some() {
        return Ok(Verdict::Skipped);
    }
    let Some(body) = record.request.body.as_ref() else {
        return Ok(Verdict::Skipped);
    };
    let Some(chat) = chat_request(api, body) else {
        return Ok(Verdict::Skipped);
    };
    let request_digest = digest::request_digest_of(api, body, &chat, true);
    let (messages, tools) = chat;
    if messages.is_empty() {
        return Ok(Verdict::Skipped);
    }
    let messages = as_rendered(api, &messages);
    // The request, by the hashes of what renders (the API shapes it the same way every time).
    let key = {
        let mut hashes = vec![api.as_str()];
        hashes.extend(request_digest.messages.iter().map(|m| m.hash.as_str()));
        hashes.extend(request_digest.tools.iter().map(|t| t.hash.as_str()));
        xxhash_rust::xxh3::xxh3_64(hashes.join(" ").as_bytes())
    };
    let laid = match known.get(&key) {
        Some(laid) => laid.clone(),
        None => {
            let laid = lay_out(client, &messages, &tools).await?;
            known.insert(key, laid.clone());
            laid
        }
    };
    let (prompt, message_counts, tool_counts, lead) = match laid {
        Laid::Counts {
            prompt,
            messages,
            tools,
            lead,
        } => (prompt, messages, tools, lead),
        Laid::Unlocated(message) => {
            return Ok(Verdict::Unlocated(match message {
                Some(k) => format!(
                    "record {}, message {k} ({})",
                    record.id,
                    messages[k]["role"].as_str().unwrap_or("?")
                ),
                None => format!("record {}, its tools", record.id),
            }));
        }
    };
    // Counts are kept by hash: a message sent twice in one request (Claude Code repeats its
    // "Output token limit hit" note) gets its first count both times, and the difference moves
    // to the message after it, so every boundary but that one stays where the server has it.
    let mut by_hash: std::collections::BTreeMap<String, u32> = std::collections::BTreeMap::new();
    let mut carry: i64 = 0;
    for (message, &count) in request_digest.messages.iter().zip(&message_counts) {
        let count = i64::from(count) + carry;
        match by_hash.get(&message.hash) {
            Some(&first) => carry = count - i64::from(first),
            None => {
                carry = 0;
                by_hash.insert(message.hash.clone(), u32::try_from(count).unwrap_or(0));
                if count < 0 {
                    carry = count;
                }
            }
        }
    }
    if carry != 0 {
        return Ok(Verdict::Mismatched(format!(
            "record {}: a repeated message's counts cannot be kept by hash",
            record.id
        )));
    }
    let counts = TokenCounts {
        messages: by_hash,
        tools: request_digest
            .tools
            .iter()
            .map(|t| t.hash.clone())
            .zip(tool_counts)
            .collect(),
        layout: true,
        lead,
    };
    // By construction they add up to the rendered prompt; they must also add up to what the
    // server counted for this very request.
    let server = record
        .response
        .as_ref()
        .and_then(|r| r.body.as_ref())
        .and_then(|body| prefixscope_core::input::server_counts(body).prompt_tokens);
    if server.is_some_and(|s| s != u64::from(prompt)) {
        return Ok(Verdict::Mismatched(format!(
            "record {}: rendered {prompt} tokens, the server counted {}",
            record.id,
            server.unwrap_or_default()
        )));
    }
    record.tokens = Some(counts);
    Ok(Verdict::LaidOut)
}

#[derive(Clone)]
enum Laid {
    Counts {
        prompt: u32,
        messages: Vec<u32>,
        tools: Vec<u32>,
        /// Tokens before the first message's content, where no tools render there.
        lead: Option<u32>,
    },
    /// The message whose content is not in the rendered prompt (None: the tools' tokens are
    /// not where they were looked for).
    Unlocated(Option<usize>),
}

enum LayoutFailure {
    Unreachable(String),
    /// `/apply-template` answered 404/405.
    NoEndpoint,
    /// The server answered without a prompt or tokens (a template error, a bad request).
    Refused(String),
}

async fn lay_out(
    client: &mut Client<'_>,
    messages: &[Value],
    tools: &[Value],
) -> Result<Laid, LayoutFailure> {
    // Only function tools go to the template, in the chat API's shape, as llama.cpp's own
    // conversions of the Anthropic and Responses APIs keep them (Codex also sends namespaces of
    // tools, Claude Code may send server tools, which `/apply-template` refuses); the others
    // weigh 0.
    let (functions, rendered_tools): (Vec<usize>, Vec<Value>) = tools
        .iter()
        .enumerate()
        .filter_map(|(i, tool)| Some((i, as_function_tool(tool)?)))
        .unzip();
    let prompt = render(client, messages, &rendered_tools).await?;
    let pieces = tokenize(client, &prompt).await?;
    let (mut counts, lead) = match split(&prompt, &pieces, messages) {
        Ok(split) => split,
        Err(k) => return Ok(Laid::Unlocated(Some(k))),
    };
    let mut lead = Some(lead);
    let total: u32 = counts.iter().sum();
    let mut tool_counts = vec![0; tools.len()];
    // Tools weigh what rendering them adds; a template that never names them drops them.
    let named = rendered_tools.iter().any(|tool| {
        tool_name(tool)
            .filter(|name| !name.is_empty())
            .is_some_and(|name| prompt.contains(name))
    });
    if named {
        let without = render(client, messages, &[]).await?;
        let without_tokens = u32::try_from(tokenize(client, &without).await?.len()).unwrap_or(0);
        let added = total.saturating_sub(without_tokens);
        // Rendered tools sit before or inside the first message in the templates that render
        // them; they are taken from the first message's count, as the analysis puts them first.
        if counts[0] < added {
            return Ok(Laid::Unlocated(None));
        }
        counts[0] -= added;
        // Rendered tools may sit before the first content, inside the lead: not known here.
        lead = None;
        for (&i, n) in functions.iter().zip(share(added, &rendered_tools)) {
            tool_counts[i] = n;
        }
    }
    Ok(Laid::Counts {
        prompt: total,
        messages: counts,
        tools: tool_counts,
        lead,
    })
}

/// The messages as the server hands them to its template. llama.cpp's conversion of the
/// Anthropic API joins the system blocks into one string with nothing between them (measured on
/// Claude Code's three-block system prompt: 3,112 tokens as the server counted, 3,114 with the
/// blocks as text parts, which the template joins with newlines).
fn as_rendered(api: Api, messages: &[Value]) -> Vec<Value> {
    let mut messages = messages.to_vec();
    if api == Api::AnthropicMessages {
        // The chat form keeps thinking blocks' text (`thinking`) to name a changed reasoning;
        // what the server renders of them is not known here, so they are sent as before.
        for message in &mut messages {
            if let Some(object) = message.as_object_mut() {
                object.remove("thinking");
            }
        }
        for message in messages.iter_mut().filter(|m| m["role"] == "system") {
            if let Some(parts) = message.get("content").and_then(Value::as_array) {
                let joined: String = parts
                    .iter()
                    .filter_map(|part| part.get("text").and_then(Value::as_str))
                    .collect();
                message["content"] = Value::String(joined);
            }
        }
    }
    messages
}

/// A tool in the chat API's function shape (an Anthropic tool converted as llama.cpp converts
/// it), or None for a tool that is not a function.
fn as_function_tool(tool: &Value) -> Option<Value> {
    match tool.get("type").and_then(Value::as_str) {
        Some("function") => Some(tool.clone()),
        None | Some("custom") if tool.get("input_schema").is_some() => {
            Some(prefixscope_core::normalize::function_tool(tool))
        }
        _ => None,
    }
}

fn tool_name(tool: &Value) -> Option<&str> {
    tool.pointer("/function/name")
        .or_else(|| tool.get("name"))
        .and_then(Value::as_str)
}

/// `total` over the tools by the length of their JSON (the last gets the rounding).
fn share(total: u32, tools: &[Value]) -> Vec<u32> {
    let sizes: Vec<u64> = tools.iter().map(|t| t.to_string().len() as u64).collect();
    let all: u64 = sizes.iter().sum::<u64>().max(1);
    let mut given = 0u32;
    let mut shares: Vec<u32> = sizes
        .iter()
        .map(|&size| {
            let n = u32::try_from(u64::from(total) * size / all).unwrap_or(0);
            given += n;
            n
        })
        .collect();
    if let Some(last) = shares.last_mut() {
        *last += total - given.min(total);
    }
    shares
}

async fn render(
    client: &mut Client<'_>,
    messages: &[Value],
    tools: &[Value],
) -> Result<String, LayoutFailure> {
    let path = format!("{}/apply-template", client.endpoint.base);
    let mut body = json!({ "messages": messages });
    if !tools.is_empty() {
        body["tools"] = json!(tools);
    }
    let first = client.requests == 0;
    let (status, reply) = client.post(&path, &body).await.map_err(|e| {
        if first {
            LayoutFailure::Unreachable(e)
        } else {
            LayoutFailure::Refused(e)
        }
    })?;
    if status == 404 || status == 405 {
        return Err(LayoutFailure::NoEndpoint);
    }
    match reply.get("prompt").and_then(Value::as_str) {
        Some(prompt) if (200..300).contains(&status) => Ok(prompt.to_string()),
        _ => Err(LayoutFailure::Refused(match server_error(&reply) {
            Some(why) => format!("{path} answered {status}: {why}"),
            None => format!("{path} answered {status}"),
        })),
    }
}

/// llama.cpp's `{"error": {"message"}}`, shortened to a line.
fn server_error(reply: &Value) -> Option<String> {
    let message = reply.pointer("/error/message")?.as_str()?;
    Some(
        prefixscope_core::text::printable_line(&message.chars().take(160).collect::<String>())
            .into_owned(),
    )
}

/// The byte length of each token of `prompt`, as the server tokenizes a prompt (special tokens
/// parsed, BOS added where the model wants one).
async fn tokenize(client: &mut Client<'_>, prompt: &str) -> Result<Vec<usize>, LayoutFailure> {
    let path = format!("{}/tokenize", client.endpoint.base);
    let body = json!({ "content": prompt, "add_special": true, "parse_special": true, "with_pieces": true });
    let (status, reply) = client
        .post(&path, &body)
        .await
        .map_err(LayoutFailure::Refused)?;
    let tokens = reply
        .get("tokens")
        .and_then(Value::as_array)
        .filter(|_| (200..300).contains(&status))
        .ok_or_else(|| LayoutFailure::Refused(format!("{path} answered {status}")))?;
    tokens
        .iter()
        .map(|token| match token.get("piece") {
            Some(Value::String(text)) => Some(text.len()),
            // Pieces that are not whole UTF-8 come as their bytes.
            Some(Value::Array(bytes)) => Some(bytes.len()),
            _ => None,
        })
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| LayoutFailure::Refused(format!("{path} answered without pieces")))
}

/// What marks where a message's content starts in the rendered prompt: the first words of its
/// text (the template may trim it), or else the name of its first tool call.
enum Needle {
    /// The first words, and the whole (trimmed) text.
    Text(String, String),
    /// Tool calls, tool results without text, empty content: templates may not render them.
    Optional(Option<String>),
}

fn needle(message: &Value) -> Needle {
    let text = digest::content_text(message.get("content"));
    let text = text.trim();
    if !text.is_empty() {
        let mut end = text.len().min(64);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        return Needle::Text(text[..end].trim_end().to_string(), text.to_string());
    }
    Needle::Optional(
        message
            .pointer("/tool_calls/0/function/name")
            .and_then(Value::as_str)
            .filter(|name| !name.is_empty())
            .map(str::to_string),
    )
}

/// Each message's tokens in `prompt`, given the byte length of each of its tokens: from the start
/// of its content to the start of the next message's (the first from 0, the last to the end).
/// A message with text must be found, in order (`Err` gives the first that is not); one without
/// (a tool call the template does not render) starts where the previous content ended.
/// Each message's tokens (see the module's doc) and the tokens before the first message's
/// content; `Err(k)` when message `k`'s content is not in the rendered prompt.
pub(super) fn split(
    prompt: &str,
    pieces: &[usize],
    messages: &[Value],
) -> Result<(Vec<u32>, u32), usize> {
    // Each message's content as (start, end) in the prompt.
    let mut spans: Vec<(usize, usize)> = Vec::with_capacity(messages.len());
    let mut without_text = Vec::new();
    let mut cursor = 0usize;
    for (k, message) in messages.iter().enumerate() {
        let rest = prompt.get(cursor..).ok_or(k)?;
        let (at, length) = match needle(message) {
            // Past the whole text where the template wrote it as it is, so a later message
            // that quotes it (a model repeating its system prompt) is not found inside it.
            Needle::Text(start, whole) => {
                let at = rest.find(&start).ok_or(k)?;
                let length = if rest[at..].starts_with(&whole) {
                    whole.len()
                } else {
                    start.len()
                };
                (at, length)
            }
            Needle::Optional(name) => {
                without_text.push(k);
                name.and_then(|name| rest.find(&name).map(|at| (at, name.len())))
                    .unwrap_or((0, 0))
            }
        };
        spans.push((cursor + at, cursor + at + length));
        cursor += at + length;
    }
    start_after_the_header(prompt, messages, &mut spans, &without_text);
    let starts: Vec<usize> = spans.iter().map(|&(start, _)| start).collect();
    // Token end offsets; pieces before the text (a BOS the template did not write) end at 0.
    let rendered: usize = pieces.iter().sum();
    let extra = rendered.checked_sub(prompt.len()).ok_or(0usize)?;
    let mut token_ends = Vec::with_capacity(pieces.len());
    let mut offset = 0usize;
    for &length in pieces {
        offset += length;
        token_ends.push(offset.saturating_sub(extra));
    }
    // A token that runs into a message's content belongs to the message: it changes with it.
    let tokens_before = |byte: usize| token_ends.partition_point(|&end| end <= byte);
    let mut bounds: Vec<usize> = starts.iter().skip(1).map(|&s| tokens_before(s)).collect();
    bounds.insert(0, 0);
    bounds.push(pieces.len());
    let lead = starts.first().map_or(0, |&s| tokens_before(s));
    Ok((
        bounds
            .windows(2)
            .map(|w| u32::try_from(w[1].saturating_sub(w[0])).unwrap_or(u32::MAX))
            .collect(),
        u32::try_from(lead).unwrap_or(u32::MAX),
    ))
}

/// What `LiveLayout` did, for the summary at exit.
#[derive(Debug, Default)]
pub struct LiveLayoutStats {
    pub laid_out: std::sync::atomic::AtomicU64,
    /// Rendered but left to estimates (did not add up to the server's count, or a message was
    /// not found in the rendered prompt).
    pub not_laid_out: std::sync::atomic::AtomicU64,
    /// Why the layout stopped, once it did (no `/apply-template`, the server stopped answering).
    pub stopped: std::sync::Mutex<Option<String>>,
}

impl LiveLayoutStats {
    /// One line for the end of `record` and `watch`, or None when nothing was tried.
    pub fn summary(&self) -> Option<String> {
        use std::sync::atomic::Ordering::Relaxed;
        let (laid, not) = (self.laid_out.load(Relaxed), self.not_laid_out.load(Relaxed));
        let stopped = self.stopped.lock().ok().and_then(|s| s.clone());
        if laid == 0 && not == 0 && stopped.is_none() {
            return None;
        }
        let mut line = format!(
            "{} laid out as llama.cpp renders them",
            prefixscope_core::units::plural(laid, "record")
        );
        if not > 0 {
            line.push_str(&format!(", {not} left to estimates"));
        }
        if let Some(why) = stopped {
            line.push_str(&format!("; layout stopped: {why}"));
        }
        Some(line)
    }
}

/// Consecutive failures after which the live layout stops asking.
const LIVE_MAX_FAILURES: u32 = 3;
/// The live layout waits at most this long for one answer: the recorder's thread waits on it.
const LIVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Distinct requests remembered (a retry is not rendered twice); forgotten all at once past it.
const LIVE_KNOWN: usize = 4096;

/// `record` and `watch`: each chat record whose response shows a llama.cpp upstream (`timings`,
/// a `.gguf` model) is laid out on the recorder's thread as it is recorded, before it is written
/// and before the live engine reads it, so the screen and a later `analyze` of the file agree.
/// Never on the proxy's request path; after `LIVE_MAX_FAILURES` failures in a row, or a server
/// without `/apply-template`, it stops asking and says why.
pub struct LiveLayout {
    endpoint: Endpoint,
    runtime: tokio::runtime::Runtime,
    sender: Option<http1::Sender>,
    known: HashMap<u64, Laid>,
    failures: u32,
    stopped: bool,
    pub stats: std::sync::Arc<LiveLayoutStats>,
}

impl crate::recorder::Enrichment for LiveLayout {
    fn enrich(&mut self, record: &mut Record) {
        self.lay_out(record);
    }

    fn active(&self) -> bool {
        !self.stopped
    }
}

impl LiveLayout {
    /// None for an upstream the tokenizer cannot reach (https) or a runtime that cannot start.
    pub fn new(upstream_url: &str) -> Option<LiveLayout> {
        let endpoint = Endpoint::parse(upstream_url).ok()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        Some(LiveLayout {
            endpoint,
            runtime,
            sender: None,
            known: HashMap::new(),
            failures: 0,
            stopped: false,
            stats: std::sync::Arc::default(),
        })
    }

    pub fn lay_out(&mut self, record: &mut Record) {
        use std::sync::atomic::Ordering::Relaxed;
        if self.stopped || !from_llama_cpp(record) {
            return;
        }
        if self.known.len() > LIVE_KNOWN {
            self.known.clear();
        }
        let mut client = Client {
            endpoint: &self.endpoint,
            sender: self.sender.take(),
            requests: 0,
            timeout: LIVE_TIMEOUT,
        };
        let verdict = self
            .runtime
            .block_on(lay_out_record(&mut client, record, &mut self.known));
        self.sender = client.sender.take();
        let stop = |why: String, stats: &LiveLayoutStats| {
            if let Ok(mut stopped) = stats.stopped.lock() {
                *stopped = Some(why);
            }
        };
        match verdict {
            Ok(Verdict::LaidOut) => {
                self.failures = 0;
                self.stats.laid_out.fetch_add(1, Relaxed);
            }
            Ok(Verdict::Mismatched(_) | Verdict::Unlocated(_)) => {
                self.failures = 0;
                self.stats.not_laid_out.fetch_add(1, Relaxed);
            }
            Ok(Verdict::Skipped) => {}
            Err(LayoutFailure::NoEndpoint) => {
                self.stopped = true;
                stop("the server has no /apply-template".into(), &self.stats);
            }
            Err(LayoutFailure::Unreachable(why) | LayoutFailure::Refused(why)) => {
                self.failures += 1;
                self.stats.not_laid_out.fetch_add(1, Relaxed);
                if self.failures >= LIVE_MAX_FAILURES {
                    self.stopped = true;
                    stop(
                        format!("{} failures in a row (last: {why})", self.failures),
                        &self.stats,
                    );
                }
            }
        }
    }
}

/// The response says the server is llama.cpp.
fn from_llama_cpp(record: &Record) -> bool {
    record
        .response
        .as_ref()
        .and_then(|r| r.body.as_ref())
        .is_some_and(|body| {
            prefixscope_core::input::server_counts(body).server
                == Some(prefixscope_core::input::ServerSeen::LlamaCpp)
        })
}

/// Places each message without text (a tool call, an empty reply) right after its role header,
/// where a text would start: where the request that produced it ended, with the generation
/// prompt. Found by the generation prompt this prompt ends with (the text after the last
/// content): its longest ending that the gap before the message holds. Without it, the
/// template's tool-call markup (`<tool_call>\n{"name": "`) would count with the message before,
/// which then differs from that message in the request that produced the call.
fn start_after_the_header(
    prompt: &str,
    messages: &[Value],
    spans: &mut [(usize, usize)],
    without_text: &[usize],
) {
    /// Markup between one content and the next, at most (a bound on the search).
    const MAX_MARKUP: usize = 4096;
    let ends_with_a_reply = messages
        .last()
        .is_some_and(|m| m.get("role").and_then(Value::as_str) == Some("assistant"));
    let Some(&(_, last_end)) = spans.last() else {
        return;
    };
    if ends_with_a_reply {
        return;
    }
    let generation_prompt = {
        let tail = prompt.get(last_end..).unwrap_or_default();
        let mut from = tail.len().saturating_sub(256);
        while !tail.is_char_boundary(from) {
            from += 1;
        }
        &tail[from..]
    };
    for &k in without_text {
        if k == 0 || messages[k].get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let from = spans[k - 1].1;
        let found = spans[k].1 > spans[k].0;
        let to = if found {
            spans[k].0
        } else {
            spans
                .get(k + 1..)
                .and_then(|later| later.iter().map(|&(start, _)| start).find(|&s| s > from))
                .unwrap_or(prompt.len())
        };
        let mut to = to.min(from + MAX_MARKUP).max(from);
        while !prompt.is_char_boundary(to) {
            to -= 1;
        }
        let Some(gap) = prompt.get(from..to) else {
            continue;
        };
        let header_end = generation_prompt
            .char_indices()
            .map(|(i, _)| &generation_prompt[i..])
            // Not a bare newline or bracket that any gap holds.
            .filter(|ending| ending.chars().filter(|c| !c.is_whitespace()).count() >= 3)
            .find_map(|ending| gap.find(ending).map(|at| from + at + ending.len()));
        if let Some(start) = header_end {
            spans[k].0 = start;
            if !found {
                spans[k].1 = start;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(tokens: &[&str]) -> (String, Vec<usize>) {
        (tokens.concat(), tokens.iter().map(|t| t.len()).collect())
    }

    #[test]
    fn each_message_runs_from_its_content_to_the_next_content() {
        let (prompt, lengths) = pieces(&[
            "<|im_start|>",
            "system",
            "\n",
            "Be",
            " brief",
            "<|im_end|>",
            "\n",
            "<|im_start|>",
            "user",
            "\n",
            "hi",
            "<|im_end|>",
            "\n",
            "<|im_start|>",
            "assistant",
            "\n",
        ]);
        let messages = [
            json!({"role": "system", "content": "Be brief"}),
            json!({"role": "user", "content": [{"type": "text", "text": "hi"}]}),
        ];
        // system: up to "hi" (its header and the user's header); user: "hi" to the end;
        // the lead: the three tokens before "Be brief".
        assert_eq!(split(&prompt, &lengths, &messages), Ok((vec![10, 6], 3)));
    }

    #[test]
    fn a_bos_the_text_does_not_show_counts_with_the_first_message() {
        let (prompt, mut lengths) = pieces(&["A", "\n", "b"]);
        lengths.insert(0, 3); // "<s>"
        let messages = [
            json!({"role": "user", "content": "A"}),
            json!({"role": "assistant", "content": "b"}),
        ];
        assert_eq!(split(&prompt, &lengths, &messages), Ok((vec![3, 1], 1)));
    }

    #[test]
    fn a_content_missing_from_the_prompt_gives_no_layout() {
        let (prompt, lengths) = pieces(&["hello"]);
        let messages = [
            json!({"role": "user", "content": "hello"}),
            json!({"role": "user", "content": "absent"}),
        ];
        assert_eq!(split(&prompt, &lengths, &messages), Err(1));
        // Order matters: a content seen only before the previous one is not found.
        let (prompt, lengths) = pieces(&["b", "a"]);
        let messages = [
            json!({"role": "user", "content": "a"}),
            json!({"role": "user", "content": "b"}),
        ];
        assert_eq!(split(&prompt, &lengths, &messages), Err(1));
    }

    #[test]
    fn a_reply_quoting_an_earlier_message_is_found_after_it() {
        // The assistant repeats the start of the system message: it is looked for past the
        // system message's whole text.
        let (prompt, lengths) = pieces(&["S", ": ", "Quote me", " please", "|", "Quote me"]);
        let messages = [
            json!({"role": "system", "content": "S: Quote me please"}),
            json!({"role": "assistant", "content": "Quote me"}),
        ];
        assert_eq!(split(&prompt, &lengths, &messages), Ok((vec![5, 1], 0)));
    }

    #[test]
    fn a_tool_call_is_found_by_its_name() {
        let (prompt, lengths) = pieces(&["q", " ", "{\"name\": \"ls\"}"]);
        let messages = [
            json!({"role": "user", "content": "q"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}),
        ];
        assert_eq!(split(&prompt, &lengths, &messages), Ok((vec![2, 1], 0)));
        // A template that does not render the call: the call starts where the question ended.
        let (prompt, lengths) = pieces(&["q", " ", "next"]);
        let messages = [
            messages[0].clone(),
            messages[1].clone(),
            json!({"role": "user", "content": "next"}),
        ];
        assert_eq!(split(&prompt, &lengths, &messages), Ok((vec![1, 1, 1], 0)));
    }

    #[test]
    fn a_tool_call_starts_after_its_role_header() {
        let header = ["<|im_start|>", "assistant", "\n"];
        let end = ["<|im_end|>", "\n"];
        let call = ["<tool_call>", "\n", "{\"name\": \"", "ls", "\"}"];
        let mut tokens = vec!["q"];
        tokens.extend(end);
        tokens.extend(header);
        tokens.extend(call);
        tokens.extend(end);
        tokens.extend(["<|im_start|>", "tool", "\n", "a.txt"]);
        tokens.extend(end);
        tokens.extend(header);
        let (prompt, lengths) = pieces(&tokens);
        let messages = [
            json!({"role": "user", "content": "q"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": "1", "content": "a.txt"}),
        ];
        // The question keeps what it had as the request before (its end and the reply's
        // header: 6 tokens), the call runs from `<tool_call>` to the tool's content.
        assert_eq!(split(&prompt, &lengths, &messages), Ok((vec![6, 10, 6], 0)));
        // Not rendered at all: the same place, after the header the template wrote for it.
        let mut tokens = vec!["q"];
        tokens.extend(end);
        tokens.extend(header);
        tokens.extend(end);
        tokens.extend(["<|im_start|>", "tool", "\n", "a.txt"]);
        tokens.extend(end);
        tokens.extend(header);
        let (prompt, lengths) = pieces(&tokens);
        assert_eq!(split(&prompt, &lengths, &messages), Ok((vec![6, 5, 6], 0)));
    }

    #[test]
    fn tool_shares_add_up() {
        let tools = [json!({"name": "a"}), json!({"name": "bbbbbbbbbb"})];
        let shares = share(10, &tools);
        assert_eq!(shares.iter().sum::<u32>(), 10);
        assert!(shares[1] > shares[0]);
        assert_eq!(share(0, &tools), vec![0, 0]);
    }
}
