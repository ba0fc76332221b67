//! Hit rate by cache capacity: a sparkline of the LRU curve with the ceiling and the server's
//! observed reuse; `c` expands it to a chart of FIFO / LRU / optimal. Live, it is a cold
//! replay, and says so.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::symbols;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Axis, Chart, Dataset, GraphType, Paragraph, Sparkline};

use super::fit;
use crate::tui::app::App;
use crate::tui::theme::{Series, Theme};
use crate::tui::ui::empty;

type CurvePoint = (String, f64, f64, Option<f64>);

pub fn draw(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    // What the server says it is (its probes, live or recorded), above what the cache did:
    // "server: not probed" when nothing was asked, never a zero.
    let [server, area] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    frame.render_widget(
        Paragraph::new(Line::styled(
            fit(&app.snapshot.server.line(), area.width as usize),
            theme.dim(),
        )),
        server,
    );
    let Some(curve) = &app.view().curve else {
        empty(frame, area, "cache simulation: waiting for requests", theme);
        return;
    };
    let width = area.width as usize;
    let observed = curve
        .observed
        .map_or("server reuse not reported".to_string(), |o| {
            format!("server {:.1}%", o * 100.0)
        });
    // The server's reuse and the ceiling whole, on one line where they fit, else on two; the
    // replay's label where there is room.
    let ceiling = format!("ceiling {:.1}%", curve.ceiling * 100.0);
    let both = format!("{observed} · {ceiling}");
    let mut heads = if both.chars().count() <= width {
        vec![both]
    } else {
        vec![observed, ceiling]
    };
    let labelled = format!("{} · {}", heads[heads.len() - 1], curve.label);
    if labelled.chars().count() <= width {
        let last = heads.len() - 1;
        heads[last] = labelled;
    } else if area.height >= 8 && !app.chart {
        // (The chart says its block model on its last line.)
        heads.push(curve.label.clone());
    }
    let head_lines = heads.len() as u16;
    let head: Vec<Line> = heads
        .into_iter()
        .map(|h| Line::styled(fit(&h, width), theme.title()))
        .collect();
    let [top, rest] =
        Layout::vertical([Constraint::Length(head_lines), Constraint::Min(0)]).areas(area);
    frame.render_widget(Paragraph::new(head), top);
    if app.chart && rest.height >= 6 {
        let [rest, key, model] = Layout::vertical([
            Constraint::Min(3),
            Constraint::Length(1),
            Constraint::Length(1),
        ])
        .areas(rest);
        // Which block model the figures follow, and where it came from (as `profile` prints it).
        frame.render_widget(
            Paragraph::new(Line::styled(
                fit(&app.snapshot.block_model, width),
                theme.dim(),
            )),
            model,
        );
        let series = |pick: &dyn Fn(&CurvePoint) -> Option<f64>| -> Vec<(f64, f64)> {
            curve
                .points
                .iter()
                .enumerate()
                .filter_map(|(i, p)| pick(p).map(|v| (i as f64, v * 100.0)))
                .collect()
        };
        let lru = series(&|p| Some(p.1));
        let fifo = series(&|p| Some(p.2));
        let optimal = series(&|p| p.3);
        let last = curve.points.len().saturating_sub(1).max(1) as f64;
        let level = |share: f64| vec![(0.0, share * 100.0), (last, share * 100.0)];
        let ceiling = level(curve.ceiling);
        let server = curve.observed.map(level).unwrap_or_default();
        // Each series has its own colour and marker, so none takes another's colour, with or
        // without colour.
        fn line<'a>(
            name: &'static str,
            marker: symbols::Marker,
            style: ratatui::style::Style,
            data: &'a [(f64, f64)],
        ) -> Dataset<'a> {
            Dataset::default()
                .name(name)
                .marker(marker)
                .graph_type(GraphType::Line)
                .style(style)
                .data(data)
        }
        // The reference levels first, then the policies lowest first (optimal ≥ LRU ≥ FIFO at
        // every capacity), so where two meet the higher one is on top.
        let mut sets = vec![line(
            "ceiling",
            symbols::Marker::Dot,
            theme.series(Series::Ceiling),
            &ceiling,
        )];
        if !server.is_empty() {
            sets.push(line(
                "server",
                symbols::Marker::Dot,
                theme.series(Series::Server),
                &server,
            ));
        }
        sets.push(line(
            "FIFO",
            symbols::Marker::Dot,
            theme.series(Series::Fifo),
            &fifo,
        ));
        sets.push(line(
            "LRU",
            symbols::Marker::Braille,
            theme.series(Series::Lru),
            &lru,
        ));
        if !optimal.is_empty() {
            sets.push(line(
                "optimal",
                symbols::Marker::Block,
                theme.series(Series::Optimal),
                &optimal,
            ));
        }
        // Every capacity labelled, at its own tick.
        let labels: Vec<String> = curve.points.iter().map(|p| p.0.clone()).collect();
        let chart = Chart::new(sets)
            .x_axis(Axis::default().bounds([0.0, last]).labels(labels))
            .y_axis(
                Axis::default()
                    .bounds([0.0, 100.0])
                    .labels(["0%", "50%", "100%"]),
            )
            // The key goes below the plot (a legend inside would hide the data behind it).
            .legend_position(None);
        frame.render_widget(chart, rest);
        let mut spans = Vec::new();
        for (name, marker, series) in [
            ("optimal", "█", Series::Optimal),
            ("LRU", "⠒", Series::Lru),
            ("FIFO", "•", Series::Fifo),
            ("ceiling", "•", Series::Ceiling),
            ("server", "•", Series::Server),
        ] {
            if name == "server" && server.is_empty() || name == "optimal" && optimal.is_empty() {
                continue;
            }
            spans.push(Span::styled(
                format!("{marker}{name} "),
                theme.series(series),
            ));
        }
        frame.render_widget(Paragraph::new(Line::from(spans)), key);
        return;
    }
    // Each capacity a bar as wide as the pane allows, its capacity under it where it fits.
    let bar = (width / curve.points.len().max(1)).max(1);
    let under = curve.points.iter().all(|p| p.0.chars().count() < bar);
    let ends = match (curve.points.first(), curve.points.last()) {
        (Some(a), Some(b)) => format!(
            "LRU {} {:.0}% … {} {:.0}%",
            a.0,
            a.1 * 100.0,
            b.0,
            b.1 * 100.0
        ),
        _ => String::new(),
    };
    let mut texts = vec![ends];
    if under && rest.height >= 4 {
        let capacities = curve
            .points
            .iter()
            .map(|p| format!("{:<bar$}", p.0))
            .collect::<String>()
            .trim_end()
            .to_string();
        let unit = " tokens";
        texts.push(if capacities.chars().count() + unit.len() <= width {
            capacities + unit
        } else {
            capacities
        });
    }
    let [spark, labels] =
        Layout::vertical([Constraint::Min(1), Constraint::Length(texts.len() as u16)]).areas(rest);
    let data: Vec<u64> = curve
        .points
        .iter()
        .flat_map(|p| std::iter::repeat_n((p.1 * 1000.0).round() as u64, bar))
        .collect();
    frame.render_widget(
        Sparkline::default()
            .data(&data)
            .max(1000)
            .style(theme.good()),
        spark,
    );
    let texts: Vec<Line> = texts
        .iter()
        .rev()
        .map(|t| Line::styled(fit(t, width), theme.dim()))
        .collect();
    frame.render_widget(Paragraph::new(texts), labels);
}
