//! The incremental engine: records arrive one by one (in completion order) and the state after
//! each `push` equals a batch analysis of the records pushed so far.
//!
//! How (DESIGN.md, "Incremental analysis"): rows are kept in start order. A new exchange is
//! inserted where it started; its classification (turn or side-call, stateless domain) is
//! updated through hash indexes, which also tell which earlier rows changed kind. The
//! sequential pass (sessions, conversation tips, links, losses) is then re-run from the
//! earliest affected row, starting from a checkpoint of its state. In the common case (the
//! record started after every other) that is one row. Global figures that every new record
//! shifts a little (the bulk prefill rate that prices losses, client labels, findings) are
//! computed when a report is asked for.

use std::collections::{BTreeSet, HashMap};

use super::report::{self, Report};
use super::table::{
    self, Choice, Link, Row, RowKind, Shape, Table, Tip, Weights, apply_link, choose_by_match,
    continues, link, structured, summarise, system_hash, weights,
};
use super::{Config, Skipped, findings};
use crate::normalize::exchange::{Exchange, SkipReason, normalize};
use crate::record::{Record, hash};

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

/// How to take back one change the sequential pass made to its state, so a rewind costs the
/// rows rewound, not the size of the state.
#[derive(Debug)]
enum Undo {
    OpenSession {
        model: String,
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
}

type TipKey = (String, Option<String>, u32);

#[derive(Debug, Default)]
struct SeqState {
    open_sessions: HashMap<String, (u32, i64)>,
    next_session: u32,
    tips: Vec<Tip>,
    tips_by: HashMap<TipKey, Vec<usize>>,
    /// Each tip under (its tip-key hash, its row's message key), as (row, tip): finds the tips
    /// a request continues without scanning every conversation of the session.
    tips_by_message_key: HashMap<(u64, u64), BTreeSet<(usize, usize)>>,
}

#[derive(Debug, Default)]
struct KeyGroup {
    /// Rows whose whole message list has this key, in start order.
    members: Vec<OrderKey>,
    /// Every member that started before this continues into a later request.
    continued_below: Option<OrderKey>,
}

/// Per model (the llmp "domain"): what classification needs to stay exact incrementally.
#[derive(Debug, Default)]
struct Domain {
    groups: HashMap<u64, KeyGroup>,
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

/// What the global figures (client labels, findings) changed since the last `refresh`.
#[derive(Debug, Clone, Default)]
pub struct Refresh {
    /// Rows already told about whose client label changed (e.g. `a/1` became `a/1 #1` when a
    /// second tool set of that user-agent appeared), with the new label.
    pub relabelled: Vec<(u64, String)>,
    /// Indexes into `report.findings`.
    pub findings_new: Vec<usize>,
    pub findings_changed: Vec<usize>,
    /// Findings no longer reported.
    pub findings_gone: Vec<FindingKey>,
}

/// A finding's identity across refreshes: kind, model, client, and which of several findings
/// with those three it is.
pub type FindingKey = (findings::FindingKind, Option<String>, Option<String>, usize);

pub struct Analyzer {
    config: Config,
    /// Client labels and findings as of the last `refresh`.
    told_labels: HashMap<u64, String>,
    told_findings: HashMap<FindingKey, findings::Finding>,
    records: u64,
    span: Option<(i64, i64)>,
    skipped: Vec<Skipped>,
    xs: Vec<Exchange>,
    ws: Vec<Weights>,
    keys: Vec<u64>,
    /// Each row's prefix keys (see `message_keys`).
    prefix_keys: Vec<Vec<u64>>,
    continued: Vec<bool>,
    continuing: Vec<bool>,
    kinds: Vec<(RowKind, Option<Shape>)>,
    domains: HashMap<String, Domain>,
    rows: Vec<Row>,
    seq: SeqState,
    /// What each derived row changed in `seq`: row r's undos are
    /// `undo[undo_start[r]..undo_start[r + 1]]`.
    undo: Vec<Undo>,
    undo_start: Vec<usize>,
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
        }
    }
}

