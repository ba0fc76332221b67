//! One file per subcommand. Exit codes everywhere: 0 success, 1 input that could not be read at
//! all (or a port that could not be bound), 2 a usage error (clap's own, and ours). A first
//! SIGINT, SIGTERM or SIGHUP stops gracefully (exit 0); a second exits with 128 + its number
//! (`session::shutdown`).

pub mod analyze;
pub mod check;
pub mod demo;
pub mod export;
pub mod profile;
pub mod record;
pub mod records;
pub mod replay;
pub mod watch;
pub mod whatif;

use std::io::Write;

pub const EXIT_OK: u8 = 0;
pub const EXIT_UNREADABLE: u8 = 1;
pub const EXIT_USAGE: u8 = 2;

/// `-o -` was given: standard output carries that output, and what the command would print
/// there goes to stderr instead.
static STDOUT_TAKEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Where the command's own text goes: stdout, or stderr when `-o -` took stdout.
pub fn text_out() -> Box<dyn std::io::Write> {
    if STDOUT_TAKEN.load(std::sync::atomic::Ordering::Relaxed) {
        Box::new(std::io::stderr().lock())
    } else {
        Box::new(std::io::stdout().lock())
    }
}

/// The command's final text on stdout. After a SIGHUP the terminal may be gone: a write error
/// is not worth a panic (`print!` would panic).
/// Control characters of recorded text are escaped (`prefixscope_core::text`).
pub fn print_stdout(text: &str) {
    let mut out = text_out();
    let _ = out.write_all(prefixscope_core::text::printable(text).as_bytes());
    let _ = out.flush();
}

/// JSON on stdout, a line: DEL and C1 escaped too (`prefixscope_core::text::printable_json`).
pub fn print_json(json: &str) {
    let _ = writeln!(
        text_out(),
        "{}",
        prefixscope_core::text::printable_json(json)
    );
}

/// Some input file has bytes: an empty one is a warning (exit 0), not an input of which nothing
/// could be used (exit 1).
pub fn had_bytes(files: &[std::path::PathBuf]) -> bool {
    files
        .iter()
        .any(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
}

/// The analysis's settings from the command line: the session gap (`--gap-seconds`) and the
/// prices (`--prices FILE` over the default table). A prices file that cannot be read or
/// parsed is said, with the entry at fault, and refused (exit 2).
pub fn analysis_config(
    prices: Option<&std::path::Path>,
    gap_seconds: Option<u64>,
) -> Result<prefixscope_core::analysis::Config, u8> {
    let mut config = prefixscope_core::analysis::Config::default();
    if let Some(gap) = gap_seconds {
        config.session_gap_ms = gap.saturating_mul(1000);
    }
    if let Some(path) = prices {
        // A table of models, not a payload: bounded before it is read whole.
        const MAX_PRICES_BYTES: u64 = 4 << 20;
        let name = path.display().to_string();
        let text = std::fs::metadata(path)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                if m.len() > MAX_PRICES_BYTES {
                    Err(format!("larger than {} MiB", MAX_PRICES_BYTES >> 20))
                } else {
                    std::fs::read_to_string(path).map_err(|e| e.to_string())
                }
            });
        let prices = text
            .map_err(|e| format!("{name}: {e}"))
            .and_then(|text| prefixscope_core::pricing::Prices::with_file(&text, &name));
        match prices {
            Ok(prices) => config.prices = prices,
            Err(e) => {
                prefixscope_core::stderr_line!("prefixscope: --prices {e}");
                return Err(EXIT_USAGE);
            }
        }
    }
    Ok(config)
}

/// A session's error on stderr, and its exit code.
pub fn fail(error: prefixscope::session::Error) -> u8 {
    use prefixscope::session::Error;
    prefixscope_core::stderr_line!("prefixscope: {error}");
    match error {
        Error::Usage(_) => EXIT_USAGE,
        Error::Unreadable(_) => EXIT_UNREADABLE,
    }
}

