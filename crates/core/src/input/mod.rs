//! Readers that turn every supported input into [`cache::Request`]s: prefixscope and llmp
//! recordings (full and digest), gateway CSV logs, Mooncake and bailian traces, any of them
//! gzipped. Reading is from a `BufRead` only; bad rows are counted with their line numbers and
//! never stop the read; non-2xx responses are excluded and counted.
//!
//! [`cache::Request`]: crate::cache::Request

pub(crate) mod gateway_csv;
pub(crate) mod parallel;
pub(crate) mod recording;
pub(crate) mod trace;

pub use recording::Reopen;
pub use recording::live_request;
pub use recording::read as read_recording;
pub use recording::read_keyed_or_twice;

pub use gateway_csv::{LogRecords, UNTIMED_PACE_MS, records as gateway_log_records};
pub use recording::for_each_record;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::cache::Request;
use crate::cache::blocks::ToolsPosition;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Recording,
    Csv,
    Mooncake,
    Bailian,
}

impl Format {
    pub fn parse(text: &str) -> Option<Format> {
        match text {
            "recording" => Some(Format::Recording),
            "csv" => Some(Format::Csv),
            "mooncake" => Some(Format::Mooncake),
            "bailian" => Some(Format::Bailian),
            _ => None,
        }
    }

