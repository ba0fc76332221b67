//! `prefixscope profile FILE...`: how much a prefix cache could save on this traffic, and how
//! much capacity that takes. Reads recordings, gateway CSV logs and Mooncake or bailian traces
//! (gzipped or not); prints a short summary, and a versioned JSON report with `--json` or `-o`.

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use super::{EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE};
use prefixscope_core::cache::Point;
use prefixscope_core::cache::ToolsPosition;
use prefixscope_core::cache::{Capacity, Policy, ProfileConfig, ProfileReport, Request, profile};
use prefixscope_core::cache::{DEFAULT_CAPACITIES, kv_model_bytes_per_token, parse_capacity};
use prefixscope_core::input::{self, FileReport, Format, InputOptions, OpenError, OpenedInput};
use prefixscope_core::units::thousands;

#[derive(Args)]
pub struct ProfileArgs {
    /// Recordings, gateway CSV logs, Mooncake or bailian traces (gzipped or not); several are
    /// replayed one after the other.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// auto, recording, csv, mooncake or bailian.
    #[arg(long, default_value = "auto")]
    format: String,
    /// Tokens per block (default: a trace's own, 512 for Mooncake; for recordings and logs the
    /// server's: 1 for llama.cpp and Ollama, which reuse to the token; else 16).
    #[arg(long)]
    block_size: Option<u32>,
    /// Replies never enter the cache: every figure in the semantics of an exported trace
    /// (by default a request's reply is cached after its prompt, as servers keep it).
    #[arg(long)]
    prompts_only: bool,
    /// Leading fraction of requests that fills the cache uncounted; 0 replays cold.
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
    /// Bounded policies to simulate, comma-separated: fifo, lru, optimal (the ceiling always is).
    #[arg(long, value_delimiter = ',', default_value = "fifo,lru,optimal")]
    policies: Vec<String>,
    /// Cache sizes, comma-separated: tokens (64K, 1M), blocks (2048b) or bytes (16GiB).
    #[arg(long, value_delimiter = ',')]
    capacities: Vec<String>,
    /// KV cache bytes per token, for capacities in bytes.
    #[arg(long)]
    bytes_per_token: Option<u64>,
    /// A model whose KV bytes per token to use: glm-5.2, llama-3.1-8b, kimi-k2.5.
    #[arg(long)]
    kv_model: Option<String>,
    /// Where tool definitions go: leading or after-system (default: by model family).
    #[arg(long)]
    tools_position: Option<String>,
    /// CSV: the column holding timestamps.
    #[arg(long)]
    ts_column: Option<String>,
    /// Print the JSON report on stdout instead of the summary.
    #[arg(long)]
    json: bool,
    /// Write the JSON report to this file and the HTML page beside it; a device or FIFO is
    /// written as it is, `-` is stdout (the summary then goes to stderr).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Write the HTML page here (instead of beside `-o`; with a device, FIFO or `-` as `-o`,
    /// the page is written only when asked for here).
    #[arg(long, value_name = "FILE", requires = "output")]
    html: Option<PathBuf>,
}

/// The JSON report: what was read, then the profile.
#[derive(Serialize)]
struct Report<'a> {
    report: &'static str,
    inputs: &'a [FileReport],
    #[serde(flatten)]
    profile: &'a ProfileReport,
}

struct Settings {
    format: Option<Format>,
    policies: Vec<Policy>,
    tools_position: Option<ToolsPosition>,
    bytes_per_token: Option<u64>,
}

fn usage(message: impl std::fmt::Display) -> u8 {
    prefixscope_core::stderr_line!("prefixscope profile: {message}");
    EXIT_USAGE
}

