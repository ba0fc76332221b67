//! What the panes draw, built from a report (pure) by the live engine for each snapshot; the
//! TUI only reads it.

use std::collections::HashMap;
use std::sync::Arc;

use crate::analysis::ids::IntMap;
use crate::analysis::{BreakCause, EvictedBy, Priced, Rated, Report, Row, RowKind};
// Defined once in the core, for the report and the commands as well; the panes take them from here.
pub use crate::units::{cause_label, duration_decimal as duration, thousands};

#[derive(Debug, Clone, Default)]
pub struct View {
    pub header: Header,
    pub lanes: Vec<Lane>,
    /// The newest `MAX_BREAKS_SHOWN` breaks, newest first, of `breaks_total`.
    pub breaks: Vec<BreakItem>,
    pub breaks_total: usize,
    /// By cost (what the client suffered plus what it caused), highest first.
    pub losses: Vec<ClientLoss>,
    /// Losses no client caused (the server dropped its cache on its own), by cause label.
    pub unattributed: Vec<(String, u64, Option<f64>)>,
    /// Who cost whom: `(causer, victim, tokens)`, clients as the report names them, the
    /// causer `None` for the server's own losses; a client's own breaks are its own row.
    pub who_cost_whom: Vec<(Option<String>, String, u64)>,
    pub curve: Option<Curve>,
    pub prefixes: Vec<PrefixItem>,
    /// Short names of the report's clients.
    pub aliases: Aliases,
}

#[derive(Debug, Clone, Default)]
pub struct Header {
    pub records: u64,
    pub analysed: u64,
    pub turns: u64,
    pub conversations: u64,
    pub lost_tokens: u64,
    pub lost_ms: Option<f64>,
    pub prefill_ms: Option<f64>,
    pub bad_lines: u64,
    /// Whether any turn's loss could be measured (the server reported reuse): when none could,
    /// the panes say "not measured", as `analyze` does, never "0 tokens".
    pub loss_measured: bool,
    /// Whether any request continues another (a loss is measured only on those).
    pub continued: bool,
    /// The filter the view was built with (empty: none). When set, every figure above is of the
    /// rows matching it (`records` and `analysed` count them), worked out from the same loss
    /// entries the Loss pane sums, as the report's own totals are.
    pub filter: String,
    /// Records received in all, whatever the filter.
    pub all_records: u64,
    /// Lost tokens whose time no server reported (`Time::untimed_tokens`).
    pub untimed_tokens: u64,
    /// The hosted APIs that answered (`OpenAI API`…); empty for a local server.
    pub providers: String,
    /// Dollars lost (`Report::money`), unfiltered only: a filter's rows are not priced apart.
    pub lost_usd: Option<f64>,
}

/// The hosted providers among the rows, by name, in their order (`Provider`'s).
fn providers(rows: &[Rated]) -> String {
    let mut seen: Vec<crate::provider::Provider> = rows
        .iter()
        .map(|r| r.provider)
        .filter(|p| p.hosted())
        .collect();
    seen.sort_unstable();
    seen.dedup();
    seen.iter()
        .map(|p| p.name())
        .collect::<Vec<_>>()
        .join(" + ")
}

impl Header {
    /// What the panes say when no loss is measured: either nothing continues another request
    /// yet (one-shot requests re-use no prefix of their own, so there is nothing to lose), or
    /// the server's counts that price a loss are missing.
    pub fn loss_not_measured(&self) -> &'static str {
        if self.continued {
            "loss not measured (no reuse and timing counts)"
        } else {
            "no loss yet: no request continues another"
        }
    }
}

#[derive(Debug, Clone)]
pub struct Lane {
    /// Shared with the client's other lanes (a snapshot has a lane per conversation).
    pub client: Arc<str>,
    /// The short name the panes show (`llmp-drive #1`), the full one in the detail.
    pub alias: Arc<str>,
    pub conversation: u32,
    pub cells: Vec<Cell>,
    /// A subagent's lane: the request of the conversation that spawned it (`Row::spawned_by`).
    pub spawned_by: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct Cell {
    pub id: u64,
    pub turn: u32,
    pub reuse: Option<f64>,
    pub broke: Option<BreakCause>,
    pub lost_tokens: u32,
    pub evicted_by: Option<Evictor>,
    /// What the cell's glyph says: the cause that cost the most on this turn.
    pub mark: Mark,
    /// The server's prompt tokens, for how much of the prompt the loss was.
    pub prompt_tokens: Option<u32>,
}

/// The request that evicted a turn's prefix (its row's `EvictedBy`), its strings shared with
/// every other cell that names them: a snapshot holds a cell for every turn (888,888 of them
/// at a million digest records), and a copy of both strings each held 70 MB more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evictor {
    pub row: u64,
    pub client: Arc<str>,
    /// `side_call`, `other_conversation` or `other_model`.
    pub kind: Arc<str>,
}

