//! From inputs to [`ExportRequest`]s in replay order, and on to a writer.
//!
//! Two passes over the input, so memory follows the input's structure, not its size:
//!
//! - **Recordings.** Pass 1 reads one line at a time and keeps, per request, its file, line and
//!   start time, and pushes the record in digest form (hashes and sizes, no text) into the
//!   analysis engine, which links turns by message hashes (so conversations and clients are those
//!   of the full records). The engine holds every request's message digests (a few hundred bytes
//!   per message: the analysis needs the whole recording at once); once it has given
//!   conversations and clients, everything but a few integers per request is dropped. Pass 2
//!   reads the files again and writes the requests in start order (the order they reached the
//!   server); a request read before its turn (files are written in completion order) waits in a
//!   small read-ahead map.
//! - **Gateway CSV.** The same, without the analysis: per request its file, row, timestamp and
//!   salted session key. Rows are written in timestamp order when every row has one (gateways
//!   often log when a request ended), else in file order.
//! - **Traces.** One row at a time, in file order; for the formats that group conversations a
//!   first pass counts each conversation's requests, so the writer knows its last one.
//!
//! The block model's tokens per character is learned in pass 1 over all the input files at once
//! (a rotated recording's files share their prefixes). Grouping writers (WEKA, OTel) hold open
//! conversations; see theirs.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufRead, Write};

use serde::Serialize;
use serde_json::{Value, json};

use super::{
    Content, Conversation, ExportRequest, OutputSource, Reply, Salt, Tag, Target, Writer, Written,
    hash_ids, output_length,
};
use crate::analysis::{Analyzer, Config};
use std::cell::RefCell;

use crate::cache::blocks::{BlockModel, Cutter, Prompt, ToolsPosition};
use crate::input::recording::{Pending, pending_request};
use crate::input::{BadRow, FileReport, Format, gateway_csv, trace};
use crate::limits::{Line, MAX_LINE_BYTES, read_line_bounded, too_long_message};
use crate::normalize::digest::{self, apply_digest};
use crate::normalize::{Api, anthropic};
use crate::record::{Output, Record, bad_record_line};

/// The files to export, each opened once per pass.
pub trait Inputs {
    fn count(&self) -> usize;
    fn name(&self, index: usize) -> String;
    /// Input `index` from its start, decompressed.
    fn open(&self, index: usize) -> io::Result<Box<dyn BufRead + '_>>;
}

#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub target: Target,
    /// Tokens per hash id (formats without hash ids ignore it).
    pub block_size: u32,
    pub salt: Salt,
    /// Where tool definitions go in the rendered prompt (`None`: by model family).
    pub tools_position: Option<ToolsPosition>,
    /// CSV: the column holding timestamps.
    pub ts_column: Option<String>,
}

#[derive(Debug)]
pub enum ExportError {
    /// The input cannot give what the target needs (exit 2).
    Usage(String),
    /// An input could not be read, or changed between the passes (exit 1).
    Unreadable(String),
    /// The output could not be written (exit 1).
    Write(io::Error),
}

