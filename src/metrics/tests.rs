use super::*;
use prefixscope_core::analysis::{Config, analyze};
use prefixscope_core::live::view::Aliases;

fn exposition(records: &[Record]) -> String {
    let report = analyze(records, &Config::default());
    let inputs = Inputs {
        totals: &Sums::of(&report),
        traffic: &Traffic::of(records),
        cache: None,
        proxy: Some(ProxyFigures::default()),
        window: Some(WindowFigures::default()),
        server: "http://127.0.0.1:8080",
    };
    classic(&openmetrics(&registry(&inputs)))
}

#[test]
fn every_family_has_help_and_type_before_any_record() {
    let text = exposition(&[]);
    let families = [
        ("requests_total", "counter"),
        ("records_total", "counter"),
        ("prompt_tokens_total", "counter"),
        ("reused_tokens_total", "counter"),
        ("evaluated_tokens_total", "counter"),
        ("lost_tokens", "gauge"),
        ("lost_seconds", "gauge"),
        ("prefix_breaks", "gauge"),
        ("evictions", "gauge"),
        ("turns", "gauge"),
        ("conversations", "gauge"),
        ("cache_ceiling_ratio", "gauge"),
        ("server_reuse_ratio", "gauge"),
        ("records_not_written_total", "counter"),
        ("recorder_queue_depth", "gauge"),
        ("metrics_connection_errors_total", "counter"),
    ];
    let lines: Vec<&str> = text.lines().collect();
    for (name, kind) in families {
        let name = format!("{PREFIX}_{name}");
        let help = lines
            .iter()
            .position(|l| l.starts_with(&format!("# HELP {name} ")));
        let typed = lines
            .iter()
            .position(|l| *l == format!("# TYPE {name} {kind}"));
        let (Some(help), Some(typed)) = (help, typed) else {
            panic!("{name}: no HELP or TYPE in\n{text}");
        };
        assert!(help < typed, "{name}");
        if let Some(sample) = lines
            .iter()
            .position(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        {
            assert!(typed < sample, "{name}: a sample before its TYPE");
        }
    }
    // No family outside the prefix, nothing OpenMetrics-only left in the classic text.
    for line in &lines {
        let name = line
            .strip_prefix("# HELP ")
            .or_else(|| line.strip_prefix("# TYPE "))
            .unwrap_or(line);
        assert!(name.starts_with("prefixscope_"), "{line}");
        assert!(!line.starts_with("# EOF") && !line.starts_with("# UNIT"));
    }
    // Before any record the raw counts are there, at 0.
    assert!(text.contains(
        "prefixscope_records_total{server=\"http://127.0.0.1:8080\",kind=\"traffic\"} 0\n"
    ));
}

#[test]
fn at_most_twenty_values_and_other() {
    let ranked: Vec<(String, (f64, u64))> = (0..30)
        .map(|i| (format!("client-{i:02}"), (f64::from(i), 0)))
        .collect();
    let kept = capped(ranked);
    assert_eq!(kept.len(), MAX_LABEL_VALUES);
    // The costliest kept: 10 to 29.
    assert!(kept.contains(&"client-29".to_string()));
    assert!(kept.contains(&"client-10".to_string()));
    assert_eq!(kept_or_other(&kept, "client-09"), OTHER);
    assert_eq!(kept_or_other(&kept, "client-10"), "client-10");
}

#[test]
fn label_values_are_safe_to_write_unescaped() {
    assert_eq!(label_value("a\"b\\c\nd"), "a_b_c_d");
    assert_eq!(label_value(""), "none");
    assert_eq!(label_value(&"x".repeat(500)).chars().count(), 80);
}

#[test]
fn classic_names_counter_families_as_their_samples() {
    let text = "# HELP x_requests Requests.\n# TYPE x_requests counter\nx_requests_total 3\n# HELP x_lost Lost.\n# TYPE x_lost gauge\n# UNIT x_lost tokens\nx_lost 5\n# EOF\n";
    assert_eq!(
        classic(text),
        "# HELP x_requests_total Requests.\n# TYPE x_requests_total counter\nx_requests_total 3\n# HELP x_lost Lost.\n# TYPE x_lost gauge\nx_lost 5\n"
    );
}

/// `(name, labels, value)` of each sample line of a classic exposition.
fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let labels = labels
                .split("\",")
                .filter(|l| !l.is_empty())
                .map(|pair| {
                    let (key, value) = pair.split_once("=\"").unwrap();
                    (key.to_string(), value.trim_end_matches('"').to_string())
                })
                .collect();
            (name.to_string(), labels, value.parse().unwrap())
        })
        .collect()
}

fn real_recording() -> Vec<Record> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("recordings/llmp/llama.cpp/parallel-nocache.jsonl");
    let read = prefixscope_core::record::read_jsonl(std::io::BufReader::new(
        std::fs::File::open(path).unwrap(),
    ));
    assert!(read.bad_lines.is_empty());
    read.records
}

