use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::REPORT_VERSION;
use super::Skipped;
use super::client_cause;
use super::engine_cause::EngineKind;
use super::findings::{Finding, FindingKind, add_ms};
use super::row::{Client, Priced, Rated, Row, RowKind, ToolUsage};
use crate::normalize::Api;
use crate::normalize::exchange::SkipReason;
use crate::normalize::measured::{Measured, Source};
use crate::units::{cause_label_plural, duration_compound, plural, thousands};

/// `R` is how the rows are held: owned (`analyze`, the default), or shared with the live engine
/// (`SharedRow`), which keeps them up to date so a snapshot copies pointers, not rows
/// (DESIGN.md, "Live engine"). Either serializes the same.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report<R = Row> {
    pub v: u32,
    pub window: Option<Window>,
    pub coverage: Coverage,
    pub servers: Vec<ServerFields>,
    pub time: Time,
    pub composition: CompositionTotals,
    pub clients: Vec<Client>,
    pub tools: Vec<ToolUsage>,
    pub findings: Vec<Finding>,
    pub rows: Vec<R>,
    /// prefixscope: what the lost tokens cost in dollars, where a price is known
    /// (`pricing::money`; hosted APIs by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub money: Option<crate::pricing::Money>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub start_ms: i64,
    pub end_ms: i64,
    pub days: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Coverage {
    pub records: u64,
    pub analysed: u64,
    pub skipped: SkippedCounts,
    pub paths: BTreeMap<String, u64>,
    pub bad_lines: u64,
    pub turns: u64,
    pub conversations: u64,
    pub turns_with_reuse: u64,
    pub turns_with_timing: u64,
    /// prefixscope: of `skipped.not_chat`, the `HEAD` and `GET /` requests harnesses send to
    /// check the server is up.
    #[serde(default)]
    pub connectivity_checks: u64,
    /// prefixscope: records of prefixscope's own requests to the server (`probe: true`), not
    /// counted in `records` or anywhere else. Absent when there were none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub probes: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SkippedCounts {
    pub not_chat: u64,
    pub error: u64,
    pub non_2xx: u64,
    pub unparsed: u64,
    /// Past `normalize::MAX_MESSAGES` or `MAX_TOOLS` (prefixscope's; absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub too_large: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerFields {
    pub api: Api,
    pub fields: Vec<CountField>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CountField {
    PromptTokens,
    CompletionTokens,
    ReusedTokens,
    EvaluatedTokens,
    PrefillMs,
    DecodeMs,
    LoadMs,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Time {
    pub prefill_ms: Option<Measured<f64>>,
    pub lost_ms: Option<Measured<f64>>,
    pub lost_tokens: u64,
    /// prefixscope: lost tokens whose time is not measured (a hosted API reports no prefill
    /// time): in `lost_tokens`, never in `lost_ms`. Absent: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub untimed_tokens: u64,
    pub by_cause: BTreeMap<String, CauseTotal>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CauseTotal {
    pub tokens: u64,
    pub ms: Option<Measured<f64>>,
    pub rows: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CompositionTotals {
    pub system: u64,
    pub tools: u64,
    pub history: u64,
    pub new_content: u64,
}

const DAY_MS: f64 = 86_400_000.0;
const SUMMARY_CAUSES: usize = 3;
const SUMMARY_FINDINGS: usize = 3;
const SUMMARY_CLIENTS: usize = 3;

/// What the report says about its input beside the rows.
pub(crate) struct Input<'a> {
    pub records: u64,
    /// Earliest start and latest end of all records (`t_end` never before `t_start`).
    pub span: Option<(i64, i64)>,
    pub analysed: u64,
    pub skipped: &'a [Skipped],
    /// Probe records, left out of everything above.
    pub probes: u64,
    pub prices: &'a crate::pricing::Prices,
}

/// The global figures a report carries beside its rows.
pub(crate) struct Globals {
    pub clients: Vec<Client>,
    pub tools: Vec<ToolUsage>,
    pub findings: Vec<Finding>,
}

pub(crate) fn assemble<R: Priced>(input: Input<'_>, rows: Vec<R>, globals: Globals) -> Report<R> {
    let window = input.span.map(|(start_ms, end_ms)| Window {
        start_ms,
        end_ms,
        days: (end_ms - start_ms) as f64 / DAY_MS,
    });
    Report {
        v: REPORT_VERSION,
        window,
        coverage: coverage(&input, &rows),
        servers: servers(&rows),
        time: time(&rows),
        composition: composition(&rows),
        clients: globals.clients,
        tools: globals.tools,
        findings: globals.findings,
        money: money(&rows, input.prices),
        rows,
    }
}

/// The dollars of the rows' losses (`pricing::money`).
pub(crate) fn money<R: Priced>(
    rows: &[R],
    prices: &crate::pricing::Prices,
) -> Option<crate::pricing::Money> {
    let losses = each(rows).flat_map(|row| {
        let row = row.row();
        [&row.lost_client, &row.lost_external]
            .into_iter()
            .flatten()
            .map(move |loss| {
                (
                    row.model.as_str(),
                    row.provider,
                    loss.cause.as_str(),
                    loss.tokens,
                )
            })
    });
    crate::pricing::money(losses, prices)
}

fn each<R: Priced>(rows: &[R]) -> impl Iterator<Item = Rated<'_>> {
    rows.iter().map(Priced::rated)
}

fn coverage<R: Priced>(input: &Input<'_>, rows: &[R]) -> Coverage {
    let mut coverage = Coverage {
        records: input.records,
        analysed: input.analysed,
        probes: input.probes,
        ..Coverage::default()
    };
    for skipped in input.skipped {
        match skipped.reason {
            SkipReason::NotChat => {
                coverage.skipped.not_chat += 1;
                coverage.connectivity_checks += u64::from(skipped.connectivity_check);
                let path = skipped.path.split('?').next().unwrap_or_default();
                *coverage.paths.entry(path.to_string()).or_default() += 1;
            }
            SkipReason::Error => coverage.skipped.error += 1,
            SkipReason::Non2xx => coverage.skipped.non_2xx += 1,
            SkipReason::Unparsed => coverage.skipped.unparsed += 1,
            SkipReason::TooLarge => coverage.skipped.too_large += 1,
        }
    }
    let mut conversations: Vec<u32> = each(rows).filter_map(|r| r.conversation).collect();
    conversations.sort_unstable();
    conversations.dedup();
    coverage.conversations = conversations.len() as u64;
    for row in each(rows).filter(|r| r.kind == RowKind::Turn) {
        coverage.turns += 1;
        coverage.turns_with_reuse += u64::from(row.counts.reused_tokens.is_some());
        coverage.turns_with_timing += u64::from(row.counts.prefill_ms.is_some());
    }
    coverage
}

fn servers<R: Priced>(rows: &[R]) -> Vec<ServerFields> {
    // The fields as a bit set per API while counting: a set insert per field per row was most
    // of the report's own cost.
    let mut apis: BTreeMap<Api, u8> = BTreeMap::new();
    let mut last: Option<(Api, u8)> = None;
    for row in each(rows) {
        let mut fields = 0u8;
        let c = &row.counts;
        let reported = [
            (CountField::PromptTokens, c.prompt_tokens.map(|m| m.source)),
            (
                CountField::CompletionTokens,
                c.completion_tokens.map(|m| m.source),
            ),
            (CountField::ReusedTokens, c.reused_tokens.map(|m| m.source)),
            (
                CountField::EvaluatedTokens,
                c.evaluated_tokens.map(|m| m.source),
            ),
            (CountField::PrefillMs, c.prefill_ms.map(|m| m.source)),
            (CountField::DecodeMs, c.decode_ms.map(|m| m.source)),
            (CountField::LoadMs, c.load_ms.map(|m| m.source)),
        ];
        for (field, source) in reported {
            if source == Some(Source::Server) {
                fields |= 1 << field as u8;
            }
        }
        match &mut last {
            Some((api, seen)) if *api == row.api => *seen |= fields,
            _ => {
                if let Some((api, seen)) = last {
                    *apis.entry(api).or_default() |= seen;
                }
                last = Some((row.api, fields));
            }
        }
    }
    if let Some((api, seen)) = last {
        *apis.entry(api).or_default() |= seen;
    }
    apis.into_iter()
        .map(|(api, seen)| ServerFields {
            api,
            fields: COUNT_FIELDS
                .into_iter()
                .filter(|&field| seen & (1 << field as u8) != 0)
                .collect(),
        })
        .collect()
}

/// Every count field, in order.
const COUNT_FIELDS: [CountField; 7] = [
    CountField::PromptTokens,
    CountField::CompletionTokens,
    CountField::ReusedTokens,
    CountField::EvaluatedTokens,
    CountField::PrefillMs,
    CountField::DecodeMs,
    CountField::LoadMs,
];

/// The time totals of `rows`: the report's, and the live view's over the rows a filter keeps.
pub fn time<R: Priced>(rows: &[R]) -> Time {
    let mut prefill_ms = None;
    let mut lost_ms: Option<Measured<f64>> = None;
    let mut lost_tokens = 0u64;
    let mut untimed_tokens = 0u64;
    let mut by_cause: BTreeMap<String, CauseTotal> = BTreeMap::new();
    for row in each(rows) {
        if let Some(prefill) = row.counts.prefill_ms {
            prefill_ms = Some(add_ms(prefill_ms, prefill));
        }
        if !row.loss_measured {
            continue;
        }
        if let Some(prefill) = row.counts.prefill_ms {
            lost_ms = Some(add_ms(
                lost_ms,
                Measured {
                    value: 0.0,
                    source: prefill.source,
                },
            ));
        }
        for (loss, ms) in row.losses() {
            lost_tokens += u64::from(loss.tokens);
            // Looked up before it is inserted: a cause's name is copied once, not per loss.
            if !by_cause.contains_key(loss.cause.as_str()) {
                by_cause.insert(
                    loss.cause.clone(),
                    CauseTotal {
                        tokens: 0,
                        ms: None,
                        rows: 0,
                    },
                );
            }
            let Some(total) = by_cause.get_mut(loss.cause.as_str()) else {
                continue;
            };
            total.tokens += u64::from(loss.tokens);
            total.rows += 1;
            match ms {
                Some(ms) => {
                    total.ms = Some(add_ms(total.ms, ms));
                    lost_ms = Some(add_ms(lost_ms, ms));
                }
                None => untimed_tokens += u64::from(loss.tokens),
            }
        }
    }
    Time {
        prefill_ms,
        lost_ms,
        lost_tokens,
        untimed_tokens,
        by_cause,
    }
}

fn composition<R: Priced>(rows: &[R]) -> CompositionTotals {
    let mut totals = CompositionTotals::default();
    for row in each(rows) {
        let c = &row.composition;
        totals.system += u64::from(c.system.value);
        totals.tools += u64::from(c.tools.value);
        totals.history += u64::from(c.history.value);
        totals.new_content += u64::from(c.new_content.value);
    }
    totals
}

impl<R: Priced> Report<R> {
    pub fn summary(&self) -> String {
        self.summary_with(&self.findings)
    }

    /// The summary, with findings worked out apart from the report (a live snapshot's, on
    /// demand).
    pub fn summary_with(&self, findings: &[Finding]) -> String {
        let mut lines = Vec::new();
        let turns = self.coverage.turns;
        let span = self
            .window
            .map(|w| {
                format!(
                    " over {}",
                    duration_compound(w.end_ms.saturating_sub(w.start_ms) as f64)
                )
            })
            .unwrap_or_default();
        lines.push(format!(
            "prefixscope: {}{span}, {} analysed, {} in {}",
            plural(self.coverage.records, "request"),
            thousands(self.coverage.analysed),
            plural(turns, "turn"),
            plural(self.coverage.conversations, "conversation")
        ));
        let several = self.clients.len() > 1;
        if several {
            let shown: Vec<String> = self
                .clients
                .iter()
                .take(SUMMARY_CLIENTS)
                .map(|c| {
                    format!(
                        "{} ({}, {})",
                        c.client,
                        plural(u64::from(c.requests), "request"),
                        plural(u64::from(c.conversations), "conversation")
                    )
                })
                .collect();
            let more = self.clients.len().saturating_sub(SUMMARY_CLIENTS);
            let tail = if more > 0 {
                format!(" · {more} more")
            } else {
                String::new()
            };
            lines.push(format!("clients: {}{tail}", shown.join(" · ")));
        }
        lines.push(self.time_line());
        let mut causes: Vec<(&String, &CauseTotal)> = self.time.by_cause.iter().collect();
        causes.sort_by(|a, b| {
            let ms = |c: &CauseTotal| c.ms.map_or(-1.0, |m| m.value);
            ms(b.1)
                .total_cmp(&ms(a.1))
                .then(b.1.tokens.cmp(&a.1.tokens))
                .then(a.0.cmp(b.0))
        });
        if !causes.is_empty() {
            let top: Vec<String> = causes
                .iter()
                .take(SUMMARY_CAUSES)
                .map(|(cause, total)| {
                    format!(
                        "{} {}",
                        cause_label_plural(cause),
                        size(total.tokens, total.ms)
                    )
                })
                .collect();
            lines.push(format!("  by cause: {}", top.join(" · ")));
        }
        lines.extend(self.money_line());
        lines.extend(self.server_lines());
        lines.push(self.coverage_line());
        // The one list every output shows (`findings::listed`): every loss in it, costliest first.
        let findings = super::findings::listed(self, findings);
        if !findings.is_empty() {
            lines.push("findings:".into());
            for finding in findings.iter().take(SUMMARY_FINDINGS) {
                let client = match (&finding.client, several) {
                    (Some(client), true) => format!(" [{client}]"),
                    _ => String::new(),
                };
                lines.push(format!(
                    "  [{}] {}{client}",
                    crate::units::serde_name(finding.confidence),
                    finding_label(finding)
                ));
                if let Some(fix) = &finding.fix {
                    lines.push(format!("      fix ({}): {}", fix.owner, fix.change));
                }
            }
            if findings.len() > SUMMARY_FINDINGS {
                lines.push(format!(
                    "  … {} more: prefixscope analyze FILE --json (the TUI: f)",
                    findings.len() - SUMMARY_FINDINGS
                ));
            }
        }
        let mut text = lines.join("\n");
        text.push('\n');
        text
    }

    /// `money lost: $1.23 (…)`, where a lost token has a price (`pricing`).
    fn money_line(&self) -> Option<String> {
        let money = self.money.as_ref()?;
        let unpriced = match money.unpriced_tokens {
            0 => String::new(),
            n => format!("; {} more lost tokens have no price", thousands(n)),
        };
        Some(format!(
            "money lost: {} on {} tokens, each billed above a cache read{unpriced} (prices: {})",
            crate::pricing::dollars(money.lost_usd),
            thousands(money.priced_tokens),
            money.source
        ))
    }

    fn time_line(&self) -> String {
        let time = &self.time;
        // Tokens whose time no server reported are counted, never priced at 0 ms.
        let untimed = match time.untimed_tokens {
            0 => String::new(),
            n if n == time.lost_tokens => {
                " (their time not measured: no prefill time reported)".into()
            }
            n => format!(
                " ({} of them untimed: no prefill time reported)",
                thousands(n)
            ),
        };
        let all_untimed = time.untimed_tokens > 0 && time.untimed_tokens == time.lost_tokens;
        match (time.lost_ms, time.prefill_ms) {
            (_, _) if all_untimed => format!(
                "tokens lost re-processing prompts: {}{untimed}",
                thousands(time.lost_tokens)
            ),
            (Some(lost), Some(prefill)) if prefill.value > 0.0 => format!(
                "time lost re-processing prompts: {}{} of {} prefill ({:.0}%), {} tokens{untimed}",
                duration_compound(lost.value),
                source_note(lost.source),
                duration_compound(prefill.value),
                100.0 * lost.value / prefill.value,
                thousands(time.lost_tokens)
            ),
            (Some(lost), _) => format!(
                "time lost re-processing prompts: {}{}, {} tokens{untimed}",
                duration_compound(lost.value),
                source_note(lost.source),
                thousands(time.lost_tokens)
            ),
            (None, _) if self.rows.iter().any(|r| r.rated().loss_measured) => {
                "time lost re-processing prompts: not measured (no prefill time reported), 0 tokens lost".into()
            }
            (None, _) => "time lost re-processing prompts: not measured (no turn had the server's reuse and timing counters)".into(),
        }
    }

    /// Engine versus client on llmp's `server_*` losses: the server's own (with the mechanism
    /// its rows show), and apart those a change llmp cannot see made the client's
    /// (`client_cause::unseen_by_llmp`: reasoning sent back changed, earlier turns re-rendered).
    fn server_lines(&self) -> Vec<String> {
        #[derive(Default)]
        struct Sum {
            rows: u64,
            tokens: u64,
            ms: Option<Measured<f64>>,
        }
        let (mut engine, mut reasoning, mut template) =
            (Sum::default(), Sum::default(), Sum::default());
        let mut engines: BTreeMap<EngineKind, u64> = BTreeMap::new();
        for rated in self.rows.iter().map(Priced::rated) {
            let Some((loss, ms)) = rated.external_loss() else {
                continue;
            };
            if !loss.cause.starts_with("server_") {
                continue;
            }
            let row = rated.row();
            let sum = match row.client_cause.as_deref() {
                Some(client_cause::REASONING_CHANGED) => &mut reasoning,
                Some(client_cause::TEMPLATE_RERENDERED) => &mut template,
                _ => &mut engine,
            };
            sum.rows += 1;
            sum.tokens += u64::from(loss.tokens);
            if let Some(m) = ms {
                sum.ms = Some(add_ms(sum.ms, m));
            }
            if let Some(cause) = &row.engine_cause {
                *engines.entry(cause.kind).or_default() += 1;
            }
        }
        let mut engines: Vec<(EngineKind, u64)> = engines.into_iter().collect();
        engines.sort_by_key(|&(kind, n)| (std::cmp::Reverse(n), kind));
        let likely = engines
            .iter()
            .filter(|(kind, _)| *kind != EngineKind::Unexplained)
            .map(|(kind, n)| format!("{} on {n}", kind.label()))
            .collect::<Vec<_>>();
        let mut lines = Vec::new();
        if engine.rows > 0 {
            lines.push(format!(
                "  the server itself dropped cached prefixes on {} (prompt unchanged, nothing in between): {}, not the client's doing{}",
                plural(engine.rows, "turn"),
                size(engine.tokens, engine.ms),
                if likely.is_empty() {
                    String::new()
                } else {
                    format!("; likely {}", likely.join(", "))
                }
            ));
        }
        if reasoning.rows > 0 {
            lines.push(format!(
                "  the client sent earlier replies' reasoning back changed on {}: {} re-evaluated, the client's doing though the messages matched",
                plural(reasoning.rows, "turn"),
                size(reasoning.tokens, reasoning.ms)
            ));
        }
        if template.rows > 0 {
            lines.push(format!(
                "  the chat template rendered earlier turns anew on {}: {} re-evaluated, though the messages matched (the server's own layout counts them anew)",
                plural(template.rows, "turn"),
                size(template.tokens, template.ms)
            ));
        }
        lines
    }

    fn coverage_line(&self) -> String {
        let c = &self.coverage;
        let mut skipped = Vec::new();
        for (count, name) in [
            (c.skipped.not_chat, "not chat"),
            (c.skipped.error, "failed"),
            (c.skipped.non_2xx, "non-2xx"),
            (c.skipped.unparsed, "unreadable"),
            (c.skipped.too_large, "too large to analyse"),
        ] {
            let checks = c.connectivity_checks;
            if name == "not chat" && checks > 0 && checks == count {
                skipped.push(plural(checks, "connectivity check"));
            } else if name == "not chat" && checks > 0 {
                skipped.push(format!(
                    "{count} {name}, {checks} of them connectivity checks"
                ));
            } else if count > 0 {
                skipped.push(format!("{count} {name}"));
            }
        }
        let mut line = format!(
            "coverage: {} of {} analysed",
            thousands(c.analysed),
            plural(c.records, "record")
        );
        if !skipped.is_empty() {
            line.push_str(&format!(" ({})", skipped.join(", ")));
        }
        if c.bad_lines > 0 {
            line.push_str(&format!(", {}", plural(c.bad_lines, "bad line")));
        }
        if c.probes > 0 {
            // Counted apart from the records, which are the traffic's.
            line.push_str(&format!(
                ", {} of the server not counted",
                plural(c.probes, "probe")
            ));
        }
        if c.turns > 0 {
            line.push_str(&format!(
                "; reuse reported on {} of {}, timing on {}",
                thousands(c.turns_with_reuse),
                plural(c.turns, "turn"),
                thousands(c.turns_with_timing)
            ));
        }
        line
    }
}

/// A finding in `analyze`'s words (the summary's line, the TUI's findings view).
pub fn finding_label(finding: &Finding) -> String {
    if finding.evidence.get("below_thresholds") == Some(&serde_json::Value::Bool(true)) {
        return super::findings::uncovered_label(finding);
    }
    // A request may name no model (llama-server serves its one model whatever is asked).
    let model = match finding.model.as_deref() {
        None => "?",
        Some("") => "no model named",
        Some(model) => model,
    };
    let evidence = &finding.evidence;
    // A value as it reads in a sentence: an empty name (a tool the request left unnamed, as
    // a provider's built-in web search) says so rather than vanishing.
    let text = |key: &str| match evidence.get(key).and_then(|v| v.as_str()) {
        Some("") => "(unnamed)".to_string(),
        Some(value) => value.to_string(),
        None => "?".to_string(),
    };
    let number = |key: &str| evidence.get(key).and_then(|v| v.as_u64()).unwrap_or(0);
    let usd = finding
        .lost_usd
        .map(|usd| format!(", {}", crate::pricing::dollars(usd)))
        .unwrap_or_default();
    let lost = match (finding.lost_tokens, finding.lost_ms) {
        (Some(tokens), ms) => format!(": {}{usd} lost", size(u64::from(tokens), ms)),
        (None, _) => ", loss not measured".into(),
    };
    let context = finding
        .context_tokens
        .map(|t| thousands(u64::from(t)))
        .unwrap_or_default();
    match finding.kind {
        FindingKind::SideCallOnConversationModel => format!(
            "{} on the conversation model {}{lost}",
            plural(number("side_calls"), "side-call"),
            if finding.model.as_deref() == Some("") {
                format!("({model})")
            } else {
                model.to_string()
            }
        ),
        FindingKind::PrefixBreak => {
            let moved = |key: &str, what: &str| match number(key) {
                0 => String::new(),
                n if n == number("broken") => format!(", messages {what}"),
                n => format!(", messages {what} on {n}"),
            };
            let reordered = moved("reordered", "moved or inserted") + &moved("dropped", "dropped");
            format!(
                "prompt prefix broken by {} on {} of {} links{reordered} ({model}){lost}",
                cause_label_plural(&text("break_cause")),
                number("broken"),
                number("links")
            )
        }
        FindingKind::ServerCacheLoss => format!(
            "{} on {} ({model}){}{lost}",
            cause_label_plural(&text("kind")),
            plural(finding.rows.len() as u64, "turn"),
            match super::findings::engine_kind(&text("engine_cause")) {
                EngineKind::Unexplained => String::new(),
                kind => format!(", the engine's {}", kind.label()),
            }
        ),
        FindingKind::ProviderCache => format!(
            "{} on {} ({model}){lost}",
            cause_label_plural(&text("kind")),
            plural(finding.rows.len() as u64, "turn"),
        ),
        FindingKind::OtherConversationEviction => format!(
            "cache lost to other conversations on {} ({model}){lost}",
            plural(finding.rows.len() as u64, "turn")
        ),
        FindingKind::OtherModelEviction => format!(
            "cache lost to other models on {} ({model}){lost}",
            plural(finding.rows.len() as u64, "turn")
        ),
        FindingKind::UnusedTool => format!(
            "tool {} offered on {}, never called ({context} tokens each)",
            text("tool"),
            plural(number("offered"), "request")
        ),
        FindingKind::LargeToolSchema => format!(
            "tool {} schema is {} tokens ({context} over {})",
            text("tool"),
            thousands(number("schema_tokens")),
            number("threshold")
        ),
        FindingKind::VolatileSystemPrompt => {
            let example = match (
                evidence.get("before").and_then(|v| v.as_str()),
                evidence.get("after").and_then(|v| v.as_str()),
            ) {
                (Some(before), Some(after)) => format!(": {before:?} → {after:?}"),
                _ => String::new(),
            };
            format!(
                "system prompt changes at character {} on {} of {} turns{example}{lost}",
                evidence
                    .get("char_offset")
                    .and_then(|v| v.as_u64())
                    .map_or("?".into(), |o| o.to_string()),
                number("changed"),
                number("links")
            )
        }
        FindingKind::LargeSystemPrompt => format!(
            "system prompt of {model} is {} tokens ({context} over {})",
            thousands(number("system_tokens")),
            number("threshold")
        ),
        FindingKind::ReasoningChanged => format!(
            "earlier replies' reasoning sent back changed on {} ({model}){lost}",
            plural(finding.rows.len() as u64, "turn")
        ),
        FindingKind::TemplateRerendered => format!(
            "the template rendered earlier turns anew on {} ({model}){lost}",
            plural(finding.rows.len() as u64, "turn")
        ),
    }
}

fn source_note(source: Source) -> &'static str {
    match source {
        Source::Server | Source::Tokenizer => "",
        Source::Proxy => " (proxy-timed, upper bound)",
        Source::Estimate => " (estimated)",
    }
}

fn size(tokens: u64, ms: Option<Measured<f64>>) -> String {
    match ms {
        Some(ms) => format!(
            "{} ({} tokens)",
            duration_compound(ms.value),
            thousands(tokens)
        ),
        None => format!("{} tokens", thousands(tokens)),
    }
}
