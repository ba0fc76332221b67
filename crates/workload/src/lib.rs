//! A deterministic generator of realistic agent traffic, as the proxy records it: for property
//! tests and benchmarks of the analysis.
//!
//! A crate of its own, used by prefixscope's tests, examples and benchmarks only (a
//! dev-dependency), so the shipped library does not carry it.
//!
//! Pure: no I/O, no clock; the only randomness is a SplitMix64 stream seeded from the config, so
//! one config always gives the same records.
//!
//! The model of the traffic:
//! - Agents run at once, one connection each. Agent `i` runs harness `i % 4`: a coding agent; its
//!   read-only subagent (same SDK and user-agent, tools a subset of the coding agent's); a test
//!   runner, a second harness on the same SDK with other tools; a reviewer with another
//!   user-agent. Agents past the fourth run the same harnesses on other repositories.
//! - Each agent runs conversations one after another (OpenAI chat): system prompt (1-4 KB, today's
//!   date at its end) + tools + a history that grows turn by turn with assistant tool calls and
//!   tool results, then an answer and perhaps a user follow-up. When the history grows past a
//!   limit, the harness asks for a summary and carries on from it alone (compaction). Now and
//!   then the day rolls over and every agent's system prompt changes its last line. A new
//!   conversation may fire a tool-less title side-call (`max_tokens` ≤ 32) on a second
//!   connection of its agent, while its first turn runs.
//! - The server has one slot shared by everybody and serves requests in arrival order: `cache_n`
//!   is the prefix (≈ chars / 4 tokens) common with the previous request's prompt, else a few
//!   tokens, so interleaved agents evict each other. Prefill runs at `prefill_tokens_per_s`,
//!   decoding at `decode_tokens_per_s`.
//! - `out_of_order: false`: one request at a time, first come first served, so records complete
//!   in start order. `true`: requests run at once, so a long prefill ends after requests that
//!   started later, and a title side-call ends before the turn it was fired with.
//!
//! Records come back in completion order (the order the proxy writes them), ids in start order.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::{Map, Value, json};

use prefixscope_core::RECORD_VERSION;
use prefixscope_core::calendar::civil_from_days;
use prefixscope_core::record::{Record, RequestRecord, ResponseRecord, StreamKind};

/// What to generate. Start from `WorkloadConfig::default()` and change what matters.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadConfig {
    /// One seed, one workload.
    pub seed: u64,
    /// Records generated.
    pub records: usize,
    /// Agents running at once (at least one is run). Agent `i` (from 0) talks on connection
    /// `i + 1`, and its title side-calls on connection `agents + i + 1`.
    pub agents: usize,
    /// Whether requests run concurrently, so completion order differs from start order.
    pub out_of_order: bool,
    /// Start of the first request, Unix milliseconds.
    pub start_ms: i64,
    /// Server prefill speed, tokens per second.
    pub prefill_tokens_per_s: f64,
    /// Server decoding speed, tokens per second.
    pub decode_tokens_per_s: f64,
    /// Chance that a new conversation (of a harness that names them) fires a title side-call.
    pub title_share: f64,
    /// Chance per request that the day rolls over, changing every system prompt's last line.
    pub date_change_rate: f64,
    /// History size, in characters, past which a harness compacts its conversation (each
    /// conversation draws its limit from 0.6 to 1.4 times this). The main lever on body sizes.
    pub context_chars: usize,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            seed: 1,
            records: 1000,
            agents: 4,
            out_of_order: true,
            // 2026-01-01T10:00:00Z
            start_ms: 1_767_261_600_000,
            prefill_tokens_per_s: 200.0,
            decode_tokens_per_s: 20.0,
            title_share: 0.5,
            date_change_rate: 0.003,
            context_chars: 40_000,
        }
    }
}

/// The records of the workload, in completion order (`t_end_ms`, then `id`), ids `1..=records`
/// in start order.
pub fn generate(config: &WorkloadConfig) -> Vec<Record> {
    let mut sim = Sim::new(config);
    let mut records = Vec::with_capacity(config.records);
    while records.len() < config.records {
        records.push(sim.next_record());
    }
    records.sort_by_key(|r| (r.t_end_ms, r.id));
    records
}

// ---------------------------------------------------------------------------------------------
// Randomness

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        let span = hi.saturating_sub(lo).saturating_add(1);
        lo + ((u128::from(self.next_u64()) * u128::from(span)) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in `[lo, hi)`.
    fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items.get(self.below(items.len())).copied().unwrap_or("")
    }

    /// `prefix` and `n` random alphanumerics.
    fn token(&mut self, prefix: &str, n: usize) -> String {
        const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
        let mut s = String::with_capacity(prefix.len() + n);
        s.push_str(prefix);
        for _ in 0..n {
            s.push(char::from(ALPHABET[self.below(ALPHABET.len())]));
        }
        s
    }

    /// Sentences from `pool`, space-separated, until at least `min_chars`.
    fn prose(&mut self, pool: &[&str], min_chars: usize) -> String {
        let mut s = String::with_capacity(min_chars + 120);
        while s.len() < min_chars {
            if !s.is_empty() {
                s.push(' ');
            }
            s.push_str(self.pick(pool));
        }
        s
    }
}

// ---------------------------------------------------------------------------------------------
// Harnesses

struct Profile {
    intro: &'static str,
    user_agent: &'static str,
    tools: &'static [&'static str],
    tasks: &'static [&'static str],
    stream_share: f64,
    /// Streamed requests ask for `stream_options.include_usage`.
    include_usage: bool,
    max_tokens: Option<u32>,
    temperature: f64,
    /// A tool-call-only assistant message is sent back with `content: null` (else `""`).
    null_content: bool,
    /// Tool results carry the tool's `name`.
    named_results: bool,
    /// Tool rounds before an answer are drawn from `0..=max_rounds`.
    max_rounds: u64,
    /// Chance the user follows an answer up in the same conversation.
    followup: f64,
    titles: bool,
    /// Milliseconds before the next conversation.
    idle_ms: (u64, u64),
}

const SDK_AGENT: &str = "agentkit-sdk/0.14.2 (node 22.11.0; linux x64)";

