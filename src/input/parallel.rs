//! A file's lines parsed on several threads, handed back one by one in file order.
//!
//! Lines are read into a chunk of at most [`CHUNK_BYTES`] and [`CHUNK_LINES`] (the line that
//! passes the bytes ends its chunk, up to the line bound of [`read_line_bounded`]); each
//! chunk's lines are split into contiguous runs of about equal bytes, parsed by one scoped
//! thread each (the caller's thread takes the first run), then given back in order. What a line becomes depends on that line
//! alone, so the order of the results and everything built from them is the serial read's. At
//! most one chunk and its parsed lines are held at a time, on at most [`MAX_WORKERS`] threads.

use std::io::BufRead;

use crate::limits::{Line, MAX_LINE_BYTES, read_line_bounded};

/// Bytes of lines parsed together: enough that a thread's start-up (tens of µs) is noise, small
/// enough that a chunk of parsed trace rows stays a few tens of MB.
pub const CHUNK_BYTES: usize = 4 << 20;

/// Lines parsed together, at most: a chunk of short lines (`{}`) would otherwise hold millions
/// of parsed rows, each far larger than its line.
pub const CHUNK_LINES: usize = 16_384;

/// Threads parsing one chunk, the caller's included: a bound whatever the machine says.
pub const MAX_WORKERS: usize = 8;

/// A chunk below this is parsed on the caller's thread alone.
const PARALLEL_MIN_BYTES: usize = 64 << 10;

/// One line's outcome, numbered from 1 as an editor counts.
pub enum Item<T> {
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

/// Reads `reader` to its end (or its first error), parsing each line with `parse` on up to
/// `workers` threads, and calls `each` with every line's outcome in file order.
pub fn for_each_parsed<R: BufRead, T: Send>(
    mut reader: R,
    workers: usize,
    parse: impl Fn(&[u8]) -> T + Sync,
    mut each: impl FnMut(Item<T>),
) {
    let workers = workers.clamp(1, MAX_WORKERS);
    // Reserved once: growing by doubling copied the chunk over and over. Pages are only
    // touched as lines fill them, so a small file costs no more than its size.
    let mut bytes: Vec<u8> = Vec::with_capacity(CHUNK_BYTES);
    let mut slots: Vec<Slot> = Vec::new();
    let mut line = Vec::new();
    let mut number = 0usize;
    let mut done = false;
    while !done {
        bytes.clear();
        slots.clear();
        while bytes.len() < CHUNK_BYTES && slots.len() < CHUNK_LINES {
            match read_line_bounded(&mut reader, &mut line, MAX_LINE_BYTES) {
                Ok(Line::Eof) => {
                    done = true;
                    break;
                }
                Ok(Line::Read { complete }) => {
                    let start = bytes.len();
                    bytes.extend_from_slice(&line);
                    slots.push(Slot::Line {
                        range: start..bytes.len(),
                        complete,
                    });
                }
                Ok(Line::TooLong { bytes }) => slots.push(Slot::TooLong(bytes)),
                Err(error) => {
                    slots.push(Slot::ReadError(error));
                    done = true;
                    break;
                }
            }
        }
        let parsed = parse_chunk(&bytes, &slots, workers, &parse);
        let mut parsed = parsed.into_iter();
        for slot in slots.drain(..) {
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
    }
}

/// The chunk's lines parsed, in order: split into runs of about equal bytes, one per worker.
fn parse_chunk<T: Send>(
    bytes: &[u8],
    slots: &[Slot],
    workers: usize,
    parse: &(impl Fn(&[u8]) -> T + Sync),
) -> Vec<T> {
    let lines: Vec<&[u8]> = slots
        .iter()
        .filter_map(|slot| match slot {
            Slot::Line { range, .. } => Some(&bytes[range.clone()]),
            _ => None,
        })
        .collect();
    if workers == 1 || bytes.len() < PARALLEL_MIN_BYTES || lines.len() < 2 {
        return lines.iter().map(|line| parse(line)).collect();
    }
    // Runs end where their share of the bytes is reached.
    let share = bytes.len().div_ceil(workers);
    let mut runs: Vec<&[&[u8]]> = Vec::with_capacity(workers);
    let (mut start, mut run_bytes) = (0, 0);
    for (i, line) in lines.iter().enumerate() {
        run_bytes += line.len();
        if run_bytes >= share && runs.len() + 1 < workers {
            runs.push(&lines[start..=i]);
            start = i + 1;
            run_bytes = 0;
        }
    }
    runs.push(&lines[start..]);
    std::thread::scope(|scope| {
        let (first, rest) = runs
            .split_first()
            .map_or((&[][..], &[][..]), |(f, r)| (*f, r));
        let handles: Vec<_> = rest
            .iter()
            .map(|run| scope.spawn(move || run.iter().map(|line| parse(line)).collect::<Vec<T>>()))
            .collect();
        let mut parsed: Vec<T> = first.iter().map(|line| parse(line)).collect();
        for handle in handles {
            match handle.join() {
                Ok(run) => parsed.extend(run),
                // A parser that panicked: its panic goes on, as it would have on one thread.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        parsed
    })
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
    fn empty_input_gives_nothing() {
        assert!(outcomes(b"", 2).is_empty());
    }

    #[test]
    fn a_read_error_is_the_last_item() {
        struct Failing(usize);
        impl std::io::Read for Failing {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.0 == 0 {
                    return Err(std::io::Error::other("disk gone"));
                }
                self.0 -= 1;
                buf[..2].copy_from_slice(b"a\n");
                Ok(2)
            }
        }
        let reader = std::io::BufReader::with_capacity(2, Failing(3));
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
}
