//! Exports: what was recorded (or read) written as a trace that the replay tools load (GuideLLM,
//! AIPerf). Pure: no clock, no file system; inputs come from readers the caller opens
//! ([`source::Inputs`]) and lines go to any `Write`.
//!
//! - [`source`] turns recordings, gateway CSV and traces into [`ExportRequest`]s in replay order,
//!   in two passes over the input so that memory does not grow with it (what is held is said
//!   there);
//! - one writer per format ([`mooncake`], [`bailian`], [`weka`], [`trace_synthetic`], [`otel`])
//!   turns those into lines;
//! - here: the salt, salted identifiers, hash ids at the consumer's block size, output lengths.
//!
//! Every format but OTel is anonymous: ids are salted hashes, lengths are counts, and no text,
//! model or tool name is written. OTel spans carry the messages because replay sends them.

pub(crate) mod bailian;
pub(crate) mod mooncake;
pub(crate) mod otel;
pub(crate) mod source;
pub(crate) mod trace_synthetic;
pub(crate) mod weka;

use std::io::{self, Write};

use serde::Serialize;
use serde_json::Value;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::cache::blocks::ID_MASK;

pub use source::{ExportError, Inputs, Options, Summary, export};

/// Every target's name, in [`Target::ALL`]'s order: the command line's choices, the TUI's list.
pub const TARGET_NAMES: [&str; Target::ALL.len()] = {
    let mut names = [""; Target::ALL.len()];
    let mut i = 0;
    while i < names.len() {
        names[i] = Target::ALL[i].as_str();
        i += 1;
    }
    names
};

/// A trace format a replay tool reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    Mooncake,
    Bailian,
    Weka,
    TraceSynthetic,
    Otel,
}

impl Target {
    pub const ALL: [Target; 5] = [
        Target::Mooncake,
        Target::Bailian,
        Target::Weka,
        Target::TraceSynthetic,
        Target::Otel,
    ];

    pub fn parse(text: &str) -> Option<Target> {
        match text {
            "mooncake" => Some(Target::Mooncake),
            "bailian" => Some(Target::Bailian),
            "weka" => Some(Target::Weka),
            "trace_synthetic" => Some(Target::TraceSynthetic),
            "otel" | "opentelemetry" => Some(Target::Otel),
            _ => None,
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Target::Mooncake => "mooncake",
            Target::Bailian => "bailian",
            Target::Weka => "weka",
            Target::TraceSynthetic => "trace_synthetic",
            Target::Otel => "otel",
        }
    }

    /// The block size the format's consumers assume: GuideLLM and AIPerf read Mooncake traces in
    /// 512-token blocks, AIPerf bailian traces in 16; WEKA traces say theirs (64 is the
    /// published corpora's). `None`: the format has no hash ids.
    pub fn default_block_size(self) -> Option<u32> {
        match self {
            Target::Mooncake => Some(512),
            Target::Bailian => Some(16),
            Target::Weka => Some(64),
            Target::TraceSynthetic | Target::Otel => None,
        }
    }

    /// Whether the export holds no text, model or tool name. OTel spans carry the messages.
    pub fn anonymous(self) -> bool {
        self != Target::Otel
    }

    /// Whether the format groups requests into conversations.
    pub fn uses_conversations(self) -> bool {
        matches!(self, Target::Bailian | Target::Weka | Target::Otel)
    }
}

/// What each salted hash is of, so ids of different kinds never coincide by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum Tag {
    /// A full block, from its source id.
    Block = 1,
    /// Source blocks grouped into one larger block, chained on the previous group.
    Group = 2,
    /// The partial last block of a request, with its token count.
    Partial = 3,
    /// A block whose source ids are missing (a trace with fewer ids than its length needs).
    Missing = 4,
    /// A conversation key.
    Conversation = 5,
    /// A displayed label (conversation, agent, model).
    Label = 6,
    /// A tool name, for comparing tool sets without keeping names.
    Tool = 7,
    /// A request with no conversation.
    Single = 8,
}

