//! `profile`'s report as one self-contained HTML page (`report.html` beside `report.json`): the
//! hit rate by capacity per policy with the ceiling marked and the reuse within and across
//! conversations shaded, the leaderboards with what each prefix is, the input and output
//! lengths, the session-id share, the server's own reuse and what was skipped. Charts are SVG
//! drawn by plotters; no script, no network: it opens from disk and prints. Every figure is
//! the JSON report's, formatted; each table cell keeps the raw number in a `data-` attribute.
//! `analyze`'s report gets a page too: loss by cause and by client (the TUI's figures, from
//! `live::view::View`), a timeline of the requests with their breaks and evictions, and the
//! findings with their fixes. Pure: a string from the report.

use plotters::prelude::*;

use prefixscope_core::cache::Policy;
use prefixscope_core::cache::PrefixGroup;
use prefixscope_core::cache::{Point, ProfileReport};
use prefixscope_core::input::FileReport;
use prefixscope_core::units::thousands;

/// The page for `profile` over `inputs`, with each recording's or log's analysis (`(file,
/// report)`): its losses by cause and client and its requests in time.
pub fn profile_page(
    profile: &ProfileReport,
    inputs: &[FileReport],
    analyses: &[(String, Box<prefixscope_core::analysis::Report>)],
) -> String {
    let names: Vec<String> = inputs
        .iter()
        .map(|f| format!("{} ({})", f.name, f.format.as_str()))
        .collect();
    let mut body = String::new();
    body.push_str(&format!(
        "<h1>prefixscope profile</h1>\n<p class=\"inputs\">{} requests · {}</p>\n",
        thousands(profile.requests),
        escape(&names.join(", "))
    ));
    body.push_str(&format!(
        "<p>{}-token blocks · warmup {:.0}%: {} requests fill the cache, {} tokens measured · conversations: {}</p>\n",
        profile.block_size,
        profile.warmup * 100.0,
        thousands(profile.warmup_requests),
        thousands(profile.measured_tokens),
        escape(&profile.conversations.source)
    ));
    body.push_str(&capacity_section(profile));
    body.push_str(&server_section(profile));
    for (name, report) in analyses {
        body.push_str(&format!(
            "<section class=\"analysis\">\n<h2>{}: what was lost, and when</h2>\n",
            escape(name)
        ));
        body.push_str(&analysis_sections(report, &report.findings));
        body.push_str("</section>\n");
    }
    body.push_str(&leaderboard_section(
        "Top prefixes by reusable tokens",
        &profile.top_prefixes.by_reusable_tokens,
    ));
    body.push_str(&leaderboard_section(
        "Top prefixes by count",
        &profile.top_prefixes.by_count,
    ));
    body.push_str(&lengths_section(profile));
    body.push_str(&sessions_section(profile));
    body.push_str(&skipped_section(inputs));
    page("prefixscope profile", &body)
}

/// The page for `analyze`'s report.
/// `findings`: the analysis's (a live snapshot's report keeps none), listed as every output
/// lists them (`analysis::listed`).
pub fn analysis_page<R: prefixscope_core::analysis::Priced>(
    report: &prefixscope_core::analysis::Report<R>,
    findings: &[prefixscope_core::analysis::Finding],
) -> String {
    let mut body = String::from("<h1>prefixscope analyze</h1>\n");
    body.push_str(&analysis_sections(report, findings));
    page("prefixscope analyze", &body)
}

