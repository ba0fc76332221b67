//! One line per record for humans (stderr while recording, stdout for `records`). A counter the
//! server did not report is shown as not reported, never as zero.

use serde_json::Value;

use prefixscope_core::normalize::Api;
use prefixscope_core::record::Record;

/// The server's top-level counters, from the body or, in digest mode, the digest.
fn server_fields(record: &Record) -> Option<Value> {
    let response = record.response.as_ref()?;
    if let Some(body) = &response.body {
        return Some(body.clone());
    }
    response
        .digest
        .as_ref()
        .map(|d| Value::Object(d.usage.clone()))
}

fn model(record: &Record) -> Option<String> {
    if let Some(body) = &record.request.body {
        return body
            .get("model")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    record.request.digest.as_ref().and_then(|d| d.model.clone())
}

/// (prompt tokens, reused tokens) as the server reported them (`input::server_counts`, the
/// one reader of every server's counters outside the analysis).
pub fn prompt_and_reused(record: &Record) -> (Option<u64>, Option<u64>) {
    let Some(fields) = server_fields(record) else {
        return (None, None);
    };
    let counts = prefixscope_core::input::server_counts(&fields);
    (counts.prompt_tokens, counts.reused_tokens)
}

/// One line for a person; control characters in recorded text are escaped (`text`).
pub fn record_line(record: &Record) -> String {
    let seconds = (record.t_end_ms - record.t_start_ms).max(0) as f64 / 1000.0;
    // Recordings made before redaction (or by other tools) may still hold query credentials.
    // A probe's id is of the probes' own range (2^48 on): `probe` says more than its number.
    let id = if record.probe {
        "probe".to_string()
    } else {
        format!("#{}", record.id)
    };
    let mut line = format!(
        "{id} {} {}",
        record.request.method,
        prefixscope_core::privacy::redact_query(&record.request.path)
    );
    match (&record.response, record.error) {
        (Some(response), error) => {
            line.push_str(&format!("  {}", response.status));
            if let Some(stream) = response.stream {
                line.push_str(if stream == prefixscope_core::record::StreamKind::Sse {
                    " sse"
                } else {
                    " ndjson"
                });
            }
            if let Some(error) = error {
                line.push_str(&format!("  {}", error.as_str()));
            }
        }
        (None, Some(error)) => line.push_str(&format!("  {}", error.as_str())),
        (None, None) => line.push_str("  no response"),
    }
    line.push_str(&format!("  {seconds:.2}s"));
    if record.probe {
        // prefixscope's own request to the server: what it said, not traffic.
        let said = prefixscope_core::probe::answer_of_record(record).map_or_else(
            || "not read".to_string(),
            |(_, a)| prefixscope_core::probe::describe(&a),
        );
        line.push_str(&format!("  {said}"));
        return prefixscope_core::text::printable_line(&line).into_owned();
    }
    if Api::from_path(&record.request.path).is_chat() {
        if let Some(model) = model(record) {
            line.push_str(&format!("  {model}"));
        }
        match prompt_and_reused(record) {
            (Some(p), Some(r)) if p > 0 => line.push_str(&format!(
                "  prompt {p} reused {r} ({}%)",
                r.saturating_mul(100) / p
            )),
            (Some(p), _) => line.push_str(&format!("  prompt {p} reuse not reported")),
            _ => line.push_str("  counts not reported"),
        }
    }
    if let Some(agent) = record.request.headers.get("user-agent") {
        line.push_str(&format!("  [{agent}]"));
    }
    prefixscope_core::text::printable_line(&line).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_for_real_records() {
        let text = include_str!("../../recordings/llmp/llama.cpp/session.jsonl");
        let read = prefixscope_core::record::read_jsonl(text.as_bytes());
        let second = record_line(&read.records[1]);
        assert!(
            second.starts_with("#2 POST /v1/chat/completions  200"),
            "{second}"
        );
        assert!(second.contains("reused"), "{second}");
        let digest = prefixscope_core::record::read_jsonl(
            include_str!("../../recordings/llmp/llama.cpp/session.digest.jsonl").as_bytes(),
        );
        assert_eq!(
            prompt_and_reused(&digest.records[1]),
            prompt_and_reused(&read.records[1])
        );
    }
}
