//! The incremental engine: records arrive one by one (in completion order) and the state after
//! each `push` equals a batch analysis of the records pushed so far.
//!
//! How (DESIGN.md, "Incremental analysis"): rows are kept in start order. A new exchange is
//! inserted where it started; its classification (turn or side-call, stateless domain) is
//! updated through hash indexes, which also tell which earlier rows changed kind. The
//! sequential pass (sessions, conversation tips, links, losses) is then re-run from the
//! earliest affected row, starting from a checkpoint of its state. In the common case (the
//! record started after every other) that is one row. Global figures that every new record
//! shifts a little (the bulk prefill rate that prices losses, client labels, tool usage,
//! findings) are worked out when a report is asked for, from what each exchange contributes,
//! taken once when it was inserted (`Facts`); rows are shared with the reports (`Arc`) and only
//! those whose label, price or evictor's label changed are written again.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::ids::{ById, IntMap};
use super::report::{self, Report};
use super::row::{Client, Row, RowKind, Shape, SharedRow, ToolUsage};
use super::table::{
    self, Choice, Link, Tip, Weights, apply_link, continues, link, structured, summarise,
    system_hash, weights,
};
use super::{Config, Skipped, findings};
use crate::normalize::exchange::{Exchange, Msg, SkipReason, ToolDef, normalize};
use crate::normalize::measured::{Measured, Source};
use crate::record::{Record, hash};
use crate::shared::Shared;

type OrderKey = (i64, u64);

fn order_key(x: &Exchange) -> OrderKey {
    (x.t_start_ms, x.id)
}

/// What a push changed, so a live view redraws only that.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Update {
    /// The new row's id, or `None` when the record was not analysed.
    pub row: Option<u64>,
    pub skipped: Option<SkipReason>,
    /// Other rows whose derivation was redone (a later-started record arrived first, or an
    /// earlier row changed kind).
    pub rederived: Vec<u64>,
}

/// What the engine takes of one record, worked out from the record alone (normalization, the
/// costliest part of a push, depends on nothing the engine holds): batch readers prepare
/// records on other threads and push them in order, with the result of `push`.
pub struct Prepared(PreparedKind);

// Nearly every record is traffic: boxing it would cost an allocation a record.
#[allow(clippy::large_enum_variant)]
enum PreparedKind {
    Probe(Box<Record>),
    Traffic {
        start_ms: i64,
        end_ms: i64,
        id: u64,
        outcome: Result<Exchange, Skipped>,
    },
}

impl Prepared {
    pub fn of(record: &Record) -> Prepared {
        if record.probe {
            return Prepared(PreparedKind::Probe(Box::new(record.clone())));
        }
        let outcome = normalize(record).map_err(|reason| Skipped {
            path: record.request.path.clone(),
            reason,
            connectivity_check: crate::normalize::exchange::is_connectivity_check(record),
        });
        Prepared(PreparedKind::Traffic {
            start_ms: record.t_start_ms,
            end_ms: record.t_end_ms,
            id: record.id,
            outcome,
        })
    }

    /// Where its record sorts in start order, as `Analyzer::from_records` pushes: pushed in
    /// this order, no row is ever derived twice.
    pub fn start_order(&self) -> (i64, u64) {
        match &self.0 {
            PreparedKind::Probe(record) => (record.t_start_ms, record.id),
            PreparedKind::Traffic { start_ms, id, .. } => (*start_ms, *id),
        }
    }
}

/// How to take back one change the sequential pass made to its state, so a rewind costs the
/// rows rewound, not the size of the state.
#[derive(Debug)]
enum Undo {
    OpenSession {
        model: u32,
        before: Option<(u32, i64)>,
    },
    NextSession(u32),
    TipMoved {
        tip: usize,
        row: usize,
        turns: u32,
    },
    TipAdded {
        tip_key: TipKey,
    },
    Indexed {
        key: (u64, u64),
        entry: (usize, usize),
    },
    Unindexed {
        key: (u64, u64),
        entry: (usize, usize),
    },
    /// A tip's request indexed under each of its message prefixes (`SeqState::by_prefix`),
    /// with its keys: positions shift on an insert before a rewind, keys do not.
    PrefixIndexed {
        tip_hash: u64,
        keys: Arc<[u64]>,
        entry: (usize, usize),
    },
    PrefixUnindexed {
        tip_hash: u64,
        keys: Arc<[u64]>,
        entry: (usize, usize),
    },
}

/// A tip's model, agent key (`agent_key`, `NONE` for none) as ids of `SeqState::names`, and
/// its session: an undo entry holds it, one or more for every row.
type TipKey = (u32, u32, u32);

#[derive(Debug, Default)]
struct SeqState {
    /// Model names and agent keys as small ids, so the undo log holds no strings. Never taken
    /// back: an id only names its string.
    names: Interner,
    /// Each model's open session and its last end, by the model's id in `names`.
    open_sessions: HashMap<u32, (u32, i64)>,
    next_session: u32,
    tips: Vec<Tip>,
    tips_by: HashMap<TipKey, Vec<usize>>,
    /// Each tip under (its tip-key hash, its row's message key), as (row, tip): finds the tips
    /// a request continues without scanning every conversation of the session.
    tips_by_message_key: HashMap<(u64, u64), BTreeSet<(usize, usize)>>,
    /// Each tip under (its tip-key hash, the exact key of each of its row's message prefixes),
    /// as (row, tip): the tips sharing a request's first k messages, for `choose_by_match`'s
    /// longest shared start without a scan of every conversation (a benchmark that repeats
    /// one session starts thousands).
    by_prefix: HashMap<(u64, u64), BTreeSet<(usize, usize)>>,
}

#[derive(Debug, Default)]
struct KeyGroup {
    /// Rows whose whole message list has this key, in start order.
    members: Vec<OrderKey>,
    /// Every member that started before this continues into a later request.
    continued_below: Option<OrderKey>,
}

impl KeyGroup {
    /// A request at `key` starts with this group's messages: the members that started before
    /// it and were not known to be continued yet are now (added to `newly`).
    fn continued_by(&mut self, key: OrderKey, newly: &mut Vec<OrderKey>) {
        if self.continued_below.is_none_or(|old| old < key) {
            let start = self
                .continued_below
                .map_or(0, |old| self.members.partition_point(|&m| m < old));
            let end = self.members.partition_point(|&m| m < key);
            newly.extend_from_slice(&self.members[start..end]);
            self.continued_below = Some(key);
        }
    }

    /// Adds the request at `key`; whether a later request already continues it.
    fn join(&mut self, key: OrderKey) -> bool {
        let continued = self.continued_below.is_some_and(|c| c > key);
        let at = self.members.partition_point(|&m| m < key);
        self.members.insert(at, key);
        continued
    }
}

/// Per model (the llmp "domain"): what classification needs to stay exact incrementally.
#[derive(Debug, Default)]
struct Domain {
    groups: HashMap<u64, KeyGroup>,
    /// The same by exact message lists (no wildcard): which rows a later, longer one extends.
    exact_groups: HashMap<u64, KeyGroup>,
    continuing_rows: usize,
    /// Rows that continue or are continued, by system prompt hash.
    linked_systems: HashMap<Option<String>, usize>,
    /// Tool-less rows that are neither summarise nor structured: they are one-shot side-calls
    /// exactly when nothing links them.
    candidates: HashMap<Option<String>, BTreeSet<OrderKey>>,
    /// Rows that are not side-calls, and those of them that break the stateless pattern with
    /// the previous one.
    rest: BTreeSet<OrderKey>,
    bad: BTreeSet<OrderKey>,
    stateless: bool,
}

/// Marks "none" among interned ids: no label yet, no call id.
const NONE: u32 = u32::MAX;

/// Strings as small ids, so the global figures group and compare integers.
#[derive(Debug, Default)]
struct Interner {
    ids: HashMap<String, u32>,
    strings: Vec<String>,
}

impl Interner {
    fn id(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.ids.get(s) {
            return id;
        }
        let id = u32::try_from(self.strings.len()).unwrap_or(NONE - 1);
        self.strings.push(s.to_string());
        self.ids.insert(s.to_string(), id);
        id
    }

    /// `""` for `NONE` (the label of a row not yet labelled, as `base_row` leaves it).
    fn get(&self, id: u32) -> &str {
        self.strings.get(id as usize).map_or("", String::as_str)
    }

    fn len(&self) -> usize {
        self.strings.len()
    }
}