/// The export's secret: every id is a hash seeded with it, so nobody without the salt file can
/// match an id against a guessed prompt, and the same salt gives the same ids on every export
/// (traces exported on different days still join).
///
/// xxh3 seeded with 64 secret bits is a keyed hash, not a MAC: it keeps ids unlinkable to a
/// dictionary of known prompts, which is what an anonymized trace needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Salt {
    seed: u64,
}

impl Salt {
    /// From a salt file's text (any non-empty text; prefixscope writes 64 hex digits).
    pub fn from_text(text: &str) -> Option<Salt> {
        let text = text.trim();
        (!text.is_empty()).then(|| Salt {
            seed: xxh3_64(text.as_bytes()),
        })
    }

    /// The seed of the block model's chained hashes.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn hash(&self, tag: Tag, words: &[u64]) -> u64 {
        let mut bytes = Vec::with_capacity(8 * (words.len() + 1));
        bytes.extend_from_slice(&(tag as u64).to_le_bytes());
        for word in words {
            bytes.extend_from_slice(&word.to_le_bytes());
        }
        xxh3_64_with_seed(&bytes, self.seed)
    }

    /// An id below 2^53 (exact in every JSON reader) and above 0 (WEKA's ids start at 1).
    pub fn id(&self, tag: Tag, words: &[u64]) -> u64 {
        match self.hash(tag, words) & ID_MASK {
            0 => 1,
            id => id,
        }
    }

    /// A 64-bit key of some text (conversation keys, tool names), never written as is.
    pub fn key(&self, tag: Tag, text: &str) -> u64 {
        self.hash(tag, &[xxh3_64(text.as_bytes())])
    }

    /// `prefix-` and 16 hex digits: a salted, stable, displayable identifier.
    pub fn label(&self, prefix: &str, key: u64) -> String {
        format!("{prefix}-{:016x}", self.hash(Tag::Label, &[key]))
    }
}

/// Hash ids of a request in `block_size`-token blocks, from its source's ids in
/// `source_block_size`-token blocks (the block model's, or a trace's own).
///
/// - Same block size: each id is mapped through the salt alone, so equal ids stay equal and
///   distinct ones distinct (a trace's prefix tree, and AIPerf's flat set of ids, are kept).
/// - A block size `k` times the source's: each group of `k` source ids becomes one id chained on
///   the previous group's, so a group is shared exactly when its whole prefix is.
/// - The partial last block (`input_tokens` not a multiple of `block_size`) gets an id of its own
///   made from its content and token count: a consumer that met it first would otherwise send a
///   short block wherever the same id later stands for a full one. `keep_partial: false` leaves it
///   out (WEKA lists full blocks only).
/// - Source ids that are missing (a trace with fewer ids than its length needs) become ids
///   nobody else has, from `unique`.
///
/// The caller checks that `block_size` is a multiple of `source_block_size`.
pub fn hash_ids(
    source: &[u64],
    source_block_size: u32,
    input_tokens: u64,
    block_size: u32,
    keep_partial: bool,
    salt: &Salt,
    unique: u64,
) -> Vec<u64> {
    // Readers bound every count; this keeps any caller from sizing ids past the maximum.
    let input_tokens = input_tokens.min(crate::limits::MAX_PROMPT_TOKENS);
    let block = u64::from(block_size.max(1));
    let source_block = u64::from(source_block_size.max(1));
    let per_group = (block / source_block).max(1) as usize;
    let full = input_tokens / block;
    let count = if keep_partial {
        input_tokens.div_ceil(block)
    } else {
        full
    };
    let mut ids = Vec::with_capacity(count as usize);
    let mut parent = 0u64;
    for g in 0..count {
        let tokens = (input_tokens - g * block).min(block);
        let needed = tokens.div_ceil(source_block) as usize;
        let start = g as usize * per_group;
        let group = source.get(start..start + needed);
        let base = match group {
            Some([id]) if per_group == 1 => salt.id(Tag::Block, &[*id]),
            Some(group) => {
                let mut words = Vec::with_capacity(group.len() + 1);
                words.push(parent);
                words.extend_from_slice(group);
                salt.id(Tag::Group, &words)
            }
            None => salt.id(Tag::Missing, &[unique, g]),
        };
        parent = base;
        // A partial last block is its own block, keyed by its content and token count (as the
        // profile keys it): a consumer that met it first would otherwise send a short block
        // wherever the same id later stands for a full one.
        ids.push(if tokens < block {
            salt.id(Tag::Partial, &[base, tokens])
        } else {
            base
        });
    }
    ids
}

