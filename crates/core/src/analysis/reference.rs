//! llmp's algorithm done the straightforward way, quadratic in the requests of a model: the
//! oracle the incremental engine is held against, row by row. Built for tests only (the
//! `reference` feature, which the workspace's tests turn on).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::row::*;
use super::server_events::{self, ServerEvents, explained};
use super::table::*;
use super::{Config, Report, findings, normalize_all, report};
use crate::normalize::exchange::Exchange;
use crate::normalize::measured::{Measured, Source};
use crate::record::Record;

/// The same analysis done the straightforward way (llmp's algorithm, quadratic in the requests
/// of a model): the oracle the engine is tested against.
pub fn analyze_reference(records: &[Record], config: &Config) -> Report {
    let (probes, traffic): (Vec<&Record>, Vec<&Record>) = records.iter().partition(|r| r.probe);
    let records: Vec<Record> = traffic.into_iter().cloned().collect();
    let records = records.as_slice();
    let normalized = normalize_all(records);
    let mut table = build(&normalized.exchanges, config);
    refine(
        &mut table.rows,
        &server_events::ServerEvents::of_records(probes.iter().copied()),
    );
    let findings = findings::find(&table.rows, &table.tools, config);
    let input = report::Input {
        records: records.len() as u64,
        span: span(records),
        analysed: normalized.exchanges.len() as u64,
        skipped: &normalized.skipped,
        probes: probes.len() as u64,
        prices: &config.prices,
    };
    let globals = report::Globals {
        clients: table.clients,
        tools: table.tools,
        findings,
    };
    report::assemble(input, table.rows, globals)
}

#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Table {
    pub rows: Vec<Row>,
    pub tools: Vec<ToolUsage>,
    pub clients: Vec<Client>,
}

pub(crate) fn build(exchanges: &[Exchange], config: &Config) -> Table {
    let mut order: Vec<&Exchange> = exchanges.iter().collect();
    order.sort_by_key(|x| (x.t_start_ms, x.id));
    let weights: Vec<Weights> = order.iter().map(|x| weights(x)).collect();
    let sessions = sessions(&order, config.session_gap_ms);
    let kinds = classify(&order);

    let mut rows: Vec<Row> = order
        .iter()
        .enumerate()
        .map(|(i, x)| base_row(x, &weights[i], kinds[i].0, kinds[i].1, sessions[i]))
        .collect();

    let mut tips: Vec<Tip> = Vec::new();
    for cur in 0..order.len() {
        if rows[cur].kind != RowKind::Turn {
            continue;
        }
        let candidates: Vec<usize> = (0..tips.len())
            .filter(|&t| {
                let prev = order[tips[t].row];
                prev.model == order[cur].model
                    && same_agent(prev, order[cur])
                    && rows[tips[t].row].session == rows[cur].session
            })
            .collect();
        let (prev, fresh) = match choose(|i| order[i], &tips, &candidates, order[cur]) {
            Choice::Continue(t) => {
                let tip = &mut tips[t];
                let prev = tip.row;
                tip.row = cur;
                tip.turns += 1;
                rows[cur].conversation = Some(tip.conversation);
                rows[cur].turn = Some(tip.turns);
                (Some(prev), false)
            }
            Choice::Fresh(from) => {
                let conversation = tips.len() as u32 + 1;
                tips.push(Tip {
                    row: cur,
                    conversation,
                    turns: 1,
                });
                rows[cur].conversation = Some(conversation);
                rows[cur].turn = Some(1);
                (from.map(|t| tips[t].row), true)
            }
        };
        let Some(prev) = prev else {
            continue;
        };
        let latest = between(|i| order[i], &kinds, prev, cur, &mut rows[cur]);
        rows[cur].linked_to = Some(order[prev].id);
        rows[cur].new_conversation = fresh;
        let link = link(
            order[prev],
            &weights[prev],
            order[cur],
            &weights[cur],
            fresh,
        );
        apply_link(
            &mut rows[cur],
            order[cur],
            &weights[cur],
            &link,
            latest.map(|(cause, _)| cause),
        );
        finish_link(&mut rows[cur], link, latest);
    }

    price(&mut rows);
    assign_clients(&order, &mut rows);
    name_evictors(&mut rows);
    let tools = tool_usage(&order, &weights, &rows);
    let clients = clients(&order, &rows);
    Table {
        rows,
        tools,
        clients,
    }
}

