//! Replays: records of saved recordings and gateway logs (read as records), or requests of traces, fed to the
//! live engine from their files at the recorded pace (or at once), or printed headless.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::Error;
use super::headless::record_line;
use crate::tui::Seek;
use prefixscope_core::analysis::Config;
use prefixscope_core::cache::Request;
use prefixscope_core::input::{self, Format, InputOptions};
use prefixscope_core::live::{Engine, FirstPass, Input, LIVE_BLOCK_SIZE};
use prefixscope_core::record::{Lines, Record};

/// What to replay and how fast.
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    pub files: Vec<PathBuf>,
    /// How much faster than recorded (ignored with `instant`).
    pub speed: f64,
    /// Every record at once, no pacing.
    pub instant: bool,
    /// The analysis's settings (its prices).
    pub analysis: Config,
}

enum Source {
    /// Recordings, opened, read as they are fed.
    Recordings(Vec<(PathBuf, std::fs::File)>),
    /// Gateway logs as the records a proxy would have written (read whole: a log's rows are
    /// put in time order), every pane applies.
    Log(Vec<Record>),
    /// A trace's requests (read whole: the block model needs the file's tokens per character
    /// first), in start order, and its bad rows.
    Trace {
        requests: Vec<Request>,
        format: Format,
        bad: usize,
    },
}

/// A replay ready to run: its files opened, and what reading them found so far.
pub struct Replay {
    pub pacer: Arc<Pacer>,
    source: Source,
    analysis: Config,
    /// Bad rows and values of a trace, to show before anything else.
    pub messages: Vec<String>,
}

impl Replay {
    /// Opens the files (recordings, or traces / gateway logs: all of one kind).
    pub fn open(config: &ReplayConfig) -> Result<Replay, Error> {
        prefixscope_core::limits::check_speed(config.speed)
            .map_err(|why| Error::Usage(format!("--speed {why}")))?;
        let formats: Vec<Option<Format>> = config
            .files
            .iter()
            .map(|p| input::open(p, None).ok().map(|o| o.format))
            .collect();
        let traces = formats
            .iter()
            .filter(|f| f.is_some_and(|f| f != Format::Recording))
            .count();
        if traces > 0 && traces < formats.len() {
            return Err(Error::Usage(
                "replay either recordings or traces / gateway logs, not both at once".into(),
            ));
        }
        let pacer = Arc::new(Pacer {
            speed: AtomicU64::new(config.speed.to_bits()),
            stop: AtomicBool::new(false),
            paced: !config.instant,
            files: config.files.clone(),
            paused: AtomicBool::new(false),
            sent: AtomicU64::new(0),
            last_due_ms: AtomicI64::new(NOTHING_SENT),
            seek_records: AtomicU64::new(0),
            seek_until_ms: AtomicI64::new(NO_SEEK),
        });
        let mut messages = Vec::new();
        let logs = formats.iter().filter(|f| **f == Some(Format::Csv)).count();
        let source = if logs > 0 && logs == formats.len() {
            Source::Log(read_logs(&config.files, &mut messages)?)
        } else if traces > 0 {
            let format = formats
                .iter()
                .flatten()
                .next()
                .copied()
                .unwrap_or(Format::Mooncake);
            let (requests, bad) = read_trace(&config.files, format, &mut messages)?;
            Source::Trace {
                requests,
                format,
                bad,
            }
        } else {
            let mut opened = Vec::new();
            for path in &config.files {
                match open_file(path) {
                    Ok(file) => opened.push((path.clone(), file)),
                    Err(e) => messages.push(format!("cannot read {}: {e}", path.display())),
                }
            }
            if opened.is_empty() {
                return Err(Error::Unreadable(messages.join("; ")));
            }
            Source::Recordings(opened)
        };
        Ok(Replay {
            pacer,
            source,
            analysis: config.analysis.clone(),
            messages,
        })
    }

    /// The trace format being replayed (`None`: recordings, every pane applies).
    pub fn trace_format(&self) -> Option<Format> {
        match &self.source {
            Source::Trace { format, .. } => Some(*format),
            Source::Recordings(_) | Source::Log(_) => None,
        }
    }

