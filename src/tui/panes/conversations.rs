//! One lane per conversation, grouped by client: each turn a cell by the tokens it lost, colour
//! and glyph (`■` nothing lost, `×` the client broke the prefix, `!` evicted, `~` the server
//! dropped its cache, `?` not measured). In the selected lane ← → move along the turns; the
//! lane scrolls back in time to keep the selected turn in sight, `‹` when earlier turns are off
//! to the left.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{fit, fit_name};
use crate::tui::app::App;
use crate::tui::theme::Theme;
use crate::tui::ui::{empty, line_style, window};
use crate::tui::view::{Cell, Lane, cause_label, tokens};

/// The cells a lane shows for `room` columns with `cursor` in sight: `(first, count)`.
pub fn cells_window(len: usize, cursor: Option<usize>, room: usize) -> (usize, usize) {
    let count = len.min(room.max(1));
    let newest = len.saturating_sub(count);
    let first = match cursor {
        Some(c) if c < newest => c.saturating_sub(count / 2).min(newest),
        _ => newest,
    };
    (first, count)
}

/// What a turn was: its turn number and what it lost to what.
pub fn cell_note(cell: &Cell, aliases: &crate::tui::view::Aliases) -> String {
    let cause = match (&cell.evicted_by, cell.broke) {
        _ if cell.lost_tokens == 0 => String::new(),
        (Some(by), _) => format!(
            " {} (#{} {})",
            cause_label(&by.kind),
            by.row,
            aliases.of(&by.client)
        ),
        (None, Some(cause)) => format!(" {}", cause_label(cause.name())),
        (None, None) => " server".into(),
    };
    let cost = match (cell.mark, cell.lost_tokens) {
        (crate::tui::view::Mark::Unmeasured, _) => "loss not measured".to_string(),
        (_, 0) => match cell.reuse {
            Some(r) => format!("nothing lost ({:.0}% reused)", r * 100.0),
            None => "nothing lost".into(),
        },
        (_, lost) => format!("lost {} tok", tokens(u64::from(lost))),
    };
    format!(" t{} {cost}{cause}", cell.turn)
}

/// The width of the lanes' names.
fn name_width(lanes: &[Lane], width: usize) -> usize {
    lanes
        .iter()
        .map(|l| l.alias.chars().count())
        .max()
        .unwrap_or(0)
        .min(width / 3)
        .max(6)
}

/// Columns before a lane's first cell: the name and a space, `c12 ` (5), the `‹` mark.
fn cells_start(client_width: usize) -> usize {
    client_width + 1 + 5 + 1
}

/// The cells a lane shows at `width` with `cursor` in sight: `(first, count)`.
fn lane_window(
    lane: &Lane,
    cursor: Option<usize>,
    width: usize,
    client_width: usize,
) -> (usize, usize) {
    let room = width.saturating_sub(client_width + 6 + 1 + 1);
    let cells_room = room
        .min(lane.cells.len())
        .min(room.saturating_sub(24).max(room * 3 / 4));
    cells_window(lane.cells.len(), cursor, cells_room)
}

