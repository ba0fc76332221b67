//! JSON Lines reading and writing. Reading is tolerant: a bad line, an unknown `v` or a truncated
//! last line is reported with its line number and the rest of the file is still read.

use std::io::{self, BufRead, Write};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Record;
use crate::RECORD_VERSION;
use crate::limits::{Line, MAX_LINE_BYTES, read_line_bounded, too_long_message};

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ReadResult {
    /// Sorted by `id` (records are written when their exchange ends, so files are not).
    pub records: Vec<Record>,
    pub bad_lines: Vec<BadLine>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadLine {
    pub line: usize,
    pub error: String,
}

/// Reads every record it can. I/O errors mid-file end the read and are reported as a bad line.
pub fn read_jsonl(reader: impl BufRead) -> ReadResult {
    let mut result = ReadResult::default();
    for item in Lines::new(reader) {
        match item {
            Ok(record) => result.records.push(record),
            Err(bad) => result.bad_lines.push(bad),
        }
    }
    result.records.sort_by_key(|r| r.id);
    result
}

/// The records of a recording one at a time, in file order (which is completion order), with
/// each bad line in its place: a reader that never holds the file.
pub struct Lines<R> {
    reader: R,
    buffer: Vec<u8>,
    number: usize,
    done: bool,
}

impl<R: BufRead> Lines<R> {
    pub fn new(reader: R) -> Lines<R> {
        Lines {
            reader,
            buffer: Vec::new(),
            number: 0,
            done: false,
        }
    }
}

impl<R: BufRead> Iterator for Lines<R> {
    type Item = Result<Record, BadLine>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.done {
            let complete =
                match read_line_bounded(&mut self.reader, &mut self.buffer, MAX_LINE_BYTES) {
                    Ok(Line::Eof) => {
                        self.done = true;
                        return None;
                    }
                    Ok(Line::Read { complete }) => complete,
                    Ok(Line::TooLong { bytes }) => {
                        self.number += 1;
                        return Some(Err(BadLine {
                            line: self.number,
                            error: too_long_message(bytes),
                        }));
                    }
                    Err(e) => {
                        self.done = true;
                        return Some(Err(read_error_line(self.number + 1, &e)));
                    }
                };
            self.number += 1;
            let Some(parsed) = parse_record_line(&self.buffer) else {
                continue;
            };
            return Some(parsed.map_err(|error| bad_record_line(self.number, complete, error)));
        }
        None
    }
}

/// One line of a recording as it was read (its newline included or not), or `None` for a blank
/// line, which every reader skips.
pub fn parse_record_line(line: &[u8]) -> Option<Result<Record, String>> {
    let line = trim_ascii(line);
    (!line.is_empty()).then(|| parse_line(line))
}

/// Line `number` did not parse: its error, said as a truncated last line when the line had no
/// newline (`complete` false: the file ended in it, as a recording still being written does).
pub fn bad_record_line(number: usize, complete: bool, error: String) -> BadLine {
    let error = match complete {
        true => error,
        false => format!("truncated last line: {error}"),
    };
    BadLine {
        line: number,
        error,
    }
}

/// The read failed before line `number`: the bad line that ends a reading.
pub fn read_error_line(number: usize, error: &io::Error) -> BadLine {
    BadLine {
        line: number,
        error: format!("read error: {error}"),
    }
}

fn trim_ascii(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|b| !b.is_ascii_whitespace());
    let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace());
    match (start, end) {
        (Some(s), Some(e)) => &bytes[s..=e],
        _ => &[],
    }
}