/// One `Arc<str>` per distinct string of a snapshot's evictors.
#[derive(Default)]
struct EvictorNames<'a>(HashMap<&'a str, Arc<str>>);

impl<'a> EvictorNames<'a> {
    fn of(&mut self, evicted_by: &'a EvictedBy) -> Evictor {
        Evictor {
            row: evicted_by.row,
            client: self.name(&evicted_by.client),
            kind: self.name(&evicted_by.kind),
        }
    }

    fn name(&mut self, name: &'a str) -> Arc<str> {
        Arc::clone(self.0.entry(name).or_insert_with(|| Arc::from(name)))
    }
}

/// How bad a turn's loss was, for its colour: none, under a quarter of its prompt, more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    None,
    Some,
    Much,
    Unknown,
}

impl Cell {
    pub fn severity(&self) -> Severity {
        match (self.mark, self.lost_tokens) {
            (Mark::Unmeasured, _) => Severity::Unknown,
            (_, 0) => Severity::None,
            (_, lost) => match self.prompt_tokens {
                Some(prompt) if u64::from(lost) * 4 < u64::from(prompt) => Severity::Some,
                _ => Severity::Much,
            },
        }
    }
}

/// A turn's glyph in its lane, from its losses (lost tokens, not the share reused): a harmless
/// break beside a costly eviction is drawn as the eviction, a break that lost nothing as clean.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// Nothing lost (`■`).
    Clean,
    /// The client broke the prefix (system prompt, tools, history) and lost tokens (`×`).
    Break,
    /// Something else ran on the cache in between (a side-call, another conversation or model)
    /// (`!`).
    Eviction,
    /// The server dropped or trimmed its cache on its own, or a hosted provider's cache
    /// expired or missed (`~`).
    Server,
    /// The server reported no reuse: the loss cannot be told (`?`).
    Unmeasured,
}

impl Mark {
    pub fn glyph(self) -> &'static str {
        match self {
            Mark::Clean => "■",
            Mark::Break => "×",
            Mark::Eviction => "!",
            Mark::Server => "~",
            Mark::Unmeasured => "?",
        }
    }
}

#[derive(Debug, Clone)]
pub struct BreakItem {
    pub id: u64,
    pub t_start_ms: i64,
    pub client: String,
    pub alias: String,
    pub conversation: Option<u32>,
    pub turn: Option<u32>,
    pub cause: String,
    pub tokens: u32,
    pub ms: Option<f64>,
    /// The row's loss could be measured (else "not measured", never "no loss").
    pub measured: bool,
    pub place: String,
}

#[derive(Debug, Clone)]
pub struct ClientLoss {
    pub client: String,
    pub alias: String,
    pub requests: u32,
    pub conversations: u32,
    pub tokens: u64,
    pub ms: Option<f64>,
    pub by_cause: Vec<(String, u64)>,
    /// What the client caused: its own breaks, and the evictions `evicted_by` names it for.
    pub caused_tokens: u64,
    pub caused_ms: Option<f64>,
    pub caused_by_cause: Vec<(String, u64)>,
    /// Whom it cost (client, tokens), highest first; itself for its own breaks.
    pub caused_to: Vec<(String, u64)>,
}

/// Hit rate by capacity (cold replay while live), with the ceiling and the server's own reuse.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Curve {
    pub label: String,
    /// (capacity label, lru, fifo, optimal) as hit shares 0..1; optimal only in snapshots.
    pub points: Vec<(String, f64, f64, Option<f64>)>,
    /// Replies cached after their prompts where known (`profile`'s `ceiling`).
    pub ceiling: f64,
    /// Prompts only (`profile`'s `ceiling_prompts_only`).
    pub ceiling_prompts_only: f64,
    pub observed: Option<f64>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct PrefixItem {
    pub label: String,
    /// What the prefix is made of (`tools (read_file, grep) + system "You are…"`), as
    /// `profile` describes it, where the input carries prompts.
    pub what: Option<String>,
    pub share_of_reusable: f64,
    /// Tokens of the shared prefix.
    pub prefix_tokens: u64,
    pub count: u64,
    pub reusable_tokens: u64,
}

/// Breaks described in a view (the newest); the rest are counted.
pub const MAX_BREAKS_SHOWN: usize = 1_000;

/// Tokens, milliseconds (if measured) and tokens by cause, of one client.
type LossTally<'a> = (u64, Option<f64>, Vec<(&'a str, u64)>);

