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
    // Columns by priority: count, reusable tokens and share whole; the prefix's length and what
    // it is made of where they fit.
    let with_length = width >= 26;
    let what_at = if with_length { 26 } else { 19 };
    let with_what = width >= what_at + 2 + 6;
    let row = |count: &str, reusable: &str, length: &str, share: &str, what: &str| {
        let mut text = format!("{count:>5} {reusable:>7}");
        if with_length {
            text.push_str(&format!(" {length:>6}"));
        }
        text.push_str(&format!(" {share:>5}"));
        if with_what {
            text.push_str(&format!("  {what}"));
        }
        fit(&text, width)
    };
    let mut lines = vec![Line::styled(
        row("count", "tokens", "prefix", "share", "what"),
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
            let text = row(
                &format!("{}×", p.count),
                &tokens(p.reusable_tokens),
                &tokens(p.prefix_tokens),
                &format!("{:.0}%", p.share_of_reusable * 100.0),
                &p.what.as_deref().map_or(String::new(), shown),
            );
            Line::from(Span::styled(
                text,
                line_style(i == selected, focused, theme),
            ))
        }),
    );
    frame.render_widget(Paragraph::new(lines), area);
}