/// Fills each evictor's client once clients are labelled.
pub(super) fn name_evictors(rows: &mut [Row]) {
    let client_of: HashMap<u64, String> = rows.iter().map(|r| (r.id, r.client.clone())).collect();
    for row in rows.iter_mut() {
        if let Some(evicted_by) = row.evicted_by.as_mut() {
            evicted_by.client = client_of.get(&evicted_by.row).cloned().unwrap_or_default();
        }
    }
}

pub(super) fn choose<'a>(
    at: impl Fn(usize) -> &'a Exchange,
    tips: &[Tip],
    candidates: &[usize],
    x: &Exchange,
) -> Choice {
    let recent = |t: &usize| tips[*t].row;
    if let Some(&t) = candidates
        .iter()
        .filter(|&&t| {
            let prev = at(tips[t].row);
            continues(prev, x) && carries_on(prev, x, tips[t].turns == 1)
        })
        // One it goes on with before one it sends again, then the longest, then one with its
        // system prompt and tools, then the latest.
        .max_by_key(|&&t| {
            let prev = at(tips[t].row);
            let len = prev.messages.len();
            (
                x.messages.len() > len,
                len,
                same_context(prev, x),
                recent(&t),
            )
        })
    {
        return Choice::Continue(t);
    }
    let identical = candidates
        .iter()
        .filter(|&&t| same_messages(at(tips[t].row), x))
        .max_by_key(|&&t| recent(&t))
        .copied();
    choose_by_match(&at, tips, candidates, identical, x)
}

pub(super) fn sessions(order: &[&Exchange], gap_ms: u64) -> Vec<u32> {
    let mut open: BTreeMap<&str, (u32, i64)> = BTreeMap::new();
    let mut next = 1u32;
    order
        .iter()
        .map(|x| {
            let session = match open.get(x.model.as_str()) {
                Some(&(session, last_end))
                    if x.t_start_ms.saturating_sub(last_end) <= session_gap_ms(x, gap_ms) =>
                {
                    session
                }
                _ => {
                    next += 1;
                    next - 1
                }
            };
            let last_end = open
                .get(x.model.as_str())
                .filter(|(s, _)| *s == session)
                .map_or(x.t_end_ms, |&(_, end)| end.max(x.t_end_ms));
            open.insert(x.model.as_str(), (session, last_end));
            session
        })
        .collect()
}

fn classify(order: &[&Exchange]) -> Vec<(RowKind, Option<Shape>)> {
    let mut kinds = vec![(RowKind::Turn, None); order.len()];
    let mut domains: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, x) in order.iter().enumerate() {
        domains.entry(x.model.as_str()).or_default().push(i);
    }
    for members in domains.values() {
        let n = members.len();
        let mut continued = vec![false; n];
        let mut continuing = vec![false; n];
        let mut extended = vec![false; n];
        for a in 0..n {
            for b in a + 1..n {
                let (x, y) = (order[members[a]], order[members[b]]);
                if continues(x, y) {
                    continued[a] = true;
                    continuing[b] = true;
                }
                if y.messages.len() > x.messages.len()
                    && x.messages
                        .iter()
                        .zip(&y.messages)
                        .all(|(p, q)| p.role == q.role && p.identity == q.identity)
                {
                    extended[a] = true;
                }
            }
        }
        let any_pair = continuing.iter().any(|&c| c);
        let continuing_systems: BTreeSet<Option<&str>> = (0..n)
            .filter(|&k| continued[k] || continuing[k])
            .map(|k| system_hash(order[members[k]]))
            .collect();
        for (k, &i) in members.iter().enumerate() {
            let x = order[i];
            let shape = if extended[k] {
                None
            } else if summarise(x) {
                Some(Shape::Summarise)
            } else if structured(x) {
                Some(Shape::Structured)
            } else if x.tools.is_empty()
                && any_pair
                && !continued[k]
                && !continuing[k]
                && !continuing_systems.contains(&system_hash(x))
            {
                Some(Shape::Oneshot)
            } else {
                None
            };
            if shape.is_some() {
                kinds[i] = (RowKind::SideCall, shape);
            }
        }
        let rest: Vec<&Exchange> = members
            .iter()
            .filter(|&&i| kinds[i].0 != RowKind::SideCall)
            .map(|&i| order[i])
            .collect();
        let stateless = rest.len() >= STATELESS_MIN_REQUESTS
            && rest.windows(2).all(|pair| {
                !continues(pair[0], pair[1]) && pair[1].messages.len() <= pair[0].messages.len()
            });
        if stateless {
            for &i in members {
                if kinds[i].0 != RowKind::SideCall {
                    kinds[i] = (RowKind::Stateless, None);
                }
            }
        }
    }
    kinds
}