fn settings(args: &ProfileArgs) -> Result<Settings, String> {
    let format = match args.format.as_str() {
        "auto" => None,
        other => Some(Format::parse(other).ok_or_else(|| {
            format!("unknown --format {other:?} (auto, recording, csv, mooncake, bailian)")
        })?),
    };
    let mut policies = Vec::new();
    for name in &args.policies {
        match Policy::parse(name) {
            Some(Policy::Ceiling) => {}
            Some(policy) if !policies.contains(&policy) => policies.push(policy),
            Some(_) => {}
            None => return Err(format!("unknown policy {name:?} (fifo, lru, optimal)")),
        }
    }
    let tools_position =
        match &args.tools_position {
            Some(text) => Some(ToolsPosition::parse(text).ok_or_else(|| {
                format!("unknown --tools-position {text:?} (leading, after-system)")
            })?),
            None => None,
        };
    if !(0.0..1.0).contains(&args.warmup) {
        return Err(format!(
            "--warmup {} must be at least 0 and below 1",
            args.warmup
        ));
    }
    if args.block_size == Some(0) {
        return Err("--block-size must be at least 1".to_string());
    }
    let bytes_per_token = match (&args.kv_model, args.bytes_per_token) {
        (Some(_), Some(_)) => {
            return Err("give --kv-model or --bytes-per-token, not both".to_string());
        }
        (Some(model), None) => Some(kv_model_bytes_per_token(model).ok_or_else(|| {
            format!("unknown --kv-model {model:?} (glm-5.2, llama-3.1-8b, kimi-k2.5)")
        })?),
        (None, bytes) => bytes,
    };
    Ok(Settings {
        format,
        policies,
        tools_position,
        bytes_per_token,
    })
}

