//! prefixscope: what the server's own probes (`probe` records) say happened to it, in time:
//! down or loading, the model it serves, its slots' context. A `server_*` loss that such an
//! event explains gets that engine cause instead of a guess from the model's name: a restart,
//! a model swap, a context shift. Worked out when a report is made, from the probes known
//! then, so a live report and a batch one of the same records agree. Pure.

use super::engine_cause::{EngineCause, EngineKind};
use super::row::Row;
use crate::probe::{Answer, Reading, answer_of_record};
use crate::record::Record;

/// A prompt this close to the slot's context fills it: llama.cpp shifts (or truncates) the
/// context, and the cached prefix is no longer the prompt's.
pub(crate) const CONTEXT_FULL_SHARE: f64 = 0.9;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    /// Nothing answered, or `/health` said it was loading or failing.
    Down(String),
    /// The model `/props` named (only `/props`: `/v1/models` names the same model otherwise).
    Model(String),
    /// A slot's context, in tokens (`/slots` `n_ctx`, else `/props`').
    Context(u64),
    /// The sliding window `/props` says the model has, in tokens.
    SlidingWindow(u64),
    /// The highest task id `/slots` showed: llama-server numbers tasks from 0 at each start,
    /// so a lower one than before means it restarted.
    Tasks(u64),
}

/// The probes' events, in time (each at its answer's end).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ServerEvents {
    events: Vec<(i64, Event)>,
}

impl ServerEvents {
    #[cfg(any(test, feature = "reference"))]
    pub(crate) fn of_records<'a>(records: impl IntoIterator<Item = &'a Record>) -> ServerEvents {
        let mut events = ServerEvents::default();
        for record in records {
            events.push(record);
        }
        events
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// A probe record's events (none for any other record), kept in time order.
    pub(crate) fn push(&mut self, record: &Record) {
        let Some((_, answer)) = answer_of_record(record) else {
            return;
        };
        let at = record.t_end_ms;
        let mut add = |event: Event| {
            let i = self.events.partition_point(|(t, _)| *t <= at);
            self.events.insert(i, (at, event));
        };
        match answer {
            Answer::Unreachable(why) => add(Event::Down(why)),
            Answer::Unavailable(_) => {}
            Answer::Read(Reading::Health(h)) if h.status != "ok" => {
                add(Event::Down(format!("/health said {}", h.status)))
            }
            Answer::Read(Reading::Props(p)) => {
                if let Some(model) = p.model {
                    add(Event::Model(model));
                }
                if let Some(n) = p.n_ctx {
                    add(Event::Context(n));
                }
                if let Some(n) = p.sliding_window.filter(|&n| n > 0) {
                    add(Event::SlidingWindow(n));
                }
            }
            Answer::Read(Reading::Slots(s)) => {
                if let Some(task) = s.slots.iter().filter_map(|slot| slot.id_task).max() {
                    add(Event::Tasks(task));
                }
                if let Some(n) = s
                    .slots
                    .iter()
                    .filter_map(|slot| slot.n_ctx)
                    .filter(|&n| n > 0)
                    .min()
                {
                    add(Event::Context(n));
                }
            }
            Answer::Read(_) => {}
        }
    }

    /// The engine cause the probes show for `row`'s `server_*` loss, whose conversation's
    /// previous turn started at `since_ms`; `None` when they show nothing.
    pub(crate) fn explain(&self, row: &Row, since_ms: i64) -> Option<EngineCause> {
        let until = row.t_start_ms;
        let between = || {
            self.events
                .iter()
                .filter(move |(t, _)| *t > since_ms && *t < until)
        };
        if let Some((t, Event::Down(why))) = between().find(|(_, e)| matches!(e, Event::Down(_))) {
            return Some(EngineCause {
                kind: EngineKind::Restart,
                evidence: format!(
                    "the server's probe found it down {:.1} s before this turn ({why}), after the turn before: its cache went with it",
                    (until - t) as f64 / 1000.0
                ),
            });
        }
        // The task counter went back between the turns: the server started anew.
        let before = self.events.iter().rev().find_map(|(t, e)| match e {
            Event::Tasks(n) if *t <= since_ms => Some(*n),
            _ => None,
        });
        let mut highest = before;
        for (_, event) in between() {
            if let Event::Tasks(n) = event {
                if let Some(high) = highest
                    && *n < high
                {
                    return Some(EngineCause {
                        kind: EngineKind::Restart,
                        evidence: format!(
                            "the server's task ids went back from {high} to {n} between the turns (its /slots): it started anew, and its cache with it"
                        ),
                    });
                }
                highest = Some(highest.map_or(*n, |h| h.max(*n)));
            }
        }
        let model_at = |end: i64| {
            self.events.iter().rev().find_map(|(t, e)| match e {
                Event::Model(m) if *t <= end => Some(m.as_str()),
                _ => None,
            })
        };
        if let (Some(before), Some(after)) = (model_at(since_ms), model_at(until))
            && before != after
        {
            return Some(EngineCause {
                kind: EngineKind::ModelReload,
                evidence: format!(
                    "the server's model changed from {before} to {after} between the turns (its /props)"
                ),
            });
        }
        let context = self.events.iter().rev().find_map(|(t, e)| match e {
            Event::Context(n) if *t <= until => Some(*n),
            _ => None,
        });
        let prompt = row.counts.prompt_tokens.map(|p| u64::from(p.value))?;
        let n_ctx = context?;
        (prompt as f64 >= CONTEXT_FULL_SHARE * n_ctx as f64).then(|| EngineCause {
            kind: EngineKind::ContextShift,
            evidence: format!(
                "the prompt ({prompt} tokens) fills the slot's context ({n_ctx}, the server's probe): llama.cpp shifts or truncates it, and the cache no longer matches"
            ),
        })
    }
}