impl Analyzer {
    pub fn new(config: Config) -> Analyzer {
        Analyzer {
            config,
            told_labels: HashMap::new(),
            told_findings: HashMap::new(),
            records: 0,
            span: None,
            skipped: Vec::new(),
            xs: Vec::new(),
            ws: Vec::new(),
            keys: Vec::new(),
            prefix_keys: Vec::new(),
            continued: Vec::new(),
            continuing: Vec::new(),
            kinds: Vec::new(),
            domains: HashMap::new(),
            rows: Vec::new(),
            seq: SeqState {
                next_session: 1,
                ..SeqState::default()
            },
            undo: Vec::new(),
            undo_start: Vec::new(),
        }
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
        self.count(record);
        let x = match normalize(record) {
            Ok(x) => x,
            Err(reason) => {
                self.skipped.push(Skipped {
                    path: record.request.path.clone(),
                    reason,
                });
                return Update {
                    row: None,
                    skipped: Some(reason),
                    rederived: Vec::new(),
                };
            }
        };
        let id = x.id;
        let from = self.insert(x);
        let rederived = self.advance(from);
        Update {
            row: Some(id),
            skipped: None,
            rederived: rederived.into_iter().filter(|&r| r != id).collect(),
        }
    }

    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// The report of everything pushed so far: rows, then the global figures.
    pub fn report(&self) -> Report {
        let order: Vec<&Exchange> = self.xs.iter().collect();
        let mut rows = self.rows.clone();
        table::price(&mut rows);
        table::assign_clients(&order, &mut rows);
        table::name_evictors(&mut rows);
        let tools = table::tool_usage(&order, &self.ws, &rows);
        let clients = table::clients(&order, &rows);
        let table = Table {
            rows,
            tools,
            clients,
        };
        let findings = findings::find(&table, &self.config);
        let input = report::Input {
            records: self.records,
            span: self.span,
            analysed: self.xs.len() as u64,
            skipped: &self.skipped,
        };
        report::assemble(input, table, findings)
    }

    /// The report, and what its global figures changed since the last call. Client labels,
    /// prices and findings depend on every row, so they are not worked out on each `push` but
    /// here, as often as a view redraws (DESIGN.md, "Incremental analysis").
    pub fn refresh(&mut self) -> (Report, Refresh) {
        let report = self.report();
        let mut changes = Refresh::default();
        for row in &report.rows {
            match self.told_labels.get_mut(&row.id) {
                Some(label) if *label != row.client => {
                    label.clone_from(&row.client);
                    changes.relabelled.push((row.id, row.client.clone()));
                }
                Some(_) => {}
                None => {
                    self.told_labels.insert(row.id, row.client.clone());
                }
            }
        }
        let mut current: HashMap<FindingKey, usize> = HashMap::new();
        for (i, finding) in report.findings.iter().enumerate() {
            let base = (finding.kind, finding.model.clone(), finding.client.clone());
            let nth = report.findings[..i]
                .iter()
                .filter(|f| f.kind == base.0 && f.model == base.1 && f.client == base.2)
                .count();
            let key = (base.0, base.1, base.2, nth);
            match self.told_findings.get(&key) {
                None => changes.findings_new.push(i),
                Some(told) if told != finding => changes.findings_changed.push(i),
                Some(_) => {}
            }
            current.insert(key, i);
        }
        changes.findings_gone = self
            .told_findings
            .keys()
            .filter(|key| !current.contains_key(*key))
            .cloned()
            .collect();
        changes.findings_gone.sort();
        self.told_findings = current
            .into_iter()
            .map(|(key, i)| (key, report.findings[i].clone()))
            .collect();
        (report, changes)
    }

