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

/// The `(priority, text)` items that fit in `width` joined by `sep`, in their own order: taken
/// lowest priority number first, each whole or not at all (a narrow terminal drops an item,
/// never the end of a figure). The first item taken is cut only if it alone is too wide.
pub fn fit_items(items: &[(u8, String)], sep: &str, width: usize) -> String {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| items[i].0);
    let sep_width = sep.chars().count();
    let mut kept = vec![false; items.len()];
    let mut used = 0;
    for i in order {
        let w = items[i].1.chars().count();
        let extra = if used == 0 { w } else { w + sep_width };
        if used + extra <= width {
            kept[i] = true;
            used += extra;
        } else if used == 0 {
            return fit(&items[i].1, width);
        }
    }
    let kept: Vec<&str> = items
        .iter()
        .zip(&kept)
        .filter(|(_, k)| **k)
        .map(|((_, text), _)| text.as_str())
        .collect();
    kept.join(sep)
}

/// Cuts a name to `width` in its middle, so names that differ only at the end (`agent #1`,
/// `agent #2`) stay told apart.
pub fn fit_name(name: &str, width: usize) -> String {
    let chars: Vec<char> = name.chars().collect();
    if chars.len() <= width {
        return name.to_string();
    }
    if width < 4 {
        return fit(name, width);
    }
    let tail = (width - 1) / 2;
    let head = width - 1 - tail;
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len() - tail..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_dropped_whole_by_priority() {
        let items = [
            (0, "lost 8,604 tokens".to_string()),
            (2, "22 turns".to_string()),
            (1, "24 requests".to_string()),
        ];
        assert_eq!(
            fit_items(&items, " · ", 80),
            "lost 8,604 tokens · 22 turns · 24 requests"
        );
        assert_eq!(
            fit_items(&items, " · ", 34),
            "lost 8,604 tokens · 24 requests"
        );
        assert_eq!(fit_items(&items, " · ", 20), "lost 8,604 tokens");
        assert_eq!(fit_items(&items, " · ", 10), "lost 8,60…");
    }

    #[test]
    fn names_keep_their_ends() {
        assert_eq!(fit_name("llmp-drive #1", 13), "llmp-drive #1");
        assert_eq!(fit_name("llmp-drive #1", 9), "llmp…e #1");
        assert_eq!(fit_name("llmp-drive #2", 8), "llmp… #2");
    }
}
