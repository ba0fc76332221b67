//! The header (what it cost, what is watched), the status line (counters, state, what the last
//! key did) and the key bar. Each drops whole items by priority where a narrow terminal has no
//! room, never the end of a figure, and the key bar has a line of its own.

use ratatui::text::{Line, Span};

use super::{fit, fit_items};
use crate::tui::app::{App, Input, Pane, Source};
use crate::tui::theme::Theme;
use crate::tui::view::{duration, thousands};
use prefixscope_core::units::plural;

/// What the watched traffic lost: the tokens and, where a server timed them, the seconds and
/// their share of prefill.
fn lost_text(app: &App) -> String {
    let h = &app.view().header;
    let untimed = h.untimed_tokens > 0 && h.untimed_tokens == h.lost_tokens;
    // The dollars beside the tokens, where a price is known.
    let usd = h
        .lost_usd
        .map(|usd| format!(" ({})", prefixscope_core::pricing::dollars(usd)))
        .unwrap_or_default();
    match (h.lost_ms, h.prefill_ms) {
        // No server said how long these took: the tokens, never "0 ms".
        _ if untimed => format!(
            "lost {}{usd}, time not measured",
            plural(h.lost_tokens, "token")
        ),
        (Some(lost), Some(prefill)) if prefill > 0.0 => {
            let untimed = match h.untimed_tokens {
                0 => String::new(),
                n => format!(", {} untimed", thousands(n)),
            };
            format!(
                "lost {}{usd}, {} ({:.0}% of prefill{untimed})",
                plural(h.lost_tokens, "token"),
                duration(lost),
                100.0 * lost / prefill
            )
        }
        _ if !h.loss_measured => h.loss_not_measured().to_string(),
        _ => format!("lost {}{usd}", plural(h.lost_tokens, "token")),
    }
}

pub fn header<'a>(app: &App, theme: &Theme) -> Line<'a> {
    let h = &app.view().header;
    let width = app.last_size.0.max(20) as usize;
    let source = match &app.source {
        Source::Live {
            upstream, listen, ..
        } => format!("watch {listen} → {upstream}"),
        Source::Replay { files } => format!("replay {files}"),
    };
    if let Input::RequestsOnly(format) = &app.input {
        let mut text = format!(
            " prefixscope · {} of a {format} input",
            plural(app.requests(), "request")
        );
        for part in [
            " (no messages: cache panes only)".to_string(),
            format!(" · {source}"),
        ] {
            if text.chars().count() + part.chars().count() <= width {
                text.push_str(&part);
            }
        }
        return Line::styled(fit(&text, width), theme.title());
    }
    // Filtered, every figure is of the matching rows and the line says so.
    let filter = if h.filter.is_empty() {
        String::new()
    } else {
        format!("filter {}: ", h.filter)
    };
    let requests = if !h.filter.is_empty() {
        format!(
            "{} of {}",
            thousands(h.records),
            plural(h.all_records, "request")
        )
    } else if app.snapshot.simulated != h.records {
        // The hit rate's cold replay counts only what it simulates (no model lists, failed
        // exchanges or non-2xx): both counts, so they never seem to disagree.
        format!(
            "{} ({} simulated)",
            plural(h.records, "request"),
            thousands(app.snapshot.simulated)
        )
    } else {
        plural(h.records, "request")
    };
    // A hosted API is named first: its cache follows the provider's rules, not a slot's.
    let provider = if h.providers.is_empty() {
        String::new()
    } else {
        format!("{} · ", h.providers)
    };
    // What it cost comes first and is never dropped: it is what the user came for. Then the
    // counts and the source, each whole or not at all.
    let title = " prefixscope · ";
    let mut text = format!("{title}{provider}{filter}{}", lost_text(app));
    if text.chars().count() > width {
        return Line::styled(fit(&text, width), theme.title());
    }
    let turns = format!(
        ", {} in {}",
        plural(h.turns, "turn"),
        plural(h.conversations, "conversation")
    );
    for (part, after) in [
        (format!(" · {requests}"), turns),
        (format!(" · {source}"), String::new()),
    ] {
        if text.chars().count() + part.chars().count() > width {
            break;
        }
        text.push_str(&part);
        if text.chars().count() + after.chars().count() <= width {
            text.push_str(&after);
        }
    }
    Line::styled(text, theme.title())
}

