//! Who holds the server's cache now, pure: the recording's chat requests replayed on the
//! simulated llama-server with the server's own settings (`whatif::Replayable`: the same token
//! model, slot choice and host cache), each request's predicted reuse checked against the
//! `cache_n` the server reported (calibration, per model), the slot each conversation's prefix
//! sits in at the end, what the next request of each conversation would evict, and what each
//! request that has started (its response not in yet) is doing to the slots now.
//!
//! It is a reconstruction, not a reading: llama.cpp's `/slots` says which task runs where, not
//! whose prefix a slot holds. The calibration says how far to trust it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::kv::Token;
use super::tokens::SimTokens;
use super::whatif::{GENERATION_PROMPT_TOKENS, Replayable};
use crate::analysis::{Priced, Report};
use crate::normalize::Api;
use crate::normalize::exchange::normalize;
use crate::record::{Record, ResponseRecord};

/// A prediction agrees with the server when it is within this many tokens of what the server
/// reused, or within `AGREE_SHARE` of the prompt, whichever is larger (inside a message without
/// the server's layout, tokens sit at the recording's ratio).
pub const AGREE_TOKENS: u32 = 16;
pub const AGREE_SHARE: f64 = 0.02;

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
    /// The requests that have started and not ended, in the order they started: where each
    /// is predicted to run and whose prefix it evicts, before the server has answered.
    pub starting: Vec<Starting>,
}

/// A request that has started, predicted from its body alone.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Starting {
    pub record: u64,
    /// The request it continues (its prompt, less the generation prompt, is where this one
    /// starts), and that request's conversation, if any yet.
    pub continues: Option<u64>,
    pub conversation: Option<u32>,
    pub client: String,
    /// The slot llama-server gives it.
    pub slot: usize,
    /// Every slot was busy with a request that started before it: it waits for one, and the
    /// slot is the one it would choose among all (the one freed first is not known).
    pub queued: bool,
    /// The share of its prompt the sim finds in that slot (or restores from the host cache).
    pub reused_share: f64,
    /// The tokens it finds there: the server's own where the prefix is earlier prompts' (their
    /// tokens are the server's count); the share's whole is estimated, its server count not
    /// known yet.
    pub reused_tokens: usize,
    /// Another conversation's prefix the slot holds, which this request overwrites.
    pub evicts: Option<Holder>,
    /// With the host cache on, the evicted prompt is saved, not lost.
    pub saved_to_host: bool,
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
    residency_with_starts(records, report, &[], slots, cache_ram)
}

/// `residency`, and what each of `starting` (requests whose response has not come: records
/// with no response) does when it reaches the server, in the order they started: each takes
/// the slot llama-server would give it among those the ones before it left idle.
pub fn residency_with_starts<R: Priced, B: std::borrow::Borrow<Record>>(
    records: &[B],
    report: &Report<R>,
    starting: &[Record],
    slots: usize,
    cache_ram: bool,
) -> Residency {
    let mut rows: BTreeMap<u64, (Option<u32>, &str)> = BTreeMap::new();
    // The turn each request continues (the analysis's link).
    let mut links: BTreeMap<u64, u64> = BTreeMap::new();
    for row in &report.rows {
        let r = row.rated().row();
        rows.insert(r.id, (r.conversation, r.client.as_str()));
        if let Some(previous) = r.linked_to {
            links.insert(r.id, previous);
        }
    }
    // A conversation's first turn has its number once a second turn joins it.
    for (&id, &previous) in &links {
        let conversation = rows.get(&id).and_then(|(c, _)| *c);
        if let (Some(conversation), Some(first)) = (conversation, rows.get_mut(&previous))
            && first.0.is_none()
        {
            first.0 = Some(conversation);
        }
    }
    let holder = |record: u64| {
        let (conversation, client) = rows.get(&record).copied().unwrap_or((None, ""));
        Holder {
            record,
            conversation,
            client: client.to_string(),
        }
    };
    let replayable = Replayable::of(records);
    let mut calibration: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut disagreements = Vec::new();
    let mut holders: Vec<Option<u64>> = vec![None; slots.max(1)];
    // Each conversation's latest prompt (the sim's tokens), to ask where its next would go;
    // and each chain of turns' latest, by its request (a first turn has no conversation yet).
    let mut latest: BTreeMap<u32, (u64, Vec<Token>)> = BTreeMap::new();
    let mut chains: BTreeMap<u64, Vec<Token>> = BTreeMap::new();
    let mut evicted = Vec::new();
    let kv = replayable.replay(slots, cache_ram, false, |_, x, prompt, served, reused| {
        if let Some(slot) = holders.get_mut(served.slot) {
            *slot = Some(x.id);
        }
        if let Some((Some(conversation), _)) = rows.get(&x.id) {
            latest.insert(*conversation, (x.id, prompt.to_vec()));
        }
        let previous = links.get(&x.id).copied();
        if let Some(previous) = previous {
            chains.remove(&previous);
        }
        chains.insert(x.id, prompt.to_vec());
        // Its previous turn's prompt was not what the slot (or the host cache) gave back.
        if let (Some(previous), Some(replaced)) = (previous, served.replaced)
            && replaced != previous
        {
            evicted.push((x.id, replaced));
        }
        if let (Some(recorded), Some(prompt)) = (x.counts.reused_tokens, x.counts.prompt_tokens) {
            let model = x.served_model.as_deref().unwrap_or(&x.model).to_string();
            let entry = calibration.entry(model).or_default();
            entry.0 += 1;
            if agrees(prompt.value, recorded.value, reused) {
                entry.1 += 1;
            } else {
                disagreements.push((x.id, recorded.value, reused));
            }
        }
    });
    let mut tokens = replayable.into_tokens();
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
    let starting = predict_starts(
        starting,
        (kv.clone(), &mut tokens),
        &holders,
        &chains,
        &holder,
        cache_ram,
    );
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
        starting,
    }
}