static PROFILES: [Profile; 4] = [
    Profile {
        intro: "You are a coding agent. You work in the user's repository through the tools \
                below: read files before changing them, keep every change minimal, run the \
                build after editing, and explain what you did in one or two sentences.",
        user_agent: SDK_AGENT,
        tools: &[
            "read_file",
            "list_dir",
            "write_file",
            "edit_file",
            "run_shell",
        ],
        tasks: TASKS,
        stream_share: 0.8,
        include_usage: false,
        max_tokens: Some(4096),
        temperature: 0.2,
        null_content: false,
        named_results: false,
        max_rounds: 8,
        followup: 0.6,
        titles: true,
        idle_ms: (20_000, 600_000),
    },
    Profile {
        intro: "You are a subagent that only reads files. Your parent agent gives you one \
                question about the repository; answer it from what the files say, quote the \
                lines that matter, and never guess.",
        user_agent: SDK_AGENT,
        tools: &["read_file", "list_dir"],
        tasks: SUBAGENT_TASKS,
        stream_share: 0.8,
        include_usage: false,
        max_tokens: Some(2048),
        temperature: 0.2,
        null_content: false,
        named_results: false,
        max_rounds: 5,
        followup: 0.0,
        titles: false,
        idle_ms: (20_000, 400_000),
    },
    Profile {
        intro: "You are a test runner in a continuous-integration harness. Find the tests that \
                cover the change, run them, and when one fails, locate the cause from the diff \
                and the test output before proposing anything.",
        user_agent: SDK_AGENT,
        tools: &["search_code", "run_tests", "git_diff"],
        tasks: TEST_TASKS,
        stream_share: 0.7,
        include_usage: false,
        max_tokens: Some(2048),
        temperature: 0.0,
        null_content: false,
        named_results: false,
        max_rounds: 6,
        followup: 0.4,
        titles: true,
        idle_ms: (30_000, 600_000),
    },
    Profile {
        intro: "You are a careful code reviewer. Read the changed files, check them against the \
                project's conventions, and leave short, actionable review comments; praise \
                nothing and nitpick only when it matters.",
        user_agent: "other-agent/2.3.1",
        tools: &["read_file", "list_dir", "post_comment"],
        tasks: REVIEW_TASKS,
        stream_share: 0.3,
        include_usage: true,
        max_tokens: None,
        temperature: 0.7,
        null_content: true,
        named_results: true,
        max_rounds: 7,
        followup: 0.5,
        titles: true,
        idle_ms: (60_000, 900_000),
    },
];

fn tool_schema(name: &str) -> Value {
    let path = json!({"type": "string", "description": "Path relative to the repository root."});
    let (description, properties, required): (&str, Value, &[&str]) = match name {
        "read_file" => (
            "Read a file from the repository. Returns its content with line numbers. For large \
             files, read a window with offset and limit.",
            json!({"path": path,
                   "offset": {"type": "integer", "description": "First line to read, 1-based."},
                   "limit": {"type": "integer", "description": "Number of lines to read."}}),
            &["path"],
        ),
        "list_dir" => (
            "List a directory of the repository, one entry per line, directories ending in /.",
            json!({"path": path,
                   "depth": {"type": "integer", "description": "How deep to recurse (default 1)."}}),
            &["path"],
        ),
        "write_file" => (
            "Write a file in the repository, replacing it if it exists. Prefer edit_file for \
             changes to existing files.",
            json!({"path": path, "content": {"type": "string", "description": "The whole new content."}}),
            &["path", "content"],
        ),
        "edit_file" => (
            "Replace one exact occurrence of old_text by new_text in a file. Fails when old_text \
             does not occur exactly once.",
            json!({"path": path,
                   "old_text": {"type": "string", "description": "Text to replace, verbatim."},
                   "new_text": {"type": "string", "description": "Replacement text."}}),
            &["path", "old_text", "new_text"],
        ),
        "run_shell" => (
            "Run a shell command in the repository root and return its exit status, standard \
             output and standard error. Commands time out after 120 seconds.",
            json!({"command": {"type": "string", "description": "The command line."},
                   "timeout_s": {"type": "integer", "description": "Timeout in seconds."}}),
            &["command"],
        ),
        "search_code" => (
            "Search the repository for a regular expression and return matching lines as \
             path:line: text, at most 50.",
            json!({"pattern": {"type": "string", "description": "A Rust regular expression."},
                   "glob": {"type": "string", "description": "Only files matching this glob."}}),
            &["pattern"],
        ),
        "run_tests" => (
            "Run the test suite, or the tests whose names contain filter, and return the \
             summary and the output of failing tests.",
            json!({"filter": {"type": "string", "description": "Substring of test names."}}),
            &[],
        ),
        "git_diff" => (
            "Show the diff of the working tree against a revision (default HEAD).",
            json!({"revision": {"type": "string", "description": "A git revision."},
                   "path": path}),
            &[],
        ),
        _ => (
            "Post a review comment on a line of the pull request under review.",
            json!({"path": path,
                   "line": {"type": "integer", "description": "Line number in the new file."},
                   "body": {"type": "string", "description": "The comment, Markdown."}}),
            &["path", "line", "body"],
        ),
    };
    json!({
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    })
}

// ---------------------------------------------------------------------------------------------
// Text pools

const PROJECTS: &[&str] = &[
    "ledger-core",
    "tiny-http",
    "geo-index",
    "invoice-service",
    "mdbook-lint",
    "sensor-gateway",
    "chess-engine",
    "feed-parser",
];

const RULES: &[&str] = &[
    "Never invent file contents: if you have not read a file in this conversation, read it \
     before you reason about it. Paths are relative to the repository root and use forward \
     slashes on every platform.",
    "Keep changes minimal. Do not reformat code you are not otherwise changing, do not rename \
     things for taste, and do not add dependencies unless the user asks for them explicitly.",
    "After editing Rust code, run `cargo build` and fix every error and warning you introduced. \
     Run the relevant tests with `cargo test <filter>` rather than the whole suite when it is \
     large.",
    "When a command fails, read its output carefully before trying again. Do not repeat the \
     same command hoping for a different result; change something first and say what.",
    "Answer in the language of the user's last message. Use Markdown for code, backticks for \
     identifiers and paths, and keep prose short: the user reads diffs, not essays.",
    "Tool calls are expensive for the user. Batch independent reads into one turn when you can, \
     and prefer reading a window of a large file to reading all of it.",
    "Security: never print secrets, tokens or the contents of .env files, never run commands \
     that send data off the machine, and refuse to weaken authentication checks.",
    "Style: follow the conventions already in the file you edit. Error messages are lowercase \
     without a trailing period; public items have a documentation comment saying what, not \
     how.",
    "If the task is ambiguous, make the most reasonable assumption, state it in one sentence, \
     and carry on; ask a question only when a wrong guess would destroy work.",
    "Git: do not commit, push, rebase or change branches. The user reviews the working tree \
     and commits themselves. Leave untracked files you did not create alone.",
    "Tests are part of the change: when you fix a bug, add a test that fails without the fix; \
     when you add a feature, add a test that shows it working on the smallest useful input.",
    "Output budget: your final answer is at most ten lines unless the user asks for more. Do \
     not restate the task, do not list the tools you used, do not apologise.",
];

const FILES: &[&str] = &[
    "src/main.rs",
    "src/lib.rs",
    "src/config.rs",
    "src/parser.rs",
    "src/error.rs",
    "src/server/mod.rs",
    "src/server/routes.rs",
    "src/server/auth.rs",
    "src/db/mod.rs",
    "src/db/schema.rs",
    "src/cache.rs",
    "src/cli.rs",
    "src/metrics.rs",
    "tests/integration.rs",
    "tests/parser.rs",
    "benches/throughput.rs",
    "Cargo.toml",
    "README.md",
];

const DIR_ENTRIES: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "README.md",
    "LICENSE",
    "src/",
    "tests/",
    "benches/",
    "examples/",
    "docs/",
    "main.rs",
    "lib.rs",
    "config.rs",
    "parser.rs",
    "error.rs",
    "server/",
    "db/",
    "cache.rs",
    "cli.rs",
    "metrics.rs",
    ".github/",
];

