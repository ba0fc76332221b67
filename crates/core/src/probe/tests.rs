//! Shapes: "real" ones are a real server's answers (`tests/data/llama-server-samples`, copied
//! from `../shared/tools/llama-server/samples`: llama-server build 11434 and xllamacpp serving
//! SmolLM2-135M); "documented" ones are written from the server's own source or docs (vLLM's and
//! SGLang's `protocol.py` `ModelCard`, Ollama's `/api/ps` in its API docs), verified by no server
//! here.

use super::*;
use serde_json::json;

const PROPS: &str = include_str!("../../../../tests/data/llama-server-samples/props.json");
const SLOTS: &str = include_str!("../../../../tests/data/llama-server-samples/slots.json");
const NP1_SLOTS: &str = include_str!("../../../../tests/data/llama-server-samples/np1_slots.json");
const XLLAMACPP_SLOTS: &str =
    include_str!("../../../../tests/data/llama-server-samples/xllamacpp_slots.json");
const METRICS: &str = include_str!("../../../../tests/data/llama-server-samples/metrics.txt");
const MODELS: &str = include_str!("../../../../tests/data/llama-server-samples/models.json");
const HEALTH: &str = include_str!("../../../../tests/data/llama-server-samples/health_body.json");
const HEALTH_LOADING: &str =
    include_str!("../../../../tests/data/llama-server-samples/health_503_loading.json");

fn read(endpoint: Endpoint, status: u16, body: &str) -> Answer {
    read_answer(endpoint, status, body.as_bytes())
}

fn info_of(answers: &[(Endpoint, u16, &str)]) -> ServerInfo {
    let mut info = ServerInfo::default();
    for (endpoint, status, body) in answers {
        info.apply(*endpoint, read(*endpoint, *status, body));
    }
    info
}