/// Does a row pass the filter by what it keeps (client, model, conversation `c3`, or text of
/// its break)? The live engine adds the rows whose messages contain it.
pub fn matches(row: &Row, filter: &str) -> bool {
    let filter = filter.trim().to_lowercase();
    if filter.is_empty() {
        return true;
    }
    let conversation = row
        .conversation
        .map(|c| format!("c{c}"))
        .unwrap_or_default();
    let place = row
        .break_location
        .as_ref()
        .map(|l| {
            format!(
                "{} {}",
                l.before.as_deref().unwrap_or(""),
                l.after.as_deref().unwrap_or("")
            )
        })
        .unwrap_or_default();
    [
        row.client.as_str(),
        row.model.as_str(),
        conversation.as_str(),
        place.as_str(),
    ]
    .iter()
    .any(|field| field.to_lowercase().contains(&filter))
}

impl View {
    /// Borrows the report's rows (no copy of a hundred thousand rows per snapshot).
    pub fn build<R: Priced>(report: &Report<R>, filter: &str) -> View {
        View::build_with_text(report, filter, None)
    }

    /// `build`, with the filter also passing the rows in `with_text` (the exchanges whose
    /// messages contain it, `Analyzer::ids_with_text`).
    pub fn build_with_text<R: Priced>(
        report: &Report<R>,
        filter: &str,
        with_text: Option<&std::collections::HashSet<u64>>,
    ) -> View {
        let filtered = !filter.trim().is_empty();
        let rows: Vec<Rated> = report
            .rows
            .iter()
            .map(Priced::rated)
            .filter(|r| {
                !filtered
                    || matches(r, filter)
                    || with_text.is_some_and(|ids| ids.contains(&r.row().id))
            })
            .collect();
        let aliases = Aliases::new(
            report
                .clients
                .iter()
                .map(|c| (c.client.as_str(), c.harness.as_deref())),
        );
        let (losses, unattributed, who_cost_whom) = losses(report, &rows, &aliases, filtered);
        let (breaks, breaks_total) = breaks(&rows, &aliases);
        View {
            header: header(report, &rows, filter),
            lanes: lanes(report, &rows, &aliases),
            breaks,
            breaks_total,
            losses,
            unattributed,
            who_cost_whom,
            aliases,
            curve: None,
            prefixes: Vec::new(),
        }
    }
}

/// The header's figures: the report's, or worked out again over the rows a filter passes.
fn header(report: &Report<impl Priced>, rows: &[Rated], filter: &str) -> Header {
    if !filter.trim().is_empty() {
        // The report's totals, worked out again over the matching rows only, so the header
        // and the Loss pane's "all" line never sit unfiltered above a filtered client.
        let time = crate::analysis::report::time(rows);
        let mut conversations: Vec<u32> = rows.iter().filter_map(|r| r.conversation).collect();
        conversations.sort_unstable();
        conversations.dedup();
        Header {
            records: rows.len() as u64,
            analysed: rows.len() as u64,
            turns: rows.iter().filter(|r| r.kind == RowKind::Turn).count() as u64,
            conversations: conversations.len() as u64,
            lost_tokens: time.lost_tokens,
            lost_ms: time.lost_ms.map(|m| m.value),
            prefill_ms: time.prefill_ms.map(|m| m.value),
            bad_lines: report.coverage.bad_lines,
            loss_measured: rows.iter().any(|r| r.loss_measured),
            continued: rows.iter().any(|r| r.linked_to.is_some()),
            filter: filter.trim().to_string(),
            all_records: report.coverage.records,
            untimed_tokens: time.untimed_tokens,
            providers: providers(rows),
            lost_usd: None,
        }
    } else {
        Header {
            records: report.coverage.records,
            analysed: report.coverage.analysed,
            turns: report.coverage.turns,
            conversations: report.coverage.conversations,
            lost_tokens: report.time.lost_tokens,
            lost_ms: report.time.lost_ms.map(|m| m.value),
            prefill_ms: report.time.prefill_ms.map(|m| m.value),
            bad_lines: report.coverage.bad_lines,
            loss_measured: rows.iter().any(|r| r.loss_measured),
            continued: rows.iter().any(|r| r.linked_to.is_some()),
            filter: String::new(),
            all_records: report.coverage.records,
            untimed_tokens: report.time.untimed_tokens,
            providers: providers(rows),
            lost_usd: report.money.as_ref().map(|m| m.lost_usd),
        }
    }
}

