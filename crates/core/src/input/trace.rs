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
#[derive(Deserialize, Default)]
#[cfg_attr(test, derive(Debug, PartialEq))]
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
#[cfg_attr(test, derive(Debug, PartialEq))]
enum BoundedIds {
    /// Every id a non-negative integer: 8 bytes each, the whole of nearly every trace.
    Integers(Vec<u64>),
    Mixed(Vec<HashId>),
}

impl BoundedIds {
    fn len(&self) -> usize {
        match self {
            BoundedIds::Integers(ids) => ids.len(),
            BoundedIds::Mixed(ids) => ids.len(),
        }
    }

    fn push(&mut self, id: HashId) {
        if let (BoundedIds::Integers(ids), HashId::Integer(id)) = (&mut *self, &id) {
            ids.push(*id);
            return;
        }
        // The first id that is not an integer: the row is kept as written from here on.
        if let BoundedIds::Integers(ids) = self {
            let integers = std::mem::take(ids);
            *self = BoundedIds::Mixed(integers.into_iter().map(HashId::Integer).collect());
        }
        if let BoundedIds::Mixed(ids) = self {
            ids.push(id);
        }
    }
}

/// One hash id as written: a non-negative integer read straight to its value (nearly every id
/// of every trace), anything else kept as JSON for [`IdInterner`] to name or refuse.
#[cfg_attr(test, derive(Debug, PartialEq))]
enum HashId {
    Integer(u64),
    Other(Value),
}

