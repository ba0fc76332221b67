//! The cache simulation on the public Mooncake conversation trace (`tests/data/mooncake/`),
//! against the figures of kvcache-simulator 0.1.3 and AIPerf, to the token
//! (`../shared/reference/cache-simulation.md`).

use std::fs::File;
use std::io::BufReader;
use std::process::Command;

use prefixscope_core::cache::Point;
use prefixscope_core::cache::{Capacity, LiveSimulator, Policy, ProfileConfig, Request, profile};
use prefixscope_core::input::{self, Format, InputOptions};

const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/mooncake/conversation_trace.jsonl.gz"
);

/// kvcache-simulator's hit tokens: (cache blocks, FIFO, LRU, optimal).
const REFERENCE: [(u64, u64, u64, u64); 6] = [
    (32, 1_943_040, 3_080_192, 3_812_262),
    (128, 2_661_376, 3_080_581, 5_415_511),
    (512, 2_961_480, 3_085_579, 9_628_909),
    (2_048, 3_728_351, 3_833_192, 18_226_289),
    (8_192, 11_210_017, 12_781_765, 27_038_068),
    (32_768, 21_376_864, 24_161_208, 27_038_068),
];
const MEASURED_TOKENS: u64 = 67_915_607;
const CEILING: u64 = 27_038_068;

fn trace() -> Vec<Request> {
    let file = File::open(TRACE).map(BufReader::new);
    let mut reader = file.and_then(input::decompressed).expect("the trace opens");
    let format = input::detect(&mut reader).expect("the trace reads");
    assert_eq!(format, Some(Format::Mooncake));
    let options = InputOptions {
        block_size: Some(512),
        ..InputOptions::default()
    };
    let input = input::read(reader, "conversation_trace", Format::Mooncake, &options);
    assert!(
        input.report.bad_rows.is_empty(),
        "{:?}",
        input.report.bad_rows
    );
    assert_eq!(input.requests.len(), 12_031);
    input.requests
}

fn capacities() -> Vec<Capacity> {
    REFERENCE
        .iter()
        .map(|&(blocks, ..)| Capacity {
            blocks,
            label: format!("{blocks}b"),
        })
        .collect()
}

fn hit_tokens(points: &[Point], policy: Policy, blocks: u64) -> Option<u64> {
    points
        .iter()
        .find(|p| p.policy == policy && p.capacity_blocks == Some(blocks))
        .map(|p| p.hit_tokens)
}

#[test]
fn every_figure_equals_kvcache_simulator_and_aiperf() {
    let requests = trace();
    let config = ProfileConfig {
        block_size: 512,
        capacities: capacities(),
        ..ProfileConfig::default()
    };
    let report = profile(&requests, &config);
    assert_eq!(report.warmup_requests, 6_015);
    assert_eq!(report.measured_tokens, MEASURED_TOKENS);
    assert_eq!(report.ceiling.hit_tokens, CEILING);
    assert_eq!(report.ceiling.measured_tokens, MEASURED_TOKENS);
    for (blocks, fifo, lru, optimal) in REFERENCE {
        assert_eq!(
            hit_tokens(&report.points, Policy::Fifo, blocks),
            Some(fifo),
            "fifo at {blocks}"
        );
        assert_eq!(
            hit_tokens(&report.points, Policy::Lru, blocks),
            Some(lru),
            "lru at {blocks}"
        );
        assert_eq!(
            hit_tokens(&report.points, Policy::Optimal, blocks),
            Some(optimal),
            "optimal at {blocks}"
        );
    }
    assert!(
        report
            .points
            .iter()
            .all(|p| p.measured_tokens == MEASURED_TOKENS)
    );
    assert!(
        report
            .points
            .iter()
            .all(|p| p.full_before_measurement == Some(true))
    );
    let rate = report.aiperf_cache_hit_rate.expect("a rate");
    assert_eq!(rate.to_string(), "0.38425808746366197");
    // The leaderboards' reusable tokens add up to the cold ceiling: no group is counted twice.
    let cold = profile(
        &requests,
        &ProfileConfig {
            block_size: 512,
            warmup: 0.0,
            policies: Vec::new(),
            ..ProfileConfig::default()
        },
    );
    assert_eq!(cold.top_prefixes.reusable_tokens, cold.ceiling.hit_tokens);
    assert_eq!(report.top_prefixes.by_count[0].count, 12_031);
}