    /// What the format is, in words, with how to force another (`--format`).
    pub fn describe(self) -> String {
        let what = match self {
            Format::Recording => "a recording (JSON Lines)",
            Format::Csv => "a gateway log (CSV or JSON Lines)",
            Format::Mooncake => "a Mooncake trace",
            Format::Bailian => "a bailian trace",
        };
        format!("{what} (--format {})", self.as_str())
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Recording => "recording",
            Format::Csv => "csv",
            Format::Mooncake => "mooncake",
            Format::Bailian => "bailian",
        }
    }

    /// The block size each format is usually read with: Mooncake traces are hashed in 512-token
    /// blocks, bailian traces in 16; prompts are cut in 16 (vLLM's smallest block).
    pub fn default_block_size(self) -> u32 {
        match self {
            Format::Mooncake => 512,
            Format::Bailian | Format::Recording | Format::Csv => 16,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct InputOptions {
    /// `None`: the input's default (a trace's own; for recordings and logs the engine's, see
    /// [`choose_block_model`]).
    pub block_size: Option<u32>,
    /// `None`: by model family.
    pub tools_position: Option<ToolsPosition>,
    /// CSV: the column holding timestamps (else the first of the usual names).
    pub ts_column: Option<String>,
    /// Salt of the block hashes.
    pub salt: u64,
    /// Key blocks by message digest even when the text is recorded.
    pub keys_from_messages: bool,
    /// Read the replies (cache each after its prompt, and let its count fix where it ends);
    /// off, a full recording reads as its digest does (digests keep no reply to read).
    pub replies: bool,
    /// Keep the analysis a recording's conversations come from (`FileInput::analysis`), for
    /// the HTML report; off, it is dropped once its conversations are taken (its rows are the
    /// size of the file's): a recording's before its requests are cut, a gateway log's after.
    pub keep_analysis: bool,
    /// The file's size, when known: a trace's reader reserves room for its rows from it and
    /// from its first lines' length, rather than grow by doubling, which copies and faults in
    /// each size on the way ([`trace::read`]).
    pub file_bytes: Option<u64>,
}

impl Default for InputOptions {
    fn default() -> Self {
        InputOptions {
            block_size: None,
            tools_position: None,
            ts_column: None,
            salt: 0,
            keys_from_messages: false,
            replies: true,
            keep_analysis: false,
            file_bytes: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadRow {
    pub line: usize,
    pub error: String,
}

/// What reading one file found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileReport {
    pub name: String,
    pub format: Format,
    pub requests: u64,
    pub bad_rows: Vec<BadRow>,
    /// Responses outside 2xx: excluded from the simulation.
    pub non_2xx: u64,
    /// Rows that are fine but hold no prompt to simulate (health checks, model lists…), by reason.
    pub skipped: BTreeMap<String, u64>,
    /// Where conversation keys came from.
    pub conversation_source: String,
    /// Numbers past their bound (`limits`), each ignored on its record and read as not
    /// reported: how many, and the first `MAX_BAD_VALUES_KEPT` of them.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub bad_value_count: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bad_values: Vec<String>,
    /// How this input's prompts were cut into blocks, and why (recordings and gateway logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_model: Option<BlockModelChoice>,
    /// Probe records (prefixscope's own requests to the server): not requests, not skipped.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub probes: u64,
    /// The read stopped here (a truncated or corrupt gzip, an I/O error): what came before it
    /// was read; the command ends with an error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_error: Option<String>,
    /// What the format's reader found that suggests another format or shape (a tab-separated
    /// header, a WEKA object), said with "nothing came out".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// The engine behind the traffic, as its responses show it (`probe::ServerKind` is what the
/// server says of itself); it picks the default block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerSeen {
    /// `timings` in the responses, or a model named by its `.gguf` path.
    LlamaCpp,
    /// `prompt_eval_count` in the responses.
    Ollama,
}

impl ServerSeen {
    pub fn as_str(self) -> &'static str {
        match self {
            ServerSeen::LlamaCpp => "llama.cpp",
            ServerSeen::Ollama => "Ollama",
        }
    }
}

/// Block size when neither the user nor the server says: vLLM's and SGLang's default.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;

/// How an input is cut into blocks, each choice with where it came from (printed by `profile`
/// and on the TUI's status line, so two figures can be compared knowing their model).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockModelChoice {
    pub block_size: u32,
    pub block_size_source: String,
    pub tokens_per_char: f64,
    pub tokens_per_char_source: String,
    pub tools_position: String,
}

impl BlockModelChoice {
    /// One line: `1-token blocks (llama.cpp reuses to the token) · 0.262 tokens/char (…) · tools …`.
    pub fn describe(&self) -> String {
        format!(
            "{}-token blocks ({}) · {:.3} tokens/char ({}) · tools {}",
            self.block_size,
            self.block_size_source,
            self.tokens_per_char,
            self.tokens_per_char_source,
            self.tools_position
        )
    }
}

/// What an input's block model is chosen from, gathered request by request in constant
/// memory (the fit keeps at most `MAX_FIT_SAMPLES` requests): the fit of the server's prompt
/// counts, and the engine.
#[derive(Debug, Clone, Default)]
pub struct ModelEvidence {
    pub fit: crate::cache::blocks::WeightFit,
    pub server: Option<ServerSeen>,
}

impl ModelEvidence {
    /// `key` orders the requests (record id, log row): the fit must not depend on the order
    /// they are added in.
    pub fn add(
        &mut self,
        key: u64,
        prompt: &crate::cache::blocks::Prompt,
        tokens: Option<u64>,
        server: Option<ServerSeen>,
    ) {
        if let Some(tokens) = tokens {
            self.fit.add(key, prompt, tokens);
        }
        self.server = self.server.or(server);
    }
}

/// The block model for an input: the user's block size, else the engine's (llama.cpp and
/// Ollama reuse to the token), else 16; what parts weigh fitted to the server's counts.
pub fn choose_block_model(
    options: &InputOptions,
    evidence: &ModelEvidence,
) -> (crate::cache::blocks::BlockModel, BlockModelChoice) {
    let fit = &evidence.fit;
    let weights = fit.weights();
    let ratio = weights.per_text_char;
    let (mut block_size, mut block_size_source) = match (options.block_size, evidence.server) {
        (Some(size), _) => (size.max(1), "--block-size".to_string()),
        (None, Some(kind)) => (1, format!("{} reuses to the token", kind.as_str())),
        (None, None) => (
            DEFAULT_BLOCK_SIZE,
            "vLLM's and SGLang's; the server is not known".to_string(),
        ),
    };
    // Prompts and what they leave cached (about twice the prompts) must fit the bound.
    let blocks_at = |size: u32| fit.tokens().saturating_mul(2) / u64::from(size);
    if options.block_size.is_none() && blocks_at(block_size) > crate::limits::MAX_SIMULATED_BLOCKS {
        let chosen = block_size;
        while blocks_at(block_size) > crate::limits::MAX_SIMULATED_BLOCKS {
            block_size = block_size.saturating_mul(2);
        }
        block_size_source = format!(
            "{block_size_source}, but {chosen}-token blocks of this input would be past {} blocks",
            crate::limits::MAX_SIMULATED_BLOCKS
        );
    }
    let counted = fit.requests();
    let tokens_per_char_source = if counted == 0 {
        "no server counts: the default".to_string()
    } else {
        format!(
            "fitted to the server's prompt_tokens over {counted} request{}: tools {:.3}/char, {:.1} per message",
            if counted == 1 { "" } else { "s" },
            weights.per_tools_char,
            weights.per_message,
        )
    };
    let tools_position = match options.tools_position {
        Some(crate::cache::blocks::ToolsPosition::Leading) => "first (--tools-position)",
        Some(crate::cache::blocks::ToolsPosition::AfterSystem) => {
            "after the system message (--tools-position)"
        }
        None => {
            "by model family (first for GLM, Kimi, DeepSeek; after the system message for the others, assumed where the family is not known)"
        }
    };
    let model = crate::cache::blocks::BlockModel {
        block_size,
        salt: options.salt,
        tools_position: options.tools_position,
        tokens_per_char: ratio,
        weights: Some(weights),
        keys_from_messages: options.keys_from_messages,
    };
    let choice = BlockModelChoice {
        block_size,
        block_size_source,
        tokens_per_char: ratio,
        tokens_per_char_source,
        tools_position: tools_position.to_string(),
    };
    (model, choice)
}

/// Bad values described one by one in a report; the rest are counted.
pub const MAX_BAD_VALUES_KEPT: usize = 20;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl FileReport {
    pub fn new(name: &str, format: Format) -> FileReport {
        FileReport {
            name: name.to_string(),
            format,
            requests: 0,
            bad_rows: Vec::new(),
            non_2xx: 0,
            skipped: BTreeMap::new(),
            conversation_source: "none".to_string(),
            bad_value_count: 0,
            bad_values: Vec::new(),
            block_model: None,
            probes: 0,
            read_error: None,
            hint: None,
        }
    }

    /// Why a file yielded no request, in a sentence: what it was read as, its bad rows (the
    /// first), its skips and non-2xx responses, and a hint at another shape.
    pub fn why_nothing(&self) -> String {
        let mut why = vec![format!("read as {}", self.format.describe())];
        if let Some(first) = self.bad_rows.first() {
            why.push(format!(
                "{} (the first, line {}: {})",
                crate::units::plural(self.bad_rows.len() as u64, "bad row"),
                first.line,
                first.error
            ));
        }
        for (reason, n) in &self.skipped {
            why.push(format!("{n} skipped: {reason}"));
        }
        if self.non_2xx > 0 {
            why.push(format!("{} non-2xx responses", self.non_2xx));
        }
        if let Some(error) = &self.read_error {
            why.push(format!("the read stopped: {error}"));
        }
        if why.len() == 1 {
            why.push("no row in it".to_string());
        }
        if let Some(hint) = &self.hint {
            why.push(hint.clone());
        }
        format!("no request: {}", why.join("; "))
    }

    /// Every skip reason with its count, for a summary line (`no hash_ids 3, not a prompt API 1`).
    pub fn skipped_text(&self) -> Option<String> {
        (!self.skipped.is_empty()).then(|| {
            self.skipped
                .iter()
                .map(|(reason, n)| format!("{reason} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
    }

    /// A number past its bound, ignored (`what` says where and which).
    pub fn bad_value(&mut self, what: String) {
        self.bad_value_count += 1;
        if self.bad_values.len() < MAX_BAD_VALUES_KEPT {
            self.bad_values.push(what);
        }
    }

    /// Moves what one record's reading counted (skips, non-2xx, probes) into `into` and gives
    /// back the bad values it found, leaving this report as new.
    fn move_counts_into(&mut self, into: &mut FileReport) -> Vec<String> {
        into.non_2xx += std::mem::take(&mut self.non_2xx);
        into.probes += std::mem::take(&mut self.probes);
        for (reason, count) in std::mem::take(&mut self.skipped) {
            *into.skipped.entry(reason).or_insert(0) += count;
        }
        self.bad_value_count = 0;
        std::mem::take(&mut self.bad_values)
    }

    fn skip(&mut self, reason: &str) {
        *self.skipped.entry(reason.to_string()).or_insert(0) += 1;
    }

    fn bad(&mut self, line: usize, error: impl Into<String>) {
        self.bad_rows.push(BadRow {
            line,
            error: error.into(),
        });
    }
}

/// The requests of one file, in replay order, and what reading it found.
#[derive(Debug, Clone, PartialEq)]
pub struct FileInput {
    pub requests: Vec<Request>,
    pub report: FileReport,
    /// The analysis the conversations came from (recordings and gateway logs), for the
    /// report's loss and timeline sections.
    pub analysis: Option<Box<crate::analysis::Report>>,
}

/// Undoes gzip when the stream starts with its magic bytes. A corrupt or truncated stream is
/// a read error that says where: after how many compressed bytes.
pub fn decompressed<'a>(mut reader: impl BufRead + 'a) -> std::io::Result<Box<dyn BufRead + 'a>> {
    let gzipped = reader.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    Ok(if gzipped {
        let consumed = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = Counted {
            inner: reader,
            consumed: std::sync::Arc::clone(&consumed),
        };
        Box::new(BufReader::with_capacity(
            1 << 16,
            GzipErrors {
                inner: flate2::bufread::MultiGzDecoder::new(counted),
                consumed,
            },
        ))
    } else {
        Box::new(reader)
    })
}

/// A reader that counts the bytes taken from it.
struct Counted<R> {
    inner: R,
    consumed: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl<R: BufRead> std::io::Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.consumed
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Counted<R> {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, amount: usize) {
        self.consumed
            .fetch_add(amount as u64, std::sync::atomic::Ordering::Relaxed);
        self.inner.consume(amount);
    }
}

/// The decoder, its errors saying how far into the compressed file they came.
struct GzipErrors<R> {
    inner: R,
    consumed: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl<R: std::io::Read> std::io::Read for GzipErrors<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf).map_err(|e| {
            let at = self.consumed.load(std::sync::atomic::Ordering::Relaxed);
            std::io::Error::new(
                e.kind(),
                format!("corrupt or truncated gzip at compressed byte {at}: {e}"),
            )
        })
    }
}

/// An input file ready to read: decompressed, and of a known format.
pub struct OpenedInput {
    pub reader: Box<dyn BufRead>,
    pub format: Format,
}

#[derive(Debug)]
pub enum OpenError {
    /// The file could not be opened or its first bytes read.
    Unreadable(std::io::Error),
    /// Its first line is no format we read.
    UnknownFormat,
}

impl std::fmt::Display for OpenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OpenError::Unreadable(e) => e.fmt(f),
            OpenError::UnknownFormat => f.write_str("cannot tell the format; give --format"),
        }
    }
}

