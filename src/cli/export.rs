//! `prefixscope export FILE... --to FORMAT`: what was recorded (or read) as a trace the replay
//! tools load (GuideLLM, AIPerf). Anonymized except `--to otel`, whose spans carry the messages.
//!
//! Ids are salted with a key kept in a salt file: `--salt-file`, else
//! `$XDG_CONFIG_HOME/prefixscope/salt`, else `~/.config/prefixscope/salt`; created on first use
//! (32 random bytes as hex, mode 0600) and reused after, so exports of the same traffic share ids.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use clap::Args;

use super::{EXIT_OK, EXIT_UNREADABLE, EXIT_USAGE};
use prefixscope::session::export::{Files, SaltFile, default_salt_path, load_or_create_salt};
use prefixscope_core::cache::ToolsPosition;
use prefixscope_core::export::{self, ExportError, Options, Summary, Target};
use prefixscope_core::input::{self, Format, OpenError};
use prefixscope_core::output_file::OutputFile;

#[derive(Args)]
#[command(after_help = "\
Formats: mooncake (GuideLLM, AIPerf; 512-token blocks), bailian (AIPerf; 16), weka (GuideLLM,
AIPerf; 64, written in the file), trace_synthetic (GuideLLM; no hash ids) are anonymized: token
counts, times and salted ids only, no text, model or tool name.
otel (GuideLLM) is NOT anonymous: its spans carry every message, the system prompt and the tool
definitions, because replay sends them. Digest recordings cannot be exported as otel.

The salt file (--salt-file, else $XDG_CONFIG_HOME/prefixscope/salt, else
~/.config/prefixscope/salt) is created on first use with mode 0600; keep it to get the same ids
again, delete it to unlink new exports from old ones.")]
pub struct ExportArgs {
    /// Recordings (prefixscope or llmp, full or digest), gateway CSV logs, or Mooncake or bailian
    /// traces, gzipped or not; all of one kind.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The trace format to write (otel is NOT anonymous: it carries the messages).
    #[arg(long, value_name = "FORMAT", value_parser = export::TARGET_NAMES)]
    to: String,
    /// Write the export to this file instead of stdout.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Tokens per hash id (default: mooncake 512, bailian 16, weka 64).
    #[arg(long)]
    block_size: Option<u32>,
    /// The salt file (created with mode 0600 when missing).
    #[arg(long, value_name = "FILE")]
    salt_file: Option<PathBuf>,
    /// The input kind: auto, recording, csv, mooncake or bailian.
    #[arg(long, default_value = "auto")]
    format: String,
    /// Where tool definitions go in a rendered prompt: leading or after-system (default: by
    /// model family).
    #[arg(long)]
    tools_position: Option<String>,
    /// CSV: the column holding timestamps.
    #[arg(long)]
    ts_column: Option<String>,
}

fn usage(message: impl std::fmt::Display) -> u8 {
    prefixscope_core::stderr_line!("prefixscope export: {message}");
    EXIT_USAGE
}

fn unreadable(message: impl std::fmt::Display) -> u8 {
    prefixscope_core::stderr_line!("prefixscope export: {message}");
    EXIT_UNREADABLE
}

/// Tells every file's kind; they must agree.
fn input_format(args: &ExportArgs) -> Result<Format, u8> {
    let forced = match args.format.as_str() {
        "auto" => None,
        other => Some(Format::parse(other).ok_or_else(|| {
            usage(format!(
                "unknown --format {other:?} (auto, recording, csv, mooncake, bailian)"
            ))
        })?),
    };
    let mut kinds: Vec<(Format, &Path)> = Vec::new();
    let mut empty = 0;
    for path in &args.files {
        let format = match input::open(path, forced) {
            Ok(opened) => opened.format,
            Err(OpenError::Unreadable(e)) => {
                return Err(unreadable(format!("cannot read {}: {e}", path.display())));
            }
            // Holds nothing of any format: read as the others' (no rows), as `profile` does.
            Err(OpenError::UnknownFormat) if super::is_empty_input(path) => {
                prefixscope_core::stderr_line!(
                    "prefixscope export: {} is empty: nothing to read",
                    path.display()
                );
                empty += 1;
                continue;
            }
            Err(e @ OpenError::UnknownFormat) => {
                return Err(usage(format!("{}: {e}", path.display())));
            }
        };
        kinds.push((format, path));
    }
    let Some(&(first, first_path)) = kinds.first() else {
        return if empty > 0 {
            Ok(Format::Recording)
        } else {
            Err(usage("no input file"))
        };
    };
    if let Some((other, path)) = kinds.iter().find(|(f, _)| *f != first) {
        return Err(usage(format!(
            "{} is a {} and {} a {}: export files of one kind at a time",
            first_path.display(),
            first.as_str(),
            path.display(),
            other.as_str()
        )));
    }
    Ok(first)
}

