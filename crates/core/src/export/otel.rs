//! OpenTelemetry GenAI spans (GuideLLM `kind=otel`), session per line:
//! `{"trace_id", "spans": [...]}`, one trace per conversation, one `chat` span per request.
//!
//! NOT anonymous: replay sends the recorded messages, so each span carries the request's
//! messages (system prompt included, as a leading message: GuideLLM does not read
//! `gen_ai.system_instructions`), the reply and the tool definitions, as JSON strings.
//!
//! - `start_time`/`end_time` ISO-8601 UTC (GuideLLM rejects numbers), `status.code` 0,
//!   `attributes` a plain object with both usage counts (GuideLLM skips a span without them),
//!   `gen_ai.usage.cache_read.input_tokens` when the server reported reuse, and
//!   `gen_ai.response.finish_reasons` (`tool_calls` when the reply called tools, which is what
//!   makes GuideLLM replay a tool loop).
//! - Ids are salted hashes (they name nothing of the source).
//! - A trace is written when its conversation's last request arrives (GuideLLM times each trace
//!   from its own first span, so order between traces does not matter). Held: the spans of open
//!   conversations, messages included.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use serde_json::{Map, Value, json};

use super::{ExportRequest, Salt, Tag, Written, write_line};
use crate::calendar::civil_from_days;

struct Trace {
    seq: u64,
    trace_id: String,
    spans: Vec<Value>,
}

pub struct Writer {
    salt: Salt,
    open: HashMap<u64, Trace>,
    next_seq: u64,
    held: u64,
    written: Written,
}

/// Epoch milliseconds as `2025-01-01T00:00:00.100Z`.
pub(crate) fn iso8601(epoch_ms: i64) -> String {
    let days = epoch_ms.div_euclid(86_400_000);
    let ms_of_day = epoch_ms.rem_euclid(86_400_000);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1000 % 60,
        ms_of_day % 1000
    )
}

impl Writer {
    pub fn new(salt: Salt) -> Writer {
        Writer {
            salt,
            open: HashMap::new(),
            next_seq: 0,
            held: 0,
            written: Written::default(),
        }
    }

    fn hex(&self, tag: Tag, words: &[u64]) -> String {
        format!("{:016x}", self.salt.id(tag, words))
    }

    fn span(&self, request: &ExportRequest, trace_id: &str, index: usize) -> Value {
        let key = request.conversation.key;
        let mut attributes = Map::new();
        let mut set = |name: &str, value: Value| {
            attributes.insert(name.to_string(), value);
        };
        set("gen_ai.operation.name", json!("chat"));
        set("gen_ai.conversation.id", json!(trace_id));
        set("gen_ai.usage.input_tokens", json!(request.input_tokens));
        set("gen_ai.usage.output_tokens", json!(request.output.tokens));
        if let Some(reused) = request.server_reused_tokens {
            set("gen_ai.usage.cache_read.input_tokens", json!(reused));
        }
        let finish = if request.reply.tool_calls > 0 {
            "tool_calls"
        } else {
            "stop"
        };
        set("gen_ai.response.finish_reasons", json!([finish]));
        let model = request
            .content
            .as_ref()
            .and_then(|c| c.model.clone())
            .or_else(|| request.model.clone());
        if let Some(model) = &model {
            set("gen_ai.request.model", json!(model));
        }
        if let Some(content) = &request.content {
            let text = |v: &[Value]| serde_json::to_string(v).unwrap_or_default();
            set(
                "gen_ai.input.messages",
                json!(text(&content.input_messages)),
            );
            if !content.output_messages.is_empty() {
                set(
                    "gen_ai.output.messages",
                    json!(text(&content.output_messages)),
                );
            }
            if let Some(tools) = &content.tools {
                set(
                    "gen_ai.tool.definitions",
                    json!(serde_json::to_string(tools).unwrap_or_default()),
                );
            }
        }
        let end_ms = request
            .t_ms
            .saturating_add(request.duration_ms.unwrap_or(0) as i64);
        json!({
            "trace_id": trace_id,
            "span_id": self.hex(Tag::Label, &[key, index as u64 + 1]),
            "name": model.map_or("chat".to_string(), |m| format!("chat {m}")),
            "start_time": iso8601(request.t_ms),
            "end_time": iso8601(end_ms),
            "status": {"code": 0},
            "attributes": attributes,
        })
    }

