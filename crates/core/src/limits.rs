//! Bounds on the numbers prefixscope reads from servers, recordings, logs and traces, checked
//! before any of them sizes an allocation (DESIGN.md, "Limits and timeouts"). A count past its
//! bound is a bad value: counted and shown where bad lines are, then treated as not reported.
//! A line past its bound is a bad line, read without being held ([`read_line_bounded`]).
//!
//! A leaf: it depends on nothing, and every floor (the recording format included) may use it.

/// The most prompt tokens one request may claim: 16,777,216, above every context window in
/// use (the largest, 10M tokens), so no real count is refused.
pub const MAX_PROMPT_TOKENS: u64 = 1 << 24;

/// Most blocks the default block model lets an input's simulation hold (prompts and what they
/// leave cached; 12 bytes each while replayed, so about 100 MB): past it, the default block size
/// doubles until the input fits. A block size the user gives is kept as given.
pub const MAX_SIMULATED_BLOCKS: u64 = 1 << 23;

/// Tokens a tokenizer can make of one character, at most: byte-fallback vocabularies give one
/// token per UTF-8 byte, and a character is at most four bytes.
pub const MAX_TOKENS_PER_CHAR: f64 = 4.0;

/// Tokens a prompt may hold beyond its text: the chat template's markers and media (an image
/// is a few hundred to a few thousand tokens whatever the length of its URL).
pub const TEMPLATE_AND_MEDIA_TOKENS: u64 = 1 << 17;

/// Replay and demo speeds: ×0.01 to ×1000. Slower shows nothing for minutes; faster paces below
/// what a sleep resolves, and a speed near zero turned a sleep into a `Duration` overflow (a
/// panic in the simulated server's worker, then a hang).
pub const MIN_SPEED: f64 = 0.01;
pub const MAX_SPEED: f64 = 1000.0;

/// The longest `--connect-timeout`, in whole seconds: a day. (`1e20` seconds panicked
/// converting to a `Duration`.)
pub const MAX_CONNECT_TIMEOUT_SECS: u64 = 86_400;

/// The most slots the simulated server (`demo --slots`) runs.
pub const MAX_SIM_SLOTS: usize = 64;

/// The longest line any reader takes (a recording's record, a trace row, a gateway log's CSV
/// record): 64 MiB. Past it the line is a counted bad line, skipped without being held: at most
/// this much of it is ever in memory, gzipped or not (a 2 MB gzip unpacked to a 2 GiB line took
/// `profile` to 5.8 GB). A record holds both bodies, each up to `--max-body` (64 MiB by default),
/// so the recorder writes a record whose line would pass this without its bodies; JSON of tiny
/// values parses to up to about 16 times its size, so a line at the bound stays near 1 GiB.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// The most hash ids one trace row may list: 2^20 (1,048,576), the blocks of `MAX_PROMPT_TOKENS`
/// at 16 tokens (bailian's size; Mooncake's is 512). A row past it is a bad row, refused while
/// it is parsed (a 23-million-id Mooncake row took `replay` to 6.7 GB).
pub const MAX_HASH_IDS_PER_ROW: usize = 1 << 20;

/// Bytes kept of each version of a changed message at a break (64 KiB), for the TUI's detail:
/// the whole text where it fits, else its start and a count of what was not kept. Only break
/// rows keep them, so a run holds at most 128 KiB per break beside its rows.
pub const MAX_BREAK_TEXT_BYTES: usize = 64 << 10;

/// What [`read_line_bounded`] read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// Nothing left.
    Eof,
    /// A line in the buffer; `complete`: it ended with `\n` (else it is the file's last).
    Read { complete: bool },
    /// A line past the bound, skipped (the buffer is empty): how many bytes it had, `\n`
    /// included.
    TooLong { bytes: u64 },
}

/// The most JSON values a body or a recorded line may hold to be read into a `Value` tree: a
/// `Value` takes 32 bytes and more, so a body of tiny values (`[0,0,…]`, two bytes a value)
/// costs sixteen times its size and more once read. Real bodies hold far fewer: a 64 MiB chat
/// body of text holds thousands.
pub const MAX_JSON_VALUES: usize = 1 << 21;

