//! The turn view: its cause and cost, what changed (before and after), the fix and what it
//! saves, the counts with their source.

use ratatui::text::{Line, Span};

use crate::tui::app::App;
use crate::tui::theme::Theme;
use crate::tui::view::{cause_label, duration, shown, thousands};
use prefixscope_core::analysis::{Finding, FindingKind, Row};
use prefixscope_core::analysis::{Fix, fix};
use prefixscope_core::live::{Prediction, Predictions, Snapshot};
use prefixscope_core::units::{cause_label_plural, plural};

use super::*;

/// The finding a turn's loss stands for, when no finding of the report names the turn: the same
/// table of fixes then speaks for the one turn.
pub(super) fn finding_of_turn(row: &Row, cause: &str) -> Finding {
    let location = row.break_location.as_ref();
    let the_clients = row.lost_client.as_ref().is_some_and(|l| l.cause == cause)
        || row.break_cause.is_some_and(|b| b.name() == cause);
    let kind = match cause {
        "system_changed" => FindingKind::VolatileSystemPrompt,
        // The client's breaks (tools, history, any cause the analysis adds) by their cause.
        cause => FindingKind::of_loss(cause, the_clients),
    };
    Finding {
        fix: None,
        lost_usd: None,
        kind,
        model: Some(row.model.clone()),
        client: Some(row.client.clone()),
        rows: vec![row.id],
        lost_tokens: None,
        lost_ms: None,
        context_tokens: None,
        confidence: prefixscope_core::analysis::Confidence::Low,
        evidence: serde_json::json!({
            "break_cause": cause,
            "before": location.and_then(|l| l.before.clone()),
            "after": location.and_then(|l| l.after.clone()),
            "engine_cause": row.engine_cause.as_ref().map(|e| e.kind),
            "client_cause": row.client_cause,
            "kind": cause,
            "provider": row.provider,
        }),
    }
}

/// The fix for a turn's costliest loss, and the savings of its server settings (over all the
/// traffic so far): the report's finding naming the turn where there is one.
pub fn turn_fix(snapshot: &Snapshot, row: &Row) -> Option<(String, Fix, Vec<Prediction>)> {
    let client = row
        .lost_client
        .as_ref()
        .map(|l| (l.tokens, l.cause.clone()));
    let external = row
        .lost_external
        .as_ref()
        .map(|l| (l.tokens, l.cause.clone()));
    let cause = match (client, external, row.break_cause) {
        (Some(c), Some(e), _) => {
            if e.0 > c.0 {
                e.1
            } else {
                c.1
            }
        }
        (Some(c), None, _) => c.1,
        (None, Some(e), _) => e.1,
        (None, None, Some(b)) => b.name().to_string(),
        (None, None, None) => return None,
    };
    let named = snapshot.advice_ready().and_then(|all| {
        all.iter().find(|a| {
            a.finding.rows.contains(&row.id)
                && prefixscope_core::analysis::advice_cause(&a.finding) == cause
        })
    });
    if let Some(advice) = named {
        return Some((cause, advice.fix.clone(), advice.savings.clone()));
    }
    let fix = fix(&finding_of_turn(row, &cause));
    let savings = fix
        .levers
        .iter()
        .filter_map(|l| snapshot.predictions.saving(*l).cloned())
        .collect();
    Some((cause, fix, savings))
}

/// How far the predictions are to be trusted (`Baseline::line`) after `indent`, marked when
/// they are not.
pub(super) fn calibration_line<'a>(
    predictions: &Predictions,
    indent: &str,
    theme: &Theme,
) -> Option<Line<'a>> {
    let baseline = predictions.baseline()?;
    let style = if baseline.trusted() {
        theme.dim()
    } else {
        theme.warn()
    };
    Some(Line::styled(format!("{indent}{}", baseline.line()), style))
}

