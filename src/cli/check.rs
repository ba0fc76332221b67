//! `prefixscope check FILE...`: a guard for CI. Exits 1 when the recordings lose more of their
//! prefill than `--max-lost`, or, against `--baseline` (an earlier `analyze --json`), when a
//! cause of loss appears or grows by more than `--tolerance`; prints the offending findings with
//! their fixes. 0 otherwise; 2 when the input cannot be judged (unreadable, or no loss
//! measured: "not measured" never passes as zero).

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde_json::Value;

use super::{EXIT_OK, EXIT_USAGE, read_recordings};
use prefixscope_core::analysis::{Config, Finding, analyze, finding_label};
use prefixscope_core::units::thousands;

/// A regression: the build fails.
const EXIT_REGRESSION: u8 = 1;

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum By {
    /// Tokens the server evaluated again, of the tokens it evaluated.
    Tokens,
    /// Seconds of prefill spent on them, of all prefill.
    Time,
}

#[derive(Args)]
pub struct CheckArgs {
    /// Recordings (prefixscope's or llmp's JSON Lines, gateway logs) with the server's counts.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Fail when more than this share of the prefill was lost (`10%` or `10`).
    #[arg(long, value_parser = percent)]
    max_lost: Option<f64>,
    /// What the shares are of.
    #[arg(long, value_enum, default_value = "tokens")]
    by: By,
    /// An earlier `prefixscope analyze --json` of the same workload: fail when a cause of loss
    /// appears or its share grows by more than `--tolerance`.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// How much a cause's share of the prefill may grow over the baseline, in points.
    #[arg(long, value_parser = percent, default_value = "1%")]
    tolerance: f64,
}

/// `12.5%` or `12.5` → 12.5; 0 to 100.
fn percent(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{text:?} is not a percentage (say 10% or 10)"))?;
    if (0.0..=100.0).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{text} is not between 0% and 100%"))
    }
}

/// What a report lost, by cause, as shares of its prefill: read from `analyze --json`'s shape,
/// so the recordings and the baseline are read alike.
#[derive(Debug, PartialEq)]
struct Losses {
    /// Tokens evaluated, or prefill ms, over every request (the header's "of N prefill").
    prefill: f64,
    lost: f64,
    by_cause: BTreeMap<String, f64>,
}

impl Losses {
    /// `None` when no loss was measured (the server reported no reuse or no timings).
    fn of(report: &Value, by: By) -> Option<Losses> {
        let rows = report["rows"].as_array()?;
        if !rows.iter().any(|row| row["loss_measured"] == true) {
            return None;
        }
        let value = |v: &Value| v.get("value").and_then(Value::as_f64);
        let prefill = match by {
            By::Tokens => rows
                .iter()
                .filter_map(|row| value(&row["counts"]["evaluated_tokens"]))
                .sum(),
            By::Time => value(&report["time"]["prefill_ms"])?,
        };
        let amount = |entry: &Value| match by {
            By::Tokens => entry["tokens"].as_f64(),
            By::Time => value(&entry["ms"]),
        };
        let lost = match by {
            By::Tokens => report["time"]["lost_tokens"].as_f64()?,
            By::Time => value(&report["time"]["lost_ms"])?,
        };
        let by_cause = report["time"]["by_cause"]
            .as_object()?
            .iter()
            .filter_map(|(cause, entry)| Some((cause.clone(), amount(entry)?)))
            .collect();
        Some(Losses {
            prefill,
            lost,
            by_cause,
        })
    }

    /// Percent of the prefill.
    fn share(&self, amount: f64) -> f64 {
        if self.prefill > 0.0 {
            amount * 100.0 / self.prefill
        } else {
            0.0
        }
    }

    fn amount_text(amount: f64, by: By) -> String {
        match by {
            By::Tokens => format!("{} tokens", thousands(amount.round() as u64)),
            By::Time => prefixscope_core::units::duration_compound(amount),
        }
    }
}

