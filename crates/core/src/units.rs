//! Numbers, durations and loss causes as people read them: one home for the report's text, the
//! TUI's panes and the commands' summaries, so each shows a figure the same way. Pure; no
//! terminal library.

/// 12345678 → `12,345,678`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `850 ms`, `1.5 s`, `2.5 min`: one unit with a decimal, for narrow columns (the TUI).
pub fn duration_decimal(ms: f64) -> String {
    if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else if ms < 60_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        format!("{:.1} min", ms / 60_000.0)
    }
}

/// `850 ms`, `12.5 s`, then whole units: `2m 30s`, `1h 5m`; negative is `0 ms`. For sentences
/// (the analysis report's text), where a long wait reads better as minutes and seconds.
pub fn duration_compound(ms: f64) -> String {
    let ms = ms.max(0.0);
    if ms < 1000.0 {
        return format!("{ms:.0} ms");
    }
    let seconds = ms / 1000.0;
    if seconds < 60.0 {
        return format!("{seconds:.1} s");
    }
    let total = seconds.round() as u64;
    let (hours, minutes, seconds) = (total / 3600, total / 60 % 60, total % 60);
    if hours > 0 {
        format!("{hours}h {minutes}m")
    } else {
        format!("{minutes}m {seconds}s")
    }
}

/// A loss cause's short name for one break (`tools changed`), and as what happened, counted
/// over many breaks (`tool list changes`): the report's sentences ("lost to tool list
/// changes"). `None` for an unknown cause.
fn cause_labels(cause: &str) -> Option<(&'static str, &'static str)> {
    Some(match cause {
        "tools_changed" => ("tools changed", "tool list changes"),
        "system_changed" => ("system prompt changed", "system prompt changes"),
        "history_rewritten" => ("history rewritten", "history rewrites"),
        "history_reordered" => ("history reordered", "history reorders"),
        "history_dropped" => ("messages dropped", "messages dropped from the history"),
        "side_call" => ("side-call", "side-calls"),
        "other_conversation" => ("other conversation", "other conversations"),
        "other_model" => ("other model", "other models"),
        "server_empty" => ("server emptied cache", "server cache emptied"),
        "server_head_only" => ("server kept head only", "server kept only the head"),
        "server_rollback" => ("server rolled back", "server cache rolled back"),
        "no_cache_breakpoint" => ("no cache_control breakpoint", "no cache_control breakpoint"),
        "cache_expired" => ("cache expired", "cache expired"),
        "provider_miss" => ("provider cache miss", "provider cache misses"),
        _ => return None,
    })
}

/// A loss cause's short name, for one break; unknown causes pass as they are.
pub fn cause_label(cause: &str) -> &str {
    cause_labels(cause).map_or(cause, |(one, _)| one)
}

/// A loss cause as what happened, counted over many breaks; unknown causes pass as they are.
pub fn cause_label_plural(cause: &str) -> &str {
    cause_labels(cause).map_or(cause, |(_, many)| many)
}

/// A unit variant's name as serde writes it (its `rename`s): the name reports and exports use,
/// one table with the derive. Empty for a value that is not written as a string.
pub fn serde_name(value: impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => name,
        _ => String::new(),
    }
}

/// `1 turn`, `2 turns`, `1,200 turns`.
pub fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{} {noun}s", thousands(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(27_038_068), "27,038,068");
    }

    #[test]
    fn durations_in_both_forms() {
        assert_eq!(duration_decimal(850.0), "850 ms");
        assert_eq!(duration_decimal(1_500.0), "1.5 s");
        assert_eq!(duration_decimal(150_000.0), "2.5 min");
        assert_eq!(duration_compound(-5.0), "0 ms");
        assert_eq!(duration_compound(12_500.0), "12.5 s");
        assert_eq!(duration_compound(150_000.0), "2m 30s");
        assert_eq!(duration_compound(3_900_000.0), "1h 5m");
    }

    #[test]
    fn cause_labels() {
        assert_eq!(cause_label("tools_changed"), "tools changed");
        assert_eq!(cause_label_plural("tools_changed"), "tool list changes");
        assert_eq!(cause_label("new_cause"), "new_cause");
    }
}
