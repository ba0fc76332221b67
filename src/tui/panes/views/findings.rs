//! The findings by cost with their fixes and savings, and a finding's rows.

use ratatui::style::Style;
use ratatui::text::{Line, Span};

use crate::tui::app::App;
use crate::tui::theme::Theme;
use crate::tui::view::{duration, shown, thousands, tokens};
use prefixscope_core::analysis::FindingKind;
use prefixscope_core::units::{cause_label_plural, plural};

use super::*;

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
    // How far the savings below are to be trusted, once.
    let savings = all.iter().any(|a| !a.savings.is_empty());
    if savings {
        lines.extend(calibration_line(&app.snapshot.predictions, "", theme));
    }
    let mut at = 0;
    let mut tables: Vec<(Vec<String>, usize)> = Vec::new();
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
            cause_label_plural(prefixscope_core::analysis::advice_cause(f)),
            match advice.fix.owner {
                "client" => "the client's to fix",
                "server" => "the server's doing",
                "provider" => "the provider's doing",
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
        // A setting's saving is over every request, whichever finding it fixes: its table
        // once, under the first finding it fixes, and a line that points there after.
        let table: Vec<String> = advice.savings.iter().map(|s| s.saving_text()).collect();
        match tables
            .iter()
            .find(|(t, _)| !table.is_empty() && *t == table)
        {
            Some((_, first)) => lines.push(Line::styled(
                format!(
                    "   saving: the settings under {first}. above ({})",
                    table.first().map_or("", String::as_str)
                ),
                theme.dim(),
            )),
            None => {
                tables.push((table, i + 1));
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
            }
        }
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
