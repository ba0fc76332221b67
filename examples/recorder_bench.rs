//! What the recorder's thread spends on one record: built with its JSON bodies parsed into
//! `Value`s and serialized again (`build_record` + `record_line`), against written as sent
//! (`build_record_raw` + `record_line_with_bodies`, the `record -q` path), on the exchange of
//! `bench/proxy.sh` (a 946 B chat request, the fake server's 816 B answer) and on every exchange
//! of a recording given as an argument; and the streamed exchange of `bench/proxy.sh` (its 4
//! events of a chat completion merged, through `Value`s or straight to text,
//! `normalize::stream_raw`). Usage: recorder_bench [RECORDING.jsonl]
use std::collections::BTreeMap;
use std::time::Instant;

use prefixscope::capture::{BodyMode, Capture, ResponseCapture, build_record, build_record_raw};
use prefixscope::record::raw::record_line_with_bodies;
use prefixscope::record::{StreamKind, read_jsonl, record_line};

const REQUEST: &str = r#"{"model":"gemma","messages":[{"role":"system","content":"You are a coding agent working in a small Rust repository. Read files before changing them, keep changes minimal, and explain what you did in one or two sentences. Prefer the standard library; do not add dependencies unless asked. Run the tests after every change and report failures verbatim. When a tool call fails, say so and try a different approach instead of repeating it. Never print secrets or the contents of .env files. Keep answers short: the user reads them in a terminal. Today is Monday, 30 November 2026."},{"role":"user","content":"What does src/main.rs do, and is there anything obviously wrong with it? It collects the command-line arguments and prints how many there are; I think the count is off by one because it includes the program name. Please check and suggest the smallest fix, with a test if one fits."}],"max_tokens":160,"temperature":0,"seed":1,"stream":false}"#;
const RESPONSE: &str = r#"{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"It prints the number of command-line arguments, including the program name, so the count is one more than the arguments given. Use std::env::args().skip(1).count() if you want only the arguments."}}],"created":1789988971,"model":"gemma-4-E2B-it-qat-UD-Q4_K_XL.gguf","system_fingerprint":"b10015-5d3321c","object":"chat.completion","usage":{"completion_tokens":44,"prompt_tokens":262,"total_tokens":306,"prompt_tokens_details":{"cached_tokens":198}},"id":"chatcmpl-A1wHROB5EJMIBkfxAlKqpus9nYwfB681","timings":{"cache_n":198,"prompt_n":64,"prompt_ms":41.873,"prompt_per_token_ms":0.654265625,"prompt_per_second":1528.4312,"predicted_n":44,"predicted_ms":371.912,"predicted_per_token_ms":8.45254545,"predicted_per_second":118.3075}}"#;

/// The fake server's streamed answer in `bench/proxy.sh` (its nginx config writes the same).
const STREAM: &str = concat!(
    "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}],\"created\":1789988971,\"id\":\"chatcmpl-A1wHROB5EJMIBkfxAlKqpus9nYwfB681\",\"model\":\"gemma-4-E2B-it-qat-UD-Q4_K_XL.gguf\",\"system_fingerprint\":\"b10015-5d3321c\",\"object\":\"chat.completion.chunk\"}\n\n",
    "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\"It prints the number of command-line arguments, including the program name.\"}}],\"created\":1789988971,\"id\":\"chatcmpl-A1wHROB5EJMIBkfxAlKqpus9nYwfB681\",\"model\":\"gemma-4-E2B-it-qat-UD-Q4_K_XL.gguf\",\"system_fingerprint\":\"b10015-5d3321c\",\"object\":\"chat.completion.chunk\"}\n\n",
    "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\" Use std::env::args().skip(1).count() for the arguments only.\"}}],\"created\":1789988971,\"id\":\"chatcmpl-A1wHROB5EJMIBkfxAlKqpus9nYwfB681\",\"model\":\"gemma-4-E2B-it-qat-UD-Q4_K_XL.gguf\",\"system_fingerprint\":\"b10015-5d3321c\",\"object\":\"chat.completion.chunk\"}\n\n",
    "data: {\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"delta\":{}}],\"created\":1789988971,\"id\":\"chatcmpl-A1wHROB5EJMIBkfxAlKqpus9nYwfB681\",\"model\":\"gemma-4-E2B-it-qat-UD-Q4_K_XL.gguf\",\"system_fingerprint\":\"b10015-5d3321c\",\"object\":\"chat.completion.chunk\",\"usage\":{\"completion_tokens\":30,\"prompt_tokens\":262,\"total_tokens\":292,\"prompt_tokens_details\":{\"cached_tokens\":198}},\"timings\":{\"cache_n\":198,\"prompt_n\":64,\"prompt_ms\":41.873,\"prompt_per_token_ms\":0.654265625,\"prompt_per_second\":1528.4312,\"predicted_n\":30,\"predicted_ms\":253.576,\"predicted_per_token_ms\":8.45253333,\"predicted_per_second\":118.3077}}\n\n",
    "data: [DONE]\n\n",
);