#[test]
fn gauges_equal_the_analysis_of_a_real_recording() {
    let records = real_recording();
    let report = analyze(&records, &Config::default());
    let text = exposition(&records);
    let samples = samples(&text);
    let sum = |name: &str, key: &str| -> BTreeMap<String, f64> {
        let mut sums = BTreeMap::new();
        for (n, labels, value) in &samples {
            if n == name {
                *sums.entry(labels[key].clone()).or_default() += value;
            }
        }
        sums
    };
    // Tokens and seconds lost by cause: `analyze`'s `time.by_cause`, to the token.
    let by_cause: BTreeMap<String, f64> = report
        .time
        .by_cause
        .iter()
        .map(|(cause, total)| (cause.clone(), total.tokens as f64))
        .collect();
    assert_eq!(by_cause.len(), 3, "{by_cause:?}");
    assert_eq!(sum("prefixscope_lost_tokens", "cause"), by_cause);
    for (cause, seconds) in sum("prefixscope_lost_seconds", "cause") {
        let ms = report.time.by_cause[&cause].ms.unwrap().value;
        assert!((seconds - ms / 1000.0).abs() < 1e-9, "{cause}");
    }
    // By client: each row's losses under its client's alias.
    let aliases = Aliases::new(
        report
            .clients
            .iter()
            .map(|c| (c.client.as_str(), c.harness.as_deref())),
    );
    let mut by_client: BTreeMap<String, f64> = BTreeMap::new();
    for row in report.rows.iter().filter(|r| r.loss_measured) {
        for loss in [&row.lost_client, &row.lost_external].into_iter().flatten() {
            *by_client.entry(aliases.of(&row.client)).or_default() += f64::from(loss.tokens);
        }
    }
    assert!(by_client.len() > 1, "{by_client:?}");
    assert_eq!(sum("prefixscope_lost_tokens", "client"), by_client);
    // Breaks and evictions: the rows that have them.
    let mut breaks: BTreeMap<String, f64> = BTreeMap::new();
    let mut evictions: BTreeMap<String, f64> = BTreeMap::new();
    for row in &report.rows {
        if let Some(cause) = row.break_cause {
            *breaks.entry(cause.name().into()).or_default() += 1.0;
        }
        if let Some(evicted) = &row.evicted_by {
            *evictions.entry(evicted.kind.clone()).or_default() += 1.0;
        }
    }
    assert!(!breaks.is_empty() && !evictions.is_empty());
    assert_eq!(sum("prefixscope_prefix_breaks", "cause"), breaks);
    assert_eq!(sum("prefixscope_evictions", "evictor"), evictions);
    let total = |name: &str| -> f64 {
        samples
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, _, v)| v)
            .sum()
    };
    assert_eq!(total("prefixscope_turns"), report.coverage.turns as f64);
    assert_eq!(
        total("prefixscope_conversations"),
        report.coverage.conversations as f64
    );
    assert_eq!(
        total("prefixscope_requests_total"),
        report.coverage.records as f64
    );
    let prompt: u64 = report
        .rows
        .iter()
        .filter_map(|r| r.counts.prompt_tokens.map(|m| u64::from(m.value)))
        .sum();
    assert_eq!(total("prefixscope_prompt_tokens_total"), prompt as f64);
}

#[test]
fn clients_past_twenty_are_summed_as_other() {
    // The real recording's conversations, each under a client of its own: more clients with
    // losses than the cap.
    let mut records = real_recording();
    for (i, record) in records.iter_mut().enumerate() {
        record
            .request
            .headers
            .insert("user-agent".into(), format!("agent-{}/1.0", i % 40));
    }
    let report = analyze(&records, &Config::default());
    let text = exposition(&records);
    let clients: std::collections::BTreeSet<String> = samples(&text)
        .into_iter()
        .filter(|(n, _, _)| n == "prefixscope_lost_tokens")
        .map(|(_, labels, _)| labels["client"].clone())
        .collect();
    assert!(clients.len() <= MAX_LABEL_VALUES + 1, "{clients:?}");
    let losing: std::collections::BTreeSet<&str> = report
        .rows
        .iter()
        .filter(|r| r.lost_client.is_some() || r.lost_external.is_some())
        .map(|r| r.client.as_str())
        .collect();
    if losing.len() > MAX_LABEL_VALUES {
        assert!(clients.contains(OTHER), "{clients:?}");
        assert_eq!(clients.len(), MAX_LABEL_VALUES + 1);
    }
    // Capped or not, the sum by cause is still the report's.
    let lost: f64 = samples(&text)
        .into_iter()
        .filter(|(n, _, _)| n == "prefixscope_lost_tokens")
        .map(|(_, _, v)| v)
        .sum();
    assert_eq!(lost, report.time.lost_tokens as f64);
}