    /// Tokens per block of the hit-rate simulation: a trace's own, else the live default.
    pub fn block_size(&self) -> u32 {
        self.trace_format()
            .map_or(LIVE_BLOCK_SIZE, Format::default_block_size)
    }

    /// Feeds the engine from the files, paced; `warn` hears of each bad line as it is read.
    pub fn feeder(
        self,
        warn: impl Fn(String) + Send + 'static,
    ) -> Box<dyn FnOnce(Sender<Input>) + Send> {
        let pacer = self.pacer;
        match self.source {
            Source::Trace { requests, bad, .. } => {
                if bad > 0 {
                    warn(format!(
                        "{} skipped",
                        prefixscope_core::units::plural(bad as u64, "bad line")
                    ));
                }
                Box::new(move |inputs: Sender<Input>| {
                    let items = requests.into_iter().map(|r| {
                        let due = r.t_ms.unwrap_or(0);
                        (due, Some(Arc::new(r)))
                    });
                    pacer.feed(items, &inputs, Input::Request);
                })
            }
            Source::Log(records) => Box::new(move |inputs: Sender<Input>| {
                let measured = FirstPass::of(&records);
                if inputs.send(Input::BlockModel(Box::new(measured))).is_err() {
                    return;
                }
                let items = records
                    .into_iter()
                    .map(|r| (r.t_start_ms, Some(Arc::new(r))));
                pacer.feed(items, &inputs, Input::Record);
            }),
            Source::Recordings(opened) => Box::new(move |inputs: Sender<Input>| {
                // The block model first, as `profile` measures it: a pass that keeps only the
                // sums (the screen is up meanwhile; records follow).
                let paths: Vec<PathBuf> = opened.iter().map(|(p, _)| p.clone()).collect();
                let measured = measure_block_model(&paths);
                if inputs.send(Input::BlockModel(Box::new(measured))).is_err() {
                    return;
                }
                let warn = Arc::new(warn);
                // Records are read as they are fed: the first screen never waits for the file.
                let items = opened.into_iter().flat_map(move |(path, file)| {
                    let warn = Arc::clone(&warn);
                    Lines::new(gunzipped(file)).map(move |item| match item {
                        Ok(record) => (
                            record.t_end_ms.max(record.t_start_ms),
                            Some(Arc::new(record)),
                        ),
                        Err(bad) => {
                            warn(format!("{}:{}: {}", path.display(), bad.line, bad.error));
                            (i64::MIN, None)
                        }
                    })
                });
                pacer.feed(items, &inputs, Input::Record);
            }),
        }
    }

    /// No terminal: a line per record (or request) on `out` as it is read, bad lines on `err`,
    /// then the summary of the live engine's snapshot (the one a TUI would show at the end).
    /// How many records (or requests) were read.
    pub fn headless(self, out: &mut dyn Write, err: &mut dyn Write) -> std::io::Result<u64> {
        match self.source {
            Source::Trace {
                requests,
                format,
                bad,
            } => headless_trace(&requests, format, bad, out),
            Source::Log(records) => headless_log(records, &self.pacer, self.analysis, out),
            Source::Recordings(opened) => {
                headless_records(opened, &self.pacer, self.analysis, out, err)
            }
        }
    }
}

/// The block model `profile` would cut these recordings with, and their first record id: one
/// pass over the files that keeps, per record, only its characters, server count and engine
/// (never the file). Files that cannot be read here are reported by the feeding pass.
pub fn measure_block_model(paths: &[PathBuf]) -> FirstPass {
    let files = paths
        .iter()
        .filter_map(|path| std::fs::File::open(path).ok());
    let records = files.flat_map(|file| Lines::new(gunzipped(file)).flatten());
    FirstPass::of(records)
}