/// Sets the milliseconds of every loss: tokens × the cheaper of the row's own prefill rate and
/// its model's bulk rate (server-timed prefills of at least 50 evaluated tokens).
pub(super) fn price(rows: &mut [Row]) {
    let mut sums: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for row in rows.iter() {
        let c = &row.counts;
        if let (Some(prefill), Some(evaluated)) = (c.prefill_ms, c.evaluated_tokens)
            && prefill.source == Source::Server
            && evaluated.value >= BULK_MIN_EVALUATED
        {
            let entry = sums.entry(row.model.clone()).or_default();
            entry.0 += prefill.value;
            entry.1 += f64::from(evaluated.value);
        }
    }
    let bulk: BTreeMap<String, f64> = sums
        .into_iter()
        .filter(|(_, (_, evaluated))| *evaluated > 0.0)
        .map(|(model, (ms, evaluated))| (model, ms / evaluated))
        .collect();
    for row in rows.iter_mut() {
        if row.lost_client.is_none() && row.lost_external.is_none() {
            continue;
        }
        let (Some(prefill), Some(evaluated)) = (row.counts.prefill_ms, row.counts.evaluated_tokens)
        else {
            continue;
        };
        let own_rate = (evaluated.value > 0).then(|| prefill.value / f64::from(evaluated.value));
        let per_token = match (own_rate, bulk.get(&row.model).copied()) {
            (Some(own), Some(bulk)) => Some(own.min(bulk)),
            (own, bulk) => own.or(bulk),
        };
        for loss in [row.lost_client.as_mut(), row.lost_external.as_mut()]
            .into_iter()
            .flatten()
        {
            loss.ms = per_token.map(|rate| Measured {
                value: f64::from(loss.tokens) * rate,
                source: prefill.source,
            });
        }
    }
}

