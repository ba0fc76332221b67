//! The recorder thread: turns captures into records, writes their lines (what is waiting in one
//! write, straight to the file), and hands each record to the other consumers.
//!
//! It is the only part allowed to hold traffic back: its input channel is bounded, and the proxy
//! makes the next request on a connection wait while it is full. Consumers get a channel each and
//! are never waited for: an unbounded one lags behind, a bounded one (the metrics endpoint's) is
//! skipped while it is full, counted in `consumer_records_skipped`. A write error (a full disk) is
//! counted and shown; records keep flowing to consumers and the proxy keeps forwarding.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use prefixscope_core::capture::{BodyMode, Capture, apply_mode, build_record};
use prefixscope_core::limits::MAX_LINE_BYTES;
use prefixscope_core::output_file::create_new_private;
use prefixscope_core::record::{ExchangeError, Record, record_line};

/// Captures waiting to be recorded before the proxy holds the next request back.
pub const RECORDER_QUEUE: usize = 1024;

/// Captures recorded together at most: the lines of those already waiting go out in one write
/// (nothing waits to fill a batch), and their records to the consumers after it.
pub const RECORDER_BATCH: usize = 64;

/// Body bytes a batch takes at most (with its one record past it): large bodies are written
/// and handed on one by one instead of held together, their lines and records at once.
pub const RECORDER_BATCH_BYTES: u64 = 8 << 20;

/// How long the recorder lets captures gather after a batch that did not fill.
pub const RECORDER_LINGER: std::time::Duration = std::time::Duration::from_micros(500);

/// Who gets the recorder's records, and which.
pub struct Consumer {
    sender: Sender<Arc<Record>>,
    probes_only: bool,
    /// Told of every record the consumer takes, sent or skipped (a bounded consumer's raw
    /// counts then equal the records written even while its analysis falls behind).
    tally: Option<Tally>,
}

/// A count kept of every record a consumer takes, on the recorder's thread: it must be cheap.
pub type Tally = Arc<dyn Fn(&Record) + Send + Sync>;

impl Consumer {
    /// Only the records of the upstream probes (`record -q`'s status thread: it reads the
    /// server's answers and prints nothing per record, so every other record would be sent,
    /// received and freed on its thread for nothing).
    pub fn probes_only(sender: Sender<Arc<Record>>) -> Consumer {
        Consumer {
            sender,
            probes_only: true,
            tally: None,
        }
    }

    /// Every record, with `tally` told of each one, including those skipped while the channel
    /// is full.
    pub fn counted(sender: Sender<Arc<Record>>, tally: Tally) -> Consumer {
        Consumer {
            sender,
            probes_only: false,
            tally: Some(tally),
        }
    }

    fn takes(&self, record: &Record) -> bool {
        !self.probes_only || record.probe
    }
}

impl From<Sender<Arc<Record>>> for Consumer {
    fn from(sender: Sender<Arc<Record>>) -> Consumer {
        Consumer {
            sender,
            probes_only: false,
            tally: None,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct RecorderConfig {
    /// `None`: records go to consumers only.
    pub path: Option<PathBuf>,
    pub mode: BodyMode,
    /// Start a new file before one would grow past this many bytes.
    pub max_size: Option<u64>,
    /// Captures that may wait before the proxy holds requests back; default `RECORDER_QUEUE`.
    pub queue: Option<usize>,
}

/// Live counters, shared with whoever shows status.
#[derive(Debug, Default)]
pub struct RecorderStats {
    pub records: AtomicU64,
    pub written: AtomicU64,
    pub bytes_written: AtomicU64,
    pub write_errors: AtomicU64,
    /// Records written without their bodies: with them the line would pass
    /// `limits::MAX_LINE_BYTES`, which no reader takes.
    pub bodies_dropped: AtomicU64,
    /// Records the enrichment (the token layout) was skipped for because captures were
    /// waiting: it must never make the queue fill and the proxy wait.
    pub not_enriched: AtomicU64,
    /// When the session began to stop: what is still queued is enriched for
    /// `STOP_ENRICH_BUDGET` more (the last turns of a session keep the server's layout), then
    /// written without it, so a stop never waits on a server's answers record by record.
    pub stopping: std::sync::OnceLock<std::time::Instant>,
    pub last_error: Mutex<Option<String>>,
    pub files: Mutex<Vec<PathBuf>>,
    /// Captures waiting for the recorder, as it last saw its queue (`--metrics`).
    pub queued: AtomicU64,
    /// Records a bounded consumer (the `--metrics` endpoint's analysis) did not get: it was that
    /// far behind.
    pub consumer_records_skipped: AtomicU64,
}

impl RecorderStats {
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|e| e.clone())
    }

    pub fn files(&self) -> Vec<PathBuf> {
        self.files.lock().map(|f| f.clone()).unwrap_or_default()
    }
}

pub struct Recorder<B> {
    sender: Option<Sender<Capture<B>>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<RecorderStats>,
}

/// Where the proxy hands captures. Cheap to clone.
pub struct CaptureSender<B> {
    sender: Sender<Capture<B>>,
}

impl<B> Clone for CaptureSender<B> {
    fn clone(&self) -> Self {
        CaptureSender {
            sender: self.sender.clone(),
        }
    }
}

impl<B> CaptureSender<B> {
    /// Hands the capture over if there is room; gives it back if the recorder is behind.
    pub fn try_send(&self, capture: Capture<B>) -> Option<Capture<B>> {
        match self.sender.try_send(capture) {
            Ok(()) => None,
            Err(TrySendError::Full(c)) => Some(c),
            // The recorder is gone only after shutdown; nothing is left to record into.
            Err(TrySendError::Disconnected(_)) => None,
        }
    }