/// A recording's reader, gzip undone as every reader undoes it (`input::decompressed`); a
/// stream that cannot even be started reads as empty, its error said by the read that follows.
fn gunzipped(file: std::fs::File) -> Box<dyn std::io::BufRead> {
    let reader = std::io::BufReader::with_capacity(1 << 18, file);
    input::decompressed(reader).unwrap_or_else(|e| Box::new(ErrorReader(Some(e))))
}

/// Reads as its one error, then as the end.
struct ErrorReader(Option<std::io::Error>);

impl std::io::Read for ErrorReader {
    fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
        self.0.take().map_or(Ok(0), Err)
    }
}

impl std::io::BufRead for ErrorReader {
    fn fill_buf(&mut self) -> std::io::Result<&[u8]> {
        match self.0.take() {
            Some(e) => Err(e),
            None => Ok(&[]),
        }
    }

    fn consume(&mut self, _: usize) {}
}

/// A file to read, not a directory (which `open` gives on Linux, and only reading refuses).
fn open_file(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    let file = std::fs::File::open(path)?;
    if file.metadata()?.is_dir() {
        return Err(std::io::Error::from(std::io::ErrorKind::IsADirectory));
    }
    Ok(file)
}

/// Gateway logs as records, in time order (several: each one's ids after the one before's),
/// their bad rows and whether they had timestamps described in `messages`.
fn read_logs(paths: &[PathBuf], messages: &mut Vec<String>) -> Result<Vec<Record>, Error> {
    let mut records: Vec<Record> = Vec::new();
    each_file(paths, messages, |name, reader, messages| {
        let mut log = input::gateway_log_records(reader, name, None);
        for row in &log.report.bad_rows {
            messages.push(format!("{name}:{}: {}", row.line, row.error));
        }
        if !log.timed && !log.records.is_empty() {
            messages.push(format!(
                "{name}: no timestamps: its rows replay in file order, one every {} s at ×1",
                input::UNTIMED_PACE_MS / 1000
            ));
        }
        let base = records.iter().map(|r| r.id).max().unwrap_or(0);
        for record in &mut log.records {
            record.id += base;
        }
        records.extend(log.records);
    })?;
    records.sort_by_key(|r| (r.t_start_ms, r.id));
    Ok(records)
}

/// Each of `paths` opened and gunzipped, given to `read` with its name; one that cannot be
/// opened is described in `messages`, and none opened at all is an error.
fn each_file(
    paths: &[PathBuf],
    messages: &mut Vec<String>,
    mut read: impl FnMut(&str, Box<dyn std::io::BufRead>, &mut Vec<String>),
) -> Result<(), Error> {
    let mut opened = 0;
    for path in paths {
        match input::open_decompressed(path) {
            Ok(reader) => {
                opened += 1;
                read(&path.display().to_string(), reader, messages);
            }
            Err(e) => messages.push(format!("cannot read {}: {e}", path.display())),
        }
    }
    if opened == 0 {
        return Err(Error::Unreadable(messages.join("; ")));
    }
    Ok(())
}

/// Logs: every record's status line, then the snapshot's summary (as `headless_records`).
fn headless_log(
    records: Vec<Record>,
    pacer: &Pacer,
    analysis: Config,
    out: &mut dyn Write,
) -> std::io::Result<u64> {
    let mut engine = Engine::new(analysis);
    engine.push(Input::BlockModel(Box::new(FirstPass::of(&records))));
    let mut read = 0;
    for record in records {
        if pacer.stop.load(Ordering::Relaxed) {
            break;
        }
        writeln!(out, "{}", record_line(&record))?;
        engine.push(Input::Record(Arc::new(record), 0));
        read += 1;
    }
    engine.push(Input::SourceDone);
    write!(
        out,
        "{}",
        prefixscope_core::text::printable(&engine.snapshot().summary())
    )?;
    Ok(read)
}

/// The summary a replay of `records` ends with (the live snapshot's: the analysis, the hit rate,
/// the fixes with their predicted savings), for a run that has its records in hand (`demo`).
pub fn summary_of(records: &[Record], analysis: Config) -> String {
    let mut engine = Engine::new(analysis);
    engine.push(Input::BlockModel(Box::new(FirstPass::of(records))));
    for record in records {
        engine.push(Input::Record(Arc::new(record.clone()), 0));
    }
    engine.push(Input::SourceDone);
    prefixscope_core::text::printable(&engine.snapshot().summary()).into_owned()
}

