//! The prefixes most requests share: by count, or (key `t`) by reusable tokens, with column
//! headers and what each is made of (as `profile` describes it).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::fit;
use crate::tui::app::App;
use crate::tui::theme::Theme;
use crate::tui::ui::{empty, line_style, window};
use crate::tui::view::{shown, tokens};

pub fn draw(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    selected: usize,
    focused: bool,
    theme: &Theme,
) {
    let items = app.prefix_items();
    if items.is_empty() {
        empty(frame, area, "no shared prefixes yet", theme);
        return;
    }
    let width = area.width as usize;
    let mut lines = vec![Line::styled(
        fit(
            &format!(
                "{:>5} {:>7} {:>6} {:>5}  what",
                "count", "tokens", "prefix", "share"
            ),
            width,
        ),
        theme.dim(),
    )];
    lines.extend(
        window(
            items.len(),
            selected,
            (area.height as usize).saturating_sub(1),
        )
        .map(|i| {
            let p = items[i];
            let text = format!(
                "{:>4}× {:>7} {:>6} {:>4.0}%  {}",
                p.count,
                tokens(p.reusable_tokens),
                tokens(p.prefix_tokens),
                p.share_of_reusable * 100.0,
                p.what.as_deref().map_or(String::new(), shown)
            );
            Line::from(Span::styled(
                fit(&text, width),
                line_style(i == selected, focused, theme),
            ))
        }),
    );
    frame.render_widget(Paragraph::new(lines), area);
}
