//! The `prefixscope` command: one subcommand, one function in `cli/`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "prefixscope",
    version,
    about = "See how well an LLM server's prefix cache serves your agents, and why it misses"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the recording proxy: point your agent at it, it forwards every byte to the server
    /// unchanged and writes one record per exchange.
    Record(cli::record::RecordArgs),
    /// Read recordings (prefixscope's or llmp's) and list what they hold.
    Records(cli::records::RecordsArgs),
    /// Report on recordings: conversations, prefix breaks, tokens and time lost, and who caused it.
    Analyze(cli::analyze::AnalyzeArgs),
    /// How much a prefix cache could save on this traffic (recordings, gateway logs, Mooncake or
    /// bailian traces), by capacity and eviction policy, and which prefixes carry the reuse.
    Profile(cli::profile::ProfileArgs),
    /// Watch saved recordings in the TUI, paced by their timestamps (one line per record and a
    /// summary when stdout is not a terminal).
    Replay(cli::replay::ReplayArgs),
    /// The recording proxy with the TUI: point your agent at it and watch its cache live.
    Watch(cli::watch::WatchArgs),
    /// Write recordings, gateway logs or traces as a trace the replay tools load (GuideLLM,
    /// AIPerf): mooncake, bailian, weka, trace_synthetic (anonymized), or otel (NOT anonymous:
    /// the spans carry the messages).
    Export(cli::export::ExportArgs),
    /// No model needed: a simulated llama-server, scripted agents talking to it through the
    /// proxy, and the TUI on their traffic (the summary when stdout is not a terminal).
    Demo(cli::demo::DemoArgs),
    /// Replay a recording against the simulated server with other settings (slots, host cache)
    /// and compare the predicted losses with the recorded ones.
    Whatif(cli::whatif::WhatIfArgs),
    /// For CI: exit 1 when recordings lose more of their prefill than --max-lost, or a cause of
    /// loss appears or grows against --baseline (an earlier `analyze --json`); 2 on bad input.
    Check(cli::check::CheckArgs),
}

fn main() -> ExitCode {
    without_huge_pages();
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Records(_)
            | Command::Analyze(_)
            | Command::Profile(_)
            | Command::Export(_)
            | Command::Whatif(_)
            | Command::Check(_)
    ) {
        prefixscope::session::shutdown::exit_on_signal();
    }
    let code = match cli.command {
        Command::Record(args) => cli::record::run(args),
        Command::Records(args) => cli::records::run(args),
        Command::Profile(args) => cli::profile::run(args),
        Command::Analyze(args) => cli::analyze::run(args),
        Command::Replay(args) => cli::replay::run(args),
        Command::Watch(args) => cli::watch::run(args),
        Command::Export(args) => cli::export::run(args),
        Command::Demo(args) => cli::demo::run(args),
        Command::Whatif(args) => cli::whatif::run(args),
        Command::Check(args) => cli::check::run(args),
    };
    ExitCode::from(code)
}

/// Transparent huge pages off for this process. Our heaps churn (every record parsed, normalized
/// and dropped, on several threads) and a huge page is faulted in and zeroed 2 MiB at a time
/// even when a few KB of it are used: with them `analyze` of 100,000 generated records spent
/// 1.2 s of system time against 0.4 s without (4.8 s wall against 4.4 s), `profile` of the
/// Mooncake trace held 85 MiB for 56 MiB of use (BENCHMARKS.md). A hint to the kernel; a kernel
/// that refuses it changes nothing.
fn without_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}