impl std::fmt::Display for ExportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExportError::Usage(m) | ExportError::Unreadable(m) => f.write_str(m),
            ExportError::Write(e) => write!(f, "cannot write the export: {e}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileBadRow {
    pub file: String,
    #[serde(flatten)]
    pub row: BadRow,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What an export read and wrote.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Summary {
    pub requests: u64,
    pub bad_rows: Vec<FileBadRow>,
    /// Numbers past their bound, ignored (`FileReport::bad_value`): how many, and the first few
    /// of each file.
    #[serde(skip_serializing_if = "is_zero")]
    pub bad_value_count: u64,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bad_values: Vec<String>,
    /// Rows that hold no prompt to export, by reason.
    pub skipped: BTreeMap<String, u64>,
    pub non_2xx: u64,
    pub output_from_server: u64,
    pub output_estimated: u64,
    pub output_raised_from_zero: u64,
    /// Where conversations came from.
    pub conversation_source: String,
    /// Requests without a timestamp (given the previous request's).
    pub untimed: u64,
    /// Most requests read ahead of their turn at once.
    pub read_ahead_max: u64,
    pub written: Written,
}

impl Summary {
    fn merge(&mut self, report: FileReport) {
        for row in report.bad_rows {
            self.bad_rows.push(FileBadRow {
                file: report.name.clone(),
                row,
            });
        }
        for (reason, n) in report.skipped {
            *self.skipped.entry(reason).or_insert(0) += n;
        }
        self.non_2xx += report.non_2xx;
        self.bad_value_count += report.bad_value_count;
        for value in report.bad_values {
            self.bad_values.push(format!("{}: {value}", report.name));
        }
    }

    fn count_output(&mut self, source: OutputSource) {
        match source {
            OutputSource::Server => self.output_from_server += 1,
            OutputSource::Estimated => self.output_estimated += 1,
            OutputSource::RaisedFromZero => self.output_raised_from_zero += 1,
        }
    }
}

/// Writes the export of `inputs` (all of `format`) to `out`.
pub fn export(
    inputs: &dyn Inputs,
    format: Format,
    options: &Options,
    out: &mut dyn Write,
) -> Result<Summary, ExportError> {
    match format {
        Format::Recording => recordings(inputs, options, out),
        Format::Csv => gateway_as_recordings(inputs, options, out),
        Format::Mooncake | Format::Bailian => traces(inputs, format, options, out),
    }
}

fn open<'a>(inputs: &'a dyn Inputs, index: usize) -> Result<Box<dyn BufRead + 'a>, ExportError> {
    inputs
        .open(index)
        .map_err(|e| ExportError::Unreadable(format!("cannot read {}: {e}", inputs.name(index))))
}

fn changed(inputs: &dyn Inputs, index: usize) -> ExportError {
    ExportError::Unreadable(format!(
        "{} changed while it was being exported",
        inputs.name(index)
    ))
}

/// Block size of the hash ids, or `None` for formats without them.
fn id_block_size(options: &Options) -> Option<u32> {
    options
        .target
        .default_block_size()
        .map(|_| options.block_size.max(1))
}

/// What the client added since the model last spoke: (tool results, other messages).
fn new_input(prompt: &Prompt) -> (bool, bool) {
    let since_reply = prompt
        .messages
        .iter()
        .rposition(|m| &*m.kind == "assistant")
        .map_or(0, |i| i + 1);
    let added = &prompt.messages[since_reply..];
    (
        added.iter().any(|m| &*m.kind == "tool"),
        added.iter().any(|m| &*m.kind != "tool"),
    )
}

fn reply_of(output: &Output) -> (Reply, u64) {
    let chars = u64::from(output.content_chars) + u64::from(output.reasoning_chars);
    (
        Reply {
            text: chars > 0,
            tool_calls: output.tool_calls.len() as u32,
        },
        chars,
    )
}

/// The messages, reply and tools of a full request, in chat form.
fn content_of(api: Api, body: &Value, response: Option<&Value>) -> Content {
    let input_messages = match api {
        Api::AnthropicMessages => anthropic::chat_messages(body),
        Api::OpenaiResponses => crate::normalize::responses::chat_messages(body),
        Api::OpenaiCompletions => {
            vec![
                json!({"role": "user", "content": body.get("prompt").cloned().unwrap_or(Value::Null)}),
            ]
        }
        _ => body
            .get("messages")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    };
    let tools: Vec<Value> = match api {
        Api::AnthropicMessages => anthropic::chat_tools(body)
            .iter()
            .map(anthropic::function_tool)
            .collect(),
        Api::OpenaiResponses => crate::normalize::responses::chat_tools(body),
        _ => body
            .get("tools")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    };
    let reply = response.and_then(|r| match api {
        Api::AnthropicMessages => {
            let mut message = anthropic::chat_reply(r);
            // Thinking is dropped from the next request's history too; keeping it here would
            // stop the replay from seeing the next request as this one's continuation.
            if let Some(m) = message.as_object_mut() {
                m.remove("thinking");
            }
            Some(message)
        }
        Api::OpenaiCompletions => r
            .pointer("/choices/0/text")
            .map(|text| json!({"role": "assistant", "content": text})),
        Api::OllamaChat => r.get("message").cloned(),
        Api::OpenaiResponses => Some(crate::normalize::responses::chat_reply(r)),
        _ => r.pointer("/choices/0/message").cloned(),
    });
    Content {
        input_messages,
        output_messages: reply.into_iter().collect(),
        tools: (!tools.is_empty()).then_some(Value::Array(tools)),
        model: body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_string),
    }
}