    pub fn push(&mut self, request: ExportRequest, out: &mut dyn Write) -> io::Result<()> {
        let key = request.conversation.key;
        if !self.open.contains_key(&key) {
            let trace_id = format!(
                "{}{}",
                self.hex(Tag::Conversation, &[key, 1]),
                self.hex(Tag::Conversation, &[key, 2])
            );
            self.open.insert(
                key,
                Trace {
                    seq: self.next_seq,
                    trace_id,
                    spans: Vec::new(),
                },
            );
            self.next_seq += 1;
        }
        let (trace_id, index) = match self.open.get(&key) {
            Some(trace) => (trace.trace_id.clone(), trace.spans.len()),
            None => return Ok(()),
        };
        let span = self.span(&request, &trace_id, index);
        if let Some(trace) = self.open.get_mut(&key) {
            trace.spans.push(span);
        }
        self.written.requests += 1;
        self.written.tool_results += u64::from(request.after_tool_result);
        self.held += 1;
        self.written.held_requests_max = self.written.held_requests_max.max(self.held);
        if request.conversation.last
            && let Some(trace) = self.open.remove(&key)
        {
            self.write(trace, out)?;
        }
        Ok(())
    }

    fn write(&mut self, trace: Trace, out: &mut dyn Write) -> io::Result<()> {
        self.held = self.held.saturating_sub(trace.spans.len() as u64);
        write_line(
            out,
            &json!({"trace_id": trace.trace_id, "spans": trace.spans}),
        )?;
        self.written.lines += 1;
        self.written.conversations += 1;
        Ok(())
    }

    /// Writes the traces still open, in order of their first span.
    pub fn finish(&mut self, out: &mut dyn Write) -> io::Result<Written> {
        let open: BTreeMap<u64, Trace> = self.open.drain().map(|(_, t)| (t.seq, t)).collect();
        for trace in open.into_values() {
            self.write(trace, out)?;
        }
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Content;
    use super::super::tests_support::request;
    use super::*;

    #[test]
    fn iso_timestamps() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(1_735_689_600_100), "2025-01-01T00:00:00.100Z");
        assert_eq!(iso8601(1_709_210_096_789), "2024-02-29T12:34:56.789Z");
        assert_eq!(iso8601(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn one_trace_per_conversation_with_messages_and_usage() {
        let salt = Salt::from_text("otel test").unwrap_or_else(|| unreachable!());
        let mut w = Writer::new(salt);
        let mut out = Vec::new();
        let mut first = request(1, 1_735_689_600_000, 40);
        first.duration_ms = Some(250);
        first.server_reused_tokens = Some(32);
        first.reply.tool_calls = 1;
        first.content = Some(Content {
            input_messages: vec![json!({"role": "system", "content": "be brief"})],
            output_messages: vec![json!({"role": "assistant", "content": null,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]})],
            tools: Some(json!([{"type": "function", "function": {"name": "ls"}}])),
            model: Some("m".into()),
        });
        let mut second = request(1, 1_735_689_601_000, 50);
        second.conversation.last = true;
        w.push(first, &mut out).ok();
        assert!(out.is_empty());
        w.push(second, &mut out).ok();
        let line: Value = serde_json::from_slice(&out).unwrap_or_default();
        let spans = line["spans"].as_array().cloned().unwrap_or_default();
        assert_eq!(spans.len(), 2);
        let a = &spans[0]["attributes"];
        assert_eq!(spans[0]["start_time"], "2025-01-01T00:00:00.000Z");
        assert_eq!(spans[0]["end_time"], "2025-01-01T00:00:00.250Z");
        assert_eq!(a["gen_ai.usage.cache_read.input_tokens"], 32);
        assert_eq!(a["gen_ai.usage.input_tokens"], 40);
        assert_eq!(a["gen_ai.response.finish_reasons"], json!(["tool_calls"]));
        assert!(
            a["gen_ai.input.messages"]
                .as_str()
                .is_some_and(|m| m.contains("be brief"))
        );
        assert!(
            spans[1]["attributes"]
                .get("gen_ai.usage.cache_read.input_tokens")
                .is_none()
        );
        assert_eq!(line["trace_id"].as_str().map(str::len), Some(32));
        assert_ne!(spans[0]["span_id"], spans[1]["span_id"]);
    }
}