/// One lane a conversation, its turns as cells, grouped by client in order of first request.
fn lanes(report: &Report<impl Priced>, rows: &[Rated], aliases: &Aliases) -> Vec<Lane> {
    let mut lanes: Vec<Lane> = Vec::new();
    let mut evictor_names = EvictorNames::default();
    let mut lane_names: HashMap<&str, (Arc<str>, Arc<str>)> = HashMap::new();
    // Conversations are numbered from 1 up: a lane's index by number, not by hash.
    let mut lane_of: Vec<usize> = Vec::new();
    // Each lane's cells counted first, so each lane holds its own length: grown by pushes,
    // a snapshot's cells (one per turn) took twice their size.
    let mut cells_of: Vec<u32> = Vec::new();
    for conversation in rows
        .iter()
        .filter(|r| r.kind == RowKind::Turn)
        .filter_map(|r| r.conversation)
    {
        let slot = conversation as usize;
        if cells_of.len() <= slot {
            cells_of.resize(slot + 1, 0);
        }
        cells_of[slot] = cells_of[slot].saturating_add(1);
    }
    let links = crate::analysis::subagent_links(rows.iter().map(|r| r.row()));
    for row in rows.iter().copied().filter(|r| r.kind == RowKind::Turn) {
        let Some(conversation) = row.conversation else {
            continue;
        };
        let cell = Cell {
            id: row.id,
            turn: row.turn.unwrap_or(0),
            reuse: row.observed_reuse,
            broke: row.break_cause,
            lost_tokens: [&row.lost_client, &row.lost_external]
                .into_iter()
                .flatten()
                .map(|l| l.tokens)
                .sum(),
            evicted_by: row.row().evicted_by.as_ref().map(|by| evictor_names.of(by)),
            mark: mark_of(row.row()),
            prompt_tokens: row.counts.prompt_tokens.map(|p| p.value),
        };
        let slot = conversation as usize;
        match lane_of.get(slot).copied().filter(|&i| i != usize::MAX) {
            Some(i) => lanes[i].cells.push(cell),
            None => {
                if lane_of.len() <= slot {
                    lane_of.resize(slot + 1, usize::MAX);
                }
                lane_of[slot] = lanes.len();
                let mut cells = Vec::with_capacity(cells_of[slot] as usize);
                cells.push(cell);
                let (client, alias) =
                    lane_names
                        .entry(row.row().client.as_str())
                        .or_insert_with(|| {
                            (
                                Arc::from(row.row().client.as_str()),
                                aliases.of(&row.client).into(),
                            )
                        });
                lanes.push(Lane {
                    client: Arc::clone(client),
                    alias: Arc::clone(alias),
                    conversation,
                    cells,
                    spawned_by: links.get(&row.id).copied(),
                });
            }
        }
    }
    // Grouped by client, in order of each client's first request.
    let client_order: IntMap<&str, usize> = report
        .clients
        .iter()
        .enumerate()
        .map(|(i, c)| (c.client.as_str(), i))
        .collect();
    // Each lane's key worked out once, not at every comparison.
    lanes.sort_by_cached_key(|l| {
        (
            client_order.get(&*l.client).copied().unwrap_or(usize::MAX),
            l.conversation,
        )
    });
    lanes
}

/// The newest breaks described (newest first), and how many there are.
fn breaks(rows: &[Rated], aliases: &Aliases) -> (Vec<BreakItem>, usize) {
    let broken: Vec<Rated> = rows
        .iter()
        .copied()
        .filter(|r| r.break_cause.is_some() || r.lost_external.is_some())
        .collect();
    let breaks_total = broken.len();
    // Only the newest are described: formatting every break of a long run was most of a
    // snapshot's view cost, and the pane lists the newest first.
    // One fact per cause, each with its own loss: a turn whose prefix broke harmlessly and
    // that was also evicted is two lines, and the eviction's tokens are the eviction's, as
    // the header, the Loss pane and `analyze` count them.
    let mut breaks: Vec<BreakItem> = Vec::new();
    for r in &broken[broken.len().saturating_sub(MAX_BREAKS_SHOWN)..] {
        let fact = |cause: &str,
                    loss: Option<(
            &crate::analysis::Loss,
            Option<crate::analysis::Measured<f64>>,
        )>,
                    place: String| BreakItem {
            id: r.id,
            t_start_ms: r.t_start_ms,
            client: r.client.clone(),
            alias: aliases.of(&r.client),
            conversation: r.conversation,
            turn: r.turn,
            // A harness's compaction rewrites the history on purpose: named as such.
            cause: if r.compaction && cause.starts_with("history_") {
                "compaction".to_string()
            } else {
                cause_label(cause).to_string()
            },
            tokens: loss.map_or(0, |(l, _)| l.tokens),
            ms: loss.and_then(|(_, ms)| ms.map(|m| m.value)),
            measured: r.loss_measured,
            place,
        };
        // The loss's own name where it has one (`history_reordered` is finer than the
        // break's `history_rewritten`), else the break's.
        let client_cause = r.lost_client.as_ref().map(|l| l.cause.clone());
        let client_cause = client_cause.or_else(|| r.break_cause.map(|c| c.name().into()));
        if let Some(cause) = client_cause {
            breaks.push(fact(&cause, r.client_loss(), location(r)));
        }
        if let Some(external) = &r.lost_external {
            let place = match &r.evicted_by {
                Some(by) => format!(
                    "evicted by #{} ({}, {})",
                    by.row,
                    aliases.of(&by.client),
                    cause_label(&by.kind)
                ),
                // The engine's own: its likely mechanism (`analysis::engine_cause`).
                None => r.engine_cause.as_ref().map_or_else(String::new, |engine| {
                    format!("the engine's: {}", engine.kind.label())
                }),
            };
            breaks.push(fact(&external.cause, r.external_loss(), place));
        }
    }
    breaks.reverse();
    (breaks, breaks_total)
}