impl std::error::Error for OpenError {}

/// Opens `path` and undoes gzip when it is gzipped, for a caller that knows the format.
pub fn open_decompressed(path: &Path) -> std::io::Result<Box<dyn BufRead>> {
    let file = std::fs::File::open(path)?;
    decompressed(BufReader::with_capacity(1 << 18, file))
}

/// Opens `path`, undoes gzip, and tells its format from its first line unless `format` is
/// given. The first bytes stay in the reader.
pub fn open(path: &Path, format: Option<Format>) -> Result<OpenedInput, OpenError> {
    let mut reader = open_decompressed(path).map_err(OpenError::Unreadable)?;
    let format = match format {
        Some(format) => format,
        None => detect(&mut reader)
            .map_err(OpenError::Unreadable)?
            .ok_or(OpenError::UnknownFormat)?,
    };
    Ok(OpenedInput { reader, format })
}

/// Tells the format from the first bytes (which `fill_buf` keeps for the reader).
pub fn detect(reader: &mut impl BufRead) -> std::io::Result<Option<Format>> {
    let head = reader.fill_buf()?;
    let text = String::from_utf8_lossy(&head[..head.len().min(1 << 16)]);
    let first_line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    let trimmed = first_line.trim_start();
    Ok(if trimmed.starts_with('{') {
        if first_line.contains("\"t_start_ms\"") || first_line.contains("\"request\":") {
            Some(Format::Recording)
        } else if first_line.contains("\"request_json\"") {
            // A gateway log as JSON Lines: the CSV's columns as keys.
            Some(Format::Csv)
        } else if first_line.contains("\"hash_ids\"") {
            if first_line.contains("\"chat_id\"") || first_line.contains("\"parent_chat_id\"") {
                Some(Format::Bailian)
            } else {
                Some(Format::Mooncake)
            }
        } else {
            None
        }
    } else if first_line.contains("request_json") {
        Some(Format::Csv)
    } else {
        None
    })
}

