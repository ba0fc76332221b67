//! Prefix breaks and evictions, newest first: the cause and the cost, whose, where, when.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{clock, fit};
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
    let breaks = &app.view().breaks;
    if breaks.is_empty() {
        empty(frame, area, "no prefix breaks yet", theme);
        return;
    }
    let width = area.width as usize;
    // Two lines per break: what and what it cost, then where (the before → after text).
    let mut lines = Vec::new();
    for i in window(breaks.len(), selected, (area.height as usize / 2).max(1)) {
        let b = &breaks[i];
        let place = match (b.conversation, b.turn) {
            (Some(c), Some(t)) => format!("c{c} t{t}"),
            _ => format!("#{}", b.id),
        };
        let cost = match b.ms {
            Some(ms) => format!("{} tok, {}", tokens(u64::from(b.tokens)), duration(ms)),
            None if b.tokens > 0 => format!("{} tok", tokens(u64::from(b.tokens))),
            None if !b.measured => "loss not measured".into(),
            None => "no loss".into(),
        };
        // Cause and cost first, then where and whose (the name is what a narrow pane cuts),
        // the time only where it fits whole.
        let mut head = format!("{}: {cost} · {place} {}", b.cause, b.alias);
        let time = format!(" · {}", clock(b.t_start_ms));
        if head.chars().count() + time.chars().count() <= width {
            head.push_str(&time);
        }
        let style = line_style(i == selected, focused, theme);
        lines.push(Line::from(Span::styled(fit(&head, width), style)));
        let where_ = if b.place.is_empty() {
            "  (where: not recorded)".to_string()
        } else {
            format!("  {}", b.place)
        };
        lines.push(Line::from(Span::styled(fit(&where_, width), theme.dim())));
    }
    frame.render_widget(Paragraph::new(lines), area);
}
