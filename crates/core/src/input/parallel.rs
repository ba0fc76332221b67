//! A file's lines parsed on every core (rayon), handed back one by one in file order.
//!
//! The caller's thread reads lines into chunks of at most [`CHUNK_BYTES`] and [`CHUNK_LINES`]
//! (the line that passes the bytes ends its chunk, up to the line bound of
//! [`append_line_bounded`]); a chunk's lines are parsed in parallel while the chunk before it
//! is given out, so at most two chunks (and their parsed lines) are held at a time. What a line
//! becomes depends on that line alone, so the order of the results and everything built from
//! them is the serial read's.

use std::io::BufRead;

use rayon::prelude::*;

use crate::limits::{Line, MAX_LINE_BYTES, append_line_bounded};

/// Bytes of lines parsed together: enough that handing them to the pool is noise, small enough
/// that the chunks in flight and their parsed lines stay a few MB each.
pub(crate) const CHUNK_BYTES: usize = 4 << 20;

/// Lines parsed together, at most: a chunk of short lines (`{}`) would otherwise hold millions
/// of parsed rows, each far larger than its line.
pub(crate) const CHUNK_LINES: usize = 1_024;

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
    /// Each line's parse, in order, on every core.
    fn parse<T: Send>(&self, parse: &(impl Fn(&[u8]) -> T + Sync)) -> Vec<T> {
        self.slots
            .par_iter()
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

/// Reads `reader` to its end (or its first error), parsing each line with `parse` on every
/// core, and calls `each` with every line's outcome in file order, on the caller's thread.
/// While the pool parses one chunk, the caller gives out the one before and reads the one
/// after, so reading, parsing and what `each` does overlap.
pub(crate) fn for_each_parsed<R: BufRead, T: Send>(
    reader: R,
    parse: impl Fn(&[u8]) -> T + Sync,
    mut each: impl FnMut(Item<T>),
) {
    let mut reading = Reading {
        reader,
        done: false,
    };
    let mut chunk = reading.chunk(chunk_buffer());
    let mut parsed = chunk.parse(&parse);
    let mut next = (!reading.done).then(|| reading.chunk(chunk_buffer()));
    let mut number = 0;
    while let Some(being_parsed) = next.take() {
        let mut next_parsed = Vec::new();
        let mut spare = Vec::new();
        rayon::in_place_scope(|scope| {
            scope.spawn(|_| next_parsed = being_parsed.parse(&parse));
            (number, spare) = chunk.give_out(number, parsed, &mut each);
            if !reading.done {
                // A buffer a long line grew is not kept for the chunks after it.
                if spare.capacity() > 2 * CHUNK_BYTES {
                    spare = chunk_buffer();
                }
                next = Some(reading.chunk(std::mem::take(&mut spare)));
            }
        });
        (chunk, parsed) = (being_parsed, next_parsed);
    }
    chunk.give_out(number, parsed, &mut each);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each line's number and text, or what was in its place.
    fn outcomes(text: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for_each_parsed(
            text,
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
    fn lines_come_back_in_file_order() {
        // Several chunks of many lines, so runs split mid-chunk and chunks follow one another.
        let mut text = Vec::new();
        for i in 0..400_000 {
            text.extend_from_slice(format!("line {i} {}\n", "x".repeat(i % 37)).as_bytes());
        }
        text.extend_from_slice(b"last without newline");
        let lines = outcomes(&text);
        assert_eq!(lines.len(), 400_001);
        assert_eq!(lines[0], "1 true line 0");
        assert_eq!(lines[400_000], "400001 false last without newline");
        for (i, line) in lines.iter().enumerate().take(400_000) {
            let expected = format!("{} true line {i} {}", i + 1, "x".repeat(i % 37));
            assert_eq!(line, expected.trim_end());
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
        let lines = outcomes(&text);
        assert_eq!(lines.len(), 12);
        for (i, line) in lines.iter().enumerate() {
            assert!(line.starts_with(&format!("{} true {i} y", i + 1)), "{i}");
        }
    }

    #[test]
    fn empty_input_gives_nothing() {
        assert!(outcomes(b"").is_empty());
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
