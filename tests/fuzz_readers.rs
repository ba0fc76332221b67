//! A seeded in-tree fuzzer per reader (issue #17, "Must show"): recordings (with the analysis
//! the profile runs on them), gateway CSV logs, Mooncake and bailian traces. Each starts from
//! real or realistic inputs, mutates them (bytes flipped, inserted, deleted, repeated; numbers
//! made huge, negative or fractional; lines cut), reads the result and checks that nothing
//! panics and every count stays inside its bound. Bounded by time (`FUZZ_SECONDS` per reader,
//! default 3) and reproducible: the seed is `FUZZ_SEED` (default fixed), and a failure names the
//! iteration's seed and keeps its input in the temporary directory.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use prefixscope_core::input::{self, FileInput, Format, InputOptions};
use prefixscope_core::limits::{MAX_HASH_IDS_PER_ROW, MAX_PROMPT_TOKENS};

/// xorshift64*: small, seeded, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

const HOSTILE_NUMBERS: [&str; 10] = [
    "18446744073709551615",
    "9223372036854775808",
    "4294967296",
    "1e308",
    "-1",
    "0",
    "1.5",
    "1e-320",
    "NaN",
    "\"12\"",
];

const TOKENS: [&str; 14] = [
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "\\",
    "\n",
    "\r\n",
    "null",
    "\"hash_ids\"",
    "\u{1b}[2J",
    "\"usage\":{\"prompt_tokens\":",
];

/// One mutation of `input`, in place.
fn mutate(rng: &mut Rng, input: &mut Vec<u8>) {
    let len = input.len();
    match rng.below(9) {
        0 if len > 0 => {
            let i = rng.below(len);
            input[i] ^= 1 << rng.below(8);
        }
        1 => {
            let i = rng.below(len + 1);
            let byte = (rng.next() & 0xff) as u8;
            input.insert(i, byte);
        }
        2 if len > 0 => {
            let start = rng.below(len);
            let end = (start + 1 + rng.below(64)).min(len);
            input.drain(start..end);
        }
        3 if len > 0 => {
            // Repeat a slice a few times (long arrays, long lines).
            let start = rng.below(len);
            let end = (start + 1 + rng.below(256)).min(len);
            let slice = input[start..end].to_vec();
            for _ in 0..1 + rng.below(8) {
                input.splice(end..end, slice.iter().copied());
            }
        }
        4 => {
            // A number somewhere replaced by a hostile one.
            let digits: Vec<usize> = input
                .iter()
                .enumerate()
                .filter(|(_, b)| b.is_ascii_digit())
                .map(|(i, _)| i)
                .collect();
            if let Some(&at) = digits.get(rng.below(digits.len())) {
                let mut end = at;
                while end < input.len() && input[end].is_ascii_digit() {
                    end += 1;
                }
                let mut start = at;
                while start > 0 && input[start - 1].is_ascii_digit() {
                    start -= 1;
                }
                let number = HOSTILE_NUMBERS[rng.below(HOSTILE_NUMBERS.len())];
                input.splice(start..end, number.bytes());
            }
        }
        5 => {
            let i = rng.below(len + 1);
            let token = TOKENS[rng.below(TOKENS.len())];
            input.splice(i..i, token.bytes());
        }
        6 if len > 0 => input.truncate(rng.below(len)),
        7 if len > 0 => {
            // Swap two lines' order by cutting at a newline and moving the tail to the front.
            let i = rng.below(len);
            input.rotate_left(i);
        }
        _ => {
            let i = rng.below(len + 1);
            input.splice(i..i, std::iter::repeat_n(b'9', 1 + rng.below(40)));
        }
    }
}

/// Records `text` can hold, at least one: a line per `\n`, and for CSV (which also ends a
/// record at a lone `\r`) one per `\r` too.
fn line_count(bytes: &[u8]) -> usize {
    bytes.iter().filter(|&&b| b == b'\n' || b == b'\r').count() + 1
}

fn check(read: &FileInput, bytes: &[u8], block_size: u32) -> Result<(), String> {
    let lines = line_count(bytes);
    let report = &read.report;
    if read.requests.len() > lines {
        return Err(format!(
            "{} requests from {lines} lines",
            read.requests.len()
        ));
    }
    if report.bad_rows.len() > lines + 1 {
        return Err(format!(
            "{} bad rows from {lines} lines",
            report.bad_rows.len()
        ));
    }
    if report.bad_values.len() > input::MAX_BAD_VALUES_KEPT {
        return Err(format!("{} bad values kept", report.bad_values.len()));
    }
    let most_blocks =
        (MAX_PROMPT_TOKENS / u64::from(block_size) + 1).max(MAX_HASH_IDS_PER_ROW as u64);
    for request in &read.requests {
        if request.input_tokens > MAX_PROMPT_TOKENS {
            return Err(format!("input_tokens {}", request.input_tokens));
        }
        if request.blocks.len() as u64 > most_blocks {
            return Err(format!("{} blocks", request.blocks.len()));
        }
        if request
            .server_reused_tokens
            .is_some_and(|r| r > MAX_PROMPT_TOKENS)
        {
            return Err(format!("reused {:?}", request.server_reused_tokens));
        }
        if request
            .blocks
            .iter()
            .any(|b| u64::from(b.tokens) > u64::from(block_size).max(1))
        {
            return Err("a block heavier than the block size".into());
        }
    }
    Ok(())
}