/// The analysis's figures: totals, loss by cause and by client, the timeline, the findings.
fn analysis_sections<R: prefixscope_core::analysis::Priced>(
    report: &prefixscope_core::analysis::Report<R>,
    findings: &[prefixscope_core::analysis::Finding],
) -> String {
    let view = prefixscope_core::live::view::View::build(report, "");
    let mut body = String::new();
    body.push_str(&format!(
        "<p class=\"inputs\">{} records, {} analysed · {} turns in {} conversations · lost <span data-lost-tokens=\"{}\">{}</span> tokens</p>\n",
        thousands(report.coverage.records),
        thousands(report.coverage.analysed),
        thousands(report.coverage.turns),
        thousands(report.coverage.conversations),
        report.time.lost_tokens,
        thousands(report.time.lost_tokens),
    ));
    if let Some(money) = &report.money {
        body.push_str(&format!(
            "<p class=\"inputs\">money lost <span data-lost-usd=\"{}\">{}</span> on {} tokens (prices: {})</p>\n",
            money.lost_usd,
            prefixscope_core::pricing::dollars(money.lost_usd),
            thousands(money.priced_tokens),
            escape(&money.source)
        ));
    }
    // Loss by cause.
    let causes: Vec<(String, u64, String)> = report
        .time
        .by_cause
        .iter()
        .map(|(cause, total)| {
            (
                prefixscope_core::units::cause_label(cause).to_string(),
                total.tokens,
                cause.clone(),
            )
        })
        .collect();
    // Nothing charged is "nothing lost" only where the loss was measured.
    let empty = if view.header.loss_measured {
        "Nothing lost.".to_string()
    } else {
        let why = view.header.loss_not_measured();
        format!("{}{}.", why[..1].to_uppercase(), &why[1..])
    };
    body.push_str("<section id=\"causes\">\n<h2>Tokens lost by cause</h2>\n");
    body.push_str(&bars_chart(
        &causes
            .iter()
            .map(|(label, tokens, _)| (label.clone(), *tokens))
            .collect::<Vec<_>>(),
        &empty,
    ));
    body.push_str("<table>\n<tr><th>cause</th><th>tokens</th><th>turns</th><th>time</th></tr>\n");
    for (cause, total) in &report.time.by_cause {
        body.push_str(&format!(
            "<tr data-cause=\"{}\"><td>{}</td><td data-tokens=\"{}\">{}</td><td>{}</td><td>{}</td></tr>\n",
            escape(cause),
            escape(prefixscope_core::units::cause_label(cause)),
            total.tokens,
            thousands(total.tokens),
            total.rows,
            total
                .ms
                .as_ref()
                .map_or("not measured".to_string(), |m| format!("{:.0} ms", m.value))
        ));
    }
    body.push_str("</table>\n</section>\n");
    // Loss by client.
    body.push_str("<section id=\"clients\">\n<h2>Tokens lost by client</h2>\n");
    body.push_str(&bars_chart(
        &view
            .losses
            .iter()
            .map(|l| (l.alias.clone(), l.tokens))
            .collect::<Vec<_>>(),
        &empty,
    ));
    body.push_str("<table>\n<tr><th>client</th><th>requests</th><th>conversations</th><th>lost</th><th>caused</th></tr>\n");
    for loss in &view.losses {
        body.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td data-tokens=\"{}\">{}</td><td>{}</td></tr>\n",
            escape(&loss.alias),
            loss.requests,
            loss.conversations,
            loss.tokens,
            thousands(loss.tokens),
            thousands(loss.caused_tokens)
        ));
    }
    body.push_str("</table>\n</section>\n");
    body.push_str(&timeline_section(report));
    // Findings and what to change.
    body.push_str("<section id=\"findings\">\n<h2>Findings</h2>\n");
    let findings = prefixscope_core::analysis::listed(report, findings);
    if findings.is_empty() {
        body.push_str("<p>None.</p>\n");
    } else {
        body.push_str("<table>\n<tr><th>finding</th><th>lost</th><th>fix</th></tr>\n");
        for finding in &findings {
            body.push_str(&format!(
                "<tr><td class=\"what\">{}</td><td>{}</td><td class=\"what\">{}</td></tr>\n",
                escape(&prefixscope_core::analysis::finding_label(finding)),
                finding
                    .lost_tokens
                    .map_or("–".to_string(), |t| thousands(u64::from(t))),
                escape(
                    &finding
                        .fix
                        .as_ref()
                        .map_or(String::new(), |f| format!("({}) {}", f.owner, f.change))
                )
            ));
        }
        body.push_str("</table>\n");
    }
    body.push_str("</section>\n");
    body
}

/// Horizontal bars, one per (label, tokens), the largest first as given; `empty` says why there
/// are none ("Nothing lost.", or that the loss was not measured, as `analyze` says it).
fn bars_chart(bars: &[(String, u64)], empty: &str) -> String {
    let bars: Vec<&(String, u64)> = bars.iter().filter(|(_, t)| *t > 0).take(20).collect();
    let Some(top) = bars.iter().map(|(_, t)| *t).max() else {
        return format!("<p class=\"note\">{}</p>\n", escape(empty));
    };
    let height = 60 + 26 * bars.len() as u32;
    let mut svg = String::new();
    let drawn = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut svg, (880, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(10)
            .build_cartesian_2d(0f64..(top as f64 * 1.05), 0f64..bars.len() as f64)?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .disable_y_axis()
            .light_line_style(RGBColor(242, 242, 242))
            .x_desc("tokens")
            .draw()?;
        // Top to bottom as given; each bar's label written on it.
        let row = |i: usize| (bars.len() - 1 - i) as f64;
        chart.draw_series(bars.iter().enumerate().map(|(i, (_, t))| {
            Rectangle::new(
                [(0.0, row(i) + 0.15), (*t as f64, row(i) + 0.85)],
                color(Policy::Fifo).mix(0.6).filled(),
            )
        }))?;
        chart.draw_series(bars.iter().enumerate().map(|(i, (label, t))| {
            Text::new(
                format!("{label}: {}", thousands(*t)),
                (top as f64 * 0.01, row(i) + 0.62),
                ("sans-serif", 13).into_font(),
            )
        }))?;
        root.present()?;
        Ok(())
    })();
    figure(drawn.map_err(|e| e.to_string()), &svg)
}

