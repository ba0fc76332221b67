//! Measures what the `--metrics` endpoint's thread spends per record, part by part, on a
//! recording the proxy benchmark wrote (`KEEP=1 bash bench/proxy.sh`): the raw counters, the
//! analysis engine alone, and the endpoint's live engine, in windows, with its figures (`live`).
//! `cargo run --release --example metrics_bench -- FILE [live [WINDOW]]`; prints one JSON line.

#[path = "support/proc_status.rs"]
mod proc_status;

use proc_status::rss_kib;
use std::sync::Arc;
use std::time::Instant;

use prefixscope::metrics::Figures;
use prefixscope::metrics::serve::DEFAULT_WINDOW;
use prefixscope_core::analysis::{Analyzer, Config};
use prefixscope_core::live::{Engine, Input};
use prefixscope_core::record::read_jsonl;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: metrics_bench FILE [live]");
        std::process::exit(2);
    };
    let bytes = std::fs::read(path).unwrap_or_else(|e| {
        eprintln!("cannot read {path}: {e}");
        std::process::exit(1);
    });
    let records: Vec<Arc<_>> = read_jsonl(bytes.as_slice())
        .records
        .into_iter()
        .map(Arc::new)
        .collect();
    let n = records.len().max(1) as f64;
    let mut result = serde_json::json!({"file": path, "records": records.len()});

    let start = Instant::now();
    let mut traffic = prefixscope::metrics::Traffic::default();
    for record in &records {
        traffic.add(record);
    }
    result["traffic_us"] = serde_json::json!(start.elapsed().as_secs_f64() * 1e6 / n);

    let rss = rss_kib();
    let start = Instant::now();
    let mut analyzer = Analyzer::new(Config::default());
    for record in &records {
        analyzer.push(record);
    }
    result["analyzer_us"] = serde_json::json!(start.elapsed().as_secs_f64() * 1e6 / n);
    result["analyzer_mib"] = serde_json::json!(rss_kib().saturating_sub(rss) as f64 / 1024.0);
    let start = Instant::now();
    let report = analyzer.report();
    result["report_ms"] = serde_json::json!(start.elapsed().as_secs_f64() * 1e3);
    // What `watch --metrics` adds to each of the screen's snapshots: the families' sums.
    let start = Instant::now();
    let sums = prefixscope_core::live::Sums::of(&report);
    result["sums_ms"] = serde_json::json!(start.elapsed().as_secs_f64() * 1e3);
    drop(sums);
    drop(report);
    drop(analyzer);

    if args.get(2).map(String::as_str) == Some("live") {
        let window = args
            .get(3)
            .and_then(|w| w.parse().ok())
            .unwrap_or(DEFAULT_WINDOW);
        let rss = rss_kib();
        let start = Instant::now();
        let mut engine = Engine::new(Config {
            window: Some(window),
            ..Config::default()
        });
        let mut peak_kib = 0;
        for (i, record) in records.iter().enumerate() {
            engine.push(Input::Record(Arc::clone(record), i as i64));
            if i % 1000 == 0 {
                peak_kib = peak_kib.max(rss_kib());
            }
        }
        result["window"] = serde_json::json!(window);
        result["live_us"] = serde_json::json!(start.elapsed().as_secs_f64() * 1e6 / n);
        result["live_peak_mib"] = serde_json::json!(peak_kib.saturating_sub(rss) as f64 / 1024.0);
        let start = Instant::now();
        let figures = Figures::of_engine(&mut engine);
        result["figures_ms"] = serde_json::json!(start.elapsed().as_secs_f64() * 1e3);
        result["windows_closed"] = serde_json::json!(figures.window.windows_closed);
    }
    println!("{result}");
}
