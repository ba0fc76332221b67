//! Hosted APIs, on real recorded traffic nobody here wrote (`tests/data/hosted`: OpenAI and
//! Anthropic exchanges from the VCR cassettes of three public test suites, with a truth file
//! written by reading them): conversations follow the runs, with session ids and without;
//! breaks are reported only where a run really changed its prompt; a turn the provider could
//! not have cached is never the server's fault nor an eviction; Anthropic's cache reads and
//! writes are read as the API defines them; a pause past the cache's lifetime is named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use prefixscope_core::analysis::{Cause, Config, Report, analyze};
use prefixscope_core::input::open_decompressed;
use prefixscope_core::normalize::{Exchange, normalize};
use prefixscope_core::provider::{Provider, Uncached};
use prefixscope_core::record::{Record, read_jsonl};
use serde_json::{Value, json};

/// The two corpora (`tests/data/hosted`, and `hosted2` from three other suites), each with its
/// truth file, and the real breaks the linking can see of those the truth lists.
const FILES: [(&str, usize, usize); 4] = [
    ("hosted/openai.jsonl", 5, 7),
    ("hosted/anthropic.jsonl", 4, 5),
    ("hosted2/openai.jsonl", 0, 1),
    ("hosted2/anthropic.jsonl", 0, 1),
];

fn data(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn records(file: &str) -> Vec<Record> {
    let read = read_jsonl(open_decompressed(&data(&format!("{file}.gz"))).unwrap());
    assert!(read.bad_lines.is_empty(), "{file}: {:?}", read.bad_lines);
    read.records
}

/// The truth file's object for each record id of `file` (`corpus/name.jsonl`).
fn truth(file: &str) -> BTreeMap<u64, Value> {
    let (corpus, name) = file.split_once('/').unwrap();
    let path = data(&format!("{corpus}/truth.json"));
    let all: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    all[name]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_u64().unwrap(), t.clone()))
        .collect()
}

/// How the report's conversations and breaks compare with the truth: conversations whose
/// turns belong to more than one run, breaks reported, false ones among them, real ones found.
struct Links {
    spanning: Vec<u32>,
    breaks: usize,
    false_breaks: Vec<u64>,
    real_found: usize,
    real: usize,
}

fn links(report: &Report, truth: &BTreeMap<u64, Value>) -> Links {
    let mut runs: BTreeMap<u32, BTreeSet<&str>> = BTreeMap::new();
    for row in &report.rows {
        if let Some(conversation) = row.conversation {
            runs.entry(conversation)
                .or_default()
                .insert(truth[&row.id]["run"].as_str().unwrap());
        }
    }
    let broken: Vec<u64> = report
        .rows
        .iter()
        .filter(|r| r.break_cause.is_some() && !r.new_conversation)
        .map(|r| r.id)
        .collect();
    // The truth says what changed ("tools changed (added get_exchange_rate)"), or null.
    let is_real = |id: &u64| !truth[id]["real_break"].is_null();
    Links {
        spanning: runs
            .into_iter()
            .filter(|(_, runs)| runs.len() > 1)
            .map(|(c, _)| c)
            .collect(),
        breaks: broken.len(),
        false_breaks: broken.iter().copied().filter(|id| !is_real(id)).collect(),
        real_found: broken.iter().filter(|id| is_real(id)).count(),
        real: truth.keys().filter(|id| is_real(id)).count(),
    }
}

fn check_links((file, found_real, real): (&str, usize, usize), records: &[Record], with: &str) {
    let truth = truth(file);
    let report = analyze(records, &Config::default());
    let found = links(&report, &truth);
    assert!(
        found.spanning.is_empty(),
        "{file} {with}: conversations spanning runs {:?}",
        found.spanning
    );
    assert!(
        found.false_breaks.len() * 10 <= found.breaks,
        "{file} {with}: false breaks {:?} of {}",
        found.false_breaks,
        found.breaks
    );
    // The real breaks the linking can see: a re-rendered single message (DSPy), a dropped
    // thinking block, a first message rewritten with nothing before it, a history cut back to
    // the system prompt are not message-level breaks of a linked request.
    assert_eq!(
        (found.real_found, found.real),
        (found_real, real),
        "{file} {with}"
    );
}