    /// Waits for room. Call it off the async runtime.
    pub fn send_blocking(&self, capture: Capture<B>) {
        let _ = self.sender.send(capture);
    }
}

/// Work done on each record on the recorder's thread, before it is written and handed on (the
/// token layout of `tokenize::LiveLayout`): the record in full, digested after it if the mode
/// says so.
pub trait Enrichment: Send {
    fn enrich(&mut self, record: &mut Record);

    /// False once it will never change a record again (the layout stopped: the server has no
    /// `/apply-template`): records are then built as the mode says, and none is counted as
    /// skipped.
    fn active(&self) -> bool {
        true
    }
}

impl<F: FnMut(&mut Record) + Send> Enrichment for F {
    fn enrich(&mut self, record: &mut Record) {
        self(record)
    }
}

pub type Enrich = Box<dyn Enrichment>;

/// How long a stop goes on enriching what is queued: the layout of a local llama.cpp takes
/// 20 ms (1,000 tokens) to 350 ms (26,000) a record (BENCHMARKS.md), so the last turns of a
/// session keep the server's counts, and a server that does not answer delays a stop by one
/// request's timeout at most.
pub const STOP_ENRICH_BUDGET: std::time::Duration = std::time::Duration::from_secs(1);

/// Captures waiting past which the enrichment is skipped (counted in `not_enriched`), well below
/// the queue's size, so the work it does on the recorder's thread never holds the proxy back.
pub const ENRICH_BACKLOG: usize = 32;

impl<B: AsRef<[u8]> + Send + 'static> Recorder<B> {
    /// Opens the first file (mode 0600: recordings hold prompts) and starts the thread.
    pub fn start(
        config: RecorderConfig,
        consumers: Vec<impl Into<Consumer>>,
    ) -> io::Result<Recorder<B>> {
        Recorder::start_enriched(config, consumers, None)
    }

    /// `start`, with `enrich` run on every record.
    pub fn start_enriched(
        config: RecorderConfig,
        consumers: Vec<impl Into<Consumer>>,
        enrich: Option<Enrich>,
    ) -> io::Result<Recorder<B>> {
        let consumers: Vec<Consumer> = consumers.into_iter().map(Into::into).collect();
        let stats = Arc::new(RecorderStats::default());
        let writer = match &config.path {
            Some(path) => Some(RotatingWriter::open(
                path.clone(),
                config.max_size,
                Arc::clone(&stats),
            )?),
            None => None,
        };
        let (sender, receiver) =
            crossbeam_channel::bounded(config.queue.unwrap_or(RECORDER_QUEUE).max(1));
        let thread_stats = Arc::clone(&stats);
        let mode = config.mode;
        let thread = std::thread::Builder::new()
            .name("prefixscope-recorder".into())
            .spawn(move || run(receiver, writer, mode, enrich, consumers, thread_stats))?;
        Ok(Recorder {
            sender: Some(sender),
            thread: Some(thread),
            stats,
        })
    }

    pub fn sender(&self) -> CaptureSender<B> {
        CaptureSender {
            // Present until `finish`, which takes `self`.
            sender: self
                .sender
                .clone()
                .unwrap_or_else(|| crossbeam_channel::bounded(0).0),
        }
    }

    pub fn stats(&self) -> Arc<RecorderStats> {
        Arc::clone(&self.stats)
    }

    /// Records everything already handed over, then stops. Senders handed out must be dropped
    /// first, or this waits for them.
    /// Stops: what is still queued is enriched for `STOP_ENRICH_BUDGET`, the rest written
    /// without it (`RecorderStats::stopping`); the thread ends once every sender is gone.
    pub fn finish(self) -> Arc<RecorderStats> {
        let _ = self.stats.stopping.set(std::time::Instant::now());
        self.finish_enriched()
    }

    /// `finish`, with what is still queued enriched as before (the demo's simulated server
    /// answers its layout at once; a real server may not, which is why `finish` does not).
    pub fn finish_enriched(mut self) -> Arc<RecorderStats> {
        self.sender = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        Arc::clone(&self.stats)
    }
}

