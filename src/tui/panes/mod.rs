//! One file per pane; each draws from the app's view and never changes it.

pub mod breaks;
pub mod conversations;
pub mod dialogs;
pub mod hit_rate;
pub mod losses;
pub mod prefixes;
pub mod status;
pub mod views;

/// `HH:MM:SS` (UTC) of a Unix-ms time.
pub fn clock(ms: i64) -> String {
    let s = ms.div_euclid(1000).rem_euclid(86_400);
    format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// Cuts to `width` characters, marking the cut.
pub fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let mut out: String = text.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}