/// `−8,175 tokens, −2.1 s` lines of a fix's settings, or why there are none.
pub(super) fn saving_lines<'a>(
    fix: &Fix,
    savings: &[Prediction],
    predictions: &Predictions,
    theme: &Theme,
) -> Vec<Line<'a>> {
    if fix.levers.is_empty() {
        return Vec::new();
    }
    if !savings.is_empty() {
        let replayed = savings.first().map_or(0, |s| s.replayed);
        let mut lines = vec![Line::styled(
            format!(
                "  saving predicted by the simulated llama-server over {} so far (prefixscope whatif FILE and the flags):",
                plural(replayed as u64, "request")
            ),
            theme.dim(),
        )];
        for saving in savings {
            lines.push(Line::from(vec![
                Span::styled(format!("    {}", saving.saving_text()), theme.good()),
                Span::styled(
                    format!(
                        " (simulated: lost {} → {}; {})",
                        thousands(saving.baseline.predicted.lost_tokens),
                        thousands(saving.predicted.lost_tokens),
                        saving.lever.whatif_args()
                    ),
                    theme.dim(),
                ),
            ]));
        }
        return lines;
    }
    let why = match predictions {
        Predictions::NotAsked => "savings: f opens the findings and works them out".to_string(),
        Predictions::TooMany(n) => format!(
            "savings: run prefixscope whatif on the recording; {} records is past the live what-if's {} or {} MiB of bodies ({})",
            thousands(*n),
            thousands(prefixscope_core::live::MAX_WHATIF_RECORDS as u64),
            prefixscope_core::live::MAX_WHATIF_BODY_BYTES >> 20,
            prefixscope_core::live::WHATIF_CAP_COST
        ),
        Predictions::NotReplayable => {
            "savings: the simulated llama-server replays llama.cpp's chat requests with counts only"
                .to_string()
        }
        Predictions::Ready(_) => String::new(),
    };
    if why.is_empty() {
        Vec::new()
    } else {
        vec![Line::styled(format!("  {why}"), theme.dim())]
    }
}

/// Before and after on their own lines, as written, the span that differs highlighted.
pub(super) fn change_lines<'a>(before: &str, after: &str, theme: &Theme) -> Vec<Line<'a>> {
    let (b, a): (Vec<char>, Vec<char>) = (before.chars().collect(), after.chars().collect());
    let head = b.iter().zip(&a).take_while(|(x, y)| x == y).count();
    let tail = b[head..]
        .iter()
        .rev()
        .zip(a[head..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let split = |text: &[char]| -> [String; 3] {
        let end = text.len() - tail;
        [
            text[..head].iter().collect(),
            text[head..end].iter().collect(),
            text[end..].iter().collect(),
        ]
    };
    let line = |label: &'static str, parts: [String; 3]| {
        Line::from(vec![
            Span::raw(label),
            Span::raw(shown(&parts[0])),
            Span::styled(shown(&parts[1]), theme.changed()),
            Span::raw(shown(&parts[2])),
        ])
    };
    vec![line("  before: ", split(&b)), line("  after:  ", split(&a))]
}

/// Where a view's lines go: the screen (line breaks and tabs drawn as `⏎` `⇥` where they are
/// part of the change), or a file (`o`: the texts as written, only control characters escaped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    Screen,
    File,
}

/// The whole text of one version of the changed message, a line per line of it, the characters
/// `changed` (a range of the whole text) highlighted, and what was not kept of it.
pub(super) fn whole_text_lines<'a>(
    text: &str,
    cut: usize,
    changed: std::ops::Range<usize>,
    written: Written,
    theme: &Theme,
) -> Vec<Line<'a>> {
    let mut lines: Vec<Line> = Vec::new();
    let mut spans: Vec<Span> = Vec::new();
    let mut run = String::new();
    let mut run_changed = false;
    let flush = |run: &mut String, changed: bool, spans: &mut Vec<Span<'a>>| {
        if run.is_empty() {
            return;
        }
        let text = match written {
            Written::Screen => shown(run),
            Written::File => prefixscope_core::text::printable(run).into_owned(),
        };
        spans.push(if changed {
            Span::styled(text, theme.changed())
        } else {
            Span::raw(text)
        });
        run.clear();
    };
    for (i, c) in text.chars().enumerate() {
        let in_change = changed.contains(&i);
        if in_change != run_changed {
            flush(&mut run, run_changed, &mut spans);
            run_changed = in_change;
        }
        if c == '\n' {
            // A changed line break is drawn, so an added or removed line shows.
            if in_change && written == Written::Screen {
                run.push('⏎');
            }
            flush(&mut run, run_changed, &mut spans);
            lines.push(Line::from(std::mem::take(&mut spans)));
        } else {
            run.push(c);
        }
    }
    flush(&mut run, run_changed, &mut spans);
    lines.push(Line::from(spans));
    if cut > 0 {
        lines.push(Line::styled(
            format!("… {} more bytes not kept", thousands(cut as u64)),
            theme.dim(),
        ));
    }
    lines
}