#[test]
fn real_llama_cpp_props_slots_health_metrics_and_models() {
    let Answer::Read(Reading::Props(props)) = read(Endpoint::Props, 200, PROPS) else {
        panic!("props not read");
    };
    assert_eq!(
        props.model.as_deref(),
        Some("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    );
    assert_eq!(props.n_ctx, Some(2048));
    assert_eq!(props.total_slots, Some(4));
    assert_eq!(props.chat_template_chars, Some(368));
    assert_eq!(props.build_info.as_deref(), Some("b0-unknown"));
    assert!(props.modalities.is_empty(), "text only: {props:?}");
    assert_eq!(props.sliding_window, None);

    let Answer::Read(Reading::Slots(slots)) = read(Endpoint::Slots, 200, SLOTS) else {
        panic!("slots not read");
    };
    assert_eq!(slots.slots.len(), 4);
    assert_eq!(slots.slots[3].id_task, Some(99));
    assert_eq!(slots.slots[0].id_task, None);
    assert!(slots.slots.iter().all(|s| s.n_ctx == Some(2048)));
    for body in [NP1_SLOTS, XLLAMACPP_SLOTS] {
        let Answer::Read(Reading::Slots(slots)) = read(Endpoint::Slots, 200, body) else {
            panic!("slots not read");
        };
        assert_eq!(slots.slots.len(), 1);
        assert!(slots.slots[0].id_task.is_some());
    }

    let Answer::Read(Reading::Metrics(metrics)) = read(Endpoint::Metrics, 200, METRICS) else {
        panic!("metrics not read");
    };
    assert_eq!(metrics.kind, Some(ServerKind::LlamaCpp));
    assert_eq!(metrics.prompt_tokens_total, Some(60.0));
    assert_eq!(metrics.prompt_tokens_cached_total, Some(245.0));
    assert_eq!(metrics.requests_processing, Some(0.0));
    assert_eq!(metrics.kv_cache_usage_ratio, None, "not in this build");

    let Answer::Read(Reading::Models(models)) = read(Endpoint::Models, 200, MODELS) else {
        panic!("models not read");
    };
    assert_eq!(models.models[0].owned_by.as_deref(), Some("llamacpp"));
    assert_eq!(models.models[0].max_model_len, Some(2048), "meta.n_ctx");
    // llama.cpp's /v1/models has an Ollama-like `models` list: it is not a loaded model.
    assert!(parse_ollama_ps(&serde_json::from_str(MODELS).unwrap()).is_none());

    assert_eq!(
        read(Endpoint::Health, 200, HEALTH),
        Answer::Read(Reading::Health(Health {
            status: "ok".into()
        }))
    );
    assert_eq!(
        read(Endpoint::Health, 503, HEALTH_LOADING),
        Answer::Read(Reading::Health(Health {
            status: "loading".into()
        }))
    );

    let info = info_of(&[
        (Endpoint::Props, 200, PROPS),
        (Endpoint::Slots, 200, SLOTS),
        (Endpoint::Health, 200, HEALTH),
        (Endpoint::Metrics, 200, METRICS),
        (Endpoint::Models, 200, MODELS),
        (Endpoint::OllamaPs, 404, "not found"),
    ]);
    assert_eq!(info.kind(), Some(ServerKind::LlamaCpp));
    assert_eq!(info.total_slots(), Some(4));
    assert_eq!(info.busy_slots(), Some(0));
    assert_eq!(
        info.line(),
        "server: llama.cpp · 4 slots (0 busy) · n_ctx 2,048 · SmolLM2-135M-Instruct.Q4_1.gguf"
    );
    assert_eq!(info.slot_texts()[3], "3 idle (task 99)");
}

#[test]
fn documented_ollama_ps() {
    // Ollama's API docs (`GET /api/ps`), and a real answer quoted in a 2026 write-up.
    let body = json!({"models": [{
        "name": "qwen2.5:0.5b", "model": "qwen2.5:0.5b", "size": 492523008,
        "digest": "a8b0c515", "details": {"format": "gguf", "family": "qwen2"},
        "expires_at": "2026-11-02T08:15:34.383753787Z", "size_vram": 0, "context_length": 2048
    }]})
    .to_string();
    let info = info_of(&[
        (Endpoint::Props, 404, "404 page not found"),
        (Endpoint::Health, 404, "404 page not found"),
        (
            Endpoint::Models,
            200,
            r#"{"object":"list","data":[{"id":"qwen2.5:0.5b","object":"model","created":1,"owned_by":"library"}]}"#,
        ),
        (Endpoint::OllamaPs, 200, &body),
    ]);
    assert_eq!(info.kind(), Some(ServerKind::Ollama));
    assert_eq!(info.model(), Some("qwen2.5:0.5b"));
    assert_eq!(info.n_ctx(), Some(2048));
    assert_eq!(info.total_slots(), None);
    assert_eq!(info.line(), "server: Ollama · n_ctx 2,048 · qwen2.5:0.5b");
    // Nothing loaded: Ollama still, with no model.
    let idle = info_of(&[(Endpoint::OllamaPs, 200, r#"{"models":[]}"#)]);
    assert_eq!(idle.kind(), Some(ServerKind::Ollama));
    assert_eq!(idle.model(), None);
}

#[test]
fn documented_vllm_and_sglang_models_and_metrics() {
    // vLLM's `ModelCard` (vllm/entrypoints/openai/protocol.py): owned_by "vllm", max_model_len.
    let vllm = r#"{"object":"list","data":[{"id":"Qwen/Qwen3-8B","object":"model","created":1,"owned_by":"vllm","root":"Qwen/Qwen3-8B","parent":null,"max_model_len":8192,"permission":[]}]}"#;
    let vllm_metrics = "# TYPE vllm:prefix_cache_hits_total counter\n\
        vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 1200.0\n\
        vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 2000.0\n\
        vllm:num_requests_running{model_name=\"x\"} 1.0\n";
    let info = info_of(&[
        (Endpoint::Props, 404, r#"{"detail":"Not Found"}"#),
        (Endpoint::Models, 200, vllm),
        (Endpoint::Metrics, 200, vllm_metrics),
    ]);
    assert_eq!(info.kind(), Some(ServerKind::Vllm));
    assert_eq!(info.n_ctx(), Some(8192));
    let metrics = info.metrics.clone().unwrap();
    assert_eq!(metrics.prefix_cache_hits, Some(1200.0));
    assert_eq!(metrics.prefix_cache_queries, Some(2000.0));
    assert_eq!(info.line(), "server: vLLM · n_ctx 8,192 · Qwen3-8B");
    // Older vLLM: without `_total`.
    let Some(Reading::Metrics(old)) = parse_metrics("vllm:prefix_cache_hits 5\n") else {
        panic!()
    };
    assert_eq!(old.prefix_cache_hits, Some(5.0));

    // SGLang's `ModelCard` (sglang/srt/entrypoints/openai/protocol.py): owned_by "sglang".
    let sglang = r#"{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","created":1,"owned_by":"sglang","root":"meta-llama/Llama-3.1-8B-Instruct","max_model_len":131072}]}"#;
    let info = info_of(&[
        (Endpoint::Models, 200, sglang),
        (
            Endpoint::Metrics,
            200,
            "sglang:cache_hit_rate{model_name=\"m\"} 0.42\n",
        ),
    ]);
    assert_eq!(info.kind(), Some(ServerKind::Sglang));
    assert_eq!(info.metrics.unwrap().cache_hit_rate, Some(0.42));
}

#[test]
fn hostile_answers_are_read_as_not_said() {
    let huge = r#"{"total_slots": 18446744073709551615, "n_ctx": 1e300, "model_path": 7,
        "default_generation_settings": {"n_ctx": -5}, "chat_template": "x"}"#;
    let Answer::Read(Reading::Props(props)) = read(Endpoint::Props, 200, huge) else {
        panic!("props with a template is read");
    };
    assert_eq!(props.total_slots, None);
    assert_eq!(props.n_ctx, None);
    assert_eq!(props.model, None);
    // Nothing of /props' fields: not a llama.cpp /props.
    for body in [
        "[]",
        "null",
        "{}",
        "\"props\"",
        r#"{"total_slots": "4"}"#,
        "{",
    ] {
        assert!(
            matches!(read(Endpoint::Props, 200, body), Answer::Unavailable(_)),
            "{body}"
        );
    }
    // A model name of 100,000 characters is cut; a slot list of a million entries is capped.
    let long = format!(
        r#"{{"model_path": "{}", "total_slots": 2}}"#,
        "m".repeat(100_000)
    );
    let Answer::Read(Reading::Props(props)) = read(Endpoint::Props, 200, &long) else {
        panic!()
    };
    assert_eq!(
        props.model.map(|m| m.chars().count()),
        Some(MAX_PROBE_TEXT_CHARS)
    );
    let many: Vec<Value> = (0..100_000)
        .map(|i| json!({"id": i, "is_processing": true}))
        .collect();
    let Some(slots) = parse_slots(&Value::Array(many)) else {
        panic!()
    };
    assert_eq!(slots.slots.len(), MAX_PROBE_SLOTS);
    // Slots that are not slots, duplicate ids, a negative id_task (llama.cpp's -1).
    let odd = json!([{"id": "0"}, {"id": 1, "id_task": -1}, {"id": 1}, 5, {"id": 4294967296u64}]);
    let slots = parse_slots(&odd).unwrap();
    assert_eq!(slots.slots.len(), 1);
    assert_eq!(slots.slots[0].id_task, None);
    // Metrics: negative, NaN, infinite and unparsable values skipped; unknown families ignored.
    let text = "llamacpp:prompt_tokens_total NaN\nllamacpp:requests_processing -1\n\
        llamacpp:kv_cache_usage_ratio inf\nllamacpp:prompt_tokens_total{a=\"} x\n\
        other_family 5\nllamacpp:prompt_tokens_total";
    assert_eq!(parse_metrics(text), None);
    // A body past the bound is not read at all.
    let big = vec![b' '; MAX_PROBE_BODY_BYTES + 1];
    assert!(matches!(
        read_answer(Endpoint::Slots, 200, &big),
        Answer::Unavailable(_)
    ));
    // Statuses: 404 and 405 are "not here"; /health's 503 is its state.
    assert!(matches!(
        read(Endpoint::Slots, 501, "{}"),
        Answer::Unavailable(_)
    ));
    assert!(matches!(
        read(Endpoint::Health, 503, "<html>"),
        Answer::Read(Reading::Health(_))
    ));
}

#[test]
fn unknown_and_unreachable_are_said_never_zeros() {
    assert_eq!(ServerInfo::default().line(), "server: not probed");
    let mut down = ServerInfo::default();
    down.apply(
        Endpoint::Props,
        Answer::Unreachable("connection refused".into()),
    );
    assert_eq!(down.line(), "server: unreachable (connection refused)");
    let none = info_of(
        &Endpoint::ALL
            .iter()
            .map(|e| (*e, 404, "no"))
            .collect::<Vec<_>>(),
    );
    assert_eq!(none.kind(), None);
    assert_eq!(none.line(), "server: unknown kind");
    let no_slots = info_of(&[(Endpoint::Props, 200, PROPS), (Endpoint::Slots, 501, "{}")]);
    assert_eq!(
        no_slots.line(),
        "server: llama.cpp · 4 slots · n_ctx 2,048 · SmolLM2-135M-Instruct.Q4_1.gguf · /slots not available"
    );
}

#[test]
fn a_probe_record_reads_back_as_its_answer() {
    for (endpoint, status, body) in [
        (Endpoint::Props, 200, PROPS),
        (Endpoint::Slots, 200, SLOTS),
        (Endpoint::Metrics, 200, METRICS),
        (Endpoint::Health, 503, HEALTH_LOADING),
        (Endpoint::OllamaPs, 404, "nope"),
    ] {
        let answer = read(endpoint, status, body);
        let capture: Capture<Vec<u8>> =
            probe_capture(7, (1, 2), endpoint.path(), Some(status), &answer);
        for mode in [
            crate::capture::BodyMode::Full,
            crate::capture::BodyMode::Digest,
        ] {
            let record = crate::capture::build_record(capture.clone(), mode);
            assert!(record.probe);
            let line = crate::record::record_line(&record);
            let back = crate::record::read_jsonl(line.as_slice()).records.remove(0);
            assert_eq!(back, record);
            assert_eq!(answer_of_record(&back), Some((endpoint, answer.clone())));
        }
    }
    let down: Capture<Vec<u8>> = probe_capture(
        8,
        (1, 2),
        "/props",
        None,
        &Answer::Unreachable("refused".into()),
    );
    let record = crate::capture::build_record(down, crate::capture::BodyMode::Full);
    assert_eq!(record.error, Some(ExchangeError::UpstreamUnreachable));
    assert!(matches!(
        answer_of_record(&record),
        Some((Endpoint::Props, Answer::Unreachable(_)))
    ));
}

#[test]
fn a_recorded_reading_is_bounded_as_an_answer_is() {
    let mut record = crate::capture::build_record(
        probe_capture::<Vec<u8>>(
            1,
            (1, 2),
            "/props",
            Some(200),
            &read(Endpoint::Props, 200, PROPS),
        ),
        crate::capture::BodyMode::Full,
    );
    let body = record.response.as_mut().unwrap().body.as_mut().unwrap();
    body["total_slots"] = json!(1_000_000);
    body["model"] = json!("x".repeat(10_000));
    body["n_ctx"] = json!(u64::MAX);
    let Some((_, Answer::Read(Reading::Props(props)))) = answer_of_record(&record) else {
        panic!("still a props reading");
    };
    assert_eq!(props.total_slots, None);
    assert_eq!(props.n_ctx, None);
    assert_eq!(props.model.unwrap().len(), MAX_PROBE_TEXT_CHARS);
    // Another endpoint's reading under this path, or garbage: unavailable.
    record.response.as_mut().unwrap().body = Some(json!({"reading": "slots", "slots": []}));
    assert!(matches!(
        answer_of_record(&record),
        Some((Endpoint::Props, Answer::Unavailable(_)))
    ));
    record.response.as_mut().unwrap().body = Some(json!([1, 2]));
    assert!(matches!(
        answer_of_record(&record),
        Some((Endpoint::Props, Answer::Unavailable(_)))
    ));
    // Not marked: not a probe, whatever its path.
    record.probe = false;
    assert_eq!(answer_of_record(&record), None);
}

#[test]
fn only_changes_are_recorded() {
    let mut changes = Changes::default();
    let busy = read(
        Endpoint::Slots,
        200,
        r#"[{"id":0,"id_task":3,"is_processing":true}]"#,
    );
    let idle = read(
        Endpoint::Slots,
        200,
        r#"[{"id":0,"id_task":3,"is_processing":false}]"#,
    );
    assert!(changes.changed(Endpoint::Slots, &busy));
    assert!(!changes.changed(Endpoint::Slots, &busy));
    assert!(changes.changed(Endpoint::Slots, &idle));
    let down = |why: &str| Answer::Unreachable(why.to_string());
    assert!(changes.changed(Endpoint::Props, &down("refused")));
    assert!(
        !changes.changed(Endpoint::Props, &down("reset")),
        "down is down"
    );
    changes.forget(Endpoint::Props);
    assert!(changes.changed(Endpoint::Props, &down("reset")));
}
