//! GuideLLM's `trace_synthetic`: `{"timestamp", "input_length", "output_length"}` per request,
//! timestamps in seconds from the export's first request, and `duration` (seconds) when the
//! source timed the exchange, so `schedule_turn=idle_gap` keeps the recorded idle gaps.

use std::io::{self, Write};

use serde::Serialize;

use super::{ExportRequest, seconds_since, write_line};

#[derive(Debug, Serialize)]
pub(crate) struct Row {
    pub timestamp: f64,
    pub input_length: u64,
    pub output_length: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
}

/// A request's line ([`super::Writer::Lines`]).
pub(super) fn line(request: &ExportRequest, origin_ms: i64, out: &mut dyn Write) -> io::Result<()> {
    let row = Row {
        timestamp: seconds_since(request.t_ms, origin_ms),
        input_length: request.input_tokens,
        output_length: request.output.tokens,
        duration: request.duration_ms.map(|ms| ms as f64 / 1000.0),
    };
    write_line(out, &row)
}

#[cfg(test)]
mod tests {
    use super::super::{Writer, Written, tests_support::request};
    use super::*;

    #[test]
    fn seconds_and_an_optional_duration() {
        let mut w = Writer::Lines(1_000, line, Written::default());
        let mut out = Vec::new();
        let mut timed = request(1, 2_500, 64);
        timed.duration_ms = Some(250);
        w.push(timed, &mut out).ok();
        w.push(request(1, 3_000, 64), &mut out).ok();
        assert_eq!(
            String::from_utf8_lossy(&out),
            "{\"timestamp\":1.5,\"input_length\":64,\"output_length\":5,\"duration\":0.25}\n\
             {\"timestamp\":2.0,\"input_length\":64,\"output_length\":5}\n"
        );
    }
}
