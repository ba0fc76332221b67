//! What the scripted agents did, pure: the events each script caused (kind + request), the
//! evictions the simulated server's own log shows, and the check of an analysis report against
//! both: every event must be named with the right cause, and nothing else blamed on eviction.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use prefixscope_core::analysis::EngineKind;
use prefixscope_core::analysis::{BreakCause, Cause, Report, Row, RowKind};
use prefixscope_core::record::Record;
use prefixscope_core::sim::ServedLog;
use prefixscope_core::units::serde_name;

/// What a script did that the analysis should name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A request outside any conversation (a title, a summary for compaction).
    SideCall,
    SystemChanged,
    ToolsChanged,
    Compaction,
    /// The turn's cached prefix was pushed out of the server by other requests (`evictors`).
    Evicted,
    /// The turn's prefix was still in its slot, but the engine could not use it (a sliding
    /// window): nobody else's doing.
    EngineForced,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScriptEvent {
    pub kind: EventKind,
    /// The request's position in the run (1, 2, …): the order the server took them.
    pub order: u64,
    pub response_id: String,
    pub agent: String,
    /// For evictions: the requests that ran on the turn's slot since its previous turn.
    pub evictors: Vec<String>,
    /// For evictions: the previous turn's prompt as a share of this one's, what the eviction
    /// cost. The analysis names a loss when reuse falls more than 20 points below its
    /// prediction, so a smaller eviction may go unnamed (and is not counted as missed).
    #[serde(default)]
    pub share: Option<f64>,
}

/// Evictions costing less than this share of the prompt may fall under the analysis's
/// 20-point threshold (with a margin for its token estimates).
pub const MINOR_EVICTION_SHARE: f64 = 0.25;

/// One request the agents sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestLog {
    pub order: u64,
    pub agent: String,
    /// The conversation it belongs to; `None` for a side-call.
    pub conversation: Option<String>,
    pub response_id: String,
    /// The prompt changed near its start on purpose (system prompt, tools): the client's loss.
    pub breaks: bool,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct RunLog {
    pub requests: Vec<RequestLog>,
    pub events: Vec<ScriptEvent>,
    pub errors: Vec<String>,
}

/// The evictions the server's log shows: a turn whose previous turn's prompt was no longer in
/// the slot it got (nor restored from host memory), with the requests that had run on that
/// slot in between; and the engine's own re-prefills: the prompt was still there and the
/// sliding window made it unusable. Turns whose prompt broke on purpose are left out (their
/// break is the cause).
pub fn evictions(log: &RunLog, served: &[ServedLog]) -> Vec<ScriptEvent> {
    let by_id: BTreeMap<&str, &ServedLog> =
        served.iter().map(|s| (s.response_id.as_str(), s)).collect();
    let mut last_of: BTreeMap<&str, &RequestLog> = BTreeMap::new();
    let mut out = Vec::new();
    for request in &log.requests {
        let Some(conversation) = request.conversation.as_deref() else {
            continue;
        };
        let previous = last_of.insert(conversation, request);
        let (Some(previous), false) = (previous, request.breaks) else {
            continue;
        };
        let (Some(prev), Some(cur)) = (
            by_id.get(previous.response_id.as_str()),
            by_id.get(request.response_id.as_str()),
        ) else {
            continue;
        };
        if cur.served.replaced == Some(prev.number) {
            if cur.served.forced {
                out.push(ScriptEvent {
                    kind: EventKind::EngineForced,
                    order: request.order,
                    response_id: request.response_id.clone(),
                    agent: request.agent.clone(),
                    evictors: Vec::new(),
                    share: Some(prev.prompt_tokens as f64 / cur.prompt_tokens.max(1) as f64),
                });
            }
            continue;
        }
        // Who used the previous turn's slot since: those pushed its prompt out.
        let evictors: Vec<&ServedLog> = served
            .iter()
            .filter(|s| {
                s.number > prev.number && s.number < cur.number && s.served.slot == prev.served.slot
            })
            .collect();
        out.push(ScriptEvent {
            kind: EventKind::Evicted,
            order: request.order,
            response_id: request.response_id.clone(),
            agent: request.agent.clone(),
            evictors: evictors.iter().map(|s| s.response_id.clone()).collect(),
            share: Some(prev.prompt_tokens as f64 / cur.prompt_tokens.max(1) as f64),
        });
    }
    out
}

