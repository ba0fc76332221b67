//! The header (what is watched, what it cost) and the status bar (counters, state, keys).

use ratatui::text::{Line, Span};

use super::fit;
use crate::tui::app::{App, Input, Pane, Source};
use crate::tui::theme::Theme;
use crate::tui::view::{duration, thousands, tokens};
use prefixscope_core::units::plural;

pub fn header<'a>(app: &App, theme: &Theme) -> Line<'a> {
    let h = &app.view().header;
    if let Input::RequestsOnly(format) = &app.input {
        let source = match &app.source {
            Source::Replay { files } => files.clone(),
            Source::Live { upstream, .. } => upstream.clone(),
        };
        let text = format!(
            " prefixscope · {} of a {format} input (no messages: cache panes only) · replay {source}",
            plural(app.requests(), "request")
        );
        return Line::styled(fit(&text, app.last_size.0.max(80) as usize), theme.title());
    }
    let source = match &app.source {
        Source::Live {
            upstream, listen, ..
        } => format!("watch {listen} → {upstream}"),
        Source::Replay { files } => format!("replay {files}"),
    };
    let untimed = h.untimed_tokens > 0 && h.untimed_tokens == h.lost_tokens;
    // The dollars beside the tokens, where a price is known.
    let usd = h
        .lost_usd
        .map(|usd| format!(" ({})", prefixscope_core::pricing::dollars(usd)))
        .unwrap_or_default();
    let lost = match (h.lost_ms, h.prefill_ms) {
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
    };
    // What it cost comes first: it is what the user came for, and a narrow terminal cuts the
    // end of the line. Filtered, every figure is of the matching rows and the line says so.
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
    let text = format!(
        " prefixscope · {provider}{filter}{lost} · {requests}, {} in {} · {source}",
        plural(h.turns, "turn"),
        plural(h.conversations, "conversation")
    );
    Line::styled(fit(&text, app.last_size.0.max(80) as usize), theme.title())
}

pub fn status_line<'a>(app: &App, theme: &Theme) -> Line<'a> {
    let mut spans = Vec::new();
    if app.paused {
        spans.push(Span::styled(" PAUSED ", theme.bad()));
    }
    if app.source_paused {
        spans.push(Span::styled(" REPLAY PAUSED (. step) ", theme.bad()));
    }
    let mut parts = vec![
        format!("{} req", app.requests()),
        format!("{:.1}/s", app.requests_per_second()),
    ];
    if let Some(written) = app.records_written {
        parts.push(format!("{written} written"));
    }
    if let Some(earlier) = &app.snapshot.earlier {
        // The panes are of the records since the analysis started again.
        parts.push(format!(
            "memory budget: {} earlier req not shown",
            thousands(earlier.records)
        ));
    }
    if app.view().header.bad_lines > 0 || app.warnings > 0 {
        parts.push(format!(
            "{}, {}",
            plural(app.view().header.bad_lines, "bad line"),
            plural(app.warnings, "warning")
        ));
    }
    match (&app.source, app.upstream_ok) {
        (Source::Live { .. }, Some(true)) => parts.push("upstream ok".into()),
        (Source::Live { .. }, Some(false)) => parts.push("UPSTREAM DOWN".into()),
        (Source::Live { .. }, None) => parts.push("upstream: no request yet".into()),
        (Source::Replay { .. }, _) => {
            if let Some(speed) = app.speed {
                parts.push(format!("×{speed}"));
            }
            if app.source_done {
                parts.push("done".into());
            }
        }
    }
    if app.in_flight > 0 {
        parts.push(format!("{} in flight", app.in_flight));
    }
    parts.extend(app.proxy_notes.iter().cloned());
    spans.push(Span::raw(format!(" {} ", parts.join(" · "))));
    if let Some(status) = &app.status {
        spans.push(Span::styled(format!("│ {status} "), theme.warn()));
    }
    let used: usize = spans.iter().map(|s| s.content.chars().count()).sum();
    let width = app.last_size.0 as usize;
    // The focused pane's keys first, then every other.
    let pane = match app.focus {
        Pane::Conversations => " ←→ turn  ↵ open turn ",
        Pane::Breaks => " ↑↓ break  ↵ open turn ",
        Pane::Losses => " ↑↓ client  ↵ its causes  w who cost whom ",
        Pane::HitRate => " ↵ -np / --cache-ram  c chart ",
        Pane::Prefixes => " ↑↓ prefix  ↵ contents  t sort ",
    };
    let keys = if app.dialog.is_some() {
        " Esc back  ↑↓ PgUp PgDn Home End scroll/select  ↵ open  o write to a file  ? help  q quit"
            .to_string()
    } else if app.source_paused {
        format!(" . one record  ] ten  g seek  p resume ·{pane}· ? help  Tab pane  f fixes  q quit")
    } else {
        let seek = if matches!(app.source, Source::Replay { .. }) && !app.source_done {
            "  g seek"
        } else {
            ""
        };
        format!(
            "{pane}· ? help  Tab pane  f fixes  w who  z zoom  p pause{seek}  / filter  s snapshot  e export  c chart  t sort  m mouse  +/- speed  q quit"
        )
    };
    if width > used + 10 {
        spans.push(Span::styled(fit(&keys, width - used), theme.dim()));
    }
    let _ = tokens;
    Line::from(spans)
}
