//! The recorder thread: turns captures into records, writes and flushes one line per record, and
//! hands each record to the other consumers.
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

use crate::capture::{BodyMode, Capture, build_record};
use crate::limits::MAX_LINE_BYTES;
use crate::output_file::create_new_private;
use crate::record::{ExchangeError, Record, record_line};

/// Captures waiting to be recorded before the proxy holds the next request back.
pub const RECORDER_QUEUE: usize = 1024;

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
pub type Enrich = Box<dyn FnMut(&mut Record) + Send>;

/// Captures waiting past which the enrichment is skipped (counted in `not_enriched`), well below
/// the queue's size, so the work it does on the recorder's thread never holds the proxy back.
pub const ENRICH_BACKLOG: usize = 32;

impl<B: AsRef<[u8]> + Send + 'static> Recorder<B> {
    /// Opens the first file (mode 0600: recordings hold prompts) and starts the thread.
    pub fn start(
        config: RecorderConfig,
        consumers: Vec<Sender<Arc<Record>>>,
    ) -> io::Result<Recorder<B>> {
        Recorder::start_enriched(config, consumers, None)
    }

    /// `start`, with `enrich` run on every record.
    pub fn start_enriched(
        config: RecorderConfig,
        consumers: Vec<Sender<Arc<Record>>>,
        enrich: Option<Enrich>,
    ) -> io::Result<Recorder<B>> {
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
    pub fn finish(mut self) -> Arc<RecorderStats> {
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
    consumers: Vec<Sender<Arc<Record>>>,
    stats: Arc<RecorderStats>,
) {
    for capture in receiver.iter() {
        let waiting = receiver.len();
        stats.queued.store(waiting as u64, Ordering::Relaxed);
        let behind = waiting > ENRICH_BACKLOG;
        if behind && enrich.is_some() {
            stats.not_enriched.fetch_add(1, Ordering::Relaxed);
        }
        let record = match enrich.as_mut().filter(|_| !behind) {
            Some(enrich) => {
                let mut record = build_record(capture, BodyMode::Full);
                enrich(&mut record);
                if mode == BodyMode::Digest {
                    crate::normalize::digest::apply_digest(&mut record);
                }
                record
            }
            None => build_record(capture, mode),
        };
        if let Some(writer) = writer.as_mut() {
            let (line, dropped) = line_within(&record, MAX_LINE_BYTES);
            if dropped {
                stats.bodies_dropped.fetch_add(1, Ordering::Relaxed);
            }
            writer.write_line(&line);
        }
        stats.records.fetch_add(1, Ordering::Relaxed);
        let record = Arc::new(record);
        for consumer in &consumers {
            if let Err(crossbeam_channel::TrySendError::Full(_)) =
                consumer.try_send(Arc::clone(&record))
            {
                stats
                    .consumer_records_skipped
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The line of `record`, `\n` included, of at most `max` bytes before the `\n`: a record past it
/// (both bodies near `--max-body`) is written without its bodies, as `body_too_large`, so every
/// line we write reads back. Consumers still get the whole record.
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
            stats,
        })
    }

    fn write_line(&mut self, line: &[u8]) {
        if let Some(max) = self.max_size
            && self.size > 0
            && self.size + line.len() as u64 > max
        {
            self.rotate();
        }
        let result = if self.partial {
            self.file
                .write_all(b"\n")
                .and_then(|()| self.file.write_all(line))
        } else {
            self.file.write_all(line)
        };
        match result.and_then(|()| self.file.flush()) {
            Ok(()) => {
                self.partial = false;
                self.size += line.len() as u64;
                self.stats.written.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .bytes_written
                    .fetch_add(line.len() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.partial = true;
                self.stats.write_errors.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut last) = self.stats.last_error.lock() {
                    *last = Some(format!("{}: {e}", self.current.display()));
                }
            }
        }
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
        let read = crate::record::read_jsonl(std::io::BufReader::new(File::open(&path).unwrap()));
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

    #[test]
    fn enrichment_runs_on_each_record_and_is_skipped_while_captures_wait() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let (hold, held) = crossbeam_channel::bounded::<()>(0);
        let (started, first_started) = crossbeam_channel::bounded::<()>(1);
        let enrich: Enrich = Box::new(move |record: &mut Record| {
            if record.id == 1 {
                // The first record's enrichment is slow: the others pile up meanwhile.
                let _ = started.send(());
                let _ = held.recv();
            }
            record.tokens = Some(crate::record::TokenCounts::default());
        });
        let recorder: Recorder<Vec<u8>> =
            Recorder::start_enriched(RecorderConfig::default(), vec![tx], Some(enrich)).unwrap();
        let sender = recorder.sender();
        let waiting = ENRICH_BACKLOG as u64 + 10;
        sender.send_blocking(capture(1));
        first_started.recv().unwrap();
        for id in 2..=1 + waiting {
            sender.send_blocking(capture(id));
        }
        let _ = hold.send(());
        drop(sender);
        let stats = recorder.finish();
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
        let recorder: Recorder<Vec<u8>> = Recorder::start(config, vec![]).unwrap();
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
        let recorder: Recorder<Vec<u8>> = Recorder::start(config, vec![]).unwrap();
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
                vec![],
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
        let read = crate::record::read_jsonl(line.as_slice());
        let slim = &read.records[0];
        assert_eq!(slim.request.body, None);
        assert_eq!(slim.request.body_bytes, 4100);
        assert_eq!(slim.error, Some(ExchangeError::BodyTooLarge));
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