impl<B> Drop for Recorder<B> {
    fn drop(&mut self) {
        self.sender = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn run<B: AsRef<[u8]>>(
    receiver: Receiver<Capture<B>>,
    mut writer: Option<RotatingWriter>,
    mode: BodyMode,
    mut enrich: Option<Enrich>,
    consumers: Vec<Consumer>,
    stats: Arc<RecorderStats>,
) {
    let mut batch: Vec<Record> = Vec::with_capacity(RECORDER_BATCH);
    while let Ok(first) = receiver.recv() {
        // What is already waiting goes out in one write: one system call (and, on ext4, one
        // partial block zeroed) for many records under load, and still one record per write
        // when they come one by one.
        let mut next = Some(first);
        let mut taken = 0;
        let mut batch_bytes = 0u64;
        while let Some(capture) = next.take() {
            taken += 1;
            let record = recorded(capture, &receiver, mode, enrich.as_mut(), &stats);
            batch_bytes +=
                record.request.body_bytes + record.response.as_ref().map_or(0, |r| r.body_bytes);
            if let Some(writer) = writer.as_mut() {
                let (line, dropped) = line_within(&record, MAX_LINE_BYTES);
                if dropped {
                    stats.bodies_dropped.fetch_add(1, Ordering::Relaxed);
                }
                writer.push_line(&line);
            }
            stats.records.fetch_add(1, Ordering::Relaxed);
            batch.push(record);
            if taken < RECORDER_BATCH && batch_bytes < RECORDER_BATCH_BYTES {
                next = receiver.try_recv().ok();
            }
        }
        if let Some(writer) = writer.as_mut() {
            writer.write_pending();
        }
        for record in batch.drain(..) {
            hand_on(record, &consumers, &stats);
        }
        // Let the next captures gather instead of waking for each: under load one write (and
        // one wake-up of this thread) serves many records, where a proxy thread paid a wake-up
        // per exchange. Nothing waits on it: the proxy's hand-over never blocks while the queue
        // has room, and a record is late by at most this. A full batch means a backlog: no
        // pause then, so the queue drains at full speed.
        if taken < RECORDER_BATCH {
            std::thread::sleep(RECORDER_LINGER);
        }
    }
}

/// The capture's record, laid out by `enrich` unless captures are waiting.
fn recorded<B: AsRef<[u8]>>(
    capture: Capture<B>,
    receiver: &Receiver<Capture<B>>,
    mode: BodyMode,
    enrich: Option<&mut Enrich>,
    stats: &RecorderStats,
) -> Record {
    let waiting = receiver.len();
    stats.queued.store(waiting as u64, Ordering::Relaxed);
    let out_of_time = stats
        .stopping
        .get()
        .is_some_and(|since| since.elapsed() > STOP_ENRICH_BUDGET);
    let behind = waiting > ENRICH_BACKLOG || out_of_time;
    let enrich = enrich.filter(|e| e.active());
    if behind && enrich.is_some() {
        stats.not_enriched.fetch_add(1, Ordering::Relaxed);
    }
    match enrich.filter(|_| !behind) {
        Some(enrich) => {
            let mut record = build_record(capture, BodyMode::Full);
            enrich.enrich(&mut record);
            apply_mode(&mut record, mode);
            record
        }
        None => build_record(capture, mode),
    }
}

/// Sends the record to each consumer that takes it, never waiting; a record no one takes is
/// freed here, on the thread that built it.
fn hand_on(record: Record, consumers: &[Consumer], stats: &RecorderStats) {
    if !consumers.iter().any(|c| c.takes(&record)) {
        return;
    }
    let record = Arc::new(record);
    for consumer in consumers.iter().filter(|c| c.takes(&record)) {
        if let Some(tally) = &consumer.tally {
            tally(&record);
        }
        if let Err(TrySendError::Full(_)) = consumer.sender.try_send(Arc::clone(&record)) {
            stats
                .consumer_records_skipped
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The line of `record`, `\n` included, of at most `max` bytes before the `\n`: a record past
/// it (both bodies near `--max-body`) is written without its bodies, as `body_too_large`, so
/// every line we write reads back. Consumers still get the whole record.
fn line_within(record: &Record, max: usize) -> (Vec<u8>, bool) {
    let line = record_line(record);
    if line.len() <= max.saturating_add(1) {
        return (line, false);
    }
    drop(line);
    let mut slim = record.clone();
    slim.request.body = None;
    slim.request.body_text = None;
    if let Some(response) = slim.response.as_mut() {
        response.body = None;
        response.body_text = None;
        response.truncated = true;
    }
    slim.error = slim.error.or(Some(ExchangeError::BodyTooLarge));
    (record_line(&slim), true)
}

struct RotatingWriter {
    base: PathBuf,
    max_size: Option<u64>,
    file: File,
    /// The file being written (`base`, then `NAME.N.EXT`).
    current: PathBuf,
    size: u64,
    index: u32,
    /// The last write failed part-way: start the next line on a fresh line.
    partial: bool,
    /// Lines waiting for the next write, and where each ends in it.
    pending: Vec<u8>,
    pending_ends: Vec<usize>,
    stats: Arc<RecorderStats>,
}

/// Rotation skips at most this many taken names before it gives up (and keeps writing the
/// current file).
const MAX_TAKEN_NAMES: u32 = 1000;

impl RotatingWriter {
    fn open(
        base: PathBuf,
        max_size: Option<u64>,
        stats: Arc<RecorderStats>,
    ) -> io::Result<RotatingWriter> {
        let file = open_recording(&base)?;
        if let Ok(mut files) = stats.files.lock() {
            files.push(base.clone());
        }
        Ok(RotatingWriter {
            current: base.clone(),
            base,
            max_size,
            file,
            size: 0,
            index: 0,
            partial: false,
            pending: Vec::new(),
            pending_ends: Vec::new(),
            stats,
        })
    }

    /// Adds a line to the next write; a line that would take the file past `--max-size`
    /// writes what is pending and starts the next file first.
    fn push_line(&mut self, line: &[u8]) {
        let size = self.size + self.pending.len() as u64;
        if let Some(max) = self.max_size
            && size > 0
            && size + line.len() as u64 > max
        {
            self.write_pending();
            self.rotate();
        }
        self.pending.extend_from_slice(line);
        self.pending_ends.push(self.pending.len());
    }

    /// Writes the pending lines in one write where the kernel takes it. On an error, the lines
    /// wholly written count as written and the rest as not; a line cut part-way makes the next
    /// write start on a fresh line.
    fn write_pending(&mut self) {
        if self.pending_ends.is_empty() {
            return;
        }
        let mut result = Ok(());
        if self.partial {
            result = self.file.write_all(b"\n");
        }
        let mut done = 0;
        if result.is_ok() {
            (done, result) = write_counting(&mut self.file, &self.pending);
        }
        let (whole, written_bytes) = whole_lines(&self.pending_ends, done);
        self.size += done as u64;
        self.stats
            .written
            .fetch_add(whole as u64, Ordering::Relaxed);
        self.stats
            .bytes_written
            .fetch_add(written_bytes as u64, Ordering::Relaxed);
        match result {
            Ok(()) => self.partial = false,
            Err(e) => {
                // Cut inside a line, or unknown after the fresh-line write failed.
                self.partial = done != written_bytes || done == 0;
                let failed = self.pending_ends.len() - whole;
                self.stats
                    .write_errors
                    .fetch_add(failed as u64, Ordering::Relaxed);
                if let Ok(mut last) = self.stats.last_error.lock() {
                    *last = Some(format!("{}: {e}", self.current.display()));
                }
            }
        }
        self.pending.clear();
        self.pending_ends.clear();
    }

    /// The next free `NAME.N.EXT`, created new (`O_EXCL | O_NOFOLLOW`, 0600): a name already
    /// taken (another process made it since the start's check) is skipped, never appended to.
    fn rotate(&mut self) {
        let mut error = None;
        for index in self.index + 1..=self.index.saturating_add(MAX_TAKEN_NAMES) {
            let next = rotated_path(&self.base, index);
            match create_new_private(&next) {
                Ok(file) => {
                    self.index = index;
                    self.file = file;
                    self.current = next.clone();
                    self.size = 0;
                    self.partial = false;
                    if let Ok(mut files) = self.stats.files.lock() {
                        files.push(next);
                    }
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => error = Some((next, e)),
                Err(e) => {
                    error = Some((next, e));
                    break;
                }
            }
        }
        // Keep writing to the current file: an oversized file beats a lost record.
        self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
        if let (Ok(mut last), Some((next, e))) = (self.stats.last_error.lock(), error) {
            *last = Some(format!("cannot rotate to {}: {e}", next.display()));
        }
    }
}

/// Of lines ending at `ends` (offsets in one buffer), how many lie wholly within its first
/// `done` bytes, and how many bytes they make.
fn whole_lines(ends: &[usize], done: usize) -> (usize, usize) {
    let whole = ends.partition_point(|&end| end <= done);
    (whole, ends[..whole].last().copied().unwrap_or(0))
}

/// Writes `bytes` until done or an error, and says how many went out (`write_all` would not).
fn write_counting(out: &mut impl Write, bytes: &[u8]) -> (usize, io::Result<()>) {
    let mut done = 0;
    while done < bytes.len() {
        match out.write(&bytes[done..]) {
            Ok(0) => return (done, Err(io::Error::from(io::ErrorKind::WriteZero))),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (done, Err(e)),
        }
    }
    (done, Ok(()))
}

/// `rec.jsonl`, then `rec.1.jsonl`, `rec.2.jsonl`…
pub fn rotated_path(base: &Path, index: u32) -> PathBuf {
    if index == 0 {
        return base.to_path_buf();
    }
    let (stem, ext) = stem_and_extension(base);
    let name = match ext {
        Some(ext) => format!("{stem}.{index}.{ext}"),
        None => format!("{stem}.{index}"),
    };
    base.with_file_name(name)
}

fn stem_and_extension(base: &Path) -> (String, Option<String>) {
    let stem = base
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ext = base.extension().map(|e| e.to_string_lossy().into_owned());
    (stem, ext)
}

/// An earlier run's rotated file beside `base` (`NAME.N.EXT`, any N), if there is one: a new
/// recording that rotates would otherwise sit among another run's files.
pub fn rotation_leftover(base: &Path) -> Option<PathBuf> {
    let (stem, ext) = stem_and_extension(base);
    let dir = match base.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let suffix = ext.map(|e| format!(".{e}")).unwrap_or_default();
    std::fs::read_dir(dir).ok()?.find_map(|entry| {
        let name = entry.ok()?.file_name().to_string_lossy().into_owned();
        let middle = name
            .strip_prefix(&format!("{stem}."))?
            .strip_suffix(&suffix)?;
        (!middle.is_empty() && middle.bytes().all(|b| b.is_ascii_digit())).then(|| dir.join(&name))
    })
}

/// The first file of a recording: created new (`O_EXCL | O_NOFOLLOW`, 0600), so an existing
/// file (an earlier run's recording, even empty) or a symlink is refused. A device or FIFO
/// (`/dev/null`, `/dev/full`) is written as it is: it holds no earlier run.
fn open_recording(path: &Path) -> io::Result<File> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        let kind = meta.file_type();
        if !kind.is_file() && !kind.is_symlink() && !kind.is_dir() {
            return OpenOptions::new().write(true).open(path);
        }
    }
    create_new_private(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn capture(id: u64) -> Capture {
        Capture {
            id,
            conn: 1,
            t_start_ms: 1,
            t_first_byte_ms: None,
            t_end_ms: 2,
            method: "GET".into(),
            path: "/health".into(),
            request_headers: BTreeMap::new(),
            request_body_bytes: 0,
            request_body: Some(Vec::new()),
            response: None,
            error: None,
            probe: false,
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "prefixscope-recorder-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn writes_every_record_with_mode_0600_and_feeds_consumers() {
        let dir = temp_dir("basic");
        let path = dir.join("rec.jsonl");
        let (tx, rx) = crossbeam_channel::unbounded();
        let recorder = Recorder::start(
            RecorderConfig {
                path: Some(path.clone()),
                ..Default::default()
            },
            vec![tx],
        )
        .unwrap();
        let sender = recorder.sender();
        for id in 1..=5 {
            sender.send_blocking(capture(id));
        }
        drop(sender);
        let stats = recorder.finish();
        assert_eq!(stats.written.load(Ordering::Relaxed), 5);
        assert_eq!(rx.try_iter().count(), 5);
        let read = prefixscope_core::record::read_jsonl(std::io::BufReader::new(
            File::open(&path).unwrap(),
        ));
        assert_eq!(read.records.len(), 5);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
    }

    /// The `--metrics` endpoint's raw counters equal the records written even when its
    /// analysis falls behind and the recorder skips it: the tally is told of every record.
    #[test]
    fn a_counted_consumer_counts_the_records_it_was_not_sent() {
        let (tx, rx) = crossbeam_channel::bounded(2);
        let told = Arc::new(AtomicU64::new(0));
        let tally = Arc::clone(&told);
        let counted = Consumer::counted(
            tx,
            Arc::new(move |_: &Record| {
                tally.fetch_add(1, Ordering::Relaxed);
            }),
        );
        let recorder: Recorder<Vec<u8>> =
            Recorder::start(RecorderConfig::default(), vec![counted]).unwrap();
        let sender = recorder.sender();
        for id in 1..=10 {
            sender.send_blocking(capture(id));
        }
        drop(sender);
        let stats = recorder.finish();
        assert_eq!(rx.try_iter().count(), 2);
        assert_eq!(stats.consumer_records_skipped.load(Ordering::Relaxed), 8);
        assert_eq!(told.load(Ordering::Relaxed), 10);
    }

    /// The test's side of a gate that holds the recorder inside one record's enrichment.
    struct Gate {
        started: Receiver<()>,
        release: Sender<()>,
    }

    /// The enrichment's side: `hold` says it started and waits to be let go.
    struct Held {
        started: Sender<()>,
        held: Receiver<()>,
    }

    impl Held {
        fn hold(&self) {
            let _ = self.started.send(());
            let _ = self.held.recv();
        }
    }

    fn gate() -> (Gate, Held) {
        let (release, held) = crossbeam_channel::bounded::<()>(0);
        let (started, started_rx) = crossbeam_channel::bounded::<()>(1);
        (
            Gate {
                started: started_rx,
                release,
            },
            Held { started, held },
        )
    }

    /// Sends capture `first`, waits until its enrichment holds the recorder, queues `rest`
    /// behind it, lets it go, and finishes.
    fn record_behind_a_held_first(
        recorder: Recorder<Vec<u8>>,
        gate: Gate,
        first: u64,
        rest: std::ops::RangeInclusive<u64>,
    ) -> Arc<RecorderStats> {
        let sender = recorder.sender();
        sender.send_blocking(capture(first));
        gate.started.recv().unwrap();
        let count = 1 + rest.clone().count() as u64;
        for id in rest {
            sender.send_blocking(capture(id));
        }
        let _ = gate.release.send(());
        drop(sender);
        // Everything recorded before the stop, which would skip the enrichment of what waits.
        while recorder.stats.records.load(Ordering::Relaxed) < count {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        recorder.finish()
    }

    #[test]
    fn enrichment_runs_on_each_record_and_is_skipped_while_captures_wait() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (gate, held) = gate();
        let enrich: Enrich = Box::new(move |record: &mut Record| {
            if record.id == 1 {
                // The first record's enrichment is slow: the others pile up meanwhile.
                held.hold();
            }
            record.tokens = Some(prefixscope_core::record::TokenCounts::default());
        });
        let recorder: Recorder<Vec<u8>> =
            Recorder::start_enriched(RecorderConfig::default(), vec![tx], Some(enrich)).unwrap();
        let waiting = ENRICH_BACKLOG as u64 + 10;
        let stats = record_behind_a_held_first(recorder, gate, 1, 2..=1 + waiting);
        let records: Vec<Arc<Record>> = rx.try_iter().collect();
        assert_eq!(records.len() as u64, 1 + waiting);
        let enriched = records.iter().filter(|r| r.tokens.is_some()).count() as u64;
        let skipped = stats.not_enriched.load(Ordering::Relaxed);
        assert!(records[0].tokens.is_some());
        assert_eq!(enriched + skipped, 1 + waiting);
        // Those that found more than ENRICH_BACKLOG waiting behind them went unenriched; the
        // last ones, with the queue drained, were enriched again.
        assert!(skipped >= waiting - ENRICH_BACKLOG as u64 - 1, "{skipped}");
        assert!(records.last().is_some_and(|r| r.tokens.is_some()));
    }

    #[test]
    fn rotates_before_a_file_would_pass_max_size() {
        let dir = temp_dir("rotate");
        let path = dir.join("rec.jsonl");
        let line = record_line(&build_record(capture(1), BodyMode::Full)).len() as u64;
        let config = RecorderConfig {
            path: Some(path.clone()),
            max_size: Some(line * 2),
            ..Default::default()
        };
        let recorder: Recorder<Vec<u8>> = Recorder::start(config, Vec::<Consumer>::new()).unwrap();
        let sender = recorder.sender();
        for id in 1..=5 {
            sender.send_blocking(capture(id));
        }
        drop(sender);
        let stats = recorder.finish();
        assert_eq!(
            stats.files(),
            vec![
                path.clone(),
                dir.join("rec.1.jsonl"),
                dir.join("rec.2.jsonl")
            ]
        );
        let sizes: Vec<u64> = stats
            .files()
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .collect();
        assert_eq!(sizes, vec![line * 2, line * 2, line]);
    }

    #[test]
    fn rotation_never_writes_into_a_file_it_did_not_create() {
        let dir = temp_dir("rotate-old");
        let path = dir.join("rec.jsonl");
        let line = record_line(&build_record(capture(1), BodyMode::Full)).len() as u64;
        let config = RecorderConfig {
            path: Some(path.clone()),
            max_size: Some(line),
            ..Default::default()
        };
        let recorder: Recorder<Vec<u8>> = Recorder::start(config, Vec::<Consumer>::new()).unwrap();
        // Made after the start (another run, a race): an old file and a symlink to one.
        std::fs::write(dir.join("rec.1.jsonl"), "an earlier run\n").unwrap();
        let elsewhere = dir.join("unrelated.txt");
        std::fs::write(&elsewhere, "not a recording\n").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(&elsewhere, dir.join("rec.2.jsonl")).unwrap();
        let sender = recorder.sender();
        for id in 1..=2 {
            sender.send_blocking(capture(id));
        }
        drop(sender);
        let stats = recorder.finish();
        assert_eq!(stats.write_errors.load(Ordering::Relaxed), 0);
        let expected_second = if cfg!(unix) {
            "rec.3.jsonl"
        } else {
            "rec.2.jsonl"
        };
        assert_eq!(stats.files(), vec![path.clone(), dir.join(expected_second)]);
        assert_eq!(
            std::fs::read_to_string(dir.join("rec.1.jsonl")).unwrap(),
            "an earlier run\n"
        );
        assert_eq!(
            std::fs::read_to_string(&elsewhere).unwrap(),
            "not a recording\n"
        );
        assert_eq!(
            std::fs::metadata(dir.join(expected_second)).unwrap().len(),
            line
        );
        // A leftover beside the base is found, whatever its number.
        let leftover = rotation_leftover(&path).unwrap();
        let name = leftover.file_name().unwrap().to_string_lossy().into_owned();
        assert!(["rec.1.jsonl", "rec.2.jsonl", "rec.3.jsonl"].contains(&name.as_str()));
        assert!(rotation_leftover(&dir.join("other.jsonl")).is_none());
    }

    #[test]
    fn a_recording_is_never_an_existing_file_or_a_symlink() {
        let dir = temp_dir("existing");
        let empty = dir.join("empty.jsonl");
        std::fs::write(&empty, "").unwrap();
        let start = |path: &Path| {
            Recorder::<Vec<u8>>::start(
                RecorderConfig {
                    path: Some(path.to_path_buf()),
                    ..Default::default()
                },
                Vec::<Consumer>::new(),
            )
        };
        assert!(start(&empty).is_err_and(|e| e.kind() == io::ErrorKind::AlreadyExists));
        #[cfg(unix)]
        {
            let target = dir.join("target.txt");
            let link = dir.join("link.jsonl");
            std::os::unix::fs::symlink(&target, &link).unwrap();
            assert!(start(&link).is_err());
            assert!(!target.exists());
        }
    }

    #[test]
    fn a_record_past_the_line_bound_is_written_without_its_bodies() {
        let mut big = capture(7);
        big.path = "/v1/chat/completions".into();
        big.request_body = Some(
            serde_json::to_vec(
                &serde_json::json!({"messages": [{"role": "user", "content": "x".repeat(4000)}]}),
            )
            .unwrap(),
        );
        big.request_body_bytes = 4100;
        let record = build_record(big, BodyMode::Full);
        let (line, dropped) = line_within(&record, 1 << 20);
        assert!(!dropped);
        assert_eq!(line, record_line(&record));
        let (line, dropped) = line_within(&record, 1000);
        assert!(dropped);
        assert!(line.len() < 1000, "{}", line.len());
        let read = prefixscope_core::record::read_jsonl(line.as_slice());
        let slim = &read.records[0];
        assert_eq!(slim.request.body, None);
        assert_eq!(slim.request.body_bytes, 4100);
        assert_eq!(slim.error, Some(ExchangeError::BodyTooLarge));
    }

    /// Takes `room` bytes, at most `step` a call, then fails as a full disk does.
    struct FillingUp {
        taken: Vec<u8>,
        room: usize,
        step: usize,
    }

    impl Write for FillingUp {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let n = bytes.len().min(self.step).min(self.room - self.taken.len());
            if n == 0 {
                return Err(io::Error::from(io::ErrorKind::StorageFull));
            }
            self.taken.extend_from_slice(&bytes[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_write_cut_part_way_counts_the_lines_wholly_written() {
        let lines = b"aaaa\nbbbb\ncccc\n";
        let ends = [5, 10, 15];
        let mut out = FillingUp {
            taken: Vec::new(),
            room: 12,
            step: 3,
        };
        let (done, result) = write_counting(&mut out, lines);
        assert_eq!(done, 12);
        assert!(result.is_err_and(|e| e.kind() == io::ErrorKind::StorageFull));
        assert_eq!(out.taken, b"aaaa\nbbbb\ncc");
        // Two lines whole (10 bytes); the third cut, so the next write starts a fresh line.
        assert_eq!(whole_lines(&ends, done), (2, 10));
        assert_eq!(whole_lines(&ends, 10), (2, 10));
        assert_eq!(whole_lines(&ends, 0), (0, 0));
        assert_eq!(whole_lines(&ends, 15), (3, 15));
        let mut roomy = FillingUp {
            taken: Vec::new(),
            room: 100,
            step: 4,
        };
        assert_eq!(write_counting(&mut roomy, lines).0, 15);
        assert_eq!(roomy.taken, lines);
    }

    #[test]
    fn waiting_captures_are_written_together_in_order_and_rotate_between_lines() {
        // The first record's enrichment holds the recorder while 40 more captures queue: they
        // go out in batches, still one whole line each, in order, across rotated files. (Ids
        // of two digits: every line is as long.)
        let dir = temp_dir("batch");
        let path = dir.join("rec.jsonl");
        let line = record_line(&build_record(capture(10), BodyMode::Full)).len() as u64;
        let (gate, held) = gate();
        let enrich: Enrich = Box::new(move |record: &mut Record| {
            if record.id == 10 {
                held.hold();
            }
        });
        let (tx, rx) = crossbeam_channel::unbounded();
        let config = RecorderConfig {
            path: Some(path.clone()),
            max_size: Some(line * 16),
            ..Default::default()
        };
        let recorder: Recorder<Vec<u8>> =
            Recorder::start_enriched(config, vec![tx], Some(enrich)).unwrap();
        let stats = record_behind_a_held_first(recorder, gate, 10, 11..=50);
        assert_eq!(stats.written.load(Ordering::Relaxed), 41);
        assert_eq!(stats.bytes_written.load(Ordering::Relaxed), 41 * line);
        let sizes: Vec<u64> = stats
            .files()
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .collect();
        assert_eq!(sizes, vec![line * 16, line * 16, line * 9]);
        let ids: Vec<u64> = stats
            .files()
            .iter()
            .flat_map(|p| {
                prefixscope_core::record::read_jsonl(std::io::BufReader::new(
                    File::open(p).unwrap(),
                ))
                .records
            })
            .map(|r| r.id)
            .collect();
        assert_eq!(ids, (10..=50).collect::<Vec<u64>>());
        let handed: Vec<u64> = rx.try_iter().map(|r| r.id).collect();
        assert_eq!(handed, ids);
    }

    /// Lays out the first record only, holding the recorder on it until told, then stops.
    struct StopsAfterTheFirst {
        held: Held,
        stopped: bool,
    }

    impl Enrichment for StopsAfterTheFirst {
        fn enrich(&mut self, record: &mut Record) {
            self.held.hold();
            record.tokens = Some(prefixscope_core::record::TokenCounts::default());
            self.stopped = true;
        }

        fn active(&self) -> bool {
            !self.stopped
        }
    }

    /// A stop does not wait on the enrichment record by record: what is queued when the
    /// recorder finishes is enriched for `STOP_ENRICH_BUDGET`, the rest written without it,
    /// counted.
    #[test]
    fn what_waits_at_a_stop_past_its_budget_is_written_without_the_enrichment() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let enrich: Enrich = Box::new(|record: &mut Record| {
            // A server that takes its time with every answer.
            std::thread::sleep(std::time::Duration::from_millis(300));
            record.tokens = Some(prefixscope_core::record::TokenCounts::default());
        });
        let recorder: Recorder<Vec<u8>> =
            Recorder::start_enriched(RecorderConfig::default(), vec![tx], Some(enrich)).unwrap();
        let sender = recorder.sender();
        for id in 1..=10 {
            sender.send_blocking(capture(id));
        }
        drop(sender);
        let started = std::time::Instant::now();
        let stats = recorder.finish();
        // The budget, one enrichment begun within it, and slack for a loaded machine.
        assert!(
            started.elapsed() < STOP_ENRICH_BUDGET + std::time::Duration::from_millis(1_000),
            "{:?}",
            started.elapsed()
        );
        let records: Vec<Arc<Record>> = rx.try_iter().collect();
        assert_eq!(records.len(), 10);
        let enriched = records.iter().filter(|r| r.tokens.is_some()).count() as u64;
        // About the budget's worth (1 s of 300 ms answers), never all ten.
        assert!((2..=6).contains(&enriched), "{enriched}");
        assert_eq!(stats.not_enriched.load(Ordering::Relaxed), 10 - enriched);
    }

    #[test]
    fn a_stopped_enrichment_is_not_called_and_no_record_counts_as_skipped_by_it() {
        let (gate, held) = gate();
        let enrich: Enrich = Box::new(StopsAfterTheFirst {
            held,
            stopped: false,
        });
        let (tx, rx) = crossbeam_channel::unbounded();
        let recorder: Recorder<Vec<u8>> =
            Recorder::start_enriched(RecorderConfig::default(), vec![tx], Some(enrich)).unwrap();
        // Far more waiting than ENRICH_BACKLOG: an active enrichment would skip them, counted.
        let stats =
            record_behind_a_held_first(recorder, gate, 1, 2..=1 + ENRICH_BACKLOG as u64 + 10);
        let records: Vec<Arc<Record>> = rx.try_iter().collect();
        assert_eq!(records.len(), ENRICH_BACKLOG + 11);
        assert!(records[0].tokens.is_some());
        assert!(records[1..].iter().all(|r| r.tokens.is_none()));
        assert_eq!(stats.not_enriched.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn in_digest_mode_a_probe_keeps_its_reading_while_the_layout_runs() {
        // The probes go out at the start, before the layout has seen a chat record and
        // stopped: they took the enriched path, whose digest dropped their bodies.
        let (tx, rx) = crossbeam_channel::unbounded();
        let enrich: Enrich = Box::new(|_: &mut Record| {});
        let config = RecorderConfig {
            mode: BodyMode::Digest,
            ..Default::default()
        };
        let recorder: Recorder<Vec<u8>> =
            Recorder::start_enriched(config, vec![tx], Some(enrich)).unwrap();
        let sender = recorder.sender();
        let mut probe = capture(1);
        probe.path = "/props".into();
        probe.probe = true;
        probe.response = Some(prefixscope_core::capture::ResponseCapture {
            status: 200,
            headers: BTreeMap::new(),
            stream: None,
            body: br#"{"total_slots":4}"#.to_vec(),
            body_bytes: 17,
            truncated: false,
        });
        let mut chat = capture(2);
        chat.path = "/v1/chat/completions".into();
        chat.request_body = Some(br#"{"messages":[{"role":"user","content":"hi"}]}"#.to_vec());
        sender.send_blocking(probe);
        sender.send_blocking(chat);
        drop(sender);
        recorder.finish();
        let records: Vec<Arc<Record>> = rx.try_iter().collect();
        let reading = records[0].response.as_ref().and_then(|r| r.body.clone());
        assert_eq!(reading, Some(serde_json::json!({"total_slots": 4})));
        assert_eq!(records[1].request.body, None);
        assert!(records[1].request.digest.is_some());
    }

    #[test]
    fn a_probes_only_consumer_gets_the_probes_and_the_others_every_record() {
        let (every, all) = crossbeam_channel::unbounded();
        let (probes, probe_records) = crossbeam_channel::unbounded();
        let recorder: Recorder<Vec<u8>> = Recorder::start(
            RecorderConfig::default(),
            vec![Consumer::from(every), Consumer::probes_only(probes)],
        )
        .unwrap();
        let sender = recorder.sender();
        for id in 1..=4 {
            let mut c = capture(id);
            c.probe = id % 2 == 0;
            sender.send_blocking(c);
        }
        drop(sender);
        let stats = recorder.finish();
        assert_eq!(all.try_iter().count(), 4);
        let got: Vec<u64> = probe_records.try_iter().map(|r| r.id).collect();
        assert_eq!(got, vec![2, 4]);
        assert_eq!(stats.consumer_records_skipped.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_full_disk_is_counted_and_consumers_still_get_every_record() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let config = RecorderConfig {
            path: Some(PathBuf::from("/dev/full")),
            ..Default::default()
        };
        let recorder = Recorder::start(config, vec![tx]).unwrap();
        let sender = recorder.sender();
        for id in 1..=3 {
            sender.send_blocking(capture(id));
        }
        drop(sender);
        let stats = recorder.finish();
        assert_eq!(stats.write_errors.load(Ordering::Relaxed), 3);
        assert!(
            stats
                .last_error()
                .unwrap_or_default()
                .contains("No space left")
        );
        assert_eq!(rx.try_iter().count(), 3);
    }

    #[test]
    fn a_full_bounded_consumer_is_skipped_and_counted_and_the_others_get_every_record() {
        let (every, all) = crossbeam_channel::unbounded();
        let (bounded, some) = crossbeam_channel::bounded(2);
        let recorder: Recorder<Vec<u8>> =
            Recorder::start(RecorderConfig::default(), vec![every, bounded]).unwrap();
        let sender = recorder.sender();
        for id in 1..=5 {
            sender.send_blocking(capture(id));
        }
        drop(sender);
        let stats = recorder.finish();
        assert_eq!(stats.records.load(Ordering::Relaxed), 5);
        assert_eq!(all.try_iter().count(), 5);
        let got: Vec<u64> = some.try_iter().map(|r| r.id).collect();
        assert_eq!(got, vec![1, 2]);
        assert_eq!(stats.consumer_records_skipped.load(Ordering::Relaxed), 3);
    }
}
