use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::Config;
use super::client_cause;
use super::engine_cause::EngineKind;
use super::ids::{ById, IntMap};
use super::row::{BreakCause, Cause, Loss, Priced, Rated, Row, RowKind, ToolUsage};
use crate::normalize::measured::{Measured, Source};
use crate::units::{plural, thousands};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub model: Option<String>,
    pub client: Option<String>,
    pub rows: Vec<u64>,
    pub lost_tokens: Option<u32>,
    pub lost_ms: Option<Measured<f64>>,
    pub context_tokens: Option<u32>,
    pub confidence: Confidence,
    pub evidence: serde_json::Value,
    /// prefixscope: what to change (`fix`), in the report as in the TUI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<FixNote>,
    /// prefixscope: the dollars its lost tokens cost, where a price is known (`pricing`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_usd: Option<f64>,
}

/// A fix as reports carry it: whose doing, and the change in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FixNote {
    pub owner: String,
    pub change: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    SideCallOnConversationModel,
    PrefixBreak,
    ServerCacheLoss,
    OtherConversationEviction,
    OtherModelEviction,
    UnusedTool,
    LargeToolSchema,
    LargeSystemPrompt,
    /// prefixscope: a span of the system prompt that changes on most turns of a client.
    VolatileSystemPrompt,
    /// prefixscope: `server_*` losses after the client sent earlier replies' reasoning back
    /// changed (`client_cause` `reasoning_changed`): the client's, not the server's.
    ReasoningChanged,
    /// prefixscope: `server_*` losses after the template rendered earlier turns anew
    /// (`client_cause` `template_rerendered`).
    TemplateRerendered,
    /// prefixscope, hosted APIs: losses to the provider's caching rules (no `cache_control`
    /// breakpoint, the cache's lifetime) or its own misses (`provider::Uncached`).
    ProviderCache,
}

/// The loss causes of a hosted provider's rules (`provider::Uncached::loss_cause`).
pub(crate) const PROVIDER_CAUSES: [&str; 3] =
    ["no_cache_breakpoint", "cache_expired", "provider_miss"];