/// A line (trimmed) as a record. Typed straight from the text: the body's `Value` is built
/// once, not built and then rebuilt by `from_value`. Only an object of valid UTF-8 goes this
/// way (serde would take a record written as an array); whatever it refuses (another version,
/// a bad field, a duplicate key) goes the checked way, whose error is the one to report.
///
/// One difference, kept on purpose: a field the record does not have is skipped unread, so a
/// lone surrogate escape, a number past `f64` or nesting past 128 levels inside one no longer
/// make the line bad (llmp's Python reader takes all three as well). Fields are added by
/// extension (`record`'s module doc), and what we do not read cannot mislead us.
fn parse_line(line: &[u8]) -> Result<Record, String> {
    if crate::limits::too_many_json_values(line) {
        return Err(format!(
            "more than {} JSON values: too many to read",
            crate::limits::MAX_JSON_VALUES
        ));
    }
    if line.first() == Some(&b'{')
        && let Ok(text) = std::str::from_utf8(line)
        && let Ok(record) = serde_json::from_str::<Record>(text)
        && record.v == RECORD_VERSION
    {
        return Ok(record);
    }
    parse_line_checked(line)
}

/// The version first, then the record: the error a reader should see for a line that is not a
/// record of this version.
fn parse_line_checked(line: &[u8]) -> Result<Record, String> {
    let value: Value = serde_json::from_slice(line).map_err(|e| e.to_string())?;
    match value.get("v").and_then(Value::as_u64) {
        Some(v) if v == u64::from(RECORD_VERSION) => {}
        Some(v) => return Err(format!("unsupported record version {v}")),
        None => return Err("missing record version `v`".to_string()),
    }
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// One record as one line, `\n` included.
pub fn record_line(record: &Record) -> Vec<u8> {
    // Serializing our own types to a Vec cannot fail: every map key is a string.
    let mut line = serde_json::to_vec(record).unwrap_or_default();
    line.push(b'\n');
    line
}

pub fn write_jsonl(mut writer: impl Write, record: &Record) -> io::Result<()> {
    writer.write_all(&record_line(record))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"{"v":1,"id":2,"conn":1,"t_start_ms":5,"t_first_byte_ms":null,"t_end_ms":6,"request":{"method":"GET","path":"/health","headers":{},"body_bytes":0,"body":null,"body_text":null,"digest":null},"response":null,"error":"upstream_unreachable","tokens":null}"#;

    #[test]
    fn bad_lines_are_counted_with_their_numbers_and_the_rest_is_read() {
        let newer = GOOD.replace(r#""v":1"#, r#""v":2"#);
        let first = GOOD.replace(r#""id":2"#, r#""id":1"#);
        let text = format!("{GOOD}\nnot json\n\n{newer}\n{first}\n{{\"v\":1,\"id\":");
        let result = read_jsonl(text.as_bytes());
        assert_eq!(
            result.records.iter().map(|r| r.id).collect::<Vec<_>>(),
            vec![1, 2]
        );
        let lines: Vec<usize> = result.bad_lines.iter().map(|b| b.line).collect();
        assert_eq!(lines, vec![2, 4, 6]);
        assert!(result.bad_lines[1].error.contains("version 2"));
        assert!(result.bad_lines[2].error.starts_with("truncated last line"));
    }

    #[test]
    fn a_written_record_reads_back_identically() {
        let record = read_jsonl(GOOD.as_bytes()).records.remove(0);
        let line = record_line(&record);
        assert_eq!(line, format!("{GOOD}\n").into_bytes());
        assert_eq!(read_jsonl(line.as_slice()).records, vec![record]);
    }

    #[test]
    fn invalid_utf8_is_a_bad_line_not_the_end() {
        let mut bytes = b"\xff\xfe\n".to_vec();
        bytes.extend_from_slice(GOOD.as_bytes());
        let result = read_jsonl(bytes.as_slice());
        assert_eq!(result.records.len(), 1);
        assert_eq!(result.bad_lines[0].line, 1);
    }

    /// Every `.jsonl` line of the repository's real recordings and test data.
    fn real_lines() -> Vec<Vec<u8>> {
        fn walk(dir: &std::path::Path, out: &mut Vec<Vec<u8>>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, out);
                } else if path.extension().is_some_and(|e| e == "jsonl") {
                    let bytes = std::fs::read(&path).unwrap();
                    out.extend(bytes.split(|&b| b == b'\n').map(<[u8]>::to_vec));
                }
            }
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut lines = Vec::new();
        walk(&root.join("recordings"), &mut lines);
        walk(&root.join("tests/data"), &mut lines);
        lines
    }

    /// The typed read straight from the bytes is a shortcut: on every line, real or broken, it
    /// gives what the version-first read gives, record for record and error for error.
    #[test]
    fn the_typed_read_equals_the_checked_one_on_real_and_broken_lines() {
        let lines = real_lines();
        let records = lines
            .iter()
            .filter(|l| parse_line_checked(l).is_ok())
            .count();
        assert!(records > 100, "{records} real records");
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let edits: [&[u8]; 10] = [
            br#""v":2,"#,
            br#""v":1,"#,
            br#""id":1,"id":2,"#,
            br#""conn":-1,"#,
            br#""t_end_ms":1e3,"#,
            b"null",
            b"\"",
            b"{",
            b"18446744073709551616",
            br#""probe":true,"#,
        ];
        let mut compared = 0;
        for line in lines.iter().filter(|l| !l.is_empty()) {
            assert_eq!(parse_line(line), parse_line_checked(line));
            for _ in 0..32 {
                let mut broken = line.clone();
                let at = (next() % broken.len() as u64) as usize;
                match next() % 3 {
                    0 => broken.truncate(at),
                    1 => broken[at] ^= 1 << (next() % 8),
                    _ => {
                        let edit = edits[(next() % edits.len() as u64) as usize];
                        broken.splice(at..at, edit.iter().copied());
                    }
                }
                assert_eq!(
                    parse_line(&broken),
                    parse_line_checked(&broken),
                    "{}",
                    String::from_utf8_lossy(&broken)
                );
                compared += 1;
            }
        }
        assert!(compared > 4_000);
        // Duplicate fields at the top: the typed read refuses them, the checked one keeps the
        // last, as it always did.
        let duplicate = GOOD.replace(r#""conn":1,"#, r#""conn":1,"conn":3,"#);
        assert_eq!(parse_line(duplicate.as_bytes()).map(|r| r.conn), Ok(3));
        // A record written as an array, and invalid UTF-8 where nothing reads it: refused, as
        // they always were.
        let array = r#"[1,2,1,5,null,6,{"method":"GET","path":"/health","headers":{},"body_bytes":0,"body":null,"body_text":null,"digest":null},null,"upstream_unreachable",null]"#;
        let mut bad_utf8 = GOOD
            .replace(r#""tokens":null"#, r#""tokens":null,"x":"~""#)
            .into_bytes();
        let at = bad_utf8.iter().position(|&b| b == b'~').unwrap();
        bad_utf8[at] = 0xff;
        for refused in [array.as_bytes(), &bad_utf8] {
            assert!(parse_line(refused).is_err());
            assert_eq!(parse_line(refused), parse_line_checked(refused));
        }
    }

    /// What an unknown field holds is skipped unread: the record is read, the field ignored.
    #[test]
    fn an_unknown_field_is_skipped_unread() {
        let good = parse_line(GOOD.as_bytes()).unwrap();
        let deep = format!("{}{}", "[".repeat(130), "]".repeat(130));
        for value in [r#""\ud800""#, "1e400", deep.as_str()] {
            let line = GOOD.replace(r#""tokens":null"#, &format!(r#""tokens":null,"x":{value}"#));
            assert!(parse_line_checked(line.as_bytes()).is_err(), "{value}");
            assert_eq!(parse_line(line.as_bytes()).as_ref(), Ok(&good), "{value}");
        }
    }

    /// serde_json's `raw_value` feature must stay off: with it, any `Value` in the program reads
    /// an object whose first key is its private marker as the JSON in its string, so a body
    /// sent with that key would be recorded and read back as something else.
    #[test]
    fn a_body_with_serde_json_s_raw_value_key_reads_as_sent() {
        let sent = r#"{"$serde_json::private::RawValue":"[1,2]"}"#;
        let value: serde_json::Value = serde_json::from_str(sent).unwrap();
        assert_eq!(value["$serde_json::private::RawValue"], "[1,2]");
    }
}