/// Reads one (decompressed) file in the given format, as the profile splits it: a recording's
/// requests are keyed by the analysis's conversations ([`keyed_by_analysis`]), which it runs
/// here; [`recording::read`] alone runs none.
pub fn read(reader: impl BufRead, name: &str, format: Format, options: &InputOptions) -> FileInput {
    read_or_twice(reader, None, name, format, options)
}

/// [`read`], which may read a large recording a second time through `reopen`, so as not to
/// hold its requests beside the analysis ([`recording::read_keyed_or_twice`]).
pub fn read_or_twice(
    reader: impl BufRead,
    reopen: Option<recording::Reopen>,
    name: &str,
    format: Format,
    options: &InputOptions,
) -> FileInput {
    match format {
        Format::Recording => recording::read_keyed_or_twice(
            reader,
            reopen,
            recording::HELD_PENDING_BYTES,
            name,
            options,
        ),
        Format::Csv => gateway_csv::read(reader, name, options),
        Format::Mooncake | Format::Bailian => trace::read(reader, name, format, options),
    }
}

/// A recording's requests keyed by the analysis's conversations (turns linked to the conversation
/// they continue), the ones the `analyze` report and the TUI show; `FILE#cN`, so two files never
/// share one. Side-calls belong to none.
pub fn keyed_by_analysis(recording: recording::Recording, name: &str) -> FileInput {
    let recording::Recording { input, records } = recording;
    let analysis = crate::analysis::analyze(&records, &crate::analysis::Config::default());
    keyed_by(input, analysis, name)
}