/// A trace's requests, in start order, and the bad rows skipped (each also described in
/// `messages`).
fn read_trace(
    paths: &[PathBuf],
    format: Format,
    messages: &mut Vec<String>,
) -> Result<(Vec<Request>, usize), Error> {
    let options = InputOptions::default();
    let mut requests = Vec::new();
    let mut bad = 0;
    each_file(paths, messages, |name, reader, messages| {
        let file = input::read(reader, name, format, &options);
        for row in &file.report.bad_rows {
            messages.push(format!("{name}:{}: {}", row.line, row.error));
        }
        for value in &file.report.bad_values {
            messages.push(format!("{name}: bad value: {value}"));
        }
        bad += file.report.bad_rows.len();
        requests.extend(file.requests);
    })?;
    requests.sort_by_key(|r| r.t_ms.unwrap_or(0));
    Ok((requests, bad))
}

/// A trace: one line per request, then the hit rates of a cold replay (the live engine's
/// snapshot, as the panes would show it).
fn headless_trace(
    requests: &[Request],
    format: Format,
    bad: usize,
    out: &mut dyn Write,
) -> std::io::Result<u64> {
    let mut engine = Engine::with_block_size(Config::default(), format.default_block_size());
    for (i, request) in requests.iter().enumerate() {
        writeln!(
            out,
            "#{} t {} ms  input {}  {}",
            i + 1,
            request.t_ms.unwrap_or(0),
            prefixscope_core::units::plural(request.input_tokens, "token"),
            prefixscope_core::units::plural(request.blocks.len() as u64, "block")
        )?;
        engine.push(Input::Request(Arc::new(request.clone()), 0));
    }
    engine.push(Input::SourceDone);
    let snapshot = engine.snapshot();
    if bad > 0 {
        writeln!(
            out,
            "{} skipped",
            prefixscope_core::units::plural(bad as u64, "bad row")
        )?;
    }
    if let Some(curve) = &snapshot.view.curve {
        let points: Vec<String> = curve
            .points
            .iter()
            .map(|(label, lru, _, _)| format!("{label} {:.1}%", lru * 100.0))
            .collect();
        writeln!(
            out,
            "{} of a {} input · {} · ceiling {:.1}% · LRU {}",
            prefixscope_core::units::plural(requests.len() as u64, "request"),
            format.as_str(),
            curve.label,
            curve.ceiling * 100.0,
            points.join(", ")
        )?;
    }
    Ok(requests.len() as u64)
}