#[test]
fn conversations_follow_the_runs_without_session_ids() {
    for case in FILES {
        check_links(case, &records(case.0), "without session ids");
    }
}

#[test]
fn conversations_follow_the_runs_with_session_ids() {
    for case in FILES {
        let file = case.0;
        let truth = truth(file);
        let mut records = records(file);
        for record in &mut records {
            let run = truth[&record.id]["run"].as_str().unwrap().to_string();
            let id = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(run.as_bytes()));
            record.request.headers.insert("x-session-id".into(), id);
        }
        check_links(case, &records, "with session ids");
    }
}

/// No `server_*` cause, no eviction by another conversation, model or side-call, anywhere on
/// a hosted API; a turn the truth says could not be cached (OpenAI under 1,024 tokens, an
/// Anthropic request without `cache_control`) is "not cacheable" when it lost anything.
#[test]
fn no_server_reset_or_eviction_on_a_hosted_api() {
    for (file, _, _) in FILES {
        let truth = truth(file);
        let report = analyze(&records(file), &Config::default());
        let mut not_cacheable = 0;
        for row in &report.rows {
            assert!(row.provider.hosted(), "{file} #{}", row.id);
            assert!(
                !matches!(
                    row.cause,
                    Some(
                        Cause::ServerReset
                            | Cause::SideCall
                            | Cause::OtherConversation
                            | Cause::OtherModel
                            | Cause::Undetermined
                    )
                ),
                "{file} #{}: {:?}",
                row.id,
                row.cause
            );
            for loss in [&row.lost_client, &row.lost_external].into_iter().flatten() {
                assert!(
                    !loss.cause.starts_with("server_")
                        && !["side_call", "other_conversation", "other_model"]
                            .contains(&loss.cause.as_str()),
                    "{file} #{}: {}",
                    row.id,
                    loss.cause
                );
            }
            if truth[&row.id]["cacheable"] == json!(false) && row.cause.is_some() {
                assert!(
                    matches!(row.cause, Some(Cause::NotCacheable | Cause::Structural)),
                    "{file} #{}: {:?}",
                    row.id,
                    row.cause
                );
                not_cacheable += usize::from(row.cause == Some(Cause::NotCacheable));
            }
        }
        assert!(not_cacheable > 0, "{file}");
        // No finding files them as the server's or as evictions.
        for finding in &report.findings {
            let kind = format!("{:?}", finding.kind);
            assert!(
                ![
                    "ServerCacheLoss",
                    "OtherConversationEviction",
                    "OtherModelEviction"
                ]
                .contains(&kind.as_str()),
                "{file}: {kind}"
            );
        }
    }
}

/// The three identical OpenAI prompts the provider did not serve from its cache (openllmetry's
/// prompt-caching test, 2026: `cached_tokens: 0` for a 1,149-token prompt sent again seconds
/// later) are the provider's misses, its 1,024 cacheable tokens each, with OpenAI's fix.
#[test]
fn openai_misses_are_the_providers_in_its_128_token_steps() {
    let report = analyze(&records("hosted/openai.jsonl"), &Config::default());
    let missed: Vec<(u64, u32)> = report
        .rows
        .iter()
        .filter(|r| r.cause == Some(Cause::ProviderMiss))
        .map(|r| (r.id, r.lost_external.as_ref().map_or(0, |l| l.tokens)))
        .collect();
    assert_eq!(missed, [(67, 1_024), (71, 1_024), (73, 1_024)]);
    let finding = report
        .findings
        .iter()
        .find(|f| f.evidence["kind"] == "provider_miss")
        .expect("a provider-miss finding");
    let fix = finding.fix.as_ref().unwrap();
    assert_eq!(fix.owner, "provider");
    assert!(fix.change.contains("prompt_cache_key"), "{}", fix.change);
}