/// Feeds the writer in replay order from per-file readers that go in file order, holding what
/// was read before its turn.
struct Reorder<'a> {
    files: Vec<Box<dyn FileRequests + 'a>>,
    ahead: HashMap<u32, ExportRequest>,
    ahead_max: u64,
}

/// One input's exportable requests in file order, each with its number from pass 1.
trait FileRequests {
    fn next_request(&mut self) -> Result<Option<(u32, ExportRequest)>, ExportError>;
}

impl Reorder<'_> {
    fn take(&mut self, seq: u32, file: usize) -> Result<Option<ExportRequest>, ExportError> {
        if let Some(request) = self.ahead.remove(&seq) {
            return Ok(Some(request));
        }
        let Some(reader) = self.files.get_mut(file) else {
            return Ok(None);
        };
        while let Some((found, request)) = reader.next_request()? {
            if found == seq {
                return Ok(Some(request));
            }
            self.ahead.insert(found, request);
            self.ahead_max = self.ahead_max.max(self.ahead.len() as u64);
        }
        Ok(None)
    }
}

/// Per request kept between the passes.
#[derive(Debug, Clone, Copy)]
struct Entry {
    file: u32,
    /// Line (recordings) or record index (CSV) within the file.
    position: u32,
    t_ms: Option<i64>,
}

/// Replay order, and which request closes each conversation.
fn plan(
    entries: &[Entry],
    conversation_of: &[Option<u64>],
    by_time: bool,
) -> (Vec<u32>, Vec<bool>) {
    let mut order: Vec<u32> = (0..entries.len() as u32).collect();
    if by_time {
        order.sort_by_key(|&s| (entries[s as usize].t_ms, s));
    }
    let mut last = vec![true; entries.len()];
    let mut latest: HashMap<u64, u32> = HashMap::new();
    for &seq in &order {
        if let Some(key) = conversation_of[seq as usize]
            && let Some(previous) = latest.insert(key, seq)
        {
            last[previous as usize] = false;
        }
    }
    (order, last)
}

/// Pass 1's result: the requests, and the order to write them in.
struct Planned {
    entries: Vec<Entry>,
    order: Vec<u32>,
    /// The source time written as 0.
    origin_ms: i64,
}

/// Pass 2: reads the requests through `files` and writes them in `plan`'s order, filling missing
/// timestamps with the previous request's.
fn write_planned(
    plan: &Planned,
    files: Vec<Box<dyn FileRequests + '_>>,
    options: &Options,
    summary: &mut Summary,
    inputs: &dyn Inputs,
    out: &mut dyn Write,
) -> Result<(), ExportError> {
    let mut reorder = Reorder {
        files,
        ahead: HashMap::new(),
        ahead_max: 0,
    };
    let mut writer = Writer::new(
        options.target,
        options.block_size,
        options.salt,
        plan.origin_ms,
    );
    let mut previous_t = plan.origin_ms;
    for &seq in &plan.order {
        let entry = plan.entries[seq as usize];
        let file = entry.file as usize;
        let Some(mut request) = reorder.take(seq, file)? else {
            return Err(changed(inputs, file));
        };
        match entry.t_ms {
            Some(t) => previous_t = t,
            None => {
                request.t_ms = previous_t;
                summary.untimed += 1;
            }
        }
        summary.requests += 1;
        summary.count_output(request.output.source);
        writer.push(request, out).map_err(ExportError::Write)?;
    }
    summary.read_ahead_max = reorder.ahead_max;
    summary.written = writer.finish(out).map_err(ExportError::Write)?;
    Ok(())
}

/// (position, seq) of each file's requests, in file order.
fn positions(entries: &[Entry], files: usize) -> Vec<Vec<(u32, u32)>> {
    let mut positions = vec![Vec::new(); files];
    for (seq, entry) in entries.iter().enumerate() {
        positions[entry.file as usize].push((entry.position, seq as u32));
    }
    positions
}