impl FindingKind {
    /// The finding a loss of `cause` belongs to when no finding names its turn; `theirs`:
    /// the loss is the client's (a break's).
    pub fn of_loss(cause: &str, theirs: bool) -> FindingKind {
        match cause {
            "side_call" => FindingKind::SideCallOnConversationModel,
            "other_conversation" => FindingKind::OtherConversationEviction,
            "other_model" => FindingKind::OtherModelEviction,
            cause if PROVIDER_CAUSES.contains(&cause) => FindingKind::ProviderCache,
            _ if theirs => FindingKind::PrefixBreak,
            _ => FindingKind::ServerCacheLoss,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Confidence {
    High,
    Medium,
    Low,
}

const PREFIX_BREAK_SHARE: f64 = 0.25;
const PREFIX_BREAK_MIN_SESSION: usize = 3;
const MIN_ROWS: usize = 2;
const HIGH_ROWS: usize = 5;
const HIGH_DAYS: f64 = 14.0;
const MEDIUM_DAYS: f64 = 7.0;
const HIGH_SESSIONS: usize = 5;
const DAY_MS: f64 = 86_400_000.0;

#[derive(Default)]
struct LossSum {
    tokens: u64,
    ms: Option<Measured<f64>>,
    untimed: u32,
}

impl LossSum {
    fn add(&mut self, (loss, ms): (&Loss, Option<Measured<f64>>)) {
        self.tokens += u64::from(loss.tokens);
        match ms {
            Some(ms) => self.ms = Some(add_ms(self.ms, ms)),
            None => self.untimed += 1,
        }
    }
}

impl<'a> FromIterator<(&'a Loss, Option<Measured<f64>>)> for LossSum {
    fn from_iter<I: IntoIterator<Item = (&'a Loss, Option<Measured<f64>>)>>(losses: I) -> Self {
        let mut sum = LossSum::default();
        losses.into_iter().for_each(|loss| sum.add(loss));
        sum
    }
}

pub(crate) fn add_ms(total: Option<Measured<f64>>, ms: Measured<f64>) -> Measured<f64> {
    match total {
        Some(total) => Measured {
            value: total.value + ms.value,
            source: total.source.max(ms.source),
        },
        None => ms,
    }
}

/// The findings of rows in start order (owned by the reference's table, shared by the engine's)
/// and the tool usage worked out from them.
pub(crate) fn find<R: Priced>(rows: &[R], tools: &[ToolUsage], config: &Config) -> Vec<Finding> {
    let all: Vec<Rated> = rows.iter().map(Priced::rated).collect();
    let by_id = ById::new(all.iter().map(|r| (r.id, r.row())));
    let mut findings = Vec::new();
    // Rows grouped once by model and by (model, client), in table order: filtering the table
    // per client made findings quadratic in the clients (1.1 s of a 100,000-row snapshot).
    let mut by_model: IntMap<&str, Vec<Rated>> = IntMap::default();
    let mut by_client: IntMap<(&str, &str), Vec<Rated>> = IntMap::default();
    for &row in &all {
        by_model
            .entry(row.row().model.as_str())
            .or_default()
            .push(row);
        by_client
            .entry((row.row().model.as_str(), row.row().client.as_str()))
            .or_default()
            .push(row);
    }
    // Each model's clients, in order, from the groups rather than from every row.
    let mut clients_of: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for &(model, client) in by_client.keys() {
        clients_of.entry(model).or_default().push(client);
    }
    let mut models: Vec<(&str, Vec<Rated>)> = by_model.into_iter().collect();
    models.sort_unstable_by_key(|&(model, _)| model);
    for (model, rows) in &models {
        let (model, rows): (&str, &[Rated]) = (model, rows);
        findings.extend(side_call_on_conversation_model(model, rows));
        findings.extend(server_cache_losses(model, rows));
        findings.extend(provider_cache_losses(model, rows));
        findings.extend(other_conversation_eviction(model, rows, &by_id));
        findings.extend(other_model_eviction(model, rows, &by_id));
        let mut clients = clients_of.remove(model).unwrap_or_default();
        clients.sort_unstable();
        for client in clients {
            let mine: &[Rated] = by_client.get(&(model, client)).map_or(&[], Vec::as_slice);
            findings.extend(prefix_breaks(model, client, mine));
            findings.extend(unseen_changes(model, client, mine));
            findings.extend(volatile_system_prompt(model, client, mine));
            findings.extend(large_system_prompt(
                model,
                client,
                mine,
                config.thresholds.system_tokens,
            ));
        }
    }
    findings.extend(tool_findings(
        &all,
        tools,
        config.thresholds.tool_schema_tokens,
    ));
    findings.sort_by(order);
    for finding in &mut findings {
        let Fix { owner, change, .. } = fix(finding);
        finding.fix = Some(FixNote {
            owner: owner.to_string(),
            change,
        });
        finding.lost_usd = lost_usd(finding, &by_id, &config.prices);
    }
    findings
}

/// What a finding's lost tokens cost: at the price of its rows' model and provider, billed
/// as its cause is (`Price::lost_per_token`).
fn lost_usd(finding: &Finding, by_id: &ById<&Row>, prices: &crate::pricing::Prices) -> Option<f64> {
    let tokens = finding.lost_tokens.filter(|&t| t > 0)?;
    let row = finding.rows.first().and_then(|&id| by_id.get(id))?;
    let price = prices.of(&row.model, row.provider)?;
    let cause = finding
        .evidence
        .get("kind")
        .or_else(|| finding.evidence.get("break_cause"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    Some(f64::from(tokens) * price.lost_per_token(cause))
}

fn loss_finding(
    kind: FindingKind,
    (model, client): (&str, Option<&str>),
    rows: Vec<u64>,
    measured: usize,
    sum: LossSum,
    mut evidence: Map<String, Value>,
) -> Finding {
    if sum.untimed > 0 {
        evidence.insert("untimed_rows".into(), Value::from(sum.untimed));
    }
    Finding {
        fix: None,
        lost_usd: None,
        kind,
        model: Some(model.to_string()),
        client: client.map(str::to_string),
        rows,
        lost_tokens: (measured > 0).then(|| u32::try_from(sum.tokens).unwrap_or(u32::MAX)),
        lost_ms: sum.ms,
        context_tokens: None,
        confidence: counter_confidence(measured),
        evidence: Value::Object(evidence),
    }
}

fn counter_confidence(measured: usize) -> Confidence {
    match measured {
        0 => Confidence::Low,
        n if n < HIGH_ROWS => Confidence::Medium,
        _ => Confidence::High,
    }
}

fn side_call_on_conversation_model(model: &str, rows: &[Rated]) -> Option<Finding> {
    let side_calls: Vec<Rated> = rows
        .iter()
        .copied()
        .filter(|r| r.kind == RowKind::SideCall)
        .collect();
    // A hosted API keeps no slot a side-call could take: it evicts nothing there.
    if side_calls.is_empty()
        || !rows.iter().any(|r| r.kind == RowKind::Turn)
        || rows.iter().all(|r| r.provider.hosted())
    {
        return None;
    }
    let after: Vec<Rated> = rows
        .iter()
        .copied()
        .filter(|r| r.kind == RowKind::Turn && !r.side_calls_between.is_empty())
        .collect();
    let measured = after.iter().filter(|r| r.loss_measured).count();
    let side_call_losses = after.iter().filter(|r| r.cause == Some(Cause::SideCall));
    let sum: LossSum = side_call_losses.filter_map(|r| r.external_loss()).collect();
    let mut shapes: BTreeMap<String, u32> = BTreeMap::new();
    for row in &side_calls {
        if let Some(shape) = row.side_call_shape {
            *shapes.entry(crate::units::serde_name(shape)).or_default() += 1;
        }
    }
    let clients: BTreeSet<&str> = side_calls.iter().map(|r| r.client.as_str()).collect();
    let evidence = json!({
        "shapes": shapes,
        "side_calls": side_calls.len(),
        "turns_after_side_calls": after.len(),
        "clients": clients,
    });
    Some(loss_finding(
        FindingKind::SideCallOnConversationModel,
        (model, None),
        side_calls.iter().map(|r| r.id).collect(),
        measured,
        sum,
        object(evidence),
    ))
}

fn prefix_breaks(model: &str, client: &str, rows: &[Rated]) -> Vec<Finding> {
    let mut session_sizes: BTreeMap<u32, usize> = BTreeMap::new();
    for row in rows {
        *session_sizes.entry(row.session).or_default() += 1;
    }
    let links: Vec<Rated> = rows
        .iter()
        .copied()
        .filter(|r| {
            r.kind == RowKind::Turn
                && r.linked_to.is_some()
                && !r.new_conversation
                && session_sizes
                    .get(&r.session)
                    .is_some_and(|&n| n >= PREFIX_BREAK_MIN_SESSION)
        })
        .collect();
    let mut findings = Vec::new();
    for cause in [
        BreakCause::ToolsChanged,
        BreakCause::SystemChanged,
        BreakCause::HistoryRewritten,
    ] {
        let broken: Vec<Rated> = links
            .iter()
            .copied()
            .filter(|r| r.break_cause == Some(cause) && !r.compaction)
            .collect();
        let share = broken.len() as f64 / links.len().max(1) as f64;
        if broken.is_empty() || share < PREFIX_BREAK_SHARE {
            continue;
        }
        let sum: LossSum = broken.iter().filter_map(|r| r.client_loss()).collect();
        let mut evidence = json!({
            "break_cause": cause,
            "links": links.len(),
            "broken": broken.len(),
            "share": share,
        });
        // prefixscope: how many of them moved or inserted messages, and how many dropped some
        // from the middle, rather than edit them.
        for (key, cause) in [
            ("reordered", "history_reordered"),
            ("dropped", "history_dropped"),
        ] {
            let rows = broken
                .iter()
                .filter(|r| r.lost_client.as_ref().is_some_and(|l| l.cause == cause))
                .count();
            if rows > 0 {
                evidence[key] = json!(rows);
            }
        }
        // prefixscope: the named cause most of them show (`client_cause`), with how many.
        let mut named: BTreeMap<&str, usize> = BTreeMap::new();
        for name in broken
            .iter()
            .filter_map(|r| r.row().client_cause.as_deref())
        {
            *named.entry(name).or_default() += 1;
        }
        if let Some((name, rows)) = named
            .iter()
            .max_by_key(|(name, n)| (**n, std::cmp::Reverse(**name)))
        {
            evidence["client_cause"] = json!(name);
            evidence["client_cause_rows"] = json!(rows);
        }
        findings.push(loss_finding(
            FindingKind::PrefixBreak,
            (model, Some(client)),
            broken.iter().map(|r| r.id).collect(),
            broken.iter().filter(|r| r.loss_measured).count(),
            sum,
            object(evidence),
        ));
    }
    findings
}

fn server_cache_losses(model: &str, rows: &[Rated]) -> Vec<Finding> {
    ["server_empty", "server_head_only", "server_rollback"]
        .into_iter()
        .filter_map(|kind| {
            let hit: Vec<Rated> = rows
                .iter()
                .copied()
                .filter(|r| r.lost_external.as_ref().is_some_and(|l| l.cause == kind))
                // prefixscope: the client's doing, its own finding (`reasoning_changed`).
                .filter(|r| !unseen_client_cause(r))
                .collect();
            if hit.len() < MIN_ROWS {
                return None;
            }
            let sum: LossSum = hit.iter().filter_map(|r| r.external_loss()).collect();
            // prefixscope: the engine's likely mechanism, the one most of these rows show.
            let mut engines: BTreeMap<EngineKind, (usize, &str)> = BTreeMap::new();
            for cause in hit.iter().filter_map(|r| r.row().engine_cause.as_ref()) {
                engines.entry(cause.kind).or_insert((0, &cause.evidence)).0 += 1;
            }
            let mut evidence = json!({ "kind": kind });
            if let Some((engine, (rows, example))) = engines
                .iter()
                .max_by_key(|(kind, (n, _))| (*n, std::cmp::Reverse(**kind)))
            {
                evidence["engine_cause"] = json!(engine);
                evidence["engine_rows"] = json!(rows);
                evidence["engine_evidence"] = json!(example);
            }
            Some(loss_finding(
                FindingKind::ServerCacheLoss,
                (model, None),
                hit.iter().map(|r| r.id).collect(),
                hit.len(),
                sum,
                object(evidence),
            ))
        })
        .collect()
}

/// prefixscope, hosted APIs: each provider rule's losses (`PROVIDER_CAUSES`), whichever side
/// of the row holds them.
fn provider_cache_losses(model: &str, rows: &[Rated]) -> Vec<Finding> {
    PROVIDER_CAUSES
        .into_iter()
        .filter_map(|kind| {
            let mut sum = LossSum::default();
            let mut hit = Vec::new();
            let mut provider = None;
            for row in rows {
                let Some(loss) = row.losses().find(|(l, _)| l.cause == kind) else {
                    continue;
                };
                sum.add(loss);
                hit.push(row);
                provider = provider.or(Some(row.row().provider));
            }
            if hit.is_empty() {
                return None;
            }
            let mut evidence = json!({ "kind": kind });
            if let Some(provider) = provider {
                evidence["provider"] = json!(provider);
            }
            Some(loss_finding(
                FindingKind::ProviderCache,
                (model, None),
                hit.iter().map(|r| r.id).collect(),
                hit.iter().filter(|r| r.loss_measured).count(),
                sum,
                object(evidence),
            ))
        })
        .collect()
}

/// prefixscope: a loss llmp files as the server's that a cause it cannot see made the
/// client's (`client_cause::unseen_by_llmp`).
fn unseen_client_cause(row: &Rated) -> bool {
    row.row()
        .client_cause
        .as_deref()
        .is_some_and(client_cause::unseen_by_llmp)
}

/// prefixscope: a client's turns whose server-side loss followed a change llmp cannot see:
/// the reasoning of earlier replies sent back changed (`reasoning_changed`), or the template
/// rendering earlier turns anew (`template_rerendered`).
fn unseen_changes(model: &str, client: &str, rows: &[Rated]) -> Vec<Finding> {
    [
        (
            client_cause::REASONING_CHANGED,
            FindingKind::ReasoningChanged,
        ),
        (
            client_cause::TEMPLATE_RERENDERED,
            FindingKind::TemplateRerendered,
        ),
    ]
    .into_iter()
    .filter_map(|(cause, kind)| {
        let hit: Vec<Rated> = rows
            .iter()
            .copied()
            .filter(|r| r.row().client_cause.as_deref() == Some(cause) && r.lost_external.is_some())
            .collect();
        if hit.is_empty() {
            return None;
        }
        let sum: LossSum = hit.iter().filter_map(|r| r.external_loss()).collect();
        Some(loss_finding(
            kind,
            (model, Some(client)),
            hit.iter().map(|r| r.id).collect(),
            hit.iter().filter(|r| r.loss_measured).count(),
            sum,
            object(json!({ "client_cause": cause })),
        ))
    })
    .collect()
}

fn other_conversation_eviction(model: &str, rows: &[Rated], by_id: &ById<&Row>) -> Option<Finding> {
    let hit: Vec<Rated> = rows
        .iter()
        .copied()
        .filter(|r| r.cause == Some(Cause::OtherConversation))
        .collect();
    if hit.len() < MIN_ROWS {
        return None;
    }
    let sum: LossSum = hit.iter().filter_map(|r| r.external_loss()).collect();
    let others = hit
        .iter()
        .flat_map(|r| &r.other_conversations_between)
        .filter_map(|&id| by_id.get(id));
    // Sorted and deduplicated, as the sets they stand for, but only the distinct ones sorted:
    // a set insert per row (hundreds of thousands of them) was most of the findings' cost.
    let mut conversations: Vec<u32> = Vec::new();
    let mut seen: IntMap<&str, ()> = IntMap::default();
    for row in hit.iter().map(|r| r.row()).chain(others.clone()) {
        seen.insert(row.client.as_str(), ());
    }
    for row in others {
        conversations.extend(row.conversation);
    }
    conversations.sort_unstable();
    conversations.dedup();
    let mut clients: Vec<&str> = seen.into_keys().collect();
    clients.sort_unstable();
    Some(loss_finding(
        FindingKind::OtherConversationEviction,
        (model, None),
        hit.iter().map(|r| r.id).collect(),
        hit.iter().filter(|r| r.loss_measured).count(),
        sum,
        object(json!({ "other_conversations": conversations.len(), "clients": clients })),
    ))
}

fn other_model_eviction(model: &str, rows: &[Rated], by_id: &ById<&Row>) -> Option<Finding> {
    let hit: Vec<Rated> = rows
        .iter()
        .copied()
        .filter(|r| r.cause == Some(Cause::OtherModel))
        .collect();
    if hit.len() < MIN_ROWS {
        return None;
    }
    let sum: LossSum = hit.iter().filter_map(|r| r.external_loss()).collect();
    let others: BTreeSet<&str> = hit
        .iter()
        .flat_map(|r| &r.other_domains_between)
        .filter_map(|&id| by_id.get(id).map(|r| r.model.as_str()))
        .collect();
    Some(loss_finding(
        FindingKind::OtherModelEviction,
        (model, None),
        hit.iter().map(|r| r.id).collect(),
        hit.iter().filter(|r| r.loss_measured).count(),
        sum,
        object(json!({ "other_models": others })),
    ))
}

const VOLATILE_MIN_LINKS: usize = 3;
const VOLATILE_SHARE: f64 = 0.5;

/// The system prompt changed at the same place on most of a client's links: a date, a nonce, a
/// billing header. Names the place and shows one change (full mode).
fn volatile_system_prompt(model: &str, client: &str, rows: &[Rated]) -> Option<Finding> {
    let links: Vec<Rated> = rows
        .iter()
        .copied()
        .filter(|r| r.kind == RowKind::Turn && r.linked_to.is_some() && !r.new_conversation)
        .collect();
    let changed: Vec<Rated> = links
        .iter()
        .copied()
        .filter(|r| {
            r.break_cause == Some(BreakCause::SystemChanged)
                && r.break_location
                    .as_ref()
                    .is_some_and(|l| l.role.as_deref() == Some("system"))
        })
        .collect();
    if links.len() < VOLATILE_MIN_LINKS
        || (changed.len() as f64) <= VOLATILE_SHARE * links.len() as f64
    {
        return None;
    }
    let mut offsets: BTreeMap<Option<u32>, usize> = BTreeMap::new();
    for row in &changed {
        *offsets
            .entry(row.break_location.as_ref().and_then(|l| l.char_offset))
            .or_default() += 1;
    }
    let offset = offsets
        .iter()
        .max_by_key(|(_, n)| **n)
        .and_then(|(o, _)| *o);
    let example = changed
        .iter()
        .filter_map(|r| r.break_location.as_ref())
        .find(|l| l.char_offset == offset);
    let sum: LossSum = changed.iter().filter_map(|r| r.client_loss()).collect();
    let evidence = json!({
        "char_offset": offset,
        "changed": changed.len(),
        "links": links.len(),
        "before": example.and_then(|l| l.before.clone()),
        "after": example.and_then(|l| l.after.clone()),
        "head_matched": example.and_then(|l| l.head_matched),
        "tail_matched": example.and_then(|l| l.tail_matched),
    });
    Some(loss_finding(
        FindingKind::VolatileSystemPrompt,
        (model, Some(client)),
        changed.iter().map(|r| r.id).collect(),
        changed.iter().filter(|r| r.loss_measured).count(),
        sum,
        object(evidence),
    ))
}

fn large_system_prompt(
    model: &str,
    client: &str,
    rows: &[Rated],
    threshold: u32,
) -> Option<Finding> {
    let over: Vec<Rated> = rows
        .iter()
        .copied()
        .filter(|r| r.composition.system.value > threshold)
        .collect();
    let largest = over.iter().map(|r| r.composition.system.value).max()?;
    let exact = over.iter().all(|r| server_sized(r));
    Some(Finding {
        fix: None,
        lost_usd: None,
        kind: FindingKind::LargeSystemPrompt,
        model: Some(model.to_string()),
        client: Some(client.to_string()),
        rows: over.iter().map(|r| r.id).collect(),
        lost_tokens: None,
        lost_ms: None,
        context_tokens: Some(largest - threshold),
        confidence: if exact {
            Confidence::High
        } else {
            Confidence::Medium
        },
        evidence: json!({ "system_tokens": largest, "threshold": threshold }),
    })
}

fn server_sized(row: &Row) -> bool {
    row.counts.prompt_tokens.is_some() || row.composition.system.source == Source::Tokenizer
}

fn tool_findings(all: &[Rated], tools: &[ToolUsage], threshold: u32) -> Vec<Finding> {
    // What a tool's findings say of its client's rows, worked out once per client rather than
    // once per tool: (every tool block exactly sized, first and last start, sessions).
    let mut of_client: IntMap<&str, (bool, i64, i64, Vec<u32>)> = IntMap::default();
    for r in all {
        let entry = of_client.entry(r.row().client.as_str()).or_insert((
            true,
            r.t_start_ms,
            r.t_start_ms,
            Vec::new(),
        ));
        if r.composition.tools.value > 0 {
            entry.0 &= server_sized(r) || r.composition.tools.source == Source::Tokenizer;
        }
        entry.1 = entry.1.min(r.t_start_ms);
        entry.2 = entry.2.max(r.t_start_ms);
        if entry.3.last() != Some(&r.session) {
            entry.3.push(r.session);
        }
    }
    for entry in of_client.values_mut() {
        entry.3.sort_unstable();
        entry.3.dedup();
    }
    let mut findings = Vec::new();
    for tool in tools {
        let (exact, days, sessions) = match of_client.get(tool.client.as_str()) {
            Some((exact, start, end, sessions)) => {
                (*exact, (end - start) as f64 / DAY_MS, sessions.len())
            }
            None => (true, 0.0, 0),
        };
        let absence = if days >= HIGH_DAYS && sessions >= HIGH_SESSIONS {
            Confidence::High
        } else if days >= MEDIUM_DAYS {
            Confidence::Medium
        } else {
            Confidence::Low
        };
        // A tool the server's template drops (the layout weighs it 0) costs no context.
        let dropped = exact && tool.schema_tokens == 0;
        if tool.called == 0 && tool.offered > 0 && !dropped {
            findings.push(Finding {
                fix: None,
                lost_usd: None,
                kind: FindingKind::UnusedTool,
                model: None,
                client: Some(tool.client.clone()),
                rows: Vec::new(),
                lost_tokens: None,
                lost_ms: None,
                context_tokens: Some(tool.schema_tokens),
                confidence: absence,
                evidence: json!({ "tool": tool.name, "offered": tool.offered, "days": days, "sessions": sessions }),
            });
        }
        if tool.schema_tokens > threshold {
            findings.push(Finding {
                fix: None,
                lost_usd: None,
                kind: FindingKind::LargeToolSchema,
                model: None,
                client: Some(tool.client.clone()),
                rows: Vec::new(),
                lost_tokens: None,
                lost_ms: None,
                context_tokens: Some(tool.schema_tokens - threshold),
                confidence: if exact { Confidence::High } else { Confidence::Medium },
                evidence: json!({ "tool": tool.name, "schema_tokens": tool.schema_tokens, "threshold": threshold }),
            });
        }
    }
    findings
}

fn order(a: &Finding, b: &Finding) -> Ordering {
    let ms = |f: &Finding| f.lost_ms.map_or(-1.0, |m| m.value);
    a.confidence
        .cmp(&b.confidence)
        .then_with(|| ms(b).total_cmp(&ms(a)))
        .then_with(|| {
            b.context_tokens
                .unwrap_or(0)
                .cmp(&a.context_tokens.unwrap_or(0))
        })
        .then_with(|| (a.kind as u8).cmp(&(b.kind as u8)))
        .then_with(|| a.model.cmp(&b.model))
        .then_with(|| a.client.cmp(&b.client))
        .then_with(|| a.evidence.to_string().cmp(&b.evidence.to_string()))
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// A setting of the server the simulated llama-server can replay (`prefixscope whatif`), so a
/// fix that changes it comes with a predicted saving.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Lever {
    /// `--cache-ram on` (host-memory prompt cache), one slot: `whatif FILE --cache-ram on`.
    CacheRam,
    /// `-np N` without the host cache: `whatif FILE --slots N --cache-ram off`.
    Slots(usize),
    /// Any other setting of the capacity view: `whatif FILE --slots N --cache-ram on|off`.
    Server { slots: usize, cache_ram: bool },
    /// `--swa-full` (a full-size cache for a sliding-window model's window layers), the
    /// server's slots and host cache as they are: `whatif FILE --swa-full`.
    SwaFull,
}

impl Lever {
    /// The one name of a setting: `--cache-ram on` is one slot with the host cache, `-np N`
    /// is N slots without it.
    pub fn of_settings(slots: usize, cache_ram: bool) -> Lever {
        match (slots, cache_ram) {
            (1, true) => Lever::CacheRam,
            (n, false) => Lever::Slots(n),
            (slots, cache_ram) => Lever::Server { slots, cache_ram },
        }
    }

    /// The server's flag, as a llama.cpp user sets it.
    pub fn flag(self) -> String {
        match self {
            Lever::CacheRam => "--cache-ram on".into(),
            Lever::Slots(n) => format!("-np {n}"),
            Lever::Server { slots, cache_ram } => format!(
                "-np {slots} --cache-ram {}",
                if cache_ram { "on" } else { "off" }
            ),
            Lever::SwaFull => "--swa-full".into(),
        }
    }

    /// The `prefixscope whatif` command that predicts it.
    pub fn whatif_args(self) -> String {
        match self {
            Lever::CacheRam => "--cache-ram on".into(),
            Lever::Slots(n) => format!("--slots {n} --cache-ram off"),
            Lever::Server { slots, cache_ram } => format!(
                "--slots {slots} --cache-ram {}",
                if cache_ram { "on" } else { "off" }
            ),
            Lever::SwaFull => "--swa-full".into(),
        }
    }

    /// `(slots, cache_ram)` for `sim::whatif::what_if`; `None` for `--swa-full`, which keeps
    /// the server's own.
    pub fn settings(self) -> Option<(usize, bool)> {
        match self {
            Lever::CacheRam => Some((1, true)),
            Lever::Slots(n) => Some((n, false)),
            Lever::Server { slots, cache_ram } => Some((slots, cache_ram)),
            Lever::SwaFull => None,
        }
    }
}

/// The capacity view's settings, in llama.cpp's terms: `-np` 1, 2, 4, 8 with `--cache-ram` off
/// and on. Every lever a fix names is one of them.
pub const CAPACITY_SETTINGS: [(usize, bool); 8] = [
    (1, false),
    (1, true),
    (2, false),
    (2, true),
    (4, false),
    (4, true),
    (8, false),
    (8, true),
];

/// The levers every fix draws on, in the order they are shown.
pub const LEVERS: [Lever; 4] = [
    Lever::CacheRam,
    Lever::Slots(2),
    Lever::Slots(4),
    Lever::Slots(8),
];

/// What to change for a finding, in the user's terms: one entry per cause (`fix`), and the
/// server settings whose saving the simulated server can predict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fix {
    /// Whose doing it is: `client`, `server` or `setup` (the server's settings, several clients).
    pub owner: &'static str,
    /// The change, as a sentence.
    pub change: String,
    pub levers: Vec<Lever>,
}

fn evidence_text<'a>(finding: &'a Finding, key: &str) -> &'a str {
    finding
        .evidence
        .get(key)
        .and_then(|v| v.as_str())
        .unwrap_or("")
}

fn system_prompt_fix(before: &str, after: &str) -> String {
    client_cause::of_system_change(before, after)
        .and_then(client_cause::fix)
        .unwrap_or("a changing value (a date, a request id, a nonce) in the system prompt: move it after the stable part, or drop it")
        .into()
}

/// Messages moved or inserted within the history, with what the harnesses seen doing it can
/// change.
const MOVED_MESSAGES_FIX: &str = "messages were moved or inserted within the history: keep it append-only, in the order it was sent (aider: --restore-chat-history puts the earlier exchange before its files message)";
const DROPPED_MESSAGES_FIX: &str = "messages were dropped from the middle of the history: keep it append-only, every message sent again (Claude Code: replies cut at max_tokens are re-sent on --continue without their resume notes, so give replies room with CLAUDE_CODE_MAX_OUTPUT_TOKENS)";

/// An engine kind from its name in a finding's evidence (serde's, the one `name` gives).
pub(crate) fn engine_kind(name: &str) -> EngineKind {
    serde_json::from_value(Value::from(name)).unwrap_or(EngineKind::Unexplained)
}

/// The one table of fixes, by finding (and, for a prefix break, by its cause).
pub fn fix(finding: &Finding) -> Fix {
    let client = |change: String| Fix {
        owner: "client",
        change,
        levers: Vec::new(),
    };
    let slots = || {
        let mut levers = vec![Lever::CacheRam];
        levers.extend(LEVERS.iter().copied().filter(|l| *l != Lever::CacheRam));
        levers
    };
    match finding.kind {
        FindingKind::VolatileSystemPrompt => client(system_prompt_fix(
            evidence_text(finding, "before"),
            evidence_text(finding, "after"),
        )),
        FindingKind::PrefixBreak if client_cause::fix(evidence_text(finding, "client_cause")).is_some() => {
            client(client_cause::fix(evidence_text(finding, "client_cause")).unwrap_or_default().into())
        }
        FindingKind::PrefixBreak => match evidence_text(finding, "break_cause") {
            "system_changed" => client(system_prompt_fix(
                evidence_text(finding, "before"),
                evidence_text(finding, "after"),
            )),
            "tools_changed" => client(
                client_cause::fix(evidence_text(finding, "client_cause"))
                    .unwrap_or("tools changed mid-conversation: keep the tool array stable (same tools, same order, same schemas) for the whole conversation")
                    .into(),
            ),
            // A turn's own loss says `history_reordered` or `history_dropped`; a finding keeps
            // llmp's cause and says `reordered` or `dropped` in its evidence.
            "history_reordered" => client(MOVED_MESSAGES_FIX.into()),
            "history_dropped" => client(DROPPED_MESSAGES_FIX.into()),
            "history_rewritten" if finding.evidence.get("reordered").is_some() => {
                client(MOVED_MESSAGES_FIX.into())
            }
            "history_rewritten" if finding.evidence.get("dropped").is_some() => {
                client(DROPPED_MESSAGES_FIX.into())
            }
            _ => client(
                "earlier messages were rewritten: append to the history instead of editing it (compact rarely, and all at once)".into(),
            ),
        },
        FindingKind::SideCallOnConversationModel => Fix {
            owner: "setup",
            change: "side-calls (titles, summaries) evict the conversation: --cache-ram keeps it in host memory, more slots (-np) keep it resident, or send side-calls to a separate small model".into(),
            levers: slots(),
        },
        FindingKind::OtherConversationEviction => Fix {
            owner: "setup",
            change: "more conversations than slots: a slot per concurrent conversation (-np N), or the host-memory prompt cache (--cache-ram)".into(),
            levers: slots(),
        },
        FindingKind::OtherModelEviction => Fix {
            owner: "setup",
            change: "models share one cache: give each model its own server, or keep prefixes in host memory (--cache-ram)".into(),
            levers: vec![Lever::CacheRam],
        },
        FindingKind::ServerCacheLoss => {
            let kind = engine_kind(evidence_text(finding, "engine_cause"));
            Fix {
                owner: "server",
                change: kind.fix().into(),
                levers: match kind {
                    EngineKind::SlidingWindow => vec![Lever::SwaFull],
                    _ => Vec::new(),
                },
            }
        }
        FindingKind::ProviderCache => {
            let kind = evidence_text(finding, "kind");
            let provider = finding
                .evidence
                .get("provider")
                .and_then(|p| serde_json::from_value(p.clone()).ok())
                .unwrap_or_default();
            Fix {
                owner: if kind == "no_cache_breakpoint" {
                    "client"
                } else {
                    "provider"
                },
                change: crate::provider::fix(kind, provider).into(),
                levers: Vec::new(),
            }
        }
        FindingKind::UnusedTool => client(format!(
            "drop the tool {} from the tool list: offered, never called",
            evidence_text(finding, "tool")
        )),
        FindingKind::LargeToolSchema => client(format!(
            "shorten the schema of the tool {} (descriptions, examples)",
            evidence_text(finding, "tool")
        )),
        FindingKind::LargeSystemPrompt => {
            client("shorten the system prompt, or move rarely used instructions out of it".into())
        }
        FindingKind::ReasoningChanged => client(
            client_cause::fix(client_cause::REASONING_CHANGED)
                .unwrap_or_default()
                .into(),
        ),
        FindingKind::TemplateRerendered => Fix {
            owner: "setup",
            change: client_cause::fix(client_cause::TEMPLATE_RERENDERED)
                .unwrap_or_default()
                .into(),
            levers: Vec::new(),
        },
    }
}

/// Findings by cost: tokens lost, then context tokens, then their usual order.
/// The one list of findings every output shows: the analysis's, without a system prompt change
/// a volatile-prompt finding already speaks for, and a finding for each loss none speaks for,
/// costliest first.
pub fn listed<R: Priced>(report: &super::Report<R>, findings: &[Finding]) -> Vec<Finding> {
    let mut all = without_duplicates(findings);
    let extra = uncovered(report, &all);
    all.extend(extra);
    by_cost(&all).into_iter().cloned().collect()
}

/// The losses no finding speaks for (a cause on too few turns for the analysis's thresholds),
/// one finding-shaped entry per model and cause, so the findings view accounts for every loss.
/// Marked `"below_thresholds": true` in their evidence.
fn uncovered<R: Priced>(report: &super::Report<R>, findings: &[Finding]) -> Vec<Finding> {
    // A loss is spoken for when a finding of its cause names its row; side-call findings name
    // the side-calls, and speak for every side-call loss of their model.
    let mut named: std::collections::HashSet<(&str, u64)> = std::collections::HashSet::new();
    let mut side_call_models: Vec<&str> = Vec::new();
    for f in findings {
        if f.kind == FindingKind::SideCallOnConversationModel {
            side_call_models.extend(f.model.as_deref());
        } else {
            named.extend(f.rows.iter().map(|&id| (advice_cause(f), id)));
        }
    }
    let covered = |id: u64, model: &str, cause: &str| {
        // A moved or dropped message is a rewrite to llmp's finding.
        let finding_cause = match cause {
            "history_reordered" | "history_dropped" => "history_rewritten",
            cause => cause,
        };
        named.contains(&(cause, id))
            || named.contains(&(finding_cause, id))
            || (cause == "side_call" && side_call_models.contains(&model))
    };
    // (model, cause) → (kind, rows, tokens, ms, example row)
    let mut groups: Vec<(String, String, Finding)> = Vec::new();
    for rated in report.rows.iter().map(Priced::rated) {
        let row = rated.row();
        let own = rated.client_loss().map(|l| (true, l));
        let external = rated.external_loss().map(|l| (false, l));
        for (theirs, (loss, ms)) in [own, external].into_iter().flatten() {
            if loss.tokens == 0 || covered(row.id, &row.model, &loss.cause) {
                continue;
            }
            let at = groups
                .iter()
                .position(|(m, c, _)| *m == row.model && *c == loss.cause);
            let at = match at {
                Some(at) => at,
                None => {
                    let kind = FindingKind::of_loss(&loss.cause, theirs);
                    let location = row.break_location.as_ref();
                    groups.push((
                        row.model.clone(),
                        loss.cause.clone(),
                        Finding {
                            fix: None,
                            lost_usd: None,
                            kind,
                            model: Some(row.model.clone()),
                            client: None,
                            rows: Vec::new(),
                            lost_tokens: Some(0),
                            lost_ms: None,
                            context_tokens: None,
                            confidence: Confidence::Low,
                            evidence: serde_json::json!({
                                "below_thresholds": true,
                                "break_cause": loss.cause,
                                "kind": loss.cause,
                                "provider": row.provider,
                                "before": location.and_then(|l| l.before.clone()),
                                "after": location.and_then(|l| l.after.clone()),
                            }),
                        },
                    ));
                    groups.len() - 1
                }
            };
            let finding = &mut groups[at].2;
            finding.rows.push(row.id);
            finding.lost_tokens =
                Some(finding.lost_tokens.unwrap_or(0).saturating_add(loss.tokens));
            if let Some(ms) = ms {
                finding.lost_ms = Some(add_ms(finding.lost_ms, ms));
            }
        }
    }
    groups
        .into_iter()
        .map(|(_, _, mut f)| {
            // Its fix as the summaries print it (a finding of the analysis carries its own).
            let fix = fix(&f);
            f.fix = Some(FixNote {
                owner: fix.owner.to_string(),
                change: fix.change,
            });
            f
        })
        .collect()
}

/// An uncovered loss in words: `system prompt changes on 1 turn (gemma): 584 tokens, 158 ms`.
pub(crate) fn uncovered_label(finding: &Finding) -> String {
    let cost = match finding.lost_ms {
        Some(ms) => format!(
            "{} tokens, {}",
            thousands(u64::from(finding.lost_tokens.unwrap_or(0))),
            crate::live::view::duration(ms.value)
        ),
        None => format!(
            "{} tokens",
            thousands(u64::from(finding.lost_tokens.unwrap_or(0)))
        ),
    };
    format!(
        "{} on {} ({}): {cost} lost (too few turns for a finding of the analysis)",
        crate::units::cause_label_plural(advice_cause(finding)),
        plural(finding.rows.len() as u64, "turn"),
        finding.model.as_deref().unwrap_or("?")
    )
}

/// The findings the view shows: a volatile system prompt is also a prefix break by
/// system-prompt changes of the same client, so one entry, the one that says where.
fn without_duplicates(findings: &[Finding]) -> Vec<Finding> {
    let volatile = |f: &Finding| {
        findings.iter().any(|v| {
            v.kind == FindingKind::VolatileSystemPrompt
                && v.client == f.client
                && v.model == f.model
        })
    };
    findings
        .iter()
        .filter(|f| {
            !(f.kind == FindingKind::PrefixBreak
                && f.evidence.get("break_cause").and_then(|v| v.as_str()) == Some("system_changed")
                && volatile(f))
        })
        .cloned()
        .collect()
}

/// The cause a finding is about, as the report names causes (`other_conversation`…).
pub fn advice_cause(finding: &Finding) -> &str {
    match finding.kind {
        FindingKind::SideCallOnConversationModel => "side_call",
        FindingKind::OtherConversationEviction => "other_conversation",
        FindingKind::OtherModelEviction => "other_model",
        FindingKind::VolatileSystemPrompt => "system_changed",
        FindingKind::PrefixBreak | FindingKind::ServerCacheLoss => finding
            .evidence
            .get("break_cause")
            .or_else(|| finding.evidence.get("kind"))
            .and_then(|v| v.as_str())
            .unwrap_or("prefix break"),
        FindingKind::UnusedTool => "unused tool",
        FindingKind::LargeToolSchema => "large tool schema",
        FindingKind::LargeSystemPrompt => "large system prompt",
        FindingKind::ReasoningChanged => "reasoning_changed",
        FindingKind::TemplateRerendered => "template_rerendered",
        FindingKind::ProviderCache => finding
            .evidence
            .get("kind")
            .and_then(|v| v.as_str())
            .unwrap_or("provider_miss"),
    }
}

pub(crate) fn by_cost(findings: &[Finding]) -> Vec<&Finding> {
    let mut sorted: Vec<&Finding> = findings.iter().collect();
    sorted.sort_by(|a, b| {
        b.lost_tokens
            .unwrap_or(0)
            .cmp(&a.lost_tokens.unwrap_or(0))
            .then_with(|| {
                b.context_tokens
                    .unwrap_or(0)
                    .cmp(&a.context_tokens.unwrap_or(0))
            })
            .then_with(|| order(a, b))
    });
    sorted
}

#[cfg(test)]
mod fix_tests {
    use super::*;