/// What one exchange contributes to the global figures, taken once when it is inserted.
#[derive(Debug)]
struct Facts {
    model: u32,
    /// The user-agent, or `unknown`.
    agent: u32,
    /// Its set of tool names (`GlobalState::sets`).
    tools: u32,
    /// Each distinct tool name (first occurrence) and its schema tokens.
    offered: Vec<(u32, u32)>,
    /// Calls that may be counted as the first sight of a call: (call id, name) for the first
    /// occurrence here of each id no earlier-started row holds, (`NONE`, name) for the
    /// response's calls without id.
    calls: Vec<(u32, u32)>,
    /// Server prefill milliseconds and evaluated tokens, when they count in the model's bulk
    /// rate.
    bulk: Option<(f64, f64)>,
    /// The row's own prefill rate and the timing's source, when it has both counts.
    timing: Option<(Option<f64>, Source)>,
}

/// The labels a row carries (as of the last report), and what deciding them and its price
/// needs of the row, so a report reads no row it does not write.
#[derive(Debug, Clone, Copy)]
struct Applied {
    client: u32,
    evictor_client: u32,
    loss: bool,
    evictor: Option<u64>,
    conversation: Option<u32>,
}

impl Applied {
    /// A row as derived: no client, no milliseconds, no evictor's client.
    fn of(row: &Row) -> Applied {
        Applied {
            client: NONE,
            evictor_client: NONE,
            loss: row.lost_client.is_some() || row.lost_external.is_some(),
            evictor: row.evicted_by.as_ref().map(|e| e.row),
            conversation: row.conversation,
        }
    }
}

/// Interned names and what is kept across reports to work the global figures out quickly.
#[derive(Debug, Default)]
struct GlobalState {
    /// Models, user-agents, tool and call names, client labels.
    strings: Interner,
    call_ids: Interner,
    /// The earliest-started row holding each call id.
    first_call: Vec<OrderKey>,
    /// Sets of tool names (sorted string ids), and unions already made of two of them.
    sets: Vec<Vec<u32>>,
    set_ids: HashMap<Vec<u32>, u32>,
    unions: IntMap<(u32, u32), u32>,
    /// `agent #n` labels by (agent, n).
    numbered: IntMap<(u32, u32), u32>,
}

impl GlobalState {
    fn set(&mut self, names: Vec<u32>) -> u32 {
        if let Some(&id) = self.set_ids.get(&names) {
            return id;
        }
        let id = u32::try_from(self.sets.len()).unwrap_or(NONE - 1);
        self.sets.push(names.clone());
        self.set_ids.insert(names, id);
        id
    }

    fn union(&mut self, a: u32, b: u32) -> u32 {
        let (sa, sb) = (&self.sets[a as usize], &self.sets[b as usize]);
        if a == b || sb.is_empty() {
            return a;
        }
        if sa.is_empty() {
            return b;
        }
        if let Some(&id) = self.unions.get(&(a, b)) {
            return id;
        }
        let mut names: Vec<u32> = sa.iter().chain(sb).copied().collect();
        names.sort_unstable();
        names.dedup();
        let id = self.set(names);
        self.unions.insert((a, b), id);
        id
    }

    fn numbered(&mut self, agent: u32, n: u32) -> u32 {
        if let Some(&id) = self.numbered.get(&(agent, n)) {
            return id;
        }
        let label = format!("{} #{n}", self.strings.get(agent));
        let id = self.strings.id(&label);
        self.numbered.insert((agent, n), id);
        id
    }
}

/// A conversation, or a request outside any: `assign_clients`'s unit.
struct Unit {
    agent: u32,
    tools: u32,
    conversation: bool,
    label: u32,
}

/// Client labels (string ids) by row position, and the units they were decided by.
struct Labels {
    of_row: Vec<u32>,
    units: Vec<Unit>,
}

fn is_subset(a: &[u32], b: &[u32]) -> bool {
    let mut rest = b.iter();
    a.iter().all(|x| rest.any(|y| y == x))
}

pub struct Analyzer {
    config: Config,
    records: u64,
    /// Probe records pushed (never counted in `records`).
    probes: u64,
    /// What the probes said happened to the server, in time (engine causes at report time).
    server_events: super::server_events::ServerEvents,
    span: Option<(i64, i64)>,
    skipped: Vec<Skipped>,
    xs: Vec<Exchange>,
    ws: Vec<Weights>,
    keys: Vec<u64>,
    /// Each row's prefix keys (see `message_keys`).
    prefix_keys: Vec<Vec<u64>>,
    /// Each row's exact prefix keys (`exact_message_keys`), for `SeqState::by_prefix`.
    exact_keys: Vec<Arc<[u64]>>,
    continued: Vec<bool>,
    continuing: Vec<bool>,
    /// A later request sends this one's messages, every one unchanged, and more: a turn.
    extended: Vec<bool>,
    kinds: Vec<(RowKind, Option<Shape>)>,
    domains: HashMap<String, Domain>,
    /// Each exchange's part in the global figures, by position like `xs`.
    facts: Vec<Facts>,
    /// The derived rows, shared with the reports; their global fields (client, loss
    /// milliseconds, evictor's client) are those of the last report, and `applied` says which.
    rows: Vec<Arc<Row>>,
    applied: Vec<Applied>,
    globals: GlobalState,
    seq: SeqState,
    /// What each derived row changed in `seq`: row r's undos are
    /// `undo[undo_start[r]..undo_start[r + 1]]`.
    undo: Vec<Undo>,
    undo_start: Vec<usize>,
    /// One copy of each distinct message: every request re-sends its conversation, so keeping
    /// each exchange's own copies would hold a conversation of n turns n²/2 times.
    messages: Shared<Msg>,
    /// One copy of each distinct list of tools, for the same reason.
    tools: Shared<[ToolDef]>,
    /// One copy of each distinct user-agent, session id, served model and tools hash: every
    /// request of a client sends the same (a served model path alone was 104 bytes a record).
    strings: Shared<str>,
    /// An estimate of the heap this engine holds (`held_bytes`).
    held: usize,
}

/// What a row costs the engine besides its messages' texts: the row, its exchange, weights,
/// facts, indexes and undo entries (measured with `examples/engine_memory`).
const ROW_BYTES: usize = 2_048;
/// What each message slot of a row costs: its shared pointer, its keys in three lists, its
/// weight and its index entries.
const SLOT_BYTES: usize = 64;

/// What a message kept once costs: its fields, texts, the map entry that shares it and the
/// index entries of the prefixes it ends (measured: about 700 bytes besides its texts).
fn message_bytes(message: &Msg) -> usize {
    700 + message.role.len()
        + message.hash.len()
        + message.identity.len()
        + message.head.len()
        + message.tail.len()
        + message.text.as_ref().map_or(0, |t| t.len())
        + message.tool_calls.len() * 128
}

/// The key a message is shared under.
fn message_key(message: &Msg) -> u64 {
    xxhash_rust::xxh3::xxh3_64(message.hash.as_bytes())
}

/// The key a string is shared under.
fn string_key(string: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(string.as_bytes())
}

/// The key a list of tools is shared under.
fn tools_key(tools: &[ToolDef]) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for tool in tools {
        hasher.update(tool.hash.as_bytes());
        hasher.update(&[0]);
    }
    hasher.digest()
}

impl SeqState {
    fn index(&mut self, key: (u64, u64), entry: (usize, usize)) {
        self.tips_by_message_key
            .entry(key)
            .or_default()
            .insert(entry);
    }

    fn unindex(&mut self, key: (u64, u64), entry: (usize, usize)) {
        if let Some(set) = self.tips_by_message_key.get_mut(&key) {
            set.remove(&entry);
            if set.is_empty() {
                self.tips_by_message_key.remove(&key);
            }
        }
    }

    fn index_prefixes(&mut self, keys: &[u64], tip_hash: u64, entry: (usize, usize)) {
        for &key in keys {
            self.by_prefix
                .entry((tip_hash, key))
                .or_default()
                .insert(entry);
        }
    }

    fn unindex_prefixes(&mut self, keys: &[u64], tip_hash: u64, entry: (usize, usize)) {
        for &key in keys {
            if let Some(set) = self.by_prefix.get_mut(&(tip_hash, key)) {
                set.remove(&entry);
                if set.is_empty() {
                    self.by_prefix.remove(&(tip_hash, key));
                }
            }
        }
    }

