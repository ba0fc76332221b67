//! WEKA agentic traces (GuideLLM `kind=weka`, AIPerf `weka_trace`): one JSON object per
//! conversation, `{"id", "models", "block_size", "hash_id_scope": "local", "tool_tokens",
//! "system_tokens", "requests": [...]}`, one per line (AIPerf wants one object per `.json` file;
//! `validate.sh` splits the lines).
//!
//! - Requests: `t` (seconds from the export's first request, so conversations keep their offsets:
//!   GuideLLM measures every conversation from the earliest request in the file), `type` (`s`
//!   streamed, `n` not), a salted model label, `in`, `out`, `hash_ids` of full blocks only
//!   (`floor(in / block_size)`), `input_types`, `output_types`, `stop`, and, when the source timed
//!   the exchange, `api_time`, `think_time` (since the conversation's previous request ended) and
//!   `ttft` (streamed only). No other field: AIPerf rejects unknown names.
//! - Tool loops: a reply with tool calls is `stop: "tool_use"`; a request whose newest message is
//!   a tool result is `input_types: ["tool_result"]`.
//! - Subagents: a conversation the analysis links to the tool call it answers
//!   ([`crate::analysis::subagent_links`], the link the TUI shows) is written as a
//!   `type: "subagent"` entry of the calling conversation, right after the request that called
//!   the tool; the parent's next turn waits for it. AIPerf reads one level only, so a subagent's
//!   subagent goes to the same top-level conversation.
//! - Conversations are written in order of their first request (GuideLLM warns and misaligns
//!   otherwise), each once it and its subagents have ended. Held: the requests of conversations
//!   not yet written, i.e. of every conversation that started since the oldest one still open.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use serde::Serialize;

use super::{ExportRequest, Salt, Tag, Written, seconds_since, write_line};

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Request {
    pub t: f64,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub model: String,
    #[serde(rename = "in")]
    pub input: u64,
    pub out: u64,
    pub hash_ids: Vec<u64>,
    pub input_types: Vec<&'static str>,
    pub output_types: Vec<&'static str>,
    pub stop: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_time: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub think_time: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft: Option<f64>,
}

#[derive(Serialize)]
struct ConversationOut<'a> {
    id: String,
    models: Vec<&'a str>,
    block_size: u32,
    hash_id_scope: &'static str,
    tool_tokens: u64,
    system_tokens: u64,
    requests: Vec<ItemOut<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum ItemOut<'a> {
    Request(&'a Request),
    Subagent(SubagentOut<'a>),
}

#[derive(Serialize)]
struct SubagentOut<'a> {
    t: f64,
    #[serde(rename = "type")]
    kind: &'static str,
    agent_id: String,
    subagent_type: &'static str,
    duration_ms: u64,
    total_tokens: u64,
    tool_use_count: u64,
    status: &'static str,
    models: Vec<&'a str>,
    tool_tokens: u64,
    system_tokens: u64,
    requests: Vec<&'a Request>,
}

enum Item {
    Request(Request),
    /// A subagent conversation, by key.
    Subagent(u64),
}

struct Conversation {
    items: Vec<Item>,
    models: Vec<String>,
    first_t_ms: i64,
    /// When the newest request ended.
    last_end_ms: i64,
    finished: bool,
    /// The top-level conversation this one is a subagent of.
    host: Option<u64>,
    open_subagents: u32,
    requests: u64,
    total_tokens: u64,
    tool_use_count: u64,
}

pub struct Writer {
    origin_ms: i64,
    block_size: u32,
    salt: Salt,
    conversations: HashMap<u64, Conversation>,
    /// Top-level conversations not written yet, by order of their first request.
    order: BTreeMap<u64, u64>,
    next_seq: u64,
    held: u64,
    written: Written,
}

/// What the client added since the model last spoke: tool results, text, or both.
fn input_types(request: &ExportRequest) -> Vec<&'static str> {
    let mut types = Vec::with_capacity(2);
    if request.after_tool_result {
        types.push("tool_result");
    }
    if request.new_text || !request.after_tool_result {
        types.push("text");
    }
    types
}

impl Writer {
    pub fn new(origin_ms: i64, block_size: u32, salt: Salt) -> Writer {
        Writer {
            origin_ms,
            block_size,
            salt,
            conversations: HashMap::new(),
            order: BTreeMap::new(),
            next_seq: 0,
            held: 0,
            written: Written::default(),
        }
    }