const CODE_LINES: &[&str] = &[
    "use std::collections::HashMap;",
    "use std::path::{Path, PathBuf};",
    "use serde::{Deserialize, Serialize};",
    "",
    "#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]",
    "pub struct Config {",
    "    pub listen: String,",
    "    pub upstream: String,",
    "    pub max_body_bytes: u64,",
    "    pub timeout_ms: u64,",
    "}",
    "impl Config {",
    "    /// Reads the configuration file, falling back to defaults for missing keys.",
    "    pub fn load(path: &Path) -> Result<Config, Error> {",
    "        let text = std::fs::read_to_string(path).map_err(|e| Error::Io(path.into(), e))?;",
    "        toml::from_str(&text).map_err(|e| Error::Parse(e.to_string()))",
    "    }",
    "pub fn parse_line(line: &str) -> Option<(&str, &str)> {",
    "    let (key, value) = line.split_once('=')?;",
    "    Some((key.trim(), value.trim()))",
    "    for (i, line) in text.lines().enumerate() {",
    "        if line.starts_with('#') || line.trim().is_empty() {",
    "            continue;",
    "        }",
    "        match parse_line(line) {",
    "            Some((k, v)) => { map.insert(k.to_string(), v.to_string()); }",
    "            None => return Err(Error::Syntax { line: i + 1 }),",
    "    let mut cache: HashMap<String, Entry> = HashMap::with_capacity(capacity);",
    "    if let Some(entry) = cache.get(&key) && entry.expires_at > now {",
    "        return Ok(entry.value.clone());",
    "    }",
    "    let response = client.get(&url).header(\"accept\", \"application/json\").send()?;",
    "    tracing::debug!(status = %response.status(), \"upstream answered\");",
    "#[cfg(test)]",
    "mod tests {",
    "    use super::*;",
    "    #[test]",
    "    fn parses_a_key_and_a_value() {",
    "        assert_eq!(parse_line(\"a = 1\"), Some((\"a\", \"1\")));",
    "    fn empty_input_is_an_error() {",
    "        assert!(matches!(Config::from_str(\"\"), Err(Error::Empty)));",
    "        let elapsed = started.elapsed().as_millis() as u64;",
    "        metrics.histogram(\"request_ms\").record(elapsed);",
    "    Ok(())",
    "}",
];

const TASKS: &[&str] = &[
    "Fix the failing test in {file}. It started failing after yesterday's refactor.",
    "Add a --verbose flag to the CLI and pass it through to {file}.",
    "Why does {file} panic on empty input? Find out and fix it.",
    "Refactor {file} so that the parsing is separate from the I/O.",
    "Add documentation comments to the public items in {file}.",
    "The timeout in {file} is ignored for slow upstreams. Make it apply to the whole request.",
    "Replace the unwraps in {file} with proper error handling.",
    "Add a cache in front of the lookup in {file}; entries should expire after five minutes.",
    "Make {file} compile on stable Rust; it uses a nightly-only feature somewhere.",
    "Implement the TODO in {file} and add a test for it.",
];

const SUBAGENT_TASKS: &[&str] = &[
    "As a subagent that only reads files: where is the configuration loaded? Start from {file}.",
    "As a subagent that only reads files: list every caller of the parser in {file}.",
    "As a subagent that only reads files: what does {file} do, in three sentences?",
    "As a subagent that only reads files: which errors can {file} return, and where?",
    "As a subagent that only reads files: find the tests that cover {file}.",
];

const TEST_TASKS: &[&str] = &[
    "CI run 4411 failed on the change to {file}. Find the failing tests and the cause.",
    "Run the tests affected by the diff in {file} and report what fails.",
    "The integration tests are flaky since {file} changed. Find the flaky one.",
    "Check that the fix in {file} is covered by a test, and run it.",
];

const REVIEW_TASKS: &[&str] = &[
    "Review the pull request that touches {file}.",
    "Review the change to {file}; the author says it is a pure refactor.",
    "Second review of {file}: the first reviewer asked for error handling. Check it is done.",
];

/// Appended to every task, so that two conversations rarely start with the same words.
const CONTEXTS: &[&str] = &[
    "It was reported in issue #{n}.",
    "See the CI log of run {n}.",
    "The customer ticket is SUP-{n}.",
    "This blocks release 0.{n}.",
    "It only happens with inputs over {n} bytes.",
    "Benchmarks regressed by {n} microseconds since then.",
    "Keep the diff under {n} lines if you can.",
    "Context: pull request #{n}.",
];

const FOLLOWUPS: &[&str] = &[
    "Looks good. Now add a test for it.",
    "Can you also handle the error case?",
    "Run the tests again, please.",
    "Please keep the change smaller; revert the formatting changes.",
    "What about the same problem in the server module?",
    "Thanks. Can you explain why that fixes it?",
    "That broke the build on my machine. Can you look again?",
    "Good. Now update the README to match.",
    "Also rename the function to something clearer.",
    "Is there anything else in that file with the same bug?",
];

const REASONING: &[&str] = &[
    "The user wants me to look at the file before changing anything.",
    "I should read the file first to see how the function is used.",
    "The error message suggests the input is empty when it reaches the parser.",
    "There may be more callers; listing the directory will tell me.",
    "The test expects an error but the function returns a default value.",
    "I need to check the configuration loading path as well.",
    "Running the tests will confirm whether the change fixes the failure.",
    "The diff shows the timeout was moved but not applied to the body read.",
    "This looks like an off-by-one in the line numbering.",
    "I will make the smallest change that fixes the problem and then build.",
    "The previous tool output shows the build succeeded, so now I run the tests.",
    "Let me search for other uses of this function before renaming it.",
];

const ANSWERS: &[&str] = &[
    "I changed the parser to return an error on empty input instead of panicking.",
    "The build passes and the tests that cover the change pass too.",
    "The timeout now applies to the whole request, including reading the body.",
    "I added a test that fails without the fix and passes with it.",
    "The function is only called from the server module, so the change is safe.",
    "Configuration is loaded once at startup in `main` and passed down by reference.",
    "Two tests fail: both expect the old error message, which the change reworded.",
    "The failure comes from the change to the default port in the configuration.",
    "I left the formatting of the untouched code as it was.",
    "There is one more place with the same pattern; I fixed it too.",
    "The change is a pure refactor except for one behaviour change in error reporting.",
    "Consider returning a typed error here instead of a string.",
    "The new code holds the lock across an await point, which can deadlock under load.",
    "Everything else looks fine to me.",
];

const TITLE_WORDS: &[&str] = &[
    "Fix", "parser", "panic", "config", "timeout", "tests", "refactor", "cache", "review", "error",
    "handling", "CLI", "flag", "docs", "server", "flaky", "build", "lookup",
];

const SUMMARY_REQUEST: &str = "Your context is almost full. Summarize the conversation so far: \
     the task, what you found, what you changed (files and functions), what is still left to \
     do, and anything the user asked you to keep in mind. The summary replaces the history.";

const TITLE_PROMPT: &str =
    "Write a five-word title for this conversation. Reply with the title only.";

const MODEL: &str = "qwen3-coder";
const SERVED_MODEL: &str = "/models/Qwen3-Coder-30B-A3B-Instruct-Q4_K_M.gguf";
const FINGERPRINT: &str = "b6210-8f2a1c3";

// ---------------------------------------------------------------------------------------------
// The simulation

/// One message of a history, with what the server model needs to know about it.
#[derive(Clone)]
struct Msg {
    value: Value,
    /// Serialized length, bytes.
    len: usize,
    /// Identity in the slot's prefix (equal messages at equal positions share it).
    seg: u64,
    tokens: u32,
}

struct ToolSet {
    value: Value,
    len: usize,
    seg: u64,
    tokens: u32,
}

