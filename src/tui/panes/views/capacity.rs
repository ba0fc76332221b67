//! The capacity view: the what-if at every setting beside the real server, and who held
//! each slot.

use ratatui::style::Style;
use ratatui::text::{Line, Span};

use crate::tui::app::App;
use crate::tui::theme::Theme;
use crate::tui::view::{duration, thousands, tokens};
use prefixscope_core::live::Predictions;
use prefixscope_core::units::plural;

/// The capacity view in llama.cpp's terms: hit rate and tokens and seconds lost under the
/// simulated llama-server at `-np` 1/2/4/8 × `--cache-ram` off/on, each `prefixscope whatif FILE
/// --slots N --cache-ram …` on the same records, beside what the real server reported.
pub fn capacity_lines<'a>(app: &App, theme: &Theme) -> Vec<Line<'a>> {
    // The real server's settings as it says them (its probes), then the simulated ones.
    let server = &app.snapshot.server;
    let mut said = vec![Line::styled(server.line(), theme.dim())];
    let slots = server.slot_texts();
    if !slots.is_empty() {
        said.push(Line::styled(
            format!("slots now: {}", slots.join(" · ")),
            theme.dim(),
        ));
    }
    said.extend(simulated_capacity_lines(app, theme));
    said
}

pub(super) fn simulated_capacity_lines<'a>(app: &App, theme: &Theme) -> Vec<Line<'a>> {
    let predictions = &app.snapshot.predictions;
    let Predictions::Ready(all) = &**predictions else {
        let why = match &**predictions {
            Predictions::NotAsked => "working out the simulated server's settings…".to_string(),
            Predictions::TooMany(n) => format!(
                "run prefixscope whatif FILE --slots N --cache-ram on|off; {} records is past the live what-if's {} or {} MiB of bodies ({})",
                thousands(*n),
                thousands(prefixscope_core::live::MAX_WHATIF_RECORDS as u64),
                prefixscope_core::live::MAX_WHATIF_BODY_BYTES >> 20,
                prefixscope_core::live::WHATIF_CAP_COST
            ),
            _ => "the simulated llama-server replays llama.cpp's chat requests with the server's counts only"
                .to_string(),
        };
        return vec![Line::styled(why, theme.dim())];
    };
    let Some(first) = all.first() else {
        return Vec::new();
    };
    let mut lines = vec![
        Line::styled(
            format!(
                "{} replayed in the order they reached the server (prefixscope whatif FILE --slots N --cache-ram off|on)",
                plural(first.replayed as u64, "request")
            ),
            theme.dim(),
        ),
        Line::styled(
            format!(
                "the real server: {}, {}",
                first
                    .recorded_hit_rate
                    .map_or("reuse not reported".into(), |h| format!(
                        "{:.1}% reused",
                        h * 100.0
                    )),
                // A loss is measured only with the server's timings (llmp's rule): without
                // them it is not measured, never zero.
                first.recorded.lost_ms.map_or(
                    "loss not measured (no reuse and timing counts)".into(),
                    |ms| format!(
                        "lost {} tokens, {}",
                        thousands(first.recorded.lost_tokens),
                        duration(ms)
                    )
                )
            ),
            theme.title(),
        ),
        Line::raw(String::new()),
    ];
    // The server's own settings (its /props, else inferred from the traffic) are marked.
    let own = predictions.baseline().map(|b| {
        prefixscope_core::analysis::Lever::of_settings(b.settings.slots, b.settings.cache_ram)
    });
    lines.push(Line::styled(
        format!("{:<8}{:<32}{}", "", "--cache-ram off", "--cache-ram on"),
        theme.dim(),
    ));
    lines.push(Line::styled(
        format!(
            "{:<8}{:<32}{}",
            "slots", "reused    lost     time", "reused    lost     time"
        ),
        theme.dim(),
    ));
    for slots in [1usize, 2, 4, 8] {
        let cell = |cache_ram: bool| -> (String, bool) {
            let lever = prefixscope_core::analysis::Lever::of_settings(slots, cache_ram);
            match all.iter().find(|p| p.lever == lever) {
                Some(p) => (
                    format!(
                        "{:>5.1}% {:>7} {:>8}{}",
                        p.hit_rate * 100.0,
                        tokens(p.predicted.lost_tokens),
                        p.predicted.lost_ms.map_or("-".into(), duration),
                        if own == Some(lever) { " ◀" } else { "" }
                    ),
                    own == Some(lever),
                ),
                None => ("-".into(), false),
            }
        };
        let (off, off_near) = cell(false);
        let (on, on_near) = cell(true);
        let style = |near: bool| {
            if near {
                theme.title()
            } else {
                Style::default()
            }
        };
        lines.push(Line::from(vec![
            Span::raw(format!("{:<8}", format!("-np {slots}"))),
            Span::styled(format!("{off:<32}"), style(off_near)),
            Span::styled(on, style(on_near)),
        ]));
    }
    lines.push(Line::raw(String::new()));
    if let Some(baseline) = predictions.baseline() {
        lines.push(Line::styled(
            format!("◀ the server's own settings: {}", baseline.settings_text()),
            theme.dim(),
        ));
        lines.extend(super::turn::calibration_line(predictions, "", theme));
    }
    lines.push(Line::styled(
        "-np: llama-server's slots (one conversation's cache each); --cache-ram: its host-memory prompt cache, unbounded here",
        theme.dim(),
    ));
    lines.extend(slot_lines(app, theme));
    lines
}

