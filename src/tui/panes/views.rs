//! The full-screen views Enter opens and Esc leaves: a turn (cause, cost, what changed, the
//! fix), a prefix (what it is made of), a client (what it suffered and caused), the findings by
//! cost with their fixes and savings, and a finding's rows. Each is a list of lines built from
//! the snapshot (`*_lines`, also what the tests read), drawn scrolled.

use ratatui::Frame;
use ratatui::layout::{Margin, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};

use crate::tui::app::{App, Dialog};
use crate::tui::theme::Theme;
use crate::tui::view::{cause_label, duration, shown, thousands, tokens};
use prefixscope_core::analysis::{Finding, FindingKind, Measured, Row};
use prefixscope_core::analysis::{Fix, fix};
use prefixscope_core::live::{Prediction, Predictions, Snapshot};
use prefixscope_core::units::{cause_label_plural, plural};

/// The area a view takes: the screen but the status bar (its keys stay in sight).
pub fn area_of(screen: Rect) -> Rect {
    Rect {
        height: screen.height.saturating_sub(1),
        ..screen
    }
}

/// The open view as plain text (for `o`): a name for its file and its lines, unwrapped.
pub fn plain_text(app: &App, theme: &Theme) -> (String, Vec<String>) {
    let text = |lines: Vec<Line>| -> Vec<String> {
        lines
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect()
    };
    match &app.dialog {
        Some(Dialog::Detail { id, .. }) => (
            format!("request-{id}"),
            text(detail_lines_as(app, *id, theme, Written::File)),
        ),
        Some(Dialog::Prefix { index, .. }) => {
            ("prefix".into(), text(prefix_lines(app, *index, theme)))
        }
        Some(Dialog::Client { index, .. }) => {
            ("client".into(), text(client_lines(app, *index, theme)))
        }
        Some(Dialog::Findings { .. }) => ("findings".into(), text(findings_lines(app, 0, theme).0)),
        Some(Dialog::Capacity { .. }) => ("capacity".into(), text(capacity_lines(app, theme))),
        Some(Dialog::WhoCostWhom { .. }) => (
            "who-cost-whom".into(),
            text(who_cost_whom_lines(app, theme)),
        ),
        Some(Dialog::FindingRows { index, .. }) => (
            "finding".into(),
            text(finding_rows_lines(app, *index, 0, theme).0),
        ),
        _ => (String::new(), Vec::new()),
    }
}

pub fn draw(frame: &mut Frame, screen: Rect, app: &App, theme: &Theme) -> bool {
    let (title, lines, scroll): (String, Vec<Line>, u16) = match &app.dialog {
        Some(Dialog::Help { scroll }) => (
            "help: keys, cells, figures (↑ ↓ scroll, any other key closes)".into(),
            super::dialogs::HELP
                .iter()
                .map(|l| {
                    if l.starts_with(' ') || l.is_empty() {
                        Line::raw(*l)
                    } else {
                        Line::styled(*l, theme.title())
                    }
                })
                .collect(),
            *scroll,
        ),
        Some(Dialog::Detail { id, scroll }) => (
            format!("request #{id}"),
            detail_lines(app, *id, theme),
            *scroll,
        ),
        Some(Dialog::Prefix { index, scroll }) => (
            "top prefix".into(),
            prefix_lines(app, *index, theme),
            *scroll,
        ),
        Some(Dialog::Client { index, scroll }) => {
            ("client".into(), client_lines(app, *index, theme), *scroll)
        }
        Some(Dialog::Findings { selected }) => {
            let (lines, at) = findings_lines(app, *selected, theme);
            let height = area_of(screen).height.saturating_sub(2) as usize;
            // The selected finding's first line kept in sight.
            let scroll = at.saturating_sub(height.saturating_sub(6)) as u16;
            ("findings by cost, with fixes".into(), lines, scroll)
        }
        Some(Dialog::Capacity { scroll }) => (
            "the server's settings, simulated".into(),
            capacity_lines(app, theme),
            *scroll,
        ),
        Some(Dialog::WhoCostWhom { scroll }) => (
            "who cost whom (tokens, from evicted_by)".into(),
            who_cost_whom_lines(app, theme),
            *scroll,
        ),
        Some(Dialog::FindingRows { index, selected }) => {
            let (lines, at) = finding_rows_lines(app, *index, *selected, theme);
            let height = area_of(screen).height.saturating_sub(2) as usize;
            let scroll = at.saturating_sub(height.saturating_sub(2)) as u16;
            ("a finding's turns".into(), lines, scroll)
        }
        _ => return false,
    };
    let rect = area_of(screen);
    frame.render_widget(Clear, rect);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(theme.focused_border())
        .title(Span::styled(format!(" {title} "), theme.title()));
    let inner = block.inner(rect);
    frame.render_widget(block, rect);
    let paragraph = Paragraph::new(lines).wrap(Wrap { trim: false });
    // Past the end (End, or a text that got shorter) shows the last page.
    let last = last_scroll(&paragraph, inner);
    frame.render_widget(paragraph.scroll((scroll.min(last), 0)), inner);
    true
}