/// Whether `json` holds more than `MAX_JSON_VALUES` values, counted without reading it: the
/// commas and opening brackets outside strings (each value after the first in an array or
/// object follows a comma). A scan of the bytes of a long text, no allocation.
pub fn too_many_json_values(json: &[u8]) -> bool {
    // Each counted byte is one byte of the text, so a shorter text cannot hold too many: the
    // common case costs no scan.
    if json.len() <= MAX_JSON_VALUES {
        return false;
    }
    let (mut count, mut in_string, mut escaped) = (0usize, false, false);
    for &byte in json {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match byte {
            b'"' => in_string = true,
            b',' | b'[' | b'{' => {
                count += 1;
                if count > MAX_JSON_VALUES {
                    return true;
                }
            }
            _ => {}
        }
    }
    false
}

/// Reads one line (through `\n`) into `buffer`, which it clears first, holding at most `max`
/// bytes of it: a longer line is read to its end, dropped and reported as `TooLong`.
pub fn read_line_bounded<R: std::io::BufRead + ?Sized>(
    reader: &mut R,
    buffer: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    buffer.clear();
    append_line_bounded(reader, buffer, max)
}

/// [`read_line_bounded`], the line appended to what `buffer` holds, so that lines gathered
/// together are copied once; a line past `max` leaves `buffer` as it was.
pub fn append_line_bounded<R: std::io::BufRead + ?Sized>(
    reader: &mut R,
    buffer: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Line> {
    let start = buffer.len();
    let mut total: u64 = 0;
    let mut too_long = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                buffer.truncate(start);
                return Err(e);
            }
        };
        if available.is_empty() {
            return Ok(match (too_long, total) {
                (true, bytes) => Line::TooLong { bytes },
                (false, 0) => Line::Eof,
                (false, _) => Line::Read { complete: false },
            });
        }
        let end = memchr::memchr(b'\n', available);
        let n = end.map_or(available.len(), |i| i + 1);
        if !too_long {
            let content = buffer.len() - start + n - usize::from(end.is_some());
            if content > max {
                too_long = true;
                buffer.truncate(start);
            } else {
                buffer.extend_from_slice(&available[..n]);
            }
        }
        total += n as u64;
        reader.consume(n);
        if end.is_some() {
            return Ok(if too_long {
                Line::TooLong { bytes: total }
            } else {
                Line::Read { complete: true }
            });
        }
    }
}

/// The bad-line message for a line past `MAX_LINE_BYTES`.
pub fn too_long_message(bytes: u64) -> String {
    format!(
        "line of {bytes} bytes is past the {} MiB line bound (skipped)",
        MAX_LINE_BYTES >> 20
    )
}

/// A CSV stream with every record (a line, or several when a quoted field holds newlines) held
/// to at most `max` bytes: the rest of a longer record is dropped as it is read, the quote it
/// was in is closed, and the record ends there; `cuts` counts such records and `last_cut_bytes`
/// says how long the last one was. The CSV parser above never holds more than the bound of
/// one record, and a reader that sees `cuts` move while it read a record reports that record
/// as too long.
pub struct CsvRecordCap<R> {
    inner: R,
    max: usize,
    in_quotes: bool,
    record_bytes: u64,
    skipping: bool,
    /// Whether what was passed on of the record being cut was inside quotes.
    cut_in_quotes: bool,
    pending: &'static [u8],
    pub cuts: u64,
    pub last_cut_bytes: u64,
}

impl<R: std::io::BufRead> CsvRecordCap<R> {
    pub fn new(inner: R, max: usize) -> CsvRecordCap<R> {
        CsvRecordCap {
            inner,
            max,
            in_quotes: false,
            record_bytes: 0,
            skipping: false,
            cut_in_quotes: false,
            pending: b"",
            cuts: 0,
            last_cut_bytes: 0,
        }
    }

    fn end_cut(&mut self) {
        self.skipping = false;
        self.cuts += 1;
        self.last_cut_bytes = self.record_bytes;
        self.record_bytes = 0;
        self.pending = if self.cut_in_quotes { b"\"\n" } else { b"\n" };
    }
}