/// The lane and the cell (`None`: the lane but no cell) under a click at `(column, row)` in
/// the pane's inner `area`, as `draw` lays them out.
pub fn cell_at(app: &App, area: Rect, column: u16, row: u16) -> Option<(usize, Option<usize>)> {
    let lanes = &app.view().lanes;
    if column < area.x || row < area.y || column >= area.x + area.width {
        return None;
    }
    let header = usize::from(area.height >= 4);
    let height = (area.height as usize).saturating_sub(usize::from(area.height >= 3) + header);
    let shown = window(lanes.len(), app.selected[0], height);
    let lane = shown.start + usize::from(row - area.y).checked_sub(header)?;
    if !shown.contains(&lane) {
        return None;
    }
    let width = area.width as usize;
    let client_width = name_width(lanes, width);
    let cursor = (lane == app.selected[0])
        .then(|| app.selected_cell())
        .flatten();
    let (first, count) = lane_window(&lanes[lane], cursor, width, client_width);
    let x = usize::from(column - area.x);
    let start = cells_start(client_width);
    let cell = (x >= start && x < start + count).then(|| first + x - start);
    Some((lane, cell))
}

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
    let client_width = name_width(lanes, width);
    // The last line says what the selected turn was, whole (a narrow lane cuts its note).
    let footer = area.height >= 3;
    // Column headers where there are rows to spare.
    let header = area.height >= 4;
    let height = area.height as usize - usize::from(footer) - usize::from(header);
    let mut lines = Vec::new();
    if header {
        lines.push(Line::styled(
            fit(
                &format!(
                    "{:<client_width$} {:<5} turns, newest last",
                    "client", "conv"
                ),
                width,
            ),
            theme.dim(),
        ));
    }
    for i in window(lanes.len(), selected, height) {
        let lane: &Lane = &lanes[i];
        let is_selected = i == selected;
        let style = line_style(is_selected, focused, theme);
        let mut spans = vec![
            Span::styled(
                format!("{:<client_width$} ", fit_name(&lane.alias, client_width)),
                style,
            ),
            // `c5↳`: a subagent's conversation (the turn detail says whose, `u` goes there).
            Span::styled(
                format!(
                    "{:<4} ",
                    format!(
                        "c{}{}",
                        lane.conversation,
                        if lane.spawned_by.is_some() { "↳" } else { "" }
                    )
                ),
                style,
            ),
        ];
        let cursor = if is_selected {
            app.selected_cell()
        } else {
            None
        };
        let (first, count) = lane_window(lane, cursor, width, client_width);
        spans.push(Span::styled(if first > 0 { "‹" } else { " " }, theme.dim()));
        for (k, cell) in lane.cells[first..first + count].iter().enumerate() {
            let mut style = theme.loss(cell.severity());
            if is_selected && focused && cursor == Some(first + k) {
                style = style.add_modifier(Modifier::REVERSED);
            }
            spans.push(Span::styled(cell.mark.glyph(), style));
        }
        let shown = cursor.or(lane.cells.len().checked_sub(1));
        if let Some(cell) = shown.and_then(|c| lane.cells.get(c)) {
            let note = cell_note(cell, &app.view().aliases);
            let used: usize = spans.iter().map(|s| s.content.chars().count()).sum();
            spans.push(Span::styled(
                fit(&note, width.saturating_sub(used)),
                theme.dim(),
            ));
        }
        lines.push(Line::from(spans));
    }
    if footer {
        lines.resize(height + usize::from(header), Line::raw(""));
        let note = lanes.get(selected).and_then(|lane| {
            let cell = lane.cells.get(app.selected_cell()?)?;
            let note = format!(
                "c{}{}",
                lane.conversation,
                cell_note(cell, &app.view().aliases)
            );
            // The turn and what it lost before the name where the pane is narrow.
            let named = format!("{} {note}", lane.alias);
            Some(if named.chars().count() <= width {
                named
            } else {
                note
            })
        });
        if let Some(note) = note {
            lines.push(Line::styled(fit(&note, width), theme.title()));
        }
    }
    frame.render_widget(Paragraph::new(lines), area);
}

/// What to set in each harness to send its traffic through the proxy at `listen` (README's
/// table).
pub fn base_urls(listen: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "Claude Code",
            format!("ANTHROPIC_BASE_URL=http://{listen} claude"),
        ),
        (
            "opencode",
            format!("opencode.json: \"options\": {{ \"baseURL\": \"http://{listen}/v1\" }}"),
        ),
        (
            "aider",
            format!("aider --openai-api-base http://{listen}/v1 --model openai/NAME"),
        ),
        ("OpenAI SDKs", format!("OPENAI_BASE_URL=http://{listen}/v1")),
        ("Ollama", format!("OLLAMA_HOST=http://{listen}")),
    ]
}

/// `watch` before its first request, over the top panes: how to point a harness at the proxy.
pub fn draw_first_screen(frame: &mut Frame, area: Rect, listen: &str, theme: &Theme) {
    let block = ratatui::widgets::Block::default()
        .borders(ratatui::widgets::Borders::ALL)
        .border_style(theme.focused_border())
        .title(Span::styled(
            " Conversations: waiting for the first request; point your harness at the proxy ",
            theme.title(),
        ));
    let inner = block.inner(area);
    frame.render_widget(ratatui::widgets::Clear, area);
    frame.render_widget(block, area);
    let lines: Vec<Line> = base_urls(listen)
        .into_iter()
        .map(|(who, how)| {
            Line::from(vec![
                Span::styled(format!("{who:<12} "), theme.dim()),
                Span::raw(how),
            ])
        })
        .collect();
    frame.render_widget(
        Paragraph::new(lines).wrap(ratatui::widgets::Wrap { trim: false }),
        inner,
    );
}
