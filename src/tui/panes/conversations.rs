//! One lane per conversation, grouped by client: each turn a cell coloured by the reuse the
//! server reported, `×` where the prefix broke, `!` where another request evicted it.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::fit;
use crate::tui::app::App;
use crate::tui::theme::Theme;
use crate::tui::ui::{empty, line_style, window};
use crate::tui::view::{Mark, cause_label};

pub fn draw(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    selected: usize,
    focused: bool,
    theme: &Theme,
) {
    let lanes = &app.view().lanes;
    if lanes.is_empty() {
        empty(frame, area, "no conversations yet", theme);
        return;
    }
    let width = area.width as usize;
    let client_width = lanes
        .iter()
        .map(|l| l.client.chars().count())
        .max()
        .unwrap_or(0)
        .min(width / 3)
        .max(6);
    let mut lines = Vec::new();
    for i in window(lanes.len(), selected, area.height as usize) {
        let lane = &lanes[i];
        let style = line_style(i == selected, focused, theme);
        let mut spans = vec![
            Span::styled(
                format!("{:<client_width$} ", fit(&lane.client, client_width)),
                style,
            ),
            Span::styled(format!("c{:<3} ", lane.conversation), style),
        ];
        let room = width.saturating_sub(client_width + 6 + 1);
        let cells_room = room
            .min(lane.cells.len())
            .min(room.saturating_sub(24).max(room / 2));
        let skip = lane.cells.len().saturating_sub(cells_room);
        for cell in &lane.cells[skip..] {
            let mark = match cell.mark {
                Mark::Break => "×",
                Mark::Eviction => "!",
                Mark::Clean => "■",
            };
            spans.push(Span::styled(mark, theme.reuse(cell.reuse)));
        }
        if let Some(last) = lane.cells.last() {
            let note = match (&last.evicted_by, last.broke) {
                (Some(by), _) => format!(
                    " evicted by #{} ({}, {})",
                    by.row,
                    by.client,
                    cause_label(&by.kind)
                ),
                (None, Some(cause)) => format!(
                    " {}",
                    cause_label(
                        &serde_json::to_value(cause)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_string))
                            .unwrap_or_default()
                    )
                ),
                _ => format!(
                    " t{} {}",
                    last.turn,
                    last.reuse.map_or("reuse not reported".into(), |r| format!(
                        "{:.0}% reused",
                        r * 100.0
                    ))
                ),
            };
            let used: usize = spans.iter().map(|s| s.content.chars().count()).sum();
            spans.push(Span::styled(
                fit(&note, width.saturating_sub(used)),
                theme.dim(),
            ));
        }
        lines.push(Line::from(spans));
    }
    frame.render_widget(Paragraph::new(lines), area);
}