impl<R: std::io::BufRead> std::io::Read for CsvRecordCap<R> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if !self.pending.is_empty() {
                let n = self.pending.len().min(out.len());
                out[..n].copy_from_slice(&self.pending[..n]);
                self.pending = &self.pending[n..];
                return Ok(n);
            }
            if out.is_empty() {
                return Ok(0);
            }
            let available = self.inner.fill_buf()?;
            if available.is_empty() {
                if self.skipping {
                    self.end_cut();
                    continue;
                }
                return Ok(0);
            }
            let (mut emitted, mut consumed) = (0, 0);
            for &byte in available {
                if emitted == out.len() {
                    break;
                }
                consumed += 1;
                let quotes_before = self.in_quotes;
                if byte == b'"' {
                    self.in_quotes = !self.in_quotes;
                }
                let record_end = byte == b'\n' && !self.in_quotes;
                self.record_bytes += 1;
                if self.skipping {
                    if record_end {
                        self.end_cut();
                        break;
                    }
                    continue;
                }
                if self.record_bytes > self.max as u64 && !record_end {
                    self.skipping = true;
                    self.cut_in_quotes = quotes_before;
                    continue;
                }
                out[emitted] = byte;
                emitted += 1;
                if record_end {
                    self.record_bytes = 0;
                }
            }
            self.inner.consume(consumed);
            if emitted > 0 {
                return Ok(emitted);
            }
        }
    }
}

/// `speed` when it is a replay or demo speed we run at, else why not (the flag's name apart).
pub fn check_speed(speed: f64) -> Result<f64, String> {
    if (MIN_SPEED..=MAX_SPEED).contains(&speed) {
        Ok(speed)
    } else {
        Err(format!("must be from {MIN_SPEED} to {MAX_SPEED}"))
    }
}

/// A token count read from a server or a file, or `None` when it is past every context window.
pub fn plausible_tokens(count: u64) -> Option<u64> {
    (count <= MAX_PROMPT_TOKENS).then_some(count)
}