/// `-o` refused (exit 2) when it is one of the inputs, or cannot be an output (a directory, a
/// block device): said before anything is read. `-o -` takes stdout (`text_out`).
pub fn check_output(
    out: Option<&std::path::Path>,
    inputs: &[std::path::PathBuf],
) -> Result<(), u8> {
    let Some(out) = out else { return Ok(()) };
    match prefixscope_core::output_file::output_kind(out) {
        Ok(prefixscope_core::output_file::OutputKind::Stdout) => {
            STDOUT_TAKEN.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(_) => {}
        Err(e) => {
            prefixscope_core::stderr_line!("prefixscope: -o {e}");
            return Err(EXIT_USAGE);
        }
    }
    let inputs: Vec<&std::path::Path> = inputs.iter().map(|p| p.as_path()).collect();
    match prefixscope_core::output_file::input_at(out, &inputs) {
        Some(input) => {
            let same = if input == out {
                String::new()
            } else {
                format!(" ({} is the same file)", input.display())
            };
            prefixscope_core::stderr_line!(
                "prefixscope: -o {} is one of the inputs{same}: writing it would destroy what is read; choose another file",
                out.display()
            );
            Err(EXIT_USAGE)
        }
        None => Ok(()),
    }
}

/// Writes a whole `-o` file (`prefixscope_core::output_file`: a 0600 temporary file renamed over the
/// target, a symlink replaced, an input refused, a failed write leaving the old file); the
/// error on stderr and its exit code.
pub fn write_output(
    out: &std::path::Path,
    inputs: &[std::path::PathBuf],
    bytes: &[u8],
) -> Result<(), u8> {
    let inputs: Vec<&std::path::Path> = inputs.iter().map(|p| p.as_path()).collect();
    prefixscope_core::output_file::write_whole(out, &inputs, bytes).map_err(|e| {
        prefixscope_core::stderr_line!("prefixscope: cannot write {}: {e}", out.display());
        if e.kind() == std::io::ErrorKind::InvalidInput {
            EXIT_USAGE
        } else {
            EXIT_UNREADABLE
        }
    })
}

/// The screen's switches: the mouse from the flag, the test and benchmark ones from the
/// environment (the binary is what they test).
pub fn screen_switches(mouse: bool) -> prefixscope::session::screen::Switches {
    prefixscope::session::screen::Switches {
        mouse,
        key_latency_file: std::env::var_os("PREFIXSCOPE_KEY_LATENCY").map(std::path::PathBuf::from),
        panic_for_test: std::env::var_os("PREFIXSCOPE_TEST_PANIC").is_some(),
    }
}

/// Recordings read from several files, each file's bad lines reported on stderr as read.
pub struct Recordings {
    pub records: Vec<prefixscope_core::record::Record>,
    pub files: Vec<RecordingFile>,
    /// A file yielded no record, or its read stopped (said on stderr): the command prints
    /// what it read and exits 1 (`exit_code`).
    pub failed: bool,
}

impl Recordings {
    /// `EXIT_OK`, or `EXIT_UNREADABLE` when a file failed.
    pub fn exit_code(&self) -> u8 {
        if self.failed {
            EXIT_UNREADABLE
        } else {
            EXIT_OK
        }
    }
}

#[derive(serde::Serialize)]
pub struct RecordingFile {
    pub path: std::path::PathBuf,
    pub records: usize,
    pub bad_lines: Vec<prefixscope_core::record::BadLine>,
}

/// Where `read_recordings_into` puts each record as it is read.
pub trait RecordSink {
    /// What each record becomes on the reading threads, in parallel, before `take` gets it in
    /// file order: the record itself, or work that depends on it alone (normalization).
    type Item: Send;
    fn prepare(record: prefixscope_core::record::Record) -> Self::Item;
    /// Record `id`, prepared.
    fn take(&mut self, id: u64, item: Self::Item);
    fn record(&mut self, record: prefixscope_core::record::Record)
    where
        Self: Sized,
    {
        let id = record.id;
        self.take(id, Self::prepare(record));
    }
    /// One file's records are all in.
    fn file_done(&mut self) {}
    /// The largest record id so far (a gateway log's ids are numbered after it).
    fn max_id(&self) -> u64;
}

/// Every record held, each file's in id order (as `record::read_jsonl` gives them).
#[derive(Default)]
struct Collect {
    records: Vec<prefixscope_core::record::Record>,
    file_start: usize,
    max_id: u64,
}

impl RecordSink for Collect {
    type Item = prefixscope_core::record::Record;

    fn prepare(record: prefixscope_core::record::Record) -> Self::Item {
        record
    }

    fn take(&mut self, id: u64, record: prefixscope_core::record::Record) {
        self.max_id = self.max_id.max(id);
        self.records.push(record);
    }

    fn file_done(&mut self) {
        self.records[self.file_start..].sort_by_key(|r| r.id);
        self.file_start = self.records.len();
    }

    fn max_id(&self) -> u64 {
        self.max_id
    }
}

impl Recordings {
    /// A gateway log's rows as the records a proxy would have written (`input::gateway_log_records`).
    fn read_log(
        &mut self,
        path: &std::path::Path,
        reader: Box<dyn std::io::BufRead>,
        sink: &mut impl RecordSink,
    ) {
        let name = path.display().to_string();
        let mut log = prefixscope_core::input::gateway_log_records(reader, &name, None);
        // Each log numbers its rows from 1: a second one's come after the first's.
        let base = sink.max_id();
        for record in &mut log.records {
            record.id += base;
        }
        for bad in &log.report.bad_rows {
            prefixscope_core::stderr_line!("prefixscope: {name}:{}: {}", bad.line, bad.error);
        }
        if log.records.is_empty() {
            prefixscope_core::stderr_line!("prefixscope: {name}: {}", log.report.why_nothing());
            self.failed = true;
        } else if let Some(error) = &log.report.read_error {
            prefixscope_core::stderr_line!(
                "prefixscope: {name}: the read stopped at {error}; the {} rows before it are read",
                log.records.len()
            );
            self.failed = true;
        }
        if !log.timed && !log.records.is_empty() {
            prefixscope_core::stderr_line!(
                "prefixscope: {name}: a gateway log without timestamps: its rows in file order, {} s apart",
                prefixscope_core::input::UNTIMED_PACE_MS / 1000
            );
        }
        self.files.push(RecordingFile {
            path: path.to_path_buf(),
            records: log.records.len(),
            bad_lines: log
                .report
                .bad_rows
                .iter()
                .map(|b| prefixscope_core::record::BadLine {
                    line: b.line,
                    error: b.error.clone(),
                })
                .collect(),
        });
        for record in log.records {
            sink.record(record);
        }
        sink.file_done();
    }
}

/// Where `-o PATH` writes a report and its page: `report.json` → itself and `report.html`;
/// `report` (no extension) → `report.json` and `report.html`; any other name → itself and
/// NAME.html; `--html FILE` puts the page there instead. A device, a FIFO or `-` gets the JSON
/// as it is, and a page only with `--html`.
pub fn report_paths(
    path: &std::path::Path,
    html: Option<&std::path::Path>,
) -> (std::path::PathBuf, Option<std::path::PathBuf>) {
    let is_file = prefixscope_core::output_file::output_kind(path).is_ok_and(|kind| kind.is_file());
    if !is_file {
        // A device, a FIFO or stdout: the JSON as it is, and the page only where asked.
        return (path.to_path_buf(), html.map(std::path::Path::to_path_buf));
    }
    let (json, beside) = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => (path.to_path_buf(), path.with_extension("html")),
        None => (path.with_extension("json"), path.with_extension("html")),
        Some(_) => {
            let mut html = path.as_os_str().to_owned();
            html.push(".html");
            (path.to_path_buf(), html.into())
        }
    };
    (
        json,
        Some(html.map_or(beside, std::path::Path::to_path_buf)),
    )
}

