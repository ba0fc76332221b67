//! Gateway logs as CSV: a `request_json` column with the OpenAI-format request body; used when
//! present: `response_json` (for the server's token counts), `model_name`, `status_code`, and a
//! timestamp column (`--ts-column`, else the first of `timestamp`, `ts`, `created_at`,
//! `request_time`, `time`) holding epoch seconds or milliseconds or ISO-8601. Rows are replayed
//! in timestamp order when every row has one (gateways often log when a request ended, or newest
//! first), else in file order.

use std::io::BufRead;

use serde_json::Value;

use super::recording::Pending;
use super::{
    FileInput, FileReport, Format, InputOptions, choose_block_model, server_counts,
    session_id_in_body,
};
use crate::cache::Request;
use crate::cache::blocks::{Cutter, Prompt, prompt_from_body, reply_segment};
use crate::calendar::days_from_civil;
use crate::limits::{CsvRecordCap, MAX_LINE_BYTES, too_long_message};
use crate::normalize::Api;

const TIMESTAMP_COLUMNS: [&str; 5] = ["timestamp", "ts", "created_at", "request_time", "time"];

/// Epoch seconds or milliseconds (told apart by size: seconds are ~1.7e9, ms ~1.7e12), or
/// ISO-8601 (`2026-07-01T12:00:00.250Z`, `2026-07-01 12:00:00+02:00`; no zone means UTC).
pub fn parse_timestamp_ms(text: &str) -> Option<i64> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if let Ok(number) = text.parse::<f64>() {
        if !number.is_finite() {
            return None;
        }
        return Some(if number.abs() > 1e11 {
            number.round() as i64
        } else {
            (number * 1000.0).round() as i64
        });
    }
    parse_iso8601_ms(text)
}

fn parse_iso8601_ms(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let (year, month, day) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    if bytes.get(4) != Some(&b'-') || bytes.get(7) != Some(&b'-') {
        return None;
    }
    let (mut hour, mut minute, mut second, mut millis) = (0, 0, 0, 0);
    let mut rest = &text[10..];
    if let Some(time) = rest.strip_prefix('T').or_else(|| rest.strip_prefix(' ')) {
        hour = time.get(0..2)?.parse().ok()?;
        minute = time.get(3..5)?.parse().ok()?;
        second = time.get(6..8)?.parse().ok()?;
        rest = &time[8..];
        if let Some(fraction) = rest.strip_prefix('.') {
            let end = fraction
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(fraction.len());
            let padded: String = fraction[..end]
                .chars()
                .chain("000".chars())
                .take(3)
                .collect();
            millis = padded.parse().ok()?;
            rest = &fraction[end..];
        }
    }
    let offset_minutes: i64 = match rest {
        "" | "Z" | "z" => 0,
        zone => {
            let sign = match zone.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let zone = zone[1..].replace(':', "");
            let hours: i64 = zone.get(0..2)?.parse().ok()?;
            let minutes: i64 = zone.get(2..4).map_or(Some(0), |m| m.parse().ok())?;
            sign * (hours * 60 + minutes)
        }
    };
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1000 + millis)
}

pub fn read(reader: impl BufRead, name: &str, options: &InputOptions) -> FileInput {
    let mut rows = Rows::new(reader, name, options.ts_column.as_deref());
    let mut pending: Vec<Pending> = rows
        .by_ref()
        .map(CsvRow::into_pending)
        .map(|p| p.with_replies(options.replies))
        .collect();
    let mut report = rows.report;

    if pending.iter().all(|p| p.request.t_ms.is_some()) {
        pending.sort_by_key(|p| p.request.t_ms);
    }
    let (model, choice) = choose_block_model(options, &Pending::evidence(&pending));
    report.block_model = Some(choice);
    let mut cutter = Cutter::new(model);
    let requests: Vec<Request> = pending.into_iter().map(|p| p.cut(&mut cutter)).collect();
    report.requests = requests.len() as u64;
    report.conversation_source = if requests.iter().any(|r| r.session_id.is_some()) {
        "session id".to_string()
    } else {
        "none".to_string()
    };
    let mut requests = requests;
    for request in &mut requests {
        request.conversation = request.session_id.as_ref().map(|s| s.value.clone());
    }
    FileInput { requests, report }
}

