//! `prefixscope whatif`: a recording's requests replayed against the simulated llama-server with
//! other settings (slots, host cache); predicted tokens and seconds lost by cause next to the
//! recorded ones, and what the prediction assumed.

use std::path::PathBuf;

use clap::Args;

use super::demo::OnOff;
use super::{EXIT_UNREADABLE, EXIT_USAGE, read_recordings};
use prefixscope_core::analysis::{Config, analyze};
use prefixscope_core::sim::{AGREE_SHARE, AGREE_TOKENS, Holder, Residency, residency};
use prefixscope_core::sim::{RecordedSettings, Replayable, TRUSTED_AGREEMENT, Totals, WhatIf};
use prefixscope_core::units::thousands;

#[derive(Args)]
pub struct WhatIfArgs {
    /// Recordings (prefixscope's or llmp's JSON Lines) with llama.cpp's timings.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The server's slots (`-np`) [default: the recording's own: its /props, else inferred]
    #[arg(long)]
    slots: Option<usize>,
    /// The server's host-memory prompt cache (llama-server's `--cache-ram`) [default: the
    /// recording's own, inferred from the traffic; on, llama-server's default, where it does
    /// not tell]
    #[arg(long, value_enum)]
    cache_ram: Option<OnOff>,
    /// A sliding-window model given a full-size cache (llama-server's `--swa-full`)
    #[arg(long)]
    swa_full: bool,
    /// The whole result as JSON on stdout.
    #[arg(long)]
    json: bool,
}

pub fn run(args: WhatIfArgs) -> u8 {
    if args.slots.is_some_and(|slots| slots == 0 || slots > 1024) {
        prefixscope_core::stderr_line!("prefixscope: --slots must be between 1 and 1024");
        return EXIT_USAGE;
    }
    let Some(read) = read_recordings(&args.files) else {
        return EXIT_UNREADABLE;
    };
    // The recording's own settings, each with its source; an option given replaces its own.
    let replayable = Replayable::of(&read.records);
    let own = replayable.settings(None);
    let settings = RecordedSettings {
        sliding_window: own.sliding_window.clone().filter(|_| !args.swa_full),
        slots: args.slots.unwrap_or(own.slots),
        slots_source: match args.slots {
            Some(_) => "given (--slots)".into(),
            None => own.slots_source.clone(),
        },
        cache_ram: args.cache_ram.map_or(own.cache_ram, |c| c == OnOff::On),
        cache_ram_source: match args.cache_ram {
            Some(_) => "given (--cache-ram)".into(),
            None => own.cache_ram_source.clone(),
        },
    };
    let (slots_given, cache_ram) = (settings.slots, settings.cache_ram);
    let recorded = analyze(&read.records, &Config::default());
    let result = replayable.what_if(slots_given, cache_ram, args.swa_full, &recorded);
    let slots = residency(&read.records, &recorded, slots_given, cache_ram);
    if args.json {
        let mut value = serde_json::to_value(&result).unwrap_or_default();
        value["residency"] = serde_json::to_value(&slots).unwrap_or_default();
        value["settings"] = serde_json::to_value(&settings).unwrap_or_default();
        value["recorded_settings"] = serde_json::to_value(&own).unwrap_or_default();
        super::print_json(&serde_json::to_string_pretty(&value).unwrap_or_default());
    } else {
        let mut text = render(&result);
        text.push_str(&format!(
            "settings: {} slot{} ({}); host cache {} ({}); {}\n",
            settings.slots,
            if settings.slots == 1 { "" } else { "s" },
            settings.slots_source,
            if settings.cache_ram { "on" } else { "off" },
            settings.cache_ram_source,
            match &settings.sliding_window {
                Some((window, source)) => format!(
                    "sliding window {} tokens ({source}; --swa-full lifts it)",
                    thousands(*window as u64)
                ),
                None if args.swa_full => "full-size cache (given: --swa-full)".into(),
                None => "full attention".into(),
            }
        ));
        text.push_str(&render_residency(&slots));
        super::print_stdout(&text);
    }
    read.exit_code()
}