/// A row's engine cause with what the probes show: theirs where they explain the loss, else
/// the one from the request and response (`Row::engine_base`). `None` for a row without one.
pub(crate) fn explained(
    row: &Row,
    started: &std::collections::HashMap<u64, i64>,
    events: &ServerEvents,
) -> Option<EngineCause> {
    let base = row.engine_base.as_deref()?;
    row.linked_to
        .and_then(|linked| started.get(&linked))
        .and_then(|since| events.explain(row, *since))
        .or_else(|| events.memory_from_props(row.t_start_ms, base))
        .or_else(|| Some(base.clone()))
}

impl ServerEvents {
    /// A loss the request's own model name left unexplained, named from what `/props` said of
    /// the server's model by `at`: a sliding window it reports, else the family its path
    /// names where the response's name (an alias, `gpt-3.5-turbo`) did not.
    fn memory_from_props(&self, at: i64, base: &EngineCause) -> Option<EngineCause> {
        if base.kind != EngineKind::Unexplained {
            return None;
        }
        let window = self.events.iter().rev().find_map(|(t, e)| match e {
            Event::SlidingWindow(n) if *t <= at => Some(*n),
            _ => None,
        });
        if let Some(window) = window {
            return Some(EngineCause {
                kind: EngineKind::SlidingWindow,
                evidence: format!(
                    "the server's /props says its model attends through a {window}-token sliding window: {}",
                    base.evidence
                ),
            });
        }
        let model = self.events.iter().rev().find_map(|(t, e)| match e {
            Event::Model(m) if *t <= at => Some(m.as_str()),
            _ => None,
        })?;
        let (kind, family) = super::engine_cause::memory_of(model)?;
        Some(EngineCause {
            kind,
            evidence: format!(
                "{family} ({}, from the model the server's /props names, {model}): {}",
                match kind {
                    EngineKind::SlidingWindow => "sliding-window attention",
                    _ => "hybrid or recurrent memory",
                },
                base.evidence
            ),
        })
    }
}