/// Reads every file it can (recordings, and gateway logs as the records a proxy would have
/// written); `None` when none could be opened at all (exit 1).
pub fn read_recordings(paths: &[std::path::PathBuf]) -> Option<Recordings> {
    let mut collect = Collect::default();
    let mut read = read_recordings_into(paths, &mut collect)?;
    read.records = collect.records;
    Some(read)
}

/// `read_recordings`, each record given to `sink` as it is read, none held here (`records`
/// stays empty): what reads a recording in memory bounded by its consumer.
pub fn read_recordings_into<S: RecordSink>(
    paths: &[std::path::PathBuf],
    sink: &mut S,
) -> Option<Recordings> {
    let mut out = Recordings {
        records: Vec::new(),
        files: Vec::new(),
        failed: false,
    };
    for path in paths {
        use prefixscope_core::input::Format;
        match prefixscope_core::input::open(path, None).map(|o| (o.format, o.reader)) {
            Ok((Format::Csv, reader)) => {
                out.read_log(path, reader, sink);
                continue;
            }
            Ok((format @ (Format::Mooncake | Format::Bailian), _)) => {
                prefixscope_core::stderr_line!(
                    "prefixscope: {} is {}: it holds token counts and hash ids, not the messages this reads; `prefixscope profile` and `replay` read traces",
                    path.display(),
                    format.describe()
                );
                out.failed = true;
                continue;
            }
            _ => {}
        }
        match prefixscope_core::input::open(path, Some(prefixscope_core::input::Format::Recording))
        {
            Ok(opened) => {
                let mut records = 0usize;
                let mut bad_lines = Vec::new();
                // Records are parsed (and prepared) on every core, taken in file order.
                prefixscope_core::input::for_each_record(
                    opened.reader,
                    |record| (record.id, S::prepare(record)),
                    |item| match item {
                        Ok((id, item)) => {
                            records += 1;
                            sink.take(id, item);
                        }
                        Err(bad) => {
                            prefixscope_core::stderr_line!(
                                "prefixscope: {}:{}: {}",
                                path.display(),
                                bad.line,
                                bad.error
                            );
                            bad_lines.push(bad);
                        }
                    },
                );
                sink.file_done();
                if records == 0 && bad_lines.is_empty() {
                    prefixscope_core::stderr_line!(
                        "prefixscope: {} is empty: no records",
                        path.display()
                    );
                }
                if records == 0 && !bad_lines.is_empty() {
                    prefixscope_core::stderr_line!(
                        "prefixscope: {}: no record: read as {}; {} bad lines",
                        path.display(),
                        prefixscope_core::input::Format::Recording.describe(),
                        bad_lines.len()
                    );
                    out.failed = true;
                }
                if let Some(stop) = bad_lines
                    .iter()
                    .find(|b| b.error.starts_with("read error: "))
                {
                    prefixscope_core::stderr_line!(
                        "prefixscope: {}: the read stopped at line {}: {}; the {records} records before it are read",
                        path.display(),
                        stop.line,
                        stop.error.trim_start_matches("read error: "),
                    );
                    out.failed = true;
                }
                out.files.push(RecordingFile {
                    path: path.clone(),
                    records,
                    bad_lines,
                });
            }
            Err(e) => {
                prefixscope_core::stderr_line!("prefixscope: cannot read {}: {e}", path.display())
            }
        }
    }
    (!out.files.is_empty()).then_some(out)
}