    fn take_back(&mut self, undo: Undo) {
        match undo {
            Undo::OpenSession { model, before } => match before {
                Some(open) => {
                    self.open_sessions.insert(model, open);
                }
                None => {
                    self.open_sessions.remove(&model);
                }
            },
            Undo::NextSession(next) => self.next_session = next,
            Undo::TipMoved { tip, row, turns } => {
                if let Some(tip) = self.tips.get_mut(tip) {
                    tip.row = row;
                    tip.turns = turns;
                }
            }
            Undo::TipAdded { tip_key } => {
                self.tips.pop();
                if let Some(list) = self.tips_by.get_mut(&tip_key) {
                    list.pop();
                    if list.is_empty() {
                        self.tips_by.remove(&tip_key);
                    }
                }
            }
            Undo::Indexed { key, entry } => self.unindex(key, entry),
            Undo::Unindexed { key, entry } => self.index(key, entry),
            Undo::PrefixIndexed {
                tip_hash,
                keys,
                entry,
            } => self.unindex_prefixes(&keys, tip_hash, entry),
            Undo::PrefixUnindexed {
                tip_hash,
                keys,
                entry,
            } => self.index_prefixes(&keys, tip_hash, entry),
        }
    }
}

impl Analyzer {
    pub fn new(config: Config) -> Analyzer {
        Analyzer {
            config,
            records: 0,
            probes: 0,
            server_events: super::server_events::ServerEvents::default(),
            span: None,
            skipped: Vec::new(),
            xs: Vec::new(),
            ws: Vec::new(),
            keys: Vec::new(),
            prefix_keys: Vec::new(),
            exact_keys: Vec::new(),
            continued: Vec::new(),
            continuing: Vec::new(),
            extended: Vec::new(),
            kinds: Vec::new(),
            domains: HashMap::new(),
            facts: Vec::new(),
            rows: Vec::new(),
            applied: Vec::new(),
            globals: GlobalState::default(),
            seq: SeqState {
                next_session: 1,
                ..SeqState::default()
            },
            undo: Vec::new(),
            undo_start: Vec::new(),
            messages: Shared::default(),
            tools: Shared::default(),
            strings: Shared::default(),
            held: 0,
        }
    }

    /// An estimate of the heap the engine holds, in bytes: what a memory budget compares
    /// (the live engine's, the `--metrics` window's). Rows cost a constant and their message
    /// slots; each distinct message and tool list its texts, once.
    pub fn held_bytes(&self) -> usize {
        self.held
    }

    /// Batch: the records pushed in start order, so no push rewinds.
    pub fn from_records(records: &[Record], config: Config) -> Analyzer {
        let mut analyzer = Analyzer::new(config);
        let mut in_start_order: Vec<&Record> = records.iter().collect();
        in_start_order.sort_by_key(|r| (r.t_start_ms, r.id));
        for record in in_start_order {
            analyzer.push(record);
        }
        analyzer
    }

    /// Adds one record (in any order) and re-derives what it changed.
    pub fn push(&mut self, record: &Record) -> Update {
        self.push_prepared(Prepared::of(record))
    }

    /// Adds one record already made ready by [`Prepared::of`] (on another thread, say): the
    /// same as `push` of that record.
    pub fn push_prepared(&mut self, prepared: Prepared) -> Update {
        let (start_ms, end_ms, outcome) = match prepared.0 {
            // Our own requests to the server (`probe`): not traffic, counted apart so every
            // figure of the traffic is what it is without them.
            PreparedKind::Probe(record) => {
                self.probes += 1;
                self.server_events.push(&record);
                return Update {
                    row: None,
                    skipped: None,
                    rederived: Vec::new(),
                };
            }
            PreparedKind::Traffic {
                start_ms,
                end_ms,
                outcome,
                ..
            } => (start_ms, end_ms, outcome),
        };
        self.count(start_ms, end_ms);
        let mut x = match outcome {
            Ok(x) => x,
            Err(skipped) => {
                let reason = skipped.reason;
                self.skipped.push(skipped);
                return Update {
                    row: None,
                    skipped: Some(reason),
                    rederived: Vec::new(),
                };
            }
        };
        for string in [
            &mut x.user_agent,
            &mut x.session_id,
            &mut x.served_model,
            &mut x.tools_hash,
        ]
        .into_iter()
        .flatten()
        {
            self.strings.share(string_key(string), string);
        }
        self.held += ROW_BYTES + SLOT_BYTES * x.messages.len();
        for message in &mut x.messages {
            if self.messages.share(message_key(message), message) {
                self.held += message_bytes(message);
            }
        }
        // Empty lists too: each is an allocation of its own.
        if self.tools.share(tools_key(&x.tools), &mut x.tools) {
            self.held += x
                .tools
                .iter()
                .map(|t| 128 + t.name.len() + t.hash.len())
                .sum::<usize>();
        }
        let id = x.id;
        let from = self.insert(x);
        let rederived = self.advance(from);
        Update {
            row: Some(id),
            skipped: None,
            rederived: rederived.into_iter().filter(|&r| r != id).collect(),
        }
    }

    /// The ids of the exchanges one of whose messages contains `needle` (any case): `/` in the
    /// TUI searches the text the requests sent, not only the break excerpts the rows keep. Each
    /// distinct message is read once.
    pub fn ids_with_text(&self, needle: &str) -> std::collections::HashSet<u64> {
        let needle = needle.trim().to_lowercase();
        let mut found = std::collections::HashSet::new();
        if needle.is_empty() {
            return found;
        }
        let mut seen: HashMap<*const Msg, bool> = HashMap::new();
        for x in &self.xs {
            let hit = x.messages.iter().any(|m| {
                *seen.entry(Arc::as_ptr(m)).or_insert_with(|| {
                    m.text
                        .as_deref()
                        .is_some_and(|t| t.to_lowercase().contains(&needle))
                })
            });
            if hit {
                found.insert(x.id);
            }
        }
        found
    }

    /// The derived rows, as the last report labelled them; their losses are not priced (a
    /// report prices them, see `SharedRow`).
    pub fn rows(&self) -> &[Arc<Row>] {
        &self.rows
    }

    /// The report of everything pushed so far: rows, then the global figures.
    pub fn report(&mut self) -> Report {
        let shared = self.shared_report();
        map_rows(shared, |rows| rows.iter().map(SharedRow::priced).collect())
    }

    /// The report, the engine's last act (`analyze`): its rows are moved out, not copied.
    pub fn into_report(mut self) -> Report {
        let shared = self.shared_report();
        // The engine goes before the rows are copied out: at a million records it held 1.4 GB
        // and the rows' vector is another 0.5 GB, more than a 2 GiB address space held both.
        drop(self);
        map_rows(shared, |rows| {
            rows.into_iter()
                .map(|shared| {
                    let mut row =
                        Arc::try_unwrap(shared.row).unwrap_or_else(|row| Row::clone(&row));
                    super::row::price_at(&mut row, shared.per_token);
                    row
                })
                .collect()
        })
    }

    /// The report, its rows shared with the engine.
    pub fn shared_report(&mut self) -> Report<SharedRow> {
        let mut report = self.live_report();
        report.findings = findings::find(&report.rows, &report.tools, &self.config);
        report
    }

    /// The report without its findings (`findings` empty), as a live snapshot holds it: no
    /// pane shows findings, so a snapshot works them out only when its summary or JSON is
    /// asked for (`analysis::find`). Linear in the rows, but over integers: labels, tool usage
    /// and clients are worked out from `facts`; losses are priced by the report, not in the
    /// rows; a row is written (copied, if a report still holds it) only when its label or its
    /// evictor's label changed (DESIGN.md, "Incremental analysis").
    pub fn live_report(&mut self) -> Report<SharedRow> {
        let labels = self.labels();
        self.apply(&labels);
        self.refine_engine_causes();
        let tools = self.tool_usage(&labels);
        let clients = self.clients(&labels);
        let bulk = self.bulk_rates();
        let rows: Vec<SharedRow> = self
            .rows
            .iter()
            .zip(self.facts.iter().zip(&self.applied))
            .map(|(row, (f, applied))| SharedRow {
                row: Arc::clone(row),
                per_token: per_token(f, applied, &bulk),
            })
            .collect();
        let input = report::Input {
            records: self.records,
            span: self.span,
            analysed: self.xs.len() as u64,
            skipped: &self.skipped,
            probes: self.probes,
            prices: &self.config.prices,
        };
        let globals = report::Globals {
            clients,
            tools,
            findings: Vec::new(),
        };
        report::assemble(input, rows, globals)
    }