fn exchange(file: &str, id: u64) -> Exchange {
    let record = records(file).into_iter().find(|r| r.id == id).unwrap();
    normalize(&record).unwrap()
}

fn digest_exchange(file: &str, id: u64) -> Exchange {
    let mut record = records(file).into_iter().find(|r| r.id == id).unwrap();
    prefixscope_core::normalize::digest::apply_digest(&mut record);
    normalize(&record).unwrap()
}

fn counts(x: &Exchange) -> [Option<u32>; 4] {
    let c = x.counts;
    [
        c.prompt_tokens.map(|m| m.value),
        c.reused_tokens.map(|m| m.value),
        c.evaluated_tokens.map(|m| m.value),
        c.cache_written.map(|m| m.value),
    ]
}

/// Anthropic's `usage`: `cache_read_input_tokens` came from the cache, `cache_creation_input_
/// tokens` were written to it, `input_tokens` came after the last breakpoint; the prompt is
/// their sum. A response that ran several passes on the server reports their sum, which is not
/// the prompt: its first pass where that is the message, else not measured. Full and digest
/// recordings read the same.
#[test]
fn anthropic_cache_reads_and_writes_read_right() {
    // #35: input 10, written 4,513, read 4,332.
    // #124: an advisor's three passes (2,390 input in all); the first, the message, 1,128.
    // #141: compaction first (55,096 written there); the message's pass is not the prompt.
    // #230: ten web searches, 404,500 input tokens for a 1.3 KB request.
    let expected = [
        (35, [Some(8_855), Some(4_332), Some(4_523), Some(4_513)]),
        (124, [Some(1_128), Some(0), Some(1_128), Some(0)]),
        (141, [None, None, None, None]),
        (230, [None, None, None, None]),
    ];
    for (id, want) in expected {
        assert_eq!(
            counts(&exchange("hosted/anthropic.jsonl", id)),
            want,
            "#{id}"
        );
        assert_eq!(
            counts(&digest_exchange("hosted/anthropic.jsonl", id)),
            want,
            "#{id} digest"
        );
        assert_eq!(
            exchange("hosted/anthropic.jsonl", id).provider,
            Provider::Anthropic
        );
    }
    let x = exchange("hosted/anthropic.jsonl", 35);
    let marks = x.params.cache_marks.unwrap();
    assert!(marks.breakpoints > 0, "{marks:?}");
}

