//! Live means incremental: after every `push` the engine's report equals a batch analysis (by
//! the reference algorithm) of the records pushed so far, whatever order they arrive in.
#![allow(clippy::manual_is_multiple_of)]

use prefixscope_core::analysis::{Analyzer, Config, analyze_reference};
use prefixscope_core::record::{Record, read_jsonl};

const RECORDINGS: [&str; 8] = [
    "llmp/llama.cpp/parallel-nocache",
    "llmp/llama.cpp/parallel",
    "llmp/llama.cpp/session",
    "llmp/llama.cpp/session.digest",
    "llmp/ollama/session",
    "llmp/ollama-openai/session",
    "xllamacpp/session",
    "xllamacpp/session.digest",
];

fn load(name: &str) -> Vec<Record> {
    let path = format!("{}/recordings/{name}.jsonl", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read(&path).unwrap();
    // The file's order is the completion order the proxy wrote.
    let mut records = read_jsonl(text.as_slice()).records;
    let order: Vec<u64> = String::from_utf8_lossy(&text)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["id"].as_u64())
        .collect();
    records.sort_by_key(|r| order.iter().position(|&id| id == r.id));
    records
}

fn check_every_prefix(name: &str, arrivals: &[Record]) {
    let config = Config::default();
    let mut engine = Analyzer::new(config.clone());
    for n in 0..arrivals.len() {
        let update = engine.push(&arrivals[n]);
        let live_report = engine.report();
        let batch_report = analyze_reference(&arrivals[..=n], &config);
        // The break texts are not in the JSON (the TUI's detail reads them): compared apart.
        let texts = |report: &prefixscope_core::analysis::Report| -> Vec<_> {
            report
                .rows
                .iter()
                .map(|r| r.break_location.as_ref().and_then(|l| l.texts.clone()))
                .collect()
        };
        assert_eq!(
            texts(&live_report),
            texts(&batch_report),
            "{name}: after {} pushes, the break texts differ",
            n + 1
        );
        let live = serde_json::to_value(live_report).unwrap();
        let batch = serde_json::to_value(batch_report).unwrap();
        if live != batch {
            for key in batch.as_object().unwrap().keys() {
                assert_eq!(
                    live[key],
                    batch[key],
                    "{name}: after {} pushes (last id {}, update {update:?}), `{key}` differs",
                    n + 1,
                    arrivals[n].id
                );
            }
        }
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

#[test]
fn live_equals_batch_after_every_record_of_every_real_recording() {
    for name in RECORDINGS {
        check_every_prefix(name, &load(name));
    }
}

/// Real traffic in shuffled arrival orders: completion order far from start order.
#[test]
fn live_equals_batch_when_records_arrive_out_of_order() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for name in RECORDINGS {
        for _ in 0..4 {
            let mut arrivals = load(name);
            for i in (1..arrivals.len()).rev() {
                let j = (rng.next() % (i as u64 + 1)) as usize;
                arrivals.swap(i, j);
            }
            check_every_prefix(name, &arrivals);
        }
    }
}

/// A small generated workload that stresses classification: tool-less chats whose first turn
/// looks like a one-shot until the second arrives, tool-using agents, title side-calls,
/// repeated identical requests, a stateless model, two user-agents, long requests that
/// complete after later ones.
fn workload(seed: u64, n: usize) -> Vec<Record> {
    let mut rng = Rng(seed | 1);
    let mut conversations: Vec<(String, String, String, Vec<serde_json::Value>, bool)> = Vec::new();
    let mut records = Vec::new();
    let mut t = 1_000_000i64;
    for id in 1..=n as u64 {
        t += (rng.next() % 3_000) as i64;
        let dice = rng.next() % 100;
        let (model, agent, messages, tools): (String, String, Vec<serde_json::Value>, bool) =
            if dice < 12 {
                // A title side-call.
                (
                    "m1".into(),
                    "ua1".into(),
                    vec![
                        serde_json::json!({"role": "user", "content": format!("title for {}", rng.next() % 5)}),
                    ],
                    false,
                )
            } else if dice < 22 {
                // A stateless model: single prompts of shrinking size.
                (
                    "embed".into(),
                    "ua2".into(),
                    vec![
                        serde_json::json!({"role": "user", "content": format!("classify {}", 100 - id % 50)}),
                    ],
                    false,
                )
            } else if dice < 35 || conversations.is_empty() {
                let tools = rng.next() % 2 == 0;
                let model = if rng.next() % 4 == 0 { "m2" } else { "m1" };
                let agent = if rng.next() % 3 == 0 { "ua2" } else { "ua1" };
                let system = format!(
                    "You are agent {}. Today is day {}.",
                    rng.next() % 4,
                    rng.next() % 2
                );
                let messages = vec![
                    serde_json::json!({"role": "system", "content": system}),
                    serde_json::json!({"role": "user", "content": format!("task {id}")}),
                ];
                conversations.push((model.into(), agent.into(), system, messages.clone(), tools));
                (model.into(), agent.into(), messages, tools)
            } else {
                let k = (rng.next() % conversations.len() as u64) as usize;
                let c = &mut conversations[k];
                match rng.next() % 10 {
                    0 => {
                        // The date in the system prompt changes.
                        c.2 = c.2.replace("day 0", "day 1");
                        c.3[0] = serde_json::json!({"role": "system", "content": c.2.clone()});
                    }
                    1 if c.3.len() > 4 => {
                        // Compaction.
                        let system = c.3[0].clone();
                        c.3 = vec![
                            system,
                            serde_json::json!({"role": "user", "content": "summary so far"}),
                        ];
                    }
                    2 => {} // the same request again
                    _ => {
                        c.3.push(serde_json::json!({"role": "assistant", "content": format!("answer {id}")}));
                        c.3.push(
                            serde_json::json!({"role": "user", "content": format!("more {id}")}),
                        );
                    }
                }
                (c.0.clone(), c.1.clone(), c.3.clone(), c.4)
            };
        let mut body = serde_json::json!({"model": model, "messages": messages});
        if tools {
            body["tools"] = serde_json::json!([{"type": "function", "function": {"name": "read_file", "parameters": {}}}]);
        }
        let prompt = 20 + 15 * messages.len() as u64;
        let reused = rng.next() % (prompt + 1);
        let duration = if rng.next() % 5 == 0 {
            9_000
        } else {
            200 + (rng.next() % 800) as i64
        };
        let record = serde_json::json!({
            "v": 1, "id": id, "conn": 1 + id % 7, "t_start_ms": t, "t_first_byte_ms": t + duration / 2, "t_end_ms": t + duration,
            "request": {"method": "POST", "path": "/v1/chat/completions", "headers": {"user-agent": agent}, "body_bytes": 1,
                "body": body, "body_text": null, "digest": null},
            "response": {"status": 200, "headers": {}, "stream": null, "chunks": null, "bad_chunks": null, "body_bytes": 1, "truncated": false,
                "body": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                    "timings": {"cache_n": reused, "prompt_n": prompt - reused, "prompt_ms": (prompt - reused) as f64 * 4.0, "predicted_n": 3, "predicted_ms": 30.0}},
                "body_text": null, "digest": null},
            "error": null, "tokens": null});
        records.push(serde_json::from_value::<Record>(record).unwrap());
    }
    // Completion order.
    records.sort_by_key(|r| (r.t_end_ms, r.id));
    records
}