fn capture(request: Vec<u8>, response: Vec<u8>) -> Capture {
    let headers: BTreeMap<String, String> = [
        ("content-type", "application/json"),
        ("user-agent", "prefixscope-bench/1"),
        ("host", "127.0.0.1:18481"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    Capture {
        id: 1,
        conn: 1,
        t_start_ms: 1_789_988_971_000,
        t_first_byte_ms: Some(1_789_988_971_001),
        t_end_ms: 1_789_988_971_002,
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        request_headers: headers.clone(),
        request_body_bytes: request.len() as u64,
        request_body: Some(request),
        response: Some(ResponseCapture {
            status: 200,
            headers,
            stream: None,
            body_bytes: response.len() as u64,
            body: response,
            truncated: false,
        }),
        error: None,
        probe: false,
    }
}

/// Microseconds per record, the best of 7 passes over `captures`, each way.
fn per_record(captures: &[Capture]) -> (f64, f64) {
    let (mut parsed, mut raw) = (f64::MAX, f64::MAX);
    let mut bytes = 0usize;
    for _ in 0..7 {
        let t = Instant::now();
        for c in captures {
            bytes += record_line(&build_record(c.clone(), BodyMode::Full)).len();
        }
        parsed = parsed.min(t.elapsed().as_secs_f64() * 1e6 / captures.len() as f64);
        let t = Instant::now();
        for c in captures {
            let (record, bodies) = build_record_raw(c.clone());
            bytes += record_line_with_bodies(
                &record,
                bodies.request.as_deref(),
                bodies.response.as_deref(),
            )
            .len();
        }
        raw = raw.min(t.elapsed().as_secs_f64() * 1e6 / captures.len() as f64);
    }
    std::hint::black_box(bytes);
    (parsed, raw)
}

fn main() {
    let bench: Vec<Capture> = (0..20_000)
        .map(|_| capture(REQUEST.as_bytes().to_vec(), RESPONSE.as_bytes().to_vec()))
        .collect();
    let (parsed, raw) = per_record(&bench);
    println!(
        "bench/proxy.sh's exchange: parsed {parsed:.2} µs, as sent {raw:.2} µs a record ({:.1}x)",
        parsed / raw
    );
    let streamed: Vec<Capture> = (0..20_000)
        .map(|_| {
            let mut c = capture(REQUEST.as_bytes().to_vec(), STREAM.as_bytes().to_vec());
            if let Some(response) = c.response.as_mut() {
                response.stream = Some(StreamKind::Sse);
            }
            c
        })
        .collect();
    let (parsed, raw) = per_record(&streamed);
    println!(
        "bench/proxy.sh's streamed exchange: merged as Values {parsed:.2} µs, as text {raw:.2} µs a record ({:.1}x)",
        parsed / raw
    );
    if let Some(path) = std::env::args().nth(1) {
        let text = std::fs::read(&path).expect("read the recording");
        let captures: Vec<Capture> = read_jsonl(&text[..])
            .records
            .iter()
            .filter_map(|r| {
                let request = serde_json::to_vec(r.request.body.as_ref()?).ok()?;
                let response = serde_json::to_vec(r.response.as_ref()?.body.as_ref()?).ok()?;
                Some(capture(request, response))
            })
            .collect();
        let (parsed, raw) = per_record(&captures);
        println!(
            "{path} ({} exchanges with JSON bodies): parsed {parsed:.2} µs, as sent {raw:.2} µs a record ({:.1}x)",
            captures.len(),
            parsed / raw
        );
    }
}