    /// `table::assign_clients` over `facts`: units (a conversation, or a request outside any)
    /// of one user-agent whose tool sets are subsets of one another are one client, numbered
    /// by first request when a user-agent has several.
    fn labels(&mut self) -> Labels {
        let g = &mut self.globals;
        let mut units: Vec<Unit> = Vec::new();
        let mut unit_of_row: Vec<u32> = Vec::with_capacity(self.facts.len());
        let mut unit_of_conversation: Vec<u32> = Vec::new();
        for (f, applied) in self.facts.iter().zip(&self.applied) {
            let slot = applied.conversation.map(|c| c as usize);
            let known = slot
                .and_then(|c| unit_of_conversation.get(c).copied())
                .filter(|&u| u != NONE);
            let unit = match known {
                Some(u) => {
                    let unit = &mut units[u as usize];
                    if unit.tools != f.tools {
                        unit.tools = g.union(unit.tools, f.tools);
                    }
                    u
                }
                None => {
                    let u = u32::try_from(units.len()).unwrap_or(NONE - 1);
                    units.push(Unit {
                        agent: f.agent,
                        tools: f.tools,
                        conversation: slot.is_some(),
                        label: f.agent,
                    });
                    if let Some(c) = slot {
                        if unit_of_conversation.len() <= c {
                            unit_of_conversation.resize(c + 1, NONE);
                        }
                        unit_of_conversation[c] = u;
                    }
                    u
                }
            };
            unit_of_row.push(unit);
        }
        // Distinct (agent, tool set) pairs, each with its first unit; subsets are merged.
        let mut pair_ids: IntMap<(u32, u32), usize> = IntMap::default();
        let mut pairs: Vec<(u32, u32, usize)> = Vec::new();
        let mut pair_of_unit: Vec<usize> = Vec::with_capacity(units.len());
        for (i, unit) in units.iter().enumerate() {
            if g.sets[unit.tools as usize].is_empty() {
                pair_of_unit.push(usize::MAX);
                continue;
            }
            let id = *pair_ids.entry((unit.agent, unit.tools)).or_insert_with(|| {
                pairs.push((unit.agent, unit.tools, i));
                pairs.len() - 1
            });
            pair_of_unit.push(id);
        }
        let mut parent: Vec<usize> = (0..pairs.len()).collect();
        fn root(parent: &mut [usize], mut i: usize) -> usize {
            while parent[i] != i {
                parent[i] = parent[parent[i]];
                i = parent[i];
            }
            i
        }
        let mut by_agent: IntMap<u32, Vec<usize>> = IntMap::default();
        for (id, pair) in pairs.iter().enumerate() {
            by_agent.entry(pair.0).or_default().push(id);
        }
        for ids in by_agent.values() {
            for (n, &a) in ids.iter().enumerate() {
                for &b in &ids[n + 1..] {
                    let (sa, sb) = (&g.sets[pairs[a].1 as usize], &g.sets[pairs[b].1 as usize]);
                    if is_subset(sa, sb) || is_subset(sb, sa) {
                        let (ra, rb) = (root(&mut parent, a), root(&mut parent, b));
                        parent[ra.max(rb)] = ra.min(rb);
                    }
                }
            }
        }
        let mut first_unit: IntMap<usize, usize> = IntMap::default();
        for (id, pair) in pairs.iter().enumerate() {
            let r = root(&mut parent, id);
            let first = first_unit.entry(r).or_insert(pair.2);
            *first = (*first).min(pair.2);
        }
        let mut clusters: IntMap<u32, Vec<usize>> = IntMap::default();
        for (&r, &first) in &first_unit {
            clusters.entry(pairs[r].0).or_default().push(first);
        }
        for firsts in clusters.values_mut() {
            firsts.sort_unstable();
        }
        let mut pair_label: Vec<u32> = Vec::with_capacity(pairs.len());
        for (id, &(agent, _, _)) in pairs.iter().enumerate() {
            let firsts = clusters.get(&agent).map_or(&[][..], Vec::as_slice);
            let label = if firsts.len() > 1 {
                let r = root(&mut parent, id);
                let first = first_unit.get(&r).copied().unwrap_or(0);
                let n = firsts.iter().position(|&f| f == first).unwrap_or(0) + 1;
                g.numbered(agent, u32::try_from(n).unwrap_or(u32::MAX))
            } else {
                agent
            };
            pair_label.push(label);
        }
        for (unit, &pair) in units.iter_mut().zip(&pair_of_unit) {
            if let Some(&label) = pair_label.get(pair) {
                unit.label = label;
            }
        }
        let of_row = unit_of_row
            .into_iter()
            .map(|u| units[u as usize].label)
            .collect();
        Labels { of_row, units }
    }

    /// Writes each row's client label and its evictor's (`table::name_evictors`) where they
    /// changed.
    fn apply(&mut self, labels: &Labels) {
        let label_of_id = ById::new(
            self.xs
                .iter()
                .zip(&labels.of_row)
                .map(|(x, &label)| (x.id, label)),
        );
        for i in 0..self.rows.len() {
            let applied = self.applied[i];
            let client = labels.of_row[i];
            let evictor_client = applied
                .evictor
                .map_or(NONE, |id| label_of_id.get(id).unwrap_or(NONE));
            if client == applied.client && evictor_client == applied.evictor_client {
                continue;
            }
            let strings = &self.globals.strings;
            let row = Arc::make_mut(&mut self.rows[i]);
            if client != applied.client {
                row.client = strings.get(client).to_string();
            }
            if evictor_client != applied.evictor_client
                && let Some(evicted_by) = row.evicted_by.as_mut()
            {
                evicted_by.client = strings.get(evictor_client).to_string();
            }
            self.applied[i] = Applied {
                client,
                evictor_client,
                ..applied
            };
        }
    }

    /// The engine causes the probes explain (`server_events`), written into the rows that
    /// have one to refine (copied, if a report still holds them). At report time, from every
    /// probe known then, as the batch analysis does.
    fn refine_engine_causes(&mut self) {
        if self.server_events.is_empty() {
            return;
        }
        let candidates: Vec<usize> = (0..self.rows.len())
            .filter(|&i| self.rows[i].engine_base.is_some())
            .collect();
        if candidates.is_empty() {
            return;
        }
        let started: std::collections::HashMap<u64, i64> =
            self.xs.iter().map(|x| (x.id, x.t_start_ms)).collect();
        for i in candidates {
            if let Some(cause) =
                super::server_events::explained(&self.rows[i], &started, &self.server_events)
                && self.rows[i].engine_cause.as_deref() != Some(&cause)
            {
                Arc::make_mut(&mut self.rows[i]).engine_cause = Some(Box::new(cause));
            }
        }
    }

    /// Each model's bulk prefill rate (by model id): ms per evaluated token over its
    /// server-timed prefills of at least 50 evaluated tokens (`table::price`).
    fn bulk_rates(&self) -> Vec<Option<f64>> {
        // Summed in row order, as `table::price` sums, so the rates are the same to the bit.
        let mut sums: Vec<(f64, f64)> = vec![(0.0, 0.0); self.globals.strings.len()];
        for f in &self.facts {
            if let Some((ms, evaluated)) = f.bulk {
                let sum = &mut sums[f.model as usize];
                sum.0 += ms;
                sum.1 += evaluated;
            }
        }
        sums.into_iter()
            .map(|(ms, evaluated)| (evaluated > 0.0).then(|| ms / evaluated))
            .collect()
    }

    /// `table::tool_usage` over `facts`: per client and tool, how often it was offered, its
    /// largest schema, and how many calls of it were first seen in that client's rows.
    fn tool_usage(&self, labels: &Labels) -> Vec<ToolUsage> {
        // (schema tokens, offered, called) by (client, tool name).
        type Usage = (u32, u32, u32);
        let mut usage: IntMap<(u32, u32), Usage> = IntMap::default();
        for (f, &client) in self.facts.iter().zip(&labels.of_row) {
            for &(name, schema) in &f.offered {
                let entry = usage.entry((client, name)).or_default();
                entry.0 = entry.0.max(schema);
                entry.1 += 1;
            }
        }
        let mut seen = vec![false; self.globals.call_ids.len()];
        for (f, &client) in self.facts.iter().zip(&labels.of_row) {
            for &(call, name) in &f.calls {
                let first = call == NONE
                    || seen
                        .get_mut(call as usize)
                        .is_some_and(|seen| !std::mem::replace(seen, true));
                if first && let Some(entry) = usage.get_mut(&(client, name)) {
                    entry.2 += 1;
                }
            }
        }
        let strings = &self.globals.strings;
        let mut usage: Vec<((u32, u32), Usage)> = usage.into_iter().collect();
        usage.sort_by(|((ca, na), _), ((cb, nb), _)| {
            (strings.get(*ca), strings.get(*na)).cmp(&(strings.get(*cb), strings.get(*nb)))
        });
        usage
            .into_iter()
            .map(
                |((client, name), (schema_tokens, offered, called))| ToolUsage {
                    client: strings.get(client).to_string(),
                    name: strings.get(name).to_string(),
                    schema_tokens,
                    offered,
                    called,
                },
            )
            .collect()
    }