pub(super) fn assign_clients(order: &[&Exchange], rows: &mut [Row]) {
    struct Unit<'a> {
        agent: &'a str,
        tools: BTreeSet<&'a str>,
        rows: Vec<usize>,
    }
    let mut units: Vec<Unit> = Vec::new();
    let mut unit_of_conversation: BTreeMap<u32, usize> = BTreeMap::new();
    for (i, x) in order.iter().enumerate() {
        let agent = x.user_agent.as_deref().unwrap_or(UNKNOWN_CLIENT);
        let unit = match rows[i].conversation {
            Some(c) if unit_of_conversation.contains_key(&c) => unit_of_conversation[&c],
            conversation => {
                units.push(Unit {
                    agent,
                    tools: BTreeSet::new(),
                    rows: Vec::new(),
                });
                if let Some(c) = conversation {
                    unit_of_conversation.insert(c, units.len() - 1);
                }
                units.len() - 1
            }
        };
        units[unit]
            .tools
            .extend(x.tools.iter().map(|t| t.name.as_str()));
        units[unit].rows.push(i);
    }
    // Units whose tool sets are subsets of one another (same user-agent) are one client. Only
    // distinct tool sets need comparing, which keeps this linear in the units.
    let mut set_ids: HashMap<(&str, &BTreeSet<&str>), usize> = HashMap::new();
    let mut sets: Vec<(&str, &BTreeSet<&str>, usize)> = Vec::new();
    let mut set_of_unit: Vec<Option<usize>> = Vec::with_capacity(units.len());
    for (i, unit) in units.iter().enumerate() {
        if unit.tools.is_empty() {
            set_of_unit.push(None);
            continue;
        }
        let id = *set_ids.entry((unit.agent, &unit.tools)).or_insert_with(|| {
            sets.push((unit.agent, &unit.tools, i));
            sets.len() - 1
        });
        set_of_unit.push(Some(id));
    }
    let mut parent: Vec<usize> = (0..sets.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut by_agent: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (id, (agent, _, _)) in sets.iter().enumerate() {
        by_agent.entry(agent).or_default().push(id);
    }
    for ids in by_agent.values() {
        for (n, &a) in ids.iter().enumerate() {
            for &b in &ids[n + 1..] {
                if sets[a].1.is_subset(sets[b].1) || sets[b].1.is_subset(sets[a].1) {
                    let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
                    parent[ra.max(rb)] = ra.min(rb);
                }
            }
        }
    }
    // A cluster is numbered by its first unit, in order of first request.
    let mut first_unit: HashMap<usize, usize> = HashMap::new();
    for (id, set) in sets.iter().enumerate() {
        let r = root(&mut parent, id);
        let first = first_unit.entry(r).or_insert(set.2);
        *first = (*first).min(set.2);
    }
    let mut clusters: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (&r, &first) in &first_unit {
        clusters.entry(sets[r].0).or_default().push(first);
    }
    for firsts in clusters.values_mut() {
        firsts.sort_unstable();
    }
    for (i, unit) in units.iter().enumerate() {
        let firsts = clusters.get(unit.agent).map_or(&[][..], Vec::as_slice);
        let label = match set_of_unit[i] {
            Some(id) if firsts.len() > 1 => {
                let r = root(&mut parent, id);
                let first = first_unit.get(&r).copied().unwrap_or(0);
                let n = firsts.iter().position(|&f| f == first).unwrap_or(0) + 1;
                format!("{} #{n}", unit.agent)
            }
            _ => unit.agent.to_string(),
        };
        for &row in &unit.rows {
            rows[row].client = label.clone();
        }
    }
}

pub(super) fn tool_usage(order: &[&Exchange], weights: &[Weights], rows: &[Row]) -> Vec<ToolUsage> {
    let mut usage: BTreeMap<(&str, &str), ToolUsage> = BTreeMap::new();
    for ((x, w), row) in order.iter().zip(weights).zip(rows) {
        let mut seen = BTreeSet::new();
        for (tool, &weight) in x.tools.iter().zip(&w.tools) {
            if !seen.insert(tool.name.as_str()) {
                continue;
            }
            let entry = usage
                .entry((row.client.as_str(), tool.name.as_str()))
                .or_insert_with(|| ToolUsage {
                    client: row.client.clone(),
                    name: tool.name.clone(),
                    schema_tokens: 0,
                    offered: 0,
                    called: 0,
                });
            entry.offered += 1;
            entry.schema_tokens = entry.schema_tokens.max(round(weight));
        }
    }
    let mut call_ids = BTreeSet::new();
    for (x, row) in order.iter().zip(rows) {
        let from_response = x.output.tool_calls.iter().map(|call| (call, true));
        let from_history = x
            .messages
            .iter()
            .filter(|m| m.role == "assistant")
            .flat_map(|m| &m.tool_calls)
            .map(|call| (call, false));
        for (call, in_response) in from_response.chain(from_history) {
            let new = match &call.id {
                Some(id) => call_ids.insert(id.clone()),
                None => in_response,
            };
            if new && let Some(entry) = usage.get_mut(&(row.client.as_str(), call.name.as_str())) {
                entry.called += 1;
            }
        }
    }
    usage.into_values().collect()
}

