//! Layout. Drawing reads the app and never changes it.
//!
//! ```text
//! ┌ prefixscope · source · requests · lost ─────────────────────────────────────┐
//! ├ Conversations ────────────────────────┬ Prefix breaks ──────────────────────┤
//! │ client  c1 ■■■■×■■  evicted by #9 …   │ 12:01:03 client c1 t4 system prompt │
//! ├ Loss per client ──────┬ Hit rate by capacity ───┬ Top prefixes ─────────────┤
//! └ Loss per client ──────┴ Hit rate by capacity ───┴ Top prefixes ─────────────┘
//!  status: PAUSED · requests · req/s · written · bad lines · upstream │ what a key did
//!  keys: the focused pane's, then help and quit, then the rest, whole keys only
//! ```

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Wrap};

use super::app::{App, Input, Pane};
use super::panes;
use super::theme::Theme;

/// Below this the layout cannot hold its panes: a message instead.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 16;

pub struct Areas {
    pub header: Rect,
    pub panes: [(Pane, Rect); 5],
    pub status: Rect,
    pub keys: Rect,
}

pub fn areas(area: Rect) -> Areas {
    areas_zoomed(area, None)
}

/// The layout, or with `zoom` that pane over the whole body (the others get no room).
pub fn areas_zoomed(area: Rect, zoom: Option<Pane>) -> Areas {
    let [header, body, status, keys] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(area);
    let [top, bottom] =
        Layout::vertical([Constraint::Percentage(62), Constraint::Percentage(38)]).areas(body);
    // The breaks carry the most text (cause, cost, whose, what changed): they get the room.
    let [conversations, breaks] =
        Layout::horizontal([Constraint::Percentage(42), Constraint::Percentage(58)]).areas(top);
    let [losses, hit_rate, prefixes] = Layout::horizontal([
        Constraint::Percentage(37),
        Constraint::Percentage(31),
        Constraint::Percentage(32),
    ])
    .areas(bottom);
    if let Some(zoomed) = zoom {
        let none = Rect::new(body.x, body.y, 0, 0);
        let at = |pane: Pane| if pane == zoomed { body } else { none };
        return Areas {
            header,
            panes: Pane::ALL.map(|p| (p, at(p))),
            status,
            keys,
        };
    }
    Areas {
        header,
        panes: [
            (Pane::Conversations, conversations),
            (Pane::Breaks, breaks),
            (Pane::Losses, losses),
            (Pane::HitRate, hit_rate),
            (Pane::Prefixes, prefixes),
        ],
        status,
        keys,
    }
}

/// Where `pane` is on a screen of `size`.
pub fn pane_rect(pane: Pane, size: (u16, u16), zoom: Option<Pane>) -> Option<Rect> {
    let area = Rect::new(0, 0, size.0, size.1);
    areas_zoomed(area, zoom)
        .panes
        .iter()
        .find(|(p, _)| *p == pane)
        .map(|(_, r)| *r)
}

/// Which pane a click landed in.
pub fn pane_at(column: u16, row: u16, size: (u16, u16), zoom: Option<Pane>) -> Option<Pane> {
    let area = Rect::new(0, 0, size.0, size.1);
    areas_zoomed(area, zoom)
        .panes
        .iter()
        .find(|(_, r)| {
            column >= r.x && column < r.x + r.width && row >= r.y && row < r.y + r.height
        })
        .map(|(p, _)| *p)
}