    /// `table::clients` over `facts`: in order of first request, with their conversations and
    /// every tool they offered.
    fn clients(&self, labels: &Labels) -> Vec<Client> {
        // (label, first row, requests, conversations, tool sets)
        let mut found: Vec<(u32, usize, u32, u32, Vec<u32>)> = Vec::new();
        let mut index: IntMap<u32, usize> = IntMap::default();
        for (i, &label) in labels.of_row.iter().enumerate() {
            let at = *index.entry(label).or_insert_with(|| {
                found.push((label, i, 0, 0, Vec::new()));
                found.len() - 1
            });
            found[at].2 += 1;
        }
        for unit in &labels.units {
            let Some(&at) = index.get(&unit.label) else {
                continue;
            };
            let client = &mut found[at];
            client.3 += u32::from(unit.conversation);
            if !client.4.contains(&unit.tools) {
                client.4.push(unit.tools);
            }
        }
        let (strings, sets) = (&self.globals.strings, &self.globals.sets);
        found
            .into_iter()
            .map(|(label, first, requests, conversations, tool_sets)| {
                let mut tools: Vec<&str> = tool_sets
                    .iter()
                    .flat_map(|&set| &sets[set as usize])
                    .map(|&name| strings.get(name))
                    .collect();
                tools.sort_unstable();
                tools.dedup();
                Client {
                    client: strings.get(label).to_string(),
                    user_agent: self.xs[first].user_agent.as_deref().map(str::to_string),
                    harness: super::harness::of(&self.xs[first]),
                    requests,
                    conversations,
                    tools: tools.into_iter().map(str::to_string).collect(),
                }
            })
            .collect()
    }

    /// What `x` contributes to the global figures (see `Facts`).
    fn facts_of(&mut self, x: &Exchange, w: &Weights) -> Facts {
        let key = order_key(x);
        let g = &mut self.globals;
        let model = g.strings.id(&x.model);
        let agent = g
            .strings
            .id(x.user_agent.as_deref().unwrap_or(table::UNKNOWN_CLIENT));
        let mut offered: Vec<(u32, u32)> = Vec::new();
        for (tool, &weight) in x.tools.iter().zip(w.tools()) {
            let name = g.strings.id(&tool.name);
            if !offered.iter().any(|&(n, _)| n == name) {
                offered.push((name, table::round(weight)));
            }
        }
        let mut names: Vec<u32> = offered.iter().map(|&(name, _)| name).collect();
        names.sort_unstable();
        let tools = g.set(names);
        let from_response = x.output.tool_calls.iter().map(|call| (call, true));
        let from_history = x
            .messages
            .iter()
            .filter(|m| m.role == "assistant")
            .flat_map(|m| &m.tool_calls)
            .map(|call| (call, false));
        let mut calls = Vec::new();
        let mut here: BTreeSet<u32> = BTreeSet::new();
        for (call, in_response) in from_response.chain(from_history) {
            match &call.id {
                None if in_response => calls.push((NONE, g.strings.id(&call.name))),
                None => {}
                Some(id) => {
                    let c = g.call_ids.id(id);
                    if !here.insert(c) {
                        continue;
                    }
                    match g.first_call.get_mut(c as usize) {
                        // An earlier-started row holds it: this is never its first sight.
                        Some(first) if *first < key => continue,
                        Some(first) => *first = key,
                        None => g.first_call.push(key),
                    }
                    calls.push((c, g.strings.id(&call.name)));
                }
            }
        }
        let c = &x.counts;
        let (bulk, timing) = match (c.prefill_ms, c.evaluated_tokens) {
            (Some(prefill), Some(evaluated)) => (
                (prefill.source == Source::Server && evaluated.value >= table::BULK_MIN_EVALUATED)
                    .then(|| (prefill.value, f64::from(evaluated.value))),
                Some((
                    (evaluated.value > 0).then(|| prefill.value / f64::from(evaluated.value)),
                    prefill.source,
                )),
            ),
            _ => (None, None),
        };
        Facts {
            model,
            agent,
            tools,
            offered,
            calls,
            bulk,
            timing,
        }
    }

    fn count(&mut self, start_ms: i64, end_ms: i64) {
        self.records += 1;
        let end = end_ms.max(start_ms);
        self.span = Some(match self.span {
            Some((s, e)) => (s.min(start_ms), e.max(end)),
            None => (start_ms, end),
        });
    }

    fn position(&self, key: OrderKey) -> usize {
        self.xs.partition_point(|x| order_key(x) < key)
    }

    /// Inserts an exchange where it started and updates classification. Returns the earliest
    /// position whose row must be derived again.
    fn insert(&mut self, x: Exchange) -> usize {
        let key = order_key(&x);
        let p = self.position(key);
        let (own_key, prefixes) = message_keys(&x);
        let exact_prefixes = exact_message_keys(&x);
        let model = x.model.clone();
        let w = weights(&x);
        let facts = self.facts_of(&x, &w);
        // The per-exchange vectors grow by a quarter (`growth`): they are most of the engine.
        crate::growth::reserve_by_quarter(&mut self.xs, 1);
        crate::growth::reserve_by_quarter(&mut self.facts, 1);
        crate::growth::reserve_by_quarter(&mut self.ws, 1);
        crate::growth::reserve_by_quarter(&mut self.prefix_keys, 1);
        crate::growth::reserve_by_quarter(&mut self.exact_keys, 1);
        self.facts.insert(p, facts);
        self.ws.insert(p, w);
        self.keys.insert(p, own_key);
        self.prefix_keys.insert(p, prefixes.clone());
        self.exact_keys
            .insert(p, Arc::from(exact_prefixes.as_slice()));
        self.continued.insert(p, false);
        self.continuing.insert(p, false);
        self.extended.insert(p, false);
        self.kinds.insert(p, (RowKind::Turn, None));
        self.xs.insert(p, x);

        // Which earlier requests this one continues, and whether a later one continues it.
        let domain = self.domains.entry(model.clone()).or_default();
        let pairs_before = domain.continuing_rows;
        let mut newly_continued = Vec::new();
        let mut continuing = false;
        for prefix in &prefixes {
            let group = domain.groups.entry(*prefix).or_default();
            if group.members.first().is_some_and(|&m| m < key) {
                continuing = true;
            }
            group.continued_by(key, &mut newly_continued);
        }
        let mut continued = domain.groups.entry(own_key).or_default().join(key);
        // An out-of-order arrival: later-started requests may continue this one.
        let mut later_continuing = Vec::new();
        for i in p + 1..self.xs.len() {
            if self.xs[i].model == model && continues(&self.xs[p], &self.xs[i]) {
                continued = true;
                later_continuing.push(i);
            }
        }

        // Which earlier requests this one extends (strictly longer, every message unchanged),
        // and whether a later one extends it.
        let mut newly_extended = Vec::new();
        if let Some((exact_own, strict)) = exact_prefixes.split_last() {
            for prefix in strict {
                let group = domain.exact_groups.entry(*prefix).or_default();
                group.continued_by(key, &mut newly_extended);
            }
            self.extended[p] = domain.exact_groups.entry(*exact_own).or_default().join(key);
        }

        let mut touched = vec![p];
        for other in newly_extended {
            let i = self.position(other);
            if !self.extended[i] {
                self.extended[i] = true;
                touched.push(i);
            }
        }
        let mut newly_linked = Vec::new();
        self.mark(p, continued, continuing, &mut newly_linked);
        for other in newly_continued {
            let i = self.position(other);
            if !self.continued[i] {
                self.mark(i, true, false, &mut newly_linked);
                touched.push(i);
            }
        }
        for i in later_continuing {
            if !self.continuing[i] {
                self.mark(i, false, true, &mut newly_linked);
                touched.push(i);
            }
        }
        let x = &self.xs[p];
        if x.tools.is_empty() && !summarise(x) && !structured(x) {
            let system = system_hash(x).map(str::to_string);
            if let Some(domain) = self.domains.get_mut(&model) {
                domain.candidates.entry(system).or_default().insert(key);
            }
        }

        // Rows whose one-shot status may have changed.
        let mut affected: BTreeSet<OrderKey> =
            touched.iter().map(|&i| order_key(&self.xs[i])).collect();
        if let Some(domain) = self.domains.get(&model) {
            if pairs_before == 0 && domain.continuing_rows > 0 {
                for set in domain.candidates.values() {
                    affected.extend(set.iter().copied());
                }
            }
            for system in &newly_linked {
                if let Some(set) = domain.candidates.get(system) {
                    affected.extend(set.iter().copied());
                }
            }
        }
        let mut earliest = p;
        let mut entered_rest = Vec::new();
        for key in affected {
            let i = self.position(key);
            let shape = self.shape(i);
            let is_side_call = shape.is_some();
            if i == p {
                self.kinds[i] = (
                    if is_side_call {
                        RowKind::SideCall
                    } else {
                        RowKind::Turn
                    },
                    shape,
                );
                if !is_side_call {
                    self.rest_insert(&model, key);
                    entered_rest.push(i);
                }
                continue;
            }
            let (old_kind, old_shape) = self.kinds[i];
            if old_shape == shape {
                continue;
            }
            earliest = earliest.min(i);
            let was_side_call = old_kind == RowKind::SideCall;
            match (was_side_call, is_side_call) {
                (true, false) => {
                    self.rest_insert(&model, key);
                    self.kinds[i] = (RowKind::Turn, None);
                    entered_rest.push(i);
                }
                (false, true) => {
                    self.rest_remove(&model, key);
                    self.kinds[i] = (RowKind::SideCall, shape);
                }
                _ => self.kinds[i] = (old_kind, shape),
            }
        }

        // The stateless pattern over the domain's rest.
        let Some(domain) = self.domains.get_mut(&model) else {
            return earliest;
        };
        let stateless = domain.rest.len() >= table::STATELESS_MIN_REQUESTS && domain.bad.is_empty();
        let kind = if stateless {
            RowKind::Stateless
        } else {
            RowKind::Turn
        };
        if stateless != domain.stateless {
            domain.stateless = stateless;
            let rest: Vec<OrderKey> = domain.rest.iter().copied().collect();
            for key in rest {
                let i = self.position(key);
                earliest = earliest.min(i);
                self.kinds[i] = (kind, None);
            }
        } else {
            for i in entered_rest {
                self.kinds[i] = (kind, None);
            }
        }
        earliest
    }