/// The block size when none is given: the format's, except that WEKA (which writes its block
/// size in the file) takes a trace's own when the default cannot be made of the trace's ids
/// (a Mooncake trace's 512-token ids cannot be cut into 64-token blocks).
fn trace_block_size(format: Format, target: Target, default: u32) -> (u32, String) {
    let source = format.default_block_size();
    let is_trace = matches!(format, Format::Mooncake | Format::Bailian);
    if is_trace && target == Target::Weka && !default.is_multiple_of(source) {
        (
            source,
            format!(" (the trace's own: its ids cannot be cut into {default}-token blocks)"),
        )
    } else {
        (default, String::new())
    }
}

pub fn run(args: ExportArgs) -> u8 {
    let Some(target) = Target::parse(&args.to) else {
        return usage(format!("unknown --to {:?}", args.to));
    };
    let tools_position = match &args.tools_position {
        Some(text) => match ToolsPosition::parse(text) {
            Some(p) => Some(p),
            None => {
                return usage(format!(
                    "unknown --tools-position {text:?} (leading, after-system)"
                ));
            }
        },
        None => None,
    };
    if args.block_size == Some(0) {
        return usage("--block-size must be at least 1");
    }
    let format = match input_format(&args) {
        Ok(format) => format,
        Err(code) => return code,
    };
    let Some(salt_path) = args.salt_file.clone().or_else(default_salt_path) else {
        return usage(
            "no place for the salt file (neither XDG_CONFIG_HOME nor HOME is set): give --salt-file",
        );
    };
    let SaltFile {
        salt,
        created,
        warning,
    } = match load_or_create_salt(&salt_path) {
        Ok(loaded) => loaded,
        Err(message) => return unreadable(message),
    };
    if let Some(warning) = warning {
        prefixscope_core::stderr_line!("prefixscope export: warning: {warning}");
    }

    let block_size = match target.default_block_size() {
        Some(default) => {
            let (size, why) = match args.block_size {
                Some(size) if size != default => (
                    size,
                    format!(" (--block-size; its consumers assume {default})"),
                ),
                Some(size) => (size, String::new()),
                None => trace_block_size(format, target, default),
            };
            prefixscope_core::stderr_line!(
                "prefixscope export: {} → {}: hash ids of {size}-token blocks{why}",
                format.as_str(),
                target.as_str(),
            );
            size
        }
        None => {
            prefixscope_core::stderr_line!(
                "prefixscope export: {} → {}: block size: none ({} has no hash ids{})",
                format.as_str(),
                target.as_str(),
                target.as_str(),
                if args.block_size.is_some() {
                    "; --block-size ignored"
                } else {
                    ""
                }
            );
            args.block_size.unwrap_or(16)
        }
    };
    if !target.anonymous() {
        prefixscope_core::stderr_line!(
            "prefixscope export: WARNING: otel is NOT anonymous: the spans carry every message, the system prompt and the tool definitions (replay sends them). Share it as you would the recording."
        );
    }
    prefixscope_core::stderr_line!(
        "prefixscope export: salt {} ({})",
        salt_path.display(),
        if created { "created" } else { "reused" }
    );

    let options = Options {
        target,
        block_size,
        salt,
        tools_position,
        ts_column: args.ts_column.clone(),
    };
    if let Err(code) = super::check_output(args.output.as_deref(), &args.files) {
        return code;
    }
    let inputs = Files { paths: &args.files };
    let result = match &args.output {
        Some(path) => {
            // A 0600 temporary file renamed over the target once the export is whole: a failed
            // export leaves an existing file as it was (`prefixscope_core::output_file`).
            let input_paths: Vec<&Path> = args.files.iter().map(PathBuf::as_path).collect();
            let mut out = match OutputFile::create(path, &input_paths) {
                Ok(out) => out,
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput => return usage(e),
                Err(e) => return unreadable(format!("cannot write {}: {e}", path.display())),
            };
            // Nothing usable (every row bad): the target is left as it was.
            export::export(&inputs, format, &options, &mut out).and_then(|s| {
                if s.requests == 0 && super::had_bytes(&args.files) {
                    return Ok(s);
                }
                out.commit().map(|()| s).map_err(ExportError::Write)
            })
        }
        None => {
            let stdout = std::io::stdout();
            let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
            export::export(&inputs, format, &options, &mut out)
                .and_then(|s| out.flush().map(|()| s).map_err(ExportError::Write))
        }
    };
    match result {
        Ok(summary) => {
            report(&summary, target, args.output.as_deref());
            if summary.requests == 0 && super::had_bytes(&args.files) {
                prefixscope_core::stderr_line!(
                    "prefixscope export: nothing in the input could be exported{}",
                    args.output
                        .as_deref()
                        .map_or(String::new(), |p| format!("; {} not written", p.display()))
                );
                return EXIT_UNREADABLE;
            }
            EXIT_OK
        }
        Err(ExportError::Usage(message)) => usage(message),
        Err(e) => unreadable(e),
    }
}

