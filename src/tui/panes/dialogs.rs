//! Pop-ups: help, the detail of a request, the filter and export inputs.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Wrap};

use crate::analysis::Measured;
use crate::tui::app::{App, Dialog, EXPORT_FORMATS};
use crate::tui::theme::Theme;
use crate::tui::ui::popup;
use crate::tui::view::cause_label;

const HELP: &[&str] = &[
    "?            this help",
    "Tab / ← →    move between panes (mouse: click; m turns the mouse off)",
    "↑ ↓ / j k    select",
    "Enter        detail of the selected request",
    "p / space    pause the view (recording goes on)",
    "/            filter by client, model, conversation (c3) or text; Esc clears",
    "s            write a JSON report snapshot and the text summary",
    "e            export an anonymized trace (Tab picks the format)",
    "c            hit rate: sparkline ↔ chart (FIFO / LRU / optimal)",
    "t            top prefixes: by count ↔ by reusable tokens",
    "+ / -        replay speed",
    "q            quit (waits for exchanges in flight; q again forces)",
    "",
    "cells: ■ a turn, coloured by the reuse the server reported;",
    "       × the prompt prefix broke; ! evicted by another request",
];

fn measured<T: std::fmt::Display>(m: Option<Measured<T>>) -> String {
    m.map_or("not measured".into(), |m| {
        format!(
            "{} ({})",
            m.value,
            serde_json::to_value(m.source)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        )
    })
}

pub fn draw(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    match &app.dialog {
        None => {}
        Some(Dialog::Help) => {
            let inner = popup(frame, area, 78, HELP.len() as u16 + 2, "keys", theme);
            frame.render_widget(
                Paragraph::new(HELP.iter().map(|l| Line::raw(*l)).collect::<Vec<_>>()),
                inner,
            );
        }
        Some(Dialog::Detail(id)) => {
            let inner = popup(frame, area, 90, 18, &format!("request #{id}"), theme);
            let Some(row) = app.snapshot.row(*id) else {
                frame.render_widget(Paragraph::new("not in the current view"), inner);
                return;
            };
            let c = &row.counts;
            let mut lines = vec![
                format!(
                    "{} · {} · {:?} · conversation {} turn {}",
                    row.client,
                    row.model,
                    row.kind,
                    row.conversation.map_or("-".into(), |c| c.to_string()),
                    row.turn.map_or("-".into(), |t| t.to_string())
                ),
                format!(
                    "prompt {} · reused {} · evaluated {}",
                    measured(c.prompt_tokens),
                    measured(c.reused_tokens),
                    measured(c.evaluated_tokens)
                ),
                format!(
                    "prefill ms {} · completion {}",
                    measured(c.prefill_ms),
                    measured(c.completion_tokens)
                ),
                format!(
                    "composition: system {} · tools {} · history {} · new {}",
                    row.composition.system.value,
                    row.composition.tools.value,
                    row.composition.history.value,
                    row.composition.new_content.value
                ),
                format!(
                    "linked to {} · prefix {} tokens · predicted reuse {} · observed {}",
                    row.linked_to.map_or("-".into(), |l| format!("#{l}")),
                    row.prefix_tokens.map_or("-".into(), |p| p.to_string()),
                    row.predicted_reuse
                        .map_or("-".into(), |r| format!("{:.0}%", r * 100.0)),
                    row.observed_reuse
                        .map_or("-".into(), |r| format!("{:.0}%", r * 100.0))
                ),
            ];
            if let Some(cause) = row.break_cause {
                let name = serde_json::to_value(cause)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default();
                lines.push(format!("break: {}", cause_label(&name)));
            }
            if let Some(at) = &row.break_location {
                lines.push(format!(
                    "where: message {} ({}) char {}",
                    at.message.map_or("-".into(), |m| m.to_string()),
                    at.role.as_deref().unwrap_or("-"),
                    at.char_offset.map_or("-".into(), |o| o.to_string())
                ));
                if let (Some(b), Some(a)) = (&at.before, &at.after) {
                    lines.push(format!("  {b:?}"));
                    lines.push(format!("→ {a:?}"));
                }
            }
            for loss in [&row.lost_client, &row.lost_external].into_iter().flatten() {
                lines.push(format!(
                    "lost {} tokens to {} ({})",
                    loss.tokens,
                    cause_label(&loss.cause),
                    loss.ms
                        .map_or("time not measured".into(), |m| format!("{:.0} ms", m.value))
                ));
            }
            if let Some(by) = &row.evicted_by {
                lines.push(format!(
                    "evicted by #{} ({}, {})",
                    by.row,
                    by.client,
                    cause_label(&by.kind)
                ));
            }
            lines.push(String::new());
            lines.push("any key closes".into());
            frame.render_widget(
                Paragraph::new(lines.into_iter().map(Line::raw).collect::<Vec<_>>())
                    .wrap(Wrap { trim: false }),
                inner,
            );
        }
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
        Some(Dialog::Export { format, name }) => {
            let inner = popup(frame, area, 70, 7, "export an anonymized trace", theme);
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
                Paragraph::new(format!("format (Tab): {}", list.join(" ")))
                    .wrap(Wrap { trim: true }),
                formats,
            );
            frame.render_widget(Paragraph::new("file (Enter writes, Esc cancels):"), label);
            frame.render_widget(name, input);
        }
    }
}
