//! A file's lines parsed on several threads, handed back one by one in file order.
//!
//! The caller's thread reads lines into chunks of at most [`CHUNK_BYTES`] and [`CHUNK_LINES`]
//! (the line that passes the bytes ends its chunk, up to the line bound of
//! [`append_line_bounded`]) and hands each chunk whole to the next free parser thread; the parsed
//! chunks come back in any order and are given out in file order. The reader runs ahead of the
//! parsers by a few chunks only: at most [`IN_FLIGHT_PER_WORKER`] chunks per parser, and as
//! many [`CHUNK_BYTES`] (and their parsed lines), are held at a time, on at most
//! [`MAX_WORKERS`] parsers. The parsers live as
//! long as the read, so what a parser keeps per thread (the normalizer's memo of digests) lasts
//! from one chunk to the next. What a line becomes depends on that line alone, so the order of
//! the results and everything built from them is the serial read's.

use std::collections::BTreeMap;
use std::io::BufRead;

use crate::limits::{Line, MAX_LINE_BYTES, append_line_bounded};

/// Bytes of lines parsed together: enough that a hand-over between threads (a few µs) is
/// noise, small enough that the chunks in flight and their parsed lines stay a few MB each.
pub(crate) const CHUNK_BYTES: usize = 1 << 20;

/// Lines parsed together, at most: a chunk of short lines (`{}`) would otherwise hold millions
/// of parsed rows, each far larger than its line.
pub(crate) const CHUNK_LINES: usize = 1_024;

/// Parser threads: a bound whatever the machine says.
pub(crate) const MAX_WORKERS: usize = 8;

/// Parser threads for a read on this machine: one per core, within [`MAX_WORKERS`].
pub fn workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_WORKERS))
}

/// Chunks read but not yet given out, per parser: one being parsed, one waiting for it.
const IN_FLIGHT_PER_WORKER: usize = 2;

/// A file whose first chunk is its whole and is below this is parsed on the caller's thread.
const PARALLEL_MIN_BYTES: usize = 64 << 10;

/// One line's outcome, numbered from 1 as an editor counts.
pub(crate) enum Item<T> {
    /// A line within the bound, parsed; `complete`: it ended with `\n` (else it is the file's
    /// last).
    Parsed {
        number: usize,
        complete: bool,
        parsed: T,
    },
    /// A line past [`MAX_LINE_BYTES`], skipped unread: how many bytes it had.
    TooLong { number: usize, bytes: u64 },
    /// The read failed before line `number`; nothing after it is read.
    ReadError {
        number: usize,
        error: std::io::Error,
    },
}

/// What a chunk holds in place of each line, in file order.
enum Slot {
    Line {
        range: std::ops::Range<usize>,
        complete: bool,
    },
    TooLong(u64),
    ReadError(std::io::Error),
}

/// Consecutive lines of the file, as read.
struct Chunk {
    bytes: Vec<u8>,
    slots: Vec<Slot>,
}

impl Chunk {
    /// Each line's parse, in order.
    fn parse<T>(&self, parse: &impl Fn(&[u8]) -> T) -> Vec<T> {
        self.slots
            .iter()
            .filter_map(|slot| match slot {
                Slot::Line { range, .. } => Some(parse(&self.bytes[range.clone()])),
                _ => None,
            })
            .collect()
    }

    /// Gives out each line's outcome, numbered on from `number` (the lines before it); returns
    /// the number of the last line and the buffer for the next chunk.
    fn give_out<T>(
        self,
        mut number: usize,
        parsed: Vec<T>,
        each: &mut impl FnMut(Item<T>),
    ) -> (usize, Vec<u8>) {
        let mut parsed = parsed.into_iter();
        for slot in self.slots {
            number += 1;
            let item = match slot {
                Slot::Line { complete, .. } => match parsed.next() {
                    Some(parsed) => Item::Parsed {
                        number,
                        complete,
                        parsed,
                    },
                    // Every line slot has its result; nothing else is possible.
                    None => break,
                },
                Slot::TooLong(bytes) => Item::TooLong { number, bytes },
                Slot::ReadError(error) => Item::ReadError { number, error },
            };
            each(item);
        }
        (number, self.bytes)
    }
}

/// The caller's side of the read: lines into chunks.
struct Reading<R> {
    reader: R,
    done: bool,
}