/// Where an output length came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputSource {
    /// The server's count (or the source trace's `output_length`).
    Server,
    /// Estimated from the reply's characters (or 1 when nothing is known).
    Estimated,
    /// The server said 0; consumers need at least 1 (AIPerf rejects 0).
    RaisedFromZero,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLength {
    pub tokens: u64,
    pub source: OutputSource,
}

/// The server's count when it gave one, else the reply's characters times the input's tokens
/// per character; at least 1 either way.
pub fn output_length(server: Option<u64>, reply_chars: u64, tokens_per_char: f64) -> OutputLength {
    match server {
        Some(0) => OutputLength {
            tokens: 1,
            source: OutputSource::RaisedFromZero,
        },
        Some(tokens) => OutputLength {
            tokens,
            source: OutputSource::Server,
        },
        None => OutputLength {
            tokens: ((reply_chars as f64 * tokens_per_char).ceil() as u64).max(1),
            source: OutputSource::Estimated,
        },
    }
}

/// Which conversation a request belongs to, as the writers need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conversation {
    /// A salted key: equal for the requests of one conversation, never written as is.
    pub key: u64,
    /// This is the conversation's last request: writers that group may write it out.
    pub last: bool,
    /// The conversation (its key) whose tool call this one answers as a subagent
    /// ([`crate::analysis::subagent_links`]).
    pub spawned_by: Option<u64>,
}

/// The reply, as far as replay needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reply {
    /// It had text (or reasoning).
    pub text: bool,
    /// Tool calls in it.
    pub tool_calls: u32,
}

/// The messages of one exchange in OpenAI chat form, for the one export that carries text.
#[derive(Debug, Clone, PartialEq)]
pub struct Content {
    /// The request's messages, system prompt first.
    pub input_messages: Vec<Value>,
    /// The reply as one assistant message (empty when no reply was recorded).
    pub output_messages: Vec<Value>,
    /// Tool definitions, when the request offered any.
    pub tools: Option<Value>,
    /// The model the request named.
    pub model: Option<String>,
}

/// One request, whatever it was read from, ready for any writer.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportRequest {
    /// Start, on the source's clock (epoch ms for recordings and gateway logs, trace ms for
    /// traces).
    pub t_ms: i64,
    pub duration_ms: Option<u64>,
    /// Time to the first byte of a streamed response.
    pub ttft_ms: Option<u64>,
    pub streamed: Option<bool>,
    pub input_tokens: u64,
    pub output: OutputLength,
    /// At the target's block size; empty for formats without hash ids.
    pub hash_ids: Vec<u64>,
    pub conversation: Conversation,
    /// The model's name (writers that are anonymous write a salted label).
    pub model: Option<String>,
    pub reply: Reply,
    /// The messages after the last assistant message include a tool result (a tool loop's next
    /// step).
    pub after_tool_result: bool,
    /// ... and other messages (a user's text).
    pub new_text: bool,
    /// Prompt tokens the server said it reused.
    pub server_reused_tokens: Option<u64>,
    /// OTel only.
    pub content: Option<Content>,
}

/// What a writer wrote beside the lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Written {
    pub lines: u64,
    pub requests: u64,
    pub conversations: u64,
    pub subagents: u64,
    /// Requests written as the step after a tool call (`input_types: ["tool_result"]`).
    pub tool_results: u64,
    /// Most requests a grouping writer held at once, waiting for their conversation to end.
    pub held_requests_max: u64,
}