impl<'de> Deserialize<'de> for HashId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = HashId;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a hash id")
            }
            fn visit_u64<E>(self, v: u64) -> Result<HashId, E> {
                Ok(HashId::Integer(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<HashId, E> {
                Ok(match u64::try_from(v) {
                    Ok(v) => HashId::Integer(v),
                    Err(_) => HashId::Other(Value::from(v)),
                })
            }
            fn visit_f64<E>(self, v: f64) -> Result<HashId, E> {
                Ok(HashId::Other(Value::from(v)))
            }
            fn visit_bool<E>(self, v: bool) -> Result<HashId, E> {
                Ok(HashId::Other(Value::Bool(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<HashId, E> {
                Ok(HashId::Other(Value::String(v.to_string())))
            }
            fn visit_string<E>(self, v: String) -> Result<HashId, E> {
                Ok(HashId::Other(Value::String(v)))
            }
            fn visit_unit<E>(self) -> Result<HashId, E> {
                Ok(HashId::Other(Value::Null))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<HashId, A::Error> {
                let value = Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))?;
                Ok(HashId::Other(value))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<HashId, A::Error> {
                let value = Value::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(HashId::Other(value))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

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
                let mut ids = BoundedIds::Integers(Vec::with_capacity(
                    seq.size_hint().unwrap_or(0).min(1 << 12),
                ));
                while let Some(id) = seq.next_element::<HashId>()? {
                    if ids.len() == bound {
                        return Err(serde::de::Error::custom(format!(
                            "more than {bound} hash ids in one row (the bound per row)"
                        )));
                    }
                    ids.push(id);
                }
                Ok(ids)
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
pub(crate) fn block_tokens(input_length: u64, block_size: u32, index: usize) -> u32 {
    let block_size = u64::from(block_size);
    let remaining = input_length.saturating_sub(index as u64 * block_size);
    remaining.clamp(1, block_size) as u32
}

pub(crate) fn read(
    mut reader: impl BufRead,
    name: &str,
    format: Format,
    options: &InputOptions,
) -> FileInput {
    let block_size = options
        .block_size
        .unwrap_or_else(|| format.default_block_size());
    // The rows are parsed on every core; what they become is decided in file order.
    let mut state = RowState::new(name, format, block_size);
    let rows = reader
        .fill_buf()
        .map_or(0, |head| expected_rows(head, options.file_bytes));
    let mut requests: Vec<Request> = Vec::with_capacity(rows);
    let parse = |line: &[u8]| prepare(parse_row(line), format, block_size);
    super::parallel::for_each_parsed(reader, parse, |item| {
        use super::parallel::Item;
        let request = match item {
            Item::Parsed { number, parsed, .. } => state.accept(number, parsed),
            Item::TooLong { number, bytes } => {
                state
                    .report
                    .bad(number, crate::limits::too_long_message(bytes));
                None
            }
            Item::ReadError { number, error } => {
                state.read_error(number, &error);
                None
            }
        };
        requests.extend(request);
    });
    let mut report = state.report;
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

/// The most rows [`expected_rows`] reserves for: 65 MB of address space at 248 bytes a request,
/// which a file of short first lines and long later ones could leave unused (untouched, so not
/// resident). A larger trace grows past it.
const MAX_EXPECTED_ROWS: usize = 1 << 18;

/// How many rows a file of `file_bytes` holds if it goes on as its first bytes (`head`) do,
/// plus one in sixteen; none when its size is unknown or no line ends in `head`. A guess only
/// sizes a reservation: a wrong one costs a copy or untouched memory, never a row.
fn expected_rows(head: &[u8], file_bytes: Option<u64>) -> usize {
    let (Some(file_bytes), lines) = (file_bytes, memchr::memchr_iter(b'\n', head).count()) else {
        return 0;
    };
    if lines == 0 {
        return 0;
    }
    let rows = if file_bytes <= head.len() as u64 {
        lines as u64 + 1
    } else {
        let per_line = (head.len() / lines).max(1) as u64;
        (file_bytes / per_line).saturating_add(1)
    };
    let rows = rows.saturating_add(rows / 16);
    usize::try_from(rows).map_or(MAX_EXPECTED_ROWS, |rows| rows.min(MAX_EXPECTED_ROWS))
}

/// One line as parsed, before the rows before it are known.
enum ParsedRow {
    Empty,
    Row(Box<Row>),
    Bad(String),
    /// A row made into its request (or its error) already, on a parser thread: what
    /// [`request_of`] gives a row that needs nothing from the rows before it.
    Made {
        result: Result<Option<Box<Request>>, String>,
        /// The row held a list of requests and no ids (the WEKA hint).
        requests_without_ids: bool,
    },
}

/// Makes a row's request where it depends on that row alone (not a bailian row, whose
/// conversation is its chain's root, nor one whose ids need the interner's numbering), so the
/// parser threads build the blocks and the reader's thread, which gives rows out in order, only
/// collects them.
fn prepare(parsed: ParsedRow, format: Format, block_size: u32) -> ParsedRow {
    let ParsedRow::Row(row) = parsed else {
        return parsed;
    };
    if format == Format::Bailian || matches!(row.hash_ids, Some(BoundedIds::Mixed(_))) {
        return ParsedRow::Row(row);
    }
    let requests_without_ids = row.requests.is_some() && row.hash_ids.is_none();
    // Neither is touched: no bailian root, no id that is not an integer.
    let (mut no_ids, mut no_roots) = (IdInterner::default(), HashMap::new());
    let result = request_of(*row, format, block_size, &mut no_ids, &mut no_roots);
    ParsedRow::Made {
        result: result.map(|request| request.map(Box::new)),
        requests_without_ids,
    }
}

/// Parses one line; depends on nothing else, so lines can be parsed on several threads.
fn parse_row(line: &[u8]) -> ParsedRow {
    let line = line.trim_ascii();
    if line.is_empty() {
        return ParsedRow::Empty;
    }
    match serde_json::from_slice::<Row>(line) {
        Ok(row) => ParsedRow::Row(Box::new(row)),
        Err(e) if e.is_syntax() || e.is_eof() => ParsedRow::Bad(format!("not a JSON object ({e})")),
        Err(e) => ParsedRow::Bad(e.to_string()),
    }
}

/// What turning rows into requests needs from the rows before: the non-integer ids seen, the
/// bailian chain roots, and the report of bad and skipped rows.
struct RowState {
    format: Format,
    block_size: u32,
    ids: IdInterner,
    // bailian: each request's conversation is its chain's root chat.
    root_of: HashMap<String, String>,
    report: FileReport,
}

impl RowState {
    fn new(name: &str, format: Format, block_size: u32) -> RowState {
        RowState {
            format,
            block_size,
            ids: IdInterner::default(),
            root_of: HashMap::new(),
            report: FileReport::new(name, format),
        }
    }

    /// The request of line `number`, or why there is none (counted in the report).
    fn accept(&mut self, number: usize, parsed: ParsedRow) -> Option<Request> {
        let (result, requests_without_ids) = match parsed {
            ParsedRow::Empty => return None,
            ParsedRow::Bad(error) => {
                self.report.bad(number, error);
                return None;
            }
            ParsedRow::Made {
                result,
                requests_without_ids,
            } => (result.map(|r| r.map(|r| *r)), requests_without_ids),
            ParsedRow::Row(row) => {
                let requests_without_ids = row.requests.is_some() && row.hash_ids.is_none();
                let result = request_of(
                    *row,
                    self.format,
                    self.block_size,
                    &mut self.ids,
                    &mut self.root_of,
                );
                (result, requests_without_ids)
            }
        };
        if requests_without_ids && self.report.hint.is_none() {
            self.report.hint = Some(
                "its rows hold a list of requests, as a WEKA trace does: prefixscope writes WEKA traces (export --to weka) but reads only Mooncake and bailian".into(),
            );
        }
        match result {
            Ok(Some(request)) => Some(request),
            Ok(None) => {
                self.report.skip("no hash_ids");
                None
            }
            Err(error) => {
                self.report.bad(number, error);
                None
            }
        }
    }

    fn read_error(&mut self, number: usize, error: &std::io::Error) {
        self.report.bad(number, format!("read error: {error}"));
        self.report.read_error = Some(format!("line {number}: {error}"));
    }
}

/// A trace's requests one row at a time, in file order; bad and skipped rows are counted in
/// `report` as they are met. Holds the bailian chain roots and any non-integer ids seen.
pub(crate) struct Rows<R> {
    reader: R,
    state: RowState,
    line_number: usize,
    buffer: Vec<u8>,
    finished: bool,
}

impl<R: BufRead> Rows<R> {
    pub(crate) fn new(reader: R, name: &str, format: Format, block_size: u32) -> Rows<R> {
        Rows {
            reader,
            state: RowState::new(name, format, block_size),
            line_number: 0,
            buffer: Vec::new(),
            finished: false,
        }
    }

    /// The bad and skipped rows met.
    pub(crate) fn into_report(self) -> FileReport {
        self.state.report
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
                    self.state
                        .report
                        .bad(self.line_number, too_long_message(bytes));
                    continue;
                }
                Err(e) => {
                    self.state.read_error(self.line_number + 1, &e);
                    self.finished = true;
                }
            }
            if self.finished {
                break;
            }
            self.line_number += 1;
            let parsed = parse_row(&self.buffer);
            if let Some(request) = self.state.accept(self.line_number, parsed) {
                return Some(request);
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
    let Some(hash_ids) = row.hash_ids.filter(|h| h.len() > 0) else {
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
    let block = |index: usize, id: u64| Block {
        id,
        tokens: block_tokens(input_length, block_size, index),
    };
    let blocks = match &hash_ids {
        BoundedIds::Integers(integers) => integers
            .iter()
            .enumerate()
            .map(|(index, &id)| block(index, id))
            .collect(),
        BoundedIds::Mixed(mixed) => {
            let mut blocks = Vec::with_capacity(mixed.len());
            for (index, value) in mixed.iter().enumerate() {
                let id = match value {
                    HashId::Integer(id) => *id,
                    HashId::Other(value) => ids.id(value).ok_or_else(|| {
                        format!("hash id {value} is neither an integer nor a string")
                    })?,
                };
                blocks.push(block(index, id));
            }
            blocks
        }
    };
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
    fn requests_made_on_the_parser_threads_equal_the_serial_read() {
        let kinds = [
            r#"{"timestamp": 5, "input_length": 1300, "output_length": 7, "hash_ids": [0, 1, 2]}"#,
            r#"{"timestamp": 6, "input_length": 600, "hash_ids": [0, "9", "x"], "session_id": "s1"}"#,
            r#"{"timestamp": 7, "input_length": 600, "hash_ids": [0, "x"], "session_id": 4}"#,
            r#"{"timestamp": 8, "input_tokens": 600, "hash_ids": [3]}"#,
            r#"{"timestamp": 9, "input_length": 0, "hash_ids": [3]}"#,
            r#"{"timestamp": 9, "input_length": 100, "hash_ids": [3], "block_size": 16}"#,
            r#"{"requests": [{"input_length": 3}]}"#,
            r#"{"timestamp": 1.5, "input_length": 10, "hash_ids": []}"#,
            r#"{"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 20, "hash_ids": [1, 2]}"#,
            r#"{"chat_id": 2, "parent_chat_id": 1, "timestamp": 1.0, "input_length": 40, "hash_ids": [1, 2, 4]}"#,
            "not json",
            "",
        ];
        let mut text = String::new();
        for i in 0..6_000usize {
            text.push_str(kinds[(i * 7 + i / 13) % kinds.len()]);
            text.push('\n');
        }
        let options = InputOptions {
            block_size: Some(512),
            ..InputOptions::default()
        };
        for format in [Format::Mooncake, Format::Bailian] {
            let parallel = read(text.as_bytes(), "t", format, &options);
            let mut rows = Rows::new(text.as_bytes(), "t", format, 512);
            let serial: Vec<Request> = rows.by_ref().collect();
            let mut report = rows.into_report();
            report.requests = serial.len() as u64;
            report.conversation_source = parallel.report.conversation_source.clone();
            assert!(serial.len() > 1_000, "{format:?}: {}", serial.len());
            assert_eq!(parallel.requests, serial, "{format:?}");
            assert_eq!(parallel.report, report, "{format:?}");
            assert!(parallel.report.hint.is_some() && !parallel.report.bad_rows.is_empty());
        }
    }

    /// The reservation follows the first lines and stays bounded whatever the file claims; a
    /// size that is wrong either way reads the same requests.
    #[test]
    fn rows_are_expected_from_the_first_lines_and_bounded() {
        let head = b"{\"a\": 1}\n{\"a\": 2}\n";
        assert_eq!(expected_rows(head, None), 0);
        assert_eq!(expected_rows(b"{\"a\": 1", Some(1 << 30)), 0);
        // The whole file in the head: its lines, and one for a last line without its end.
        assert_eq!(expected_rows(head, Some(head.len() as u64)), 3);
        // 9 bytes a line: a 9,000-byte file holds about 1,000, and one in sixteen more.
        assert_eq!(expected_rows(head, Some(9_000)), 1_001 + 1_001 / 16);
        assert_eq!(expected_rows(head, Some(u64::MAX)), MAX_EXPECTED_ROWS);
        assert_eq!(expected_rows(b"\n\n\n", Some(u64::MAX)), MAX_EXPECTED_ROWS);

        let row =
            r#"{"timestamp": 5, "input_length": 1300, "output_length": 7, "hash_ids": [0, 1, 2]}"#;
        let text = format!("{row}\n").repeat(3_000);
        let read_with = |file_bytes| {
            let options = InputOptions {
                file_bytes,
                ..InputOptions::default()
            };
            read(text.as_bytes(), "t", Format::Mooncake, &options)
        };
        let unknown = read_with(None);
        assert_eq!(unknown.requests.len(), 3_000);
        for claimed in [0, 10, text.len() as u64, u64::MAX] {
            let input = read_with(Some(claimed));
            assert_eq!(input.requests, unknown.requests, "{claimed}");
            assert_eq!(input.report, unknown.report, "{claimed}");
        }
    }

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