#[test]
fn the_command_prints_the_figures() {
    let output = Command::new(env!("CARGO_BIN_EXE_prefixscope"))
        .args(["profile", TRACE, "--json"])
        .output()
        .expect("the binary runs");
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["block_size"], 512);
    assert_eq!(report["ceiling"]["hit_tokens"], CEILING);
    assert_eq!(report["measured_tokens"], MEASURED_TOKENS);
    assert_eq!(report["version"], 2);
    assert_eq!(report["inputs"][0]["format"], "mooncake");
    // The default capacities, 16K … 16M tokens, are the reference's block counts at 512.
    for (blocks, fifo, lru, optimal) in REFERENCE {
        for (policy, expected) in [("fifo", fifo), ("lru", lru), ("optimal", optimal)] {
            let point = report["points"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["policy"] == policy && p["capacity_blocks"] == blocks);
            assert_eq!(
                point.map(|p| p["hit_tokens"].clone()),
                Some(expected.into())
            );
        }
    }
    // serde_json prints the shortest representation that reads back exactly.
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("\"aiperf_cache_hit_rate\": 0.38425808746366197"));

    let summary = Command::new(env!("CARGO_BIN_EXE_prefixscope"))
        .args(["profile", TRACE])
        .output()
        .expect("the binary runs");
    let text = String::from_utf8_lossy(&summary.stdout);
    assert!(
        text.contains("AIPerf cache_hit_rate 0.38425808746366197"),
        "{text}"
    );
    assert!(
        text.contains("ceiling 39.81% (27,038,068 of 67,915,607 tokens)"),
        "{text}"
    );
}

#[test]
fn live_after_n_requests_equals_a_cold_batch_replay_of_those_n() {
    let requests = trace();
    let mut live = LiveSimulator::new(512, capacities());
    for n in [1_000usize, 4_000] {
        while live.requests() < n {
            live.push(&requests[live.requests()]);
        }
        let config = ProfileConfig {
            block_size: 512,
            warmup: 0.0,
            policies: vec![Policy::Fifo, Policy::Lru],
            capacities: capacities(),
            ..ProfileConfig::default()
        };
        let batch = profile(&requests[..n], &config);
        assert_eq!(live.ceiling().hit_tokens, batch.ceiling.hit_tokens);
        assert_eq!(live.ceiling().measured_tokens, batch.measured_tokens);
        for point in live.points() {
            let blocks = point.capacity_blocks.unwrap_or_default();
            assert_eq!(
                Some(point.hit_tokens),
                hit_tokens(&batch.points, point.policy, blocks),
                "{} at {blocks} after {n}",
                point.policy.as_str()
            );
        }
    }
}

/// Python's `statistics.mean` of `values` (written as their shortest round-trip text, which
/// Python reads back exactly), or `None` when there is no python3 here.
fn python_statistics_mean(values: &[f64]) -> Option<f64> {
    use std::io::Write;
    let mut child = Command::new("python3")
        .args([
            "-c",
            "import sys, statistics; print(repr(statistics.mean(float(l) for l in sys.stdin)))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .ok()?;
    let text: String = values.iter().map(|v| format!("{v:?}\n")).collect();
    child.stdin.take()?.write_all(text.as_bytes()).ok()?;
    let out = child.wait_with_output().ok()?;
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

/// A seeded trace of `n` requests: conversations that grow (their earlier blocks again, then
/// new ones), and one-off requests sharing a system prompt, so ratios take many values.
fn generated_trace(n: usize) -> Vec<Request> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move |below: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % below
    };
    let mut conversations: Vec<Vec<u64>> = Vec::new();
    let mut fresh = 1_000_000u64;
    let mut requests = Vec::new();
    for _ in 0..n {
        let blocks: Vec<u64> = if conversations.is_empty() || next(4) == 0 {
            let mut ids = vec![next(3) + 1];
            for _ in 0..(1 + next(40)) {
                fresh += 1;
                ids.push(fresh);
            }
            conversations.push(ids.clone());
            ids
        } else {
            let c = next(conversations.len() as u64) as usize;
            for _ in 0..(1 + next(6)) {
                fresh += 1;
                conversations[c].push(fresh);
            }
            conversations[c].clone()
        };
        requests.push(Request {
            blocks: blocks
                .iter()
                .map(|&id| prefixscope_core::cache::Block { id, tokens: 16 })
                .collect(),
            input_tokens: 16 * blocks.len() as u64,
            ..Request::default()
        });
    }
    requests
}

/// AIPerf's cache_hit_rate is `statistics.mean` of the per-request ratios: the exact sum
/// divided by n, rounded once. It equals Python's to the bit on the Mooncake trace and on a
/// generated trace of 5,000 requests.
#[test]
fn the_aiperf_rate_equals_python_statistics_mean_to_the_bit() {
    use prefixscope_core::cache::{aiperf_cache_hit_rate, aiperf_ratios};
    for (name, requests) in [("mooncake", trace()), ("generated", generated_trace(5_000))] {
        let ours = aiperf_cache_hit_rate(&requests).unwrap();
        let Some(python) = python_statistics_mean(&aiperf_ratios(&requests)) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "python3 is needed here to check the mean"
            );
            eprintln!("SKIPPED: no python3 to compare with");
            return;
        };
        assert_eq!(
            ours.to_bits(),
            python.to_bits(),
            "{name}: {ours:?} vs {python:?}"
        );
    }
}