/// One writer per format.
pub enum Writer {
    /// Mooncake and trace_synthetic: each request a line of its own, nothing held. The source
    /// time written as 0, the format's line, what was written.
    Lines(i64, Line, Written),
    Bailian(bailian::Writer),
    Weka(weka::Writer),
    Otel(otel::Writer),
}

/// Writes a request's line, its time counted from the `i64`, the source time written as 0.
pub type Line = fn(&ExportRequest, i64, &mut dyn Write) -> io::Result<()>;

impl Writer {
    /// `origin_ms`: the source time written as 0.
    pub fn new(target: Target, block_size: u32, salt: Salt, origin_ms: i64) -> Writer {
        match target {
            Target::Mooncake => Writer::Lines(origin_ms, mooncake::line, Written::default()),
            Target::Bailian => Writer::Bailian(bailian::Writer::new(origin_ms)),
            Target::Weka => Writer::Weka(weka::Writer::new(origin_ms, block_size, salt)),
            Target::TraceSynthetic => {
                Writer::Lines(origin_ms, trace_synthetic::line, Written::default())
            }
            Target::Otel => Writer::Otel(otel::Writer::new(salt)),
        }
    }

    pub fn push(&mut self, request: ExportRequest, out: &mut dyn Write) -> io::Result<()> {
        match self {
            Writer::Lines(origin_ms, line, written) => {
                line(&request, *origin_ms, out)?;
                written.lines += 1;
                written.requests += 1;
                Ok(())
            }
            Writer::Bailian(w) => w.push(&request, out),
            Writer::Weka(w) => w.push(request, out),
            Writer::Otel(w) => w.push(request, out),
        }
    }

    /// Writes what is still held (conversations whose last request never came).
    pub fn finish(&mut self, out: &mut dyn Write) -> io::Result<Written> {
        match self {
            Writer::Lines(.., written) => Ok(*written),
            Writer::Bailian(w) => Ok(w.written()),
            Writer::Weka(w) => w.finish(out),
            Writer::Otel(w) => w.finish(out),
        }
    }
}

/// Writes `row` as one JSON line.
pub fn write_line(out: &mut dyn Write, row: &impl Serialize) -> io::Result<()> {
    serde_json::to_writer(&mut *out, row).map_err(io::Error::other)?;
    out.write_all(b"\n")
}

