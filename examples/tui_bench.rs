//! The TUI at size: every record of FILE pushed into the app state (what `replay --instant`
//! does), one view rebuild, then frames drawn on a 120×40 `TestBackend`.
//!
//! `cargo run --release --example tui_bench -- FILE`; prints one JSON line. Used by
//! bench/tui.sh.

use std::sync::Arc;
use std::time::Instant;

use prefixscope::analysis::Config;
use prefixscope::record::read_jsonl;
use prefixscope::tui::app::{App, Source};
use prefixscope::tui::event::Event;
use prefixscope::tui::theme::Theme;
use prefixscope::tui::ui;
use ratatui::Terminal;
use ratatui::backend::TestBackend;

// The binary's allocator, so the figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        / 1024.0
}

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: tui_bench FILE");
        std::process::exit(2);
    };
    let file = std::fs::File::open(&path).unwrap_or_else(|e| {
        eprintln!("cannot read {path}: {e}");
        std::process::exit(1);
    });
    let parse = Instant::now();
    let mut records = read_jsonl(std::io::BufReader::new(file)).records;
    records.sort_by_key(|r| (r.t_end_ms.max(r.t_start_ms), r.id));
    let parse_s = parse.elapsed().as_secs_f64();
    let count = records.len();
    let rss_records = rss_mib();

    let mut app = App::new(
        Source::Replay {
            files: path.clone(),
        },
        Config::default(),
    );
    let push = Instant::now();
    let mut now = 0;
    for record in records.drain(..) {
        now += 1;
        app.handle(Event::Record(Arc::new(record)), now);
    }
    let push_s = push.elapsed().as_secs_f64();
    drop(records);
    let rebuild = Instant::now();
    app.rebuild_view();
    let rebuild_s = rebuild.elapsed().as_secs_f64();
    // What the loop would measure, and so the interval it would leave between rebuilds.
    app.rebuild_cost_ms = (rebuild_s * 1000.0) as i64;

    let mut terminal = Terminal::new(TestBackend::new(120, 40)).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1);
    });
    app.last_size = (120, 40);
    let theme = Theme::from_env();
    let mut frames_us = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let _ = terminal.draw(|frame| ui::draw(frame, &app, &theme));
        frames_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    frames_us.sort_by(f64::total_cmp);
    let pick = |p: f64| frames_us[((frames_us.len() - 1) as f64 * p) as usize];
    println!(
        "{}",
        serde_json::json!({
            "file": path, "records": count, "parse_s": parse_s,
            "push_all_s": push_s, "push_us_per_record": push_s * 1e6 / count.max(1) as f64,
            "view_rebuild_s": rebuild_s,
            "redraw_interval_ms": app.redraw_interval_ms(),
            "frame_us_p50": pick(0.5), "frame_us_p99": pick(0.99),
            "rss_after_mib": rss_mib(), "rss_records_mib": rss_records,
        })
    );
}