/// Which rows a timeline series shows.
type RowTest<'a> = dyn Fn(&prefixscope_core::analysis::Row) -> bool + 'a;

/// Each request in time (seconds since the first) by its prompt: a client's break red, an
/// eviction by another request purple, the server's own loss grey, the others blue.
fn timeline_section<R: prefixscope_core::analysis::Priced>(
    report: &prefixscope_core::analysis::Report<R>,
) -> String {
    use prefixscope_core::analysis::Cause;
    let rows: Vec<&prefixscope_core::analysis::Row> =
        report.rows.iter().map(|r| r.rated().row()).collect();
    let Some(start) = rows.iter().map(|r| r.t_start_ms).min() else {
        return String::new();
    };
    let at = |r: &prefixscope_core::analysis::Row| (r.t_start_ms - start) as f64 / 1000.0;
    let prompt = |r: &prefixscope_core::analysis::Row| {
        f64::from(r.counts.prompt_tokens.map_or(0, |p| p.value).max(1))
    };
    let end = rows.iter().map(|r| at(r)).fold(1.0, f64::max);
    let top = rows.iter().map(|r| prompt(r)).fold(10.0, f64::max);
    let mut svg = String::new();
    let drawn = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut svg, (880, 360)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..end * 1.02, (1f64..top * 1.5).log_scale())?;
        chart
            .configure_mesh()
            .light_line_style(RGBColor(242, 242, 242))
            .x_desc("seconds since the first request")
            .y_desc("prompt tokens")
            .draw()?;
        let evicted = |r: &prefixscope_core::analysis::Row| {
            matches!(
                r.cause,
                Some(Cause::OtherConversation | Cause::SideCall | Cause::OtherModel)
            )
        };
        let kinds: [(&str, RGBColor, &RowTest<'_>); 4] = [
            ("turn", RGBColor(31, 119, 180), &|r| {
                r.break_cause.is_none() && r.lost_external.is_none()
            }),
            ("a client's break", RGBColor(214, 39, 40), &|r| {
                r.break_cause.is_some()
            }),
            (
                "evicted by another request (conversation, side-call, model)",
                RGBColor(148, 103, 189),
                &|r| r.break_cause.is_none() && evicted(r),
            ),
            ("the server's own loss", RGBColor(127, 127, 127), &|r| {
                r.break_cause.is_none() && r.lost_external.is_some() && !evicted(r)
            }),
        ];
        for (label, c, is) in kinds {
            let of: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| is(r))
                .map(|r| (at(r), prompt(r)))
                .collect();
            if of.is_empty() {
                continue;
            }
            chart
                .draw_series(of.into_iter().map(|p| Circle::new(p, 4, c.filled())))?
                .label(label)
                .legend(move |(x, y)| Circle::new((x + 8, y), 4, c.filled()));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()?;
        root.present()?;
        Ok(())
    })();
    let chart = figure(drawn.map_err(|e| e.to_string()), &svg);
    format!("<section id=\"timeline\">\n<h2>The requests in time</h2>\n{chart}</section>\n")
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n",
        escape(title)
    )
}

