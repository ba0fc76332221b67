//! The recording format (v1, compatible with llmp's): one `Record` per exchange, JSON Lines.
//!
//! `null` means "not measured", never zero. Extensions are new fields or new keys only, so llmp
//! reads what we write and we read what llmp writes.
//!
//! The lowest floor: this module depends on nothing else of the crate but the `limits` leaf
//! (the line bound). Digesting
//! (`normalize::digest`) and building records from captures (`capture`) live above it.

pub mod hash;
mod jsonl;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use jsonl::{
    BadLine, Lines, ReadResult, bad_record_line, parse_record_line, read_error_line, read_jsonl,
    record_line, write_jsonl,
};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub v: u32,
    pub id: u64,
    pub conn: u64,
    pub t_start_ms: i64,
    pub t_first_byte_ms: Option<i64>,
    pub t_end_ms: i64,
    pub request: RequestRecord,
    pub response: Option<ResponseRecord>,
    pub error: Option<ExchangeError>,
    pub tokens: Option<TokenCounts>,
    /// prefixscope: a request prefixscope itself sent to the upstream to learn what it is
    /// (`probe::poll`: `/props`, `/slots`…), its response body the reading kept. Not an exchange
    /// of the traffic: every analysis skips it and counts it. Absent on every other record, so
    /// llmp's recordings and ours without probes read and write back unchanged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub probe: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    pub headers: BTreeMap<String, String>,
    pub body_bytes: u64,
    pub body: Option<Value>,
    pub body_text: Option<String>,
    pub digest: Option<RequestDigest>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseRecord {
    pub status: u16,
    pub headers: BTreeMap<String, String>,
    pub stream: Option<StreamKind>,
    pub chunks: Option<u32>,
    pub bad_chunks: Option<u32>,
    pub body_bytes: u64,
    pub truncated: bool,
    pub body: Option<Value>,
    pub body_text: Option<String>,
    pub digest: Option<ResponseDigest>,
}

impl ResponseRecord {
    /// A response known by its status and body alone (a gateway log's row, a request still in
    /// flight read as if answered): no headers, not streamed, nothing counted.
    pub fn bare(status: u16, body: Option<Value>) -> ResponseRecord {
        ResponseRecord {
            status,
            headers: BTreeMap::new(),
            stream: None,
            chunks: None,
            bad_chunks: None,
            body_bytes: 0,
            truncated: false,
            body,
            body_text: None,
            digest: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamKind {
    Sse,
    Ndjson,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExchangeError {
    UpstreamUnreachable,
    UpstreamReset,
    ClientDisconnected,
    Timeout,
    BodyTooLarge,
}

impl ExchangeError {
    pub fn as_str(self) -> &'static str {
        match self {
            ExchangeError::UpstreamUnreachable => "upstream_unreachable",
            ExchangeError::UpstreamReset => "upstream_reset",
            ExchangeError::ClientDisconnected => "client_disconnected",
            ExchangeError::Timeout => "timeout",
            ExchangeError::BodyTooLarge => "body_too_large",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestDigest {
    pub model: Option<String>,
    pub params: Params,
    pub messages: Vec<MessageDigest>,
    pub tools: Vec<ToolDigest>,
    pub tools_hash: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Params {
    pub max_tokens: Option<u32>,
    pub response_format: bool,
    pub grammar: bool,
    pub stream: bool,
    /// prefixscope: the request's `cache_control` markers (Anthropic's breakpoints). Absent
    /// in older recordings: not known, never taken for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_marks: Option<crate::provider::CacheMarks>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MessageDigest {
    pub role: String,
    pub hash: String,
    pub chars: u32,
    pub head: String,
    pub tail: String,
    pub tool_calls: Vec<ToolCall>,
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// prefixscope: the hash of what a server renders, when it differs from `hash`: a list of
    /// one text block and the plain string of that text are one message, and `cache_control`
    /// markers are not content (clients move them every turn). Absent (older recordings, and
    /// every message these rules leave unchanged): `hash` is the identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// prefixscope: characters of the reasoning the client sent back with the message
    /// (`reasoning_content`, `reasoning`, Ollama's and Anthropic's `thinking`), which the
    /// identity leaves out but a template may render. Absent: none (or an older recording).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub reasoning_chars: u32,
    /// prefixscope: image, audio, file and document parts (`normalize::digest::media_parts`),
    /// whose tokens no character count sees. Absent: none (or an older recording).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub media: u32,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: Option<String>,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolDigest {
    pub name: String,
    pub hash: String,
    pub chars: u32,
    /// prefixscope: a tool the provider runs and describes to the model itself (Anthropic's
    /// `web_search_20250305`, `code_execution_…`; the Responses API's built-ins): its tokens
    /// are the provider's instructions, not its few characters. Absent: a client's tool.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub provided: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseDigest {
    pub usage: Map<String, Value>,
    pub output: Output,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Output {
    pub content_chars: u32,
    pub reasoning_chars: u32,
    pub tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TokenCounts {
    pub messages: BTreeMap<String, u32>,
    pub tools: BTreeMap<String, u32>,
    /// The counts are the server's layout of the rendered prompt (`tokenize::layout`: template
    /// tokens included, tools the template drops at 0), not each text's own tokens.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub layout: bool,
    /// With the layout: tokens of the rendered prompt before the first message's content (a
    /// BOS, the template's opening), which the first message's count includes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lead: Option<u32>,
}