/// Whether `path` (gunzipped) holds no bytes at all: an empty input, read as holding nothing,
/// whatever its format (exit 0, with a warning), in every command.
pub fn is_empty_input(path: &std::path::Path) -> bool {
    use std::io::BufRead;
    prefixscope_core::input::open_decompressed(path)
        .and_then(|mut reader| reader.fill_buf().map(|b| b.is_empty()))
        .unwrap_or(false)
}

/// Each bad value of a file on stderr (a number past its bound, ignored), then how many more.
pub fn print_bad_values(name: &str, report: &prefixscope_core::input::FileReport) {
    for value in &report.bad_values {
        prefixscope_core::stderr_line!("prefixscope: {name}: bad value: {value}");
    }
    let more = report.bad_value_count - report.bad_values.len() as u64;
    if more > 0 {
        prefixscope_core::stderr_line!("prefixscope: {name}: {more} more bad values");
    }
}

/// `--speed`: a number from `MIN_SPEED` to `MAX_SPEED` (clap reports the error, exit 2).
pub fn parse_speed(text: &str) -> Result<f64, String> {
    let speed: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number"))?;
    prefixscope_core::limits::check_speed(speed)
}

/// A timeout in whole seconds, 1 to `MAX_CONNECT_TIMEOUT_SECS` (a day).
pub fn parse_timeout_seconds(text: &str) -> Result<u64, String> {
    use prefixscope_core::limits::MAX_CONNECT_TIMEOUT_SECS;
    match text.trim().parse::<u64>() {
        Ok(seconds) if (1..=MAX_CONNECT_TIMEOUT_SECS).contains(&seconds) => Ok(seconds),
        _ => Err(format!(
            "must be whole seconds from 1 to {MAX_CONNECT_TIMEOUT_SECS}"
        )),
    }
}

/// `--slots` of the simulated server: 1 to `MAX_SIM_SLOTS`.
pub fn parse_sim_slots(text: &str) -> Result<usize, String> {
    use prefixscope_core::limits::MAX_SIM_SLOTS;
    match text.trim().parse::<usize>() {
        Ok(slots) if (1..=MAX_SIM_SLOTS).contains(&slots) => Ok(slots),
        _ => Err(format!("must be a whole number from 1 to {MAX_SIM_SLOTS}")),
    }
}

/// `--memory-budget`: a size of at least 1 MiB.
pub fn parse_memory_budget(text: &str) -> Result<usize, String> {
    let bytes = parse_bytes(text)?;
    if bytes < 1 << 20 {
        return Err(format!("{text:?} is below 1 MiB"));
    }
    Ok(usize::try_from(bytes).unwrap_or(usize::MAX))
}

/// `1048576`, `64K`, `64KiB`, `16MB`, `1G`: binary multiples (K = 1024), as users of these tools
/// expect for memory-like sizes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, unit) = t.split_at(digits_end);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (e.g. 1048576, 64KiB, 16M)"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("unknown size unit {other:?} in {text:?}")),
    };
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        assert_eq!(parse_bytes("64K"), Ok(65536));
        assert_eq!(parse_bytes("64MiB"), Ok(64 << 20));
        assert_eq!(parse_bytes("1g"), Ok(1 << 30));
        assert!(parse_bytes("12 parsecs").is_err());
        assert!(parse_bytes("").is_err());
    }
}