impl<R: BufRead> Reading<R> {
    /// The next lines, read into `bytes` (emptied first). Sets `done` at the end of the file or
    /// its first read error, which is the chunk's last slot.
    fn chunk(&mut self, mut bytes: Vec<u8>) -> Chunk {
        bytes.clear();
        let mut slots = Vec::new();
        while bytes.len() < CHUNK_BYTES && slots.len() < CHUNK_LINES {
            let start = bytes.len();
            match append_line_bounded(&mut self.reader, &mut bytes, MAX_LINE_BYTES) {
                Ok(Line::Eof) => {
                    self.done = true;
                    break;
                }
                Ok(Line::Read { complete }) => {
                    slots.push(Slot::Line {
                        range: start..bytes.len(),
                        complete,
                    });
                }
                Ok(Line::TooLong { bytes }) => slots.push(Slot::TooLong(bytes)),
                Err(error) => {
                    slots.push(Slot::ReadError(error));
                    self.done = true;
                    break;
                }
            }
        }
        Chunk { bytes, slots }
    }
}

/// A chunk's buffer: reserved once, since growing by doubling copied the chunk over and over.
/// Pages are only touched as lines fill them, so a small file costs no more than its size.
fn chunk_buffer() -> Vec<u8> {
    Vec::with_capacity(CHUNK_BYTES)
}

/// A parsed chunk, or the panic of the parser that took it.
type Parsed<T> = (usize, Chunk, std::thread::Result<Vec<T>>);

