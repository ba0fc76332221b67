//! Who cost whom: the losses between clients.

use ratatui::text::Line;

use crate::tui::app::App;
use crate::tui::theme::Theme;
use crate::tui::view::tokens;

/// Who cost whom: a row per client that caused a loss (the server for its own), a column per
/// client that suffered one, tokens in each cell; a client's own breaks on the diagonal.
pub fn who_cost_whom_lines<'a>(app: &App, theme: &Theme) -> Vec<Line<'a>> {
    let view = app.view();
    let aliases = &view.aliases;
    let name = |c: &Option<String>| {
        c.as_deref()
            .map_or("(server)".to_string(), |c| aliases.of(c))
    };
    // Clients in the Loss pane's order (by cost), then any other.
    let mut victims: Vec<&str> = view.losses.iter().map(|l| l.client.as_str()).collect();
    let mut causers: Vec<Option<&str>> = victims.iter().map(|v| Some(*v)).collect();
    for (c, v, _) in &view.who_cost_whom {
        if !victims.contains(&v.as_str()) {
            victims.push(v);
        }
        if !causers.contains(&c.as_deref()) {
            causers.push(c.as_deref());
        }
    }
    let tokens_of = |c: Option<&str>, v: &str| -> u64 {
        view.who_cost_whom
            .iter()
            .filter(|(cc, vv, _)| cc.as_deref() == c && vv == v)
            .map(|e| e.2)
            .sum()
    };
    causers.retain(|c| victims.iter().any(|v| tokens_of(*c, v) > 0));
    if causers.is_empty() {
        return vec![Line::styled("nothing lost yet", theme.dim())];
    }
    let width = victims
        .iter()
        .map(|v| aliases.of(v).chars().count())
        .max()
        .unwrap_or(6)
        .clamp(7, 12);
    let first = causers
        .iter()
        .map(|c| name(&c.map(str::to_string)).chars().count())
        .max()
        .unwrap_or(8)
        .clamp(8, 16);
    // Cut the user agent, never the `#2` that tells two clients apart.
    let fit = |s: String, w: usize| match s.rsplit_once(" #") {
        Some((agent, n)) if s.chars().count() > w && n.len() + 3 < w => {
            format!("{} #{n}", crate::tui::panes::fit(agent, w - n.len() - 2))
        }
        _ => crate::tui::panes::fit(&s, w),
    };
    let mut lines = vec![
        Line::styled(
            "a row per client that caused the loss, a column per client that lost it; where both meet: its own breaks, and its own conversations evicting each other",
            theme.dim(),
        ),
        Line::raw(String::new()),
    ];
    let mut head = format!("{:<first$} ", "caused by");
    head = fit(head, first + 1);
    for v in &victims {
        head.push_str(&format!(" {:>width$}", fit(aliases.of(v), width)));
    }
    head.push_str(&format!(" {:>8}", "caused"));
    lines.push(Line::styled(head, theme.title()));
    for c in &causers {
        let mut row = format!("{:<first$} ", fit(name(&c.map(str::to_string)), first));
        let mut total = 0;
        for v in &victims {
            let t = tokens_of(*c, v);
            total += t;
            row.push_str(&format!(
                " {:>width$}",
                if t == 0 { "·".to_string() } else { tokens(t) }
            ));
        }
        row.push_str(&format!(" {:>8}", tokens(total)));
        lines.push(Line::raw(row));
    }
    let mut row = format!("{:<first$} ", "suffered");
    let mut all = 0;
    for v in &victims {
        let t: u64 = causers.iter().map(|c| tokens_of(*c, v)).sum();
        all += t;
        row.push_str(&format!(" {:>width$}", tokens(t)));
    }
    row.push_str(&format!(" {:>8}", tokens(all)));
    lines.push(Line::styled(row, theme.title()));
    lines
}
