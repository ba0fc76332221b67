//! Hashed traces: Mooncake (`timestamp` ms, `input_length`, `output_length`, `hash_ids`, an
//! optional `session_id`) and qwen-bailian (`timestamp` in seconds, `chat_id`,
//! `parent_chat_id` with -1 for a root, `turn`, `type`). Requests are replayed in file order and
//! weighted as kvcache-simulator weighs them, so figures agree with it to the token.

use std::collections::HashMap;
use std::io::BufRead;

use serde::Deserialize;
use serde_json::Value;

use super::{FileInput, FileReport, Format, InputOptions};
use crate::cache::{Block, BlockKeys, Cut, Request, SessionId};

/// Only the fields we read; `hash_ids` stays raw so an id compares as its decimal text, as in
/// kvcache-simulator (`1` and `"1"` are one id).
#[derive(Deserialize)]
struct Row {
    timestamp: Option<Value>,
    input_length: Option<Value>,
    output_length: Option<Value>,
    hash_ids: Option<BoundedIds>,
    block_size: Option<Value>,
    session_id: Option<Value>,
    chat_id: Option<Value>,
    parent_chat_id: Option<Value>,
    /// Not a Mooncake field: read to say "did you mean" when `input_length` is missing.
    input_tokens: Option<Value>,
    /// Nor this: a WEKA conversation's list of requests (WEKA is written, not read).
    requests: Option<serde::de::IgnoredAny>,
}

/// A row's hash ids, refused while parsed past `limits::MAX_HASH_IDS_PER_ROW`: a row of
/// millions of ids never becomes a vector of them.
struct BoundedIds(Vec<Value>);

impl<'de> Deserialize<'de> for BoundedIds {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = BoundedIds;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an array of hash ids")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<BoundedIds, A::Error> {
                let bound = crate::limits::MAX_HASH_IDS_PER_ROW;
                let mut ids = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 12));
                while let Some(id) = seq.next_element::<Value>()? {
                    if ids.len() == bound {
                        return Err(serde::de::Error::custom(format!(
                            "more than {bound} hash ids in one row (the bound per row)"
                        )));
                    }
                    ids.push(id);
                }
                Ok(BoundedIds(ids))
            }
        }
        deserializer.deserialize_seq(Visitor)
    }
}

/// Maps a trace's hash ids to u64: non-negative integers (and their decimal text) as
/// themselves, any other text to its own id above 2^63 (so it meets no integer id).
#[derive(Default)]
struct IdInterner {
    others: HashMap<String, u64>,
}

impl IdInterner {
    fn id(&mut self, value: &Value) -> Option<u64> {
        let text = match value {
            Value::Number(n) => match n.as_u64() {
                Some(id) => return Some(id),
                None if n.is_i64() => n.to_string(),
                None => return None,
            },
            Value::String(s) => {
                if let Ok(id) = s.parse::<u64>()
                    && id.to_string() == *s
                {
                    return Some(id);
                }
                s.clone()
            }
            _ => return None,
        };
        let next = (1u64 << 63) + self.others.len() as u64;
        Some(*self.others.entry(text).or_insert(next))
    }
}

fn as_u64(value: Option<&Value>) -> Option<u64> {
    match value? {
        Value::Number(n) => n
            .as_u64()
            .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64)),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

fn as_key(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        _ => None,
    }
}

/// kvcache-simulator's block weight: the last block is partial, and never below one token.
pub fn block_tokens(input_length: u64, block_size: u32, index: usize) -> u32 {
    let block_size = u64::from(block_size);
    let remaining = input_length.saturating_sub(index as u64 * block_size);
    remaining.clamp(1, block_size) as u32
}

pub fn read(reader: impl BufRead, name: &str, format: Format, options: &InputOptions) -> FileInput {
    let block_size = options
        .block_size
        .unwrap_or_else(|| format.default_block_size());
    let mut rows = Rows::new(reader, name, format, block_size);
    let requests: Vec<Request> = rows.by_ref().collect();
    let mut report = rows.report;
    report.requests = requests.len() as u64;
    report.conversation_source = match format {
        Format::Bailian => "parent_chat_id".to_string(),
        _ if requests.iter().any(|r| r.conversation.is_some()) => "session_id".to_string(),
        _ => "none".to_string(),
    };
    FileInput {
        requests,
        report,
        analysis: None,
    }
}