/// A cached Anthropic conversation resumed after a pause: past the 5-minute lifetime the
/// provider wrote the prefix again, and the turn says the cache expired; with the 1-hour
/// lifetime asked for, the same pause is the provider's miss, not an expiry.
#[test]
fn a_pause_past_the_cache_lifetime_is_named() {
    let all = records("hosted/anthropic.jsonl");
    // #31 → #32: a `cache_control` conversation whose second turn read 9,116 tokens.
    let first = all.iter().find(|r| r.id == 31).unwrap().clone();
    let mut second = all.iter().find(|r| r.id == 32).unwrap().clone();
    let pause = 6 * 60_000;
    second.t_start_ms = first.t_end_ms + pause;
    second.t_first_byte_ms = second.t_first_byte_ms.map(|t| t + pause);
    second.t_end_ms += pause;
    // What the provider reports on a cold cache: nothing read, all of it written again.
    let usage = &mut second.response.as_mut().unwrap().body.as_mut().unwrap()["usage"];
    let read = usage["cache_read_input_tokens"].as_u64().unwrap();
    let written = usage["cache_creation_input_tokens"].as_u64().unwrap();
    usage["cache_read_input_tokens"] = json!(0);
    usage["cache_creation_input_tokens"] = json!(read + written);

    let report = analyze(&[first.clone(), second.clone()], &Config::default());
    let row = report.rows.iter().find(|r| r.id == 32).unwrap();
    assert_eq!(row.linked_to, Some(31));
    assert_eq!(row.cause, Some(Cause::CacheExpired));
    assert_eq!(
        row.uncached,
        Some(Uncached::Expired {
            gap_s: 360,
            ttl_s: 300
        })
    );
    let lost = row.lost_external.as_ref().unwrap();
    assert_eq!(lost.cause, "cache_expired");
    assert!(lost.tokens > 8_000, "{lost:?}");
    let text = row.uncached.as_ref().unwrap().text();
    assert!(text.contains("past the 5-minute lifetime"), "{text}");

    // The same pause with the 1-hour lifetime asked for on every marker.
    let one_hour = |record: &mut Record| {
        let body = record.request.body.as_mut().unwrap();
        ask_one_hour(body);
    };
    let (mut first, mut second) = (first, second);
    one_hour(&mut first);
    one_hour(&mut second);
    let report = analyze(&[first, second], &Config::default());
    let row = report.rows.iter().find(|r| r.id == 32).unwrap();
    assert_eq!(row.cause, Some(Cause::ProviderMiss));
}

