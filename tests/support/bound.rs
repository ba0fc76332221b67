//! The ceiling as an upper bound of what a real server reused: the check the real llama.cpp
//! recordings and the end-to-end test share.

use prefixscope_core::cache::ceiling_per_request;
use prefixscope_core::input::{self, Format, InputOptions};
use prefixscope_core::record::Record;

/// Tokens a template renders before the first message of a prompt without a system message
/// (SmolLM2's and Qwen2.5's default system prompt): the server may reuse a few of them from an
/// earlier prompt's system message, and no recording holds that text to match.
pub const DEFAULT_SYSTEM_ALLOWANCE: u64 = 8;

/// What the check found: the totals, and every request whose server reuse exceeds its ceiling
/// by more than one block.
pub struct Bound {
    pub block_size: u64,
    pub server_total: u64,
    pub ceiling_total: u64,
    pub over: Vec<String>,
}

/// Reads `jsonl` (a recording) at profile's defaults and compares, request by request, the
/// ceiling (replies cached, replayed cold) with the reuse the server reported.
pub fn ceiling_bound(jsonl: &[u8], name: &str) -> Bound {
    let input = input::read(jsonl, name, Format::Recording, &InputOptions::default());
    let records: Vec<Record> = prefixscope_core::record::read_jsonl(jsonl).records;
    let block_size = u64::from(
        input
            .report
            .block_model
            .as_ref()
            .map_or(16, |m| m.block_size),
    );
    let per_request = ceiling_per_request(&input.requests, true);
    let mut bound = Bound {
        block_size,
        server_total: 0,
        ceiling_total: 0,
        over: Vec::new(),
    };
    for (request, &ceiling) in input.requests.iter().zip(&per_request) {
        let Some(reused) = request.server_reused_tokens else {
            continue;
        };
        bound.server_total += reused;
        bound.ceiling_total += ceiling;
        let record = records.iter().find(|r| Some(r.id) == request.record_id);
        let body = record.and_then(|r| r.request.body.as_ref());
        // Chat form: the Anthropic API's system prompt is a field, not a message.
        let without_system = body.is_some_and(|b| {
            b.get("system").is_none()
                && b.pointer("/messages/0/role").is_some_and(|r| r != "system")
        });
        // Reuse that ends inside the first message is of another prompt's first message (the
        // words two system prompts start with): inside a message the ceiling places tokens by
        // characters, which two different texts need not share.
        let first_message_end = request
            .parts
            .iter()
            .find(|part| &*part.kind != "tools")
            .map_or(0, |part| part.token_end);
        let allowance = block_size
            + if without_system || reused < first_message_end {
                DEFAULT_SYSTEM_ALLOWANCE
            } else {
                0
            };
        if reused > ceiling + allowance {
            bound.over.push(format!(
                "record {:?}: server reused {reused}, ceiling {ceiling} ({block_size}-token blocks)",
                request.record_id
            ));
        }
    }
    bound
}