#[test]
fn live_equals_batch_on_generated_interleaved_agents_completing_out_of_order() {
    let mut out_of_order = 0;
    for seed in 1..=12u64 {
        let arrivals = workload(seed * 7919, 70);
        out_of_order += arrivals
            .windows(2)
            .filter(|w| w[1].t_start_ms < w[0].t_start_ms)
            .count();
        check_every_prefix(&format!("workload seed {seed}"), &arrivals);
    }
    assert!(
        out_of_order > 50,
        "the workload should complete out of start order: {out_of_order}"
    );
}

/// The benchmark's workload (several agents, many conversations in one session, so the tip
/// index decides most links): the engine, fed in completion order, equals the reference.
#[test]
fn engine_equals_reference_on_the_benchmark_workload() {
    use workload::{WorkloadConfig, generate};
    for seed in [1u64, 2, 3] {
        let config = WorkloadConfig {
            seed,
            records: 600,
            agents: 5,
            context_chars: 6_000,
            ..WorkloadConfig::default()
        };
        let arrivals = generate(&config);
        let mut engine = Analyzer::new(Config::default());
        for record in &arrivals {
            engine.push(record);
        }
        let live = serde_json::to_value(engine.report()).unwrap();
        let batch = serde_json::to_value(analyze_reference(&arrivals, &Config::default())).unwrap();
        assert!(
            live == batch,
            "seed {seed}: live and reference reports differ"
        );
        let conversations = live["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["conversation"].as_u64())
            .max()
            .unwrap_or(0);
        assert!(
            conversations > 20,
            "seed {seed}: only {conversations} conversations"
        );
    }
}

/// Reports follow global changes: on `parallel-nocache`, rows first labelled `llmp-drive/1`
/// are relabelled `llmp-drive/1 #1` once the second tool set appears, findings appear as their
/// evidence arrives, and the last report is the batch report. A report shares the rows it did
/// not change with the report before it.
#[test]
fn reports_relabel_rows_and_add_findings() {
    let arrivals = load("llmp/llama.cpp/parallel-nocache");
    let mut engine = Analyzer::new(Config::default());
    let mut labels: std::collections::HashMap<u64, String> = std::collections::HashMap::new();
    let mut relabelled = Vec::new();
    let mut most_findings = 0;
    let mut last = None;
    for record in &arrivals {
        engine.push(record);
        let report = engine.report();
        for row in &report.rows {
            match labels.insert(row.id, row.client.clone()) {
                Some(old) if old != row.client => relabelled.push((row.id, row.client.clone())),
                _ => {}
            }
        }
        most_findings = most_findings.max(report.findings.len());
        last = Some(report);
    }
    assert!(
        relabelled
            .iter()
            .any(|(_, label)| label == "llmp-drive/1 #1"),
        "{relabelled:?}"
    );
    assert!(most_findings > 0);
    let last = last.unwrap();
    let batch = serde_json::to_value(analyze_reference(&arrivals, &Config::default())).unwrap();
    assert_eq!(serde_json::to_value(&last).unwrap(), batch);
    // Nothing changed since: the next report is the same, and shares every row with the one
    // before.
    assert_eq!(engine.report(), last);
    let (a, b) = (engine.shared_report(), engine.shared_report());
    assert!(
        a.rows.len() == last.rows.len()
            && a.rows
                .iter()
                .zip(&b.rows)
                .all(|(a, b)| std::sync::Arc::ptr_eq(&a.row, &b.row))
    );
}
