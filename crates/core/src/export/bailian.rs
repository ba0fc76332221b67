//! Qwen-Bailian traces (AIPerf `bailian_trace`; GuideLLM reads them as `kind=mooncake` with
//! `hash_id_block_size=16`): one line per request,
//! `{"chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type", "turn",
//! "hash_ids"}`.
//!
//! - `chat_id`: the request's number in the export, from 1 (it names nothing of the source);
//!   `parent_chat_id` the previous request of the same conversation, -1 for the first; `turn`
//!   counts from 1 along the conversation. AIPerf follows the parent chain to form sessions.
//! - `timestamp` in seconds (a float) from the export's first request; `input_length` the whole
//!   prompt; `type` the request type (`text`), not a model.
//! - Held: the last chat id and turn of each open conversation, until its last request.

use std::collections::HashMap;
use std::io::{self, Write};

use serde::Serialize;

use super::{ExportRequest, Written, seconds_since, write_line};

#[derive(Debug, Serialize)]
pub(crate) struct Row<'a> {
    pub chat_id: u64,
    pub parent_chat_id: i64,
    pub timestamp: f64,
    pub input_length: u64,
    pub output_length: u64,
    #[serde(rename = "type")]
    pub request_type: &'static str,
    pub turn: u32,
    pub hash_ids: &'a [u64],
}

pub struct Writer {
    origin_ms: i64,
    next_chat_id: u64,
    /// Open conversations: their last chat id and turn.
    open: HashMap<u64, (u64, u32)>,
    written: Written,
}

impl Writer {
    pub fn new(origin_ms: i64) -> Writer {
        Writer {
            origin_ms,
            next_chat_id: 1,
            open: HashMap::new(),
            written: Written::default(),
        }
    }

    pub fn push(&mut self, request: &ExportRequest, out: &mut dyn Write) -> io::Result<()> {
        let chat_id = self.next_chat_id;
        self.next_chat_id += 1;
        let key = request.conversation.key;
        let (parent_chat_id, turn) = match self.open.get(&key) {
            Some(&(parent, turn)) => (parent as i64, turn + 1),
            None => {
                self.written.conversations += 1;
                (-1, 1)
            }
        };
        if request.conversation.last {
            self.open.remove(&key);
        } else {
            self.open.insert(key, (chat_id, turn));
        }
        write_line(
            out,
            &Row {
                chat_id,
                parent_chat_id,
                timestamp: seconds_since(request.t_ms, self.origin_ms),
                input_length: request.input_tokens,
                output_length: request.output.tokens,
                request_type: "text",
                turn,
                hash_ids: &request.hash_ids,
            },
        )?;
        self.written.lines += 1;
        self.written.requests += 1;
        self.written.tool_results += u64::from(request.after_tool_result);
        Ok(())
    }

    pub fn written(&self) -> Written {
        self.written
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests_support::request;
    use super::*;

    #[test]
    fn chains_follow_conversations_and_close_at_their_last_request() {
        let mut w = Writer::new(0);
        let mut out = Vec::new();
        let mut a1 = request(1, 0, 40);
        let b1 = request(2, 500, 20);
        let mut a2 = request(1, 1_250, 60);
        a1.hash_ids = vec![10, 11, 12];
        a2.conversation.last = true;
        let mut a3 = request(1, 2_000, 60); // same key after the last: a new conversation
        a3.conversation.last = true;
        for r in [&a1, &b1, &a2, &a3] {
            w.push(r, &mut out).ok();
        }
        let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let chain: Vec<(i64, i64, i64)> = rows
            .iter()
            .map(|r| {
                (
                    r["chat_id"].as_i64().unwrap_or(0),
                    r["parent_chat_id"].as_i64().unwrap_or(0),
                    r["turn"].as_i64().unwrap_or(0),
                )
            })
            .collect();
        assert_eq!(chain, vec![(1, -1, 1), (2, -1, 1), (3, 1, 2), (4, -1, 1)]);
        assert_eq!(rows[2]["timestamp"], 1.25);
        assert_eq!(rows[0]["type"], "text");
        assert_eq!(rows[0]["hash_ids"], serde_json::json!([10, 11, 12]));
        assert_eq!(w.written().conversations, 3);
    }
}