    /// The top-level conversation `request` (the first of its own) is a subagent of, if any:
    /// the one its link names (or that one's host), while it is open.
    fn host_of(&self, request: &ExportRequest) -> Option<u64> {
        let parent = request.conversation.spawned_by?;
        let open = self.conversations.get(&parent).filter(|c| !c.finished)?;
        Some(open.host.unwrap_or(parent))
    }

    fn item(&self, request: &ExportRequest, previous_end_ms: Option<i64>) -> Request {
        let calls = request.reply.tool_calls > 0;
        let mut output_types = Vec::with_capacity(2);
        if request.reply.text || !calls {
            output_types.push("text");
        }
        if calls {
            output_types.push("tool_use");
        }
        let seconds = |ms: u64| ms as f64 / 1000.0;
        let streamed = request.streamed == Some(true);
        Request {
            t: seconds_since(request.t_ms, self.origin_ms),
            kind: if streamed { "s" } else { "n" },
            model: self.model_label(request.model.as_deref()),
            input: request.input_tokens,
            out: request.output.tokens,
            hash_ids: request.hash_ids.clone(),
            input_types: input_types(request),
            output_types,
            stop: if calls { "tool_use" } else { "end_turn" },
            api_time: request.duration_ms.map(seconds),
            think_time: request.duration_ms.map(|_| {
                previous_end_ms.map_or(0.0, |end| {
                    seconds(request.t_ms.saturating_sub(end).max(0) as u64)
                })
            }),
            ttft: request.ttft_ms.filter(|_| streamed).map(seconds),
        }
    }

    fn model_label(&self, model: Option<&str>) -> String {
        self.salt.label(
            "model",
            self.salt.key(Tag::Label, model.unwrap_or_default()),
        )
    }

    pub fn push(&mut self, request: ExportRequest, out: &mut dyn Write) -> io::Result<()> {
        let key = request.conversation.key;
        let end_ms = request
            .t_ms
            .saturating_add(request.duration_ms.unwrap_or(0) as i64);
        if !self.conversations.contains_key(&key) {
            let host = self.host_of(&request);
            match host.and_then(|h| self.conversations.get_mut(&h)) {
                Some(hosting) => {
                    hosting.items.push(Item::Subagent(key));
                    hosting.open_subagents += 1;
                    self.written.subagents += 1;
                }
                None => {
                    self.order.insert(self.next_seq, key);
                }
            }
            self.conversations.insert(
                key,
                Conversation {
                    items: Vec::new(),
                    models: Vec::new(),
                    first_t_ms: request.t_ms,
                    last_end_ms: end_ms,
                    finished: false,
                    host,
                    open_subagents: 0,
                    requests: 0,
                    total_tokens: 0,
                    tool_use_count: 0,
                },
            );
            self.next_seq += 1;
        }
        let previous_end = self
            .conversations
            .get(&key)
            .filter(|c| c.requests > 0)
            .map(|c| c.last_end_ms);
        let item = self.item(&request, previous_end);
        let Some(conversation) = self.conversations.get_mut(&key) else {
            return Ok(());
        };
        if !conversation.models.contains(&item.model) {
            conversation.models.push(item.model.clone());
        }
        conversation.items.push(Item::Request(item));
        conversation.last_end_ms = end_ms;
        conversation.requests += 1;
        conversation.total_tokens += request.input_tokens + request.output.tokens;
        conversation.tool_use_count += u64::from(request.reply.tool_calls);
        self.written.requests += 1;
        self.written.tool_results += u64::from(request.after_tool_result);
        self.held += 1;
        self.written.held_requests_max = self.written.held_requests_max.max(self.held);
        if request.conversation.last {
            conversation.finished = true;
            if let Some(host) = conversation.host
                && let Some(hosting) = self.conversations.get_mut(&host)
            {
                hosting.open_subagents = hosting.open_subagents.saturating_sub(1);
            }
        }
        self.flush(out, false)
    }