/// Who holds each slot now, as the replay with the server's settings has it, how often that
/// replay matched what the server reported, and what each conversation's next request would
/// evict: a reconstruction, said as one.
pub(super) fn slot_lines<'a>(app: &App, theme: &Theme) -> Vec<Line<'a>> {
    let Some(view) = &*app.snapshot.slots else {
        return Vec::new();
    };
    let r = &view.residency;
    let aliases = &app.view().aliases;
    let who = |conversation: Option<u32>, client: &str, record: u64| match conversation {
        Some(c) => format!("c{c} {} (#{record})", aliases.of(client)),
        None => format!("#{record} {} (no conversation)", aliases.of(client)),
    };
    let mut lines = vec![
        Line::raw(String::new()),
        Line::styled(
            format!(
                "who holds each slot, replayed at -np {} --cache-ram {} ({})",
                r.slots,
                if r.cache_ram { "on" } else { "off" },
                view.source
            ),
            theme.title(),
        ),
    ];
    for (slot, holder) in r.holders.iter().enumerate() {
        lines.push(Line::raw(format!(
            "  slot {slot}  {}",
            holder.as_ref().map_or("empty".to_string(), |h| who(
                h.conversation,
                &h.client,
                h.record
            ))
        )));
    }
    if r.cache_ram {
        lines.push(Line::raw(format!(
            "  host cache  {}",
            plural(r.host_prompts as u64, "prompt")
        )));
    }
    let (compared, agreed) = r
        .calibration
        .iter()
        .fold((0, 0), |(c, a), m| (c + m.compared, a + m.agreed));
    lines.push(Line::styled(
        if compared == 0 {
            "  calibration: not measured (no request with the server's reuse count)".to_string()
        } else {
            let disagreed: Vec<String> = r
                .disagreements
                .iter()
                .take(6)
                .map(|(id, _, _)| format!("#{id}"))
                .collect();
            format!(
                "  calibration: the replay matched the server's reuse on {agreed} of {compared} requests{}",
                if disagreed.is_empty() {
                    String::new()
                } else {
                    format!("; not on {}", disagreed.join(" "))
                }
            )
        },
        theme.dim(),
    ));
    // Requests in flight: predicted from their bodies as they started, before the server answered.
    for start in r.starting.iter().take(4) {
        let whose = match start.conversation {
            Some(c) => format!("c{c} {}", aliases.of(&start.client)),
            None => "a new conversation".to_string(),
        };
        let slot = if start.queued {
            format!("waits, then slot {}", start.slot)
        } else {
            format!("slot {}", start.slot)
        };
        let place = match &start.evicts {
            Some(evicts) => format!(
                "{slot}, evicting {}{} (predicted; reuses {:.0}%)",
                who(evicts.conversation, &evicts.client, evicts.record),
                if start.saved_to_host {
                    ", saved to host memory"
                } else {
                    ""
                },
                start.reused_share * 100.0
            ),
            None => format!(
                "{slot} (predicted; reuses {:.0}%)",
                start.reused_share * 100.0
            ),
        };
        let line = format!("  in flight: #{} of {whose} → {place}", start.record);
        lines.push(if start.evicts.is_some() && !start.saved_to_host {
            Line::styled(line, theme.warn())
        } else {
            Line::raw(line)
        });
    }
    for next in r.next_evictions.iter().take(4) {
        lines.push(Line::raw(format!(
            "  next: a request of c{} {} takes slot {} from {}{}",
            next.conversation,
            aliases.of(&next.client),
            next.slot,
            who(
                next.evicts.conversation,
                &next.evicts.client,
                next.evicts.record
            ),
            if next.saved_to_host {
                ", saved to host memory"
            } else {
                ""
            }
        )));
    }
    lines
}
