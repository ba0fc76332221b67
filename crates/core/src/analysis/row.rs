//! The analysis's rows, llmp's columns and prefixscope's additions, and what prices them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::normalize::Api;
use crate::normalize::exchange::Counts;
use crate::normalize::measured::Measured;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub id: u64,
    pub api: Api,
    pub model: String,
    pub client: String,
    pub t_start_ms: i64,
    pub kind: RowKind,
    pub side_call_shape: Option<Shape>,
    pub session: u32,
    pub conversation: Option<u32>,
    pub turn: Option<u32>,
    pub counts: Counts,
    pub composition: Composition,
    pub linked_to: Option<u64>,
    pub new_conversation: bool,
    pub prefix_tokens: Option<u32>,
    pub break_cause: Option<BreakCause>,
    pub compaction: bool,
    pub predicted_reuse: Option<f64>,
    pub observed_reuse: Option<f64>,
    pub cause: Option<Cause>,
    pub lost_client: Option<Loss>,
    pub lost_external: Option<Loss>,
    pub side_calls_between: Vec<u64>,
    pub other_conversations_between: Vec<u64>,
    pub other_domains_between: Vec<u64>,
    pub loss_measured: bool,
    /// prefixscope: where the prompt stopped matching the one it was linked to. Boxed: most
    /// rows have none, and inline it was a quarter of every row's size.
    pub break_location: Option<Box<BreakLocation>>,
    /// prefixscope: the request that most likely evicted this turn's prefix.
    pub evicted_by: Option<EvictedBy>,
    /// prefixscope: on a conversation's first turn, the request of another conversation whose
    /// tool call it may answer as a subagent (`engine::spawner`): a candidate, known as the
    /// turn arrives; kept once the parent goes on (`subagent_links`).
    #[serde(skip)]
    pub spawned_by: Option<u64>,
    /// prefixscope: the break's cause by name where it is one users know (`client_cause`):
    /// Claude Code's attribution header, a date in the system prompt, tools reordered, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cause: Option<String>,
    /// prefixscope: for a `server_*` loss, the engine's mechanism and its evidence. Boxed,
    /// like the next: few rows have one, and inline the two were 64 of every row's bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_cause: Option<Box<super::engine_cause::EngineCause>>,
    /// The engine cause from the request and response alone, before the probes refine it
    /// (`server_events`): what a refinement falls back to when the probes stop explaining it.
    #[serde(skip)]
    pub engine_base: Option<Box<super::engine_cause::EngineCause>>,
    /// prefixscope, hosted APIs: the provider's rule that kept this turn's prefix from its
    /// cache, where one did (`Cause::NotCacheable`, `CacheExpired`, `ProviderMiss`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncached: Option<crate::provider::Uncached>,
    /// prefixscope: who answered (`Provider::of_response`); absent for a local server.
    #[serde(default, skip_serializing_if = "crate::provider::Provider::is_local")]
    pub provider: crate::provider::Provider,
}

/// Where a break is: the first differing message and, in full mode, the first differing
/// character with up to 60 characters of text before and after; in digest mode, whether the
/// first and last 256 characters still matched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BreakLocation {
    pub message: Option<u32>,
    pub role: Option<String>,
    pub char_offset: Option<u32>,
    pub before: Option<String>,
    pub after: Option<String>,
    pub head_matched: Option<bool>,
    pub tail_matched: Option<bool>,
    pub tools_added: Vec<String>,
    pub tools_removed: Vec<String>,
    /// Both versions of the changed message, whole up to a bound (full mode only). Not in the
    /// report's JSON, which keeps the snippets: the TUI's detail shows and writes these.
    #[serde(skip)]
    pub texts: Option<BreakTexts>,
}

/// The changed message before and after, each cut at `limits::MAX_BREAK_TEXT_BYTES`, and where
/// the change is in them (characters of the whole texts, as `snippets` finds it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BreakTexts {
    pub before: Arc<str>,
    pub after: Arc<str>,
    /// Bytes of each text not kept (past the bound).
    pub before_cut: usize,
    pub after_cut: usize,
    /// Characters both texts start with, and end with, around the change.
    pub head: usize,
    pub tail: usize,
}