pub fn run(args: ProfileArgs) -> u8 {
    let settings = match settings(&args) {
        Ok(s) => s,
        Err(message) => return usage(message),
    };
    for out in [&args.output, &args.html] {
        if let Err(code) = super::check_output(out.as_deref(), &args.files) {
            return code;
        }
    }

    // Capacities are sized once the block size is known (after reading); their syntax is
    // checked before anything is read.
    for text in &args.capacities {
        if let Err(message) = parse_capacity(text, 1, settings.bytes_per_token) {
            return usage(message);
        }
    }
    // Open and recognise every file first: the block size follows the first file's format.
    let mut opened = Vec::new();
    let (mut empty, mut unreadable) = (Vec::new(), false);
    for path in &args.files {
        match input::open(path, settings.format) {
            Ok(OpenedInput { reader, format }) => opened.push((path, format, reader)),
            Err(OpenError::Unreadable(e)) => {
                unreadable = true;
                prefixscope_core::stderr_line!("prefixscope: cannot read {}: {e}", path.display());
            }
            Err(OpenError::UnknownFormat) if super::is_empty_input(path) => {
                prefixscope_core::stderr_line!(
                    "prefixscope: {} is empty: nothing to read",
                    path.display()
                );
                empty.push(path);
            }
            Err(e @ OpenError::UnknownFormat) => {
                prefixscope_core::stderr_line!("prefixscope: {}: {e}", path.display())
            }
        }
    }
    let first_format = match opened.first() {
        Some(&(_, format, _)) => format,
        None if !empty.is_empty() => Format::Recording,
        // Nothing to read: exit 1 if a file could not be read, 2 if only the format was unknown
        // (give --format), as `export`.
        None if unreadable => return EXIT_UNREADABLE,
        None => return EXIT_USAGE,
    };
    // Empty files hold no requests of any format: read as the others' format.
    let empty_names: Vec<String> = empty.iter().map(|p| p.display().to_string()).collect();
    for path in empty {
        opened.push((path, first_format, Box::new(std::io::empty())));
    }
    let mut options = InputOptions {
        block_size: args.block_size,
        tools_position: settings.tools_position,
        ts_column: args.ts_column.clone(),
        // The HTML report shows each recording's losses and timeline.
        keep_analysis: args.output.is_some(),
        ..InputOptions::default()
    };
    let mut requests: Vec<Request> = Vec::new();
    let mut reports = Vec::new();
    let mut analyses = Vec::new();
    // The first file's block size (the user's, a trace's own, or its server's) holds for all.
    let mut block_size = args.block_size;
    for (path, format, reader) in opened {
        let name = path.display().to_string();
        // A large recording is read twice rather than held beside its analysis; a pipe
        // (`<(zcat …)`) cannot be, and is held.
        let reopen = || input::open_decompressed(path);
        let metadata = std::fs::metadata(path).ok().filter(|m| m.is_file());
        let reopen = metadata.is_some().then_some(&reopen as input::Reopen);
        options.file_bytes = metadata.map(|m| m.len());
        let file = input::read_or_twice(reader, reopen, &name, format, &options);
        for bad in &file.report.bad_rows {
            prefixscope_core::stderr_line!("prefixscope: {name}:{}: {}", bad.line, bad.error);
        }
        super::print_bad_values(&name, &file.report);
        if block_size.is_none() {
            block_size = Some(
                file.report
                    .block_model
                    .as_ref()
                    .map_or(format.default_block_size(), |m| m.block_size),
            );
            options.block_size = block_size;
        }
        // The first file's requests are taken whole: a copy of them cost a millisecond in
        // every 12,000 requests, most of it the kernel faulting in the copy's pages.
        if requests.is_empty() {
            requests = file.requests;
        } else {
            requests.extend(file.requests);
        }
        if let Some(analysis) = file.analysis {
            analyses.push((name.clone(), analysis));
        }
        reports.push(file.report);
    }
    let block_size = block_size.unwrap_or(first_format.default_block_size());
    // A file that yields no request is an error, said with why; one whose read stopped (a
    // truncated gzip) is too, once what came before it is profiled.
    let mut failed = false;
    for report in &reports {
        if report.requests == 0 && !empty_names.contains(&report.name) {
            prefixscope_core::stderr_line!(
                "prefixscope: {}: {}",
                report.name,
                report.why_nothing()
            );
            failed = true;
        }
    }
    if requests.is_empty() && failed {
        return super::EXIT_UNREADABLE;
    }

    let capacity_texts: Vec<String> = if args.capacities.is_empty() {
        DEFAULT_CAPACITIES.iter().map(|c| c.to_string()).collect()
    } else {
        args.capacities.clone()
    };
    let mut capacities: Vec<Capacity> = Vec::new();
    for text in &capacity_texts {
        match parse_capacity(text, block_size, settings.bytes_per_token) {
            Ok(c) if !capacities.iter().any(|known| known.blocks == c.blocks) => capacities.push(c),
            Ok(_) => {}
            Err(message) => return usage(message),
        }
    }

    let mut sources: Vec<&str> = reports
        .iter()
        .map(|r| r.conversation_source.as_str())
        .filter(|s| *s != "none")
        .collect();
    sources.dedup();
    let config = ProfileConfig {
        block_size,
        warmup: args.warmup,
        policies: settings.policies,
        capacities,
        conversation_source: if sources.is_empty() {
            "none".to_string()
        } else {
            sources.join(", ")
        },
        prompts_only: args.prompts_only,
        ..ProfileConfig::default()
    };
    let html_path = args
        .output
        .as_ref()
        .map(|path| super::report_paths(path, args.html.as_deref()));
    // Without `--capacities` the page's chart spans the traffic's working set: one run over its
    // capacities and the JSON's, which takes its own points out of it.
    let page = match &html_path {
        Some((_, Some(_))) if args.capacities.is_empty() => {
            around_working_set(&requests, &config).map(|wider| profile(&requests, &wider))
        }
        _ => None,
    };
    let profile = match &page {
        Some(page) => with_capacities_of(page, &config),
        None => profile(&requests, &config),
    };
    let report = Report {
        report: "prefixscope profile",
        inputs: &reports,
        profile: &profile,
    };
    let to_json = || serde_json::to_string_pretty(&report).unwrap_or_default();
    let json = match html_path {
        Some((json_path, html_path)) => {
            // `-o report.json` or `-o report`: report.json and report.html beside it. The page
            // is built and written on another core while the JSON is, so that the two files'
            // syncs overlap; each file is replaced whole or not at all.
            let (json, json_written, html_written) = std::thread::scope(|scope| {
                let html = scope.spawn(|| {
                    let Some(html_path) = html_path else {
                        return Ok(());
                    };
                    let html = prefixscope::html_report::profile_page(
                        page.as_ref().unwrap_or(&profile),
                        &reports,
                        &analyses,
                    );
                    super::write_output(&html_path, &args.files, html.as_bytes())
                });
                let json = to_json();
                let written =
                    super::write_output(&json_path, &args.files, format!("{json}\n").as_bytes());
                (json, written, html.join())
            });
            let html_written =
                html_written.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            if let Err(code) = json_written.and(html_written) {
                return code;
            }
            json
        }
        None => to_json(),
    };
    if args.json {
        super::print_json(&json);
    } else {
        super::print_stdout(&format!("{}\n", summary(&profile, &reports)));
    }
    for report in &reports {
        if let Some(error) = &report.read_error {
            prefixscope_core::stderr_line!(
                "prefixscope: {}: the read stopped at {error}; the {} requests before it are profiled",
                report.name,
                thousands(report.requests)
            );
            failed = true;
        }
    }
    // The process ends here: what it read and computed is not freed one allocation at a time
    // (the 12,031 requests of the Mooncake trace and the allocator handing their pages back
    // cost about 1 ms of a 42 ms run); the kernel takes the pages back at exit.
    std::mem::forget((requests, profile, analyses, reports));
    if failed {
        super::EXIT_UNREADABLE
    } else {
        EXIT_OK
    }
}