/// Seconds since `origin_ms`, as the consumers that read seconds want them.
pub fn seconds_since(t_ms: i64, origin_ms: i64) -> f64 {
    t_ms.saturating_sub(origin_ms) as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn salt() -> Salt {
        Salt::from_text("test salt").unwrap_or(Salt { seed: 7 })
    }

    #[test]
    fn ids_stay_below_2_53_and_above_0_and_depend_on_the_salt() {
        let a = salt();
        let b = Salt::from_text("other salt").unwrap_or(Salt { seed: 8 });
        for n in 0..1000u64 {
            let id = a.id(Tag::Block, &[n]);
            assert!((1..=ID_MASK).contains(&id));
            assert_ne!(id, b.id(Tag::Block, &[n]));
        }
        assert_eq!(Salt::from_text("  \n"), None);
        assert_eq!(Salt::from_text("x\n"), Salt::from_text("x"));
    }

    #[test]
    fn hash_ids_fit_the_input_length_and_never_reuse_a_partial_id_as_full() {
        let s = salt();
        let source: Vec<u64> = (100..110).collect();
        // Same block size: ceil(input / bs) ids, the last one partial and different.
        let ids = hash_ids(&source, 512, 1000, 512, true, &s, 0);
        assert_eq!(ids.len(), 2);
        let longer = hash_ids(&source, 512, 1024, 512, true, &s, 0);
        assert_eq!(ids[0], longer[0]);
        assert_ne!(
            ids[1], longer[1],
            "a partial block's id is not the full block's"
        );
        // The same partial block (same content, same tokens) keeps one id.
        assert_eq!(ids, hash_ids(&source, 512, 1000, 512, true, &s, 9));
        // WEKA: full blocks only.
        assert_eq!(hash_ids(&source, 64, 200, 64, false, &s, 0).len(), 3);
        assert_eq!(hash_ids(&source, 64, 192, 64, false, &s, 0).len(), 3);
        // Exact multiples have no partial block.
        let exact = hash_ids(&source, 512, 1024, 512, true, &s, 0);
        assert_eq!(exact, longer);
    }

    #[test]
    fn grouped_ids_are_shared_exactly_when_their_prefix_is() {
        let s = salt();
        // bailian's 16-token ids grouped into 512-token blocks: 32 per group.
        let a: Vec<u64> = (0..64).collect();
        let mut b = a.clone();
        b[40] = 999; // differs in the second group
        let mut c = a.clone();
        c[3] = 999; // differs in the first group
        let ids = |v: &[u64]| hash_ids(v, 16, 1024, 512, true, &s, 0);
        assert_eq!(ids(&a)[0], ids(&b)[0]);
        assert_ne!(ids(&a)[1], ids(&b)[1]);
        assert_ne!(ids(&a)[0], ids(&c)[0]);
        assert_ne!(
            ids(&a)[1],
            ids(&c)[1],
            "chained: a changed prefix changes the rest"
        );
        // A partial last group needs only the ids its tokens cover.
        let short = hash_ids(&a[..38], 16, 600, 512, true, &s, 0);
        assert_eq!(short.len(), 2);
        assert_eq!(short[0], ids(&a)[0]);
    }

    #[test]
    fn missing_source_ids_become_ids_nobody_shares() {
        let s = salt();
        let one = hash_ids(&[5], 512, 2048, 512, true, &s, 1);
        let two = hash_ids(&[5], 512, 2048, 512, true, &s, 2);
        assert_eq!(one.len(), 4);
        assert_eq!(one[0], two[0]);
        assert!(one[1..].iter().all(|id| !two.contains(id)));
    }

    #[test]
    fn output_lengths_are_at_least_one() {
        assert_eq!(output_length(Some(9), 0, 0.25).tokens, 9);
        assert_eq!(
            output_length(Some(0), 0, 0.25),
            OutputLength {
                tokens: 1,
                source: OutputSource::RaisedFromZero
            }
        );
        let estimated = output_length(None, 41, 0.25);
        assert_eq!(
            (estimated.tokens, estimated.source),
            (11, OutputSource::Estimated)
        );
        assert_eq!(output_length(None, 0, 0.25).tokens, 1);
    }

    #[test]
    fn targets_parse_and_name_their_block_sizes() {
        for target in Target::ALL {
            assert_eq!(Target::parse(target.as_str()), Some(target));
        }
        assert_eq!(Target::Mooncake.default_block_size(), Some(512));
        assert_eq!(Target::Bailian.default_block_size(), Some(16));
        assert_eq!(Target::Weka.default_block_size(), Some(64));
        assert!(!Target::Otel.anonymous());
    }
}

#[cfg(test)]
pub mod tests_support {
    use super::*;

    /// A request of conversation `key` with 5 output tokens from the server.
    pub fn request(key: u64, t_ms: i64, input_tokens: u64) -> ExportRequest {
        ExportRequest {
            t_ms,
            duration_ms: None,
            ttft_ms: None,
            streamed: None,
            input_tokens,
            output: OutputLength {
                tokens: 5,
                source: OutputSource::Server,
            },
            hash_ids: Vec::new(),
            conversation: Conversation {
                key,
                last: false,
                spawned_by: None,
            },
            model: Some("secret-model".into()),
            reply: Reply::default(),
            after_tool_result: false,
            new_text: true,
            server_reused_tokens: None,
            content: None,
        }
    }
}