/// Recordings: every record's status line as it is read, then the snapshot's summary.
/// Stopped (`Pacer::stop`, a signal), it ends with the summary of what was read.
fn headless_records(
    files: Vec<(PathBuf, std::fs::File)>,
    pacer: &Pacer,
    analysis: Config,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<u64> {
    let paths: Vec<PathBuf> = files.iter().map(|(p, _)| p.clone()).collect();
    let mut engine = Engine::new(analysis);
    engine.push(Input::BlockModel(Box::new(measure_block_model(&paths))));
    let (mut read, mut bad_lines) = (0, 0);
    for (path, file) in files {
        for item in Lines::new(gunzipped(file)) {
            if pacer.stop.load(Ordering::Relaxed) {
                break;
            }
            match item {
                Ok(record) => {
                    writeln!(out, "{}", record_line(&record))?;
                    engine.push(Input::Record(Arc::new(record), 0));
                    read += 1;
                }
                Err(bad) => {
                    writeln!(
                        err,
                        "prefixscope: {}:{}: {}",
                        path.display(),
                        bad.line,
                        bad.error
                    )?;
                    bad_lines += 1;
                }
            }
        }
    }
    engine.push(Input::SourceDone);
    if bad_lines > 0 {
        writeln!(
            out,
            "{} skipped",
            prefixscope_core::units::plural(bad_lines, "bad line")
        )?;
    }
    write!(
        out,
        "{}",
        prefixscope_core::text::printable(&engine.snapshot().summary())
    )?;
    Ok(read)
}

/// Feeds the engine at the recorded pace (or at once), and is the app's control of it.
pub struct Pacer {
    speed: AtomicU64,
    stop: AtomicBool,
    paced: bool,
    /// What the `e` key exports (read again from disk).
    pub files: Vec<PathBuf>,
    /// Feeding held (the TUI's `p` in a replay); `.` and `]` read on as a seek does.
    paused: AtomicBool,
    /// Records (or requests) sent so far, and the recorded time of the latest.
    sent: AtomicU64,
    last_due_ms: AtomicI64,
    /// A seek under way: feed at once, unpaced, until this many are sent (0: none) or until the
    /// first one due after this time (`NO_SEEK`: none); then hold.
    seek_records: AtomicU64,
    seek_until_ms: AtomicI64,
}

const NOTHING_SENT: i64 = i64::MIN;
const NO_SEEK: i64 = i64::MIN;

impl Pacer {
    /// `items`: each thing to send with the recorded time it is due at (`None`: nothing to send,
    /// e.g. a bad line already reported), in file order; a time before the previous one's is
    /// sent at once. Ends with the source's end.
    fn feed<T>(
        &self,
        items: impl Iterator<Item = (i64, Option<T>)>,
        inputs: &Sender<Input>,
        wrap: impl Fn(T, i64) -> Input,
    ) {
        // Recorded time `anchor.1 + elapsed * speed` is due at wall time `anchor.0`; a speed
        // change re-anchors at the current item so nothing jumps.
        let mut anchor: Option<(Instant, i64)> = None;
        let mut speed = f64::from_bits(self.speed.load(Ordering::Relaxed));
        for (due_ms, item) in items {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            let Some(item) = item else { continue };
            if self.seeking(due_ms) {
                // Sent at once; the pace goes on from here once the seek is done.
                anchor = Some((Instant::now(), due_ms));
            } else {
                if self.paced {
                    match anchor.as_mut() {
                        None => anchor = Some((Instant::now(), due_ms)),
                        Some(anchor) => self.wait_until(due_ms, anchor, &mut speed),
                    }
                }
                let mut resumed = false;
                // A seek asked for while waiting or held takes this record if it is in range,
                // else it ends here and the reading stays held.
                while !self.seeking(due_ms) {
                    resumed |= self.hold();
                    if !self.seek_asked() {
                        break;
                    }
                }
                if resumed || self.seek_asked() {
                    // The pace goes on from this record, nothing jumps.
                    anchor = Some((Instant::now(), due_ms));
                }
            }
            if inputs
                .send(wrap(item, crate::clock::wall_clock_ms()))
                .is_err()
            {
                return;
            }
            self.sent.fetch_add(1, Ordering::Relaxed);
            self.last_due_ms.fetch_max(due_ms, Ordering::Relaxed);
        }
        let _ = inputs.send(Input::SourceDone);
    }

    /// Whether a seek goes on to the record due at `due_ms`; ends the seek when it is reached.
    fn seeking(&self, due_ms: i64) -> bool {
        let records = self.seek_records.load(Ordering::Relaxed);
        if records > 0 {
            if self.sent.load(Ordering::Relaxed) < records {
                return true;
            }
            self.seek_records.store(0, Ordering::Relaxed);
        }
        let until = self.seek_until_ms.load(Ordering::Relaxed);
        if until != NO_SEEK {
            if due_ms <= until {
                return true;
            }
            self.seek_until_ms.store(NO_SEEK, Ordering::Relaxed);
        }
        false
    }

    fn seek_asked(&self) -> bool {
        self.seek_records.load(Ordering::Relaxed) > 0
            || self.seek_until_ms.load(Ordering::Relaxed) != NO_SEEK
    }

    /// Waits while feeding is paused and no step or seek is asked for; whether it waited.
    fn hold(&self) -> bool {
        let mut held = false;
        while self.paused.load(Ordering::Relaxed)
            && !self.stop.load(Ordering::Relaxed)
            && !self.seek_asked()
        {
            held = true;
            std::thread::sleep(Duration::from_millis(20));
        }
        held
    }

    /// Sleeps until recorded time `due_ms` is due, in short steps so speed changes and
    /// quitting take effect at once.
    fn wait_until(&self, due_ms: i64, anchor: &mut (Instant, i64), speed: &mut f64) {
        loop {
            let now_speed = f64::from_bits(self.speed.load(Ordering::Relaxed));
            if now_speed != *speed {
                let recorded_now =
                    anchor.1 as f64 + anchor.0.elapsed().as_secs_f64() * 1000.0 * *speed;
                *anchor = (Instant::now(), recorded_now as i64);
                *speed = now_speed;
            }
            let wait_ms =
                (due_ms - anchor.1) as f64 / *speed - anchor.0.elapsed().as_secs_f64() * 1000.0;
            if wait_ms <= 0.0 || self.stop.load(Ordering::Relaxed) || self.seek_asked() {
                return;
            }
            std::thread::sleep(Duration::from_secs_f64(wait_ms.min(100.0) / 1000.0));
        }
    }
}

impl Pacer {
    pub fn set_speed(&self, speed: f64) {
        self.speed.store(speed.to_bits(), Ordering::Relaxed);
    }

    /// Stops feeding (quitting).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Holds feeding (`true`) or lets it go on.
    pub fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// While paused: `records` more at once, unpaced (a seek that many records on, added to
    /// any still under way), then held again.
    pub fn step(&self, records: u64) {
        let from = self.seek_records.load(Ordering::Relaxed).max(self.sent());
        self.paused.store(true, Ordering::Relaxed);
        self.seek_records
            .store(from.saturating_add(records), Ordering::Relaxed);
    }

    /// Records (or requests) sent to the engine so far.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Reads on at once to `to`, then holds the reading there (as `p` does); forward only.
    /// What to say, or why not.
    pub fn seek(&self, to: Seek) -> Result<String, String> {
        let sent = self.sent();
        let last = self.last_due_ms.load(Ordering::Relaxed);
        let clock = |ms: i64| {
            let s = ms.div_euclid(1000).rem_euclid(86_400);
            format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
        };
        let until = match to {
            Seek::Record(n) if n <= sent => {
                return Err(format!(
                    "record {n} is already read ({sent} so far): seek goes forward only"
                ));
            }
            Seek::Record(n) => {
                self.paused.store(true, Ordering::Relaxed);
                self.seek_records.store(n, Ordering::Relaxed);
                return Ok(format!("reading on to record {n}, then paused"));
            }
            _ if last == NOTHING_SENT => {
                return Err("no record read yet: seek to a record number".into());
            }
            Seek::TimeOfDay(ms) => last - last.rem_euclid(86_400_000) + ms,
            Seek::Ahead(ms) => last.saturating_add(ms),
        };
        if until <= last {
            return Err(format!(
                "{} is not after the latest record read ({}): seek goes forward only",
                clock(until),
                clock(last)
            ));
        }
        self.paused.store(true, Ordering::Relaxed);
        self.seek_until_ms.store(until, Ordering::Relaxed);
        Ok(format!(
            "reading on to the records of {} and before, then paused",
            clock(until)
        ))
    }
}

impl crate::tui::Control for Pacer {
    fn set_speed(&self, speed: f64) {
        Pacer::set_speed(self, speed);
    }

    fn stop(&self) {
        Pacer::stop(self);
    }

    fn pause_source(&self, paused: bool) -> bool {
        Pacer::pause(self, paused);
        true
    }

    fn step_source(&self, records: u64) {
        Pacer::step(self, records);
    }

    fn seek_source(&self, to: Seek) -> Result<String, String> {
        Pacer::seek(self, to)
    }

    fn export(&self, format: &str, path: &str) -> Result<String, String> {
        super::export::export_files(&self.files, format, path)
    }
}