/// The scroll that shows a paragraph's last page in `inner`.
fn last_scroll(paragraph: &Paragraph, inner: Rect) -> u16 {
    let rows = paragraph.line_count(inner.width);
    u16::try_from(rows.saturating_sub(usize::from(inner.height))).unwrap_or(u16::MAX)
}

/// The scroll that shows the last page of the open view, at the screen size of the last draw
/// (End goes there; ↑ from there moves at once).
pub fn view_end(app: &App, theme: &Theme) -> u16 {
    let lines = match &app.dialog {
        Some(Dialog::Help { .. }) => super::dialogs::HELP.iter().map(|l| Line::raw(*l)).collect(),
        Some(Dialog::Detail { id, .. }) => detail_lines(app, *id, theme),
        Some(Dialog::Prefix { index, .. }) => prefix_lines(app, *index, theme),
        Some(Dialog::Client { index, .. }) => client_lines(app, *index, theme),
        Some(Dialog::Capacity { .. }) => capacity_lines(app, theme),
        Some(Dialog::WhoCostWhom { .. }) => who_cost_whom_lines(app, theme),
        _ => return 0,
    };
    let (width, height) = app.last_size;
    let inner = Rect::new(0, 0, width, height.saturating_sub(1)).inner(Margin::new(1, 1));
    last_scroll(&Paragraph::new(lines).wrap(Wrap { trim: false }), inner)
}

fn measured<T: std::fmt::Display>(m: Option<Measured<T>>) -> String {
    m.map_or("not measured".into(), |m| {
        format!(
            "{} ({})",
            m.value,
            serde_json::to_value(m.source)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        )
    })
}