const STYLE: &str = "body { font-family: sans-serif; margin: 2em auto; max-width: 960px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25em 0.7em; text-align: right; white-space: nowrap; }
td.what { white-space: normal; }
th:first-child, td:first-child, td.what { text-align: left; }
td.what { font-family: monospace; font-size: 0.9em; }
.note { color: #666; font-size: 0.9em; }
svg { max-width: 100%; height: auto; }
@media print { body { margin: 0; max-width: none; } section { break-inside: avoid; } }
";

/// The policies' colours, ceiling black.
fn color(policy: Policy) -> RGBColor {
    match policy {
        Policy::Ceiling => RGBColor(0, 0, 0),
        Policy::Fifo => RGBColor(230, 120, 20),
        Policy::Lru => RGBColor(31, 119, 180),
        Policy::Optimal => RGBColor(44, 160, 44),
    }
}

fn capacity_section(profile: &ProfileReport) -> String {
    let mut out = String::from("<section id=\"capacity\">\n<h2>Hit rate by cache capacity</h2>\n");
    out.push_str(&capacity_chart(profile));
    out.push_str(
        "<p class=\"note\">Lines: each policy's hit rate at each capacity; dashed: the ceiling (every block kept). Shaded under the LRU line: hits on blocks the request's own conversation sent before (dark) and on other conversations' (light).</p>\n",
    );
    out.push_str("<table class=\"points\">\n<tr><th>capacity</th><th>policy</th><th>hit rate</th><th>hit tokens</th><th>same conversation</th><th>other</th></tr>\n");
    let row = |p: &Point| {
        format!(
            "<tr data-policy=\"{}\" data-capacity-tokens=\"{}\"><td>{}</td><td>{}</td><td data-hit-rate=\"{}\">{:.1}%</td><td data-hit-tokens=\"{}\">{}</td><td data-same=\"{}\">{}</td><td data-other=\"{}\">{}</td></tr>\n",
            p.policy.as_str(),
            p.capacity_tokens.map_or(String::new(), |t| t.to_string()),
            escape(p.capacity.as_deref().unwrap_or("unbounded")),
            p.policy.as_str(),
            p.hit_rate,
            p.hit_rate * 100.0,
            p.hit_tokens,
            thousands(p.hit_tokens),
            p.same_conversation_tokens,
            thousands(p.same_conversation_tokens),
            p.other_tokens,
            thousands(p.other_tokens),
        )
    };
    for point in &profile.points {
        out.push_str(&row(point));
    }
    out.push_str(&row(&profile.ceiling));
    out.push_str("</table>\n</section>\n");
    out
}

/// The capacity chart: log capacity × hit rate, a line per policy, the ceiling dashed.
fn capacity_chart(profile: &ProfileReport) -> String {
    // Around the working set: past four times it, every capacity holds it all (the ceiling);
    // the table below has them.
    let working_set = profile
        .unique_blocks
        .saturating_mul(u64::from(profile.block_size))
        .max(1);
    let limit = working_set
        .checked_next_power_of_two()
        .unwrap_or(u64::MAX)
        .saturating_mul(4);
    let all = || profile.points.iter().filter_map(|p| p.capacity_tokens);
    let limit = if all().filter(|&t| t <= limit).count() >= 2 {
        limit
    } else {
        u64::MAX
    };
    let shown = |p: &&Point| p.capacity_tokens.is_some_and(|t| t <= limit);
    let capacities: Vec<f64> = all().filter(|&t| t <= limit).map(|t| t as f64).collect();
    let (Some(low), Some(high)) = (
        capacities.iter().copied().reduce(f64::min),
        capacities.iter().copied().reduce(f64::max),
    ) else {
        return "<p class=\"note\">No capacity was simulated.</p>\n".to_string();
    };
    let high = if high > low { high } else { low * 2.0 };
    let mut svg = String::new();
    let drawn = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut svg, (880, 440)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(56)
            .build_cartesian_2d((low..high).log_scale(), 0f64..100f64)?;
        chart
            .configure_mesh()
            .light_line_style(RGBColor(242, 242, 242))
            .x_desc("cache capacity (tokens)")
            .y_desc("hit rate (%)")
            .x_label_formatter(&|v| short_tokens(*v))
            .draw()?;
        let of = |policy: Policy| -> Vec<&Point> {
            profile
                .points
                .iter()
                .filter(|p| p.policy == policy && shown(p))
                .collect()
        };
        let at = |p: &Point, tokens: u64| {
            let x = p.capacity_tokens.unwrap_or(0) as f64;
            (x, percent(tokens, p.measured_tokens))
        };
        let lru = of(Policy::Lru);
        if !lru.is_empty() {
            let blue = color(Policy::Lru);
            chart
                .draw_series(AreaSeries::new(
                    lru.iter().map(|p| at(p, p.hit_tokens)),
                    0.0,
                    blue.mix(0.15),
                ))?
                .label("lru: other conversations")
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 18, y + 5)], blue.mix(0.15).filled())
                });
            chart
                .draw_series(AreaSeries::new(
                    lru.iter().map(|p| at(p, p.same_conversation_tokens)),
                    0.0,
                    blue.mix(0.4),
                ))?
                .label("lru: same conversation")
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 18, y + 5)], blue.mix(0.4).filled())
                });
        }
        for policy in [Policy::Fifo, Policy::Lru, Policy::Optimal] {
            let points = of(policy);
            if points.is_empty() {
                continue;
            }
            let c = color(policy);
            chart
                .draw_series(LineSeries::new(
                    points.iter().map(|p| at(p, p.hit_tokens)),
                    c.stroke_width(2),
                ))?
                .label(policy.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
            chart.draw_series(
                points
                    .iter()
                    .map(|p| Circle::new(at(p, p.hit_tokens), 3, c.filled())),
            )?;
        }
        let ceiling = percent(profile.ceiling.hit_tokens, profile.ceiling.measured_tokens);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(low, ceiling), (high, ceiling)],
                8,
                5,
                BLACK.stroke_width(1),
            ))?
            .label(format!("ceiling {ceiling:.1}%"))
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()?;
        root.present()?;
        Ok(())
    })();
    figure(drawn.map_err(|e| e.to_string()), &svg)
}