/// How far the replay is to be trusted with these settings, and who holds the cache at the end.
fn render_residency(r: &Residency) -> String {
    let mut out = String::new();
    let (compared, agreed) = r
        .calibration
        .iter()
        .fold((0, 0), |(c, a), m| (c + m.compared, a + m.agreed));
    if compared == 0 {
        out.push_str("calibration: not measured (no request with the server's reuse count)\n");
    } else {
        let models: Vec<String> = r
            .calibration
            .iter()
            .map(|m| format!("{} {}/{}", m.model, m.agreed, m.compared))
            .collect();
        out.push_str(&format!(
            "calibration: with these settings the simulation's reuse matched the server's on {agreed} of {compared} requests (within {AGREE_TOKENS} tokens or {:.0}% of the prompt; {}): if these are the server's own settings, that is how far the rest is to be trusted\n",
            AGREE_SHARE * 100.0,
            models.join(", ")
        ));
        if (agreed as f64) < TRUSTED_AGREEMENT * compared as f64 {
            out.push_str(&format!(
                "not to be trusted: under {:.0}% of the requests agree with the server\n",
                TRUSTED_AGREEMENT * 100.0
            ));
        }
    }
    let who = |h: &Holder| match h.conversation {
        Some(c) => format!("conversation {c} ({}), #{}", h.client, h.record),
        None => format!("#{} ({}, no conversation)", h.record, h.client),
    };
    for (slot, holder) in r.holders.iter().enumerate() {
        out.push_str(&format!(
            "slot {slot} at the end: {}\n",
            holder.as_ref().map_or("empty".into(), who)
        ));
    }
    if r.cache_ram {
        out.push_str(&format!(
            "host cache at the end: {} prompt{}\n",
            r.host_prompts,
            if r.host_prompts == 1 { "" } else { "s" }
        ));
    }
    for next in &r.next_evictions {
        out.push_str(&format!(
            "next: a request of conversation {} ({}) would take slot {} from {}{}\n",
            next.conversation,
            next.client,
            next.slot,
            who(&next.evicts),
            if next.saved_to_host {
                " (saved to host memory)"
            } else {
                ""
            }
        ));
    }
    out
}

fn render(w: &WhatIf) -> String {
    let mut out = format!(
        "prefixscope whatif: {} requests replayed against a simulated llama-server with {} slot{}, host cache {} ({} records not replayed)\n",
        w.replayed,
        w.slots,
        if w.slots == 1 { "" } else { "s" },
        if w.cache_ram { "on" } else { "off" },
        w.not_replayed
    );
    let seconds = |ms: Option<f64>| ms.map_or("-".into(), |ms| format!("{:.2} s", ms / 1000.0));
    let pair = |tokens: u64, ms: Option<f64>| format!("{} tok {}", thousands(tokens), seconds(ms));
    let mut rows = vec![
        (
            String::new(),
            "recorded".to_string(),
            "predicted".to_string(),
        ),
        (
            "prefill".into(),
            seconds(w.recorded.prefill_ms),
            seconds(w.predicted.prefill_ms),
        ),
        (
            "lost".into(),
            pair(w.recorded.lost_tokens, w.recorded.lost_ms),
            pair(w.predicted.lost_tokens, w.predicted.lost_ms),
        ),
    ];
    for cause in causes(&w.recorded, &w.predicted) {
        let of = |t: &Totals| {
            t.by_cause
                .iter()
                .find(|(c, _, _)| *c == cause)
                .map_or((0, None), |(_, tokens, ms)| (*tokens, *ms))
        };
        let (rt, rm) = of(&w.recorded);
        let (pt, pm) = of(&w.predicted);
        rows.push((format!("  {cause}"), pair(rt, rm), pair(pt, pm)));
    }
    // Columns as wide as their widest figure (and a gap), so large recordings stay aligned.
    let width = rows
        .iter()
        .map(|(_, recorded, predicted)| recorded.len().max(predicted.len()) + 2)
        .fold(22, usize::max);
    for (label, recorded, predicted) in rows {
        out.push_str(&format!(
            "{label:<24}{recorded:>width$}{predicted:>width$}\n"
        ));
    }
    out.push_str("assumed:\n");
    for assumption in &w.assumptions {
        out.push_str(&format!("  - {assumption}\n"));
    }
    out
}

fn causes(a: &Totals, b: &Totals) -> Vec<String> {
    let mut causes: Vec<String> = a
        .by_cause
        .iter()
        .chain(&b.by_cause)
        .map(|(c, _, _)| c.clone())
        .collect();
    causes.sort();
    causes.dedup();
    causes
}
