//! Measures the analysis of one recording, one part per process so no part inherits another's
//! warm caches or grown heap: `parse` (JSON Lines to records), `normalize` (digests of every
//! message), `batch` (normalization and analysis, `analysis::analyze`), `incremental` (push in
//! completion order: latency per record, rows re-derived, memory, then the report).
//!
//! `cargo run --release --example analysis_bench -- FILE MODE`; prints one JSON line.
//! Used by bench/analysis.sh.

#[path = "support/proc_status.rs"]
mod proc_status;

use proc_status::rss_kib;
use std::time::Instant;

use prefixscope_core::analysis::{Analyzer, Config, analyze};
use prefixscope_core::normalize::normalize;
use prefixscope_core::record::{Record, read_jsonl};

// The binary's allocator, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(0.0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(path), Some(mode)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: analysis_bench FILE parse|normalize|batch|incremental");
        std::process::exit(2);
    };
    let bytes = std::fs::read(path).unwrap_or_else(|e| {
        eprintln!("cannot read {path}: {e}");
        std::process::exit(1);
    });
    let rss_start = rss_kib();
    let parse_start = Instant::now();
    let records = read_jsonl(bytes.as_slice()).records;
    let parse_s = parse_start.elapsed().as_secs_f64();
    let mut result = serde_json::json!({
        "file": path, "mode": mode, "bytes": bytes.len(), "records": records.len(),
        "parse_s": parse_s,
        "records_rss_mib": rss_kib().saturating_sub(rss_start) as f64 / 1024.0,
    });
    match mode.as_str() {
        "parse" => {}
        "normalize" => {
            let start = Instant::now();
            let analysed = records.iter().filter(|r| normalize(r).is_ok()).count();
            result["normalize_s"] = serde_json::json!(start.elapsed().as_secs_f64());
            result["analysed"] = serde_json::json!(analysed);
        }
        "batch" => {
            let start = Instant::now();
            let report = analyze(&records, &Config::default());
            result["batch_s"] = serde_json::json!(start.elapsed().as_secs_f64());
            result["rows"] = serde_json::json!(report.rows.len());
        }
        "incremental" => incremental(&bytes, &records, &mut result),
        other => {
            eprintln!("unknown mode {other}");
            std::process::exit(2);
        }
    }
    println!("{result}");
}

fn incremental(bytes: &[u8], records: &[Record], result: &mut serde_json::Value) {
    // Completion order is the file's order (read_jsonl sorts by id).
    let position: std::collections::HashMap<u64, usize> = bytes
        .split(|&b| b == b'\n')
        .filter_map(|l| {
            serde_json::from_slice::<serde_json::Value>(l)
                .ok()?
                .get("id")?
                .as_u64()
        })
        .enumerate()
        .map(|(i, id)| (id, i))
        .collect();
    let mut arrivals: Vec<&Record> = records.iter().collect();
    arrivals.sort_by_key(|r| position.get(&r.id).copied().unwrap_or(usize::MAX));
    let rss_before = rss_kib();
    let mut engine = Analyzer::new(Config::default());
    let mut micros: Vec<f64> = Vec::with_capacity(arrivals.len());
    let mut rederived = 0usize;
    let start = Instant::now();
    for record in arrivals {
        let t = Instant::now();
        let update = engine.push(record);
        micros.push(t.elapsed().as_secs_f64() * 1e6);
        rederived += update.rederived.len();
    }
    let total = start.elapsed().as_secs_f64();
    let engine_kib = rss_kib().saturating_sub(rss_before);
    let report_start = Instant::now();
    let report = engine.report();
    let report_s = report_start.elapsed().as_secs_f64();
    let last_1000 = &micros[micros.len().saturating_sub(1000)..];
    result["incremental_s"] = serde_json::json!(total);
    result["push_us_p50"] = serde_json::json!(percentile(&micros, 0.5));
    result["push_us_p99"] = serde_json::json!(percentile(&micros, 0.99));
    result["push_us_max"] = serde_json::json!(percentile(&micros, 1.0));
    result["push_us_p99_last_1000"] = serde_json::json!(percentile(last_1000, 0.99));
    result["rows_rederived"] = serde_json::json!(rederived);
    result["report_s"] = serde_json::json!(report_s);
    result["rows"] = serde_json::json!(report.rows.len());
    result["engine_mib"] = serde_json::json!(engine_kib as f64 / 1024.0);
    result["engine_bytes_per_record"] =
        serde_json::json!(engine_kib as f64 * 1024.0 / records.len().max(1) as f64);
}