    /// Writes the oldest conversations that are complete (all of them when `all`).
    fn flush(&mut self, out: &mut dyn Write, all: bool) -> io::Result<()> {
        while let Some((&seq, &key)) = self.order.first_key_value() {
            let complete = self
                .conversations
                .get(&key)
                .is_none_or(|c| c.finished && c.open_subagents == 0);
            if !(complete || all) {
                break;
            }
            self.order.remove(&seq);
            self.write_conversation(key, out)?;
            self.remove(key);
        }
        Ok(())
    }

    fn remove(&mut self, key: u64) {
        if let Some(conversation) = self.conversations.remove(&key) {
            self.held = self.held.saturating_sub(conversation.requests);
            for item in conversation.items {
                if let Item::Subagent(child) = item {
                    self.remove(child);
                }
            }
        }
    }

    fn write_conversation(&mut self, key: u64, out: &mut dyn Write) -> io::Result<()> {
        let Some(conversation) = self.conversations.get(&key) else {
            return Ok(());
        };
        let mut models: Vec<&str> = conversation.models.iter().map(String::as_str).collect();
        let mut requests = Vec::with_capacity(conversation.items.len());
        for item in &conversation.items {
            match item {
                Item::Request(request) => requests.push(ItemOut::Request(request)),
                Item::Subagent(child) => {
                    if let Some(subagent) = self.subagent(*child) {
                        for model in &subagent.models {
                            if !models.contains(model) {
                                models.push(model);
                            }
                        }
                        requests.push(ItemOut::Subagent(subagent));
                    }
                }
            }
        }
        write_line(
            out,
            &ConversationOut {
                id: self.salt.label("conv", key),
                models,
                block_size: self.block_size,
                hash_id_scope: "local",
                tool_tokens: 0,
                system_tokens: 0,
                requests,
            },
        )?;
        self.written.lines += 1;
        self.written.conversations += 1;
        Ok(())
    }

