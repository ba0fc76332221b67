//! The full-screen views Enter opens and Esc leaves: a turn (cause, cost, what changed, the
//! fix), a prefix (what it is made of), a client (what it suffered and caused), the findings by
//! cost with their fixes and savings, and a finding's rows. Each is a list of lines built from
//! the snapshot (`*_lines`, also what the tests read), drawn scrolled.

use ratatui::Frame;
use ratatui::layout::{Margin, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Wrap};

use crate::tui::app::{App, Dialog};
use crate::tui::theme::Theme;
use prefixscope_core::analysis::Measured;
use prefixscope_core::units::serde_name;

mod capacity;
mod client;
mod findings;
mod prefix;
mod turn;
mod who_cost_whom;

pub use capacity::capacity_lines;
pub use client::client_lines;
pub use findings::{finding_rows_lines, findings_lines};
pub use prefix::prefix_lines;
use turn::*;
pub use turn::{Written, detail_lines, detail_lines_as, spawner_of, turn_fix};
pub use who_cost_whom::who_cost_whom_lines;

/// The area a view takes: the screen but the status line and the key bar (what a key did and
/// the keys stay in sight).
pub fn area_of(screen: Rect) -> Rect {
    Rect {
        height: screen.height.saturating_sub(2),
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
    // The popup's frame over the whole view area.
    let rect = area_of(screen);
    let inner = crate::tui::ui::popup(frame, rect, rect.width, rect.height, &title, theme);
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
    let inner = area_of(Rect::new(0, 0, width, height)).inner(Margin::new(1, 1));
    last_scroll(&Paragraph::new(lines).wrap(Wrap { trim: false }), inner)
}

fn measured<T: std::fmt::Display>(m: Option<Measured<T>>) -> String {
    m.map_or("not measured".into(), |m| {
        format!("{} ({})", m.value, serde_name(m.source))
    })
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
