//! Writes a generated agent workload as a recording (JSON Lines, completion order).
//!
//! cargo run --release --example workload -- --records N [--agents A] [--seed S] [--in-order]
//!     [--context-chars C] -o FILE

use std::fs::File;
use std::io::{BufWriter, Write};
use std::process::ExitCode;
use std::time::Instant;

use prefixscope_core::record::record_line;
use workload::{WorkloadConfig, generate};

const USAGE: &str =
    "usage: workload --records N [--agents A] [--seed S] [--in-order] [--context-chars C] -o FILE";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("workload: {message}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let mut config = WorkloadConfig::default();
    let mut records = None;
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--records" => records = Some(number(&value("--records")?)?),
            "--agents" => config.agents = number(&value("--agents")?)?,
            "--seed" => config.seed = number(&value("--seed")?)?,
            "--context-chars" => config.context_chars = number(&value("--context-chars")?)?,
            "--in-order" => config.out_of_order = false,
            "-o" | "--out" => out = Some(value("-o")?),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    config.records = records.ok_or("--records is required")?;
    let out = out.ok_or("-o FILE is required")?;

    let started = Instant::now();
    let generated = generate(&config);
    let generating = started.elapsed();

    let file = File::create(&out).map_err(|e| format!("{out}: {e}"))?;
    let mut writer = BufWriter::new(file);
    let mut bytes = 0usize;
    for record in &generated {
        let line = record_line(record);
        bytes += line.len();
        writer.write_all(&line).map_err(|e| format!("{out}: {e}"))?;
    }
    writer.flush().map_err(|e| format!("{out}: {e}"))?;

    let seconds = generating.as_secs_f64();
    eprintln!(
        "{} records ({:.1} MB) generated in {:.3} s ({:.0} records/s), written to {out} in {:.3} s",
        generated.len(),
        bytes as f64 / 1e6,
        seconds,
        generated.len() as f64 / seconds.max(1e-9),
        (started.elapsed() - generating).as_secs_f64(),
    );
    Ok(())
}

fn number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    text.parse().map_err(|_| format!("not a number: {text}"))
}
