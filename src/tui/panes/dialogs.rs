//! Pop-ups: help, the detail of a request, the filter and export inputs.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::widgets::{Paragraph, Wrap};

use crate::tui::app::{App, Dialog, EXPORT_FORMATS};
use crate::tui::theme::Theme;
use crate::tui::ui::popup;

pub const HELP: &[&str] = &[
    "keys",
    "  ?            this help (any key closes it)",
    "  Tab / S-Tab  next / previous pane (mouse: click; m turns the mouse off)",
    "  ↑ ↓ / j k    select a lane, a break, a client, a prefix; scroll a view",
    "  PgUp PgDn    in a view: a page; Home / End: its start / end (a turn ends with both whole texts)",
    "  ← → / h l    in Conversations: move along the lane's turns (Home oldest, End newest);",
    "               elsewhere: next / previous pane",
    "  Enter        open: a turn (cause, cost, what changed, the fix), a prefix (what it is",
    "               made of), a client (what it suffered and caused); Esc goes back",
    "  v / u        in a turn: the request that evicted it / that spawned its subagent (c5↳)",
    "  f            findings by cost, each with its fix and the predicted saving",
    "  ↵ on Hit rate the server's settings simulated: -np 1/2/4/8 × --cache-ram off/on",
    "  z            zoom the focused pane to the whole screen (z or Esc again: back)",
    "  w            who cost whom: clients × clients, tokens, from evicted_by",
    "  o            in a view: write its whole text to prefixscope-<view>-<ms>.txt (0600)",
    "  p / space    replay: pause reading the file (. reads one record, ] ten); watch: pause the",
    "               view (the recording goes on)",
    "  g            replay: seek forward to a record (120) or a time (09:01:30, +90s), then pause",
    "  /            filter by client, model, conversation (c3) or text; Esc clears",
    "  s            write a snapshot: JSON report and text summary (with the fixes)",
    "  e            export a trace (Tab picks the format; all but otel are anonymous)",
    "  c  t         hit rate: sparkline ↔ chart (FIFO / LRU / optimal); prefixes: by count ↔ tokens",
    "  m  + / -     mouse on / off; replay speed",
    "  q            quit (waits for exchanges in flight; q again forces)",
    "",
    "cells (one per turn, by the tokens it lost; the glyph says it without colour)",
    "  ■ nothing lost  × the client broke the prefix  ! evicted by a request that ran",
    "  in between  ~ the server (or hosted API) lost its cache  ? loss not measured (no counts)",
    "  colour: green none · yellow under a quarter of the prompt · red more · grey unknown",
    "  ‹ earlier turns to the left (← scrolls back)",
    "",
    "figures",
    "  lost        prompt tokens the server evaluated again although it had seen them",
    "  suffered    what a client lost on its own turns; caused: what it made others (and",
    "              itself) lose: its own breaks, the turns evicted_by names it for",
    "  #2          clients with one user agent but different tool sets: #1, #2 … apart",
    "  c3 t4       conversation 3, turn 4; #15 a request's id in the recording",
    "  ceiling     the most any cache could reuse of this traffic (replies cached)",
    "  server      what the server said it reused; cold replay: requests so far through",
    "              an empty LRU / FIFO cache at each capacity",
    "  saving      the simulated llama-server (prefixscope whatif) with that setting,",
    "              over the same requests: lost tokens recorded minus predicted",
];
pub fn draw(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    if super::views::draw(frame, area, app, theme) {
        return;
    }
    match &app.dialog {
        None => {}
        Some(Dialog::Filter(area_input)) => {
            let inner = popup(
                frame,
                area,
                60,
                4,
                "filter: client, model, c3 or text (Enter applies, Esc cancels)",
                theme,
            );
            frame.render_widget(area_input, inner);
        }
        Some(Dialog::Seek(area_input)) => {
            let inner = popup(
                frame,
                area,
                70,
                5,
                "seek: read on to a record or a time, then pause (forward only)",
                theme,
            );
            let [hint, input] =
                Layout::vertical([Constraint::Length(2), Constraint::Length(1)]).areas(inner);
            frame.render_widget(
                Paragraph::new(format!(
                    "record number (120), time of day (09:01:30) or ahead (+90s, +2m); {} read so far · Enter seeks, Esc cancels",
                    prefixscope_core::units::plural(app.requests(), "record")
                ))
                .wrap(Wrap { trim: true }),
                hint,
            );
            frame.render_widget(area_input, input);
        }
        Some(Dialog::Export { format, name }) => {
            let inner = popup(
                frame,
                area,
                70,
                7,
                "export a trace (otel keeps the messages: not anonymous)",
                theme,
            );
            let [formats, label, input] = Layout::vertical([
                Constraint::Length(2),
                Constraint::Length(1),
                Constraint::Length(1),
            ])
            .areas(inner);
            let list: Vec<String> = EXPORT_FORMATS
                .iter()
                .enumerate()
                .map(|(i, f)| {
                    if i == *format {
                        format!("[{f}]")
                    } else {
                        f.to_string()
                    }
                })
                .collect();
            frame.render_widget(
                Paragraph::new(format!(
                    "format (Tab): {} · anonymous: all but otel (it keeps the messages)",
                    list.join(" ")
                ))
                .wrap(Wrap { trim: true }),
                formats,
            );
            frame.render_widget(Paragraph::new("file (Enter writes, Esc cancels):"), label);
            frame.render_widget(name, input);
        }
        Some(_) => {}
    }
}