/// Both whole versions of the changed message, each under a heading saying its size.
pub(super) fn break_text_lines<'a>(
    texts: &prefixscope_core::analysis::BreakTexts,
    message: Option<u32>,
    written: Written,
    theme: &Theme,
) -> Vec<Line<'a>> {
    let mut lines = Vec::new();
    let message = message.map_or(String::new(), |m| format!(" {m}"));
    for (which, text, cut) in [
        ("before", &texts.before, texts.before_cut),
        ("after", &texts.after, texts.after_cut),
    ] {
        let chars = text.chars().count();
        // The change in this version: after the shared head, before the shared tail (of the
        // whole text; a cut text may end before it).
        let whole_chars = if cut == 0 { chars } else { usize::MAX };
        let end = whole_chars.saturating_sub(texts.tail).max(texts.head);
        lines.push(Line::raw(String::new()));
        lines.push(Line::styled(
            format!(
                "message{message} {which}, whole ({}{}):",
                plural(text.len() as u64 + cut as u64, "byte"),
                if cut > 0 {
                    format!(", the first {} kept", thousands(text.len() as u64))
                } else {
                    String::new()
                }
            ),
            theme.title(),
        ));
        lines.extend(whole_text_lines(text, cut, texts.head..end, written, theme));
    }
    lines
}

pub fn detail_lines<'a>(app: &App, id: u64, theme: &Theme) -> Vec<Line<'a>> {
    detail_lines_as(app, id, theme, Written::Screen)
}