/// A trace's requests one row at a time, in file order; bad and skipped rows are counted in
/// `report` as they are met. Holds the bailian chain roots and any non-integer ids seen.
pub struct Rows<R> {
    reader: R,
    format: Format,
    block_size: u32,
    ids: IdInterner,
    // bailian: each request's conversation is its chain's root chat.
    root_of: HashMap<String, String>,
    line_number: usize,
    buffer: Vec<u8>,
    finished: bool,
    pub report: FileReport,
}

impl<R: BufRead> Rows<R> {
    pub fn new(reader: R, name: &str, format: Format, block_size: u32) -> Rows<R> {
        Rows {
            reader,
            format,
            block_size,
            ids: IdInterner::default(),
            root_of: HashMap::new(),
            line_number: 0,
            buffer: Vec::new(),
            finished: false,
            report: FileReport::new(name, format),
        }
    }

    /// The line the last request came from.
    pub fn line(&self) -> usize {
        self.line_number
    }
}

impl<R: BufRead> Iterator for Rows<R> {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        while !self.finished {
            use crate::limits::{Line, MAX_LINE_BYTES, read_line_bounded, too_long_message};
            match read_line_bounded(&mut self.reader, &mut self.buffer, MAX_LINE_BYTES) {
                Ok(Line::Eof) => self.finished = true,
                Ok(Line::Read { .. }) => {}
                Ok(Line::TooLong { bytes }) => {
                    self.line_number += 1;
                    self.report.bad(self.line_number, too_long_message(bytes));
                    continue;
                }
                Err(e) => {
                    self.report
                        .bad(self.line_number + 1, format!("read error: {e}"));
                    self.report.read_error = Some(format!("line {}: {e}", self.line_number + 1));
                    self.finished = true;
                }
            }
            if self.finished {
                break;
            }
            self.line_number += 1;
            let line = self.buffer.trim_ascii();
            if line.is_empty() {
                continue;
            }
            let row: Row = match serde_json::from_slice(line) {
                Ok(row) => row,
                Err(e) if e.is_syntax() || e.is_eof() => {
                    self.report
                        .bad(self.line_number, format!("not a JSON object ({e})"));
                    continue;
                }
                Err(e) => {
                    self.report.bad(self.line_number, e.to_string());
                    continue;
                }
            };
            if row.requests.is_some() && row.hash_ids.is_none() && self.report.hint.is_none() {
                self.report.hint = Some(
                    "its rows hold a list of requests, as a WEKA trace does: prefixscope writes WEKA traces (export --to weka) but reads only Mooncake and bailian".into(),
                );
            }
            match request_of(
                row,
                self.format,
                self.block_size,
                &mut self.ids,
                &mut self.root_of,
            ) {
                Ok(Some(request)) => return Some(request),
                Ok(None) => self.report.skip("no hash_ids"),
                Err(error) => self.report.bad(self.line_number, error),
            }
        }
        None
    }
}