/// Counters and state on the left, then the proxy's troubles, then what the last key did.
pub fn status_line<'a>(app: &App, theme: &Theme) -> Line<'a> {
    let width = app.last_size.0.max(20) as usize;
    let mut spans = Vec::new();
    if app.paused {
        spans.push(Span::styled(" PAUSED ", theme.bad()));
    }
    if app.source_paused {
        spans.push(Span::styled(" REPLAY PAUSED (. step) ", theme.bad()));
    }
    // (priority, text): alerts before counters, counters before rates.
    let mut items: Vec<(u8, String)> = vec![(0, format!("{} req", app.requests()))];
    items.push((3, format!("{:.1}/s", app.requests_per_second())));
    if let Some(written) = app.records_written {
        items.push((2, format!("{written} written")));
    }
    if let Some(earlier) = &app.snapshot.earlier {
        // The panes are of the records since the analysis started again.
        items.push((
            0,
            format!(
                "{}: {} earlier req not shown",
                if earlier.window.is_some() {
                    "analysis window"
                } else {
                    "memory budget"
                },
                thousands(earlier.records)
            ),
        ));
    }
    if app.view().header.bad_lines > 0 || app.warnings > 0 {
        items.push((
            1,
            format!(
                "{}, {}",
                plural(app.view().header.bad_lines, "bad line"),
                plural(app.warnings, "warning")
            ),
        ));
    }
    match (&app.source, app.upstream_ok) {
        (Source::Live { .. }, Some(true)) => items.push((2, "upstream ok".into())),
        (Source::Live { .. }, Some(false)) => items.push((0, "UPSTREAM DOWN".into())),
        (Source::Live { .. }, None) => items.push((2, "upstream: no request yet".into())),
        (Source::Replay { .. }, _) => {
            if let Some(speed) = app.speed {
                items.push((2, format!("×{speed}")));
            }
            if app.source_done {
                items.push((1, "done".into()));
            }
        }
    }
    if app.in_flight > 0 {
        items.push((1, format!("{} in flight", app.in_flight)));
    }
    items.extend(app.proxy_notes.iter().map(|note| (1, note.clone())));
    let used: usize = spans.iter().map(|s| s.content.chars().count()).sum();
    // What the last key did is read in full, before the counters that are also elsewhere.
    let status = app
        .status
        .as_ref()
        .map(|s| fit(s, width.saturating_sub(used + 12)));
    let status_width = status.as_ref().map_or(0, |s| s.chars().count() + 3);
    let counters = fit_items(&items, " · ", width.saturating_sub(used + status_width + 2));
    spans.push(Span::raw(format!(" {counters} ")));
    if let Some(status) = status {
        spans.push(Span::styled(format!("│ {status}"), theme.warn()));
    }
    Line::from(spans)
}

/// The keys of the focused pane first, then help and quit, then every other key, as many whole
/// keys as the width holds.
pub fn key_bar<'a>(app: &App, theme: &Theme) -> Line<'a> {
    let width = app.last_size.0.max(20) as usize;
    let pane: &[&str] = match app.focus {
        Pane::Conversations => &["←→ turn", "↵ open turn"],
        Pane::Breaks => &["↑↓ break", "↵ open turn"],
        Pane::Losses => &["↑↓ client", "↵ its causes"],
        Pane::HitRate => &["↵ -np / --cache-ram", "c chart"],
        Pane::Prefixes => &["↑↓ prefix", "↵ contents", "t sort"],
    };
    let mut keys: Vec<&str> = Vec::new();
    if matches!(app.dialog, Some(crate::tui::app::Dialog::Detail { .. })) {
        keys.extend([
            "Esc back",
            "? help",
            "q quit",
            "v its evictor",
            "u its parent",
            "↑↓ PgUp PgDn Home End scroll",
            "o write to a file",
        ]);
    } else if app.dialog.is_some() {
        keys.extend([
            "Esc back",
            "? help",
            "q quit",
            "↑↓ PgUp PgDn Home End scroll/select",
            "↵ open",
            "o write to a file",
        ]);
    } else if app.source_paused {
        keys.extend([
            ". one record",
            "] ten",
            "p resume",
            "? help",
            "q quit",
            "g seek",
        ]);
        keys.extend(pane);
        keys.extend(["Tab pane", "f fixes"]);
    } else {
        keys.extend(pane);
        keys.extend([
            "? help", "q quit", "Tab pane", "f fixes", "w who", "z zoom", "p pause",
        ]);
        if matches!(app.source, Source::Replay { .. }) && !app.source_done {
            keys.push("g seek");
        }
        keys.extend([
            "/ filter",
            "s snapshot",
            "e export",
            "c chart",
            "t sort",
            "m mouse",
            "+/- speed",
        ]);
    }
    let items: Vec<(u8, String)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (u8::try_from(i).unwrap_or(u8::MAX), (*k).to_string()))
        .collect();
    Line::from(Span::styled(
        format!(" {}", fit_items(&items, "  ", width.saturating_sub(1))),
        theme.dim(),
    ))
}
