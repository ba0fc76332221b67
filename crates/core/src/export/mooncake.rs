//! Mooncake traces (GuideLLM `kind=mooncake`, AIPerf `mooncake_trace`, `aiperf analyze-trace`):
//! `{"timestamp", "input_length", "output_length", "hash_ids"}`, one independent request per
//! line.
//!
//! - `timestamp` in milliseconds from the export's first request: AIPerf reads milliseconds
//!   (GuideLLM reads seconds; replay with `time_scale=0.001`), as the published traces are.
//! - `hash_ids`: exactly `ceil(input_length / 512)` (GuideLLM rejects any other count, AIPerf
//!   fails on more), the partial last block's id never reused as a full block's.
//! - No `type` field (AIPerf would require `"mooncake_trace"`) and no `session_id` (AIPerf would
//!   then resend history on top of `input_length`, which already holds it).

use std::io::{self, Write};

use serde::Serialize;

use super::{ExportRequest, write_line};

#[derive(Debug, Serialize)]
pub(crate) struct Row<'a> {
    pub timestamp: i64,
    pub input_length: u64,
    pub output_length: u64,
    pub hash_ids: &'a [u64],
}

/// A request's line ([`super::Writer::Lines`]).
pub(super) fn line(request: &ExportRequest, origin_ms: i64, out: &mut dyn Write) -> io::Result<()> {
    let row = Row {
        timestamp: request.t_ms.saturating_sub(origin_ms),
        input_length: request.input_tokens,
        output_length: request.output.tokens,
        hash_ids: &request.hash_ids,
    };
    write_line(out, &row)
}

#[cfg(test)]
mod tests {
    use super::super::{Writer, Written, tests_support::request};
    use super::*;

    #[test]
    fn one_line_per_request_in_milliseconds() {
        let mut w = Writer::Lines(1_000, line, Written::default());
        let mut out = Vec::new();
        let mut r = request(1, 3_500, 1000);
        r.hash_ids = vec![7, 8];
        let written = w.push(r, &mut out).and_then(|()| w.finish(&mut out)).ok();
        assert_eq!(
            String::from_utf8_lossy(&out),
            "{\"timestamp\":2500,\"input_length\":1000,\"output_length\":5,\"hash_ids\":[7,8]}\n"
        );
        assert_eq!(written.map(|w| w.requests), Some(1));
    }
}