/// Reads `reader` to its end (or its first error), parsing each line with `parse` on up to
/// `workers` threads, and calls `each` with every line's outcome in file order, on the
/// caller's thread.
pub(crate) fn for_each_parsed<R: BufRead, T: Send>(
    reader: R,
    workers: usize,
    parse: impl Fn(&[u8]) -> T + Sync,
    mut each: impl FnMut(Item<T>),
) {
    let workers = workers.clamp(1, MAX_WORKERS);
    let mut reading = Reading {
        reader,
        done: false,
    };
    let first = reading.chunk(chunk_buffer());
    if workers == 1 || (reading.done && first.bytes.len() < PARALLEL_MIN_BYTES) {
        let (mut number, mut chunk) = (0, first);
        loop {
            let parsed = chunk.parse(&parse);
            let bytes;
            (number, bytes) = chunk.give_out(number, parsed, &mut each);
            if reading.done {
                return;
            }
            chunk = reading.chunk(bytes);
        }
    }
    let in_flight = workers * IN_FLIGHT_PER_WORKER;
    std::thread::scope(|scope| {
        let (work, work_queue) = crossbeam_channel::bounded::<(usize, Chunk)>(in_flight);
        let (parsed_queue, parsed) = crossbeam_channel::bounded::<Parsed<T>>(in_flight);
        for _ in 0..workers {
            let (work_queue, parsed_queue, parse) =
                (work_queue.clone(), parsed_queue.clone(), &parse);
            scope.spawn(move || {
                for (sequence, chunk) in work_queue {
                    // Caught, so the caller passes the panic on instead of waiting for the chunk.
                    let lines = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        chunk.parse(parse)
                    }));
                    if parsed_queue.send((sequence, chunk, lines)).is_err() {
                        return;
                    }
                }
            });
        }
        drop((work_queue, parsed_queue));
        // Chunks read (`sent`) and given out (`given`); those parsed out of turn wait. The
        // bytes out are bounded too: a chunk ends after the line that passes its size, and a
        // line may be up to `MAX_LINE_BYTES`, so a chunk of long lines holds the reader back
        // until it is given out, as the one chunk at a time of the serial read would.
        let (mut sent, mut given, mut number) = (0usize, 0usize, 0usize);
        let mut bytes_out = 0usize;
        let bytes_allowed = in_flight * CHUNK_BYTES;
        let mut waiting: BTreeMap<usize, (Chunk, Vec<T>)> = BTreeMap::new();
        let mut spare: Vec<Vec<u8>> = Vec::new();
        let mut next = Some(first);
        loop {
            while sent - given < in_flight && (sent == given || bytes_out < bytes_allowed) {
                let chunk = match next.take() {
                    Some(chunk) => chunk,
                    None if reading.done => break,
                    None => reading.chunk(spare.pop().unwrap_or_else(chunk_buffer)),
                };
                bytes_out += chunk.bytes.len();
                // Every parser holds the receiver until this sender is dropped.
                if work.send((sent, chunk)).is_err() {
                    break;
                }
                sent += 1;
            }
            if given == sent {
                break;
            }
            // Every parser holds the sender: the queue is open while a chunk is out.
            let Ok((sequence, chunk, lines)) = parsed.recv() else {
                break;
            };
            match lines {
                Ok(lines) => waiting.insert(sequence, (chunk, lines)),
                Err(panic) => std::panic::resume_unwind(panic),
            };
            while let Some((chunk, lines)) = waiting.remove(&given) {
                bytes_out -= chunk.bytes.len();
                let bytes;
                (number, bytes) = chunk.give_out(number, lines, &mut each);
                // A buffer a long line grew is not kept for the chunks after it.
                if bytes.capacity() <= 2 * CHUNK_BYTES {
                    spare.push(bytes);
                }
                given += 1;
            }
        }
        // Ends the parsers.
        drop(work);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each line's number and text, or what was in its place.
    fn outcomes(text: &[u8], workers: usize) -> Vec<String> {
        let mut out = Vec::new();
        for_each_parsed(
            text,
            workers,
            |line| String::from_utf8_lossy(line).trim_end().to_string(),
            |item| {
                out.push(match item {
                    Item::Parsed {
                        number,
                        complete,
                        parsed,
                    } => format!("{number} {complete} {parsed}"),
                    Item::TooLong { number, bytes } => format!("{number} too long {bytes}"),
                    Item::ReadError { number, error } => format!("{number} error {error}"),
                })
            },
        );
        out
    }

    #[test]
    fn lines_come_back_in_file_order_on_any_number_of_threads() {
        // Several chunks of many lines, so runs split mid-chunk and chunks follow one another.
        let mut text = Vec::new();
        for i in 0..400_000 {
            text.extend_from_slice(format!("line {i} {}\n", "x".repeat(i % 37)).as_bytes());
        }
        text.extend_from_slice(b"last without newline");
        let serial = outcomes(&text, 1);
        assert_eq!(serial.len(), 400_001);
        assert_eq!(serial[0], "1 true line 0");
        assert_eq!(serial[400_000], "400001 false last without newline");
        for workers in [2, 3, 8, 100] {
            assert_eq!(outcomes(&text, workers), serial, "{workers} workers");
        }
    }

    #[test]
    fn chunks_of_long_lines_come_back_in_order() {
        // Lines longer than a chunk: each ends a chunk of its own, held back by the bytes out.
        let mut text = Vec::new();
        for i in 0..12 {
            let len = if i % 3 == 0 { 3 * CHUNK_BYTES } else { 10 };
            text.extend_from_slice(format!("{i} {}\n", "y".repeat(len)).as_bytes());
        }
        let serial = outcomes(&text, 1);
        assert_eq!(serial.len(), 12);
        for workers in [2, 4] {
            assert_eq!(outcomes(&text, workers), serial, "{workers} workers");
        }
    }

    #[test]
    fn empty_input_gives_nothing() {
        assert!(outcomes(b"", 2).is_empty());
    }

    #[test]
    fn a_read_error_is_the_last_item() {
        let failing = crate::test_support::FailingReader {
            piece: b"a\n",
            reads: 3,
        };
        let reader = std::io::BufReader::with_capacity(2, failing);
        let mut out = Vec::new();
        for_each_parsed(
            reader,
            2,
            |line| line.len(),
            |item| {
                out.push(match item {
                    Item::Parsed { number, .. } => format!("{number}"),
                    Item::TooLong { number, .. } => format!("{number} too long"),
                    Item::ReadError { number, error } => format!("{number} {error}"),
                })
            },
        );
        assert_eq!(out, vec!["1", "2", "3", "4 disk gone"]);
    }

    #[test]
    fn a_parser_that_panics_passes_its_panic_on() {
        let mut text = Vec::new();
        for i in 0..200_000 {
            text.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        let outcome = std::panic::catch_unwind(|| {
            for_each_parsed(
                text.as_slice(),
                2,
                |line| {
                    if line == b"line 150000\n" {
                        panic!("bad parser");
                    }
                    line.len()
                },
                |_| {},
            )
        });
        let panic = outcome.unwrap_err();
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"bad parser"));
    }
}