#[derive(Clone, Copy, PartialEq)]
enum Reply {
    Tools,
    Answer,
    Summary,
}

struct Lane {
    profile: usize,
    conn: u64,
    title_conn: u64,
    project: &'static str,
    /// The system prompt without its date line.
    stem: String,
    stem_seg: u64,
    stem_tokens: u32,
    /// The day the system prompt says, its message and the date line's segment.
    day: i64,
    system: Msg,
    date_seg: u64,
    date_tokens: u32,
    history: Vec<Msg>,
    history_chars: usize,
    rounds_left: u64,
    compact_at: usize,
    summarizing: bool,
    next_start: i64,
    title: Option<(i64, Msg)>,
}

struct Call {
    id: String,
    name: &'static str,
    arguments: String,
    path: &'static str,
}

struct Output {
    reasoning: Option<String>,
    content: String,
    calls: Vec<Call>,
    finish: &'static str,
    predicted_n: u32,
}

struct Sim<'a> {
    config: &'a WorkloadConfig,
    rng: Rng,
    lanes: Vec<Lane>,
    tools: Vec<ToolSet>,
    title_system: Msg,
    next_id: u64,
    next_seg: u64,
    last_start: i64,
    server_free: i64,
    /// Segments of the prompt the slot holds.
    slot: Vec<(u64, u32)>,
    day: i64,
}