// ---------------------------------------------------------------------------------------------
// Recordings

/// Calls `each` with every non-empty line of a recording, parsed by the recording reader's own
/// rules (a truncated last line, another `v`, invalid UTF-8 are errors). Stops at a read error,
/// which it reports as the next line's error.
fn each_record(
    reader: &mut dyn BufRead,
    mut each: impl FnMut(usize, Result<Record, String>) -> Result<(), ExportError>,
) -> Result<(), ExportError> {
    let mut buffer = Vec::new();
    let mut line = 0usize;
    loop {
        match read_line_bounded(reader, &mut buffer, MAX_LINE_BYTES) {
            Ok(Line::Eof) => return Ok(()),
            Ok(Line::Read { .. }) => {}
            Ok(Line::TooLong { bytes }) => {
                line += 1;
                each(line, Err(too_long_message(bytes)))?;
                continue;
            }
            Err(e) => return each(line + 1, Err(format!("read error: {e}"))),
        }
        line += 1;
        if buffer.trim_ascii().is_empty() {
            continue;
        }
        each(line, parse_record(&buffer))?;
    }
}

/// One line as every recording reader parses it (`record::parse_record_line`); a line without
/// its newline is the file's cut last one.
fn parse_record(line: &[u8]) -> Result<Record, String> {
    let complete = line.ends_with(b"\n");
    match crate::record::parse_record_line(line) {
        Some(parsed) => parsed.map_err(|error| bad_record_line(0, complete, error).error),
        None => Err("empty line".to_string()),
    }
}

/// What pass 2 needs to turn a record into a request.
struct RecordingContext<'a> {
    options: &'a Options,
    /// Requests are cut in the order they are written: the cutter learns where earlier
    /// prefixes ended, as the profile's does.
    cutter: RefCell<Cutter>,
    conversation_of: Vec<Option<u64>>,
    /// The conversation whose tool call each record's conversation answers as a subagent.
    spawned_by: Vec<Option<u64>>,
    last: Vec<bool>,
}

impl RecordingContext<'_> {
    fn request(&self, record: &Record, seq: u32) -> Option<ExportRequest> {
        let mut ignored = FileReport::new("", Format::Recording);
        let Pending {
            prompt,
            prompt_tokens,
            request,
            reply: reply_segment,
            ..
        } = pending_request(record, &mut ignored)?;
        let options = self.options;
        let salt = &options.salt;
        let api = Api::from_path(&record.request.path);
        let response = record.response.as_ref();
        let output = response.and_then(|r| match (&r.digest, &r.body) {
            (Some(digest), _) => Some(digest.output.clone()),
            (None, Some(body)) => Some(digest::response_digest(api, body).output),
            (None, None) => None,
        });
        let (reply, reply_chars) = output.as_ref().map(reply_of).unwrap_or_default();
        // The reply fixes where it ends for the turns after, as in the profile (what it leaves
        // cached is not exported: a trace replays prompts).
        let (cut, _) = self.cutter.borrow_mut().cut_turn(
            &prompt,
            prompt_tokens,
            reply_segment.as_ref(),
            request.output_tokens,
        );
        let input_tokens = cut.input_tokens.max(1);
        let added = new_input(&prompt);
        let hash_ids = id_block_size(options).map_or_else(Vec::new, |bs| {
            let ids: Vec<u64> = cut.blocks.iter().map(|b| b.id).collect();
            hash_ids(
                &ids,
                bs,
                input_tokens,
                bs,
                options.target != Target::Weka,
                salt,
                u64::from(seq),
            )
        });
        let streamed = response.is_some_and(|r| r.stream.is_some());
        let content = match (options.target, &record.request.body) {
            (Target::Otel, Some(body)) => Some(content_of(
                api,
                body,
                response.and_then(|r| r.body.as_ref()),
            )),
            _ => None,
        };
        let index = seq as usize;
        Some(ExportRequest {
            t_ms: record.t_start_ms,
            duration_ms: Some(record.t_end_ms.saturating_sub(record.t_start_ms).max(0) as u64),
            ttft_ms: record
                .t_first_byte_ms
                .filter(|_| streamed)
                .map(|t| t.saturating_sub(record.t_start_ms).max(0) as u64),
            streamed: request.streamed,
            input_tokens,
            output: output_length(
                request.output_tokens,
                reply_chars,
                self.cutter.borrow().model.tokens_per_char,
            ),
            hash_ids,
            conversation: Conversation {
                key: self.conversation_of[index]
                    .unwrap_or_else(|| salt.id(Tag::Single, &[u64::from(seq)])),
                last: self.last[index],
                spawned_by: self.spawned_by[index],
            },
            model: prompt.model.clone(),
            reply,
            after_tool_result: added.0,
            new_text: added.1,
            server_reused_tokens: request.server_reused_tokens,
            content,
        })
    }
}