/// What the requests that have started do to the slots, on a copy of the replayed cache.
fn predict_starts(
    starting: &[Record],
    (mut kv, tokens): (super::kv::KvCache, &mut SimTokens),
    holders: &[Option<Holder>],
    chains: &BTreeMap<u64, Vec<Token>>,
    holder_of: &dyn Fn(u64) -> Holder,
    cache_ram: bool,
) -> Vec<Starting> {
    let mut order: Vec<&Record> = starting.iter().collect();
    order.sort_by_key(|r| (r.t_start_ms, r.id));
    let mut holders: Vec<Option<Holder>> = holders.to_vec();
    let mut busy = vec![false; holders.len()];
    let mut predicted = Vec::new();
    for record in order {
        if request_only(record).is_none() {
            continue;
        }
        let Some(prompt) = tokens.started(record) else {
            continue;
        };
        // The turn whose prompt, less its generation prompt, this one extends (the longest).
        let continued = chains
            .iter()
            .filter(|(_, previous)| {
                let body = &previous[..previous.len().saturating_sub(GENERATION_PROMPT_TOKENS)];
                !body.is_empty() && prompt.starts_with(body)
            })
            .max_by_key(|(_, previous)| previous.len())
            .map(|(&id, _)| holder_of(id));
        let continues = continued.as_ref().map(|h| h.record);
        let conversation = continued.as_ref().and_then(|h| h.conversation);
        let client = continued.map(|h| h.client).unwrap_or_default();
        let idle = kv.choose_slot(&prompt, |i| !busy.get(i).copied().unwrap_or(true));
        let Some(slot) = idle.or_else(|| kv.choose_slot(&prompt, |_| true)) else {
            continue;
        };
        let served = kv.serve(slot, &prompt, record.id);
        if let Some(busy) = busy.get_mut(slot) {
            *busy = true;
        }
        let held = holders.get(slot).cloned().flatten();
        let same_chain = |h: &Holder| {
            Some(h.record) == continues
                || (conversation.is_some() && h.conversation == conversation)
        };
        if let Some(holder) = holders.get_mut(slot) {
            *holder = Some(Holder {
                record: record.id,
                conversation,
                client: client.clone(),
            });
        }
        predicted.push(Starting {
            record: record.id,
            continues,
            conversation,
            client,
            slot,
            queued: idle.is_none(),
            reused_share: served.cache_n as f64 / prompt.len().max(1) as f64,
            reused_tokens: served.cache_n,
            evicts: held.filter(|h| !same_chain(h)),
            saved_to_host: cache_ram,
        });
    }
    predicted
}

/// A started request's exchange from its body alone (no response yet: an empty 200 in its
/// place, so the messages and tools are read as they will be once it ends).
fn request_only(record: &Record) -> Option<crate::normalize::exchange::Exchange> {
    let mut shadow = record.clone();
    shadow.error = None;
    shadow.response = Some(ResponseRecord::bare(200, None));
    normalize(&shadow)
        .ok()
        .filter(|x| x.api == Api::OpenaiChat && !x.messages.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agreement_is_within_16_tokens_or_a_fiftieth_of_the_prompt() {
        assert!(agrees(100, 50, 66));
        assert!(!agrees(100, 50, 67));
        assert!(agrees(2_000, 1_000, 1_040));
        assert!(!agrees(2_000, 1_000, 1_041));
    }
}