/// Mutates the seeds for `FUZZ_SECONDS`, reading each result in `format`; returns the runs.
fn fuzz(name: &str, format: Format, seeds: &[Vec<u8>], block_size: u32) -> u64 {
    let seconds: u64 = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let seed: u64 = std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x005e_ed17);
    let mut rng = Rng(seed ^ (format as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let options = InputOptions {
        block_size: Some(block_size),
        ..InputOptions::default()
    };
    let started = Instant::now();
    let mut runs = 0u64;
    while started.elapsed() < Duration::from_secs(seconds) {
        let case_seed = rng.next() | 1;
        let mut case = Rng(case_seed);
        let mut bytes = seeds[case.below(seeds.len())].clone();
        for _ in 0..1 + case.below(12) {
            mutate(&mut case, &mut bytes);
        }
        let result =
            std::panic::catch_unwind(|| input::read(bytes.as_slice(), name, format, &options));
        let failure = match &result {
            Ok(read) => check(read, &bytes, block_size).err(),
            Err(_) => Some("panicked".to_string()),
        };
        if let Some(failure) = failure {
            let kept = std::env::temp_dir().join(format!("prefixscope-fuzz-{name}-{case_seed}"));
            let _ = std::fs::write(&kept, &bytes);
            panic!(
                "{name}: {failure} (case seed {case_seed}, input kept in {})",
                kept.display()
            );
        }
        runs += 1;
    }
    eprintln!(
        "{name}: {runs} runs in {:?}, no panic, every count bounded",
        started.elapsed()
    );
    assert!(runs > 0);
    runs
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Seeds of a few lines each, cut from `text`.
fn chunks(text: &[u8], lines: usize) -> Vec<Vec<u8>> {
    let all: Vec<&[u8]> = text.split_inclusive(|&b| b == b'\n').collect();
    all.chunks(lines).map(|c| c.concat()).collect()
}

#[test]
fn fuzzed_recordings_never_panic_and_stay_bounded() {
    let mut seeds = Vec::new();
    for file in [
        "recordings/llmp/llama.cpp/session.jsonl",
        "recordings/llmp/llama.cpp/session.digest.jsonl",
        "recordings/llmp/ollama/session.jsonl",
        "recordings/xllamacpp/session.jsonl",
    ] {
        let text = std::fs::read(root().join(file)).unwrap();
        seeds.extend(chunks(&text, 3));
    }
    fuzz("recording", Format::Recording, &seeds, 16);
}

#[test]
fn fuzzed_gateway_logs_never_panic_and_stay_bounded() {
    let body = |user: &str, text: &str| {
        format!(
            "\"{{\"\"model\"\":\"\"glm-5\"\",\"\"user\"\":\"\"{user}\"\",\"\"stream\"\":true,\"\"messages\"\":[{{\"\"role\"\":\"\"system\"\",\"\"content\"\":\"\"You help.\"\"}},{{\"\"role\"\":\"\"user\"\",\"\"content\"\":\"\"{text}\"\"}}]}}\""
        )
    };
    let usage = "\"{\"\"usage\"\":{\"\"prompt_tokens\"\":40,\"\"completion_tokens\"\":3,\"\"prompt_tokens_details\"\":{\"\"cached_tokens\"\":32}}}\"";
    let csv = format!(
        "timestamp,request_json,response_json,status_code,model_name\n\
         2024-05-01T10:00:00Z,{},{usage},200,glm-5\n\
         1714557601,{},,200,\n\
         1714557602000,{},{usage},500,glm-5\n\
         2024-05-01 10:00:03+02:00,{},{usage},200,glm-5\n",
        body("alice", "second question"),
        body("alice", "first question"),
        body("bob", "other question"),
        body("carol", "a \"\"quoted\"\" question"),
    );
    fuzz("csv", Format::Csv, &[csv.into_bytes()], 16);
}

#[test]
fn fuzzed_mooncake_traces_never_panic_and_stay_bounded() {
    let mut text = Vec::new();
    flate2::read::MultiGzDecoder::new(
        std::fs::File::open(root().join("tests/data/mooncake/conversation_trace.jsonl.gz"))
            .unwrap(),
    )
    .read_to_end(&mut text)
    .unwrap();
    let head: Vec<u8> = text
        .split_inclusive(|&b| b == b'\n')
        .take(60)
        .flatten()
        .copied()
        .collect();
    let mut seeds = chunks(&head, 4);
    seeds.push(
        b"{\"timestamp\": 5, \"input_length\": 900, \"output_length\": 1, \"session_id\": \"s1\", \"block_size\": 512, \"hash_ids\": [\"1\", 2, \"x\"]}\n"
            .to_vec(),
    );
    fuzz("mooncake", Format::Mooncake, &seeds, 512);
}

#[test]
fn fuzzed_bailian_traces_never_panic_and_stay_bounded() {
    let text = b"{\"chat_id\": 1, \"parent_chat_id\": -1, \"timestamp\": 0.5, \"input_length\": 20, \"output_length\": 1, \"turn\": 1, \"type\": \"text\", \"hash_ids\": [1, 2]}\n\
{\"chat_id\": 2, \"parent_chat_id\": -1, \"timestamp\": 1.0, \"input_length\": 20, \"output_length\": 1, \"turn\": 1, \"hash_ids\": [1, 3]}\n\
{\"chat_id\": 3, \"parent_chat_id\": 1, \"timestamp\": 2.25, \"input_length\": 40, \"output_length\": 1, \"turn\": 2, \"hash_ids\": [1, 2, 4]}\n\
{\"chat_id\": 4, \"parent_chat_id\": 3, \"timestamp\": 3.0, \"input_length\": 40, \"output_length\": 1, \"turn\": 3, \"hash_ids\": [1, 2, 4, 5]}\n";
    fuzz("bailian", Format::Bailian, &[text.to_vec()], 16);
}