struct RecordingFile<'a> {
    reader: Box<dyn BufRead + 'a>,
    /// (line, seq) of the file's exportable records, in file order.
    lines: Vec<(u32, u32)>,
    next: usize,
    line: u32,
    buffer: Vec<u8>,
    context: &'a RecordingContext<'a>,
}

impl FileRequests for RecordingFile<'_> {
    fn next_request(&mut self) -> Result<Option<(u32, ExportRequest)>, ExportError> {
        let Some(&(target_line, seq)) = self.lines.get(self.next) else {
            return Ok(None);
        };
        self.next += 1;
        while self.line < target_line {
            match read_line_bounded(&mut self.reader, &mut self.buffer, MAX_LINE_BYTES) {
                Ok(Line::Eof) | Err(_) => return Ok(None),
                Ok(_) => self.line += 1,
            }
        }
        let request = parse_record(&self.buffer)
            .ok()
            .and_then(|record| self.context.request(&record, seq));
        Ok(request.map(|r| (seq, r)))
    }
}

fn recordings(
    inputs: &dyn Inputs,
    options: &Options,
    out: &mut dyn Write,
) -> Result<Summary, ExportError> {
    let mut summary = Summary {
        conversation_source: "the analysis".to_string(),
        ..Summary::default()
    };
    let mut entries: Vec<Entry> = Vec::new();
    // The analysis runs as the records are read (its engine takes them in any order), so no
    // record is kept: only the engine's own state, which has no text.
    let mut analyzer = Analyzer::new(Config::default());
    let mut evidence = crate::input::ModelEvidence::default();
    for file in 0..inputs.count() {
        let name = inputs.name(file);
        let mut report = FileReport::new(&name, Format::Recording);
        let mut reader = open(inputs, file)?;
        each_record(&mut *reader, |line, parsed| {
            let mut record = match parsed {
                Ok(record) => record,
                Err(error) => {
                    report.bad_rows.push(BadRow { line, error });
                    return Ok(());
                }
            };
            let Some(pending) = pending_request(&record, &mut report) else {
                return Ok(());
            };
            if options.target == Target::Otel && record.request.body.is_none() {
                return Err(ExportError::Usage(format!(
                    "{name} is a digest recording (made with --digest): it keeps no messages, \
                     and OTel replay sends the messages; export it as mooncake, bailian, weka \
                     or trace_synthetic instead"
                )));
            }
            pending.observe(&mut evidence);
            entries.push(Entry {
                file: file as u32,
                position: line as u32,
                t_ms: Some(record.t_start_ms),
            });
            // The analysis links turns by message hashes: a digest copy gives it the same
            // conversations without holding any text.
            if record.request.body.is_some() {
                apply_digest(&mut record);
            }
            record.id = entries.len() as u64;
            analyzer.push(&record);
            Ok(())
        })?;
        summary.merge(report);
    }
    if entries.is_empty() {
        let mut writer = Writer::new(options.target, options.block_size, options.salt, 0);
        summary.written = writer.finish(out).map_err(ExportError::Write)?;
        return Ok(summary);
    }

    // Each record's conversation and the one it answers as a subagent, read from the rows the
    // engine shares: copied into a report beside the engine, they took a million digest records
    // past a 2 GiB address space.
    let report = analyzer.live_report();
    drop(analyzer);
    let rows = || report.rows.iter().map(|shared| &*shared.row);
    let seq_of = |id: u64| (id as usize).checked_sub(1).filter(|&s| s < entries.len());
    let conversation_key = |c: u32| options.salt.id(Tag::Conversation, &[u64::from(c)]);
    let mut conversation_of: Vec<Option<u64>> = vec![None; entries.len()];
    for row in rows() {
        if let Some(seq) = seq_of(row.id) {
            conversation_of[seq] = row.conversation.map(conversation_key);
        }
    }
    let links = crate::analysis::subagent_links(rows());
    let parent_of: HashMap<u32, u64> = rows()
        .filter_map(|row| {
            let parent = seq_of(*links.get(&row.id)?)?;
            Some((row.conversation?, conversation_of[parent]?))
        })
        .collect();
    let mut spawned_by: Vec<Option<u64>> = vec![None; entries.len()];
    for row in rows() {
        if let Some(seq) = seq_of(row.id) {
            spawned_by[seq] = row.conversation.and_then(|c| parent_of.get(&c).copied());
        }
    }
    drop(report);

    let (order, last) = plan(&entries, &conversation_of, true);
    let origin_ms = order
        .first()
        .and_then(|&s| entries[s as usize].t_ms)
        .unwrap_or(0);
    let context = RecordingContext {
        options,
        cutter: RefCell::new(Cutter::new(BlockModel {
            block_size: id_block_size(options).unwrap_or(16),
            salt: options.salt.seed(),
            tools_position: options.tools_position,
            tokens_per_char: evidence.fit.weights().per_text_char,
            weights: Some(evidence.fit.weights()),
            keys_from_messages: false,
        })),
        conversation_of,
        spawned_by,
        last,
    };
    let mut files: Vec<Box<dyn FileRequests + '_>> = Vec::new();
    for (file, lines) in positions(&entries, inputs.count()).into_iter().enumerate() {
        files.push(Box::new(RecordingFile {
            reader: open(inputs, file)?,
            lines,
            next: 0,
            line: 0,
            buffer: Vec::new(),
            context: &context,
        }));
    }
    let plan = Planned {
        entries,
        order,
        origin_ms,
    };
    write_planned(&plan, files, options, &mut summary, inputs, out)?;
    Ok(summary)
}

