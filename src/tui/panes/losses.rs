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
        empty(frame, area, "no clients yet", theme);
        return;
    }
    let width = area.width as usize;
    let mut lines = Vec::new();
    let h = &app.view().header;
    let total = match (h.lost_ms, h.prefill_ms) {
        _ if !h.loss_measured => "all: loss not measured (no reuse reported)".into(),
        (Some(lost), Some(prefill)) if prefill > 0.0 => {
            format!(
                "all: {} tokens, {} of {} prefill ({:.0}%)",
                tokens(h.lost_tokens),
                duration(lost),
                duration(prefill),
                100.0 * lost / prefill
            )
        }
        (Some(lost), _) => format!("all: {} tokens, {}", tokens(h.lost_tokens), duration(lost)),
        (None, _) => format!("all: {} tokens, time not measured", tokens(h.lost_tokens)),
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