/// `input`'s requests keyed by `analysis`'s conversations, the analysis kept beside them.
fn keyed_by(input: FileInput, analysis: crate::analysis::Report, name: &str) -> FileInput {
    let conversations = conversations_by_record(&analysis.rows, name);
    keyed_by_conversations(input, &conversations, Some(analysis))
}

/// The conversation each record of `analysis` continues, as `FILE#cN`.
fn conversations_by_record<'a>(
    rows: impl IntoIterator<Item = &'a crate::analysis::Row>,
    name: &str,
) -> HashMap<u64, String> {
    rows.into_iter()
        .filter_map(|row| Some((row.id, format!("{name}#c{}", row.conversation?))))
        .collect()
}

/// `input`'s requests keyed by `conversations`, with the analysis they came from when kept.
fn keyed_by_conversations(
    mut input: FileInput,
    conversations: &HashMap<u64, String>,
    analysis: Option<crate::analysis::Report>,
) -> FileInput {
    recording::set_conversations(&mut input.requests, conversations);
    if input.requests.iter().any(|r| r.conversation.is_some()) {
        input.report.conversation_source = "analysis".to_string();
    }
    input.analysis = analysis.map(Box::new);
    input
}

/// First non-empty string at any of `paths` (JSON pointers) in `body`.
fn session_id_in_body(body: &Value) -> Option<crate::cache::SessionId> {
    const SESSION_PATHS: [(&str, &str); 4] = [
        ("/prompt_cache_key", "prompt_cache_key"),
        (
            "/metadata/cursorConversationId",
            "metadata.cursorConversationId",
        ),
        ("/metadata/user_id", "metadata.user_id"),
        ("/user", "user"),
    ];
    SESSION_PATHS.iter().find_map(|(pointer, source)| {
        body.pointer(pointer)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(|value| crate::cache::SessionId {
                source: (*source).to_string(),
                value: value.to_string(),
            })
    })
}