/// Losses no client caused, by label: tokens and milliseconds.
type Unattributed = Vec<(String, u64, Option<f64>)>;
/// Tokens lost by (causer, victim); no causer: the server's own.
type WhoCostWhom = Vec<(Option<String>, String, u64)>;

/// Per client what it suffered and caused (by cost), what no client caused, and who cost whom.
fn losses(
    report: &Report<impl Priced>,
    rows: &[Rated],
    aliases: &Aliases,
    filtered: bool,
) -> (Vec<ClientLoss>, Unattributed, WhoCostWhom) {
    // One pass over the rows, then one entry per client in the report's order.
    let mut loss_of: IntMap<&str, LossTally> = IntMap::default();
    for row in rows.iter().copied() {
        for (loss, loss_ms) in row.losses() {
            let (tokens, ms, by_cause) = loss_of.entry(row.row().client.as_str()).or_default();
            *tokens += u64::from(loss.tokens);
            add_ms(ms, loss_ms.map(|m| m.value));
            // By cause as recorded; named once per client below.
            tally(by_cause, loss.cause.as_str(), u64::from(loss.tokens));
        }
    }
    // What each client caused: its own breaks, the evictions `evicted_by` names it for; what
    // no client caused (the server's own resets) apart.
    #[derive(Default)]
    struct Caused<'a> {
        tokens: u64,
        ms: Option<f64>,
        by_cause: Vec<(&'a str, u64)>,
        to: Vec<(&'a str, u64)>,
    }
    let mut caused_by: IntMap<&str, Caused> = IntMap::default();
    let mut unattributed: Vec<(String, u64, Option<f64>)> = Vec::new();
    let mut who: Vec<((Option<&str>, &str), u64)> = Vec::new();
    for row in rows.iter().copied() {
        let victim = row.row().client.as_str();
        let own = row
            .client_loss()
            .map(|(loss, ms)| (Some(victim), loss, ms.map(|m| m.value)));
        let external = row.external_loss().map(|(loss, ms)| {
            let causer = row.row().evicted_by.as_ref().map(|by| by.client.as_str());
            (causer, loss, ms.map(|m| m.value))
        });
        for (causer, loss, ms) in [own, external].into_iter().flatten() {
            tally(&mut who, (causer, victim), u64::from(loss.tokens));
            let Some(causer) = causer else {
                let label = cause_label(&loss.cause).to_string();
                match unattributed.iter_mut().find(|(l, _, _)| *l == label) {
                    Some(entry) => {
                        entry.1 += u64::from(loss.tokens);
                        add_ms(&mut entry.2, ms);
                    }
                    None => unattributed.push((label, u64::from(loss.tokens), ms)),
                }
                continue;
            };
            let c = caused_by.entry(causer).or_default();
            c.tokens += u64::from(loss.tokens);
            add_ms(&mut c.ms, ms);
            tally(&mut c.by_cause, loss.cause.as_str(), u64::from(loss.tokens));
            tally(&mut c.to, victim, u64::from(loss.tokens));
        }
    }
    unattributed.sort_by_key(|u| std::cmp::Reverse(u.1));
    let who_cost_whom = who
        .into_iter()
        .map(|((c, v), t)| (c.map(str::to_string), v.to_string(), t))
        .collect();
    // Filtered, a client is listed when some of its rows match, with their counts.
    let mut matched: IntMap<&str, (u32, Vec<u32>)> = IntMap::default();
    if filtered {
        for row in rows.iter().copied() {
            let (requests, conversations) = matched.entry(row.row().client.as_str()).or_default();
            *requests += 1;
            if let Some(c) = row.conversation
                && !conversations.contains(&c)
            {
                conversations.push(c);
            }
        }
    }
    let losses = report
        .clients
        .iter()
        .filter_map(|c| {
            let (requests, conversations) = if filtered {
                let (requests, conversations) = matched.get(c.client.as_str())?;
                (*requests, conversations.len() as u32)
            } else {
                (c.requests, c.conversations)
            };
            let (tokens, ms, causes) = loss_of.remove(c.client.as_str()).unwrap_or_default();
            let by_cause = by_label(causes);
            let caused = caused_by.remove(c.client.as_str()).unwrap_or_default();
            let caused_by_cause = by_label(caused.by_cause);
            let mut caused_to: Vec<(String, u64)> = caused
                .to
                .into_iter()
                .map(|(victim, tokens)| (victim.to_string(), tokens))
                .collect();
            caused_to.sort_by_key(|c| std::cmp::Reverse(c.1));
            Some(ClientLoss {
                client: c.client.clone(),
                alias: aliases.of(&c.client),
                caused_tokens: caused.tokens,
                caused_ms: caused.ms,
                caused_by_cause,
                caused_to,
                requests,
                conversations,
                tokens,
                ms,
                by_cause,
            })
        })
        .collect::<Vec<ClientLoss>>();
    let mut losses = losses;
    // By cost: what a client suffered and what it caused, highest first (stable: the
    // report's order among equals).
    losses.sort_by_key(|l| std::cmp::Reverse(l.tokens.max(l.caused_tokens)));
    (losses, unattributed, who_cost_whom)
}

fn mark_of(row: &Row) -> Mark {
    let client = row.lost_client.as_ref().map_or(0, |l| l.tokens);
    let external = row.lost_external.as_ref();
    let external_tokens = external.map_or(0, |l| l.tokens);
    if !row.loss_measured {
        // A conversation's first turn had nothing cached to lose.
        return if row.linked_to.is_none() {
            Mark::Clean
        } else {
            Mark::Unmeasured
        };
    }
    if client == 0 && external_tokens == 0 {
        return Mark::Clean;
    }
    if client >= external_tokens {
        return Mark::Break;
    }
    match external {
        Some(l) if l.cause.starts_with("server_") || l.cause == "cache_expired" => Mark::Server,
        Some(l) if l.cause == "provider_miss" => Mark::Server,
        _ => Mark::Eviction,
    }
}

/// Where a row's prompt stopped matching: the changed text, the tools, or the message.
fn location(r: &Row) -> String {
    match &r.break_location {
        Some(l) if l.before.is_some() || l.after.is_some() => change(
            l.before.as_deref().unwrap_or(""),
            l.after.as_deref().unwrap_or(""),
        ),
        Some(l) if !l.tools_added.is_empty() || !l.tools_removed.is_empty() => {
            let list = |sign: char, tools: &[String]| {
                tools
                    .iter()
                    .map(|t| format!("{sign}{}", shown(t)))
                    .collect::<Vec<_>>()
            };
            let mut changed = list('+', &l.tools_added);
            changed.extend(list('-', &l.tools_removed));
            format!("tools {}", changed.join(" "))
        }
        Some(l) => match (l.message, l.head_matched, l.tail_matched) {
            (Some(m), Some(h), Some(t)) => {
                format!("message {m}: head {}, tail {}", same(h), same(t))
            }
            (Some(m), _, _) => format!("message {m}"),
            _ => String::new(),
        },
        None => String::new(),
    }
}

/// `"…Today is Monday." → "…Today is Tuesday."`: the shared lead-in cut to a few characters,
/// so the change itself fits a narrow pane.
fn change(before: &str, after: &str) -> String {
    const CONTEXT: usize = 12;
    let shared = before
        .chars()
        .zip(after.chars())
        .take_while(|(a, b)| a == b)
        .count();
    let cut = |text: &str| -> String {
        let skip = shared.saturating_sub(CONTEXT);
        let rest: String = text.chars().skip(skip).collect();
        if skip > 0 { format!("…{rest}") } else { rest }
    };
    format!("\"{}\" → \"{}\"", shown(&cut(before)), shown(&cut(after)))
}

/// Recorded text on one line, as written (no Rust escaping): line breaks and tabs as `⏎` and
/// `⇥`, other control characters escaped (`crate::text`).
pub fn shown(text: &str) -> String {
    let one_line: String = text
        .chars()
        .map(|c| match c {
            '\n' => '⏎',
            '\t' => '⇥',
            '\r' => '␍',
            c => c,
        })
        .collect();
    crate::text::printable(&one_line).into_owned()
}

/// Short names for user agents: the harness it names (`Claude Code`), the product
/// (`llmp-drive`), its version where two agents share
/// a product, the whole user agent where that is not enough; the `#2` suffix kept.
#[derive(Debug, Clone, Default)]
pub struct Aliases {
    names: std::collections::HashMap<String, String>,
}

impl Aliases {
    /// From each client and the harness the analysis named for it, if any.
    pub fn new<'a>(clients: impl Iterator<Item = (&'a str, Option<&'a str>)>) -> Aliases {
        let (clients, harnesses): (Vec<&str>, Vec<Option<&str>>) = clients.unzip();
        // A harness named from more than the user-agent (aider, by its system prompt).
        let named: std::collections::HashMap<&str, &str> = clients
            .iter()
            .zip(&harnesses)
            .filter_map(|(client, harness)| {
                let harness = harness.map(|h| h.split(' ').next().unwrap_or(h))?;
                Some((*client, harness))
            })
            .collect();
        let agent = |client: &'a str| -> (&'a str, &'a str) {
            match client.rsplit_once(" #") {
                Some((ua, n)) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => {
                    (ua, &client[ua.len()..])
                }
                _ => (client, ""),
            }
        };
        let agent_of = |client: &'a str| agent(client).0;
        let product = |ua: &'a str| -> &'a str {
            let first = ua.split_whitespace().next().unwrap_or(ua);
            first.split('/').next().unwrap_or(first)
        };
        let first_word = |ua: &'a str| -> &'a str { ua.split_whitespace().next().unwrap_or(ua) };
        let mut agents: Vec<&str> = clients.iter().map(|c| agent(c).0).collect();
        agents.sort_unstable();
        agents.dedup();
        // How many distinct user-agents each short form stands for, counted once: asking every
        // client's form of every other client made a snapshot quadratic in the clients (20 s
        // at 16,000 clients).
        let count_by = |short: &dyn Fn(&'a str) -> &'a str| {
            let mut counts: std::collections::HashMap<&'a str, usize> =
                std::collections::HashMap::new();
            for agent in &agents {
                *counts.entry(short(agent)).or_insert(0) += 1;
            }
            counts
        };
        let (by_product, by_first_word) = (count_by(&product), count_by(&first_word));
        let unique = |counts: &std::collections::HashMap<&'a str, usize>, short: &'a str| {
            counts.get(short) == Some(&1)
        };
        let harness_of = |client: &'a str| {
            crate::analysis::harness::product_name(agent_of(client)).or(named.get(client).copied())
        };
        // Each harness's user-agents: the first seen, and whether another one was.
        let mut agents_of_harness: std::collections::HashMap<&str, (&str, bool)> =
            std::collections::HashMap::new();
        for client in &clients {
            if let Some(h) = harness_of(client) {
                let agent = agent_of(client);
                let (first, more) = agents_of_harness.entry(h).or_insert((agent, false));
                *more |= *first != agent;
            }
        }
        let names = clients
            .iter()
            .map(|client| {
                let (ua, suffix) = agent(client);
                let harness = harness_of(client);
                // One user-agent per harness: its name says which one.
                let same_harness = |h| agents_of_harness.get(h).is_some_and(|(_, more)| !more);
                let short = if let Some(h) = harness
                    && same_harness(h)
                {
                    h
                } else if unique(&by_product, product(ua)) && !product(ua).is_empty() {
                    product(ua)
                } else if unique(&by_first_word, first_word(ua)) && !first_word(ua).is_empty() {
                    first_word(ua)
                } else {
                    ua
                };
                let short: String = if short.chars().count() > 20 {
                    short.chars().take(19).chain(['…']).collect()
                } else {
                    short.to_string()
                };
                (client.to_string(), format!("{short}{suffix}"))
            })
            .collect();
        Aliases { names }
    }

    pub fn of_client(&self, client: &str) -> Option<&str> {
        self.names.get(client).map(String::as_str)
    }

    /// The alias, or the client itself when it is not one of the report's.
    pub fn of(&self, client: &str) -> String {
        self.of_client(client).unwrap_or(client).to_string()
    }
}