/// One scripted event against the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventCheck {
    pub event: ScriptEvent,
    /// The record (and report row) of the event's request.
    pub row: Option<u64>,
    pub named: bool,
    /// What the report says about that row.
    pub report_says: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    pub events: Vec<EventCheck>,
    /// Rows the report blames on eviction or the server where the script and the server's log
    /// show none.
    pub unexpected: Vec<(u64, String)>,
}

impl Check {
    pub fn named(&self) -> usize {
        self.events.iter().filter(|e| e.named).count()
    }

    /// `side_call 2/2 · system_changed 1/1 · …`
    pub fn summary(&self) -> String {
        let mut by_kind: BTreeMap<EventKind, (usize, usize)> = BTreeMap::new();
        for e in &self.events {
            let entry = by_kind.entry(e.event.kind).or_default();
            entry.0 += 1;
            entry.1 += usize::from(e.named);
        }
        let mut parts: Vec<String> = by_kind
            .iter()
            .map(|(kind, (expected, named))| format!("{} {named}/{expected}", serde_name(kind)))
            .collect();
        if !self.unexpected.is_empty() {
            parts.push(format!("{} unexpected", self.unexpected.len()));
        }
        parts.join(" · ")
    }
}

/// The `id` of the response a record holds (the simulated server numbers its responses).
pub fn response_id(record: &Record) -> Option<&str> {
    record.response.as_ref()?.body.as_ref()?.get("id")?.as_str()
}

/// Holds `report` (of `records`) against the script's events. `exact_evictor`: the report's
/// `evicted_by` must be one of the event's evictors (true with one slot, where "the last request
/// in between" is the evictor; with more slots only the cause is compared).
pub fn check(
    report: &Report,
    records: &[Record],
    log: &RunLog,
    events: &[ScriptEvent],
    exact_evictor: bool,
) -> Check {
    let record_of: BTreeMap<&str, u64> = records
        .iter()
        .filter_map(|r| response_id(r).map(|id| (id, r.id)))
        .collect();
    let side_calls: BTreeSet<&str> = log
        .requests
        .iter()
        .filter(|r| r.conversation.is_none())
        .map(|r| r.response_id.as_str())
        .collect();
    let rows: BTreeMap<u64, &Row> = report.rows.iter().map(|r| (r.id, r)).collect();
    let mut evicted_rows = BTreeSet::new();
    let checks = events
        .iter()
        .map(|event| {
            let id = record_of.get(event.response_id.as_str()).copied();
            let row = id.and_then(|id| rows.get(&id).copied());
            let Some(row) = row else {
                return EventCheck {
                    event: event.clone(),
                    row: id,
                    named: false,
                    report_says: "no such row".into(),
                };
            };
            let evicted_by = row.evicted_by.as_ref();
            let named = match event.kind {
                EventKind::SideCall => row.kind == RowKind::SideCall,
                EventKind::SystemChanged => row.break_cause == Some(BreakCause::SystemChanged),
                EventKind::ToolsChanged => row.break_cause == Some(BreakCause::ToolsChanged),
                EventKind::Compaction => row.compaction,
                EventKind::Evicted => {
                    evicted_rows.insert(row.id);
                    let evictors: BTreeMap<u64, bool> = event
                        .evictors
                        .iter()
                        .filter_map(|e| {
                            record_of
                                .get(e.as_str())
                                .map(|&r| (r, side_calls.contains(e.as_str())))
                        })
                        .collect();
                    let kind_ok = match (row.cause, evicted_by) {
                        (Some(Cause::SideCall | Cause::OtherConversation), Some(by)) => {
                            !exact_evictor
                                || evictors
                                    .get(&by.row)
                                    .is_some_and(|&side_call| side_call == (by.kind == "side_call"))
                        }
                        _ => false,
                    };
                    let minor = event.share.is_some_and(|s| s < MINOR_EVICTION_SHARE);
                    kind_ok || (minor && row.cause.is_none())
                }
                // The engine's, and named as a sliding window; none of it the client's.
                EventKind::EngineForced => {
                    evicted_rows.insert(row.id);
                    row.lost_client.is_none()
                        && row
                            .lost_external
                            .as_ref()
                            .is_some_and(|l| l.cause.starts_with("server_"))
                        && row
                            .engine_cause
                            .as_ref()
                            .is_some_and(|e| e.kind == EngineKind::SlidingWindow)
                }
            };
            EventCheck {
                event: event.clone(),
                row: Some(row.id),
                named,
                report_says: describe(row),
            }
        })
        .collect();
    let unexpected = report
        .rows
        .iter()
        .filter(|row| !evicted_rows.contains(&row.id))
        .filter(|row| {
            row.lost_external.is_some()
                || matches!(
                    row.cause,
                    Some(
                        Cause::SideCall
                            | Cause::OtherConversation
                            | Cause::ServerReset
                            | Cause::Undetermined
                            | Cause::OtherModel
                    )
                )
        })
        .map(|row| (row.id, describe(row)))
        .collect();
    Check {
        events: checks,
        unexpected,
    }
}