/// Prompt tokens, reused tokens and output tokens as a server reported them, from a response
/// body (or a digest's kept fields): OpenAI `usage`, llama.cpp `timings`, Anthropic `usage`,
/// Ollama's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerCounts {
    pub prompt_tokens: Option<u64>,
    pub reused_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    /// Counters present but past `limits::MAX_PROMPT_TOKENS` (ignored: read as not reported).
    pub implausible: Option<(&'static str, u64)>,
    /// The engine, when its counters name it.
    pub server: Option<ServerSeen>,
}

/// The server's prompt count of one request, if it is plausible: a counter past
/// `MAX_PROMPT_TOKENS`, or a prompt count its text cannot hold, is a bad value on `report`
/// (`at` names the record or row) and reads as not reported.
pub fn bounded_prompt_tokens(
    counts: &ServerCounts,
    prompt_chars: u64,
    at: &str,
    report: &mut FileReport,
) -> Option<u64> {
    if let Some((field, value)) = counts.implausible {
        report.bad_value(format!(
            "{at}: {} {value} is past {} tokens (ignored)",
            field.trim_start_matches('/').replace('/', "."),
            crate::limits::MAX_PROMPT_TOKENS
        ));
    }
    match counts.prompt_tokens {
        Some(tokens) if tokens > crate::limits::max_tokens_for_chars(prompt_chars) => {
            report.bad_value(format!(
                "{at}: {tokens} prompt tokens for {prompt_chars} characters of prompt (ignored)"
            ));
            None
        }
        // A prompt with text is never 0 tokens (a gateway that does not count a media prompt
        // says 0): not measured, and estimated from the text instead.
        Some(0) if prompt_chars > 0 => {
            report.bad_value(format!(
                "{at}: 0 prompt tokens for {prompt_chars} characters of prompt (ignored)"
            ));
            None
        }
        tokens => tokens,
    }
}