pub(super) fn clients(order: &[&Exchange], rows: &[Row]) -> Vec<Client> {
    let mut clients: Vec<Client> = Vec::new();
    let mut conversations: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    let mut tools: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (x, row) in order.iter().zip(rows) {
        let position = match clients.iter().position(|c| c.client == row.client) {
            Some(position) => position,
            None => {
                clients.push(Client {
                    client: row.client.clone(),
                    user_agent: x.user_agent.as_deref().map(str::to_string),
                    harness: super::harness::of(x),
                    requests: 0,
                    conversations: 0,
                    tools: Vec::new(),
                });
                clients.len() - 1
            }
        };
        clients[position].requests += 1;
        if let Some(c) = row.conversation {
            conversations
                .entry(row.client.as_str())
                .or_default()
                .insert(c);
        }
        tools
            .entry(row.client.as_str())
            .or_default()
            .extend(x.tools.iter().map(|t| t.name.as_str()));
    }
    for client in &mut clients {
        client.conversations = conversations
            .get(client.client.as_str())
            .map_or(0, |c| c.len() as u32);
        client.tools = tools
            .get(client.client.as_str())
            .map(|t| t.iter().map(|name| name.to_string()).collect())
            .unwrap_or_default();
    }
    clients
}

pub(crate) fn span(records: &[Record]) -> Option<(i64, i64)> {
    Some((
        records.iter().map(|r| r.t_start_ms).min()?,
        records.iter().map(|r| r.t_end_ms.max(r.t_start_ms)).max()?,
    ))
}

/// Refines the engine causes of `rows` with what the probes show (rows in start order; the
/// previous turn of each found by id).
pub(crate) fn refine(rows: &mut [Row], events: &ServerEvents) {
    if events.is_empty() {
        return;
    }
    let started: std::collections::HashMap<u64, i64> =
        rows.iter().map(|r| (r.id, r.t_start_ms)).collect();
    for row in rows.iter_mut() {
        if let Some(cause) = explained(row, &started, events) {
            row.engine_cause = Some(Box::new(cause));
        }
    }
}

/// `choose` when no candidate's request is continued by `x`: the tip sharing the longest
/// leading run of messages.
fn choose_by_match<'a>(
    at: &impl Fn(usize) -> &'a Exchange,
    tips: &[Tip],
    candidates: &[usize],
    identical: Option<usize>,
    x: &Exchange,
) -> Choice {
    // A request a tip sent already, message for message (`identical`, the latest such): a
    // re-send of that request, never a break of another conversation; found by the caller's
    // index, so a benchmark that repeats one session costs no scan of every run before it.
    if identical.is_some() {
        return Choice::Fresh(identical);
    }
    let lead = x.messages.iter().take_while(|m| m.role == "system").count();
    let matched = |t: usize| {
        let prev = at(tips[t].row);
        prev.messages
            .iter()
            .zip(&x.messages)
            .take_while(|(a, b)| a.identity == b.identity)
            .count()
    };
    let recent = |t: &usize| tips[*t].row;
    // A break needs evidence of the same conversation: a message past the opening (the
    // system prompt and the first message) that both send, or messages of its own past what
    // it shares (a compaction keeps the task and sends a summary). A request that only
    // repeats an earlier conversation's opening is another run that opens alike.
    let opening = lead + 1;
    let mut sent: Option<std::collections::HashSet<&str>> = None;
    let mut went_on = |t: usize| {
        let sent = sent.get_or_insert_with(|| {
            x.messages
                .iter()
                .skip(opening)
                .map(|m| m.identity.as_str())
                .collect()
        });
        at(tips[t].row)
            .messages
            .iter()
            .skip(opening)
            .any(|m| sent.contains(m.identity.as_str()))
    };
    // The same messages again are not a break: a request of its own (see `carries_on`).
    let same = |t: usize| {
        let prev = at(tips[t].row);
        matched(t) == prev.messages.len() && matched(t) == x.messages.len()
    };
    if let Some(&t) = candidates
        .iter()
        .filter(|&&t| {
            // New messages of its own past a point where the two differ: an edit past the
            // opening, or a compaction of it. A request that holds all of the tip's messages
            // and goes on without the tip's reply is the tip's only if they share more than
            // the opening.
            let prev = at(tips[t].row);
            let diverged = matched(t) < x.messages.len()
                && matched(t) < prev.messages.len()
                && (matched(t) > opening || compacts(prev, x));
            matched(t) > lead && !same(t) && (diverged || went_on(t))
        })
        .max_by_key(|&&t| (matched(t), recent(&t)))
    {
        return Choice::Continue(t);
    }
    Choice::Fresh(
        candidates
            .iter()
            .filter(|&&t| matched(t) > 0)
            .max_by_key(|&&t| (matched(t), recent(&t)))
            .copied(),
    )
}