fn percent(part: u64, whole: u64, decimals: usize) -> String {
    if whole == 0 {
        return "–".to_string();
    }
    format!("{:.*}%", decimals, part as f64 * 100.0 / whole as f64)
}

fn summary(p: &ProfileReport, inputs: &[FileReport]) -> String {
    let mut out = Vec::new();
    let names: Vec<String> = inputs
        .iter()
        .map(|f| format!("{} {}", f.format.as_str(), f.name))
        .collect();
    out.push(format!(
        "{} requests · {}",
        thousands(p.requests),
        names.join(", ")
    ));
    let excluded: u64 = inputs.iter().map(|f| f.non_2xx).sum();
    let bad: usize = inputs.iter().map(|f| f.bad_rows.len()).sum();
    if excluded > 0 || bad > 0 {
        out.push(format!(
            "excluded: {excluded} non-2xx responses, {bad} bad rows"
        ));
    }
    for input in inputs {
        if let Some(skipped) = input.skipped_text() {
            out.push(format!("skipped in {}: {skipped}", input.name));
        }
    }
    let bad_values: u64 = inputs.iter().map(|f| f.bad_value_count).sum();
    if bad_values > 0 {
        out.push(format!(
            "bad values: {bad_values} implausible server counts ignored (read as not reported)"
        ));
    }
    let cuts: Vec<String> = p
        .cuts
        .iter()
        .map(|(cut, n)| format!("{cut} {}", thousands(*n)))
        .collect();
    out.push(format!(
        "blocks of {} tokens ({}) · warmup {:.0}%: {} requests fill the cache, {} tokens measured",
        p.block_size,
        cuts.join(", "),
        p.warmup * 100.0,
        thousands(p.warmup_requests),
        thousands(p.measured_tokens),
    ));
    for input in inputs {
        if let Some(model) = &input.block_model {
            out.push(format!("block model: {}", model.describe()));
        }
    }
    let dist = |d: &prefixscope_core::cache::Distribution| match (d.p50, d.p90, d.p99) {
        (Some(a), Some(b), Some(c)) => format!(
            "p50 {} · p90 {} · p99 {}",
            thousands(a),
            thousands(b),
            thousands(c)
        ),
        _ => "–".to_string(),
    };
    let rate = p
        .request_rate
        .as_ref()
        .and_then(|r| r.requests_per_s)
        .map_or("–".to_string(), |r| format!("{r:.1} req/s"));
    let stream = p
        .streaming_share
        .map_or("–".to_string(), |s| format!("{:.0}%", s * 100.0));
    out.push(format!(
        "input {} tok · output {} tok · streamed {stream} · {rate}",
        dist(&p.lengths.input_tokens),
        dist(&p.lengths.output_tokens),
    ));
    let models: Vec<String> = p
        .models
        .iter()
        .map(|(m, n)| format!("{m} {}", percent(*n, p.requests, 0)))
        .collect();
    out.push(format!("models: {}", models.join(", ")));

    out.push(String::new());
    let mut policies: Vec<Policy> = Vec::new();
    for point in &p.points {
        if !policies.contains(&point.policy) {
            policies.push(point.policy);
        }
    }
    let mut capacities: Vec<(u64, String)> = Vec::new();
    for point in &p.points {
        if let (Some(blocks), Some(label)) = (point.capacity_blocks, &point.capacity)
            && !capacities.iter().any(|(b, _)| *b == blocks)
        {
            capacities.push((blocks, label.clone()));
        }
    }
    let names: Vec<String> = capacities
        .iter()
        .map(|(blocks, label)| {
            if label.ends_with(" blocks") {
                label.clone()
            } else {
                format!("{label} ({} blocks)", thousands(*blocks))
            }
        })
        .collect();
    // The label column fits the longest label, so the figures stay in columns.
    let width = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0)
        .max(26);
    let mut header = format!("{:<w$}", "hit rate by capacity", w = width + 2);
    for policy in &policies {
        header.push_str(&format!("{:>9}", policy.as_str()));
    }
    out.push(header);
    let mut underfilled = false;
    for ((blocks, _), name) in capacities.iter().zip(&names) {
        let mut line = format!("  {name:<width$}");
        for policy in &policies {
            let point: Option<&Point> = p
                .points
                .iter()
                .find(|x| x.policy == *policy && x.capacity_blocks == Some(*blocks));
            let cell = point.map_or("".to_string(), |x| {
                let mark = if x.full_before_measurement == Some(false) && p.warmup_requests > 0 {
                    underfilled = true;
                    "*"
                } else {
                    ""
                };
                format!("{}{mark}", percent(x.hit_tokens, x.measured_tokens, 1))
            });
            line.push_str(&format!("{cell:>9}"));
        }
        out.push(line);
    }
    if underfilled {
        out.push("  * the cache was not full when measuring began".to_string());
    }
    let c = &p.ceiling;
    out.push(format!(
        "  ceiling {} ({} of {} tokens): same conversation {}, other {}  (conversations: {})",
        percent(c.hit_tokens, c.measured_tokens, 2),
        thousands(c.hit_tokens),
        thousands(c.measured_tokens),
        percent(c.same_conversation_tokens, c.measured_tokens, 1),
        percent(c.other_tokens, c.measured_tokens, 1),
        p.conversations.source,
    ));
    let q = &p.ceiling_prompts_only;
    if p.prompts_only {
        out.push("  prompts only: replies never enter the cache (the trace semantics)".to_string());
    } else if p.replies_cached > 0 {
        out.push(format!(
            "  replies cached after their prompts on {} requests (servers keep the generated tokens); prompts only: ceiling {} ({} tokens)",
            thousands(p.replies_cached),
            percent(q.hit_tokens, q.measured_tokens, 2),
            thousands(q.hit_tokens),
        ));
    }
    if let Some(rate) = p.aiperf_cache_hit_rate {
        out.push(format!("  AIPerf cache_hit_rate {rate}"));
    }
    if let Some(s) = &p.server_observed {
        out.push(format!(
            "  server reported reuse {} of {} prompt tokens ({}) on {} requests; ceiling on the same requests {} ({}, cold)",
            thousands(s.server_reused_tokens),
            thousands(s.prompt_tokens),
            percent(s.server_reused_tokens, s.prompt_tokens, 1),
            s.requests,
            thousands(s.ceiling_hit_tokens),
            percent(s.ceiling_hit_tokens, s.prompt_tokens, 1),
        ));
    }

    out.push(String::new());
    let sources: Vec<String> = p
        .sessions
        .by_source
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect();
    out.push(format!(
        "session identifiers: {:.1}% of requests{}",
        p.sessions.share * 100.0,
        if sources.is_empty() {
            String::new()
        } else {
            format!(" ({})", sources.join(", "))
        }
    ));
    let boards = &p.top_prefixes;
    out.push(format!(
        "shared prefixes: {} groups, {} reusable tokens",
        thousands(boards.groups),
        thousands(boards.reusable_tokens)
    ));
    for (title, entries) in [
        (
            "top prefixes by reusable tokens",
            &boards.by_reusable_tokens,
        ),
        ("top prefixes by count", &boards.by_count),
    ] {
        if entries.is_empty() {
            continue;
        }
        out.push(format!("{title}:"));
        for entry in entries.iter().take(3) {
            let what = entry
                .what
                .as_ref()
                .map_or(String::new(), |w| format!("  {w}"));
            out.push(format!(
                "  {} tok × {} requests  {} reusable ({:.1}%){what}",
                thousands(entry.prefix_tokens),
                thousands(entry.count),
                thousands(entry.reusable_tokens),
                entry.share_of_reusable * 100.0,
            ));
        }
    }
    out.join("\n")
}