fn server_section(profile: &ProfileReport) -> String {
    let Some(server) = &profile.server_observed else {
        return "<section id=\"server\">\n<h2>The server's own reuse</h2>\n<p>Not measured: no response carried the server's reuse count.</p>\n</section>\n".to_string();
    };
    format!(
        "<section id=\"server\">\n<h2>The server's own reuse</h2>\n<p>On the {} requests whose responses said it: the server reused <span data-server-reused=\"{}\">{}</span> of {} prompt tokens ({}); the ceiling on the same requests, cold, {} ({}).</p>\n</section>\n",
        thousands(server.requests),
        server.server_reused_tokens,
        thousands(server.server_reused_tokens),
        thousands(server.prompt_tokens),
        percent_text(server.server_reused_tokens, server.prompt_tokens),
        thousands(server.ceiling_hit_tokens),
        percent_text(server.ceiling_hit_tokens, server.prompt_tokens),
    )
}

fn leaderboard_section(title: &str, groups: &[PrefixGroup]) -> String {
    let mut out = format!(
        "<section class=\"leaderboard\">\n<h2>{}</h2>\n",
        escape(title)
    );
    if groups.is_empty() {
        out.push_str("<p>No prefix is shared by two requests.</p>\n</section>\n");
        return out;
    }
    out.push_str("<table>\n<tr><th>prefix</th><th>requests</th><th>reusable tokens</th><th>share</th><th>what it is</th></tr>\n");
    for g in groups {
        out.push_str(&format!(
            "<tr><td>{} tok</td><td>{}</td><td data-reusable=\"{}\">{}</td><td>{:.1}%</td><td class=\"what\">{}</td></tr>\n",
            thousands(g.prefix_tokens),
            thousands(g.count),
            g.reusable_tokens,
            thousands(g.reusable_tokens),
            g.share_of_reusable * 100.0,
            escape(g.what.as_deref().unwrap_or("(hash ids only)"))
        ));
    }
    out.push_str("</table>\n</section>\n");
    out
}

fn lengths_section(profile: &ProfileReport) -> String {
    let mut out = String::from(
        "<section id=\"lengths\">\n<h2>Input and output lengths (tokens)</h2>\n<table>\n<tr><th></th><th>requests</th><th>p50</th><th>p90</th><th>p99</th><th>mean</th></tr>\n",
    );
    let cell = |v: Option<u64>| v.map_or("–".to_string(), thousands);
    for (name, d) in [
        ("input", &profile.lengths.input_tokens),
        ("output", &profile.lengths.output_tokens),
    ] {
        out.push_str(&format!(
            "<tr><td>{name}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            thousands(d.n),
            cell(d.p50),
            cell(d.p90),
            cell(d.p99),
            d.mean.map_or("–".to_string(), |m| format!("{m:.0}"))
        ));
    }
    out.push_str("</table>\n");
    out.push_str(&lengths_chart(profile));
    out.push_str("</section>\n");
    out
}