impl BreakTexts {
    pub(super) fn of(before: &Arc<str>, after: &Arc<str>, head: usize, tail: usize) -> BreakTexts {
        // The message's own text is shared when it fits: no copy for the common case.
        let kept = |text: &Arc<str>| -> (Arc<str>, usize) {
            let bound = crate::limits::MAX_BREAK_TEXT_BYTES;
            if text.len() <= bound {
                return (Arc::clone(text), 0);
            }
            let mut end = bound;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            (Arc::from(&text[..end]), text.len() - end)
        };
        let ((before, before_cut), (after, after_cut)) = (kept(before), kept(after));
        BreakTexts {
            before,
            after,
            before_cut,
            after_cut,
            head,
            tail,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvictedBy {
    pub row: u64,
    pub client: String,
    /// `side_call`, `other_conversation` or `other_model`.
    pub kind: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RowKind {
    Turn,
    SideCall,
    Stateless,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Shape {
    Summarise,
    Structured,
    Oneshot,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakCause {
    ToolsChanged,
    SystemChanged,
    HistoryRewritten,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    Structural,
    SideCall,
    OtherConversation,
    OtherModel,
    ServerReset,
    Undetermined,
    /// prefixscope, hosted APIs: the provider's rules kept the prefix out of its cache
    /// (`Row::uncached` says which: too short, no breakpoint).
    NotCacheable,
    /// prefixscope, hosted APIs: the pause since the prefix was sent exceeded its lifetime.
    CacheExpired,
    /// prefixscope, hosted APIs: no rule explains it; the provider did not serve the prefix.
    ProviderMiss,
}

impl Cause {
    /// llmp's causes of a loss that is not the client's: something took the slot, or the
    /// server dropped its cache.
    pub(super) fn slot_or_server(self) -> bool {
        matches!(
            self,
            Cause::SideCall
                | Cause::OtherConversation
                | Cause::OtherModel
                | Cause::ServerReset
                | Cause::Undetermined
        )
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Loss {
    pub cause: String,
    pub tokens: u32,
    pub ms: Option<Measured<f64>>,
}

/// A row shared with the live engine, and what its losses cost per token at its report's rates
/// (milliseconds, with the timing's source); the row's own `Loss::ms` are left unset. Every
/// record moves the bulk rate, hence nearly every loss's milliseconds: priced in the row, each
/// snapshot would copy most rows; priced here, it copies none (DESIGN.md, "Live engine").
#[derive(Debug, Clone, PartialEq)]
pub struct SharedRow {
    pub row: Arc<Row>,
    pub per_token: Option<Measured<f64>>,
}

impl SharedRow {
    /// The milliseconds of one of this row's losses.
    pub fn ms(&self, loss: &Loss) -> Option<Measured<f64>> {
        self.rated().ms(loss)
    }

    /// The row with its losses priced, as an owned report holds it.
    pub fn priced(&self) -> Row {
        let mut row = Row::clone(&self.row);
        price_at(&mut row, self.per_token);
        row
    }
}

/// Sets a row's losses' milliseconds at a rate per token (`table::price`'s multiply).
pub(super) fn price_at(row: &mut Row, per_token: Option<Measured<f64>>) {
    for loss in [row.lost_client.as_mut(), row.lost_external.as_mut()]
        .into_iter()
        .flatten()
    {
        loss.ms = per_token.map(|rate| Measured {
            value: f64::from(loss.tokens) * rate.value,
            source: rate.source,
        });
    }
}

impl Serialize for SharedRow {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.priced().serialize(serializer)
    }
}

/// How a report holds its rows: owned, with their losses priced (`Row`), or shared with the
/// live engine (`SharedRow`). What reads losses' milliseconds reads them through `Rated`.
pub trait Priced {
    fn rated(&self) -> Rated<'_>;
}

impl Priced for Row {
    fn rated(&self) -> Rated<'_> {
        Rated {
            row: self,
            per_token: None,
        }
    }
}

impl Priced for SharedRow {
    fn rated(&self) -> Rated<'_> {
        Rated {
            row: &self.row,
            per_token: Some(&self.per_token),
        }
    }
}

/// The subagent links to keep, from the subagent's first request id to the request whose tool
/// call it answers: the engine's candidates (`Row::spawned_by`, known as the subagent's first
/// turn arrives) whose parent conversation went on after that request. A harness waits for its
/// subagent, and a conversation that ended on a tool call spawned nothing (one test after
/// another of an SDK's suite looks alike). One rule for the panes and the WEKA export.
pub fn subagent_links<'a>(
    rows: impl Iterator<Item = &'a Row> + Clone,
) -> std::collections::HashMap<u64, u64> {
    let turns = rows.filter(|r| r.kind == RowKind::Turn);
    let parents: std::collections::HashSet<u64> =
        turns.clone().filter_map(|r| r.spawned_by).collect();
    if parents.is_empty() {
        return Default::default();
    }
    let mut last_turn = std::collections::HashMap::new();
    let mut parent_turn = std::collections::HashMap::new();
    for row in turns.clone() {
        let (Some(conversation), Some(turn)) = (row.conversation, row.turn) else {
            continue;
        };
        let last = last_turn.entry(conversation).or_insert(turn);
        *last = (*last).max(turn);
        if parents.contains(&row.id) {
            parent_turn.insert(row.id, (conversation, turn));
        }
    }
    let went_on = |parent: &u64| {
        parent_turn
            .get(parent)
            .is_some_and(|(conversation, turn)| last_turn[conversation] > *turn)
    };
    turns
        .filter_map(|r| Some((r.id, r.spawned_by.filter(went_on)?)))
        .collect()
}

/// A row and how its losses are priced: by their own `ms` (`per_token` `None`), or at its
/// shared row's rate. Two words, the row one step away, so a report's passes copy them freely.
#[derive(Debug, Clone, Copy)]
pub struct Rated<'a> {
    row: &'a Row,
    per_token: Option<&'a Option<Measured<f64>>>,
}

impl<'a> Rated<'a> {
    pub fn row(self) -> &'a Row {
        self.row
    }

    pub fn ms(self, loss: &Loss) -> Option<Measured<f64>> {
        match self.per_token {
            None => loss.ms,
            Some(rate) => rate.map(|rate| Measured {
                value: f64::from(loss.tokens) * rate.value,
                source: rate.source,
            }),
        }
    }

    /// The client-side loss and its milliseconds.
    pub fn client_loss(self) -> Option<(&'a Loss, Option<Measured<f64>>)> {
        let loss = self.row.lost_client.as_ref()?;
        Some((loss, self.ms(loss)))
    }

    /// The external loss and its milliseconds.
    pub fn external_loss(self) -> Option<(&'a Loss, Option<Measured<f64>>)> {
        let loss = self.row.lost_external.as_ref()?;
        Some((loss, self.ms(loss)))
    }

    /// Both losses, client first, with their milliseconds.
    pub fn losses(self) -> impl Iterator<Item = (&'a Loss, Option<Measured<f64>>)> {
        [self.client_loss(), self.external_loss()]
            .into_iter()
            .flatten()
    }
}

/// Already priced: a filtered selection of rows goes through the report's own totals (the
/// live view's filtered header).
impl Priced for Rated<'_> {
    fn rated(&self) -> Rated<'_> {
        *self
    }
}

impl std::ops::Deref for Rated<'_> {
    type Target = Row;
    fn deref(&self) -> &Row {
        self.row()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Composition {
    pub system: Measured<u32>,
    pub tools: Measured<u32>,
    pub history: Measured<u32>,
    pub new_content: Measured<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolUsage {
    pub client: String,
    pub name: String,
    pub schema_tokens: u32,
    pub offered: u32,
    pub called: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Client {
    pub client: String,
    pub user_agent: Option<String>,
    /// prefixscope: the agent harness its requests name (`Claude Code 2.1.197`, `aider`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness: Option<String>,
    pub requests: u32,
    pub conversations: u32,
    pub tools: Vec<String>,
}

impl BreakCause {
    pub fn name(self) -> &'static str {
        match self {
            BreakCause::ToolsChanged => "tools_changed",
            BreakCause::SystemChanged => "system_changed",
            BreakCause::HistoryRewritten => "history_rewritten",
        }
    }
}