fn ask_one_hour(value: &mut Value) {
    match value {
        Value::Object(object) => {
            for (key, value) in object.iter_mut() {
                if key == "cache_control" {
                    value["ttl"] = json!("1h");
                } else {
                    ask_one_hour(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(ask_one_hour),
        _ => {}
    }
}

/// A local server's traffic stays the local server's: the checked-in llama.cpp and Ollama
/// recordings have no hosted row.
#[test]
fn local_recordings_stay_local() {
    for path in [
        "recordings/llmp/llama.cpp/session.jsonl",
        "recordings/llmp/ollama/session.jsonl",
        "recordings/llmp/ollama-openai/session.jsonl",
        "recordings/xllamacpp/session.jsonl",
    ] {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        let read = read_jsonl(std::io::BufReader::new(std::fs::File::open(file).unwrap()));
        let report = analyze(&read.records, &Config::default());
        assert!(
            report.rows.iter().all(|r| r.provider == Provider::Local),
            "{path}"
        );
    }
}

/// Media and the provider's own tools count where they are: on every hosted row (both corpora
/// and the gateway log, where images, audio, PDF documents, MCP servers and server tools ride
/// along), the system prompt and each tool weigh at most twice their own text's estimate and
/// a template's few hundred tokens, whatever the server's count holds besides (9,179 tokens
/// for a 122-character system prompt before).
#[test]
fn no_system_prompt_or_tool_is_charged_for_media_or_the_providers_tools() {
    let log = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/gateway-logs/pydantic-ai-cassettes.csv.gz");
    let gateway = prefixscope_core::input::gateway_log_records(
        open_decompressed(&log).unwrap(),
        "pydantic-ai",
        None,
    );
    let mut sets: Vec<(String, Vec<Record>)> = FILES
        .iter()
        .map(|f| (f.0.to_string(), records(f.0)))
        .collect();
    sets.push(("gateway log".into(), gateway.records));
    // Twice the text, and what a template adds to a short prompt (its roles and separators,
    // spread over the text when the count exceeds it by less than 256 tokens).
    let bound = |chars: u32| 2.0 * (f64::from(chars) / 4.0).ceil() + 256.0;
    for (name, records) in sets {
        let exchanges: BTreeMap<u64, Exchange> = records
            .iter()
            .filter_map(|r| normalize(r).ok().map(|x| (r.id, x)))
            .collect();
        let report = analyze(&records, &Config::default());
        let mut hosted = 0;
        let mut tool_chars: BTreeMap<&str, u32> = BTreeMap::new();
        for row in report.rows.iter().filter(|r| r.provider.hosted()) {
            hosted += 1;
            let x = &exchanges[&row.id];
            let system: u32 = x
                .messages
                .iter()
                .filter(|m| m.role == "system")
                .map(|m| m.chars)
                .sum();
            assert!(
                f64::from(row.composition.system.value) <= bound(system),
                "{name} #{}: system {} tokens for {system} characters",
                row.id,
                row.composition.system.value
            );
            for tool in x.tools.iter() {
                let chars = tool_chars.entry(tool.name.as_str()).or_default();
                *chars = (*chars).max(tool.chars);
            }
        }
        assert!(hosted > 100, "{name}: {hosted} hosted rows");
        // Tools some local server was offered too are scaled by its counts (llmp's rule).
        let local_tools: BTreeSet<&str> = report
            .rows
            .iter()
            .filter(|r| !r.provider.hosted())
            .flat_map(|r| exchanges[&r.id].tools.iter().map(|t| t.name.as_str()))
            .collect();
        for usage in &report.tools {
            if local_tools.contains(usage.name.as_str()) {
                continue;
            }
            if let Some(&chars) = tool_chars.get(usage.name.as_str()) {
                assert!(
                    f64::from(usage.schema_tokens) <= bound(chars),
                    "{name}: tool {} {} tokens for {chars} characters",
                    usage.name,
                    usage.schema_tokens
                );
            }
        }
    }
}

const BIN: &str = env!("CARGO_BIN_EXE_prefixscope");

/// `--prices` on a recording: the money lost is its lost tokens × (the price billed − the
/// cache-read price), the same in `analyze`'s text, JSON and finding, the HTML page, the
/// headless replay's summary and the TUI's header. OpenAI's three misses: 3,072 tokens of
/// gpt-4o-mini at $1.00 input and $0.25 cached per million: $0.002304.
#[test]
fn prices_turn_lost_tokens_into_the_same_money_everywhere() {
    let dir = std::env::temp_dir().join(format!("prefixscope-prices-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prices = dir.join("prices.json");
    std::fs::write(
        &prices,
        r#"[{"model": "gpt-4o-mini", "input": 1.0, "cache_read": 0.25}]"#,
    )
    .unwrap();
    let recording = data("hosted/openai.jsonl.gz");
    let expected = 3_072.0 * (1.0 - 0.25) / 1e6;
    let run = |args: &[&std::ffi::OsStr]| {
        let out = std::process::Command::new(BIN).args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let json_path = dir.join("report.json");
    let text = run(&[
        "analyze".as_ref(),
        recording.as_os_str(),
        "--prices".as_ref(),
        prices.as_os_str(),
        "-o".as_ref(),
        json_path.as_os_str(),
    ]);
    assert!(
        text.contains("money lost: $0.0023 on 3,072 tokens"),
        "{text}"
    );
    let json: Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    let lost = json["money"]["lost_usd"].as_f64().unwrap();
    assert!((lost - expected).abs() < 1e-12, "{lost}");
    let finding = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["evidence"]["kind"] == "provider_miss")
        .unwrap();
    assert!((finding["lost_usd"].as_f64().unwrap() - expected).abs() < 1e-12);
    let html = std::fs::read_to_string(json_path.with_extension("html")).unwrap();
    assert!(
        html.contains(&format!("data-lost-usd=\"{lost}\"")),
        "no money in the page"
    );
    let replay = run(&[
        "replay".as_ref(),
        "--headless".as_ref(),
        "--instant".as_ref(),
        "--prices".as_ref(),
        prices.as_os_str(),
        recording.as_os_str(),
    ]);
    assert!(
        replay.contains("money lost: $0.0023 on 3,072 tokens"),
        "{replay}"
    );
    // The TUI's header and Loss pane read the view's header.
    let config = Config {
        prices: prefixscope_core::pricing::Prices::with_file(
            &std::fs::read_to_string(&prices).unwrap(),
            "prices.json",
        )
        .unwrap(),
        ..Config::default()
    };
    let report = analyze(&records("hosted/openai.jsonl"), &config);
    let view = prefixscope_core::live::view::View::build(&report, "");
    assert!((view.header.lost_usd.unwrap() - expected).abs() < 1e-12);
    // Without the file, the default table's gpt-4o-mini ($0.15 and $0.075).
    let report = analyze(&records("hosted/openai.jsonl"), &Config::default());
    let default = report.money.unwrap().lost_usd;
    assert!((default - 3_072.0 * 0.075 / 1e6).abs() < 1e-12, "{default}");
    // A local server's model is priced only when named: the llama.cpp session is not.
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("recordings/xllamacpp/session.jsonl");
    let read = read_jsonl(std::io::BufReader::new(std::fs::File::open(file).unwrap()));
    assert!(analyze(&read.records, &Config::default()).money.is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The chains of a bailian export (what AIPerf replays) are the analysis's conversations: no
/// link between two runs, and every continuation the truth file lists (22 OpenAI, 86 Anthropic).
#[test]
fn exported_chains_follow_the_runs() {
    let dir = std::env::temp_dir().join(format!("prefixscope-chains-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (file, continuations) in [("hosted/openai.jsonl", 22), ("hosted/anthropic.jsonl", 86)] {
        let out = dir.join(format!("{}.bailian", file.replace('/', "-")));
        let status = std::process::Command::new(BIN)
            .arg("export")
            .arg(data(&format!("{file}.gz")))
            .args(["--to", "bailian", "--salt-file"])
            .arg(dir.join("salt"))
            .arg("-o")
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            status.status.success(),
            "{}",
            String::from_utf8_lossy(&status.stderr)
        );
        let truth = truth(file);
        // Exported rows are the analysed requests in start order.
        let mut analysed: Vec<Record> = records(file)
            .into_iter()
            .filter(|r| {
                r.response
                    .as_ref()
                    .is_some_and(|r| (200..300).contains(&r.status))
            })
            .collect();
        analysed.sort_by_key(|r| (r.t_start_ms, r.id));
        let rows: Vec<Value> = std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(rows.len(), analysed.len(), "{file}");
        let id_of: BTreeMap<i64, u64> = rows
            .iter()
            .zip(&analysed)
            .map(|(row, record)| (row["chat_id"].as_i64().unwrap(), record.id))
            .collect();
        let mut links = 0;
        for row in &rows {
            let parent = row["parent_chat_id"].as_i64().unwrap();
            if parent < 0 {
                continue;
            }
            links += 1;
            let (a, b) = (id_of[&parent], id_of[&row["chat_id"].as_i64().unwrap()]);
            assert_eq!(truth[&a]["run"], truth[&b]["run"], "{file}: #{a} → #{b}");
        }
        assert_eq!(links, continuations, "{file}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// SDK test suites run one test after another, and a test that ends on a tool call is often
/// followed by one offering fewer tools: the engine's subagent candidates. No parent goes on
/// after its tool call there, so the panes link no subagent (the demo's real one is linked:
/// tests/demo.rs).
#[test]
fn an_sdks_test_suite_is_no_tree_of_subagents() {
    use prefixscope_core::live::{Engine, Input};
    use std::sync::Arc;
    for file in ["hosted/anthropic.jsonl", "hosted2/anthropic.jsonl"] {
        let records = records(file);
        let mut engine = Engine::for_records(Config::default(), &records);
        for record in records {
            engine.push(Input::Record(Arc::new(record), 0));
        }
        engine.push(Input::SourceDone);
        let snapshot = engine.snapshot();
        let linked: Vec<(u64, u64)> = snapshot
            .view
            .lanes
            .iter()
            .filter_map(|l| Some((l.cells[0].id, l.spawned_by?)))
            .collect();
        assert!(linked.is_empty(), "{file}: {linked:?}");
    }
}