/// The most tokens a prompt of `chars` characters can be: its text at four tokens a character,
/// plus the template and media allowance, and never past `MAX_PROMPT_TOKENS`.
pub fn max_tokens_for_chars(chars: u64) -> u64 {
    chars
        .saturating_mul(MAX_TOKENS_PER_CHAR as u64)
        .saturating_add(TEMPLATE_AND_MEDIA_TOKENS)
        .min(MAX_PROMPT_TOKENS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_counts_pass_and_huge_ones_do_not() {
        assert_eq!(plausible_tokens(10_000_000), Some(10_000_000));
        assert_eq!(plausible_tokens(1 << 32), None);
        assert_eq!(plausible_tokens(u64::MAX), None);
    }

    #[test]
    fn a_line_past_the_bound_is_skipped_whole_and_the_next_one_read() {
        let text = b"short\n0123456789abcdef\nlast";
        let mut reader = std::io::BufReader::with_capacity(4, &text[..]);
        let mut buffer = Vec::new();
        let mut next = || read_line_bounded(&mut reader, &mut buffer, 10).unwrap();
        assert_eq!(next(), Line::Read { complete: true });
        assert_eq!(next(), Line::TooLong { bytes: 17 });
        assert_eq!(next(), Line::Read { complete: false });
        assert_eq!(next(), Line::Eof);
        // Exactly at the bound is fine, newline or not.
        let mut buffer = Vec::new();
        let mut exact = &b"0123456789\n0123456789"[..];
        assert_eq!(
            read_line_bounded(&mut exact, &mut buffer, 10).unwrap(),
            Line::Read { complete: true }
        );
        assert_eq!(buffer, b"0123456789\n");
        assert_eq!(
            read_line_bounded(&mut exact, &mut buffer, 10).unwrap(),
            Line::Read { complete: false }
        );
        // A long last line without a newline.
        let mut long = &b"0123456789abc"[..];
        assert_eq!(
            read_line_bounded(&mut long, &mut buffer, 10).unwrap(),
            Line::TooLong { bytes: 13 }
        );
        assert!(buffer.is_empty());
    }

    /// Appended lines follow what the buffer held, each bounded on its own; one past the bound,
    /// or cut by a read error, leaves the buffer as it was.
    #[test]
    fn appended_lines_are_bounded_each_and_a_skipped_one_leaves_nothing() {
        let text = b"0123456789\nab\n0123456789abc\ncd";
        let mut reader = std::io::BufReader::with_capacity(3, &text[..]);
        let mut buffer = b"held|".to_vec();
        let mut next = |buffer: &mut Vec<u8>| append_line_bounded(&mut reader, buffer, 10).unwrap();
        assert_eq!(next(&mut buffer), Line::Read { complete: true });
        assert_eq!(next(&mut buffer), Line::Read { complete: true });
        assert_eq!(next(&mut buffer), Line::TooLong { bytes: 14 });
        assert_eq!(buffer, b"held|0123456789\nab\n");
        assert_eq!(next(&mut buffer), Line::Read { complete: false });
        assert_eq!(next(&mut buffer), Line::Eof);
        assert_eq!(buffer, b"held|0123456789\nab\ncd");

        // Three bytes, then a failure.
        let failing = crate::test_support::FailingReader {
            piece: b"x",
            reads: 3,
        };
        let mut failing = std::io::BufReader::with_capacity(1, failing);
        let mut buffer = b"held|".to_vec();
        assert!(append_line_bounded(&mut failing, &mut buffer, 10).is_err());
        assert_eq!(buffer, b"held|");
    }

    #[test]
    fn a_csv_record_past_the_bound_is_cut_and_its_quote_closed() {
        use std::io::Read;
        let text = "a,b\n1,\"short\"\n2,\"a long field\nover lines, \"\"quoted\"\"\"\n3,x\n";
        let mut capped = CsvRecordCap::new(text.as_bytes(), 12);
        let mut out = String::new();
        capped.read_to_string(&mut out).unwrap();
        assert_eq!(out, "a,b\n1,\"short\"\n2,\"a long fi\"\n3,x\n");
        assert_eq!(capped.cuts, 1);
        assert_eq!(
            capped.last_cut_bytes,
            "2,\"a long field\nover lines, \"\"quoted\"\"\"\n".len() as u64
        );
        let mut csv = csv::ReaderBuilder::new()
            .flexible(true)
            .from_reader(CsvRecordCap::new(text.as_bytes(), 12));
        let rows: Vec<Vec<String>> = csv
            .records()
            .map(|r| r.unwrap().iter().map(str::to_string).collect())
            .collect();
        assert_eq!(
            rows,
            vec![vec!["1", "short"], vec!["2", "a long fi"], vec!["3", "x"]]
        );
        // A long last record without a newline.
        let mut capped = CsvRecordCap::new(&b"1,0123456789"[..], 4);
        let mut out = String::new();
        capped.read_to_string(&mut out).unwrap();
        assert_eq!((out.as_str(), capped.cuts), ("1,01\n", 1));
    }

    #[test]
    fn a_prompt_bound_follows_its_text_and_stops_at_the_maximum() {
        assert_eq!(max_tokens_for_chars(0), TEMPLATE_AND_MEDIA_TOKENS);
        assert_eq!(max_tokens_for_chars(1000), 4000 + TEMPLATE_AND_MEDIA_TOKENS);
        assert_eq!(max_tokens_for_chars(u64::MAX), MAX_PROMPT_TOKENS);
    }

    #[test]
    fn json_values_are_counted_outside_strings_only() {
        let many = format!("[{}0]", "0,".repeat(MAX_JSON_VALUES));
        assert!(too_many_json_values(many.as_bytes()));
        let few = format!("[{}0]", "0,".repeat(MAX_JSON_VALUES - 2));
        assert!(!too_many_json_values(few.as_bytes()));
        // Commas and brackets inside a string, escaped quotes included, are text.
        let text = format!(
            "{{\"content\": \"a\\\" {}\"}}",
            ",[{".repeat(MAX_JSON_VALUES)
        );
        assert!(!too_many_json_values(text.as_bytes()));
    }
}
