//! The client view: what a client suffered and what it caused.

use ratatui::text::Line;

use crate::tui::app::App;
use crate::tui::theme::Theme;
use crate::tui::view::{duration, shown, thousands};
use prefixscope_core::units::plural;

pub fn client_lines<'a>(app: &App, index: usize, theme: &Theme) -> Vec<Line<'a>> {
    let Some(l) = app.view().losses.get(index) else {
        return vec![Line::raw("not in the current view")];
    };
    let time = |ms: Option<f64>| ms.map_or("time not measured".into(), duration);
    let mut lines = vec![
        Line::styled(format!("{} ({})", l.alias, shown(&l.client)), theme.title()),
        Line::raw(format!(
            "{} in {}",
            plural(u64::from(l.requests), "request"),
            plural(u64::from(l.conversations), "conversation")
        )),
        Line::raw(String::new()),
        Line::styled(
            format!(
                "suffered: {} tokens, {} (lost on its own turns)",
                thousands(l.tokens),
                time(l.ms)
            ),
            theme.title(),
        ),
    ];
    if l.by_cause.is_empty() {
        lines.push(Line::styled("  nothing", theme.dim()));
    }
    for (cause, tokens) in &l.by_cause {
        lines.push(Line::raw(format!("  {cause}: {}", thousands(*tokens))));
    }
    let mut from: Vec<(String, u64)> = app
        .view()
        .who_cost_whom
        .iter()
        .filter(|(_, v, _)| *v == l.client)
        .map(|(c, _, t)| {
            let who = match c.as_deref() {
                None => "(the server, on its own)".to_string(),
                Some(c) if c == l.client => format!("{} (itself)", app.view().aliases.of(c)),
                Some(c) => app.view().aliases.of(c),
            };
            (who, *t)
        })
        .collect();
    from.sort_by_key(|f| std::cmp::Reverse(f.1));
    if !from.is_empty() {
        lines.push(Line::raw("  from:"));
        for (who, tokens) in from {
            lines.push(Line::raw(format!("    {who}: {}", thousands(tokens))));
        }
    }
    lines.push(Line::raw(String::new()));
    lines.push(Line::styled(
        format!(
            "caused: {} tokens, {} (its own breaks, and the evictions evicted_by names it for)",
            thousands(l.caused_tokens),
            time(l.caused_ms)
        ),
        theme.title(),
    ));
    if l.caused_by_cause.is_empty() {
        lines.push(Line::styled("  nothing", theme.dim()));
    }
    for (cause, tokens) in &l.caused_by_cause {
        lines.push(Line::raw(format!("  {cause}: {}", thousands(*tokens))));
    }
    if !l.caused_to.is_empty() {
        lines.push(Line::raw("  to:"));
        let aliases = app.snapshot.view.aliases.clone();
        for (victim, tokens) in &l.caused_to {
            let whom = if *victim == l.client {
                format!("{} (itself)", aliases.of(victim))
            } else {
                aliases.of(victim)
            };
            lines.push(Line::raw(format!("    {whom}: {}", thousands(*tokens))));
        }
    }
    lines
}
