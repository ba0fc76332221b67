//! Gateway logs as CSV, read as the records a proxy would have written ([`records`]), so every
//! analysis, pane and export runs on a log as on a recording. Columns: `request_json` (the
//! OpenAI-format request body); used when present: `response_json` (the response body: the
//! server's token counts, the reply), `model_name`, `status_code`, a session column
//! ([`SESSION_COLUMNS`]) and a timestamp column (`--ts-column`, else the first of `timestamp`,
//! `ts`, `created_at`, `request_time`, `time`) holding epoch seconds or milliseconds or
//! ISO-8601. Rows are put in timestamp order when every row has one (gateways often log when a
//! request ended, or newest first), else in file order, `UNTIMED_PACE_MS` apart.

use std::io::BufRead;

use serde_json::Value;

use super::{FileInput, FileReport, Format, InputOptions};
use crate::calendar::days_from_civil;
use crate::limits::{CsvRecordCap, MAX_LINE_BYTES, too_long_message};

const TIMESTAMP_COLUMNS: [&str; 5] = ["timestamp", "ts", "created_at", "request_time", "time"];

/// Epoch seconds or milliseconds (told apart by size: seconds are ~1.7e9, ms ~1.7e12), or
/// ISO-8601 (`2026-07-01T12:00:00.250Z`, `2026-07-01 12:00:00+02:00`; no zone means UTC).
pub(crate) fn parse_timestamp_ms(text: &str) -> Option<i64> {
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

pub(crate) fn read(reader: impl BufRead, name: &str, options: &InputOptions) -> FileInput {
    let log = records(reader, name, options.ts_column.as_deref());
    let mut input = super::keyed_by_analysis(
        super::recording::of_records(log.records, log.report, options),
        name,
    );
    if input.report.conversation_source != "analysis" {
        input.report.conversation_source = "none".to_string();
    }
    if !options.keep_analysis {
        input.analysis = None;
    }
    input
}

/// A gateway log one row at a time, in file order; bad rows and non-2xx responses are counted in
/// `report` as they are met.
pub(crate) struct Rows<R: std::io::Read> {
    /// Each CSV record held to `limits::MAX_LINE_BYTES`.
    csv: csv::Reader<CsvRecordCap<R>>,
    record: csv::StringRecord,
    request_column: Option<usize>,
    response_column: Option<usize>,
    model_column: Option<usize>,
    status_column: Option<usize>,
    ts_column: Option<usize>,
    /// A column of session or conversation ids (`SESSION_COLUMNS`), and its name.
    session_column: Option<(usize, String)>,
    host_column: Option<usize>,
    index: usize,
    pub report: FileReport,
}

/// Columns read as a session id (the client's own conversation key), first found.
pub(crate) const SESSION_COLUMNS: [&str; 6] = [
    "session_id",
    "conversation_id",
    "thread_id",
    "x-session-id",
    "x_session_id",
    "session",
];

/// One row as logged, before any prompt is read from it: what a record is made of.
pub(crate) struct RawRow {
    /// The row's position among the file's records (header excluded), from 0.
    pub index: usize,
    pub status: Option<u16>,
    pub body: Value,
    /// The response body, when the row has one that parses.
    pub response: Option<Value>,
    pub model: Option<String>,
    pub t_ms: Option<i64>,
    /// The session column's name and the row's value in it.
    pub session: Option<(String, String)>,
    /// The `host` column: the server that answered (which provider's rules apply).
    pub host: Option<String>,
}

impl<R: BufRead> Rows<R> {
    /// `ts_column`: the column holding timestamps, else the first of the usual names.
    pub(crate) fn new(reader: R, name: &str, ts_column: Option<&str>) -> Rows<R> {
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
        if let Some(h) = headers.as_ref().filter(|_| request_column.is_none()) {
            report.bad(1, "no request_json column");
            if h.len() == 1 && h.get(0).is_some_and(|f| f.contains('\t')) {
                report.hint = Some(
                    "its header is tab-separated: gateway logs are read as comma-separated CSV or as JSON Lines".into(),
                );
            }
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
        let session_column = SESSION_COLUMNS
            .iter()
            .find_map(|name| column(name).map(|c| (c, (*name).to_string())));
        Rows {
            request_column,
            response_column: column("response_json"),
            model_column: column("model_name"),
            status_column: column("status_code"),
            ts_column,
            session_column,
            host_column: column("host"),
            csv,
            record: csv::StringRecord::new(),
            index: 0,
            report,
        }
    }
}

impl<R: BufRead> Rows<R> {
    /// The next row that parses, whatever its status; bad rows are counted in `report` as they
    /// are met.
    pub(crate) fn next_raw(&mut self) -> Option<RawRow> {
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
                        self.report.read_error = Some(format!("line {}: {e}", line.max(2)));
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
            let status = match field(self.status_column) {
                Some(status) => match status.parse::<u16>() {
                    Ok(code) => Some(code),
                    Err(_) => {
                        self.report
                            .bad(line, format!("status_code {status:?} is not a number"));
                        continue;
                    }
                },
                None => None,
            };
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
            let session = self.session_column.as_ref().and_then(|(c, name)| {
                field(Some(*c)).map(|value| {
                    let value: String = value.chars().take(MAX_SESSION_CHARS).collect();
                    (name.clone(), value)
                })
            });
            return Some(RawRow {
                index,
                status,
                response: field(self.response_column).and_then(|r| serde_json::from_str(r).ok()),
                model: field(self.model_column).map(str::to_string),
                body,
                t_ms,
                session,
                host: field(self.host_column).map(host_of),
            });
        }
    }
}

/// A host column's value, bounded (a name, not a payload).
fn host_of(value: &str) -> String {
    value.chars().take(MAX_HOST_CHARS).collect()
}

const MAX_HOST_CHARS: usize = 256;

/// A session id is cut to this many characters (an id, not a payload).
const MAX_SESSION_CHARS: usize = 256;

/// A gateway log's rows as the records a proxy would have written: the same analysis,
/// panes and exports then run on it. `timed`: every row had a timestamp (records in time
/// order); else they are in file order, `UNTIMED_PACE_MS` apart from 0.
pub struct LogRecords {
    pub records: Vec<crate::record::Record>,
    pub report: FileReport,
    pub timed: bool,
}

/// The pace of a log without timestamps: one row a second, in file order.
pub const UNTIMED_PACE_MS: i64 = 1_000;

/// A log's records: CSV, or JSON Lines (one object per exchange, keyed by the CSV's column
/// names, told by its first byte).
pub fn records(mut reader: impl BufRead, name: &str, ts_column: Option<&str>) -> LogRecords {
    let json_lines = reader
        .fill_buf()
        .ok()
        .and_then(|head| head.iter().find(|b| !b.is_ascii_whitespace()).copied())
        == Some(b'{');
    let (raws, report) = if json_lines {
        json_rows(reader, name, ts_column)
    } else {
        let mut rows = Rows::new(reader, name, ts_column);
        let mut raws = Vec::new();
        while let Some(raw) = rows.next_raw() {
            raws.push(raw);
        }
        (raws, rows.report)
    };
    of_rows(raws, report)
}

/// A JSON Lines log's rows: each line an object with the CSV's column names as keys, whose
/// bodies are objects or JSON text. Bad lines are counted, never fatal.
fn json_rows(
    reader: impl BufRead,
    name: &str,
    ts_column: Option<&str>,
) -> (Vec<RawRow>, FileReport) {
    let mut report = FileReport::new(name, Format::Csv);
    let mut raws = Vec::new();
    let timestamp_keys: Vec<&str> = match ts_column {
        Some(column) => vec![column],
        None => TIMESTAMP_COLUMNS.to_vec(),
    };
    let mut reader = reader;
    let mut buffer = Vec::new();
    let mut number = 0;
    loop {
        use crate::limits::{Line, read_line_bounded};
        number += 1;
        match read_line_bounded(&mut reader, &mut buffer, MAX_LINE_BYTES) {
            Ok(Line::Eof) => break,
            Ok(Line::Read { .. }) => {}
            Ok(Line::TooLong { bytes }) => {
                report.bad(number, too_long_message(bytes));
                continue;
            }
            Err(e) => {
                report.bad(number, format!("read error: {e}"));
                report.read_error = Some(format!("line {number}: {e}"));
                break;
            }
        }
        if buffer.trim_ascii().is_empty() {
            continue;
        }
        let object: serde_json::Map<String, Value> = match serde_json::from_slice(&buffer) {
            Ok(Value::Object(object)) => object,
            Ok(_) => {
                report.bad(number, "not a JSON object");
                continue;
            }
            Err(e) => {
                report.bad(number, format!("not JSON: {e}"));
                continue;
            }
        };
        // A body is an object, or JSON text in a string (as a CSV cell holds it).
        let body_of = |key: &str| match object.get(key) {
            Some(Value::String(text)) => serde_json::from_str::<Value>(text).ok(),
            Some(Value::Null) | None => None,
            Some(value) => Some(value.clone()),
        };
        let text_of = |key: &str| match object.get(key) {
            Some(Value::String(text)) if !text.trim().is_empty() => Some(text.trim().to_string()),
            Some(Value::Number(n)) => Some(n.to_string()),
            _ => None,
        };
        let Some(body) = body_of("request_json").filter(Value::is_object) else {
            report.bad(number, "no request_json object (the request body)");
            continue;
        };
        let status = match text_of("status_code") {
            Some(text) => match text.parse::<u16>() {
                Ok(code) => Some(code),
                Err(_) => {
                    report.bad(number, format!("status_code {text:?} is not a number"));
                    continue;
                }
            },
            None => None,
        };
        let t_ms = match timestamp_keys.iter().find_map(|k| text_of(k)) {
            Some(text) => match parse_timestamp_ms(&text) {
                Some(t) => Some(t),
                None => {
                    report.bad(
                        number,
                        format!("timestamp {text:?} is neither epoch nor ISO-8601"),
                    );
                    continue;
                }
            },
            None => None,
        };
        let session = SESSION_COLUMNS.iter().find_map(|key| {
            text_of(key).map(|v| {
                (
                    (*key).to_string(),
                    v.chars().take(MAX_SESSION_CHARS).collect(),
                )
            })
        });
        raws.push(RawRow {
            index: raws.len(),
            status,
            body,
            response: body_of("response_json"),
            model: text_of("model_name"),
            t_ms,
            session,
            host: text_of("host").map(|h| host_of(&h)),
        });
    }
    (raws, report)
}

fn of_rows(raws: Vec<RawRow>, report: FileReport) -> LogRecords {
    use crate::record::{Record, RequestRecord, ResponseRecord};
    let timed = !raws.is_empty() && raws.iter().all(|r| r.t_ms.is_some());
    let mut records: Vec<Record> = raws
        .into_iter()
        .map(|raw| {
            let t_ms = match (timed, raw.t_ms) {
                (true, Some(t)) => t,
                _ => raw.index as i64 * UNTIMED_PACE_MS,
            };
            let path = if raw.body.get("messages").is_some() {
                "/v1/chat/completions"
            } else {
                "/v1/completions"
            };
            let mut body = raw.body;
            if body.get("model").is_none()
                && let (Some(model), Some(object)) = (raw.model, body.as_object_mut())
            {
                object.insert("model".into(), Value::String(model));
            }
            Record {
                v: 1,
                id: raw.index as u64 + 1,
                conn: 0,
                t_start_ms: t_ms,
                t_first_byte_ms: None,
                t_end_ms: t_ms,
                request: RequestRecord {
                    method: "POST".into(),
                    path: path.into(),
                    // Read as a recording's session header is (its column named in README).
                    headers: raw
                        .session
                        .into_iter()
                        .map(|(_, value)| ("x-session-id".to_string(), value))
                        .chain(raw.host.map(|host| ("host".to_string(), host)))
                        .collect(),
                    body_bytes: 0,
                    body: Some(body),
                    body_text: None,
                    digest: None,
                },
                // A log without a status column logged what answered.
                response: Some(ResponseRecord::bare(
                    raw.status.unwrap_or(200),
                    raw.response,
                )),
                error: None,
                tokens: None,
                probe: false,
            }
        })
        .collect();
    // Gateways often log when a request ended, or newest first: replayed by time.
    records.sort_by_key(|r| (r.t_start_ms, r.id));
    LogRecords {
        records,
        report,
        timed,
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