fn cause_name(cause: prefixscope_core::analysis::BreakCause) -> String {
    serde_json::to_value(cause)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The finding a turn's loss stands for, when no finding of the report names the turn: the same
/// table of fixes then speaks for the one turn.
fn finding_of_turn(row: &Row, cause: &str) -> Finding {
    let location = row.break_location.as_ref();
    let the_clients = row.lost_client.as_ref().is_some_and(|l| l.cause == cause)
        || row.break_cause.is_some_and(|b| cause_name(b) == cause);
    let kind = match cause {
        "system_changed" => FindingKind::VolatileSystemPrompt,
        "side_call" => FindingKind::SideCallOnConversationModel,
        "other_conversation" => FindingKind::OtherConversationEviction,
        "other_model" => FindingKind::OtherModelEviction,
        // The client's breaks (tools, history, any cause the analysis adds) by their cause.
        _ if the_clients => FindingKind::PrefixBreak,
        _ => FindingKind::ServerCacheLoss,
    };
    Finding {
        fix: None,
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
            "engine_cause": row.engine_cause.as_ref().map(|e| e.kind.name()),
            "client_cause": row.client_cause,
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
        (None, None, Some(b)) => cause_name(b),
        (None, None, None) => return None,
    };
    let named = snapshot.advice_ready().and_then(|all| {
        all.iter().find(|a| {
            a.finding.rows.contains(&row.id)
                && prefixscope_core::live::advice_cause(&a.finding) == cause
        })
    });
    if let Some(advice) = named {
        return Some((cause, advice.fix.clone(), advice.savings.clone()));
    }
    let fix = fix(&finding_of_turn(row, &cause));
    let savings = fix
        .levers
        .iter()
        .filter_map(|l| snapshot.predictions.of(*l).cloned())
        .collect();
    Some((cause, fix, savings))
}

/// `−8,175 tokens, −2.1 s` lines of a fix's settings, or why there are none.
fn saving_lines<'a>(
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
                        " (lost {} → {}; {})",
                        thousands(saving.recorded.lost_tokens),
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
            "savings: run prefixscope whatif on the recording; {} records is past the live what-if's {} ({})",
            thousands(*n),
            thousands(prefixscope_core::live::MAX_WHATIF_RECORDS as u64),
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
fn change_lines<'a>(before: &str, after: &str, theme: &Theme) -> Vec<Line<'a>> {
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
fn whole_text_lines<'a>(
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
fn break_text_lines<'a>(
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
            (false, _) => "loss not measured: the server reported no reuse".to_string(),
            (true, Some(cause)) => format!(
                "{}, but nothing was lost (the change came after what could be reused)",
                cause_label(&cause_name(cause))
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
        lines.push(Line::raw(format!(
            "evicted by #{} ({by_alias}{at}, {}): it ran on the cache between this turn and the one before",
            by.row,
            cause_label(&by.kind)
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
    if let Some((cause, fix, savings)) = turn_fix(snapshot, &row) {
        lines.push(Line::from(vec![
            Span::styled("fix: ", theme.title()),
            Span::raw(format!("{} ({})", fix.change, cause_label_plural(&cause))),
        ]));
        lines.extend(saving_lines(&fix, &savings, &snapshot.predictions, theme));
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
            "  prefill ms {} · completion {}",
            measured(c.prefill_ms),
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

pub fn prefix_lines<'a>(app: &App, index: usize, theme: &Theme) -> Vec<Line<'a>> {
    let items = app.prefix_items();
    let Some(p) = items.get(index) else {
        return vec![Line::raw("not in the current view")];
    };
    let mut lines = vec![
        Line::styled(
            format!(
                "{} requests start with the same {}-token prefix",
                thousands(p.count),
                thousands(p.prefix_tokens)
            ),
            theme.title(),
        ),
        Line::raw(format!(
            "reusable: {} tokens ({:.0}% of what every shared prefix could reuse)",
            thousands(p.reusable_tokens),
            p.share_of_reusable * 100.0
        )),
        Line::raw(String::new()),
        Line::styled("what it is made of (profile's description)", theme.title()),
    ];
    match &p.what {
        Some(what) => {
            for part in what.split(" + ") {
                lines.push(Line::raw(format!("  {}", shown(part))));
            }
        }
        None => lines.push(Line::styled(
            "  not known: the input carries no prompts (a trace)",
            theme.dim(),
        )),
    }
    lines
}

pub fn client_lines<'a>(app: &App, index: usize, theme: &Theme) -> Vec<Line<'a>> {
    let Some(l) = app.view().losses.get(index) else {
        return vec![Line::raw("not in the current view")];
    };
    let time = |ms: Option<f64>| ms.map_or("time not measured".into(), duration);
    let mut lines = vec![
        Line::styled(format!("{} ({})", l.alias, shown(&l.client)), theme.title()),
        Line::raw(format!(
            "{} in {}",
            plural(u64::from(l.requests), "request"),
            plural(u64::from(l.conversations), "conversation")
        )),
        Line::raw(String::new()),
        Line::styled(
            format!(
                "suffered: {} tokens, {} (lost on its own turns)",
                thousands(l.tokens),
                time(l.ms)
            ),
            theme.title(),
        ),
    ];
    if l.by_cause.is_empty() {
        lines.push(Line::styled("  nothing", theme.dim()));
    }
    for (cause, tokens) in &l.by_cause {
        lines.push(Line::raw(format!("  {cause}: {}", thousands(*tokens))));
    }
    let mut from: Vec<(String, u64)> = app
        .view()
        .who_cost_whom
        .iter()
        .filter(|(_, v, _)| *v == l.client)
        .map(|(c, _, t)| {
            let who = match c.as_deref() {
                None => "(the server, on its own)".to_string(),
                Some(c) if c == l.client => format!("{} (itself)", app.view().aliases.of(c)),
                Some(c) => app.view().aliases.of(c),
            };
            (who, *t)
        })
        .collect();
    from.sort_by_key(|f| std::cmp::Reverse(f.1));
    if !from.is_empty() {
        lines.push(Line::raw("  from:"));
        for (who, tokens) in from {
            lines.push(Line::raw(format!("    {who}: {}", thousands(tokens))));
        }
    }
    lines.push(Line::raw(String::new()));
    lines.push(Line::styled(
        format!(
            "caused: {} tokens, {} (its own breaks, and the evictions evicted_by names it for)",
            thousands(l.caused_tokens),
            time(l.caused_ms)
        ),
        theme.title(),
    ));
    if l.caused_by_cause.is_empty() {
        lines.push(Line::styled("  nothing", theme.dim()));
    }
    for (cause, tokens) in &l.caused_by_cause {
        lines.push(Line::raw(format!("  {cause}: {}", thousands(*tokens))));
    }
    if !l.caused_to.is_empty() {
        lines.push(Line::raw("  to:"));
        let aliases = app.snapshot.view.aliases.clone();
        for (victim, tokens) in &l.caused_to {
            let whom = if *victim == l.client {
                format!("{} (itself)", aliases.of(victim))
            } else {
                aliases.of(victim)
            };
            lines.push(Line::raw(format!("    {whom}: {}", thousands(*tokens))));
        }
    }
    lines
}

/// The findings view's lines, and the line where the selected finding starts.
pub fn findings_lines<'a>(app: &App, selected: usize, theme: &Theme) -> (Vec<Line<'a>>, usize) {
    let Some(all) = app.snapshot.advice_ready() else {
        return (
            vec![Line::styled(
                "working out the findings and the simulated server's savings…",
                theme.dim(),
            )],
            0,
        );
    };
    if all.is_empty() {
        return (vec![Line::styled("no findings yet", theme.dim())], 0);
    }
    let mut lines = vec![Line::styled(
        "what cost the most first; each with what to change, and where a server setting can fix it, what the simulated llama-server predicts it saves",
        theme.dim(),
    )];
    if !app.view().header.filter.is_empty() {
        lines.push(Line::styled("(unfiltered: every request)", theme.dim()));
    }
    let mut at = 0;
    for (i, advice) in all.iter().enumerate() {
        lines.push(Line::raw(String::new()));
        if i == selected {
            at = lines.len();
        }
        let f = &advice.finding;
        let cost = match (f.lost_tokens, f.lost_ms) {
            (Some(t), Some(ms)) => {
                format!("{} tok, {}", thousands(u64::from(t)), duration(ms.value))
            }
            (Some(t), None) => format!("{} tok", thousands(u64::from(t))),
            (None, _) => match f.context_tokens {
                Some(t) => format!("{} context tokens", thousands(u64::from(t))),
                None => "not measured".into(),
            },
        };
        let head = format!(
            "{}. {} · {cost} · {}",
            i + 1,
            cause_label_plural(prefixscope_core::live::advice_cause(f)),
            match advice.fix.owner {
                "client" => "the client's to fix",
                "server" => "the server's doing",
                _ => "the server's settings",
            }
        );
        let style = if i == selected {
            theme.selected()
        } else {
            theme.title()
        };
        lines.push(Line::styled(head, style));
        lines.push(Line::raw(format!("   {}", shown(&advice.label))));
        if f.kind == FindingKind::VolatileSystemPrompt
            && let (Some(b), Some(a)) = (
                f.evidence.get("before").and_then(|v| v.as_str()),
                f.evidence.get("after").and_then(|v| v.as_str()),
            )
        {
            lines.push(Line::raw(format!(
                "   at character {} of the system prompt:",
                f.evidence
                    .get("char_offset")
                    .and_then(|v| v.as_u64())
                    .map_or("?".into(), thousands)
            )));
            lines.extend(change_lines(b, a, theme).into_iter().map(|mut l| {
                l.spans.insert(0, Span::raw(" "));
                l
            }));
        }
        lines.push(Line::from(vec![
            Span::styled("   fix: ", theme.title()),
            Span::raw(advice.fix.change.clone()),
        ]));
        lines.extend(
            saving_lines(
                &advice.fix,
                &advice.savings,
                &app.snapshot.predictions,
                theme,
            )
            .into_iter()
            .map(|mut l| {
                l.spans.insert(0, Span::raw(" "));
                l
            }),
        );
        if !f.rows.is_empty() {
            lines.push(Line::styled(
                format!("   ↵ its {}", plural(f.rows.len() as u64, "request")),
                theme.dim(),
            ));
        }
    }
    (lines, at)
}

pub fn finding_rows_lines<'a>(
    app: &App,
    index: usize,
    selected: usize,
    theme: &Theme,
) -> (Vec<Line<'a>>, usize) {
    let Some(advice) = app.snapshot.advice_ready().and_then(|a| a.get(index)) else {
        return (vec![Line::raw("not in the current view")], 0);
    };
    let mut lines = vec![
        Line::styled(shown(&advice.label), theme.title()),
        Line::styled("↵ a request's detail · Esc back", theme.dim()),
    ];
    let mut at = 0;
    // Only the rows around the selected one are looked up (a finding may name thousands).
    const AROUND: usize = 100;
    let rows = &advice.finding.rows;
    let from = selected.saturating_sub(AROUND);
    let to = (selected + AROUND).min(rows.len());
    if from > 0 || to < rows.len() {
        lines.push(Line::styled(
            format!(
                "requests {}–{} of {}",
                from + 1,
                to,
                thousands(rows.len() as u64)
            ),
            theme.dim(),
        ));
    }
    for (i, id) in rows.iter().enumerate().take(to).skip(from) {
        let text = match app.snapshot.row(*id) {
            Some(row) => {
                let lost: u32 = [&row.lost_client, &row.lost_external]
                    .into_iter()
                    .flatten()
                    .map(|l| l.tokens)
                    .sum();
                format!(
                    "#{id} {} {} · lost {}",
                    app.snapshot.view.aliases.clone().of(&row.client),
                    match (row.conversation, row.turn) {
                        (Some(c), Some(t)) => format!("c{c} t{t}"),
                        _ => format!("{:?}", row.kind).to_lowercase(),
                    },
                    tokens(u64::from(lost))
                )
            }
            None => format!("#{id}"),
        };
        if i == selected {
            at = lines.len();
        }
        lines.push(Line::styled(
            text,
            if i == selected {
                theme.selected()
            } else {
                Style::default()
            },
        ));
    }
    (lines, at)
}

/// The capacity view in llama.cpp's terms: hit rate and tokens and seconds lost under the
/// simulated llama-server at `-np` 1/2/4/8 × `--cache-ram` off/on, each `prefixscope whatif FILE
/// --slots N --cache-ram …` on the same records, beside what the real server reported.
pub fn capacity_lines<'a>(app: &App, theme: &Theme) -> Vec<Line<'a>> {
    // The real server's settings as it says them (its probes), then the simulated ones.
    let server = &app.snapshot.server;
    let mut said = vec![Line::styled(server.line(), theme.dim())];
    let slots = server.slot_texts();
    if !slots.is_empty() {
        said.push(Line::styled(
            format!("slots now: {}", slots.join(" · ")),
            theme.dim(),
        ));
    }
    said.extend(simulated_capacity_lines(app, theme));
    said
}

fn simulated_capacity_lines<'a>(app: &App, theme: &Theme) -> Vec<Line<'a>> {
    let predictions = &app.snapshot.predictions;
    let Predictions::Ready(all) = &**predictions else {
        let why = match &**predictions {
            Predictions::NotAsked => "working out the simulated server's settings…".to_string(),
            Predictions::TooMany(n) => format!(
                "run prefixscope whatif FILE --slots N --cache-ram on|off; {} records is past the live what-if's {} ({})",
                thousands(*n),
                thousands(prefixscope_core::live::MAX_WHATIF_RECORDS as u64),
                prefixscope_core::live::WHATIF_CAP_COST
            ),
            _ => "the simulated llama-server replays llama.cpp's chat requests with the server's counts only"
                .to_string(),
        };
        return vec![Line::styled(why, theme.dim())];
    };
    let Some(first) = all.first() else {
        return Vec::new();
    };
    let mut lines = vec![
        Line::styled(
            format!(
                "{} replayed in the order they reached the server (prefixscope whatif FILE --slots N --cache-ram off|on)",
                plural(first.replayed as u64, "request")
            ),
            theme.dim(),
        ),
        Line::styled(
            format!(
                "the real server: {}, {}",
                first
                    .recorded_hit_rate
                    .map_or("reuse not reported".into(), |h| format!(
                        "{:.1}% reused",
                        h * 100.0
                    )),
                // A loss is measured only with the server's timings (llmp's rule): without
                // them it is not measured, never zero.
                first.recorded.lost_ms.map_or(
                    "loss not measured (no reuse and timing counts)".into(),
                    |ms| format!(
                        "lost {} tokens, {}",
                        thousands(first.recorded.lost_tokens),
                        duration(ms)
                    )
                )
            ),
            theme.title(),
        ),
        Line::raw(String::new()),
    ];
    // The recording does not say how the server was set up: the setting whose prediction is
    // nearest what the server reported is marked.
    let nearest = predictions.nearest().map(|p| p.lever);
    lines.push(Line::styled(
        format!("{:<8}{:<32}{}", "", "--cache-ram off", "--cache-ram on"),
        theme.dim(),
    ));
    lines.push(Line::styled(
        format!(
            "{:<8}{:<32}{}",
            "slots", "reused    lost     time", "reused    lost     time"
        ),
        theme.dim(),
    ));
    for slots in [1usize, 2, 4, 8] {
        let cell = |cache_ram: bool| -> (String, bool) {
            let lever = prefixscope_core::analysis::Lever::of_settings(slots, cache_ram);
            match all.iter().find(|p| p.lever == lever) {
                Some(p) => (
                    format!(
                        "{:>5.1}% {:>7} {:>8}{}",
                        p.hit_rate * 100.0,
                        tokens(p.predicted.lost_tokens),
                        p.predicted.lost_ms.map_or("-".into(), duration),
                        if nearest == Some(lever) { " ◀" } else { "" }
                    ),
                    nearest == Some(lever),
                ),
                None => ("-".into(), false),
            }
        };
        let (off, off_near) = cell(false);
        let (on, on_near) = cell(true);
        let style = |near: bool| {
            if near {
                theme.title()
            } else {
                Style::default()
            }
        };
        lines.push(Line::from(vec![
            Span::raw(format!("{:<8}", format!("-np {slots}"))),
            Span::styled(format!("{off:<32}"), style(off_near)),
            Span::styled(on, style(on_near)),
        ]));
    }
    lines.push(Line::raw(String::new()));
    lines.push(Line::styled(
        "◀ the setting whose prediction is nearest what the server reported (the recording does not say how it was set up)",
        theme.dim(),
    ));
    lines.push(Line::styled(
        "-np: llama-server's slots (one conversation's cache each); --cache-ram: its host-memory prompt cache, unbounded here",
        theme.dim(),
    ));
    lines.extend(slot_lines(app, theme));
    lines
}

/// Who holds each slot now, as the replay with the server's settings has it, how often that
/// replay matched what the server reported, and what each conversation's next request would
/// evict: a reconstruction, said as one.
fn slot_lines<'a>(app: &App, theme: &Theme) -> Vec<Line<'a>> {
    let Some(view) = &*app.snapshot.slots else {
        return Vec::new();
    };
    let r = &view.residency;
    let aliases = &app.view().aliases;
    let who = |conversation: Option<u32>, client: &str, record: u64| match conversation {
        Some(c) => format!("c{c} {} (#{record})", aliases.of(client)),
        None => format!("#{record} {} (no conversation)", aliases.of(client)),
    };
    let mut lines = vec![
        Line::raw(String::new()),
        Line::styled(
            format!(
                "who holds each slot, replayed at -np {} --cache-ram {} ({})",
                r.slots,
                if r.cache_ram { "on" } else { "off" },
                view.source
            ),
            theme.title(),
        ),
    ];
    for (slot, holder) in r.holders.iter().enumerate() {
        lines.push(Line::raw(format!(
            "  slot {slot}  {}",
            holder.as_ref().map_or("empty".to_string(), |h| who(
                h.conversation,
                &h.client,
                h.record
            ))
        )));
    }
    if r.cache_ram {
        lines.push(Line::raw(format!(
            "  host cache  {}",
            plural(r.host_prompts as u64, "prompt")
        )));
    }
    let (compared, agreed) = r
        .calibration
        .iter()
        .fold((0, 0), |(c, a), m| (c + m.compared, a + m.agreed));
    lines.push(Line::styled(
        if compared == 0 {
            "  calibration: not measured (no request with the server's reuse count)".to_string()
        } else {
            let disagreed: Vec<String> = r
                .disagreements
                .iter()
                .take(6)
                .map(|(id, _, _)| format!("#{id}"))
                .collect();
            format!(
                "  calibration: the replay matched the server's reuse on {agreed} of {compared} requests{}",
                if disagreed.is_empty() {
                    String::new()
                } else {
                    format!("; not on {}", disagreed.join(" "))
                }
            )
        },
        theme.dim(),
    ));
    // Requests in flight: predicted from their bodies as they started, before the server answered.
    for start in r.starting.iter().take(4) {
        let whose = match start.conversation {
            Some(c) => format!("c{c} {}", aliases.of(&start.client)),
            None => "a new conversation".to_string(),
        };
        let slot = if start.queued {
            format!("waits, then slot {}", start.slot)
        } else {
            format!("slot {}", start.slot)
        };
        let place = match &start.evicts {
            Some(evicts) => format!(
                "{slot}, evicting {}{} (predicted; reuses {:.0}%)",
                who(evicts.conversation, &evicts.client, evicts.record),
                if start.saved_to_host {
                    ", saved to host memory"
                } else {
                    ""
                },
                start.reused_share * 100.0
            ),
            None => format!(
                "{slot} (predicted; reuses {:.0}%)",
                start.reused_share * 100.0
            ),
        };
        let line = format!("  in flight: #{} of {whose} → {place}", start.record);
        lines.push(if start.evicts.is_some() && !start.saved_to_host {
            Line::styled(line, theme.warn())
        } else {
            Line::raw(line)
        });
    }
    for next in r.next_evictions.iter().take(4) {
        lines.push(Line::raw(format!(
            "  next: a request of c{} {} takes slot {} from {}{}",
            next.conversation,
            aliases.of(&next.client),
            next.slot,
            who(
                next.evicts.conversation,
                &next.evicts.client,
                next.evicts.record
            ),
            if next.saved_to_host {
                ", saved to host memory"
            } else {
                ""
            }
        )));
    }
    lines
}

/// Who cost whom: a row per client that caused a loss (the server for its own), a column per
/// client that suffered one, tokens in each cell; a client's own breaks on the diagonal.
pub fn who_cost_whom_lines<'a>(app: &App, theme: &Theme) -> Vec<Line<'a>> {
    let view = app.view();
    let aliases = &view.aliases;
    let name = |c: &Option<String>| {
        c.as_deref()
            .map_or("(server)".to_string(), |c| aliases.of(c))
    };
    // Clients in the Loss pane's order (by cost), then any other.
    let mut victims: Vec<&str> = view.losses.iter().map(|l| l.client.as_str()).collect();
    let mut causers: Vec<Option<&str>> = victims.iter().map(|v| Some(*v)).collect();
    for (c, v, _) in &view.who_cost_whom {
        if !victims.contains(&v.as_str()) {
            victims.push(v);
        }
        if !causers.contains(&c.as_deref()) {
            causers.push(c.as_deref());
        }
    }
    let tokens_of = |c: Option<&str>, v: &str| -> u64 {
        view.who_cost_whom
            .iter()
            .filter(|(cc, vv, _)| cc.as_deref() == c && vv == v)
            .map(|e| e.2)
            .sum()
    };
    causers.retain(|c| victims.iter().any(|v| tokens_of(*c, v) > 0));
    if causers.is_empty() {
        return vec![Line::styled("nothing lost yet", theme.dim())];
    }
    let width = victims
        .iter()
        .map(|v| aliases.of(v).chars().count())
        .max()
        .unwrap_or(6)
        .clamp(7, 12);
    let first = causers
        .iter()
        .map(|c| name(&c.map(str::to_string)).chars().count())
        .max()
        .unwrap_or(8)
        .clamp(8, 16);
    // Cut the user agent, never the `#2` that tells two clients apart.
    let fit = |s: String, w: usize| match s.rsplit_once(" #") {
        Some((agent, n)) if s.chars().count() > w && n.len() + 3 < w => {
            format!("{} #{n}", super::fit(agent, w - n.len() - 2))
        }
        _ => super::fit(&s, w),
    };
    let mut lines = vec![
        Line::styled(
            "a row per client that caused the loss, a column per client that lost it; where both meet: its own breaks, and its own conversations evicting each other",
            theme.dim(),
        ),
        Line::raw(String::new()),
    ];
    let mut head = format!("{:<first$} ", "caused by");
    head = fit(head, first + 1);
    for v in &victims {
        head.push_str(&format!(" {:>width$}", fit(aliases.of(v), width)));
    }
    head.push_str(&format!(" {:>8}", "caused"));
    lines.push(Line::styled(head, theme.title()));
    for c in &causers {
        let mut row = format!("{:<first$} ", fit(name(&c.map(str::to_string)), first));
        let mut total = 0;
        for v in &victims {
            let t = tokens_of(*c, v);
            total += t;
            row.push_str(&format!(
                " {:>width$}",
                if t == 0 { "·".to_string() } else { tokens(t) }
            ));
        }
        row.push_str(&format!(" {:>8}", tokens(total)));
        lines.push(Line::raw(row));
    }
    let mut row = format!("{:<first$} ", "suffered");
    let mut all = 0;
    for v in &victims {
        let t: u64 = causers.iter().map(|c| tokens_of(*c, v)).sum();
        all += t;
        row.push_str(&format!(" {:>width$}", tokens(t)));
    }
    row.push_str(&format!(" {:>8}", tokens(all)));
    lines.push(Line::styled(row, theme.title()));
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text_of(lines: &[Line]) -> Vec<String> {
        lines
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect()
    }

    /// A line per line of the text, the change highlighted across a line break (drawn as `⏎`
    /// on screen, left out of the file), and what was not kept said at the end.
    #[test]
    fn whole_text_keeps_its_lines_highlights_the_change_and_says_what_was_cut() {
        let theme = Theme { color: true };
        let lines = whole_text_lines("one\ntwo\tx\nthree", 1_234, 2..6, Written::Screen, &theme);
        assert_eq!(
            text_of(&lines),
            ["one⏎", "two⇥x", "three", "… 1,234 more bytes not kept"]
        );
        let changed: Vec<&str> = lines
            .iter()
            .flat_map(|l| &l.spans)
            .filter(|s| s.style == theme.changed())
            .map(|s| s.content.as_ref())
            .collect();
        assert_eq!(changed, ["e⏎", "tw"]);
        let file = whole_text_lines("one\ntwo\tx", 0, 2..6, Written::File, &theme);
        assert_eq!(text_of(&file), ["one", "two\tx"]);
    }
}