    /// ORs a row's flags in and keeps its domain's counts (flags only ever turn on).
    fn mark(
        &mut self,
        i: usize,
        continued: bool,
        continuing: bool,
        newly_linked: &mut Vec<Option<String>>,
    ) {
        let was_linked = self.continued[i] || self.continuing[i];
        let was_continuing = self.continuing[i];
        self.continued[i] |= continued;
        self.continuing[i] |= continuing;
        let system = system_hash(&self.xs[i]).map(str::to_string);
        let Some(domain) = self.domains.get_mut(&self.xs[i].model) else {
            return;
        };
        if self.continuing[i] && !was_continuing {
            domain.continuing_rows += 1;
        }
        if (self.continued[i] || self.continuing[i]) && !was_linked {
            let count = domain.linked_systems.entry(system.clone()).or_default();
            *count += 1;
            if *count == 1 {
                newly_linked.push(system);
            }
        }
    }

    fn shape(&self, i: usize) -> Option<Shape> {
        let x = &self.xs[i];
        // A request a later one extends is a turn, whatever its shape (where llmp is wrong: a
        // first turn with a small `max_tokens` looks like a title call until it goes on).
        if self.extended[i] {
            return None;
        }
        if summarise(x) {
            return Some(Shape::Summarise);
        }
        if structured(x) {
            return Some(Shape::Structured);
        }
        let domain = self.domains.get(&x.model)?;
        let system = system_hash(x).map(str::to_string);
        (x.tools.is_empty()
            && domain.continuing_rows > 0
            && !self.continued[i]
            && !self.continuing[i]
            && domain.linked_systems.get(&system).copied().unwrap_or(0) == 0)
            .then_some(Shape::Oneshot)
    }

    fn bad_pair(&self, a: OrderKey, b: OrderKey) -> bool {
        let (x, y) = (&self.xs[self.position(a)], &self.xs[self.position(b)]);
        continues(x, y) || y.messages.len() > x.messages.len()
    }

    fn neighbours(&self, model: &str, key: OrderKey) -> (Option<OrderKey>, Option<OrderKey>) {
        let Some(domain) = self.domains.get(model) else {
            return (None, None);
        };
        let pred = domain.rest.range(..key).next_back().copied();
        let succ = domain
            .rest
            .range((std::ops::Bound::Excluded(key), std::ops::Bound::Unbounded))
            .next()
            .copied();
        (pred, succ)
    }

    fn set_bad(&mut self, model: &str, key: OrderKey, bad: bool) {
        if let Some(domain) = self.domains.get_mut(model) {
            if bad {
                domain.bad.insert(key);
            } else {
                domain.bad.remove(&key);
            }
        }
    }

    fn rest_insert(&mut self, model: &str, key: OrderKey) {
        let (pred, succ) = self.neighbours(model, key);
        let bad_here = pred.is_some_and(|p| self.bad_pair(p, key));
        let bad_next = succ.map(|s| (s, self.bad_pair(key, s)));
        if let Some(domain) = self.domains.get_mut(model) {
            domain.rest.insert(key);
        }
        self.set_bad(model, key, bad_here);
        if let Some((s, bad)) = bad_next {
            self.set_bad(model, s, bad);
        }
    }

    fn rest_remove(&mut self, model: &str, key: OrderKey) {
        let (pred, succ) = self.neighbours(model, key);
        if let Some(domain) = self.domains.get_mut(model) {
            domain.rest.remove(&key);
        }
        self.set_bad(model, key, false);
        if let Some(s) = succ {
            let bad = pred.is_some_and(|p| self.bad_pair(p, s));
            self.set_bad(model, s, bad);
        }
    }

    /// Runs the sequential pass from `from` (or from where it stopped, if earlier) to the end.
    /// Returns the ids of the rows derived.
    fn advance(&mut self, from: usize) -> Vec<u64> {
        self.rewind(from.min(self.rows.len()));
        let first = self.rows.len();
        for i in first..self.xs.len() {
            // A row pushes at most 7 undos: 2 for its session, 5 for its tip.
            crate::growth::reserve_by_quarter(&mut self.undo, 7);
            crate::growth::reserve_by_quarter(&mut self.applied, 1);
            self.undo_start.push(self.undo.len());
            let row = self.derive(i);
            self.applied.push(Applied::of(&row));
            self.rows.push(Arc::new(row));
        }
        self.rows[first..].iter().map(|r| r.id).collect()
    }

    /// Takes back the rows from `to` on, newest first, undoing what each changed.
    fn rewind(&mut self, to: usize) {
        while self.rows.len() > to {
            self.rows.pop();
            self.applied.pop();
            let start = self.undo_start.pop().unwrap_or(0);
            while self.undo.len() > start {
                let Some(undo) = self.undo.pop() else { break };
                self.seq.take_back(undo);
            }
        }
    }

