//! Loss per client, by cost: what each client suffered (lost on its own turns) next to what it
//! caused (its own breaks, and the evictions `evicted_by` names it for), with its causes; the
//! losses no client caused (the server's own) on a line of their own.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{fit, fit_name};
use crate::tui::app::App;
use crate::tui::theme::Theme;
use crate::tui::ui::{empty, line_style, window};
use crate::tui::view::{duration, tokens};

/// `1 token`, `8,759 tokens`, `12.3K tokens`.
fn token_count(n: u64) -> String {
    if n == 1 {
        "1 token".into()
    } else {
        format!("{} tokens", tokens(n))
    }
}

pub fn draw(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    selected: usize,
    focused: bool,
    theme: &Theme,
) {
    let view = app.view();
    let losses = &view.losses;
    if losses.is_empty() {
        let h = &view.header;
        let text = if h.filter.is_empty() {
            "no clients yet".to_string()
        } else {
            format!("no request matches /{}", h.filter)
        };
        empty(frame, area, &text, theme);
        return;
    }
    let width = area.width as usize;
    let mut lines = Vec::new();
    let h = &view.header;
    // The header's totals: filtered, of the matching rows (the clients below are those with a
    // matching row), and the line says so.
    let all = if h.filter.is_empty() {
        "all".to_string()
    } else {
        format!("all matching /{}", h.filter)
    };
    let untimed = h.untimed_tokens > 0 && h.untimed_tokens == h.lost_tokens;
    // The dollars beside the tokens where a price is known: what a hosted API's user pays.
    let lost_tokens = match h.lost_usd {
        Some(usd) => format!(
            "{} ({})",
            token_count(h.lost_tokens),
            prefixscope_core::pricing::dollars(usd)
        ),
        None => token_count(h.lost_tokens),
    };
    // The figures whole: the longest wording that fits, values before labels.
    let total = match (h.lost_ms, h.prefill_ms) {
        _ if !h.loss_measured => vec![format!("{all}: {}", h.loss_not_measured())],
        _ if untimed => vec![
            format!("{all}: {lost_tokens}, time not measured"),
            format!("{all}: {lost_tokens}, untimed"),
        ],
        (Some(lost), Some(prefill)) if prefill > 0.0 => {
            let share = 100.0 * lost / prefill;
            vec![
                format!(
                    "{all}: {lost_tokens}, {} of {} prefill ({share:.0}%)",
                    duration(lost),
                    duration(prefill),
                ),
                format!("{all}: {lost_tokens}, {} ({share:.0}%)", duration(lost)),
                format!(
                    "{all}: {} tok, {} ({share:.0}%)",
                    tokens(h.lost_tokens),
                    duration(lost)
                ),
            ]
        }
        (Some(lost), _) => vec![format!("{all}: {lost_tokens}, {}", duration(lost))],
        (None, _) => vec![format!("{all}: {lost_tokens}, time not measured")],
    };
    let total = total
        .iter()
        .find(|t| t.chars().count() <= width)
        .or(total.last())
        .cloned()
        .unwrap_or_default();
    lines.push(Line::styled(fit(&total, width), theme.title()));
    // Columns by priority: the figures whole, the name cut in its middle, the causes only
    // where they fit.
    const FIGURES: usize = 18;
    let name_width = losses
        .iter()
        .map(|l| l.alias.chars().count())
        .chain((!view.unattributed.is_empty()).then_some("(server)".len()))
        .max()
        .unwrap_or(6)
        .max(6)
        .min(width.saturating_sub(FIGURES).max(4));
    let causes_shown = width >= name_width + FIGURES + 2 + 10;
    let causes_header = if causes_shown {
        "  causes (suffered)"
    } else {
        ""
    };
    lines.push(Line::styled(
        fit(
            &format!(
                "{:<name_width$} {:>8} {:>8}{causes_header}",
                "client", "suffered", "caused"
            ),
            width,
        ),
        theme.dim(),
    ));
    let entries = losses.len() + view.unattributed.len();
    for i in window(entries, selected, (area.height as usize).saturating_sub(2)) {
        let text = match losses.get(i) {
            Some(l) => {
                let (suffered, caused) = if h.loss_measured {
                    (tokens(l.tokens), tokens(l.caused_tokens))
                } else {
                    ("not measured".to_string(), String::new())
                };
                let causes: Vec<String> = l
                    .by_cause
                    .iter()
                    .map(|(c, t)| format!("{c} {}", tokens(*t)))
                    .collect();
                let causes = if causes_shown {
                    format!("  {}", causes.join(", "))
                } else {
                    String::new()
                };
                let line = format!(
                    "{:<name_width$} {suffered:>8} {caused:>8}{causes}",
                    fit_name(&l.alias, name_width),
                );
                if h.loss_measured {
                    line
                } else {
                    format!("{}: not measured", l.alias)
                }
            }
            None => {
                let (cause, tokens_lost, _) = &view.unattributed[i - losses.len()];
                let why = if causes_shown {
                    format!("  {cause}: no client ran in between")
                } else {
                    String::new()
                };
                format!(
                    "{:<name_width$} {:>8} {:>8}{why}",
                    "(server)",
                    "",
                    tokens(*tokens_lost)
                )
            }
        };
        lines.push(Line::from(Span::styled(
            fit(&text, width),
            line_style(i == selected, focused, theme),
        )));
    }
    frame.render_widget(Paragraph::new(lines), area);
}
