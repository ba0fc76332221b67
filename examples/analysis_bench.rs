//! Measures the analysis on one recording: parse time, batch analysis time, incremental push
//! latency (p50 / p99 / max per record, in completion order), report time, and memory.
//!
//! `cargo run --release --example analysis_bench -- FILE [--incremental]`; prints one JSON line.
//! Used by bench/analysis.sh.

use std::time::Instant;

use prefixscope::analysis::{Analyzer, Config, analyze};
use prefixscope::record::read_jsonl;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: analysis_bench FILE [--incremental]");
        std::process::exit(2);
    };
    let incremental = args.iter().any(|a| a == "--incremental");
    let rss_start = rss_kib();
    let t = Instant::now();
    let bytes = std::fs::read(path).unwrap_or_else(|e| {
        eprintln!("cannot read {path}: {e}");
        std::process::exit(1);
    });
    // Completion order is the file's order; read_jsonl sorts by id, so keep the file order too.
    let order: Vec<u64> = bytes
        .split(|&b| b == b'\n')
        .filter_map(|l| {
            serde_json::from_slice::<serde_json::Value>(l)
                .ok()?
                .get("id")?
                .as_u64()
        })
        .collect();
    let parse_start = Instant::now();
    let records = read_jsonl(bytes.as_slice()).records;
    let parse_s = parse_start.elapsed().as_secs_f64();
    let rss_parsed = rss_kib();
    let _ = t;

    let batch_start = Instant::now();
    let report = analyze(&records, &Config::default());
    let batch_s = batch_start.elapsed().as_secs_f64();
    let rows = report.rows.len();
    drop(report);

    let mut result = serde_json::json!({
        "file": path, "bytes": bytes.len(), "records": records.len(), "rows": rows,
        "parse_s": parse_s, "batch_analysis_s": batch_s,
        "rss_records_mib": (rss_parsed.saturating_sub(rss_start)) as f64 / 1024.0,
    });
    if incremental {
        let position: std::collections::HashMap<u64, usize> =
            order.iter().enumerate().map(|(i, id)| (*id, i)).collect();
        let mut arrivals: Vec<&prefixscope::record::Record> = records.iter().collect();
        arrivals.sort_by_key(|r| position.get(&r.id).copied().unwrap_or(usize::MAX));
        let rss_before = rss_kib();
        let mut engine = Analyzer::new(Config::default());
        let mut micros: Vec<f64> = Vec::with_capacity(arrivals.len());
        let start = Instant::now();
        let mut rederived = 0usize;
        for record in arrivals {
            let t = Instant::now();
            let update = engine.push(record);
            micros.push(t.elapsed().as_secs_f64() * 1e6);
            rederived += update.rederived.len();
        }
        let total = start.elapsed().as_secs_f64();
        let rss_engine = rss_kib().saturating_sub(rss_before);
        let report_start = Instant::now();
        let report = engine.report();
        let report_s = report_start.elapsed().as_secs_f64();
        let last_1000: Vec<f64> = micros[micros.len().saturating_sub(1000)..].to_vec();
        let pct = |v: &[f64], p: f64| {
            let mut v = v.to_vec();
            v.sort_by(f64::total_cmp);
            v.get(((v.len() as f64 - 1.0) * p).round() as usize)
                .copied()
                .unwrap_or(0.0)
        };
        result["incremental_total_s"] = serde_json::json!(total);
        result["push_us_p50"] = serde_json::json!(pct(&micros, 0.5));
        result["push_us_p99"] = serde_json::json!(pct(&micros, 0.99));
        result["push_us_max"] = serde_json::json!(pct(&micros, 1.0));
        result["push_us_p99_last_1000"] = serde_json::json!(pct(&last_1000, 0.99));
        result["rows_rederived"] = serde_json::json!(rederived);
        result["report_s"] = serde_json::json!(report_s);
        result["engine_rss_mib"] = serde_json::json!(rss_engine as f64 / 1024.0);
        result["engine_bytes_per_record"] =
            serde_json::json!(rss_engine as f64 * 1024.0 / records.len().max(1) as f64);
        result["same_as_batch"] = serde_json::json!(report.rows.len() == rows);
    }
    println!("{result}");
}