    fn count(&mut self, record: &Record) {
        self.records += 1;
        let end = record.t_end_ms.max(record.t_start_ms);
        self.span = Some(match self.span {
            Some((s, e)) => (s.min(record.t_start_ms), e.max(end)),
            None => (record.t_start_ms, end),
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
        let model = x.model.clone();
        self.ws.insert(p, weights(&x));
        self.keys.insert(p, own_key);
        self.prefix_keys.insert(p, prefixes.clone());
        self.continued.insert(p, false);
        self.continuing.insert(p, false);
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
            if group.continued_below.is_none_or(|old| old < key) {
                let start = group
                    .continued_below
                    .map_or(0, |old| group.members.partition_point(|&m| m < old));
                let end = group.members.partition_point(|&m| m < key);
                newly_continued.extend_from_slice(&group.members[start..end]);
                group.continued_below = Some(key);
            }
        }
        let group = domain.groups.entry(own_key).or_default();
        let mut continued = group.continued_below.is_some_and(|c| c > key);
        let at = group.members.partition_point(|&m| m < key);
        group.members.insert(at, key);
        // An out-of-order arrival: later-started requests may continue this one.
        let mut later_continuing = Vec::new();
        for i in p + 1..self.xs.len() {
            if self.xs[i].model == model && continues(&self.xs[p], &self.xs[i]) {
                continued = true;
                later_continuing.push(i);
            }
        }

        let mut touched = vec![p];
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
            self.undo_start.push(self.undo.len());
            let row = self.derive(i);
            self.rows.push(row);
        }
        self.rows[first..].iter().map(|r| r.id).collect()
    }

    /// Takes back the rows from `to` on, newest first, undoing what each changed.
    fn rewind(&mut self, to: usize) {
        while self.rows.len() > to {
            self.rows.pop();
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
        let tip_key = (x.model.clone(), x.user_agent.clone(), session);
        let tip_hash = tip_key_hash(&tip_key);
        let choice = match self.continued_tip(i, session, tip_hash) {
            Some(t) => Choice::Continue(t),
            None => {
                let empty = Vec::new();
                let candidates = self.seq.tips_by.get(&tip_key).unwrap_or(&empty);
                let xs = &self.xs;
                choose_by_match(&|r| &xs[r], &self.seq.tips, candidates, x)
            }
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
                (Some(prev), false)
            }
            Choice::Fresh(from) => {
                let conversation = self.seq.tips.len() as u32 + 1;
                let from_row = from.map(|t| self.seq.tips[t].row);
                self.seq.tips.push(Tip {
                    row: i,
                    conversation,
                    turns: 1,
                });
                let t = self.seq.tips.len() - 1;
                self.seq.tips_by.entry(tip_key.clone()).or_default().push(t);
                self.undo.push(Undo::TipAdded { tip_key });
                let key = (tip_hash, self.keys[i]);
                self.seq.index(key, (i, t));
                self.undo.push(Undo::Indexed { key, entry: (i, t) });
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

    /// The tip `choose` would pick because row `i` continues its request: the longest such
    /// request, then the most recent. Found through the message-key index; `continues` is
    /// checked again so a hash collision cannot change the answer.
    fn continued_tip(&self, i: usize, session: u32, tip_hash: u64) -> Option<usize> {
        let x = &self.xs[i];
        for key in self.prefix_keys[i].iter().rev() {
            let Some(set) = self.seq.tips_by_message_key.get(&(tip_hash, *key)) else {
                continue;
            };
            let found = set.iter().rev().find(|&&(row, _)| {
                let prev = &self.xs[row];
                prev.model == x.model
                    && prev.user_agent == x.user_agent
                    && self.rows[row].session == session
                    && continues(prev, x)
            });
            if let Some(&(_, t)) = found {
                return Some(t);
            }
        }
        None
    }

    /// llmp's sessions: per model, a pause longer than the gap after the last end starts one.
    fn session(&mut self, i: usize) -> u32 {
        let x = &self.xs[i];
        let gap = self.config.session_gap_ms as i64;
        let open = self.seq.open_sessions.get(&x.model).copied();
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
        let before = self
            .seq
            .open_sessions
            .insert(x.model.clone(), (session, last_end));
        self.undo.push(Undo::OpenSession {
            model: x.model.clone(),
            before,
        });
        session
    }
}

fn tip_key_hash((model, user_agent, session): &(String, Option<String>, u32)) -> u64 {
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
        prefixes.push(mix(state, token(&m.role, &m.hash, true)));
        state = mix(state, token(&m.role, &m.hash, false));
    }
    let own = prefixes.last().copied().unwrap_or(0);
    (own, prefixes)
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
        let a = Analyzer::new(Config::default());
        let r = a.report();
        assert_eq!((r.coverage.records, r.rows.len(), r.window), (0, 0, None));
    }
}
