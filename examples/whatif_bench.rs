//! What the findings view's savings cost past the live what-if's 1,000-record cap: the first N
//! records of a recording through `live::predict_at` at the fixes' levers (what the findings
//! view works out) and at every setting of the capacity view, with the memory the records held
//! for it take.
//!
//! `cargo run --release --example whatif_bench -- FILE N [N...]`; prints one JSON line per N.
//! Recorded in BENCHMARKS.md ("What-if in the TUI").

#[path = "support/proc_status.rs"]
mod proc_status;

use proc_status::rss_kib;
use std::time::Instant;

use prefixscope_core::analysis::{CAPACITY_SETTINGS, LEVERS};
use prefixscope_core::live::{Predictions, predict_at};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: whatif_bench FILE N [N...]");
        std::process::exit(2);
    };
    let sizes: Vec<usize> = args[2..].iter().filter_map(|a| a.parse().ok()).collect();
    let most = sizes.iter().copied().max().unwrap_or(0);
    let before = rss_kib() as f64 / 1024.0;
    let file = std::fs::File::open(path).unwrap_or_else(|e| {
        eprintln!("cannot read {path}: {e}");
        std::process::exit(1);
    });
    // Only the records measured are kept, as the engine would keep them.
    let records: Vec<_> = prefixscope_core::record::Lines::new(std::io::BufReader::new(file))
        .filter_map(Result::ok)
        .take(most)
        .collect();
    let held_mib = (rss_kib() as f64 / 1024.0) - before;
    let levers: Vec<(usize, bool)> = LEVERS.iter().filter_map(|l| l.settings()).collect();
    for n in sizes {
        let part = &records[..n.min(records.len())];
        let time = |settings: &[(usize, bool)]| {
            let start = Instant::now();
            let replayed = match predict_at(part, settings, None) {
                Predictions::Ready(p) => p.first().map_or(0, |p| p.replayed),
                _ => 0,
            };
            (start.elapsed().as_secs_f64(), replayed)
        };
        let (findings_s, replayed) = time(&levers);
        let (capacity_s, _) = time(&CAPACITY_SETTINGS);
        println!(
            "{}",
            serde_json::json!({
                "file": path, "records": part.len(), "replayed": replayed,
                "settings_findings": levers.len(), "findings_s": findings_s,
                "settings_capacity": CAPACITY_SETTINGS.len(), "capacity_s": capacity_s,
                "records_held_mib": held_mib * part.len() as f64 / records.len().max(1) as f64,
            })
        );
    }
}