fn report(summary: &Summary, target: Target, output: Option<&Path>) {
    for bad in &summary.bad_rows {
        prefixscope_core::stderr_line!(
            "prefixscope: {}:{}: {}",
            bad.file,
            bad.row.line,
            bad.row.error
        );
    }
    for value in &summary.bad_values {
        prefixscope_core::stderr_line!("prefixscope: bad value: {value}");
    }
    if summary.bad_value_count > 0 {
        prefixscope_core::stderr_line!(
            "prefixscope export: {} implausible server counts ignored (read as not reported)",
            summary.bad_value_count
        );
    }
    let w = &summary.written;
    let unit = match target {
        Target::Weka => "conversation objects",
        Target::Otel => "traces",
        _ => "rows",
    };
    prefixscope_core::stderr_line!(
        "prefixscope export: {} requests → {} {unit}{}",
        summary.requests,
        w.lines,
        output.map_or(String::new(), |p| format!(" in {}", p.display()))
    );
    prefixscope_core::stderr_line!(
        "  output_length: {} from the server, {} estimated (no count in the response), {} raised from 0 to 1",
        summary.output_from_server,
        summary.output_estimated,
        summary.output_raised_from_zero
    );
    if target.uses_conversations() {
        prefixscope_core::stderr_line!(
            "  conversations from {}: {} written · {} tool-result steps{}",
            summary.conversation_source,
            w.conversations,
            w.tool_results,
            if target == Target::Weka {
                format!(" · {} subagents", w.subagents)
            } else {
                String::new()
            }
        );
    }
    let skipped: Vec<String> = summary
        .skipped
        .iter()
        .map(|(reason, n)| format!("{n} {reason}"))
        .collect();
    prefixscope_core::stderr_line!(
        "  not exported: {} bad lines, {} non-2xx responses{}",
        summary.bad_rows.len(),
        summary.non_2xx,
        if skipped.is_empty() {
            String::new()
        } else {
            format!(", {}", skipped.join(", "))
        }
    );
    prefixscope_core::stderr_line!(
        "  held at most: {} requests read ahead of their turn, {} in conversations not yet written",
        summary.read_ahead_max,
        w.held_requests_max
    );
    if summary.untimed > 0 {
        prefixscope_core::stderr_line!(
            "  {} requests had no timestamp and were given the previous one's",
            summary.untimed
        );
    }
    if target.anonymous() {
        prefixscope_core::stderr_line!(
            "  anonymized: token counts, times and salted ids; no message text, system prompt, tool schema, arguments, results, model or tool name"
        );
    }
}