pub fn draw(frame: &mut Frame, app: &App, theme: &Theme) {
    let area = frame.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let text = format!(
            "prefixscope needs {MIN_WIDTH}×{MIN_HEIGHT}; this terminal is {}×{}. q quits.",
            area.width, area.height
        );
        frame.render_widget(Paragraph::new(text).wrap(Wrap { trim: true }), area);
        return;
    }
    let areas = areas_zoomed(area, app.zoom.then_some(app.focus));
    frame.render_widget(
        Paragraph::new(panes::status::header(app, theme)),
        areas.header,
    );
    for (pane, rect) in areas.panes {
        if rect.width == 0 || rect.height == 0 {
            continue;
        }
        let focused = pane == app.focus;
        let block = Block::default()
            .borders(Borders::ALL)
            .border_style(if focused {
                theme.focused_border()
            } else {
                theme.border()
            })
            .title(Span::styled(
                format!(" {} ", title(app, pane)),
                theme.title(),
            ));
        let inner = block.inner(rect);
        frame.render_widget(block, rect);
        let selected = app.selected[Pane::ALL.iter().position(|p| *p == pane).unwrap_or(0)];
        if let (Input::RequestsOnly(format), Pane::Conversations | Pane::Breaks | Pane::Losses) =
            (&app.input, pane)
        {
            let text = format!(
                "a {format} input has no messages: this pane needs a recording (the hit rate and prefixes still apply)"
            );
            empty(frame, inner, &text, theme);
            continue;
        }
        match pane {
            Pane::Conversations => {
                panes::conversations::draw(frame, inner, app, selected, focused, theme)
            }
            Pane::Breaks => panes::breaks::draw(frame, inner, app, selected, focused, theme),
            Pane::Losses => panes::losses::draw(frame, inner, app, selected, focused, theme),
            Pane::HitRate => panes::hit_rate::draw(frame, inner, app, theme),
            Pane::Prefixes => panes::prefixes::draw(frame, inner, app, selected, focused, theme),
        }
    }
    if let (super::app::Source::Live { listen, .. }, None, 0) =
        (&app.source, app.speed, app.requests())
        && !app.zoom
    {
        let top = areas.panes[0].1.union(areas.panes[1].1);
        panes::conversations::draw_first_screen(frame, top, listen, theme);
    }
    frame.render_widget(
        Paragraph::new(panes::status::status_line(app, theme)),
        areas.status,
    );
    frame.render_widget(
        Paragraph::new(panes::status::key_bar(app, theme)),
        areas.keys,
    );
    panes::dialogs::draw(frame, area, app, theme);
}

fn title(app: &App, pane: Pane) -> String {
    let title = pane_title(app, pane);
    // The cache panes simulate every request: under a filter they say so.
    match pane {
        Pane::HitRate | Pane::Prefixes if !app.view().header.filter.is_empty() => {
            format!("{title} (unfiltered)")
        }
        _ => title,
    }
}

fn pane_title(app: &App, pane: Pane) -> String {
    match pane {
        Pane::HitRate if app.chart => "Hit rate by capacity (chart)".into(),
        Pane::HitRate if app.focus == Pane::HitRate && app.input == Input::Exchanges => {
            "Hit rate by capacity (↵ -np, --cache-ram)".into()
        }
        Pane::Prefixes if app.prefixes_by_tokens => "Top prefixes by reusable tokens".into(),
        Pane::Prefixes => "Top prefixes by count".into(),
        Pane::Conversations if !app.filter.is_empty() => format!("Conversations [/{}]", app.filter),
        Pane::Conversations if app.focus == Pane::Conversations => {
            "Conversations (← → turns, ↵ open)".into()
        }
        Pane::Losses => "Loss per client, by cost".into(),
        // Only the newest breaks are described; the title says how many there are.
        Pane::Breaks
            if app.view().breaks_total > prefixscope_core::live::view::MAX_BREAKS_SHOWN =>
        {
            format!(
                "Prefix breaks (newest {} of {})",
                prefixscope_core::units::thousands(
                    prefixscope_core::live::view::MAX_BREAKS_SHOWN as u64
                ),
                prefixscope_core::units::thousands(app.view().breaks_total as u64)
            )
        }
        other => other.title().into(),
    }
}

/// The first `height` items starting so that `selected` is visible.
pub fn window(len: usize, selected: usize, height: usize) -> std::ops::Range<usize> {
    if height == 0 || len == 0 {
        return 0..0;
    }
    let start = selected
        .saturating_sub(height - 1)
        .min(len.saturating_sub(height));
    start..(start + height).min(len)
}

pub fn line_style(selected: bool, focused: bool, theme: &Theme) -> Style {
    if selected && focused {
        theme.selected()
    } else {
        Style::default()
    }
}

pub fn empty(frame: &mut Frame, area: Rect, text: &str, theme: &Theme) {
    frame.render_widget(
        Paragraph::new(Line::styled(text.to_string(), theme.dim())).wrap(Wrap { trim: true }),
        area,
    );
}

pub fn popup(
    frame: &mut Frame,
    area: Rect,
    width: u16,
    height: u16,
    title: &str,
    theme: &Theme,
) -> Rect {
    let w = width.min(area.width);
    let h = height.min(area.height);
    let rect = Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    );
    frame.render_widget(Clear, rect);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_style(theme.focused_border())
        .title(Span::styled(format!(" {title} "), theme.title()));
    let inner = block.inner(rect);
    frame.render_widget(block, rect);
    inner
}