    fn finding(kind: FindingKind, evidence: Value) -> Finding {
        Finding {
            fix: None,
            lost_usd: None,
            kind,
            model: None,
            client: None,
            rows: Vec::new(),
            lost_tokens: None,
            lost_ms: None,
            context_tokens: None,
            confidence: Confidence::High,
            evidence,
        }
    }

    #[test]
    fn one_fix_per_cause_in_the_users_terms() {
        let date = finding(
            FindingKind::VolatileSystemPrompt,
            json!({"before": "Today is 2026-03-14.", "after": "Today is 2026-03-15."}),
        );
        assert!(fix(&date).change.contains("move it after the stable part"));
        let claude = finding(
            FindingKind::VolatileSystemPrompt,
            json!({"before": "x-anthropic-billing-header: cc_version=1; cch=ab12;", "after": "cch=cd34;"}),
        );
        assert!(
            fix(&claude)
                .change
                .contains("CLAUDE_CODE_ATTRIBUTION_HEADER=0")
        );
        let tools = finding(
            FindingKind::PrefixBreak,
            json!({"break_cause": "tools_changed"}),
        );
        assert!(fix(&tools).change.contains("keep the tool array stable"));
        // A turn's reorder or drop (its loss cause) and a finding's (llmp's cause, "reordered"
        // or "dropped" in the evidence) get the fix about messages: aider's for moved ones,
        // Claude Code's for dropped ones.
        for (moved, harness) in [
            (
                json!({"break_cause": "history_reordered"}),
                "--restore-chat-history",
            ),
            (
                json!({"break_cause": "history_rewritten", "reordered": 2}),
                "--restore-chat-history",
            ),
            (
                json!({"break_cause": "history_dropped"}),
                "CLAUDE_CODE_MAX_OUTPUT_TOKENS",
            ),
            (
                json!({"break_cause": "history_rewritten", "dropped": 2}),
                "CLAUDE_CODE_MAX_OUTPUT_TOKENS",
            ),
        ] {
            let change = fix(&finding(FindingKind::PrefixBreak, moved)).change;
            assert!(change.contains("append-only"), "{change}");
            assert!(change.contains(harness), "{change}");
            assert!(!change.contains("tool array"), "{change}");
        }
        let others = fix(&finding(FindingKind::OtherConversationEviction, json!({})));
        assert_eq!(others.owner, "setup");
        assert!(others.levers.contains(&Lever::CacheRam));
        assert!(others.levers.contains(&Lever::Slots(4)));
        let server = fix(&finding(FindingKind::ServerCacheLoss, json!({})));
        assert_eq!(server.owner, "server");
        assert!(server.levers.is_empty());
        assert_eq!(Lever::Slots(4).whatif_args(), "--slots 4 --cache-ram off");
    }
}