impl<'a> Sim<'a> {
    fn new(config: &'a WorkloadConfig) -> Sim<'a> {
        let mut rng = Rng::new(config.seed);
        let mut next_seg = 1;
        let tools = PROFILES
            .iter()
            .map(|p| {
                let value = Value::Array(p.tools.iter().map(|name| tool_schema(name)).collect());
                let len = json_len(&value);
                next_seg += 1;
                ToolSet {
                    value,
                    len,
                    seg: next_seg,
                    tokens: tokens_of(len) + 8,
                }
            })
            .collect();
        next_seg += 1;
        let title_system = make_msg(
            json!({"role": "system", "content": TITLE_PROMPT}),
            TITLE_PROMPT.len(),
            next_seg,
        );
        let day = config.start_ms.div_euclid(86_400_000);
        let agents = config.agents.max(1);
        let mut lanes = Vec::with_capacity(agents);
        for i in 0..agents {
            let profile = i % PROFILES.len();
            let project = PROJECTS[(i / PROFILES.len() + profile) % PROJECTS.len()];
            let mut stem = String::with_capacity(4200);
            stem.push_str(PROFILES[profile].intro);
            let _ = writeln!(
                stem,
                "\n\nThe repository is {project}, checked out at /home/dev/src/{project}. \
                 The user is a developer on the {project} team."
            );
            let target = rng.range(1_000, 3_800) as usize;
            let first = rng.below(RULES.len());
            let mut k = 0;
            while stem.len() < target {
                stem.push_str("\n- ");
                stem.push_str(RULES[(first + k) % RULES.len()]);
                k += 1;
                if k % RULES.len() == 0 {
                    stem.push_str("\n\nRemember:");
                }
            }
            stem.push_str("\n\n");
            next_seg += 1;
            let stem_seg = next_seg;
            let stem_tokens = tokens_of(stem.len());
            let placeholder = make_msg(Value::Null, 0, 0);
            let start = config.start_ms + rng.range(0, 20_000) as i64 + 1_500 * i as i64;
            lanes.push(Lane {
                profile,
                conn: i as u64 + 1,
                title_conn: (agents + i) as u64 + 1,
                project,
                stem,
                stem_seg,
                stem_tokens,
                day: i64::MIN,
                system: placeholder,
                date_seg: 0,
                date_tokens: 0,
                history: Vec::new(),
                history_chars: 0,
                rounds_left: 0,
                compact_at: 0,
                summarizing: false,
                next_start: start,
                title: None,
            });
        }
        Sim {
            config,
            rng,
            lanes,
            tools,
            title_system,
            next_id: 0,
            next_seg,
            last_start: i64::MIN,
            server_free: i64::MIN,
            slot: Vec::new(),
            day,
        }
    }

    fn seg(&mut self) -> u64 {
        self.next_seg += 1;
        self.next_seg
    }

    fn msg(&mut self, value: Value, chars: usize) -> Msg {
        let seg = self.seg();
        make_msg(value, chars, seg)
    }

    fn next_record(&mut self) -> Record {
        let mut best: (i64, usize, bool) = (i64::MAX, 0, false);
        for (i, lane) in self.lanes.iter().enumerate() {
            if lane.next_start < best.0 {
                best = (lane.next_start, i, false);
            }
            if let Some((at, _)) = lane.title
                && at < best.0
            {
                best = (at, i, true);
            }
        }
        let (at, lane, title) = best;
        let t_start = if self.last_start == i64::MIN {
            at
        } else {
            at.max(self.last_start + 1)
        };
        self.last_start = t_start;
        self.next_id += 1;
        if self.rng.chance(self.config.date_change_rate) {
            self.day += 1;
        }
        if title {
            self.title_call(lane, t_start)
        } else {
            self.turn(lane, t_start)
        }
    }

    /// The one slot: the common prefix with the previous prompt, then the slot holds this one.
    fn serve(&mut self, segs: Vec<(u64, u32)>) -> (u32, u32) {
        let total: u32 = segs.iter().map(|s| s.1).sum::<u32>() + 3;
        let common: u32 = self
            .slot
            .iter()
            .zip(&segs)
            .take_while(|(a, b)| a.0 == b.0)
            .map(|(_, b)| b.1)
            .sum();
        let cache_n = if common == 0 {
            self.rng.range(0, 4) as u32
        } else {
            common
        };
        let cache_n = cache_n.min(total - 1);
        self.slot = segs;
        (cache_n, total)
    }

    fn refresh_system(&mut self, li: usize) {
        if self.lanes[li].day == self.day {
            return;
        }
        let (year, month, dom) = civil_from_days(self.day);
        let weekday = WEEKDAYS[(self.day + 4).rem_euclid(7) as usize];
        let line = format!("Today is {weekday}, {year:04}-{month:02}-{dom:02}.");
        let date_seg = self.seg();
        let system_seg = self.seg();
        let lane = &mut self.lanes[li];
        let mut text = String::with_capacity(lane.stem.len() + line.len());
        text.push_str(&lane.stem);
        text.push_str(&line);
        let chars = text.len();
        lane.system = make_msg(
            json!({"role": "system", "content": text}),
            chars,
            system_seg,
        );
        lane.day = self.day;
        lane.date_seg = date_seg;
        lane.date_tokens = tokens_of(line.len()).max(1);
    }

    fn push(&mut self, li: usize, msg: Msg, chars: usize) {
        let lane = &mut self.lanes[li];
        lane.history_chars += chars;
        lane.history.push(msg);
    }

    fn start_conversation(&mut self, li: usize, t_start: i64) {
        let profile = &PROFILES[self.lanes[li].profile];
        let template = self.rng.pick(profile.tasks);
        let file = self.rng.pick(FILES);
        let mut text = template.replace("{file}", file);
        let context = self.rng.pick(CONTEXTS);
        let n = self.rng.range(100, 9_999);
        text.push(' ');
        text.push_str(&context.replace("{n}", &n.to_string()));
        let chars = text.len();
        let user = self.msg(json!({"role": "user", "content": text}), chars);
        let lane = &mut self.lanes[li];
        lane.history.clear();
        lane.history_chars = 0;
        lane.summarizing = false;
        let context = self.config.context_chars as u64;
        lane.compact_at =
            self.rng
                .range(context / 5 * 3, context.saturating_mul(7) / 5) as usize;
        lane.rounds_left = 1 + self.rng.range(0, profile.max_rounds.saturating_sub(1));
        if profile.titles && self.rng.chance(self.config.title_share) {
            let delay = self.rng.range(2, 60) as i64;
            lane.title = Some((t_start + delay, user.clone()));
        }
        self.push(li, user, chars);
    }

    fn turn(&mut self, li: usize, t_start: i64) -> Record {
        if self.lanes[li].history.is_empty() {
            self.start_conversation(li, t_start);
        }
        self.refresh_system(li);
        let profile = &PROFILES[self.lanes[li].profile];
        let stream = self.rng.chance(profile.stream_share);
        let reply = if self.lanes[li].summarizing {
            Reply::Summary
        } else if self.lanes[li].rounds_left > 0 {
            Reply::Tools
        } else {
            Reply::Answer
        };

        // The request.
        let lane = &self.lanes[li];
        let tools = &self.tools[lane.profile];
        let mut map = Map::new();
        map.insert("model".into(), Value::from(MODEL));
        if let Some(max) = profile.max_tokens {
            map.insert("max_tokens".into(), Value::from(max));
        }
        map.insert("temperature".into(), Value::from(profile.temperature));
        map.insert("stream".into(), Value::Bool(stream));
        if stream && profile.include_usage {
            map.insert("stream_options".into(), json!({"include_usage": true}));
        }
        let mut body_len = json_len_object(&map);
        let mut messages = Vec::with_capacity(lane.history.len() + 1);
        let mut messages_len = 1 + lane.system.len;
        messages.push(lane.system.value.clone());
        let mut segs = Vec::with_capacity(lane.history.len() + 3);
        segs.push((lane.stem_seg, lane.stem_tokens));
        segs.push((lane.date_seg, lane.date_tokens));
        segs.push((tools.seg, tools.tokens));
        for m in &lane.history {
            messages.push(m.value.clone());
            messages_len += 1 + m.len;
            segs.push((m.seg, m.tokens));
        }
        body_len += member_len("messages", messages_len + 1);
        body_len += member_len("tools", tools.len);
        map.insert("messages".into(), Value::Array(messages));
        map.insert("tools".into(), tools.value.clone());
        let request = request_record(Value::Object(map), body_len, profile.user_agent);

        // The reply.
        let (cache_n, total) = self.serve(segs);
        let output = match reply {
            Reply::Tools => self.tool_output(li),
            Reply::Answer => self.answer_output(profile.max_tokens, 120, 900),
            Reply::Summary => self.answer_output(profile.max_tokens, 1_200, 2_800),
        };
        let (record, t_end) = self.finish(li, request, t_start, (cache_n, total), &output, stream);

        // The harness carries on.
        match reply {
            Reply::Tools => {
                self.lanes[li].rounds_left -= 1;
                let pause = self.continue_after_tools(li, output);
                self.lanes[li].next_start = t_end + pause;
                if self.lanes[li].history_chars > self.lanes[li].compact_at {
                    let chars = SUMMARY_REQUEST.len();
                    let ask = self.msg(json!({"role": "user", "content": SUMMARY_REQUEST}), chars);
                    self.push(li, ask, chars);
                    self.lanes[li].summarizing = true;
                }
            }
            Reply::Summary => {
                let text = format!(
                    "This session continues a previous conversation that ran out of context. \
                     The summary below covers it.\n\n{}\n\nContinue with the task where it \
                     was left off.",
                    output.content
                );
                let chars = text.len();
                let user = self.msg(json!({"role": "user", "content": text}), chars);
                let lane = &mut self.lanes[li];
                lane.history.clear();
                lane.history_chars = 0;
                lane.summarizing = false;
                lane.rounds_left = lane.rounds_left.max(1);
                lane.next_start = t_end + self.rng.range(100, 900) as i64;
                self.push(li, user, chars);
            }
            Reply::Answer => {
                let chars = output.content.len();
                let answer = self.msg(
                    json!({"role": "assistant", "content": output.content}),
                    chars,
                );
                self.push(li, answer, chars);
                if self.rng.chance(profile.followup) {
                    let text = self.rng.pick(FOLLOWUPS);
                    let user = self.msg(json!({"role": "user", "content": text}), text.len());
                    self.push(li, user, text.len());
                    self.lanes[li].rounds_left = self.rng.range(0, profile.max_rounds);
                    self.lanes[li].next_start = t_end + self.rng.range(5_000, 180_000) as i64;
                } else {
                    self.lanes[li].history.clear();
                    let (lo, hi) = profile.idle_ms;
                    self.lanes[li].next_start = t_end + self.rng.range(lo, hi) as i64;
                }
            }
        }
        record
    }

    /// Appends the assistant's tool calls and their results; the milliseconds the tools took.
    fn continue_after_tools(&mut self, li: usize, output: Output) -> i64 {
        let profile = &PROFILES[self.lanes[li].profile];
        let calls: Vec<Value> = output
            .calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        let call_chars: usize = output
            .calls
            .iter()
            .map(|c| c.name.len() + c.arguments.len())
            .sum();
        let content = if profile.null_content {
            Value::Null
        } else {
            Value::from("")
        };
        let assistant = self.msg(
            json!({"role": "assistant", "content": content, "tool_calls": calls}),
            call_chars,
        );
        self.push(li, assistant, call_chars);
        let mut pause = 0;
        for Call {
            id,
            name,
            arguments,
            path,
        } in output.calls
        {
            let (result, ms) = self.tool_result(li, name, &arguments, path);
            pause = pause.max(ms);
            let chars = result.len();
            let value = if profile.named_results {
                json!({"role": "tool", "tool_call_id": id, "name": name, "content": result})
            } else {
                json!({"role": "tool", "tool_call_id": id, "content": result})
            };
            let msg = self.msg(value, chars);
            self.push(li, msg, chars);
        }
        pause + self.rng.range(20, 400) as i64
    }

    fn title_call(&mut self, li: usize, t_start: i64) -> Record {
        let Some((_, user)) = self.lanes[li].title.take() else {
            return self.turn(li, t_start);
        };
        let max_tokens = [12u32, 16, 24, 32][self.rng.below(4)];
        let mut map = Map::new();
        map.insert("model".into(), Value::from(MODEL));
        map.insert("max_tokens".into(), Value::from(max_tokens));
        map.insert("temperature".into(), Value::from(0.3));
        map.insert("stream".into(), Value::Bool(false));
        let body_len =
            json_len_object(&map) + member_len("messages", 3 + self.title_system.len + user.len);
        let segs = vec![
            (self.title_system.seg, self.title_system.tokens),
            (user.seg, user.tokens),
        ];
        map.insert(
            "messages".into(),
            Value::Array(vec![self.title_system.value.clone(), user.value]),
        );
        let profile = &PROFILES[self.lanes[li].profile];
        let request = request_record(Value::Object(map), body_len, profile.user_agent);
        let served = self.serve(segs);
        let words = self.rng.range(3, 6) as usize;
        let mut content = String::new();
        for w in 0..words {
            if w > 0 {
                content.push(' ');
            }
            content.push_str(self.rng.pick(TITLE_WORDS));
        }
        let predicted = (words as u32 * 3 / 2 + 1).min(max_tokens);
        let output = Output {
            reasoning: None,
            content,
            calls: Vec::new(),
            finish: if predicted == max_tokens {
                "length"
            } else {
                "stop"
            },
            predicted_n: predicted,
        };
        let conn = self.lanes[li].title_conn;
        let (mut record, _) = self.finish(li, request, t_start, served, &output, false);
        record.conn = conn;
        record
    }

    fn reasoning(&mut self) -> Option<String> {
        self.rng.chance(0.6).then(|| {
            let min = self.rng.range(60, 500) as usize;
            self.rng.prose(REASONING, min)
        })
    }

    fn answer_output(&mut self, max_tokens: Option<u32>, lo: u64, hi: u64) -> Output {
        let reasoning = self.reasoning();
        let min = self.rng.range(lo, hi) as usize;
        let mut content = self.rng.prose(ANSWERS, min);
        let reasoning_tokens = reasoning.as_ref().map_or(0, |r| tokens_of(r.len()));
        let mut predicted_n = reasoning_tokens + tokens_of(content.len()) + 1;
        let mut finish = "stop";
        if let Some(max) = max_tokens
            && predicted_n > max
        {
            predicted_n = max;
            finish = "length";
            let keep = (max.saturating_sub(reasoning_tokens) as usize * 4).min(content.len());
            content.truncate(keep);
        }
        Output {
            reasoning,
            content,
            calls: Vec::new(),
            finish,
            predicted_n,
        }
    }

    fn tool_output(&mut self, li: usize) -> Output {
        let profile = &PROFILES[self.lanes[li].profile];
        let reasoning = self.reasoning();
        let n = match self.rng.below(20) {
            0 => 3,
            1..=3 => 2,
            _ => 1,
        };
        let mut calls = Vec::with_capacity(n);
        let mut chars = 0;
        for _ in 0..n {
            let name = profile.tools[self.rng.below(profile.tools.len())];
            let path = self.rng.pick(FILES);
            let arguments = self.arguments(name, path);
            chars += name.len() + arguments.len();
            let id = self.rng.token("call_", 24);
            calls.push(Call {
                id,
                name,
                arguments,
                path,
            });
        }
        let reasoning_tokens = reasoning.as_ref().map_or(0, |r| tokens_of(r.len()));
        let predicted_n = reasoning_tokens + tokens_of(chars) + 8 * n as u32;
        Output {
            reasoning,
            content: String::new(),
            calls,
            finish: "tool_calls",
            predicted_n,
        }
    }

    fn code(&mut self, lines: usize) -> String {
        let mut s = String::with_capacity(lines * 40);
        let first = self.rng.below(CODE_LINES.len());
        for k in 0..lines {
            s.push_str(CODE_LINES[(first + k * 7 + k / CODE_LINES.len()) % CODE_LINES.len()]);
            s.push('\n');
        }
        s
    }

    fn arguments(&mut self, name: &str, file: &str) -> String {
        let value = match name {
            "read_file" => {
                if self.rng.chance(0.25) {
                    let offset = self.rng.range(1, 400);
                    json!({"path": file, "offset": offset, "limit": 120})
                } else {
                    json!({"path": file})
                }
            }
            "list_dir" => {
                let path = self
                    .rng
                    .pick(&["src", "tests", ".", "src/server", "src/db"]);
                json!({"path": path})
            }
            "write_file" => {
                let lines = self.rng.range(8, 40) as usize;
                json!({"path": file, "content": self.code(lines)})
            }
            "edit_file" => {
                let (a, b) = (
                    self.rng.range(1, 6) as usize,
                    self.rng.range(1, 10) as usize,
                );
                json!({"path": file, "old_text": self.code(a), "new_text": self.code(b)})
            }
            "run_shell" => {
                let command = self.rng.pick(&[
                    "cargo build",
                    "cargo test",
                    "cargo clippy --all-targets",
                    "git status --short",
                    "cargo test parser",
                    "rg -n TODO src",
                ]);
                json!({"command": command})
            }
            "search_code" => {
                let pattern = self.rng.pick(&[
                    "fn load",
                    "unwrap\\(\\)",
                    "timeout",
                    "Error::",
                    "impl .* for Config",
                    "#\\[test\\]",
                ]);
                json!({"pattern": pattern})
            }
            "run_tests" => {
                let filter =
                    self.rng
                        .pick(&["parser", "config", "server::routes", "integration", ""]);
                json!({"filter": filter})
            }
            "git_diff" => json!({"path": file}),
            _ => {
                let line = self.rng.range(1, 300);
                let body = self.rng.prose(ANSWERS, 80);
                json!({"path": file, "line": line, "body": body})
            }
        };
        value.to_string()
    }

    /// A tool's result and how long it took, ms.
    fn tool_result(&mut self, li: usize, name: &str, arguments: &str, path: &str) -> (String, i64) {
        match name {
            "read_file" => {
                let lines = self.rng.range(10, 130) as usize;
                let mut s = String::with_capacity(lines * 46);
                let first = self.rng.below(CODE_LINES.len());
                let start = self.rng.range(1, 200) as usize;
                for k in 0..lines {
                    let line = CODE_LINES[(first + k) % CODE_LINES.len()];
                    let _ = writeln!(s, "{:>5}\t{line}", start + k);
                }
                (s, self.rng.range(5, 60) as i64)
            }
            "list_dir" => {
                let n = self.rng.range(4, 20) as usize;
                let first = self.rng.below(DIR_ENTRIES.len());
                let s: Vec<&str> = (0..n)
                    .map(|k| DIR_ENTRIES[(first + k) % DIR_ENTRIES.len()])
                    .collect();
                (s.join("\n"), self.rng.range(5, 40) as i64)
            }
            "write_file" | "edit_file" => {
                let s = format!("Wrote {} bytes to {path}.", arguments.len());
                (s, self.rng.range(5, 30) as i64)
            }
            "run_shell" | "run_tests" => {
                let project = self.lanes[li].project;
                let n = self.rng.range(3, 40) as usize;
                let mut s = format!("   Compiling {project} v0.3.1 (/home/dev/src/{project})\n");
                s.push_str("    Finished `test` profile [unoptimized + debuginfo] target(s)\n");
                let _ = writeln!(s, "running {n} tests");
                let mut failed = 0;
                for k in 0..n {
                    let ok = !self.rng.chance(0.08);
                    failed += usize::from(!ok);
                    let status = if ok { "ok" } else { "FAILED" };
                    let module =
                        ["parser", "config", "server::routes", "cache", "db::schema"][k % 5];
                    let _ = writeln!(s, "test {module}::tests::case_{k} ... {status}");
                }
                let _ = writeln!(
                    s,
                    "\ntest result: {}. {} passed; {failed} failed; 0 ignored; finished in {}.{:02}s",
                    if failed == 0 { "ok" } else { "FAILED" },
                    n - failed,
                    self.rng.range(0, 9),
                    self.rng.range(0, 99),
                );
                (s, self.rng.range(1_500, 25_000) as i64)
            }
            "search_code" => {
                let n = self.rng.range(1, 25) as usize;
                let mut s = String::with_capacity(n * 60);
                for _ in 0..n {
                    let file = self.rng.pick(FILES);
                    let line = self.rng.range(1, 400);
                    let text = self.rng.pick(CODE_LINES);
                    let _ = writeln!(s, "{file}:{line}: {}", text.trim());
                }
                (s, self.rng.range(20, 300) as i64)
            }
            "git_diff" => {
                let file = self.rng.pick(FILES);
                let mut s = format!("diff --git a/{file} b/{file}\n--- a/{file}\n+++ b/{file}\n");
                let hunks = self.rng.range(1, 4);
                for _ in 0..hunks {
                    let at = self.rng.range(1, 300);
                    let _ = writeln!(s, "@@ -{at},7 +{at},8 @@");
                    let lines = self.rng.range(4, 14) as usize;
                    let first = self.rng.below(CODE_LINES.len());
                    for k in 0..lines {
                        let sign = [" ", " ", "-", "+"][self.rng.below(4)];
                        s.push_str(sign);
                        s.push_str(CODE_LINES[(first + k) % CODE_LINES.len()]);
                        s.push('\n');
                    }
                }
                (s, self.rng.range(10, 80) as i64)
            }
            _ => {
                let s = format!("Comment posted (#{}).", self.rng.range(1_000, 99_999));
                (s, self.rng.range(100, 900) as i64)
            }
        }
    }

    /// Times the exchange on the server and builds its record; also returns `t_end_ms`.
    fn finish(
        &mut self,
        li: usize,
        request: RequestRecord,
        t_start: i64,
        (cache_n, total): (u32, u32),
        output: &Output,
        stream: bool,
    ) -> (Record, i64) {
        let usage = !stream || PROFILES[self.lanes[li].profile].include_usage;
        let prompt_n = total - cache_n;
        let predicted_n = output.predicted_n.max(1);
        let prompt_ms = round3(
            f64::from(prompt_n) * 1000.0 / self.config.prefill_tokens_per_s.max(1.0)
                * self.rng.between(0.92, 1.08)
                + self.rng.between(2.0, 12.0),
        );
        let predicted_ms = round3(
            f64::from(predicted_n) * 1000.0 / self.config.decode_tokens_per_s.max(1.0)
                * self.rng.between(0.9, 1.1),
        );
        let begin = if self.config.out_of_order {
            t_start + self.rng.range(1, 4) as i64
        } else {
            (t_start + 1).max(self.server_free)
        };
        let first_token = begin + prompt_ms.ceil() as i64 + 1;
        let t_end = first_token + predicted_ms.ceil() as i64 + 1;
        self.server_free = t_end;

        let mut message = Map::new();
        let content = match (output.content.is_empty(), stream) {
            (true, true) => Value::Null,
            _ => Value::from(output.content.as_str()),
        };
        message.insert("content".into(), content);
        if let Some(reasoning) = &output.reasoning {
            message.insert("reasoning_content".into(), Value::from(reasoning.as_str()));
        }
        message.insert("role".into(), Value::from("assistant"));
        if !output.calls.is_empty() {
            let calls = output
                .calls
                .iter()
                .map(|c| {
                    json!({"function": {"arguments": c.arguments, "name": c.name},
                           "id": c.id, "type": "function"})
                })
                .collect();
            message.insert("tool_calls".into(), Value::Array(calls));
        }
        let mut body = json!({
            "choices": [{"finish_reason": output.finish, "index": 0, "message": message}],
            "created": t_end.div_euclid(1000),
            "id": self.rng.token("chatcmpl-", 32),
            "model": SERVED_MODEL,
            "object": "chat.completion",
            "system_fingerprint": FINGERPRINT,
            "timings": {
                "cache_n": cache_n,
                "prompt_n": prompt_n,
                "prompt_ms": prompt_ms,
                "prompt_per_token_ms": prompt_ms / f64::from(prompt_n),
                "prompt_per_second": f64::from(prompt_n) * 1000.0 / prompt_ms,
                "predicted_n": predicted_n,
                "predicted_ms": predicted_ms,
                "predicted_per_token_ms": predicted_ms / f64::from(predicted_n),
                "predicted_per_second": f64::from(predicted_n) * 1000.0 / predicted_ms,
            },
        });
        if usage && let Value::Object(object) = &mut body {
            object.insert(
                "usage".into(),
                json!({
                    "completion_tokens": predicted_n,
                    "prompt_tokens": total,
                    "prompt_tokens_details": {"cached_tokens": cache_n},
                    "total_tokens": total + predicted_n,
                }),
            );
        }
        let mut headers = BTreeMap::new();
        let response = if stream {
            let chunks = predicted_n + 2 + u32::from(usage);
            let body_bytes = u64::from(chunks) * self.rng.range(250, 330) + json_len(&body) as u64;
            headers.insert("content-type".into(), "text/event-stream".into());
            headers.insert("transfer-encoding".into(), "chunked".into());
            ResponseRecord {
                status: 200,
                headers,
                stream: Some(StreamKind::Sse),
                chunks: Some(chunks),
                bad_chunks: Some(0),
                body_bytes,
                truncated: false,
                body: Some(body),
                body_text: None,
                digest: None,
            }
        } else {
            let body_bytes = json_len(&body) as u64;
            headers.insert("content-length".into(), body_bytes.to_string());
            headers.insert(
                "content-type".into(),
                "application/json; charset=utf-8".into(),
            );
            ResponseRecord {
                status: 200,
                headers,
                stream: None,
                chunks: None,
                bad_chunks: None,
                body_bytes,
                truncated: false,
                body: Some(body),
                body_text: None,
                digest: None,
            }
        };
        let record = Record {
            v: RECORD_VERSION,
            id: self.next_id,
            conn: self.lanes[li].conn,
            t_start_ms: t_start,
            t_first_byte_ms: Some(if stream { first_token } else { t_end }),
            t_end_ms: t_end,
            request,
            response: Some(response),
            error: None,
            tokens: None,
            probe: false,
        };
        (record, t_end)
    }
}

const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

fn request_record(body: Value, body_len: usize, user_agent: &str) -> RequestRecord {
    let mut headers = BTreeMap::new();
    headers.insert("content-length".into(), body_len.to_string());
    headers.insert("content-type".into(), "application/json".into());
    headers.insert("user-agent".into(), user_agent.into());
    RequestRecord {
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        headers,
        body_bytes: body_len as u64,
        body: Some(body),
        body_text: None,
        digest: None,
    }
}

fn make_msg(value: Value, chars: usize, seg: u64) -> Msg {
    let len = json_len(&value);
    Msg {
        value,
        len,
        seg,
        tokens: tokens_of(chars) + 4,
    }
}

/// ≈ 4 characters a token.
fn tokens_of(chars: usize) -> u32 {
    u32::try_from(chars.div_ceil(4)).unwrap_or(u32::MAX)
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Length of `value` as serde_json writes it compactly.
fn json_len(value: &Value) -> usize {
    match value {
        Value::Null | Value::Bool(true) => 4,
        Value::Bool(false) => 5,
        Value::Number(n) => {
            let mut counter = Counter(0);
            let _ = write!(counter, "{n}");
            counter.0
        }
        Value::String(s) => string_len(s),
        Value::Array(items) => {
            2 + items.iter().map(json_len).sum::<usize>() + items.len().saturating_sub(1)
        }
        Value::Object(map) => json_len_object(map),
    }
}

fn json_len_object(map: &Map<String, Value>) -> usize {
    2 + map
        .iter()
        .map(|(k, v)| string_len(k) + 1 + json_len(v))
        .sum::<usize>()
        + map.len().saturating_sub(1)
}

/// Counts what is written to it.
struct Counter(usize);

impl Write for Counter {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0 += s.len();
        Ok(())
    }
}

/// What `"key":value,` adds to a non-empty object.
fn member_len(key: &str, value_len: usize) -> usize {
    1 + string_len(key) + 1 + value_len
}

/// Extra bytes serde_json writes for each byte of a string: `\n` is 2 bytes, `\u0001` is 6.
const ESCAPE_EXTRA: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = 5;
        b += 1;
    }
    table[b'"' as usize] = 1;
    table[b'\\' as usize] = 1;
    table[b'\n' as usize] = 1;
    table[b'\t' as usize] = 1;
    table[b'\r' as usize] = 1;
    table[0x08] = 1;
    table[0x0c] = 1;
    table
};

