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

use super::{ExportRequest, Written, write_line};

#[derive(Debug, Serialize)]
pub(crate) struct Row<'a> {
    pub timestamp: i64,
    pub input_length: u64,
    pub output_length: u64,
    pub hash_ids: &'a [u64],
}

pub(crate) fn row(request: &ExportRequest, origin_ms: i64) -> Row<'_> {
    Row {
        timestamp: request.t_ms.saturating_sub(origin_ms),
        input_length: request.input_tokens,
        output_length: request.output.tokens,
        hash_ids: &request.hash_ids,
    }
}

pub struct Writer {
    origin_ms: i64,
    written: Written,
}

impl Writer {
    pub fn new(origin_ms: i64) -> Writer {
        Writer {
            origin_ms,
            written: Written::default(),
        }
    }

    pub fn push(&mut self, request: &ExportRequest, out: &mut dyn Write) -> io::Result<()> {
        write_line(out, &row(request, self.origin_ms))?;
        self.written.lines += 1;
        self.written.requests += 1;
        Ok(())
    }

    pub fn written(&self) -> Written {
        self.written
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests_support::request;
    use super::*;

    #[test]
    fn one_line_per_request_in_milliseconds() {
        let mut w = Writer::new(1_000);
        let mut out = Vec::new();
        let mut r = request(1, 3_500, 1000);
        r.hash_ids = vec![7, 8];
        w.push(&r, &mut out).ok();
        assert_eq!(
            String::from_utf8_lossy(&out),
            "{\"timestamp\":2500,\"input_length\":1000,\"output_length\":5,\"hash_ids\":[7,8]}\n"
        );
        assert_eq!(w.written().requests, 1);
    }
}