    /// Derives row `i` from the rows before it (llmp's table pass, one row at a time).
    fn derive(&mut self, i: usize) -> Row {
        let session = self.session(i);
        let x = &self.xs[i];
        let (kind, shape) = self.kinds[i];
        let mut row = table::base_row(x, &self.ws[i], kind, shape, session);
        if kind != RowKind::Turn {
            return row;
        }
        let agent = agent_key(x);
        let tip_hash = tip_key_hash(&x.model, agent.as_deref(), session);
        let names = &mut self.seq.names;
        let tip_key = (
            names.id(&x.model),
            agent.as_deref().map_or(NONE, |agent| names.id(agent)),
            session,
        );
        let choice = match self.continued_tip(i, session, tip_hash) {
            Some(t) => Choice::Continue(t),
            None => self.choose_by_prefix(i, session, tip_hash),
        };
        let (prev, fresh) = match choice {
            Choice::Continue(t) => {
                let tip = &mut self.seq.tips[t];
                let prev = tip.row;
                self.undo.push(Undo::TipMoved {
                    tip: t,
                    row: prev,
                    turns: tip.turns,
                });
                tip.row = i;
                tip.turns += 1;
                row.conversation = Some(tip.conversation);
                row.turn = Some(tip.turns);
                let (old_key, new_key) = ((tip_hash, self.keys[prev]), (tip_hash, self.keys[i]));
                self.seq.unindex(old_key, (prev, t));
                self.undo.push(Undo::Unindexed {
                    key: old_key,
                    entry: (prev, t),
                });
                self.seq.index(new_key, (i, t));
                self.undo.push(Undo::Indexed {
                    key: new_key,
                    entry: (i, t),
                });
                self.index_prefixes(tip_hash, (prev, t), false);
                self.index_prefixes(tip_hash, (i, t), true);
                (Some(prev), false)
            }
            Choice::Fresh(from) => {
                row.spawned_by = self.spawner(i).map(|t| self.xs[self.seq.tips[t].row].id);
                let conversation = self.seq.tips.len() as u32 + 1;
                let from_row = from.map(|t| self.seq.tips[t].row);
                self.seq.tips.push(Tip {
                    row: i,
                    conversation,
                    turns: 1,
                });
                let t = self.seq.tips.len() - 1;
                self.seq.tips_by.entry(tip_key).or_default().push(t);
                self.undo.push(Undo::TipAdded { tip_key });
                let key = (tip_hash, self.keys[i]);
                self.seq.index(key, (i, t));
                self.undo.push(Undo::Indexed { key, entry: (i, t) });
                self.index_prefixes(tip_hash, (i, t), true);
                row.conversation = Some(conversation);
                row.turn = Some(1);
                (from_row, true)
            }
        };
        let Some(prev) = prev else {
            return row;
        };
        let xs = &self.xs;
        let latest = table::between(|r| &xs[r], &self.kinds, prev, i, &mut row);
        row.linked_to = Some(self.xs[prev].id);
        row.new_conversation = fresh;
        let link: Link = link(
            &self.xs[prev],
            &self.ws[prev],
            &self.xs[i],
            &self.ws[i],
            fresh,
        );
        apply_link(
            &mut row,
            &self.xs[i],
            &self.ws[i],
            &link,
            latest.map(|(cause, _)| cause),
        );
        table::finish_link(&mut row, link, latest);
        row
    }

    /// The conversation (its tip) that row `i`, the first of a new one, is a subagent of: of
    /// the same user agent, waiting on a tool call (its latest request ended with one, before
    /// `i` started), and offering a strict superset of `i`'s tools (two sessions of one harness
    /// offer equal sets and are not parent and child); the latest to end. The most recent
    /// conversations only (`SUBAGENT_LOOKBACK`): a parent waits for its subagent.
    fn spawner(&self, i: usize) -> Option<usize> {
        let x = &self.xs[i];
        if x.tools.is_empty() {
            return None;
        }
        let tools: BTreeSet<&str> = x.tools.iter().map(|t| t.name.as_str()).collect();
        let first = self.seq.tips.len().saturating_sub(SUBAGENT_LOOKBACK);
        (first..self.seq.tips.len())
            .filter(|&t| {
                let parent = &self.xs[self.seq.tips[t].row];
                parent.user_agent == x.user_agent
                    && !parent.output.tool_calls.is_empty()
                    && parent.t_end_ms <= x.t_start_ms
                    && parent.tools.len() > tools.len()
                    && tools
                        .iter()
                        .all(|name| parent.tools.iter().any(|tool| tool.name.as_str() == *name))
            })
            .max_by_key(|&t| (self.xs[self.seq.tips[t].row].t_end_ms, t))
    }

    /// The tip `choose` would pick because row `i` continues its request and carries it on
    /// (`table::carries_on`): one it goes on with before one it sends again, then the longest
    /// such request, then the most recent. Found through the message-key index; `continues` is
    /// checked again so a hash collision cannot change the answer.
    fn continued_tip(&self, i: usize, session: u32, tip_hash: u64) -> Option<usize> {
        let x = &self.xs[i];
        // A request it goes on with before one it sends again (`choose`): the shorter
        // prefixes, longest first, then its own length.
        let keys = &self.prefix_keys[i];
        let shorter = &keys[..keys.len().saturating_sub(1)];
        for key in shorter.iter().rev().chain(keys.last()) {
            let Some(set) = self.seq.tips_by_message_key.get(&(tip_hash, *key)) else {
                continue;
            };
            let valid = |&&(row, t): &&(usize, usize)| {
                let prev = &self.xs[row];
                prev.model == x.model
                    && table::same_agent(prev, x)
                    && self.rows[row].session == session
                    && continues(prev, x)
                    && table::carries_on(prev, x, self.seq.tips[t].turns == 1)
            };
            // The latest with the same system prompt and tools, else the latest.
            let mut found = set.iter().rev().filter(valid);
            let Some(&(latest_row, latest)) = found.next() else {
                continue;
            };
            if table::same_context(&self.xs[latest_row], x) {
                return Some(latest);
            }
            let same = found
                .find(|&&(row, _)| table::same_context(&self.xs[row], x))
                .map(|&(_, t)| t);
            return Some(same.unwrap_or(latest));
        }
        None
    }

    /// Indexes (or, `false`, unindexes) the tip `entry.1` at row `entry.0` under its message
    /// prefixes (`SeqState::by_prefix`), with the undo that takes it back.
    fn index_prefixes(&mut self, tip_hash: u64, entry: (usize, usize), index: bool) {
        let keys = Arc::clone(&self.exact_keys[entry.0]);
        if index {
            self.seq.index_prefixes(&keys, tip_hash, entry);
            self.undo.push(Undo::PrefixIndexed {
                tip_hash,
                keys,
                entry,
            });
        } else {
            self.seq.unindex_prefixes(&keys, tip_hash, entry);
            self.undo.push(Undo::PrefixUnindexed {
                tip_hash,
                keys,
                entry,
            });
        }
    }

    /// `table::choose_by_match` through the prefix index (`SeqState::by_prefix`): the same
    /// choice (the most messages shared, then the latest), found level by level from row `i`'s
    /// whole message list down, each level's latest tip, instead of a scan of every tip.
    fn choose_by_prefix(&self, i: usize, session: u32, tip_hash: u64) -> Choice {
        if let Some(t) = self.identical_tip(i, session, tip_hash) {
            return Choice::Fresh(Some(t));
        }
        let x = &self.xs[i];
        let keys = &self.exact_keys[i];
        let lead = x.messages.iter().take_while(|m| m.role == "system").count();
        let opening = lead + 1;
        // The latest tip of this agent and session sharing at least `k` leading messages
        // (checked, so a hash collision cannot choose).
        // `past_opening`: sharing more than the opening, any tip qualifies; else one that
        // differs from `x` there and which `x` compacts (`table::compacts`), or one of whose
        // later messages `x` sends elsewhere (moved: `choose_by_match`'s `went_on`).
        // Built on first use: most requests are decided before a tip needs it.
        let sent: std::cell::OnceCell<std::collections::HashSet<&str>> = std::cell::OnceCell::new();
        let went_on = |prev: &Exchange| {
            let sent = sent.get_or_init(|| {
                x.messages
                    .iter()
                    .skip(opening)
                    .map(|m| m.identity.as_str())
                    .collect()
            });
            prev.messages
                .iter()
                .skip(opening)
                .any(|m| sent.contains(m.identity.as_str()))
        };
        let latest = |k: usize, past_opening: bool| -> Option<usize> {
            let set = self.seq.by_prefix.get(&(tip_hash, keys[k - 1]))?;
            set.iter().rev().find_map(|&(row, t)| {
                let prev = &self.xs[row];
                let shared = prev
                    .messages
                    .iter()
                    .zip(&x.messages)
                    .take_while(|(a, b)| a.identity == b.identity)
                    .count();
                (prev.model == x.model
                    && table::same_agent(prev, x)
                    && self.rows[row].session == session
                    && self.seq.tips.get(t).is_some_and(|tip| tip.row == row)
                    && shared >= k
                    && (past_opening
                        || (prev.messages.len() > k && table::compacts(prev, x))
                        || went_on(prev)))
                .then_some(t)
            })
        };
        let n = x.messages.len();
        // A break: the most shared, past the opening. Sharing all of `x` (no tip sends it
        // alone: `identical_tip`), it must send a message past the opening too, which a tip
        // holding all of `x` does exactly when `x` has one. Sharing less, `x` goes on past it:
        // past the opening, any tip; at the opening only, a tip `x` compacts.
        for k in (opening..=n).rev() {
            if k == n && n <= opening {
                continue;
            }
            if let Some(t) = latest(k, k > opening || k == n) {
                return Choice::Continue(t);
            }
        }
        // A new conversation: the tip sharing the longest start, if any.
        Choice::Fresh((1..=n).rev().find_map(|k| latest(k, true)))
    }

