//! The prefix view: what a shared prefix is made of.

use ratatui::text::Line;

use crate::tui::app::App;
use crate::tui::theme::Theme;
use crate::tui::view::{shown, thousands};

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