fn request_of(
    row: Row,
    format: Format,
    block_size: u32,
    ids: &mut IdInterner,
    root_of: &mut HashMap<String, String>,
) -> Result<Option<Request>, String> {
    let Some(BoundedIds(hash_ids)) = row.hash_ids.filter(|h| !h.0.is_empty()) else {
        return Ok(None);
    };
    let input_length = match &row.input_length {
        None if row.input_tokens.is_some() => {
            return Err(
                "no input_length (the prompt's tokens); did you mean input_tokens? Mooncake rows name it input_length".into(),
            );
        }
        None => return Err("no input_length (the prompt's tokens)".into()),
        Some(value) => as_u64(Some(value))
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("input_length {value} must be a positive integer"))?,
    };
    let input_length = crate::limits::plausible_tokens(input_length).ok_or_else(|| {
        format!(
            "input_length {input_length} is past {} tokens",
            crate::limits::MAX_PROMPT_TOKENS
        )
    })?;
    if let Some(own) = row.block_size.as_ref()
        && as_u64(Some(own)) != Some(u64::from(block_size))
    {
        return Err(format!(
            "block_size {own} differs from the block size in use ({block_size})"
        ));
    }
    let mut blocks = Vec::with_capacity(hash_ids.len());
    for (index, value) in hash_ids.iter().enumerate() {
        let id = ids
            .id(value)
            .ok_or_else(|| format!("hash id {value} is neither an integer nor a string"))?;
        blocks.push(Block {
            id,
            tokens: block_tokens(input_length, block_size, index),
        });
    }
    let t_ms = row
        .timestamp
        .as_ref()
        .and_then(|t| t.as_f64())
        .map(|t| match format {
            Format::Bailian => (t * 1000.0).round() as i64,
            _ => t.round() as i64,
        });
    let (conversation, session_id) = match format {
        Format::Bailian => {
            let chat = as_key(row.chat_id.as_ref());
            let parent = as_key(row.parent_chat_id.as_ref()).filter(|p| p != "-1");
            let root = match (&parent, &chat) {
                (Some(parent), _) => Some(
                    root_of
                        .get(parent)
                        .cloned()
                        .unwrap_or_else(|| parent.clone()),
                ),
                (None, Some(chat)) => Some(chat.clone()),
                (None, None) => None,
            };
            if let (Some(chat), Some(root)) = (&chat, &root) {
                root_of.insert(chat.clone(), root.clone());
            }
            (root.map(|r| format!("chat {r}")), None)
        }
        _ => {
            let session = as_key(row.session_id.as_ref());
            (
                session.clone(),
                session.map(|value| SessionId {
                    source: "session_id".to_string(),
                    value,
                }),
            )
        }
    };
    Ok(Some(Request {
        t_ms,
        blocks,
        input_tokens: input_length,
        output_tokens: as_u64(row.output_length.as_ref()),
        conversation,
        session_id,
        cut: Some(Cut::TraceHashIds),
        keys: Some(BlockKeys::Trace),
        ..Request::default()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_follow_the_reference() {
        assert_eq!(block_tokens(1000, 512, 0), 512);
        assert_eq!(block_tokens(1000, 512, 1), 488);
        assert_eq!(block_tokens(1000, 512, 2), 1);
    }

    #[test]
    fn ids_compare_as_their_decimal_text() {
        let mut ids = IdInterner::default();
        assert_eq!(ids.id(&Value::from(7)), Some(7));
        assert_eq!(ids.id(&Value::from("7")), Some(7));
        let odd = ids.id(&Value::from("07"));
        assert!(odd.is_some_and(|id| id >= 1 << 63));
        assert_eq!(ids.id(&Value::from("07")), odd);
        assert_eq!(ids.id(&Value::from(1.5)), None);
    }

    #[test]
    fn bad_rows_are_counted_and_the_rest_read() {
        let text = "{\"timestamp\": 0, \"input_length\": 600, \"output_length\": 5, \"hash_ids\": [1, 2]}\n\
                    not json\n\
                    {\"timestamp\": 1, \"input_length\": 0, \"hash_ids\": [1]}\n\
                    {\"timestamp\": 2, \"input_length\": 10, \"hash_ids\": []}\n\
                    {\"timestamp\": 3, \"input_length\": 10, \"hash_ids\": [1]}";
        let options = InputOptions {
            block_size: Some(512),
            ..InputOptions::default()
        };
        let input = read(text.as_bytes(), "t", Format::Mooncake, &options);
        assert_eq!(input.requests.len(), 2);
        assert_eq!(input.requests[0].blocks[1].tokens, 88);
        let lines: Vec<usize> = input.report.bad_rows.iter().map(|b| b.line).collect();
        assert_eq!(lines, vec![2, 3]);
        assert_eq!(input.report.skipped.get("no hash_ids"), Some(&1));
    }

    #[test]
    fn bailian_conversations_follow_parent_chains_and_seconds_become_ms() {
        let text = "{\"chat_id\": 1, \"parent_chat_id\": -1, \"timestamp\": 0.5, \"input_length\": 20, \"output_length\": 1, \"turn\": 1, \"hash_ids\": [1, 2]}\n\
                    {\"chat_id\": 2, \"parent_chat_id\": -1, \"timestamp\": 1.0, \"input_length\": 20, \"output_length\": 1, \"turn\": 1, \"hash_ids\": [1, 3]}\n\
                    {\"chat_id\": 3, \"parent_chat_id\": 1, \"timestamp\": 2.25, \"input_length\": 40, \"output_length\": 1, \"turn\": 2, \"hash_ids\": [1, 2, 4]}\n\
                    {\"chat_id\": 4, \"parent_chat_id\": 3, \"timestamp\": 3.0, \"input_length\": 40, \"output_length\": 1, \"turn\": 3, \"hash_ids\": [1, 2, 4, 5]}";
        let input = read(
            text.as_bytes(),
            "b",
            Format::Bailian,
            &InputOptions::default(),
        );
        let conversations: Vec<Option<&str>> = input
            .requests
            .iter()
            .map(|r| r.conversation.as_deref())
            .collect();
        assert_eq!(
            conversations,
            vec![
                Some("chat 1"),
                Some("chat 2"),
                Some("chat 1"),
                Some("chat 1")
            ]
        );
        assert_eq!(input.requests[2].t_ms, Some(2250));
        assert_eq!(input.report.conversation_source, "parent_chat_id");
    }
}
