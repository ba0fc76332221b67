//! What the analysis engine holds per record: a recording streamed into `Analyzer::push` one
//! record at a time (each dropped after its push), with every allocation counted, so the figure
//! is the engine's live heap and not the allocator's pages or the parsed file.
//!
//! `cargo run --release --example engine_memory -- FILE [EVERY]`; prints one JSON line per
//! `EVERY` records (default 10,000) and one at the end, after `into_report`.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};

use prefixscope_core::analysis::{Analyzer, Config};
use prefixscope_core::record::Lines;

/// mimalloc (the binary's allocator), counting the bytes live.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(live, Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { mimalloc::MiMalloc.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded as received.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size >= layout.size() {
            let live = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size
                - layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        } else {
            LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        // SAFETY: forwarded as received.
        unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args.get(1) else {
        eprintln!("usage: engine_memory FILE [EVERY]");
        std::process::exit(2);
    };
    let every: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let file = std::fs::File::open(path).unwrap_or_else(|e| {
        eprintln!("cannot read {path}: {e}");
        std::process::exit(1);
    });
    let base = LIVE.load(Ordering::Relaxed);
    let mut analyzer = Analyzer::new(Config::default());
    let mut records = 0u64;
    let print = |stage: &str, records: u64, estimate: Option<usize>| {
        let live = LIVE.load(Ordering::Relaxed).saturating_sub(base);
        println!(
            "{}",
            serde_json::json!({
                "stage": stage, "records": records, "live_mib": live as f64 / 1048576.0,
                "bytes_per_record": live as f64 / records.max(1) as f64,
                "estimate_mib": estimate.map(|e| e as f64 / 1048576.0),
            })
        );
    };
    for record in Lines::new(std::io::BufReader::with_capacity(1 << 20, file)).flatten() {
        analyzer.push(&record);
        drop(record);
        records += 1;
        if records.is_multiple_of(every) {
            print("pushed", records, Some(analyzer.held_bytes()));
        }
    }
    if records == 0 || !records.is_multiple_of(every) {
        print("pushed", records, Some(analyzer.held_bytes()));
    }
    let report = analyzer.into_report();
    print("report", records, None);
    drop(report);
    let peak = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    println!(
        "{}",
        serde_json::json!({"peak_mib": peak as f64 / 1048576.0})
    );
}