fn describe(row: &Row) -> String {
    format!(
        "kind {:?}, break {:?}, compaction {}, cause {:?}, lost {:?}/{:?}, evicted by {:?}, engine {:?}",
        row.kind,
        row.break_cause,
        row.compaction,
        row.cause,
        row.lost_client.as_ref().map(|l| (&l.cause, l.tokens)),
        row.lost_external.as_ref().map(|l| (&l.cause, l.tokens)),
        row.evicted_by.as_ref().map(|e| (e.row, &e.kind)),
        row.engine_cause.as_ref().map(|e| e.kind),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefixscope_core::sim::{KvCache, KvConfig};

    fn request(order: u64, conversation: Option<&str>) -> RequestLog {
        RequestLog {
            order,
            agent: "a".into(),
            conversation: conversation.map(String::from),
            response_id: format!("r{order}"),
            breaks: false,
            prompt_tokens: 0,
            cached_tokens: 0,
        }
    }

    /// Serves prompts on one slot and logs them as the server does.
    fn serve(kv: &mut KvCache, prompts: &[Vec<u64>]) -> Vec<ServedLog> {
        prompts
            .iter()
            .enumerate()
            .map(|(i, prompt)| {
                let number = i as u64 + 1;
                let slot = kv.choose_slot(prompt, |_| true).unwrap_or(0);
                ServedLog {
                    number,
                    response_id: format!("r{number}"),
                    prompt_tokens: prompt.len(),
                    served: kv.serve(slot, prompt, number),
                }
            })
            .collect()
    }

    #[test]
    fn evictions_come_from_the_servers_log() {
        let a1: Vec<u64> = (0..100).collect();
        let a2: Vec<u64> = (0..150).collect();
        let title: Vec<u64> = (1000..1010).collect();
        let log = RunLog {
            requests: vec![
                request(1, Some("a")),
                request(2, None),
                request(3, Some("a")),
            ],
            ..RunLog::default()
        };
        let prompts = [a1.clone(), title.clone(), a2.clone()];
        // One slot, no host cache: the title evicts the conversation.
        let served = serve(&mut KvCache::new(KvConfig::new(1, false)), &prompts);
        let found = evictions(&log, &served);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].order, found[0].evictors.clone()),
            (3, vec!["r2".into()])
        );
        assert_eq!(found[0].share, Some(100.0 / 150.0));
        // Two slots, or the host cache: nothing evicted.
        let served = serve(&mut KvCache::new(KvConfig::new(2, false)), &prompts);
        assert!(evictions(&log, &served).is_empty());
        let served = serve(&mut KvCache::new(KvConfig::new(1, true)), &prompts);
        assert!(evictions(&log, &served).is_empty());
    }
}
