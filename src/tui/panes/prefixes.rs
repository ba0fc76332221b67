//! The prefixes most requests share: by count, or (key `t`) by reusable tokens.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::fit;
use crate::tui::app::App;
use crate::tui::theme::Theme;
use crate::tui::ui::{empty, line_style, window};
use crate::tui::view::tokens;

pub fn draw(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    selected: usize,
    focused: bool,
    theme: &Theme,
) {
    let mut items: Vec<_> = app.view().prefixes.iter().collect();
    if items.is_empty() {
        empty(frame, area, "no shared prefixes yet", theme);
        return;
    }
    if app.prefixes_by_tokens {
        items.sort_by_key(|p| std::cmp::Reverse(p.reusable_tokens));
    } else {
        items.sort_by_key(|p| std::cmp::Reverse(p.count));
    }
    let width = area.width as usize;
    let lines: Vec<Line> = window(items.len(), selected, area.height as usize)
        .map(|i| {
            let p = items[i];
            let text = format!(
                "{:>4}× {:>7} tok  {}",
                p.count,
                tokens(p.reusable_tokens),
                p.label
            );
            Line::from(Span::styled(
                fit(&text, width),
                line_style(i == selected, focused, theme),
            ))
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), area);
}