/// One good row of a gateway log: its prompt (not cut yet: blocks wait for the whole input's
/// tokens-per-character) and what was read beside it.
pub struct CsvRow {
    /// The row's position among the file's records (header excluded), from 0.
    pub index: usize,
    pub prompt: Prompt,
    /// The server's prompt token count, when the response gave one.
    pub prompt_tokens: Option<u64>,
    /// Everything but the blocks.
    pub request: Request,
    /// The OpenAI-format request body.
    pub body: Value,
    /// The response body, when the row has one that parses.
    pub response: Option<Value>,
}

impl CsvRow {
    /// The reply as the next turn renders it (the response is OpenAI-format, as the request).
    pub fn reply(&self) -> Option<crate::cache::blocks::Segment> {
        self.response
            .as_ref()
            .and_then(|r| reply_segment(Api::OpenaiChat, r, self.request.output_tokens))
    }

    /// The row on its way to a request: its prompt, counts and reply (the response is
    /// OpenAI-format, as the request is).
    pub fn into_pending(self) -> Pending {
        let counts = self
            .response
            .as_ref()
            .map(server_counts)
            .unwrap_or_default();
        let reply = self.reply();
        Pending {
            prompt: self.prompt,
            prompt_tokens: self.prompt_tokens,
            reply,
            server: counts.server,
            order: self.index as u64,
            request: self.request,
        }
    }
}

/// A gateway log one row at a time, in file order; bad rows and non-2xx responses are counted in
/// `report` as they are met.
pub struct Rows<R: std::io::Read> {
    /// Each CSV record held to `limits::MAX_LINE_BYTES`.
    csv: csv::Reader<CsvRecordCap<R>>,
    record: csv::StringRecord,
    request_column: Option<usize>,
    response_column: Option<usize>,
    model_column: Option<usize>,
    status_column: Option<usize>,
    ts_column: Option<usize>,
    index: usize,
    pub report: FileReport,
}

impl<R: BufRead> Rows<R> {
    /// `ts_column`: the column holding timestamps, else the first of the usual names.
    pub fn new(reader: R, name: &str, ts_column: Option<&str>) -> Rows<R> {
        let mut report = FileReport::new(name, Format::Csv);
        let mut csv = csv::ReaderBuilder::new()
            .flexible(true)
            .from_reader(CsvRecordCap::new(reader, MAX_LINE_BYTES));
        let headers = match csv.headers() {
            Ok(h) => Some(h.clone()),
            Err(e) => {
                report.bad(1, format!("no CSV header: {e}"));
                None
            }
        };
        let column = |name: &str| {
            headers
                .as_ref()
                .and_then(|h| h.iter().position(|h| h.trim() == name))
        };
        let request_column = column("request_json");
        if headers.is_some() && request_column.is_none() {
            report.bad(1, "no request_json column");
        }
        let ts_column = match ts_column {
            Some(name) => match column(name) {
                Some(c) => Some(c),
                None => {
                    report.bad(1, format!("no timestamp column {name:?}"));
                    None
                }
            },
            None => TIMESTAMP_COLUMNS.iter().find_map(|name| column(name)),
        };
        Rows {
            request_column,
            response_column: column("response_json"),
            model_column: column("model_name"),
            status_column: column("status_code"),
            ts_column,
            csv,
            record: csv::StringRecord::new(),
            index: 0,
            report,
        }
    }
}

impl<R: BufRead> Iterator for Rows<R> {
    type Item = CsvRow;

