//! `prefixscope analyze FILE...`: the report of one or more recordings (merged in time order).

use std::fs::File;
use std::io::BufReader;
use std::path::PathBuf;

use clap::Args;

use super::{EXIT_OK, EXIT_UNREADABLE};
use prefixscope::analysis::{Config, analyze};
use prefixscope::record::{Record, read_jsonl};

#[derive(Args)]
pub struct AnalyzeArgs {
    /// Recordings (prefixscope or llmp, full or digest); several merge in time order.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Print the JSON report on stdout instead of the text summary.
    #[arg(long)]
    json: bool,
    /// Write the JSON report to this file (the summary still goes to stdout).
    #[arg(short, long)]
    out: Option<PathBuf>,
    /// A pause longer than this (per model) starts a new session.
    #[arg(long, default_value_t = 60)]
    gap_seconds: u64,
    /// Count messages and tools with the server's tokenizer (llama-server /tokenize); without it,
    /// counts are estimates.
    #[arg(long, value_name = "URL")]
    tokenize: Option<String>,
}

pub fn run(args: AnalyzeArgs) -> u8 {
    let mut records: Vec<Record> = Vec::new();
    let mut bad_lines = 0u64;
    let mut readable = 0;
    for path in &args.files {
        match File::open(path) {
            Ok(file) => {
                readable += 1;
                let read = read_jsonl(BufReader::new(file));
                for bad in &read.bad_lines {
                    eprintln!(
                        "prefixscope: {}:{}: {}",
                        path.display(),
                        bad.line,
                        bad.error
                    );
                }
                bad_lines += read.bad_lines.len() as u64;
                records.extend(read.records);
            }
            Err(e) => eprintln!("prefixscope: cannot read {}: {e}", path.display()),
        }
    }
    if readable == 0 {
        return EXIT_UNREADABLE;
    }
    let config = Config {
        session_gap_ms: args.gap_seconds.saturating_mul(1000),
        ..Config::default()
    };
    if let Some(url) = &args.tokenize {
        let result = prefixscope::tokenize::enrich(&mut records, url);
        for warning in &result.warnings {
            eprintln!("prefixscope: warning: tokenize: {warning}");
        }
    }
    let mut report = analyze(&records, &config);
    report.coverage.bad_lines = bad_lines;
    let json = serde_json::to_string_pretty(&report).unwrap_or_default();
    if let Some(out) = &args.out
        && let Err(e) = std::fs::write(out, format!("{json}\n"))
    {
        eprintln!("prefixscope: cannot write {}: {e}", out.display());
        return EXIT_UNREADABLE;
    }
    if args.json {
        println!("{json}");
    } else {
        print!("{}", report.summary());
    }
    EXIT_OK
}
