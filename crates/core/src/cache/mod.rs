//! Cache simulation: how much a prefix cache could save on some traffic, and how much capacity
//! that takes. Pure: no I/O, no clock.
//!
//! Every input (recordings, gateway CSV, Mooncake and bailian traces) becomes a [`Request`]: a
//! sequence of blocks with their token weights plus what the profile reports beside the curve.
//! From there one engine serves them all:
//!
//! - [`blocks`]: the block model for requests that carry a prompt (render, cut, chained hash;
//!   `blocks::fit`, what the parts weigh);
//! - [`policy`]: the trie of blocks and the policies (ceiling, FIFO, optimal), each exactly as
//!   kvcache-simulator 0.1.3 computes it;
//! - [`lru`]: LRU, exactly as kvcache-simulator computes it, at every capacity from one walk
//!   (stack distances);
//! - [`profile`]: the batch report (curve, split, leaderboards, distributions, AIPerf's rate);
//! - [`live`]: the same policies fed one request at a time (a cold replay) for the live views.

pub(crate) mod blocks;
pub(crate) mod capacity;
pub(crate) mod live;
pub(crate) mod lru;
pub(crate) mod policy;
pub(crate) mod prefixes;
pub(crate) mod profile;
pub(crate) mod stats;

pub use blocks::{BlockModel, Cutter, ToolsPosition};
pub use capacity::{DEFAULT_CAPACITIES, kv_model_bytes_per_token, parse_capacity};
pub use lru::Lru;
pub use policy::{Belady, Ceiling, EventBuilder, Fifo, next_uses};
pub use prefixes::{PrefixGroup, leaderboards};
pub use profile::{Passes, Point, aiperf_cache_hit_rate, aiperf_ratios, ceiling_per_request};
pub use stats::Distribution;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use live::LiveSimulator;
pub use policy::Policy;
pub use profile::{Capacity, ProfileConfig, ProfileReport, profile};

/// Version of the profile report format.
/// 2: `ceiling` caches each request's reply after its prompt (where the reply is known);
/// `ceiling_prompts_only` and `prompts_only` added.
pub const PROFILE_REPORT_VERSION: u32 = 2;

/// One block of a request's prompt: its id (a chained hash below 2^53, or a trace's raw hash id)
/// and how many prompt tokens it stands for. Packed to 12 bytes, not 16: the blocks are most of
/// a trace's requests (3.5 MB of the Mooncake trace's, once 4.6), and each page of them is
/// faulted in. Fields are read by value (a reference to a packed field does not compile).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(C, packed(4))]
pub struct Block {
    pub id: u64,
    pub tokens: u32,
}

/// How a request's prompt was cut into blocks; the report counts requests by cut, because the
/// precision of every figure depends on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cut {
    /// A trace's own `hash_ids`, weighted from `input_length` as kvcache-simulator does.
    TraceHashIds,
    /// Token positions from the recording's tokenizer counts per message and tool.
    TokenizerCounts,
    /// Token positions scaled to the server's `prompt_tokens`: exactly
    /// `ceil(prompt_tokens / block_size)` blocks.
    ServerPromptTokens,
    /// No token count at all: characters ÷ 4.
    CharsDiv4,
}

impl Cut {
    pub fn as_str(self) -> &'static str {
        match self {
            Cut::TraceHashIds => "trace_hash_ids",
            Cut::TokenizerCounts => "tokenizer_counts",
            Cut::ServerPromptTokens => "server_prompt_tokens",
            Cut::CharsDiv4 => "chars_div_4",
        }
    }
}

/// What a block's id was computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockKeys {
    /// The trace's hash ids as given.
    Trace,
    /// The rendered text of the block (full recordings, gateway logs).
    Content,
    /// (message hash, index within the message): digest recordings, which keep no text.
    MessageDigest,
}