// ---------------------------------------------------------------------------------------------
// Gateway CSV

/// Gateway logs exported as the recordings a proxy would have written
/// (`gateway_csv::records`): conversations from the analysis, as for recordings. Each log's
/// records are held as recording lines in memory (a log's rows are read whole to be put in
/// time order anyway).
fn gateway_as_recordings(
    inputs: &dyn Inputs,
    options: &Options,
    out: &mut dyn Write,
) -> Result<Summary, ExportError> {
    struct InMemory(Vec<(String, Vec<u8>)>);
    impl Inputs for InMemory {
        fn count(&self) -> usize {
            self.0.len()
        }
        fn name(&self, index: usize) -> String {
            self.0
                .get(index)
                .map(|(n, _)| n.clone())
                .unwrap_or_default()
        }
        fn open(&self, index: usize) -> io::Result<Box<dyn BufRead + '_>> {
            let bytes = self.0.get(index).map_or(&[][..], |(_, b)| b.as_slice());
            Ok(Box::new(bytes))
        }
    }
    let mut logs = Vec::new();
    let mut reports = Vec::new();
    for file in 0..inputs.count() {
        let name = inputs.name(file);
        let log = gateway_csv::records(open(inputs, file)?, &name, options.ts_column.as_deref());
        let mut lines = Vec::new();
        for record in &log.records {
            lines.extend(crate::record::record_line(record));
        }
        logs.push((name, lines));
        reports.push(log.report);
    }
    let mut summary = recordings(&InMemory(logs), options, out)?;
    // The rows no record came of (the records' own skips are counted as a recording's).
    for report in reports {
        summary.merge(report);
    }
    Ok(summary)
}

// ---------------------------------------------------------------------------------------------
// Traces