    fn next(&mut self) -> Option<CsvRow> {
        let request_column = self.request_column?;
        loop {
            let line = self.csv.position().line() as usize;
            let cuts = self.csv.get_ref().cuts;
            let read = self.csv.read_record(&mut self.record);
            if self.csv.get_ref().cuts != cuts {
                self.index += 1;
                let bytes = self.csv.get_ref().last_cut_bytes;
                self.report.bad(line.max(2), too_long_message(bytes));
                continue;
            }
            match read {
                Ok(false) => return None,
                Ok(true) => {}
                Err(e) => {
                    self.report.bad(line.max(2), e.to_string());
                    if e.is_io_error() {
                        return None;
                    }
                    continue;
                }
            }
            let index = self.index;
            self.index += 1;
            let record = &self.record;
            let line = record.position().map_or(line, |p| p.line() as usize);
            let field = |c: Option<usize>| {
                c.and_then(|c| record.get(c))
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
            };
            if let Some(status) = field(self.status_column) {
                match status.parse::<u16>() {
                    Ok(code) if (200..300).contains(&code) => {}
                    Ok(_) => {
                        self.report.non_2xx += 1;
                        continue;
                    }
                    Err(_) => {
                        self.report
                            .bad(line, format!("status_code {status:?} is not a number"));
                        continue;
                    }
                }
            }
            let body: Value = match field(Some(request_column)).map(serde_json::from_str) {
                Some(Ok(body)) => body,
                Some(Err(e)) => {
                    self.report.bad(line, format!("request_json: {e}"));
                    continue;
                }
                None => {
                    self.report.bad(line, "empty request_json");
                    continue;
                }
            };
            let api = if body.get("messages").is_some() {
                Api::OpenaiChat
            } else {
                Api::OpenaiCompletions
            };
            let Some(mut prompt) = prompt_from_body(api, &body, None) else {
                self.report
                    .bad(line, "request_json holds neither messages nor a prompt");
                continue;
            };
            if prompt.model.is_none() {
                prompt.model = field(self.model_column).map(str::to_string);
            }
            let response: Option<Value> =
                field(self.response_column).and_then(|r| serde_json::from_str(r).ok());
            let counts = response.as_ref().map(server_counts).unwrap_or_default();
            let t_ms = match field(self.ts_column) {
                Some(text) => match parse_timestamp_ms(text) {
                    Some(t) => Some(t),
                    None => {
                        self.report.bad(
                            line,
                            format!("timestamp {text:?} is neither epoch nor ISO-8601"),
                        );
                        continue;
                    }
                },
                None => None,
            };
            let request = Request {
                t_ms,
                output_tokens: counts.output_tokens,
                session_id: session_id_in_body(&body),
                model: prompt.model.clone(),
                streamed: Some(body.get("stream").and_then(Value::as_bool).unwrap_or(false)),
                server_reused_tokens: counts.reused_tokens,
                ..Request::default()
            };
            let prompt_tokens = super::bounded_prompt_tokens(
                &counts,
                prompt.chars(),
                &format!("line {line}"),
                &mut self.report,
            );
            return Some(CsvRow {
                index,
                prompt,
                prompt_tokens,
                request,
                body,
                response,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp_ms("1753340000"), Some(1_753_340_000_000));
        assert_eq!(parse_timestamp_ms("1753340000123"), Some(1_753_340_000_123));
        assert_eq!(parse_timestamp_ms("1753340000.5"), Some(1_753_340_000_500));
        assert_eq!(parse_timestamp_ms("1970-01-02T00:00:00Z"), Some(86_400_000));
        assert_eq!(
            parse_timestamp_ms("2025-07-24T07:33:20.123Z"),
            Some(1_753_342_400_123)
        );
        assert_eq!(
            parse_timestamp_ms("2025-07-24 09:33:20+02:00"),
            Some(1_753_342_400_000)
        );
        assert_eq!(parse_timestamp_ms("yesterday"), None);
    }

    #[test]
    fn rows_bad_rows_and_non_2xx() {
        let body = |text: &str| {
            format!(
                "\"{{\"\"model\"\":\"\"glm-5\"\",\"\"stream\"\":true,\"\"user\"\":\"\"u1\"\",\"\"messages\"\":[{{\"\"role\"\":\"\"user\"\",\"\"content\"\":\"\"{text}\"\"}}]}}\""
            )
        };
        let csv = format!(
            "timestamp,request_json,response_json,status_code\n\
             2,{},\"{{\"\"usage\"\":{{\"\"prompt_tokens\"\":40,\"\"completion_tokens\"\":3}}}}\",200\n\
             1,{},,200\n\
             3,not json,,200\n\
             4,{},,500\n",
            body("second"),
            body("first"),
            body("failed"),
        );
        let input = read(csv.as_bytes(), "g.csv", &InputOptions::default());
        assert_eq!(input.requests.len(), 2);
        assert_eq!(input.report.non_2xx, 1);
        assert_eq!(input.report.bad_rows.len(), 1);
        assert_eq!(input.report.bad_rows[0].line, 4);
        // Sorted by timestamp: the row stamped 1 comes first.
        assert_eq!(input.requests[0].t_ms, Some(1000));
        assert_eq!(input.requests[1].input_tokens, 40);
        assert_eq!(input.requests[1].blocks.len(), 3);
        assert_eq!(input.requests[0].streamed, Some(true));
        assert_eq!(
            input.requests[0]
                .session_id
                .as_ref()
                .map(|s| s.source.as_str()),
            Some("user")
        );
    }
}
