//! The server model against what a real llama.cpp said, on one recording of
//! `tests/llama/scenarios.py`: the ceiling bounds the server's reuse on every request, and
//! every charged loss is what the server had and re-evaluated.
//!
//! What the slot held after a turn comes from the server's own counts: its prompt and the
//! tokens it generated, all but the last (sampled, never evaluated) — on the `append` scenario
//! every warm turn reuses exactly that (`held_after`), which is what makes it the truth here.

use prefixscope_core::analysis::{Config, Report, Row, analyze};
use prefixscope_core::record::{Record, read_jsonl};

/// Tokens a llama.cpp slot holds after serving `row`: its prompt and its reply less one.
pub fn held_after(row: &Row) -> Option<u32> {
    let prompt = row.counts.prompt_tokens?.value;
    let generated = row.counts.completion_tokens?.value;
    Some(prompt + generated.saturating_sub(1))
}

pub struct Check {
    pub report: Report,
    /// Server reuse and the ceiling on the same requests, in total.
    pub server_total: u64,
    pub ceiling_total: u64,
    /// Charged tokens and the truth (held before − reused), in total.
    pub charged_total: u64,
    pub truth_total: u64,
    pub problems: Vec<String>,
}

/// Checks one recording. A charged loss must be within max(4 tokens, `share`) of what the
/// slot held of the turn before and the server did not reuse (3% with the server's layout, 8%
/// without, where messages are weighed by their characters); the ceiling may be short of the
/// server's reuse by one token on a request (llama.cpp re-tokenizes the reply at its end).
pub fn check(jsonl: &[u8], name: &str) -> Check {
    check_within(jsonl, name, 0.03)
}

/// Whether `next` sends `prev`'s reply back as its next message (else the slot's reply is
/// not what the prompt continues with: a harness that put a tool call in its place).
fn reply_sent_back(prev: &Record, next: &Record) -> bool {
    let reply = prev
        .response
        .as_ref()
        .and_then(|r| r.body.as_ref())
        .and_then(|b| b.pointer("/choices/0/message/content"))
        .and_then(|c| c.as_str());
    let (Some(sent), Some(next_messages)) = (
        prev.request
            .body
            .as_ref()
            .and_then(|b| b["messages"].as_array()),
        next.request
            .body
            .as_ref()
            .and_then(|b| b["messages"].as_array()),
    ) else {
        return true;
    };
    next_messages
        .get(sent.len())
        .is_some_and(|m| m["role"] == "assistant" && m["content"].as_str() == reply)
}

pub fn check_within(jsonl: &[u8], name: &str, share: f64) -> Check {
    let bound = super::bound::ceiling_bound(jsonl, name);
    let records = read_jsonl(jsonl).records;
    let record = |id: u64| records.iter().find(|r| r.id == id);
    let report = analyze(&records, &Config::default());
    let mut problems = bound.over.clone();
    if bound.ceiling_total < bound.server_total {
        problems.push(format!(
            "{name}: ceiling {} < server {} in total",
            bound.ceiling_total, bound.server_total
        ));
    }
    let (mut charged_total, mut truth_total) = (0u64, 0u64);
    for row in &report.rows {
        let charged: u32 = [&row.lost_client, &row.lost_external]
            .into_iter()
            .flatten()
            .map(|loss| loss.tokens)
            .sum();
        let Some(prev) = row
            .linked_to
            .and_then(|id| report.rows.iter().find(|r| r.id == id))
        else {
            if charged > 0 {
                problems.push(format!("{name} row {}: {charged} charged, no link", row.id));
            }
            continue;
        };
        let held = match (record(prev.id), record(row.id)) {
            (Some(p), Some(r)) if !reply_sent_back(p, r) => {
                prev.counts.prompt_tokens.map(|p| p.value)
            }
            _ => held_after(prev),
        };
        let (Some(held), Some(reused)) = (held, row.counts.reused_tokens) else {
            continue;
        };
        let truth = held.saturating_sub(reused.value);
        charged_total += u64::from(charged);
        truth_total += u64::from(truth);
        let tolerance = (f64::from(truth) * share).max(4.0);
        if f64::from(charged.abs_diff(truth)) > tolerance {
            problems.push(format!(
                "{name} row {}: charged {charged} ({:?}), the server lost {truth} (held {held}, reused {})",
                row.id,
                row.lost_external
                    .as_ref()
                    .or(row.lost_client.as_ref())
                    .map(|l| l.cause.as_str()),
                reused.value
            ));
        }
    }
    Check {
        report,
        server_total: bound.server_total,
        ceiling_total: bound.ceiling_total,
        charged_total,
        truth_total,
        problems,
    }
}