fn same(matched: bool) -> &'static str {
    if matched { "same" } else { "changed" }
}

/// `8,759`, `12.3K`, `4.1M`: short and readable.
pub fn tokens(n: u64) -> String {
    match n {
        0..=9_999 => thousands(n),
        10_000..=999_999 => format!("{:.1}K", n as f64 / 1000.0),
        _ => format!("{:.1}M", n as f64 / 1_000_000.0),
    }
}

/// Adds `tokens` to `key`'s entry of a short list kept in first-seen order.
fn tally<K: PartialEq>(list: &mut Vec<(K, u64)>, key: K, tokens: u64) {
    match list.iter_mut().find(|(k, _)| *k == key) {
        Some(entry) => entry.1 += tokens,
        None => list.push((key, tokens)),
    }
}

/// Adds measured milliseconds to a sum that stays "not measured" until one is.
fn add_ms(sum: &mut Option<f64>, ms: Option<f64>) {
    if let Some(ms) = ms {
        *sum = Some(sum.unwrap_or(0.0) + ms);
    }
}

/// Tokens by cause as recorded, summed by the cause's label, largest first.
fn by_label(causes: Vec<(&str, u64)>) -> Vec<(String, u64)> {
    let mut labelled: Vec<(&str, u64)> = Vec::new();
    for (cause, tokens) in causes {
        tally(&mut labelled, cause_label(cause), tokens);
    }
    labelled.sort_by_key(|c| std::cmp::Reverse(c.1));
    labelled
        .into_iter()
        .map(|(label, tokens)| (label.to_string(), tokens))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The aliases as they were first written, each short form checked against every other
    /// client (quadratic): the oracle of the counted version.
    fn aliases_by_scanning(
        clients: &[(&'static str, Option<&'static str>)],
    ) -> Vec<(String, String)> {
        let named: std::collections::HashMap<&str, &str> = clients
            .iter()
            .filter_map(|(c, h)| Some((*c, h.map(|h| h.split(' ').next().unwrap_or(h))?)))
            .collect();
        let agent = |client: &'static str| match client.rsplit_once(" #") {
            Some((ua, n)) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => {
                (ua, &client[ua.len()..])
            }
            _ => (client, ""),
        };
        let product = |ua: &'static str| {
            let first = ua.split_whitespace().next().unwrap_or(ua);
            first.split('/').next().unwrap_or(first)
        };
        let first_word = |ua: &'static str| ua.split_whitespace().next().unwrap_or(ua);
        let mut agents: Vec<&str> = clients.iter().map(|(c, _)| agent(c).0).collect();
        agents.sort_unstable();
        agents.dedup();
        let unique = |short: &dyn Fn(&'static str) -> &'static str, ua| {
            agents.iter().filter(|o| short(o) == short(ua)).count() == 1
        };
        let harness_of = |c: &'static str| {
            crate::analysis::harness::product_name(agent(c).0).or(named.get(c).copied())
        };
        clients
            .iter()
            .map(|(client, _)| {
                let (ua, suffix) = agent(client);
                let same_harness = |h| {
                    let mut a: Vec<&str> = clients
                        .iter()
                        .filter(|(c, _)| harness_of(c) == Some(h))
                        .map(|(c, _)| agent(c).0)
                        .collect();
                    a.sort_unstable();
                    a.dedup();
                    a.len() == 1
                };
                let short = match harness_of(client) {
                    Some(h) if same_harness(h) => h,
                    _ if unique(&product, ua) && !product(ua).is_empty() => product(ua),
                    _ if unique(&first_word, ua) && !first_word(ua).is_empty() => first_word(ua),
                    _ => ua,
                };
                let short: String = if short.chars().count() > 20 {
                    short.chars().take(19).chain(['…']).collect()
                } else {
                    short.to_string()
                };
                (client.to_string(), format!("{short}{suffix}"))
            })
            .collect()
    }

    #[test]
    fn aliases_counted_once_are_the_aliases_found_by_scanning() {
        let parts = [
            "claude-cli/2.1.197 (external, cli)",
            "claude-cli/2.1.200 (external, cli)",
            "opencode/0.3.1",
            "OpenAI/Python 1.99.9",
            "OpenAI/Python 1.99.9 aider",
            "python-requests/2.32.3",
            "python-httpx/0.28",
            "curl/8.5.0",
            "llmp-drive",
            "a very long user agent name that goes on",
            "",
            "  ",
        ];
        let harnesses = [None, Some("aider 0.86"), Some("Claude Code 2.1")];
        let mut seed = 7u64;
        for round in 0..200 {
            let mut clients: Vec<(&'static str, Option<&'static str>)> = Vec::new();
            for _ in 0..(round % 9 + 1) {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let ua = parts[(seed >> 33) as usize % parts.len()];
                let client: &'static str = match (seed >> 20) % 3 {
                    0 => ua,
                    n => Box::leak(format!("{ua} #{n}").into_boxed_str()),
                };
                let harness = harnesses[(seed >> 40) as usize % harnesses.len()];
                if clients.iter().all(|(c, _)| *c != client) {
                    clients.push((client, harness));
                }
            }
            let counted = Aliases::new(clients.iter().copied());
            for (client, alias) in aliases_by_scanning(&clients) {
                assert_eq!(counted.of(&client), alias, "{clients:?}");
            }
        }
    }
}