/// The real recording's traffic five times over, with new ids.
fn five_times_over() -> Vec<Record> {
    let one: Vec<Record> = real_recording().into_iter().filter(|r| !r.probe).collect();
    (0..5u64)
        .flat_map(|round| {
            one.iter().map(move |record| {
                let mut record = record.clone();
                record.id += round * 10_000;
                record
            })
        })
        .collect()
}

/// The figures of an engine fed `records` (the endpoint's under `record`).
fn engine_figures(records: &[Record], config: Config) -> (Figures, Engine) {
    let mut engine = Engine::new(config);
    for (i, record) in records.iter().enumerate() {
        engine.push(prefixscope_core::live::Input::Record(
            std::sync::Arc::new(record.clone()),
            i as i64,
        ));
    }
    (Figures::of_engine(&mut engine), engine)
}

fn window_of(records: usize) -> Config {
    Config {
        window: Some(records),
        ..Config::default()
    }
}

#[test]
fn one_window_is_the_analysis_of_its_records() {
    let records = real_recording();
    let (figures, _) = engine_figures(&records, window_of(serve::MAX_WINDOW));
    let report = analyze(&records, &Config::default());
    assert_eq!(figures.totals, Sums::of(&report));
    assert_eq!(figures.window.windows_closed, 0);
    assert!(figures.totals.lost.values().map(|l| l.0).sum::<u64>() > 0);
}

#[test]
fn closed_windows_add_up_to_the_analyses_of_their_records() {
    // The recording's traffic five times over (new ids), in windows of 100 records.
    let records = five_times_over();
    let (figures, _) = engine_figures(&records, window_of(serve::MIN_WINDOW));
    let mut expected = Sums::default();
    for chunk in records.chunks(serve::MIN_WINDOW) {
        expected.add(&Sums::of(&analyze(chunk, &Config::default())));
    }
    let windows = records.len().div_ceil(serve::MIN_WINDOW);
    assert_eq!(figures.window.windows_closed, windows as u64 - 1);
    assert_eq!(
        figures.window.window_records,
        (records.len() - (windows - 1) * serve::MIN_WINDOW) as u64
    );
    assert_eq!(figures.totals, expected);
}

/// A window also closes when its analysis passes the memory budget, whatever its count of
/// records: its memory is bounded by the budget, not by records of any size. The closed
/// windows still add up to the analyses of their records.
#[test]
fn a_window_closes_at_the_memory_budget() {
    let records = five_times_over();
    let config = Config {
        memory_budget: 64 << 10,
        ..window_of(serve::MAX_WINDOW)
    };
    let mut engine = Engine::new(config);
    let mut closed_at = Vec::new();
    for (i, record) in records.iter().enumerate() {
        let before = engine.earlier().map_or(0, |e| e.restarts);
        engine.push(prefixscope_core::live::Input::Record(
            std::sync::Arc::new(record.clone()),
            i as i64,
        ));
        if engine.earlier().map_or(0, |e| e.restarts) > before {
            closed_at.push(i);
        }
        assert!(engine.held_bytes() <= (64 << 10) + (32 << 10));
    }
    assert!(closed_at.len() >= 2, "{closed_at:?}");
    let mut expected = Sums::default();
    let mut from = 0;
    for &to in closed_at.iter().chain(std::iter::once(&records.len())) {
        expected.add(&Sums::of(&analyze(&records[from..to], &Config::default())));
        from = to;
    }
    assert_eq!(Figures::of_engine(&mut engine).totals, expected);
}

/// The screen's snapshot and the engine itself give the endpoint the same figures, so `watch`
/// (whose screen sends its snapshots') and `record` (which runs the engine) agree; the cache figures of
/// closed windows are kept, weighted by their prompt tokens.
#[test]
fn a_snapshot_gives_the_figures_of_its_engine() {
    let records = five_times_over();
    let (figures, mut engine) = engine_figures(&records, window_of(serve::MIN_WINDOW));
    assert_eq!(Figures::of_snapshot(&engine.snapshot()), figures);
    let cache = figures.cache.expect("the cache simulation ran");
    assert!(cache.ceiling > 0.0 && cache.ceiling <= 1.0, "{cache:?}");
    let earlier = engine.earlier().expect("windows closed");
    assert!(earlier.requests > 0);
    // The hit rate is of the open window's requests, the others said: received is still
    // simulated plus the reasons not.
    let snapshot = engine.snapshot();
    let not_simulated: u64 = snapshot.not_simulated.iter().map(|(_, n)| n).sum();
    assert_eq!(snapshot.simulated + not_simulated, snapshot.requests);
    assert!(
        snapshot
            .simulated_line()
            .is_some_and(|line| line.contains("before the analysis started again")),
        "{:?}",
        snapshot.simulated_line()
    );
}
