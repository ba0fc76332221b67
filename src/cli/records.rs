//! `prefixscope records FILE...`: what recordings hold, one line per record and a summary.
//! Bad lines are listed with their numbers; they never stop the read.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use super::EXIT_UNREADABLE;
use prefixscope_core::normalize::Api;
use prefixscope_core::record::Record;

#[derive(Args)]
pub struct RecordsArgs {
    /// Recordings (JSON Lines, prefixscope or llmp format v1); several merge in time order.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Print a JSON summary on stdout instead of text.
    #[arg(long)]
    json: bool,
    /// Write the merged records, in time order, to this file (a recording); a device or FIFO
    /// is written as it is, `-` is stdout (the listing then goes to stderr).
    #[arg(short, long)]
    out: Option<PathBuf>,
}

#[derive(Serialize)]
struct Summary {
    files: Vec<super::RecordingFile>,
    records: usize,
    /// prefixscope's own requests to the server (`probe`), listed, counted apart from `records`.
    #[serde(skip_serializing_if = "is_zero")]
    probes: usize,
    bad_lines: usize,
    by_api: BTreeMap<&'static str, usize>,
    by_path: BTreeMap<String, usize>,
    errors: BTreeMap<&'static str, usize>,
    non_2xx: usize,
    streamed: usize,
    digest: usize,
    bad_chunks: u64,
    truncated: usize,
    user_agents: BTreeMap<String, usize>,
}

pub fn run(args: RecordsArgs) -> u8 {
    if let Err(code) = super::check_output(args.out.as_deref(), &args.files) {
        return code;
    }
    let Some(read) = super::read_recordings(&args.files) else {
        return EXIT_UNREADABLE;
    };
    let exit_code = read.exit_code();
    let (mut records, files) = (read.records, read.files);
    records.sort_by_key(|r| (r.t_start_ms, r.id));
    let summary = summarize(&records, files);
    if let Some(out) = &args.out {
        let mut bytes = Vec::new();
        for record in &records {
            bytes.extend(prefixscope_core::record::record_line(record));
        }
        if let Err(code) = super::write_output(out, &args.files, &bytes) {
            return code;
        }
    }
    let mut stdout = super::text_out();
    if args.json {
        let _ = writeln!(
            stdout,
            "{}",
            prefixscope_core::text::printable_json(
                &serde_json::to_string_pretty(&summary).unwrap_or_default()
            )
        );
        return exit_code;
    }
    for record in &records {
        let _ = writeln!(
            stdout,
            "{}",
            prefixscope::session::headless::record_line(record)
        );
    }
    let _ = writeln!(
        stdout,
        "{}",
        prefixscope_core::text::printable(&text_summary(&summary))
    );
    exit_code
}

fn summarize(records: &[Record], files: Vec<super::RecordingFile>) -> Summary {
    let mut s = Summary {
        bad_lines: files.iter().map(|f| f.bad_lines.len()).sum(),
        files,
        records: records.iter().filter(|r| !r.probe).count(),
        probes: records.iter().filter(|r| r.probe).count(),
        by_api: BTreeMap::new(),
        by_path: BTreeMap::new(),
        errors: BTreeMap::new(),
        non_2xx: 0,
        streamed: 0,
        digest: 0,
        bad_chunks: 0,
        truncated: 0,
        user_agents: BTreeMap::new(),
    };
    for r in records.iter().filter(|r| !r.probe) {
        *s.by_api
            .entry(Api::from_path(&r.request.path).as_str())
            .or_default() += 1;
        let path = r
            .request
            .path
            .split('?')
            .next()
            .unwrap_or_default()
            .to_string();
        *s.by_path.entry(path).or_default() += 1;
        if let Some(e) = r.error {
            *s.errors.entry(e.as_str()).or_default() += 1;
        }
        if let Some(resp) = &r.response {
            s.non_2xx += usize::from(!(200..300).contains(&resp.status));
            s.streamed += usize::from(resp.stream.is_some());
            s.bad_chunks += u64::from(resp.bad_chunks.unwrap_or(0));
            s.truncated += usize::from(resp.truncated);
        }
        s.digest += usize::from(r.request.digest.is_some());
        let agent = r
            .request
            .headers
            .get("user-agent")
            .cloned()
            .unwrap_or_else(|| "unknown".into());
        *s.user_agents.entry(agent).or_default() += 1;
    }
    s
}

fn text_summary(s: &Summary) -> String {
    let mut out = format!(
        "{} records in {} file(s), {} bad lines",
        s.records,
        s.files.len(),
        s.bad_lines
    );
    if s.probes > 0 {
        out.push_str(&format!(
            " ({} of prefixscope's probes of the server beside them)",
            s.probes
        ));
    }
    out.push_str(&format!("\napis: {}", join_map(&s.by_api)));
    out.push_str(&format!("\nclients: {}", join_map(&s.user_agents)));
    out.push_str(&format!(
        "\nstreamed {}, digest {}, non-2xx {}, errors {}, bad chunks {}, truncated {}",
        s.streamed,
        s.digest,
        s.non_2xx,
        if s.errors.is_empty() {
            "none".to_string()
        } else {
            join_map(&s.errors)
        },
        s.bad_chunks,
        s.truncated
    ));
    out
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn join_map<K: std::fmt::Display>(m: &BTreeMap<K, usize>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}