/// A trace row's conversation key, scoped to its file (chat ids restart with every file).
fn trace_conversation(salt: &Salt, file: usize, conversation: Option<&str>) -> Option<u64> {
    conversation.map(|c| salt.key(Tag::Conversation, &format!("{file}\u{0}{c}")))
}

fn traces(
    inputs: &dyn Inputs,
    format: Format,
    options: &Options,
    out: &mut dyn Write,
) -> Result<Summary, ExportError> {
    let target = options.target;
    let source_block = format.default_block_size();
    if target == Target::Otel {
        return Err(ExportError::Usage(format!(
            "a {} trace holds token counts, not messages, and OTel replay sends the messages; \
             export it as trace_synthetic instead",
            format.as_str()
        )));
    }
    if let Some(bs) = id_block_size(options)
        && !bs.is_multiple_of(source_block)
    {
        return Err(ExportError::Usage(format!(
            "a {} trace's hash ids are of {source_block}-token blocks, which cannot be cut into \
             {bs}-token blocks; give --block-size {source_block} or a multiple of it",
            format.as_str()
        )));
    }
    let salt = &options.salt;
    let mut summary = Summary {
        conversation_source: match (target.uses_conversations(), format) {
            (false, _) => "not used by this format".to_string(),
            (true, Format::Bailian) => "parent_chat_id chains".to_string(),
            (true, _) => "session_id (else one request each)".to_string(),
        },
        ..Summary::default()
    };
    // Pass 1, for the formats that need to know each conversation's last request.
    let mut remaining: HashMap<u64, u64> = HashMap::new();
    let counted = target.uses_conversations();
    if counted {
        for file in 0..inputs.count() {
            let name = inputs.name(file);
            let mut rows = trace::Rows::new(open(inputs, file)?, &name, format, source_block);
            for request in rows.by_ref() {
                if let Some(key) = trace_conversation(salt, file, request.conversation.as_deref()) {
                    *remaining.entry(key).or_insert(0) += 1;
                }
            }
            summary.merge(rows.into_report());
        }
    }
    // Traces are on their own clock already (ms from the trace's start).
    let mut writer = Writer::new(target, options.block_size, *salt, 0);
    let mut seq = 0u64;
    let mut previous_t = 0i64;
    for file in 0..inputs.count() {
        let name = inputs.name(file);
        let mut rows = trace::Rows::new(open(inputs, file)?, &name, format, source_block);
        for request in rows.by_ref() {
            seq += 1;
            let key = trace_conversation(salt, file, request.conversation.as_deref());
            let last = match key.and_then(|k| remaining.get_mut(&k)) {
                Some(n) => {
                    *n = n.saturating_sub(1);
                    *n == 0
                }
                None => true,
            };
            let t_ms = match request.t_ms {
                Some(t) => t,
                None => {
                    summary.untimed += 1;
                    previous_t
                }
            };
            previous_t = t_ms;
            let input_tokens = request.input_tokens.max(1);
            let ids: Vec<u64> = request.blocks.iter().map(|b| b.id).collect();
            let hash_ids = id_block_size(options).map_or_else(Vec::new, |bs| {
                hash_ids(
                    &ids,
                    source_block,
                    input_tokens,
                    bs,
                    target != Target::Weka,
                    salt,
                    seq,
                )
            });
            let export = ExportRequest {
                t_ms,
                duration_ms: None,
                ttft_ms: None,
                streamed: None,
                input_tokens,
                output: output_length(request.output_tokens, 0, 0.0),
                hash_ids,
                conversation: Conversation {
                    key: key.unwrap_or_else(|| salt.id(Tag::Single, &[seq])),
                    last,
                    spawned_by: None,
                },
                model: None,
                reply: Reply::default(),
                after_tool_result: false,
                new_text: true,
                server_reused_tokens: None,
                content: None,
            };
            summary.requests += 1;
            summary.count_output(export.output.source);
            writer.push(export, out).map_err(ExportError::Write)?;
        }
        if !counted {
            summary.merge(rows.into_report());
        }
    }
    summary.written = writer.finish(out).map_err(ExportError::Write)?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::blocks::prompt_from_body;

    fn prompt(messages: Value) -> Prompt {
        prompt_from_body(Api::OpenaiChat, &json!({"messages": messages}), None).unwrap_or_default()
    }

    #[test]
    fn new_input_is_what_follows_the_last_reply() {
        let first =
            prompt(json!([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]));
        assert_eq!(new_input(&first), (false, true));
        let tool_step = prompt(json!([{"role": "user", "content": "u"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "a.rs"}]));
        assert_eq!(new_input(&tool_step), (true, false));
        let both = prompt(json!([{"role": "assistant", "content": "x"},
            {"role": "tool", "tool_call_id": "c", "content": "a.rs"}, {"role": "user", "content": "and?"}]));
        assert_eq!(new_input(&both), (true, true));
    }

    #[test]
    fn plans_go_by_start_time_and_mark_each_conversations_last_request() {
        let entry = |t| Entry {
            file: 0,
            position: 0,
            t_ms: Some(t),
        };
        let entries = [entry(30), entry(10), entry(20), entry(40)];
        let conversations = [Some(1), Some(1), None, Some(2)];
        let (order, last) = plan(&entries, &conversations, true);
        assert_eq!(order, vec![1, 2, 0, 3]);
        assert_eq!(last, vec![true, false, true, true]);
        let (file_order, _) = plan(&entries, &conversations, false);
        assert_eq!(file_order, vec![0, 1, 2, 3]);
    }

    #[test]
    fn anthropic_content_is_chat_form_without_thinking() {
        let body = json!({"model": "claude", "system": "be brief",
            "tools": [{"name": "ls", "description": "list", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "hi"}]});
        let reply = json!({"content": [{"type": "thinking", "thinking": "hmm"},
            {"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]});
        let content = content_of(Api::AnthropicMessages, &body, Some(&reply));
        assert_eq!(
            content.input_messages[0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(content.output_messages.len(), 1);
        assert!(content.output_messages[0].get("thinking").is_none());
        assert_eq!(
            content.output_messages[0]["tool_calls"][0]["function"]["name"],
            "ls"
        );
        let tools = content.tools.unwrap_or_default();
        assert_eq!(
            tools[0]["function"]["parameters"],
            json!({"type": "object"})
        );
        assert_eq!(content.model.as_deref(), Some("claude"));
    }

    #[test]
    fn record_lines_are_parsed_by_the_recording_readers_rules() {
        assert!(parse_record(b"not json\n").is_err());
        assert!(parse_record(b"{\"v\":2}\n").is_err_and(|e| e.contains("version 2")));
        let mut lines = Vec::new();
        let text = "\n{\"v\":1}\n\n{\"v\":1,\"id\":";
        each_record(&mut text.as_bytes(), |line, parsed| {
            lines.push((line, parsed.is_ok()));
            Ok(())
        })
        .ok();
        assert_eq!(lines, vec![(2, false), (4, false)]);
    }

    struct Listed(Vec<(u32, u64)>);

    impl FileRequests for Listed {
        fn next_request(&mut self) -> Result<Option<(u32, ExportRequest)>, ExportError> {
            if self.0.is_empty() {
                return Ok(None);
            }
            let (seq, t) = self.0.remove(0);
            Ok(Some((
                seq,
                super::super::tests_support::request(1, t as i64, 1),
            )))
        }
    }

    #[test]
    fn reorder_holds_what_was_read_before_its_turn() {
        // File 0 holds requests 2, 0, 1 (completion order); file 1 holds 3.
        let mut reorder = Reorder {
            files: vec![
                Box::new(Listed(vec![(2, 20), (0, 0), (1, 10)])),
                Box::new(Listed(vec![(3, 30)])),
            ],
            ahead: HashMap::new(),
            ahead_max: 0,
        };
        let mut times = Vec::new();
        for (seq, file) in [(0, 0), (1, 0), (2, 0), (3, 1)] {
            let request = reorder.take(seq, file).ok().flatten();
            times.push(request.map(|r| r.t_ms));
        }
        assert_eq!(times, vec![Some(0), Some(10), Some(20), Some(30)]);
        assert_eq!(reorder.ahead_max, 1);
        assert!(reorder.take(9, 0).ok().flatten().is_none());
    }
}