    /// The latest tip whose request sends row `i`'s messages exactly (`table::same_messages`),
    /// through the message-key index.
    fn identical_tip(&self, i: usize, session: u32, tip_hash: u64) -> Option<usize> {
        let x = &self.xs[i];
        let set = self
            .seq
            .tips_by_message_key
            .get(&(tip_hash, self.keys[i]))?;
        set.iter()
            .rev()
            .find(|&&(row, _)| {
                let prev = &self.xs[row];
                prev.model == x.model
                    && table::same_agent(prev, x)
                    && self.rows[row].session == session
                    && table::same_messages(prev, x)
            })
            .map(|&(_, t)| t)
    }

    /// llmp's sessions: per model, a pause longer than the gap after the last end starts one.
    fn session(&mut self, i: usize) -> u32 {
        let x = &self.xs[i];
        let gap = table::session_gap_ms(x, self.config.session_gap_ms);
        let model = self.seq.names.id(&x.model);
        let open = self.seq.open_sessions.get(&model).copied();
        let session = match open {
            Some((session, last_end)) if x.t_start_ms.saturating_sub(last_end) <= gap => session,
            _ => {
                self.undo.push(Undo::NextSession(self.seq.next_session));
                self.seq.next_session += 1;
                self.seq.next_session - 1
            }
        };
        let last_end = open
            .filter(|(s, _)| *s == session)
            .map_or(x.t_end_ms, |(_, end)| end.max(x.t_end_ms));
        let before = self.seq.open_sessions.insert(model, (session, last_end));
        self.undo.push(Undo::OpenSession { model, before });
        session
    }
}

/// What a row's losses cost per token (`table::price`): the cheaper of its own prefill rate
/// and its model's bulk rate. `None` for a row without losses or timing.
fn per_token(f: &Facts, applied: &Applied, bulk: &[Option<f64>]) -> Option<Measured<f64>> {
    let (own, source) = f.timing.filter(|_| applied.loss)?;
    let rate = match (own, bulk.get(f.model as usize).copied().flatten()) {
        (Some(own), Some(bulk)) => Some(own.min(bulk)),
        (own, bulk) => own.or(bulk),
    };
    rate.map(|value| Measured { value, source })
}

/// The same report with its rows held another way.
fn map_rows<A, B>(report: Report<A>, f: impl FnOnce(Vec<A>) -> Vec<B>) -> Report<B> {
    Report {
        v: report.v,
        window: report.window,
        coverage: report.coverage,
        servers: report.servers,
        time: report.time,
        composition: report.composition,
        clients: report.clients,
        tools: report.tools,
        findings: report.findings,
        money: report.money,
        rows: f(report.rows),
    }
}

/// What keeps agents apart in the tips: the user-agent, and the session id when there is one.
/// How many of the most recent conversations a new one's parent is looked for in.
const SUBAGENT_LOOKBACK: usize = 64;

fn agent_key(x: &Exchange) -> Option<String> {
    match (&x.user_agent, &x.session_id) {
        (agent, None) => agent.as_deref().map(str::to_string),
        (agent, Some(session)) => Some(format!(
            "{}\u{0}{session}",
            agent.as_deref().unwrap_or_default()
        )),
    }
}

fn tip_key_hash(model: &str, user_agent: Option<&str>, session: u32) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hash::feed_bytes(model.as_bytes(), &mut hasher);
    match user_agent {
        Some(agent) => hash::feed_bytes(agent.as_bytes(), &mut hasher),
        None => hasher.update(b"-"),
    }
    hasher.update(&session.to_le_bytes());
    hasher.digest()
}

/// A request's key (its whole message list) and the keys of each of its prefixes, such that
/// `continues(a, b)` exactly when `key(a)` is one of `b`'s prefix keys: system messages match
/// by role, and a last assistant message by role (harnesses rewrite it).
fn message_keys(x: &Exchange) -> (u64, Vec<u64>) {
    let mut state = hash::fnv1a64(b"prefixscope-prefix");
    let mut prefixes = Vec::with_capacity(x.messages.len());
    for (i, m) in x.messages.iter().enumerate() {
        let _ = i;
        prefixes.push(mix(state, token(&m.role, &m.identity, true)));
        state = mix(state, token(&m.role, &m.identity, false));
    }
    let own = prefixes.last().copied().unwrap_or(0);
    (own, prefixes)
}

/// The keys of each prefix of `x`'s messages compared exactly (role and identity, no
/// wildcard), the whole list's last.
fn exact_message_keys(x: &Exchange) -> Vec<u64> {
    let mut state = hash::fnv1a64(b"prefixscope-exact");
    x.messages
        .iter()
        .map(|m| {
            let mut bytes = Vec::with_capacity(m.role.len() + m.identity.len() + 1);
            bytes.extend_from_slice(m.role.as_bytes());
            bytes.push(0);
            bytes.extend_from_slice(m.identity.as_bytes());
            state = mix(state, hash::fnv1a64(&bytes));
            state
        })
        .collect()
}

fn token(role: &str, message_hash: &str, last: bool) -> u64 {
    let wildcard = role == "system" || (last && role == "assistant");
    let mut bytes = Vec::with_capacity(role.len() + message_hash.len() + 2);
    bytes.push(if wildcard { b'*' } else { b'=' });
    bytes.extend_from_slice(role.as_bytes());
    bytes.push(0);
    if !wildcard {
        bytes.extend_from_slice(message_hash.as_bytes());
    }
    hash::fnv1a64(&bytes)
}

fn mix(state: u64, token: u64) -> u64 {
    // splitmix64 finalizer over the combined words: cheap, and spreads every bit.
    let mut z = state.rotate_left(23) ^ token.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_analyzer_reports_nothing() {
        let mut a = Analyzer::new(Config::default());
        let r = a.report();
        assert_eq!((r.coverage.records, r.rows.len(), r.window), (0, 0, None));
    }

    #[test]
    fn a_message_sent_again_is_kept_once() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../recordings/llmp/llama.cpp/parallel-nocache.jsonl");
        let read =
            crate::record::read_jsonl(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
        let mut a = Analyzer::new(Config::default());
        for record in &read.records {
            a.push(record);
        }
        let sent: usize = a.xs.iter().map(|x| x.messages.len()).sum();
        let mut distinct: Vec<*const Msg> =
            a.xs.iter()
                .flat_map(|x| x.messages.iter().map(Arc::as_ptr))
                .collect();
        distinct.sort_unstable();
        distinct.dedup();
        let kept = a.messages.len();
        assert_eq!(distinct.len(), kept);
        assert!(kept * 2 < sent, "{kept} kept of {sent} sent");
        // Equal lists of tools (the empty one too) are one list, held by all that offer it.
        let xs: Vec<&Exchange> = a.xs.iter().collect();
        for x in &xs {
            for y in &xs {
                assert_eq!(x.tools == y.tools, Arc::ptr_eq(&x.tools, &y.tools));
            }
        }
        let mut lists: Vec<*const ToolDef> = xs.iter().map(|x| x.tools.as_ptr()).collect();
        lists.sort_unstable();
        lists.dedup();
        assert_eq!(lists.len(), a.tools.len());
        assert!(xs.iter().any(|x| !x.tools.is_empty()));
        assert!(a.tools.len() * 2 < xs.len(), "{lists:?}");
        // Equal user-agents, session ids, served models and tools hashes are one string each.
        let strings = |x: &Exchange| {
            [&x.user_agent, &x.session_id, &x.served_model, &x.tools_hash].map(Option::clone)
        };
        for x in &xs {
            for y in &xs {
                for (a, b) in strings(x).iter().zip(strings(y).iter()) {
                    if let (Some(a), Some(b)) = (a, b) {
                        assert_eq!(a == b, Arc::ptr_eq(a, b), "{a} {b}");
                    }
                }
            }
        }
        assert!(xs.iter().all(|x| x.user_agent.is_some()));
    }

    #[test]
    fn an_undo_entry_holds_no_string() {
        // 48 bytes, one or more per row (a prefix entry holds its keys, shared): it held a
        // model name's copy (and a tip's two) before.
        assert!(std::mem::size_of::<Undo>() <= 48);
    }
}