pub fn run(args: CheckArgs) -> u8 {
    if args.max_lost.is_none() && args.baseline.is_none() {
        prefixscope_core::stderr_line!(
            "prefixscope check: nothing to check against: give --max-lost P% or --baseline REPORT"
        );
        return EXIT_USAGE;
    }
    let baseline = match &args.baseline {
        Some(path) => match read_baseline(path, args.by) {
            Ok(losses) => Some(losses),
            Err(why) => {
                prefixscope_core::stderr_line!("prefixscope check: --baseline {why}");
                return EXIT_USAGE;
            }
        },
        None => None,
    };
    let Some(read) = read_recordings(&args.files) else {
        return EXIT_USAGE;
    };
    if read.failed {
        prefixscope_core::stderr_line!(
            "prefixscope check: not every input could be read: nothing is judged on part of it"
        );
        return EXIT_USAGE;
    }
    let report = analyze(&read.records, &Config::default());
    let json = serde_json::to_value(&report).unwrap_or_default();
    let Some(now) = Losses::of(&json, args.by) else {
        prefixscope_core::stderr_line!(
            "prefixscope check: loss not measured: the server reported no reuse {}on these requests; the check needs a server that reports them (llama.cpp, vLLM, Ollama, a hosted API's cached tokens)",
            if args.by == By::Time {
                "or prefill time "
            } else {
                ""
            }
        );
        return EXIT_USAGE;
    };
    let mut out = String::new();
    let mut failed_causes: Vec<String> = Vec::new();
    let mut failed = false;
    let lost_share = now.share(now.lost);
    out.push_str(&format!(
        "lost {:.1}% of the prefill ({} of {})",
        lost_share,
        Losses::amount_text(now.lost, args.by),
        Losses::amount_text(now.prefill, args.by),
    ));
    if let Some(limit) = args.max_lost {
        let over = lost_share > limit;
        failed |= over;
        out.push_str(&format!(
            ": {} --max-lost {limit}%\n",
            if over { "FAIL, over" } else { "ok, within" }
        ));
        if over {
            failed_causes.extend(now.by_cause.keys().cloned());
        }
    } else {
        out.push('\n');
    }
    if let Some(before) = &baseline {
        for (cause, &amount) in &now.by_cause {
            let share = now.share(amount);
            let was = before.by_cause.get(cause).map(|&a| before.share(a));
            let grew = match was {
                None => amount > 0.0,
                Some(was) => share - was > args.tolerance,
            };
            out.push_str(&format!(
                "  {cause}: {share:.1}% of the prefill ({}), baseline {}{}\n",
                Losses::amount_text(amount, args.by),
                was.map_or("none".into(), |w| format!("{w:.1}%")),
                match (grew, was) {
                    (true, None) => ": FAIL, a new cause".to_string(),
                    (true, Some(_)) => format!(": FAIL, grew by more than {}%", args.tolerance),
                    (false, _) => String::new(),
                }
            ));
            if grew {
                failed = true;
                failed_causes.push(cause.clone());
            }
        }
    }
    if failed {
        let findings = offending(&report.findings, &failed_causes);
        if !findings.is_empty() {
            out.push_str("what to fix:\n");
            for finding in findings {
                out.push_str(&format!("  {}\n", finding_label(finding)));
                if let Some(fix) = &finding.fix {
                    out.push_str(&format!("      fix ({}): {}\n", fix.owner, fix.change));
                }
            }
        }
    }
    super::print_stdout(&out);
    if failed { EXIT_REGRESSION } else { EXIT_OK }
}

fn read_baseline(path: &std::path::Path, by: By) -> Result<Losses, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let report: Value = serde_json::from_str(&text).map_err(|e| {
        format!(
            "{}: not a report of `prefixscope analyze --json`: {e}",
            path.display()
        )
    })?;
    Losses::of(&report, by).ok_or_else(|| {
        format!(
            "{}: no measured loss in it (the server reported no reuse, or not `analyze --json`'s shape)",
            path.display()
        )
    })
}

/// The findings with a loss of one of `causes`, costliest first.
fn offending<'a>(findings: &'a [Finding], causes: &[String]) -> Vec<&'a Finding> {
    let mut found: Vec<&Finding> = findings
        .iter()
        .filter(|f| f.lost_tokens.unwrap_or(0) > 0)
        .filter(|f| {
            let cause = prefixscope_core::analysis::advice_cause(f);
            causes.iter().any(|c| c == cause)
        })
        .collect();
    found.sort_by_key(|f| std::cmp::Reverse(f.lost_tokens.unwrap_or(0)));
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentages_are_read_with_or_without_the_sign() {
        assert_eq!(percent("10%"), Ok(10.0));
        assert_eq!(percent(" 2.5 "), Ok(2.5));
        assert!(percent("120%").is_err());
        assert!(percent("ten").is_err());
    }

    #[test]
    fn shares_are_of_the_whole_prefill() {
        let report = serde_json::json!({
            "rows": [
                {"loss_measured": true, "counts": {"evaluated_tokens": {"value": 300}}},
                {"loss_measured": false, "counts": {"evaluated_tokens": {"value": 80}}},
                {"loss_measured": true, "counts": {"evaluated_tokens": {"value": 20}}},
            ],
            "time": {"lost_tokens": 40, "lost_ms": {"value": 20.0}, "prefill_ms": {"value": 200.0},
                "by_cause": {"side_call": {"tokens": 40, "ms": {"value": 20.0}}}},
        });
        let tokens = Losses::of(&report, By::Tokens).unwrap();
        assert_eq!(tokens.share(tokens.lost), 10.0);
        let time = Losses::of(&report, By::Time).unwrap();
        assert_eq!(time.share(time.by_cause["side_call"]), 10.0);
        let unmeasured = serde_json::json!({"rows": [{"loss_measured": false}], "time": {}});
        assert_eq!(Losses::of(&unmeasured, By::Tokens), None);
    }
}