pub fn detail_lines_as<'a>(app: &App, id: u64, theme: &Theme, written: Written) -> Vec<Line<'a>> {
    let snapshot = &app.snapshot;
    let Some(row) = snapshot.row(id) else {
        return vec![Line::raw("not in the current view")];
    };
    let alias = snapshot.view.aliases.clone().of(&row.client);
    let mut lines: Vec<Line> = Vec::new();
    let place = match (row.conversation, row.turn) {
        (Some(c), Some(t)) => format!("c{c} turn {t}"),
        _ => format!("{:?}", row.kind).to_lowercase(),
    };
    lines.push(Line::styled(
        format!("{alias} {place} · request #{id} · {}", row.model),
        theme.title(),
    ));
    // Cause and cost first: what the user came for.
    let prompt = row.counts.prompt_tokens.map(|p| p.value);
    let mut lossy = false;
    for loss in [&row.lost_client, &row.lost_external].into_iter().flatten() {
        lossy = true;
        let share = match prompt {
            Some(p) if p > 0 => format!(
                " ({:.0}% of its {} prompt tokens)",
                100.0 * f64::from(loss.tokens) / f64::from(p),
                thousands(u64::from(p))
            ),
            _ => String::new(),
        };
        lines.push(Line::from(vec![
            Span::styled(format!("{}: ", cause_label(&loss.cause)), theme.bad()),
            Span::raw(format!(
                "lost {}, {}{share}",
                plural(u64::from(loss.tokens), "token"),
                loss.ms
                    .map_or("time not measured".into(), |m| duration(m.value))
            )),
        ]));
    }
    if !lossy {
        let text = match (row.loss_measured, row.break_cause) {
            // Which count is missing, in the server's terms: a first turn has nothing to lose.
            (false, _) if row.linked_to.is_none() => {
                "nothing to lose: no earlier request shares its start".to_string()
            }
            (false, _) if row.counts.reused_tokens.is_none() => {
                "loss not measured: the server reported no reuse".to_string()
            }
            (false, _) => "loss not measured: the server reported no prefill time".to_string(),
            (true, Some(cause)) => format!(
                "{}, but nothing was lost (the change came after what could be reused)",
                cause_label(cause.name())
            ),
            (true, None) => "nothing lost".to_string(),
        };
        lines.push(Line::styled(text, theme.good()));
    }
    if let Some(by) = &row.evicted_by {
        let evictor = snapshot.row(by.row);
        let at = evictor
            .as_ref()
            .and_then(|e| Some(format!(" c{} t{}", e.conversation?, e.turn?)))
            .unwrap_or_default();
        let by_alias = snapshot.view.aliases.clone().of(&by.client);
        let key = if written == Written::Screen {
            ", v opens it"
        } else {
            ""
        };
        lines.push(Line::raw(format!(
            "evicted by #{} ({by_alias}{at}, {}{key}): it ran on the cache between this turn and the one before",
            by.row,
            cause_label(&by.kind)
        )));
    }
    // A subagent's turn: the request whose tool call its conversation answers.
    if let Some(parent) = spawner_of(app, &row) {
        let place = snapshot
            .row(parent)
            .and_then(|p| {
                Some(format!(
                    " ({} c{} t{})",
                    snapshot.view.aliases.clone().of(&p.client),
                    p.conversation?,
                    p.turn?
                ))
            })
            .unwrap_or_default();
        let key = if written == Written::Screen {
            ", u opens it"
        } else {
            ""
        };
        lines.push(Line::raw(format!(
            "subagent: its conversation answers the tool call of #{parent}{place}{key}"
        )));
    }
    // The cause by the name users know it (`client_cause`), and the engine's, with its evidence.
    if let Some(named) = row
        .client_cause
        .as_deref()
        .and_then(prefixscope_core::analysis::client_cause_label)
    {
        lines.push(Line::raw(format!("the client's: {named}")));
    }
    if let Some(engine) = &row.engine_cause {
        lines.push(Line::raw(format!(
            "the engine's, likely: {}: {}",
            engine.kind.label(),
            engine.evidence
        )));
    }
    // A hosted provider's rule that kept the prefix out of its cache (too short, no marker,
    // the lifetime past): what the provider did, in its terms.
    if let Some(uncached) = &row.uncached {
        lines.push(Line::raw(format!("the provider's: {}", uncached.text())));
    }
    if let Some((cause, fix, savings)) = turn_fix(snapshot, &row) {
        lines.push(Line::from(vec![
            Span::styled("fix: ", theme.title()),
            Span::raw(format!("{} ({})", fix.change, cause_label_plural(&cause))),
        ]));
        lines.extend(saving_lines(&fix, &savings, &snapshot.predictions, theme));
        if !savings.is_empty() {
            lines.extend(calibration_line(&snapshot.predictions, "    ", theme));
        }
    }
    if let Some(at) = &row.break_location {
        lines.push(Line::raw(String::new()));
        lines.push(Line::styled("what changed", theme.title()));
        lines.push(Line::raw(format!(
            "  message {} ({}), character {}",
            at.message.map_or("-".into(), |m| m.to_string()),
            at.role.as_deref().unwrap_or("-"),
            at.char_offset
                .map_or("-".into(), |o| thousands(u64::from(o)))
        )));
        match (&at.before, &at.after) {
            (Some(b), Some(a)) => {
                lines.extend(change_lines(b, a, theme));
                if at.texts.is_some() {
                    lines.push(Line::styled(
                        "  both whole texts are below (↓ PgDn End; o writes them to a file)",
                        theme.dim(),
                    ));
                }
            }
            (Some(b), None) => lines.push(Line::raw(format!("  before: {}", shown(b)))),
            (None, Some(a)) => lines.push(Line::raw(format!("  after:  {}", shown(a)))),
            (None, None) => {}
        }
        if !at.tools_added.is_empty() || !at.tools_removed.is_empty() {
            lines.push(Line::raw(format!(
                "  tools added: {} · removed: {}",
                if at.tools_added.is_empty() {
                    "-".into()
                } else {
                    at.tools_added.join(", ")
                },
                if at.tools_removed.is_empty() {
                    "-".into()
                } else {
                    at.tools_removed.join(", ")
                }
            )));
        }
        if let (Some(h), Some(t)) = (at.head_matched, at.tail_matched) {
            lines.push(Line::raw(format!(
                "  digest mode: head {}, tail {}",
                if h { "same" } else { "changed" },
                if t { "same" } else { "changed" }
            )));
        }
    }
    let c = &row.counts;
    lines.push(Line::raw(String::new()));
    lines.push(Line::styled(
        "counts (and where each came from)",
        theme.title(),
    ));
    for text in [
        format!(
            "  prompt {} · reused {} · evaluated {}",
            measured(c.prompt_tokens),
            measured(c.reused_tokens),
            measured(c.evaluated_tokens)
        ),
        format!(
            "  prefill {} · completion {}",
            // Milliseconds as a person reads them (`186.7 ms`), not the float's digits.
            measured(c.prefill_ms.map(|m| Measured {
                value: duration(m.value),
                source: m.source,
            })),
            measured(c.completion_tokens)
        ),
        format!(
            "  composition: system {} · tools {} · history {} · new {}",
            row.composition.system.value,
            row.composition.tools.value,
            row.composition.history.value,
            row.composition.new_content.value
        ),
        format!(
            "  linked to {} · prefix {} tokens · predicted reuse {} · observed {}",
            row.linked_to.map_or("-".into(), |l| format!("#{l}")),
            row.prefix_tokens.map_or("-".into(), |p| p.to_string()),
            row.predicted_reuse
                .map_or("-".into(), |r| format!("{:.0}%", r * 100.0)),
            row.observed_reuse
                .map_or("-".into(), |r| format!("{:.0}%", r * 100.0))
        ),
        format!("  client (user agent and label): {}", shown(&row.client)),
    ] {
        lines.push(Line::raw(text));
    }
    // The whole texts last: they may be long, and the figures above stay on the first page.
    if let Some(at) = &row.break_location
        && let Some(texts) = &at.texts
    {
        lines.extend(break_text_lines(texts, at.message, written, theme));
    }
    lines
}

/// The request whose tool call `row`'s conversation answers as a subagent, if it is one.
pub fn spawner_of(app: &App, row: &prefixscope_core::analysis::Row) -> Option<u64> {
    let conversation = row.conversation?;
    app.view()
        .lanes
        .iter()
        .find(|lane| lane.conversation == conversation)?
        .spawned_by
}
