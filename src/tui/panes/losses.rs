//! Tokens and seconds each client lost to re-processing, by cause.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::fit;
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
    let losses = &app.view().losses;
    if losses.is_empty() {
        let h = &app.view().header;
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
    let h = &app.view().header;
    // The header's totals: filtered, of the matching rows (the clients below are those with a
    // matching row), and the line says so.
    let all = if h.filter.is_empty() {
        "all".to_string()
    } else {
        format!("all matching /{}", h.filter)
    };
    let total = match (h.lost_ms, h.prefill_ms) {
        _ if !h.loss_measured => format!("{all}: loss not measured (no reuse reported)"),
        (Some(lost), Some(prefill)) if prefill > 0.0 => {
            format!(
                "{all}: {}, {} of {} prefill ({:.0}%)",
                token_count(h.lost_tokens),
                duration(lost),
                duration(prefill),
                100.0 * lost / prefill
            )
        }
        (Some(lost), _) => format!("{all}: {}, {}", token_count(h.lost_tokens), duration(lost)),
        (None, _) => format!("{all}: {}, time not measured", token_count(h.lost_tokens)),
    };
    lines.push(Line::styled(fit(&total, width), theme.title()));
    for i in window(
        losses.len(),
        selected,
        (area.height as usize).saturating_sub(1),
    ) {
        let l = &losses[i];
        let time = l.ms.map_or("time not measured".to_string(), duration);
        let lost = if h.loss_measured {
            format!("{} tok, {time}", tokens(l.tokens))
        } else {
            "not measured".to_string()
        };
        let causes: Vec<String> = l
            .by_cause
            .iter()
            .take(2)
            .map(|(c, t)| format!("{c} {}", tokens(*t)))
            .collect();
        let text = format!(
            "{}: {lost}{}",
            l.client,
            if causes.is_empty() {
                String::new()
            } else {
                format!(" · {}", causes.join(", "))
            }
        );
        lines.push(Line::from(Span::styled(
            fit(&text, width),
            line_style(i == selected, focused, theme),
        )));
    }
    frame.render_widget(Paragraph::new(lines), area);
}