/// The page's capacities without `--capacities`: the defaults (as the JSON has them) and the
/// live axis's from one block up to the traffic's working set, which the defaults pass by on a
/// small recording. `None`: nothing to add.
fn around_working_set(
    requests: &[prefixscope_core::cache::Request],
    config: &ProfileConfig,
) -> Option<ProfileConfig> {
    let nodes = prefixscope_core::cache::Passes::new(requests, !config.prompts_only)
        .parents
        .len();
    let working_set = (nodes as u64).saturating_sub(1) * u64::from(config.block_size);
    let (_, mut capacities) = prefixscope_core::live::capacity_axis(config.block_size, working_set);
    for capacity in &config.capacities {
        if !capacities.iter().any(|c| c.blocks == capacity.blocks) {
            capacities.push(capacity.clone());
        }
    }
    capacities.sort_by_key(|c| c.blocks);
    let same = capacities.len() == config.capacities.len()
        && capacities
            .iter()
            .zip(&config.capacities)
            .all(|(a, b)| a.blocks == b.blocks);
    (!same).then(|| ProfileConfig {
        capacities,
        ..config.clone()
    })
}

/// The report of `config`'s capacities, out of one of more: a point depends on its own capacity
/// alone, so these are the points a run of `config` gives.
fn with_capacities_of(
    wider: &prefixscope_core::cache::ProfileReport,
    config: &ProfileConfig,
) -> prefixscope_core::cache::ProfileReport {
    let points = config
        .capacities
        .iter()
        .flat_map(|capacity| {
            config.policies.iter().filter_map(move |&policy| {
                let point = wider
                    .points
                    .iter()
                    .find(|p| p.policy == policy && p.capacity_blocks == Some(capacity.blocks))?;
                Some(prefixscope_core::cache::Point {
                    capacity: Some(capacity.label.clone()),
                    ..point.clone()
                })
            })
        })
        .collect();
    prefixscope_core::cache::ProfileReport {
        points,
        ..wider.clone()
    }
}