/// p50 / p90 / p99 of input and output as bars (log scale: they span orders of magnitude).
fn lengths_chart(profile: &ProfileReport) -> String {
    let bars: Vec<(String, u64)> = [
        ("input", &profile.lengths.input_tokens),
        ("output", &profile.lengths.output_tokens),
    ]
    .iter()
    .flat_map(|(name, d)| {
        [("p50", d.p50), ("p90", d.p90), ("p99", d.p99)]
            .into_iter()
            .filter_map(move |(q, v)| v.map(|v| (format!("{name} {q}"), v.max(1))))
    })
    .collect();
    let Some(top) = bars.iter().map(|(_, v)| *v).max() else {
        return String::new();
    };
    let mut svg = String::new();
    let drawn = (|| -> Result<(), Box<dyn std::error::Error + '_>> {
        let root = SVGBackend::with_string(&mut svg, (880, 260)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(90)
            .build_cartesian_2d((1f64..(top as f64 * 2.0)).log_scale(), 0..bars.len())?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc("tokens")
            .y_labels(bars.len())
            .y_label_formatter(&|i| bars.get(*i).map_or(String::new(), |(n, _)| n.clone()))
            .draw()?;
        chart.draw_series(bars.iter().enumerate().map(|(i, (name, v))| {
            let c = if name.starts_with("input") {
                color(Policy::Lru)
            } else {
                color(Policy::Fifo)
            };
            Rectangle::new([(1.0, i), (*v as f64, i + 1)], c.mix(0.7).filled())
        }))?;
        root.present()?;
        Ok(())
    })();
    figure(drawn.map_err(|e| e.to_string()), &svg)
}

fn sessions_section(profile: &ProfileReport) -> String {
    let s = &profile.sessions;
    let sources: Vec<String> = s
        .by_source
        .iter()
        .map(|(source, n)| format!("{} {}", escape(source), thousands(*n)))
        .collect();
    format!(
        "<section id=\"sessions\">\n<h2>Session identifiers</h2>\n<p><span data-session-share=\"{}\">{:.1}%</span> of requests carry one ({}){}.</p>\n</section>\n",
        s.share,
        s.share * 100.0,
        thousands(s.requests_with_session_id),
        if sources.is_empty() {
            String::new()
        } else {
            format!(": {}", sources.join(", "))
        }
    )
}

fn skipped_section(inputs: &[FileReport]) -> String {
    let mut out = String::from(
        "<section id=\"skipped\">\n<h2>What was skipped</h2>\n<table>\n<tr><th>file</th><th>requests</th><th>non-2xx</th><th>bad rows</th><th>skipped</th></tr>\n",
    );
    for f in inputs {
        out.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            escape(&f.name),
            thousands(f.requests),
            thousands(f.non_2xx),
            thousands(f.bad_rows.len() as u64),
            escape(&f.skipped_text().unwrap_or_else(|| "none".to_string()))
        ));
    }
    out.push_str("</table>\n");
    for f in inputs {
        for bad in f.bad_rows.iter().take(5) {
            out.push_str(&format!(
                "<p class=\"note\">{} line {}: {}</p>\n",
                escape(&f.name),
                bad.line,
                escape(&bad.error)
            ));
        }
    }
    out.push_str("</section>\n");
    out
}

/// A drawn chart in its figure, or why it could not be drawn.
fn figure(drawn: Result<(), String>, svg: &str) -> String {
    match drawn {
        Ok(()) => format!("<figure>{svg}</figure>\n"),
        Err(e) => format!(
            "<p class=\"note\">The chart could not be drawn: {}</p>\n",
            escape(&e)
        ),
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

fn percent_text(part: u64, whole: u64) -> String {
    if whole == 0 {
        "–".to_string()
    } else {
        format!("{:.1}%", percent(part, whole))
    }
}

/// `16K`, `1M`, `256` on the capacity axis.
fn short_tokens(tokens: f64) -> String {
    let t = tokens.round() as u64;
    if t >= 1 << 20 && t.is_multiple_of(1 << 20) {
        format!("{}M", t >> 20)
    } else if t >= 1 << 10 && t.is_multiple_of(1 << 10) {
        format!("{}K", t >> 10)
    } else {
        thousands(t)
    }
}

/// Text for HTML: the five characters that mean markup, escaped (prompts are data).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_prompts_is_text() {
        assert_eq!(
            escape("<script>alert('x') & \"y\"</script>\u{1b}"),
            "&lt;script&gt;alert(&#39;x&#39;) &amp; &quot;y&quot;&lt;/script&gt;\\u{1b}"
        );
    }

    #[test]
    fn capacities_read_short() {
        assert_eq!(short_tokens(16_384.0), "16K");
        assert_eq!(short_tokens(1_048_576.0), "1M");
        assert_eq!(short_tokens(1_000.0), "1,000");
    }
}