/// One part of a rendered prompt, for saying what a shared prefix is made of.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptPart {
    /// `tools`, or the message's role. Shared with the prompt's segment: every request of a
    /// conversation re-sends its parts.
    pub kind: Arc<str>,
    /// Tool names for `tools`; the message's name or tool call id otherwise.
    pub label: Option<Arc<str>>,
    /// Where the part ends, in the request's prompt tokens.
    pub token_end: u64,
    /// The first characters of the text (full recordings and gateway logs only).
    pub preview: Option<Arc<str>>,
}

/// One request, whatever it was read from: everything after parsing is shared.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Request {
    /// Arrival time (epoch or trace-relative milliseconds), when the input has one.
    pub t_ms: Option<i64>,
    pub blocks: Vec<Block>,
    /// Prompt tokens: `input_length`, the server's count, or the estimate the cut used.
    pub input_tokens: u64,
    pub output_tokens: Option<u64>,
    /// Requests with the same key belong to one conversation (for the "same conversation" split).
    pub conversation: Option<String>,
    /// An explicit session identifier the request carried (for affinity routing).
    pub session_id: Option<SessionId>,
    pub model: Option<String>,
    pub streamed: Option<bool>,
    pub cut: Option<Cut>,
    pub keys: Option<BlockKeys>,
    /// Prompt tokens the server said it reused from its cache, when it said so.
    pub server_reused_tokens: Option<u64>,
    /// The record id, for recordings (so the analysis can attach its conversations).
    pub record_id: Option<u64>,
    /// What the prompt is made of, for recordings and gateway logs.
    pub parts: Vec<PromptPart>,
    /// The blocks the server holds once it has answered: the prompt, then the reply as the next
    /// turn renders it (llama.cpp keeps the generated tokens in the slot; vLLM and SGLang cache
    /// full blocks of them). Empty where the reply is unknown (traces, digest recordings) or
    /// cannot be reused (it began with reasoning). The simulation inserts them after the request
    /// is served, without counting them: see [`profile::Passes`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cached_after: Vec<Block>,
}

/// A session identifier and where it was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionId {
    pub source: String,
    pub value: String,
}

/// A fast hasher for the simulator's integer keys (the Fx multiply-rotate scheme): std's SipHash
/// guards against adversarial keys, which block ids are not, at several times the cost.
#[derive(Debug, Clone, Copy, Default)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(SEED);
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

/// Where `id` goes in an array indexed by small ids, or `None` for the hash-map side. Trace ids
/// are mostly small integers, and one array access beats a hash lookup that misses the CPU
/// cache. The array may grow to about twice the entries `held`, so a large id cannot size it;
/// an id once too large may fall within it later, so a caller whose array slot is empty must
/// still look on its map side.
pub fn small_id_slot(id: u64, array_len: usize, held: usize) -> Option<usize> {
    let bound = array_len.max(2 * held + 4096);
    usize::try_from(id).ok().filter(|&i| i < bound)
}

pub type IdBuildHasher = std::hash::BuildHasherDefault<IdHasher>;
pub type IdMap<K, V> = std::collections::HashMap<K, V, IdBuildHasher>;
pub type IdSet<K> = std::collections::HashSet<K, IdBuildHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_twelve_bytes_and_reads_back_what_it_was_given() {
        assert_eq!(std::mem::size_of::<Block>(), 12);
        let blocks = [
            Block {
                id: u64::MAX,
                tokens: u32::MAX,
            },
            Block {
                id: 1 << 53,
                tokens: 7,
            },
        ];
        let (first, second) = (blocks[0], blocks[1]);
        assert_eq!((first.id, first.tokens), (u64::MAX, u32::MAX));
        assert_eq!((second.id, second.tokens), (1 << 53, 7));
        let json = serde_json::to_string(&blocks[1]).unwrap_or_default();
        assert_eq!(json, r#"{"id":9007199254740992,"tokens":7}"#);
        assert_eq!(serde_json::from_str::<Block>(&json).ok(), Some(blocks[1]));
    }
}