    fn subagent(&self, key: u64) -> Option<SubagentOut<'_>> {
        let c = self.conversations.get(&key)?;
        let requests: Vec<&Request> = c
            .items
            .iter()
            .filter_map(|item| match item {
                Item::Request(r) => Some(r),
                Item::Subagent(_) => None,
            })
            .collect();
        Some(SubagentOut {
            t: seconds_since(c.first_t_ms, self.origin_ms),
            kind: "subagent",
            agent_id: self.salt.label("agent", key),
            subagent_type: "subagent",
            duration_ms: c.last_end_ms.saturating_sub(c.first_t_ms).max(0) as u64,
            total_tokens: c.total_tokens,
            tool_use_count: c.tool_use_count,
            status: "completed",
            models: c.models.iter().map(String::as_str).collect(),
            tool_tokens: 0,
            system_tokens: 0,
            requests,
        })
    }

    /// Writes every conversation still held, in start order.
    pub fn finish(&mut self, out: &mut dyn Write) -> io::Result<Written> {
        self.flush(out, true)?;
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests_support::request;
    use super::super::{Reply, Salt};
    use super::*;
    use serde_json::Value;

    fn lines(out: &[u8]) -> Vec<Value> {
        String::from_utf8_lossy(out)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn salt() -> Salt {
        Salt::from_text("weka test").unwrap_or_else(|| unreachable!())
    }

    #[test]
    fn one_object_per_conversation_with_tool_loops_in_start_order() {
        let mut w = Writer::new(0, 64, salt());
        let mut out = Vec::new();
        // Conversation 1 starts first and ends last; conversation 2 runs meanwhile.
        let mut a1 = request(1, 0, 200);
        a1.duration_ms = Some(100);
        a1.reply = Reply {
            text: false,
            tool_calls: 1,
        };
        a1.hash_ids = vec![1, 2, 3];
        let mut b1 = request(2, 50, 100);
        b1.duration_ms = Some(10);
        b1.conversation.last = true;
        let mut a2 = request(1, 400, 260);
        a2.duration_ms = Some(100);
        a2.after_tool_result = true;
        a2.new_text = false;
        a2.conversation.last = true;
        w.push(a1, &mut out).ok();
        w.push(b1, &mut out).ok();
        assert!(out.is_empty(), "conversation 2 waits for conversation 1");
        w.push(a2, &mut out).ok();
        let written = w.finish(&mut out).unwrap_or_default();
        let rows = lines(&out);
        assert_eq!(rows.len(), 2);
        assert_eq!(written.held_requests_max, 3);
        let first = &rows[0];
        assert_eq!(first["hash_id_scope"], "local");
        assert_eq!(first["block_size"], 64);
        let requests = first["requests"].as_array().cloned().unwrap_or_default();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0]["stop"], "tool_use");
        assert_eq!(requests[0]["output_types"], serde_json::json!(["tool_use"]));
        assert_eq!(
            requests[1]["input_types"],
            serde_json::json!(["tool_result"])
        );
        assert_eq!(requests[1]["t"], 0.4);
        assert_eq!(requests[1]["think_time"], 0.3);
        assert_eq!(requests[1]["api_time"], 0.1);
        assert_eq!(rows[1]["requests"][0]["t"], 0.05);
        assert!(
            first["id"]
                .as_str()
                .is_some_and(|id| id.starts_with("conv-"))
        );
        assert!(
            requests[0]["model"]
                .as_str()
                .is_some_and(|m| m.starts_with("model-"))
        );
    }

    #[test]
    fn a_conversation_linked_to_a_tool_call_is_written_inside_its_caller() {
        let mut w = Writer::new(0, 64, salt());
        let mut out = Vec::new();
        let mut parent = request(1, 0, 300);
        parent.duration_ms = Some(100);
        parent.reply.tool_calls = 1;
        // Linked by the analysis to conversation 1's tool call.
        let mut child1 = request(2, 150, 100);
        child1.conversation.spawned_by = Some(1);
        child1.duration_ms = Some(50);
        child1.reply.tool_calls = 1;
        // The child's own step, then its end.
        let mut child2 = request(2, 250, 140);
        child2.conversation.spawned_by = Some(1);
        child2.duration_ms = Some(50);
        child2.after_tool_result = true;
        child2.new_text = false;
        child2.conversation.last = true;
        // Not linked: conversations of their own.
        let mut peer = request(4, 160, 100);
        peer.conversation.last = true;
        // Linked to a conversation already written: one of its own.
        let mut stranger = request(5, 170, 100);
        stranger.conversation.spawned_by = Some(4);
        stranger.conversation.last = true;
        let mut parent2 = request(1, 400, 420);
        parent2.after_tool_result = true;
        parent2.new_text = false;
        parent2.conversation.last = true;
        for r in [parent, child1, peer, stranger, child2, parent2] {
            w.push(r, &mut out).ok();
        }
        let written = w.finish(&mut out).unwrap_or_default();
        assert_eq!(written.subagents, 1);
        assert_eq!(written.conversations, 3);
        assert_eq!(written.requests, 6);
        let rows = lines(&out);
        let requests = rows[0]["requests"].as_array().cloned().unwrap_or_default();
        let kinds: Vec<&str> = requests
            .iter()
            .map(|r| r["type"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(kinds, vec!["n", "subagent", "n"]);
        let sub = &requests[1];
        assert_eq!(sub["t"], 0.15);
        assert_eq!(sub["duration_ms"], 150);
        assert_eq!(sub["total_tokens"], 250);
        assert_eq!(sub["tool_use_count"], 1);
        assert_eq!(sub["requests"].as_array().map(Vec::len), Some(2));
        assert!(
            sub["agent_id"]
                .as_str()
                .is_some_and(|a| a.starts_with("agent-"))
        );
    }

    #[test]
    fn a_subagents_subagent_joins_the_top_level_conversation() {
        let mut w = Writer::new(0, 64, salt());
        let mut out = Vec::new();
        let mk = |key, t, spawned_by, calls, last| {
            let mut r = request(key, t, 100);
            r.conversation.last = last;
            r.conversation.spawned_by = spawned_by;
            r.reply.tool_calls = calls;
            r
        };
        w.push(mk(1, 0, None, 1, false), &mut out).ok();
        w.push(mk(2, 10, Some(1), 1, false), &mut out).ok();
        w.push(mk(3, 20, Some(2), 0, true), &mut out).ok();
        w.push(mk(2, 30, Some(1), 0, true), &mut out).ok();
        w.push(mk(1, 40, None, 0, true), &mut out).ok();
        let rows = lines(&out);
        assert_eq!(rows.len(), 1);
        let kinds: Vec<&str> = rows[0]["requests"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| r["type"].as_str().unwrap_or_default())
            .collect();
        assert_eq!(kinds, vec!["n", "subagent", "subagent", "n"]);
    }
}