pub fn server_counts(body: &Value) -> ServerCounts {
    const COUNTERS: [&str; 15] = [
        "/timings/cache_n",
        "/timings/prompt_n",
        "/timings/predicted_n",
        "/usage/prompt_tokens",
        "/usage/completion_tokens",
        "/usage/input_tokens",
        "/usage/output_tokens",
        "/usage/cache_read_input_tokens",
        "/usage/cache_creation_input_tokens",
        "/usage/input_tokens_details/cached_tokens",
        "/prompt_eval_count",
        "/prompt_eval_cached_count",
        "/eval_count",
        "/prompt_progress/total",
        "/prompt_progress/cache",
    ];
    let implausible = COUNTERS.iter().find_map(|pointer| {
        let value = body.pointer(pointer).and_then(Value::as_u64)?;
        crate::limits::plausible_tokens(value)
            .is_none()
            .then_some((*pointer, value))
    });
    let number = |pointer: &str| {
        body.pointer(pointer)
            .and_then(Value::as_u64)
            .and_then(crate::limits::plausible_tokens)
    };
    let cache_n = number("/timings/cache_n");
    let anthropic_input = number("/usage/input_tokens");
    let cache_read = number("/usage/cache_read_input_tokens");
    let prompt_tokens = number("/usage/prompt_tokens")
        .or_else(|| Some(cache_n? + number("/timings/prompt_n")?))
        .or_else(|| {
            // Anthropic's input_tokens leaves out what was read from or written to the cache.
            Some(
                anthropic_input?
                    + cache_read.unwrap_or(0)
                    + number("/usage/cache_creation_input_tokens").unwrap_or(0),
            )
        })
        .or_else(|| number("/prompt_eval_count"))
        .or_else(|| number("/prompt_progress/total"));
    // The Responses API: input_tokens is the whole prompt, cached_tokens the reused part.
    let reused_tokens = cache_n
        .or_else(|| number("/usage/prompt_tokens_details/cached_tokens"))
        .or_else(|| number("/usage/input_tokens_details/cached_tokens"))
        .or(cache_read)
        .or_else(|| number("/prompt_eval_cached_count"))
        .or_else(|| number("/prompt_progress/cache"));
    let output_tokens = number("/usage/completion_tokens")
        .or_else(|| number("/usage/output_tokens"))
        .or_else(|| number("/timings/predicted_n"))
        .or_else(|| number("/eval_count"));
    // llama-server answers with the model's file path; on the Anthropic and Responses APIs it
    // sends no `timings`.
    let gguf = body
        .get("model")
        .and_then(Value::as_str)
        .is_some_and(|model| model.ends_with(".gguf"));
    let server = if body.get("timings").is_some_and(Value::is_object) || gguf {
        Some(ServerSeen::LlamaCpp)
    } else if body.get("prompt_eval_count").is_some() {
        Some(ServerSeen::Ollama)
    } else {
        None
    };
    ServerCounts {
        prompt_tokens,
        reused_tokens,
        output_tokens,
        implausible,
        server,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn formats_are_told_apart_by_their_first_line() {
        let cases = [
            (
                r#"{"v":1,"id":1,"conn":1,"t_start_ms":5}"#,
                Some(Format::Recording),
            ),
            (
                r#"{"timestamp": 0, "input_length": 9, "hash_ids": [1]}"#,
                Some(Format::Mooncake),
            ),
            (
                r#"{"chat_id": 1, "parent_chat_id": -1, "hash_ids": [1]}"#,
                Some(Format::Bailian),
            ),
            ("timestamp,request_json,status_code\n", Some(Format::Csv)),
            ("hello\n", None),
        ];
        for (text, expected) in cases {
            let mut reader = text.as_bytes();
            assert_eq!(detect(&mut reader).ok().flatten(), expected, "{text}");
        }
    }

    #[test]
    fn gzip_is_undone() {
        use std::io::{Read, Write};
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(b"{\"hash_ids\": [1]}\n").ok();
        let bytes = encoder.finish().unwrap_or_default();
        let mut text = String::new();
        decompressed(bytes.as_slice())
            .and_then(|mut r| r.read_to_string(&mut text))
            .ok();
        assert_eq!(text, "{\"hash_ids\": [1]}\n");
    }

    #[test]
    fn server_counts_from_each_server() {
        let llama = json!({"timings": {"cache_n": 438, "prompt_n": 87, "predicted_n": 9}});
        assert_eq!(
            server_counts(&llama),
            ServerCounts {
                prompt_tokens: Some(525),
                reused_tokens: Some(438),
                output_tokens: Some(9),
                implausible: None,
                server: Some(ServerSeen::LlamaCpp),
            }
        );
        let hostile = json!({"usage": {"prompt_tokens": 1u64 << 63}, "timings": {"cache_n": 5}});
        assert_eq!(server_counts(&hostile).prompt_tokens, None);
        assert_eq!(
            server_counts(&hostile).implausible,
            Some(("/usage/prompt_tokens", 1 << 63))
        );
        let anthropic = json!({"usage": {"input_tokens": 12, "cache_read_input_tokens": 45, "output_tokens": 3}});
        assert_eq!(server_counts(&anthropic).prompt_tokens, Some(57));
        assert_eq!(server_counts(&anthropic).reused_tokens, Some(45));
        let openai = json!({"usage": {"prompt_tokens": 40, "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 32}}});
        assert_eq!(server_counts(&openai).reused_tokens, Some(32));
        assert_eq!(
            server_counts(&json!({"prompt_eval_count": 441})).prompt_tokens,
            Some(441)
        );
    }
}
