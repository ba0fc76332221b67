//! Who holds the server's cache now, pure: the recording's chat requests replayed on the
//! simulated llama-server with the server's own settings (`whatif::replay`: the same token
//! model, slot choice and host cache), each request's predicted reuse checked against the
//! `cache_n` the server reported (calibration, per model), the slot each conversation's prefix
//! sits in at the end, and what the next request of each conversation would evict.
//!
//! It is a reconstruction, not a reading: llama.cpp's `/slots` says which task runs where, not
//! whose prefix a slot holds. The calibration says how far to trust it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::kv::Token;
use super::whatif::{replay, replayable, tokens_per_char};
use crate::analysis::{Priced, Report};
use crate::record::Record;

/// A prediction agrees with the server when it is within this many tokens of what the server
/// reused, or within `AGREE_SHARE` of the prompt, whichever is larger (the sim weighs messages
/// by characters and reuses whole messages).
pub const AGREE_TOKENS: u32 = 16;
pub const AGREE_SHARE: f64 = 0.10;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Residency {
    pub slots: usize,
    pub cache_ram: bool,
    /// What each slot holds at the end: the request whose prompt it is and its conversation.
    pub holders: Vec<Option<Holder>>,
    /// Prompts and tokens (the sim's) in host memory at the end.
    pub host_prompts: usize,
    pub host_tokens: usize,
    /// Per model: requests the server reported reuse for, and how many the sim predicted.
    pub calibration: Vec<Calibration>,
    /// Requests where the sim and the server disagree: (record id, server reused, predicted).
    pub disagreements: Vec<(u64, u32, u32)>,
    /// Requests the sim found evicted (their conversation's previous prompt no longer in the
    /// slot they got): (record id, the request whose prompt the slot held instead). Needs no
    /// response: each is known once the request and those before it have started.
    pub evicted: Vec<(u64, u64)>,
    /// What each conversation's next request would do to another's prefix, had it come now.
    pub next_evictions: Vec<NextEviction>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    pub record: u64,
    pub conversation: Option<u32>,
    pub client: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Calibration {
    pub model: String,
    pub compared: usize,
    pub agreed: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NextEviction {
    /// The conversation whose next request it would be, its latest request and its client.
    pub conversation: u32,
    pub after: u64,
    pub client: String,
    pub slot: usize,
    /// The conversation whose prefix that slot holds now.
    pub evicts: Holder,
    /// With the host cache on, the evicted prompt is saved, not lost.
    pub saved_to_host: bool,
}

pub fn agrees(prompt: u32, recorded: u32, predicted: u32) -> bool {
    let tolerance = AGREE_TOKENS.max((f64::from(prompt) * AGREE_SHARE).round() as u32);
    recorded.abs_diff(predicted) <= tolerance
}

/// `records` replayed with the server's settings; `report` is their analysis (for the
/// conversations and clients of each request).
pub fn residency<R: Priced>(
    records: &[Record],
    report: &Report<R>,
    slots: usize,
    cache_ram: bool,
) -> Residency {
    let rows: BTreeMap<u64, (Option<u32>, &str)> = report
        .rows
        .iter()
        .map(|r| {
            let r = r.rated().row();
            (r.id, (r.conversation, r.client.as_str()))
        })
        .collect();
    let holder = |record: u64| {
        let (conversation, client) = rows.get(&record).copied().unwrap_or((None, ""));
        Holder {
            record,
            conversation,
            client: client.to_string(),
        }
    };
    let exchanges = replayable(records);
    let ratio = tokens_per_char(exchanges.iter().map(|(_, x)| x));
    let mut calibration: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut disagreements = Vec::new();
    let mut holders: Vec<Option<u64>> = vec![None; slots.max(1)];
    // Each conversation's latest prompt (the sim's tokens), to ask where its next would go.
    let mut latest: BTreeMap<u32, (u64, Vec<Token>)> = BTreeMap::new();
    let mut evicted = Vec::new();
    let kv = replay(
        &exchanges,
        slots,
        cache_ram,
        ratio,
        |_, x, prompt, served, reused| {
            if let Some(slot) = holders.get_mut(served.slot) {
                *slot = Some(x.id);
            }
            if let Some((Some(conversation), _)) = rows.get(&x.id) {
                let previous = latest.insert(*conversation, (x.id, prompt.to_vec()));
                // Its previous prompt was not what the slot (or the host cache) gave back.
                if let (Some((previous, _)), Some(replaced)) = (previous, served.replaced)
                    && replaced != previous
                {
                    evicted.push((x.id, replaced));
                }
            }
            if let (Some(recorded), Some(prompt)) = (x.counts.reused_tokens, x.counts.prompt_tokens)
            {
                let model = x.served_model.clone().unwrap_or_else(|| x.model.clone());
                let entry = calibration.entry(model).or_default();
                entry.0 += 1;
                if agrees(prompt.value, recorded.value, reused) {
                    entry.1 += 1;
                } else {
                    disagreements.push((x.id, recorded.value, reused));
                }
            }
        },
    );
    let holders: Vec<Option<Holder>> = holders.into_iter().map(|h| h.map(holder)).collect();
    let mut next_evictions = Vec::new();
    for (&conversation, (id, prompt)) in &latest {
        // Its next request starts with its latest prompt: the slot llama-server would give it.
        let Some(slot) = kv.choose_slot(prompt, |_| true) else {
            continue;
        };
        let Some(Some(held)) = holders.get(slot) else {
            continue;
        };
        if held.conversation != Some(conversation) {
            next_evictions.push(NextEviction {
                conversation,
                after: *id,
                client: holder(*id).client,
                slot,
                evicts: held.clone(),
                saved_to_host: cache_ram,
            });
        }
    }
    let (host_prompts, host_tokens) = kv.host_cache();
    Residency {
        slots: kv.slot_count(),
        cache_ram,
        holders,
        host_prompts,
        host_tokens,
        calibration: calibration
            .into_iter()
            .map(|(model, (compared, agreed))| Calibration {
                model,
                compared,
                agreed,
            })
            .collect(),
        disagreements,
        evicted,
        next_evictions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_is_within_16_tokens_or_a_tenth_of_the_prompt() {
        assert!(agrees(100, 50, 66));
        assert!(!agrees(100, 50, 67));
        assert!(agrees(2_000, 1_000, 1_200));
        assert!(!agrees(2_000, 1_000, 1_201));
    }
}