fn string_len(s: &str) -> usize {
    2 + s.len()
        + s.bytes()
            .map(|b| usize::from(ESCAPE_EXTRA[usize::from(b)]))
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use prefixscope_core::record::{read_jsonl, record_line};

    fn config(records: usize, out_of_order: bool) -> WorkloadConfig {
        WorkloadConfig {
            seed: 7,
            records,
            out_of_order,
            ..WorkloadConfig::default()
        }
    }

    fn body(record: &Record) -> &Value {
        record.request.body.as_ref().unwrap()
    }

    fn messages(record: &Record) -> &Vec<Value> {
        body(record)["messages"].as_array().unwrap()
    }

    #[test]
    fn the_same_seed_gives_the_same_records_and_another_seed_others() {
        let a = generate(&config(300, true));
        assert_eq!(a, generate(&config(300, true)));
        let other = generate(&WorkloadConfig {
            seed: 8,
            ..config(300, true)
        });
        assert_ne!(a, other);
    }

    #[test]
    fn ids_are_one_to_n_in_start_order() {
        for out_of_order in [true, false] {
            let records = generate(&config(500, out_of_order));
            let ids: BTreeSet<u64> = records.iter().map(|r| r.id).collect();
            assert_eq!(ids, (1..=500).collect());
            let mut by_id = records.clone();
            by_id.sort_by_key(|r| r.id);
            assert!(by_id.windows(2).all(|w| w[0].t_start_ms < w[1].t_start_ms));
            assert!(records.windows(2).all(|w| w[0].t_end_ms <= w[1].t_end_ms));
            for r in &records {
                let first = r.t_first_byte_ms.unwrap();
                assert!(r.t_start_ms < first && first <= r.t_end_ms);
            }
        }
    }

    #[test]
    fn in_order_completes_in_start_order() {
        let records = generate(&config(800, false));
        let ids: Vec<u64> = records.iter().map(|r| r.id).collect();
        assert_eq!(ids, (1..=800).collect::<Vec<_>>());
    }

    #[test]
    fn out_of_order_differs_from_start_order_and_round_trips() {
        let records = generate(&config(1200, true));
        let displaced = records
            .iter()
            .enumerate()
            .filter(|(i, r)| r.id != *i as u64 + 1)
            .count();
        assert!(
            displaced * 20 >= records.len(),
            "only {displaced} displaced"
        );
        let mut file = Vec::new();
        for r in &records {
            let line = record_line(r);
            assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
            file.extend_from_slice(&line);
        }
        let read = read_jsonl(file.as_slice());
        assert!(read.bad_lines.is_empty(), "{:?}", read.bad_lines);
        let mut by_id = records.clone();
        by_id.sort_by_key(|r| r.id);
        assert_eq!(read.records, by_id);
    }

    #[test]
    fn body_bytes_is_the_serialized_length() {
        for r in generate(&config(200, true)) {
            let request = serde_json::to_vec(body(&r)).unwrap();
            assert_eq!(r.request.body_bytes, request.len() as u64);
            let response = r.response.as_ref().unwrap();
            if response.stream.is_none() {
                let bytes = serde_json::to_vec(response.body.as_ref().unwrap()).unwrap();
                assert_eq!(response.body_bytes, bytes.len() as u64);
            }
        }
    }

    #[test]
    fn the_traffic_has_the_shapes_the_analysis_looks_for() {
        let records = generate(&config(2400, true));
        let starts: Vec<&Record> = records
            .iter()
            .filter(|r| {
                let m = messages(r);
                body(r).get("tools").is_some()
                    && m.len() == 2
                    && !m[1]["content"]
                        .as_str()
                        .unwrap()
                        .starts_with("This session continues")
            })
            .collect();
        let conversations = starts.len();
        assert!(
            (40..=800).contains(&conversations),
            "{conversations} conversations"
        );
        let compactions = records
            .iter()
            .filter(|r| {
                messages(r).len() == 2
                    && messages(r)[1]["content"]
                        .as_str()
                        .unwrap()
                        .starts_with("This session continues")
            })
            .count();
        assert!(compactions > 0);
        let titles: Vec<&Record> = records
            .iter()
            .filter(|r| body(r).get("tools").is_none())
            .collect();
        assert!(!titles.is_empty());
        assert!(
            titles
                .iter()
                .all(|r| body(r)["max_tokens"].as_u64().unwrap() <= 32)
        );
        let streamed = records
            .iter()
            .filter(|r| r.response.as_ref().unwrap().stream == Some(StreamKind::Sse))
            .count();
        assert!(streamed > 200 && streamed < 2200, "{streamed} streamed");
        let user_agents: BTreeSet<&str> = records
            .iter()
            .map(|r| r.request.headers["user-agent"].as_str())
            .collect();
        assert_eq!(user_agents.len(), 2);
        let systems: BTreeSet<&str> = records
            .iter()
            .map(|r| messages(r)[0]["content"].as_str().unwrap())
            .collect();
        assert!(
            systems.len() > 5,
            "the date changed {} times",
            systems.len()
        );
        let timings =
            |r: &Record| r.response.as_ref().unwrap().body.as_ref().unwrap()["timings"].clone();
        let cold = records
            .iter()
            .filter(|r| timings(r)["cache_n"].as_u64().unwrap() < 8)
            .count();
        let warm = records
            .iter()
            .filter(|r| timings(r)["cache_n"].as_u64().unwrap() > 500)
            .count();
        assert!(cold > 100 && warm > 500, "{cold} cold, {warm} warm");
        let system_chars: Vec<usize> = records
            .iter()
            .filter(|r| body(r).get("tools").is_some())
            .map(|r| messages(r)[0]["content"].as_str().unwrap().len())
            .collect();
        assert!(system_chars.iter().all(|&n| (1_000..=4_500).contains(&n)));
    }

    #[test]
    fn tool_results_answer_the_calls_before_them() {
        for r in generate(&config(400, true)) {
            let mut open: Vec<String> = Vec::new();
            for m in messages(&r) {
                if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
                    assert!(open.is_empty());
                    open = calls
                        .iter()
                        .map(|c| c["id"].as_str().unwrap().to_string())
                        .collect();
                } else if m["role"] == "tool" {
                    let id = m["tool_call_id"].as_str().unwrap();
                    assert_eq!(open.remove(0), id);
                }
            }
        }
    }
}
