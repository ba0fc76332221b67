//! The shared steps of the analysis: how a request links to an earlier one, where and why its
//! prefix broke, and what that cost.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::normalize::exchange::{Exchange, Msg};
use crate::normalize::measured::{Measured, Source};

use super::row::{
    BreakCause, BreakLocation, BreakTexts, Cause, Composition, EvictedBy, Loss, Row, RowKind, Shape,
};

const SIDE_CALL_MAX_MESSAGES: usize = 3;
const SUMMARISE_USER_SHARE: f64 = 0.9;
const SUMMARISE_MIN_CHARS: u64 = 20_000;
const STRUCTURED_MAX_TOKENS: u32 = 32;
pub(super) const STATELESS_MIN_REQUESTS: usize = 3;
const COMPACTION_RATIO: f64 = 0.7;
const CAUSE_GAP_POINTS: f64 = 20.0;
const COLD_SHARE: f64 = 0.05;
const DIGEST_EDGE_CHARS: u32 = 256;
const SERVER_EMPTY_BELOW: f64 = 128.0;
const HEAD_MARGIN: f64 = 1.15;
pub(super) const BULK_MIN_EVALUATED: u32 = 50;
pub(super) const UNKNOWN_CLIENT: &str = "unknown";
const SNIPPET_CHARS: usize = 60;
const SNIPPET_CONTEXT: usize = 20;
/// A client may trim or pad the reply it re-sends as history (aider wraps it in newlines).
const REPLY_CHARS_SLACK: u32 = 4;
/// A moved message counts as an edit of one the server had when at least half of it is the
/// other's unchanged head and tail.
const EDITED_MIN_SHARE: f64 = 0.5;

pub(super) struct Weights {
    messages: Vec<f64>,
    pub(super) tools: Vec<f64>,
    tool_block: f64,
    total: f64,
    source: Source,
}

#[derive(Debug, Clone)]
pub(super) struct Tip {
    pub(super) row: usize,
    pub(super) conversation: u32,
    pub(super) turns: u32,
}

pub(super) enum Choice {
    Continue(usize),
    Fresh(Option<usize>),
}

pub(super) struct Link {
    pub(super) location: Option<BreakLocation>,
    prefix_len: usize,
    prefix_tokens: f64,
    break_cause: Option<BreakCause>,
    compaction: bool,
    /// What the server had processed of this prompt before, by the previous request: llmp's
    /// `already_sent`, plus messages it sent at another position (moved) and the previous reply
    /// re-sent as history. Every such token the server re-evaluates is the break's cost; only the
    /// rest is new content (llmp's rule counted moved messages and the reply as new).
    seen_before: f64,
    /// Messages were moved or inserted at the break: the message there was sent elsewhere
    /// before, or the one that was there is sent later.
    reordered: bool,
    /// Messages were dropped at the break: the one that was there is sent no more, and the
    /// one there now was sent after it (Claude Code's --continue leaves out its resume notes).
    dropped: bool,
    /// prefixscope: the break's named cause (`client_cause`).
    named: Option<&'static str>,
    /// prefixscope: on an appended turn, what the server's slot held beyond the estimated
    /// prefix: the previous prompt by the server's own count, and the previous reply (the slot
    /// keeps the tokens it generated, all but the last, which it sampled but never evaluated).
    /// An eviction loses it too, where llmp charges only the estimated previous prompt.
    reply_held: f64,
    /// Milliseconds from the linked request's end to this one's start: how long its prefix
    /// sat unused (a hosted cache's lifetime counts from the last use).
    idle_ms: i64,
    /// On a hosted API, what its rules allow of this link.
    hosted: Option<HostedLink>,
}

/// A link on a hosted API: the provider's rules for the model, and what the two requests' own
/// numbers say of where their cache breakpoints fell.
struct HostedLink {
    rules: Option<crate::provider::Rules>,
    /// Anthropic: the prefix the provider can serve ends at the earlier request's last
    /// breakpoint (what it wrote) and at this one's (where it reads): each request's cache
    /// read plus cache write, in its own numbers.
    window: Option<f64>,
    /// The provider caches only at a `cache_control` breakpoint, and one of the two requests
    /// had none: nothing was written, or nothing could be read.
    no_breakpoint: bool,
    /// The longest lifetime the provider gives a prefix here, in seconds.
    ttl_s: Option<u32>,
}

impl HostedLink {
    /// What the provider can serve of `reusable` tokens on a prompt of `prompt`: up to the
    /// breakpoints (unless a missing one is the finding: then what it would have served),
    /// past the minimum, in its steps.
    fn servable(&self, reusable: f64, prompt: u32) -> f64 {
        let reusable = match self.window {
            Some(window) if !self.no_breakpoint => reusable.min(window),
            _ => reusable,
        };
        self.rules
            .map_or(reusable, |rules| rules.cacheable(reusable, prompt))
    }

    /// The cause of a turn the provider served less of than it could: a rule (too short, no
    /// breakpoint, expired) or the provider's own miss, never another conversation, model or
    /// a server that emptied its cache. `unruled` is the shortfall against the prefix alone
    /// (percentage points of the prompt), which a prompt below the minimum shows.
    fn cause(
        &self,
        cause: Option<Cause>,
        idle_ms: i64,
        prompt: u32,
        unruled: f64,
    ) -> (Option<Cause>, Option<crate::provider::Uncached>) {
        use crate::provider::Uncached;
        if let Some(rules) = self.rules
            && prompt < rules.minimum
            && unruled > CAUSE_GAP_POINTS
        {
            let minimum = rules.minimum;
            return (
                Some(Cause::NotCacheable),
                Some(Uncached::BelowMinimum { minimum }),
            );
        }
        if !cause.is_some_and(Cause::slot_or_server) {
            return (cause, None);
        }
        if self.no_breakpoint {
            return (Some(Cause::NotCacheable), Some(Uncached::NoBreakpoint));
        }
        if let Some(ttl_s) = self.ttl_s
            && idle_ms > i64::from(ttl_s) * 1_000
        {
            let gap_s = u64::try_from(idle_ms / 1_000).unwrap_or(0);
            return (
                Some(Cause::CacheExpired),
                Some(Uncached::Expired { gap_s, ttl_s }),
            );
        }
        (Some(Cause::ProviderMiss), Some(Uncached::ProviderMiss))
    }
}

fn hosted_link(prev: &Exchange, cur: &Exchange) -> Option<HostedLink> {
    if !cur.provider.hosted() {
        return None;
    }
    let rules = crate::provider::rules(cur.provider, &cur.model);
    let needs_breakpoint = rules.is_some_and(|r| r.needs_breakpoint);
    let marks = [prev.params.cache_marks, cur.params.cache_marks];
    let no_breakpoint = needs_breakpoint && marks.iter().flatten().any(|m| m.breakpoints == 0);
    let breakpoint_end = |x: &Exchange| match (x.counts.reused_tokens, x.counts.cache_written) {
        (Some(read), Some(written)) => Some(f64::from(read.value) + f64::from(written.value)),
        _ => None,
    };
    let window = match (needs_breakpoint, breakpoint_end(prev), breakpoint_end(cur)) {
        (true, Some(a), Some(b)) => Some(a.min(b)),
        _ => None,
    };
    let asked = marks.iter().flatten().map(|m| m.ttl_s).max();
    let ttl_s = rules
        .and_then(|r| r.ttl_s)
        .map(|ttl| asked.map_or(ttl, |asked| asked.max(ttl)));
    Some(HostedLink {
        rules,
        window,
        no_breakpoint,
        ttl_s,
    })
}

/// A row before linking: what the exchange alone says.
pub(super) fn base_row(
    x: &Exchange,
    w: &Weights,
    kind: RowKind,
    shape: Option<Shape>,
    session: u32,
) -> Row {
    Row {
        id: x.id,
        api: x.api,
        model: x.model.clone(),
        client: String::new(),
        t_start_ms: x.t_start_ms,
        kind,
        side_call_shape: shape,
        session,
        conversation: None,
        turn: None,
        counts: x.counts,
        composition: composition(x, w, 0),
        linked_to: None,
        new_conversation: false,
        prefix_tokens: None,
        break_cause: None,
        compaction: false,
        predicted_reuse: None,
        observed_reuse: None,
        cause: None,
        lost_client: None,
        lost_external: None,
        side_calls_between: Vec::new(),
        other_conversations_between: Vec::new(),
        other_domains_between: Vec::new(),
        loss_measured: false,
        break_location: None,
        evicted_by: None,
        spawned_by: None,
        client_cause: None,
        engine_cause: None,
        engine_base: None,
        uncached: None,
        provider: x.provider,
    }
}

/// Sorts what ran between the linked turn `prev` and `cur` into the row's lists; returns the
/// kind and id of the last same-model request among them.
pub(super) fn between<'a>(
    at: impl Fn(usize) -> &'a Exchange,
    kinds: &[(RowKind, Option<Shape>)],
    prev: usize,
    cur: usize,
    row: &mut Row,
) -> Option<(Cause, u64)> {
    let mut latest = None;
    let model = &at(cur).model;
    for (i, (kind, _)) in kinds.iter().enumerate().take(cur).skip(prev + 1) {
        let id = at(i).id;
        if &at(i).model != model {
            row.other_domains_between.push(id);
        } else if *kind == RowKind::SideCall {
            row.side_calls_between.push(id);
            latest = Some((Cause::SideCall, id));
        } else {
            row.other_conversations_between.push(id);
            latest = Some((Cause::OtherConversation, id));
        }
    }
    latest
}

/// prefixscope's additions to a linked row: where it broke, and who most likely evicted it.
pub(super) fn finish_link(row: &mut Row, link: Link, latest: Option<(Cause, u64)>) {
    row.break_location = link.location.map(Box::new);
    row.evicted_by = match row.cause {
        Some(Cause::SideCall) => latest.map(|(_, id)| (id, "side_call")),
        Some(Cause::OtherConversation) => latest.map(|(_, id)| (id, "other_conversation")),
        Some(Cause::OtherModel) => row
            .other_domains_between
            .last()
            .map(|&id| (id, "other_model")),
        _ => None,
    }
    .map(|(row, kind)| EvictedBy {
        row,
        client: String::new(),
        kind: kind.into(),
    });
}

impl Weights {
    /// Each tool's schema tokens, in the exchange's order.
    pub(super) fn tools(&self) -> &[f64] {
        &self.tools
    }
}

/// How far a hosted API's count may scale the request's estimated text (`weights`), when it
/// exceeds the text by more than a template adds.
const HOSTED_MAX_SCALE: f64 = 2.0;
const HOSTED_TEMPLATE_TOKENS: f64 = 256.0;

pub(super) fn weights(x: &Exchange) -> Weights {
    let mut exact = true;
    let mut weight = |tokens: Option<Measured<u32>>, chars: u32| match tokens {
        Some(tokens) => f64::from(tokens.value),
        None => {
            exact = false;
            f64::from(chars.div_ceil(4))
        }
    };
    let mut messages: Vec<f64> = x
        .messages
        .iter()
        .map(|m| weight(m.tokens, m.chars))
        .collect();
    let mut tools: Vec<f64> = x.tools.iter().map(|t| weight(t.tokens, t.chars)).collect();
    let raw_total = messages.iter().chain(&tools).fold(0.0, |sum, w| sum + w);
    // Parts whose tokens no character shows: media, and the provider's own tools (their
    // instructions are the provider's, their definition a name).
    let media: u32 = x.messages.iter().map(|m| m.media).sum();
    let provided = x.tools.iter().filter(|t| t.provided).count() as u32;
    // The provider's tools' instructions: in the tool block, not in any tool's schema (no
    // client can shorten them).
    let mut instructions = 0.0;
    if let Some(prompt) = x.counts.prompt_tokens
        && raw_total > 0.0
    {
        let prompt = f64::from(prompt.value);
        if media + provided > 0 && prompt > raw_total {
            // What the text does not account for is theirs: each part's share goes where it
            // is (the message that holds it, the tool block), never to the system prompt.
            let per_part = (prompt - raw_total) / f64::from(media + provided);
            for (w, m) in messages.iter_mut().zip(&x.messages) {
                *w += per_part * f64::from(m.media);
            }
            instructions = per_part * f64::from(provided);
        } else {
            // A hosted provider adds prompts of its own no request shows (MCP servers' tools,
            // citations, a server tool's instructions): past twice the text, the count is
            // theirs, left unattributed rather than charged to the system prompt and tools.
            let scale = prompt / raw_total;
            // A few hundred tokens past the text are the template's (roles, separators).
            let scale = if x.provider.hosted() && prompt - raw_total > HOSTED_TEMPLATE_TOKENS {
                scale.min(HOSTED_MAX_SCALE)
            } else {
                scale
            };
            for w in messages.iter_mut().chain(tools.iter_mut()) {
                *w *= scale;
            }
        }
    }
    let tool_block = tools.iter().fold(instructions, |sum, w| sum + w);
    let total = messages.iter().fold(tool_block, |sum, w| sum + w);
    let source = if exact && !(messages.is_empty() && tools.is_empty()) {
        Source::Tokenizer
    } else {
        Source::Estimate
    };
    Weights {
        messages,
        tools,
        tool_block,
        total,
        source,
    }
}

/// Requests from one agent: the same user-agent and, where the harness sends one, the same
/// session id.
pub(super) fn same_agent(a: &Exchange, b: &Exchange) -> bool {
    a.user_agent == b.user_agent && a.session_id == b.session_id
}

/// On a hosted API a minute's pause does not end a conversation: the pause that outlives the
/// provider's usual 5-minute cache is what the analysis must name (`Uncached::Expired`). Its
/// sessions break after half an hour: six lifetimes of the default cache, and short of the
/// hour-long ones, which a longer pause may still find warm (a new conversation that reuses
/// a prefix, never a loss claimed that did not happen).
pub(super) const HOSTED_SESSION_GAP_MS: u64 = 30 * 60_000;

/// The pause after which `x` starts a new session of its model.
pub(super) fn session_gap_ms(x: &Exchange, configured: u64) -> i64 {
    let gap = if x.provider.hosted() {
        configured.max(HOSTED_SESSION_GAP_MS)
    } else {
        configured
    };
    i64::try_from(gap).unwrap_or(i64::MAX)
}

/// `a` and `b` send the same system prompt and tools: of two requests a third continues
/// alike, the one it more likely goes on from (another agent sends the same first message
/// under its own system prompt).
pub(super) fn same_context(a: &Exchange, b: &Exchange) -> bool {
    system_hash(a) == system_hash(b) && a.tools_hash == b.tools_hash
}

/// `b` is a compaction of `a`: it keeps `a`'s opening and is much shorter (characters, as
/// the break's `compaction` flag weighs tokens). Sharing only the opening, that is what makes
/// it the same conversation rather than another run that opens alike.
pub(super) fn compacts(a: &Exchange, b: &Exchange) -> bool {
    let chars = |x: &Exchange| x.messages.iter().map(|m| f64::from(m.chars)).sum::<f64>();
    chars(b) < COMPACTION_RATIO * chars(a)
}

/// `a` and `b` send the same messages, one for one.
pub(super) fn same_messages(a: &Exchange, b: &Exchange) -> bool {
    a.messages.len() == b.messages.len()
        && a.messages
            .iter()
            .zip(&b.messages)
            .all(|(x, y)| x.identity == y.identity)
}

/// `b`, which `continues` `a`, goes on with `a`'s conversation: it sends `a`'s messages and
/// then a reply (`a`'s, as the assistant's), or it sends them again (a retry). Not when `a`
/// opened its conversation (`first`) and got its reply: the same first request again is
/// another run that opens alike (a test suite, a benchmark), a conversation of its own that
/// shares the prefix. Nor when the next message is not the assistant's: another agent handed
/// `a`'s reply as its user's message.
pub(super) fn carries_on(a: &Exchange, b: &Exchange, first: bool) -> bool {
    let replied = a.output.content_chars > 0 || !a.output.tool_calls.is_empty();
    match b.messages.get(a.messages.len()) {
        Some(next) => next.role == "assistant",
        None => !(first && replied),
    }
}

pub(super) fn continues(a: &Exchange, b: &Exchange) -> bool {
    let (am, bm) = (&a.messages, &b.messages);
    if am.is_empty() || am.len() > bm.len() {
        return false;
    }
    let last = am.len() - 1;
    am.iter().zip(bm).enumerate().all(|(i, (x, y))| {
        x.role == y.role
            && (x.identity == y.identity
                || x.role == "system"
                || (i == last && x.role == "assistant"))
    })
}

pub(super) fn system_hash(x: &Exchange) -> Option<&str> {
    x.messages
        .iter()
        .find(|m| m.role == "system")
        .map(|m| m.identity.as_str())
}

pub(super) fn summarise(x: &Exchange) -> bool {
    if !x.tools.is_empty() || x.messages.len() > SIDE_CALL_MAX_MESSAGES {
        return false;
    }
    let total: u64 = x.messages.iter().map(|m| u64::from(m.chars)).sum();
    let user: u64 = x
        .messages
        .iter()
        .filter(|m| m.role == "user")
        .map(|m| u64::from(m.chars))
        .sum();
    user > SUMMARISE_MIN_CHARS && (user as f64) > SUMMARISE_USER_SHARE * total as f64
}

pub(super) fn structured(x: &Exchange) -> bool {
    x.tools.is_empty()
        && x.messages.len() <= SIDE_CALL_MAX_MESSAGES
        && (x.params.grammar
            || x.params.response_format
            || x.params
                .max_tokens
                .is_some_and(|n| n > 0 && n <= STRUCTURED_MAX_TOKENS))
}

pub(super) fn link(
    prev: &Exchange,
    pw: &Weights,
    cur: &Exchange,
    cw: &Weights,
    fresh: bool,
) -> Link {
    if fresh {
        let k = prev
            .messages
            .iter()
            .zip(&cur.messages)
            .take_while(|(a, b)| a.identity == b.identity)
            .count();
        let prefix_tokens = match (k, prev.tools_hash == cur.tools_hash) {
            (0, _) => 0.0,
            (_, same_tools) => cw.messages[..k]
                .iter()
                .fold(if same_tools { cw.tool_block } else { 0.0 }, |sum, w| {
                    sum + w
                }),
        };
        return Link {
            location: None,
            prefix_len: k,
            prefix_tokens,
            break_cause: None,
            compaction: false,
            seen_before: prefix_tokens,
            reordered: false,
            dropped: false,
            named: unseen_cause(prev, cur, k),
            reply_held: 0.0,
            idle_ms: cur.t_start_ms.saturating_sub(prev.t_end_ms),
            hosted: hosted_link(prev, cur),
        };
    }
    if prev.tools_hash != cur.tools_hash {
        let names = |x: &Exchange| {
            x.tools
                .iter()
                .map(|t| t.name.clone())
                .collect::<BTreeSet<String>>()
        };
        let (before, after) = (names(prev), names(cur));
        return Link {
            location: Some(BreakLocation {
                message: None,
                role: None,
                char_offset: None,
                before: None,
                after: None,
                head_matched: None,
                tail_matched: None,
                tools_added: after.difference(&before).cloned().collect(),
                tools_removed: before.difference(&after).cloned().collect(),
                texts: None,
            }),
            prefix_len: 0,
            prefix_tokens: 0.0,
            break_cause: Some(BreakCause::ToolsChanged),
            compaction: false,
            seen_before: already_sent(prev, cur, cw, false) + moved_or_replied(prev, cur, cw),
            reordered: false,
            dropped: false,
            named: Some(super::client_cause::of_tools_change(
                &prev.tools,
                &cur.tools,
            )),
            reply_held: 0.0,
            idle_ms: cur.t_start_ms.saturating_sub(prev.t_end_ms),
            hosted: hosted_link(prev, cur),
        };
    }
    let overlap = prev.messages.len().min(cur.messages.len());
    let k = (0..overlap)
        .take_while(|&i| prev.messages[i].identity == cur.messages[i].identity)
        .count();
    let prefix_tokens = if k == 0 {
        0.0
    } else {
        cw.messages[..k]
            .iter()
            .fold(cw.tool_block, |sum, w| sum + w)
    };
    let break_cause = if k < overlap {
        if prev.messages[k].role == "system" || cur.messages[k].role == "system" {
            Some(BreakCause::SystemChanged)
        } else {
            Some(BreakCause::HistoryRewritten)
        }
    } else if cur.messages.len() < prev.messages.len() {
        Some(BreakCause::HistoryRewritten)
    } else {
        None
    };
    let compaction =
        break_cause == Some(BreakCause::HistoryRewritten) && cw.total < COMPACTION_RATIO * pw.total;
    let already_sent = if break_cause.is_some() && !compaction {
        already_sent(prev, cur, cw, true)
    } else {
        prefix_tokens
    };
    let (seen_before, reordered, dropped) = if break_cause.is_some() && !compaction {
        // The message at the break was sent elsewhere before, or the one that was there is
        // still sent, later: messages were moved, inserted or dropped, not edited.
        let later = |m: Option<&Arc<Msg>>, xs: &[Arc<Msg>]| {
            m.is_some_and(|m| xs.iter().skip(k + 1).any(|x| x.identity == m.identity))
        };
        let was_later = later(cur.messages.get(k), &prev.messages);
        let is_later = later(prev.messages.get(k), &cur.messages);
        let rewritten = break_cause == Some(BreakCause::HistoryRewritten);
        // What was there is gone, and what followed it comes up: dropped, not moved.
        let dropped = rewritten && was_later && !is_later;
        (
            already_sent + moved_or_replied(prev, cur, cw),
            rewritten && (was_later || is_later) && !dropped,
            dropped,
        )
    } else {
        (prefix_tokens, false, false)
    };
    let location = break_cause.map(|_| locate(prev, cur, k));
    let named = match (break_cause, &location) {
        (Some(BreakCause::SystemChanged), Some(l)) => super::client_cause::of_system_change(
            l.before.as_deref().unwrap_or(""),
            l.after.as_deref().unwrap_or(""),
        ),
        _ => None,
    }
    .or_else(|| unseen_cause(prev, cur, k));
    // What the slot held of `prev` that this turn could reuse: on an appended turn, the server's
    // own count of `prev`'s prompt (estimated weights move with the template's tokens, the
    // count does not) and its reply, below.
    let prompt_held = match (break_cause, prev.counts.prompt_tokens) {
        (None, Some(prompt)) if k == prev.messages.len() && k > 0 => {
            f64::from(prompt.value) - prefix_tokens
        }
        _ => 0.0,
    };
    let reply_held = match (break_cause, cur.messages.get(k), cw.messages.get(k)) {
        // A hosted provider caches prompts, never the reply it generated.
        _ if prev.provider.hosted() => 0.0,
        // A reply that began with reasoning: the slot holds the reasoning first, which the
        // next turn does not send back, so nothing of the reply is reusable (as the ceiling).
        (None, Some(m), Some(&weight))
            if k == prev.messages.len()
                && prev.output.reasoning_chars == 0
                && is_reply(prev, m) =>
        {
            // The server's count of what it generated, where it gave one: a weight from
            // characters moves with the text's ratio.
            match prev.counts.completion_tokens {
                Some(generated) => f64::from(generated.value.saturating_sub(1)),
                None => weight,
            }
        }
        _ => 0.0,
    };
    Link {
        location,
        prefix_len: k,
        prefix_tokens,
        break_cause,
        compaction,
        seen_before,
        reordered,
        dropped,
        named,
        reply_held: prompt_held + reply_held,
        idle_ms: cur.t_start_ms.saturating_sub(prev.t_end_ms),
        hosted: hosted_link(prev, cur),
    }
}

/// Whether `m` is `prev`'s reply re-sent as history: the same tool call ids, or no calls and
/// the length of its text, give or take padding.
fn is_reply(prev: &Exchange, m: &Msg) -> bool {
    let output = &prev.output;
    m.role == "assistant"
        && if output.tool_calls.is_empty() {
            m.tool_calls.is_empty()
                && output.content_chars > 0
                && m.chars.abs_diff(output.content_chars) <= REPLY_CHARS_SLACK
        } else {
            output.tool_calls.iter().all(|c| c.id.is_some())
                && m.tool_calls
                    .iter()
                    .map(|c| c.id.as_deref())
                    .eq(output.tool_calls.iter().map(|c| c.id.as_deref()))
        }
}

/// prefixscope: what changed in the first `k` messages that llmp's identities cannot see: the
/// reasoning sent back with them, or how the server's template renders them.
fn unseen_cause(prev: &Exchange, cur: &Exchange, k: usize) -> Option<&'static str> {
    use super::client_cause::{
        REASONING_CHANGED, TEMPLATE_RERENDERED, reasoning_changed, template_rerendered,
    };
    if reasoning_changed(&prev.messages, &cur.messages, k) {
        Some(REASONING_CHANGED)
    } else if template_rerendered(&prev.messages, &cur.messages, k) {
        Some(TEMPLATE_RERENDERED)
    } else {
        None
    }
}

/// The weight of `cur`'s messages the server processed for `prev` that `already_sent` leaves
/// out: a message of `prev` at another position (each of `prev`'s messages counted once), the
/// unchanged share of one edited and moved (aider re-sends its last question without the
/// reminder it appended), and `prev`'s reply re-sent as an assistant message (same tool call
/// ids, or no calls and the length of its text, give or take padding).
fn moved_or_replied(prev: &Exchange, cur: &Exchange, cw: &Weights) -> f64 {
    let prev_ids: BTreeSet<&str> = prev.messages.iter().map(|m| m.identity.as_str()).collect();
    let cur_ids: BTreeSet<&str> = cur.messages.iter().map(|m| m.identity.as_str()).collect();
    // Positions `already_sent` counted: equal, or edited in place (same role, neither side
    // found elsewhere).
    let counted = |i: usize| match (prev.messages.get(i), cur.messages.get(i)) {
        (Some(p), Some(c)) => {
            p.identity == c.identity
                || (p.role == c.role
                    && !prev_ids.contains(c.identity.as_str())
                    && !cur_ids.contains(p.identity.as_str()))
        }
        _ => false,
    };
    let mut sources: Vec<Option<&Msg>> = prev
        .messages
        .iter()
        .enumerate()
        .map(|(i, p)| (!counted(i)).then_some(&**p))
        .collect();
    let mut left: Vec<(&Msg, f64)> = Vec::new();
    let mut weight = 0.0;
    for (i, (m, &w)) in cur.messages.iter().zip(&cw.messages).enumerate() {
        if counted(i) {
            continue;
        }
        match sources
            .iter_mut()
            .find(|s| s.is_some_and(|p| p.identity == m.identity))
        {
            Some(source) => {
                *source = None;
                weight += w;
            }
            None => left.push((m, w)),
        }
    }
    let mut reply_found = false;
    for (m, w) in left {
        if !reply_found && is_reply(prev, m) {
            reply_found = true;
            weight += w;
            continue;
        }
        let best = sources
            .iter_mut()
            .filter(|s| s.is_some_and(|p| p.role == m.role))
            .map(|s| {
                let share = s.map_or(0.0, |p| unchanged_share(p, m));
                (share, s)
            })
            .max_by(|a, b| a.0.total_cmp(&b.0));
        if let Some((share, source)) = best
            && share >= EDITED_MIN_SHARE
        {
            *source = None;
            weight += w * share;
        }
    }
    weight
}

/// The first differing message `k` of `cur` against `prev`, and inside it the first differing
/// character with a snippet of each side.
fn locate(prev: &Exchange, cur: &Exchange, k: usize) -> BreakLocation {
    let (a, b) = (prev.messages.get(k), cur.messages.get(k));
    // Where the user looks: an Anthropic request's `system` is not one of its `messages`, so
    // a break there has no message index and the others count from after it.
    let system_apart = cur.api == crate::normalize::Api::AnthropicMessages
        && cur.messages.first().is_some_and(|m| m.role == "system");
    let message = match (system_apart, k) {
        (true, 0) => None,
        (true, k) => Some(k as u32 - 1),
        (false, k) => Some(k as u32),
    };
    let mut location = BreakLocation {
        message,
        role: b.or(a).map(|m| m.role.clone()),
        char_offset: None,
        before: None,
        after: None,
        head_matched: None,
        tail_matched: None,
        tools_added: Vec::new(),
        tools_removed: Vec::new(),
        texts: None,
    };
    let (Some(a), Some(b)) = (a, b) else {
        return location;
    };
    match (&a.text, &b.text) {
        (Some(x), Some(y)) => {
            let (offset, tail, before, after) = snippets(x, y);
            location.char_offset = Some(offset as u32);
            location.before = Some(before);
            location.after = Some(after);
            location.texts = Some(BreakTexts::of(x, y, offset, tail));
        }
        _ => {
            location.head_matched = Some(a.head == b.head);
            location.tail_matched = Some(a.tail == b.tail);
        }
    }
    location
}

/// The first differing character, the characters both texts end with after the change, and up
/// to 60 characters of each text around the change: a little context before it, then the
/// differing span.
fn snippets(before: &str, after: &str) -> (usize, usize, String, String) {
    let a: Vec<char> = before.chars().collect();
    let b: Vec<char> = after.chars().collect();
    let head = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let shortest = a.len().min(b.len());
    let tail = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take(shortest - head)
        .take_while(|(x, y)| x == y)
        .count();
    let start = head.saturating_sub(SNIPPET_CONTEXT);
    let cut = |text: &[char], end_of_change: usize| -> String {
        let end = (end_of_change + SNIPPET_CONTEXT)
            .min(text.len())
            .min(start + SNIPPET_CHARS);
        text[start.min(end)..end].iter().collect()
    };
    (head, tail, cut(&a, a.len() - tail), cut(&b, b.len() - tail))
}

fn already_sent(prev: &Exchange, cur: &Exchange, cw: &Weights, same_tools: bool) -> f64 {
    let prev_hashes: BTreeSet<&str> = prev.messages.iter().map(|m| m.identity.as_str()).collect();
    let cur_hashes: BTreeSet<&str> = cur.messages.iter().map(|m| m.identity.as_str()).collect();
    let tools = if same_tools { cw.tool_block } else { 0.0 };
    let messages: f64 = prev
        .messages
        .iter()
        .zip(&cur.messages)
        .zip(&cw.messages)
        .map(|((p, c), &weight)| {
            if p.identity == c.identity {
                weight
            } else if p.role == c.role
                && !prev_hashes.contains(c.identity.as_str())
                && !cur_hashes.contains(p.identity.as_str())
            {
                weight * unchanged_share(p, c)
            } else {
                0.0
            }
        })
        .fold(0.0, |sum, w| sum + w);
    tools + messages
}

fn unchanged_share(prev: &Msg, cur: &Msg) -> f64 {
    if cur.chars == 0 {
        return 0.0;
    }
    let unchanged = match (&prev.text, &cur.text) {
        (Some(a), Some(b)) => {
            let a: Vec<char> = a.chars().collect();
            let b: Vec<char> = b.chars().collect();
            let shortest = a.len().min(b.len());
            let head = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            let tail = a
                .iter()
                .rev()
                .zip(b.iter().rev())
                .take(shortest - head)
                .take_while(|(x, y)| x == y)
                .count();
            (head + tail) as u32
        }
        _ => {
            let edge = DIGEST_EDGE_CHARS.min(cur.chars);
            let head = if prev.head == cur.head { edge } else { 0 };
            let tail = if prev.tail == cur.tail { edge } else { 0 };
            head + tail
        }
    };
    f64::from(unchanged.min(cur.chars)) / f64::from(cur.chars)
}

pub(super) fn apply_link(
    row: &mut Row,
    x: &Exchange,
    w: &Weights,
    link: &Link,
    latest: Option<Cause>,
) {
    row.prefix_tokens = Some(round(link.prefix_tokens));
    row.break_cause = link.break_cause;
    row.client_cause = link.named.map(str::to_string);
    row.compaction = link.compaction;
    row.composition = composition(x, w, link.prefix_len);

    let counts = x.counts;
    if let (Some(prompt), Some(reused)) = (counts.prompt_tokens, counts.reused_tokens)
        && prompt.value > 0
    {
        // On a hosted API, what its rules let it serve of the prefix.
        let expected = link.hosted.as_ref().map_or(link.prefix_tokens, |h| {
            h.servable(link.prefix_tokens, prompt.value)
        });
        let predicted = expected / f64::from(prompt.value);
        let observed = f64::from(reused.value) / f64::from(prompt.value);
        row.predicted_reuse = Some(predicted);
        row.observed_reuse = Some(observed);
        row.cause = cause(
            (predicted - observed) * 100.0,
            observed <= COLD_SHARE,
            link.break_cause.is_some(),
            latest,
            !row.other_domains_between.is_empty(),
        );
        if let Some(hosted) = &link.hosted {
            let unruled = (link.prefix_tokens / f64::from(prompt.value) - observed) * 100.0;
            (row.cause, row.uncached) =
                hosted.cause(row.cause, link.idle_ms, prompt.value, unruled);
        }
    }

    // A hosted API's counts measure its tokens without any timing (its time is then not
    // measured); a local server's loss needs its prefill time too (llmp's rule).
    let timed = counts.prefill_ms.is_some() || link.hosted.is_some();
    let (Some(_), Some(evaluated), true, Some(reused)) = (
        counts.prompt_tokens,
        counts.evaluated_tokens,
        timed,
        counts.reused_tokens,
    ) else {
        return;
    };
    row.loss_measured = true;
    let charged_break = link.break_cause.filter(|_| !link.compaction);
    let reused = f64::from(reused.value);
    let evaluated_tokens = f64::from(evaluated.value);
    let reusable = match charged_break {
        Some(_) => link.prefix_tokens.max(link.seen_before),
        None => link.prefix_tokens + link.reply_held,
    };
    let reusable = match (&link.hosted, counts.prompt_tokens) {
        (Some(hosted), Some(prompt)) => hosted.servable(reusable, prompt.value),
        _ => reusable,
    };
    let lost = (reusable - reused).clamp(0.0, evaluated_tokens);
    // A loss has one cause. Where others had taken the slot before this turn came (a side-call,
    // another conversation or model), the break cost nothing more: the server had nothing of
    // the turn before to reuse. Every token is the eviction's; the break stays on the row, a
    // harmless fact. (llmp splits it: the break's part past its point.)
    let slot_taken = matches!(
        row.cause,
        Some(Cause::SideCall | Cause::OtherConversation | Cause::OtherModel)
    );
    let client = match (charged_break, row.cause) {
        (Some(_), _) if slot_taken => 0.0,
        // The cache was warm (the server reused about what the prefix predicted, or more): every
        // token it had and re-evaluated is the break's, including what the estimated prefix got
        // wrong (a template that drops the tool schemas makes the estimate too long).
        (Some(_), None | Some(Cause::Structural)) => lost,
        (Some(_), _) => lost.min((reusable - link.prefix_tokens.max(reused)).max(0.0)),
        (None, _) => 0.0,
    };
    // A hosted provider's rule takes what no break explains: the client's where it is a
    // missing breakpoint, alone on the row or beside the break's part.
    let ruled = row.uncached.as_ref().and_then(|u| u.loss_cause());
    let client = match (ruled, charged_break) {
        (Some("no_cache_breakpoint"), None) => lost,
        _ => client,
    };
    let external = match row.cause {
        Some(cause) if cause.slot_or_server() => lost - client,
        Some(Cause::CacheExpired | Cause::ProviderMiss) => lost - client,
        Some(Cause::NotCacheable) if charged_break.is_some() => lost - client,
        _ => 0.0,
    };

    // Milliseconds are priced once every row is known (`price`): the per-token rate uses the
    // model's bulk rate over the whole recording.
    let loss = |cause: &str, tokens: f64| {
        let tokens = round(tokens);
        (tokens > 0).then(|| Loss {
            cause: cause.to_string(),
            tokens,
            ms: None,
        })
    };
    if let Some(cause) = charged_break {
        let name = if link.dropped {
            "history_dropped"
        } else if link.reordered {
            "history_reordered"
        } else {
            cause.name()
        };
        row.lost_client = loss(name, client);
    } else if let Some(cause @ "no_cache_breakpoint") = ruled {
        row.lost_client = loss(cause, client);
    }
    let external_cause = match row.cause {
        Some(Cause::NotCacheable | Cause::CacheExpired | Cause::ProviderMiss) => ruled,
        Some(Cause::SideCall) => Some("side_call"),
        Some(Cause::OtherConversation) => Some("other_conversation"),
        Some(Cause::OtherModel) => Some("other_model"),
        Some(Cause::ServerReset | Cause::Undetermined) => {
            let head = w.tool_block
                + x.messages
                    .iter()
                    .zip(&w.messages)
                    .take_while(|(m, _)| m.role == "system")
                    .fold(0.0, |sum, (_, w)| sum + w);
            Some(if reused < SERVER_EMPTY_BELOW {
                "server_empty"
            } else if reused <= head * HEAD_MARGIN {
                "server_head_only"
            } else {
                "server_rollback"
            })
        }
        _ => None,
    };
    if let Some(cause) = external_cause {
        row.lost_external = loss(cause, external);
    }
    // A server_* loss after the client changed the reasoning it sent back is the client's
    // (`client_cause`), whatever llmp's cause says: no engine cause is guessed for it.
    let client_changed_reasoning = row
        .client_cause
        .as_deref()
        .is_some_and(super::client_cause::unseen_by_llmp);
    if let Some(lost) = row
        .lost_external
        .as_ref()
        .filter(|l| l.cause.starts_with("server_") && !client_changed_reasoning)
    {
        row.engine_base = Some(Box::new(super::engine_cause::engine_cause(
            x.served_model.as_deref().unwrap_or(&row.model),
            &lost.cause,
            round(reused),
            counts.prompt_tokens.map_or(0, |p| p.value),
            counts.load_ms.map(|m| m.value),
        )));
        row.engine_cause = row.engine_base.clone();
    }
}

fn cause(
    gap: f64,
    cold: bool,
    has_break: bool,
    latest: Option<Cause>,
    other_domains: bool,
) -> Option<Cause> {
    if gap < -CAUSE_GAP_POINTS {
        None
    } else if gap.abs() <= CAUSE_GAP_POINTS {
        has_break.then_some(Cause::Structural)
    } else if !cold {
        Some(if has_break {
            Cause::Structural
        } else {
            Cause::Undetermined
        })
    } else if latest.is_some() {
        latest
    } else if other_domains {
        Some(Cause::OtherModel)
    } else {
        Some(Cause::ServerReset)
    }
}

pub(super) fn composition(x: &Exchange, w: &Weights, prefix_len: usize) -> Composition {
    let mut system = 0.0;
    let mut history = 0.0;
    let mut new_content = 0.0;
    for (i, (m, &weight)) in x.messages.iter().zip(&w.messages).enumerate() {
        if m.role == "system" {
            system += weight;
        } else if i < prefix_len {
            history += weight;
        } else {
            new_content += weight;
        }
    }
    let measured = |value: f64| Measured {
        value: round(value),
        source: w.source,
    };
    Composition {
        system: measured(system),
        tools: measured(w.tool_block),
        history: measured(history),
        new_content: measured(new_content),
    }
}

pub(super) fn round(value: f64) -> u32 {
    if value.is_finite() && value > 0.0 {
        value.round().min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::Config;
    use crate::analysis::reference::*;
    use crate::analysis::row::ToolUsage;
    use crate::normalize::Api;
    use crate::normalize::exchange::{Counts, ToolDef};

    /// A break keeps both whole texts, the message's own (no copy) when it fits, and past the
    /// bound only its start, with the bytes not kept counted on a character boundary.
    #[test]
    fn a_break_keeps_both_whole_texts_up_to_the_bound() {
        let before: Arc<str> = Arc::from("You are helpful. Today is Monday.");
        let after: Arc<str> = Arc::from("You are helpful. Today is Tuesday.");
        let (head, tail, _, _) = snippets(&before, &after);
        let texts = BreakTexts::of(&before, &after, head, tail);
        assert!(Arc::ptr_eq(&texts.before, &before));
        assert_eq!((texts.before_cut, texts.after_cut), (0, 0));
        assert_eq!(&before[head..before.len() - tail], "Mon");
        assert_eq!(&after[head..after.len() - tail], "Tues");

        let bound = crate::limits::MAX_BREAK_TEXT_BYTES;
        // 'é' is two bytes: the bound falls inside one, so the cut moves back by a byte.
        let long: Arc<str> = Arc::from(format!("a{}", "é".repeat(bound)));
        let texts = BreakTexts::of(&long, &after, 0, 0);
        assert_eq!(texts.before.len(), bound - 1);
        assert_eq!(texts.before_cut, long.len() - (bound - 1));
        assert!(long.starts_with(&*texts.before));
    }
    use crate::record::hash;
    use crate::record::{Output, Params, ToolCall};

    fn msg(role: &str, text: &str) -> Msg {
        let chars: Vec<char> = text.chars().collect();
        let head: String = chars.iter().take(256).collect();
        let tail: String = chars[chars.len().saturating_sub(256)..].iter().collect();
        Msg {
            role: role.into(),
            hash: hash::hex(format!("{role}\0{text}").as_bytes()),
            identity: hash::hex(format!("{role}\0{text}").as_bytes()),
            chars: chars.len() as u32,
            tokens: None,
            head: hash::hex(head.as_bytes()),
            tail: hash::hex(tail.as_bytes()),
            text: Some(text.into()),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
            reasoning_chars: 0,
            media: 0,
        }
    }

    fn sized(role: &str, tag: &str, tokens: u32) -> Msg {
        let mut m = msg(role, tag);
        m.tokens = Some(Measured {
            value: tokens,
            source: Source::Tokenizer,
        });
        m
    }

    fn ex(id: u64, t: i64, messages: Vec<Msg>) -> Exchange {
        Exchange {
            id,
            t_start_ms: t,
            t_end_ms: t + 100,
            api: Api::OpenaiChat,
            model: "m".into(),
            served_model: None,
            user_agent: Some("agent/1".into()),
            session_id: None,
            messages: messages.into_iter().map(Arc::new).collect(),
            tools: Arc::from([]),
            tools_hash: None,
            params: Params::default(),
            counts: Counts::default(),
            output: Output::default(),
            ok: true,
            provider: Default::default(),
        }
    }

    fn with_tools(mut x: Exchange, names: &[(&str, u32)]) -> Exchange {
        x.tools = names
            .iter()
            .map(|(name, tokens)| ToolDef {
                name: (*name).into(),
                hash: hash::hex(name.as_bytes()),
                chars: 400,
                tokens: Some(Measured {
                    value: *tokens,
                    source: Source::Tokenizer,
                }),
                provided: false,
            })
            .collect();
        x.tools_hash = Some(hash::hex(format!("{names:?}").as_bytes()).into());
        x
    }

    fn model(mut x: Exchange, name: &str) -> Exchange {
        x.model = name.into();
        x
    }

    fn server(value: u32) -> Option<Measured<u32>> {
        Some(Measured {
            value,
            source: Source::Server,
        })
    }

    fn served(
        mut x: Exchange,
        prompt: u32,
        reused: u32,
        evaluated: u32,
        prefill_ms: f64,
    ) -> Exchange {
        x.counts.prompt_tokens = server(prompt);
        x.counts.reused_tokens = server(reused);
        x.counts.evaluated_tokens = server(evaluated);
        x.counts.prefill_ms = Some(Measured {
            value: prefill_ms,
            source: Source::Server,
        });
        x
    }

    fn table(exchanges: &[Exchange]) -> Table {
        build(exchanges, &Config::default())
    }

    fn row(t: &Table, id: u64) -> &Row {
        t.rows.iter().find(|r| r.id == id).unwrap()
    }

    fn conversation(turns: usize) -> Vec<Vec<Msg>> {
        let mut history = vec![sized("system", "sys", 1000)];
        let mut out = Vec::new();
        for i in 0..turns {
            history.push(sized("user", &format!("u{i}"), 100));
            out.push(history.clone());
            history.push(sized("assistant", &format!("a{i}"), 100));
        }
        out
    }

    #[test]
    fn rows_are_ordered_by_time_then_id() {
        let t = table(&[
            ex(3, 10, vec![msg("user", "c")]),
            ex(2, 10, vec![msg("user", "b")]),
            ex(1, 20, vec![msg("user", "a")]),
        ]);
        assert_eq!(
            t.rows.iter().map(|r| r.id).collect::<Vec<_>>(),
            vec![2, 3, 1]
        );
    }

    #[test]
    fn weights_estimate_from_chars_and_scale_to_the_server_total() {
        let mut x = ex(
            1,
            0,
            vec![msg("system", &"s".repeat(10)), msg("user", &"u".repeat(30))],
        );
        let w = weights(&x);
        assert_eq!(w.messages, vec![3.0, 8.0]);
        assert_eq!(w.source, Source::Estimate);
        x.counts.prompt_tokens = server(22);
        let w = weights(&x);
        assert_eq!(w.messages, vec![6.0, 16.0]);
        assert_eq!(w.total, 22.0);
        assert_eq!(w.source, Source::Estimate);
    }

    #[test]
    fn tokenizer_counts_are_weights() {
        let x = with_tools(ex(1, 0, vec![sized("user", "u", 40)]), &[("ls", 60)]);
        let w = weights(&x);
        assert_eq!(
            (w.messages.clone(), w.tool_block, w.total),
            (vec![40.0], 60.0, 100.0)
        );
        assert_eq!(w.source, Source::Tokenizer);
        let c = table(&[x]).rows[0].composition;
        assert_eq!(
            (c.tools.value, c.new_content.value, c.tools.source),
            (60, 40, Source::Tokenizer)
        );
    }

    #[test]
    fn sessions_split_on_the_gap_after_the_last_request_ended() {
        let mut a = ex(1, 0, vec![msg("user", "a")]);
        a.t_end_ms = 200_000;
        let b = ex(2, 250_000, vec![msg("user", "b")]);
        let c = ex(3, 400_000, vec![msg("user", "c")]);
        let t = table(&[a, b, c]);
        assert_eq!(row(&t, 1).session, row(&t, 2).session);
        assert_ne!(row(&t, 2).session, row(&t, 3).session);
    }

    #[test]
    fn sessions_are_per_domain() {
        let t = table(&[
            ex(1, 0, vec![msg("user", "a")]),
            model(ex(2, 30_000, vec![msg("user", "x")]), "other"),
            ex(3, 50_000, vec![msg("user", "b")]),
        ]);
        assert_eq!(row(&t, 1).session, row(&t, 3).session);
        assert_ne!(row(&t, 1).session, row(&t, 2).session);
    }

    #[test]
    fn continuation_rules() {
        let a = ex(
            1,
            0,
            vec![
                msg("system", "s1"),
                msg("user", "u"),
                msg("assistant", "par"),
            ],
        );
        let b = ex(
            2,
            0,
            vec![
                msg("system", "s2"),
                msg("user", "u"),
                msg("assistant", "partial answer"),
                msg("user", "more"),
            ],
        );
        assert!(continues(&a, &b));
        let c = ex(
            3,
            0,
            vec![
                msg("system", "s1"),
                msg("user", "other"),
                msg("assistant", "par"),
            ],
        );
        assert!(!continues(&a, &c));
        let d = ex(4, 0, vec![msg("system", "s1"), msg("user", "u")]);
        assert!(!continues(&a, &d));
        let e = ex(
            5,
            0,
            vec![msg("system", "s1"), msg("user", "u"), msg("user", "x")],
        );
        assert!(!continues(&a, &e));
        assert!(!continues(&ex(6, 0, vec![]), &a));
        let question = ex(7, 0, vec![msg("system", "s1"), msg("user", "q1")]);
        let other = ex(
            8,
            0,
            vec![
                msg("system", "s1"),
                msg("user", "q2"),
                msg("assistant", "x"),
            ],
        );
        assert!(!continues(&question, &other));
    }

    #[test]
    fn summarise_side_call() {
        let big = "x".repeat(20_001);
        let shape = |x: Exchange| table(&[x]).rows[0].clone();
        let r = shape(ex(
            1,
            0,
            vec![msg("system", "Summarise."), msg("user", &big)],
        ));
        assert_eq!(
            (r.kind, r.side_call_shape),
            (RowKind::SideCall, Some(Shape::Summarise))
        );
        let r = shape(ex(
            2,
            0,
            vec![msg("system", &"s".repeat(3000)), msg("user", &big)],
        ));
        assert_eq!(r.side_call_shape, None);
        let r = shape(ex(3, 0, vec![msg("user", &"y".repeat(20_000))]));
        assert_eq!(r.side_call_shape, None);
        let r = shape(ex(4, 0, vec![msg("user", &"y".repeat(20_001))]));
        assert_eq!(r.side_call_shape, Some(Shape::Summarise));
    }

    #[test]
    fn structured_side_call() {
        let base = || ex(1, 0, vec![msg("system", "Title?"), msg("user", "text")]);
        let shape = |x: Exchange| table(&[x]).rows[0].side_call_shape;
        let mut x = base();
        x.params.max_tokens = Some(32);
        assert_eq!(shape(x), Some(Shape::Structured));
        let mut x = base();
        x.params.max_tokens = Some(33);
        assert_eq!(shape(x), None);
        let mut x = base();
        x.params.max_tokens = Some(0);
        assert_eq!(shape(x), None);
        let mut x = base();
        x.params.grammar = true;
        assert_eq!(shape(x), Some(Shape::Structured));
        let mut x = base();
        x.params.response_format = true;
        assert_eq!(shape(x.clone()), Some(Shape::Structured));
        assert_eq!(shape(with_tools(x.clone(), &[("ls", 10)])), None);
        x.messages
            .extend([msg("assistant", "a"), msg("user", "b")].map(Arc::new));
        assert_eq!(shape(x), None);
    }

    #[test]
    fn oneshot_side_call() {
        let turns = conversation(3);
        let oneshot = ex(
            10,
            150,
            vec![msg("system", "Pick a filename."), msg("user", "q")],
        );
        let same_system = ex(
            11,
            160,
            vec![sized("system", "sys", 1000), msg("user", "unrelated")],
        );
        let with_tools_x = with_tools(
            ex(12, 170, vec![msg("system", "Other."), msg("user", "q3")]),
            &[("ls", 5)],
        );
        let t = table(&[
            ex(1, 0, turns[0].clone()),
            ex(2, 100, turns[1].clone()),
            oneshot,
            same_system,
            with_tools_x,
            ex(3, 200, turns[2].clone()),
        ]);
        assert_eq!(row(&t, 10).side_call_shape, Some(Shape::Oneshot));
        assert_eq!(row(&t, 11).kind, RowKind::Turn);
        assert_eq!(row(&t, 12).kind, RowKind::Turn);
        assert_eq!(row(&t, 1).kind, RowKind::Turn);
    }

    #[test]
    fn no_oneshot_without_a_continuing_pair() {
        let t = table(&[
            ex(1, 0, vec![msg("system", "A"), msg("user", "q1")]),
            ex(
                2,
                10,
                vec![
                    msg("system", "B"),
                    msg("user", "q2"),
                    msg("assistant", "x"),
                    msg("user", "y"),
                ],
            ),
        ]);
        assert!(t.rows.iter().all(|r| r.kind == RowKind::Turn));
    }

    #[test]
    fn stateless_domain() {
        let classify_rows =
            |xs: Vec<Exchange>| table(&xs).rows.iter().map(|r| r.kind).collect::<Vec<_>>();
        let q = |id, text: &str| {
            ex(
                id,
                id as i64 * 10,
                vec![msg("system", "Classify."), msg("user", text)],
            )
        };
        assert_eq!(
            classify_rows(vec![q(1, "a"), q(2, "b"), q(3, "c")]),
            vec![RowKind::Stateless; 3]
        );
        assert_eq!(
            classify_rows(vec![q(1, "a"), q(2, "b")]),
            vec![RowKind::Turn; 2]
        );
        let mut grows = q(3, "c");
        grows.messages.push(Arc::new(msg("user", "d")));
        assert_eq!(
            classify_rows(vec![q(1, "a"), q(2, "b"), grows]),
            vec![RowKind::Turn; 3]
        );
        let t = table(&[q(1, "a"), q(2, "b"), q(3, "c")]);
        assert!(
            t.rows
                .iter()
                .all(|r| r.prefix_tokens.is_none() && r.turn.is_none())
        );
    }

    #[test]
    fn links_record_what_ran_between() {
        let turns = conversation(2);
        let mut side = ex(5, 50, vec![msg("system", "Title?"), msg("user", "t")]);
        side.params.max_tokens = Some(8);
        let other = model(ex(6, 60, vec![msg("user", "o")]), "embedder");
        let t = table(&[
            ex(1, 0, turns[0].clone()),
            side,
            other,
            ex(2, 100, turns[1].clone()),
        ]);
        let r = row(&t, 2);
        assert_eq!(r.side_calls_between, vec![5]);
        assert_eq!(r.other_domains_between, vec![6]);
        assert_eq!((row(&t, 1).turn, r.turn), (Some(1), Some(2)));
        assert_eq!(row(&t, 5).turn, None);
        assert_eq!(row(&t, 1).prefix_tokens, None);
    }

    #[test]
    fn growing_conversation_has_no_break() {
        let turns = conversation(2);
        let t = table(&[ex(1, 0, turns[0].clone()), ex(2, 100, turns[1].clone())]);
        let r = row(&t, 2);
        assert_eq!(r.break_cause, None);
        assert_eq!(r.prefix_tokens, Some(1100));
        let c = r.composition;
        assert_eq!(
            (c.system.value, c.history.value, c.new_content.value),
            (1000, 100, 200)
        );
        let first = row(&t, 1).composition;
        assert_eq!(
            (
                first.system.value,
                first.history.value,
                first.new_content.value
            ),
            (1000, 0, 100)
        );
    }

    #[test]
    fn an_empty_prefix_is_positive_zero() {
        let turns = conversation(2);
        let mut sys = turns[1].clone();
        sys[0] = sized("system", "other", 1000);
        let t = link_pair(|x| served(x, 1300, 0, 1300, 1300.0), sys);
        let predicted = row(&t, 2).predicted_reuse.unwrap();
        assert!(predicted == 0.0 && predicted.is_sign_positive());
        assert_eq!(serde_json::to_string(&predicted).unwrap(), "0.0");
    }

    #[test]
    fn tool_change_breaks_the_prefix() {
        let turns = conversation(2);
        let a = with_tools(ex(1, 0, turns[0].clone()), &[("ls", 50)]);
        let b = with_tools(ex(2, 100, turns[1].clone()), &[("ls", 50), ("cat", 50)]);
        let t = table(&[a, b]);
        let r = row(&t, 2);
        assert_eq!(r.break_cause, Some(BreakCause::ToolsChanged));
        assert_eq!(r.prefix_tokens, Some(0));
        assert_eq!(r.composition.history.value, 0);
    }

    #[test]
    fn tools_are_not_reusable_when_the_first_message_changed() {
        let turns = conversation(2);
        let a = with_tools(ex(1, 0, turns[0].clone()), &[("ls", 50)]);
        let mut changed = turns[1].clone();
        changed[0] = sized("system", "other", 1000);
        let b = with_tools(ex(2, 100, changed.clone()), &[("ls", 50)]);
        let t = table(&[
            served(a, 1150, 0, 1150, 1150.0),
            served(b, 1350, 0, 1350, 1350.0),
        ]);
        let r = row(&t, 2);
        assert_eq!(
            (r.prefix_tokens, r.break_cause),
            (Some(0), Some(BreakCause::SystemChanged))
        );
        assert_eq!(r.cause, Some(Cause::Structural));
        assert_eq!(r.lost_client.clone().map(|l| l.tokens), Some(150));
        assert_eq!(r.lost_external, None);

        let mut edited = turns[1].clone();
        edited[1] = sized("user", "u0 edited", 100);
        let c = with_tools(ex(3, 200, edited), &[("ls", 50)]);
        let t = table(&[with_tools(ex(1, 0, turns[0].clone()), &[("ls", 50)]), c]);
        assert_eq!(row(&t, 3).prefix_tokens, Some(1050));
    }

    #[test]
    fn system_and_history_breaks() {
        let turns = conversation(2);
        let mut sys = turns[1].clone();
        sys[0] = sized("system", "sys v2", 1000);
        let t = table(&[ex(1, 0, turns[0].clone()), ex(2, 100, sys)]);
        assert_eq!(row(&t, 2).break_cause, Some(BreakCause::SystemChanged));
        assert_eq!(row(&t, 2).prefix_tokens, Some(0));

        let turns = conversation(3);
        let mut edit = turns[2].clone();
        edit[3] = sized("user", "u1 edited", 100);
        let t = table(&[ex(1, 0, turns[1].clone()), ex(2, 100, edit)]);
        assert_eq!(row(&t, 2).break_cause, Some(BreakCause::HistoryRewritten));
        assert_eq!(row(&t, 2).prefix_tokens, Some(1200));
        assert_eq!(
            (row(&t, 2).linked_to, row(&t, 2).new_conversation),
            (Some(1), false)
        );
    }

    #[test]
    fn shorter_request_matched_to_its_end_is_rewritten_history() {
        let turns = conversation(3);
        let t = table(&[ex(1, 0, turns[2].clone()), ex(2, 100, turns[1].clone())]);
        let r = row(&t, 2);
        assert_eq!(r.break_cause, Some(BreakCause::HistoryRewritten));
        assert!(!r.compaction);
    }

    #[test]
    fn compaction_is_a_big_shrink() {
        let long = conversation(20).pop().unwrap();
        let short = vec![
            long[0].clone(),
            long[1].clone(),
            sized("user", "summary so far", 200),
            sized("user", "next", 100),
        ];
        let t = table(&[ex(1, 0, long.clone()), ex(2, 100, short)]);
        let r = row(&t, 2);
        assert_eq!(r.break_cause, Some(BreakCause::HistoryRewritten));
        assert!(r.compaction);

        let system_only = vec![long[0].clone(), sized("user", "summary so far", 200)];
        let t = table(&[ex(1, 0, long), ex(2, 100, system_only)]);
        let r = row(&t, 2);
        assert!(r.new_conversation && !r.compaction);
        assert_eq!(r.break_cause, None);
    }

    #[test]
    fn already_sent_counts_equal_and_edited_messages_but_not_moved_ones() {
        let prev = ex(
            1,
            0,
            vec![
                sized("system", "s", 100),
                sized("user", "a", 100),
                sized("assistant", "b", 100),
            ],
        );
        let mut cur = prev.clone();
        cur.id = 2;
        cur.messages[0] = Arc::new(sized("system", "s2", 100));
        let w = weights(&cur);
        assert_eq!(already_sent(&prev, &cur, &w, true), 250.0);
        cur.messages[0] = Arc::new(sized("system", "t", 100));
        assert_eq!(already_sent(&prev, &cur, &w, true), 200.0);

        let mut moved = prev.clone();
        moved
            .messages
            .insert(1, Arc::new(sized("user", "inserted", 100)));
        let w = weights(&moved);
        assert_eq!(already_sent(&prev, &moved, &w, true), 100.0);
    }

    /// aider's `--restore-chat-history`: the earlier exchange comes back before the messages
    /// that preceded it. Everything the server re-evaluated but the new question had been
    /// processed before, moved or as the reply: that is the reorder's cost, not zero.
    #[test]
    fn a_moved_message_costs_what_the_server_re_evaluated_for_it() {
        let lead = vec![
            sized("system", "s", 60),
            sized("user", "example", 20),
            sized("assistant", "example reply", 20),
        ];
        let files = sized("user", "files", 100);
        let ack = sized("assistant", "ok", 50);
        let question = sized("user", "q1", 20);
        let reply = sized("assistant", "the answer", 30);
        let prev_messages = [
            lead.clone(),
            vec![files.clone(), ack.clone(), question.clone()],
        ];
        let mut prev = served(ex(1, 0, prev_messages.concat()), 270, 0, 270, 270.0);
        prev.output.content_chars = reply.chars;
        let cur_messages = [
            lead,
            vec![question, reply, files, ack, sized("user", "q2", 20)],
        ];
        let cur = served(ex(2, 200, cur_messages.concat()), 320, 100, 220, 220.0);
        let t = table(&[prev, cur]);
        let r = row(&t, 2);
        assert_eq!(r.break_cause, Some(BreakCause::HistoryRewritten));
        assert_eq!(r.prefix_tokens, Some(100));
        let client = r.lost_client.clone().unwrap();
        assert_eq!(
            (client.cause.as_str(), client.tokens),
            ("history_reordered", 200)
        );
        assert_eq!(r.lost_external, None);
    }

    /// Claude Code's `--continue` after replies cut at max_tokens: the replies come back
    /// without the resume notes between them. What was there is gone and what followed it
    /// comes up: messages dropped, not moved.
    #[test]
    fn a_dropped_message_is_named_dropped_not_reordered() {
        let lead = vec![sized("system", "s", 60), sized("user", "task", 20)];
        let cut = sized("assistant", "part one", 40);
        let note = sized("user", "continue", 10);
        let rest = sized("assistant", "part two", 40);
        let prev_messages = [
            lead.clone(),
            vec![cut.clone(), note, rest.clone(), sized("user", "q1", 20)],
        ];
        let prev = served(ex(1, 0, prev_messages.concat()), 190, 0, 190, 190.0);
        let cur_messages = [lead, vec![cut, rest, sized("user", "q2", 20)]];
        let cur = served(ex(2, 200, cur_messages.concat()), 180, 120, 60, 60.0);
        let t = table(&[prev, cur]);
        let r = row(&t, 2);
        assert_eq!(r.break_cause, Some(BreakCause::HistoryRewritten));
        assert_eq!(r.lost_client.clone().unwrap().cause, "history_dropped");
    }

    /// A system prompt edit: the server re-evaluates the whole history, the previous reply
    /// included; only the new question is new.
    #[test]
    fn a_break_charges_the_re_sent_reply_too() {
        let question = sized("user", "q1", 20);
        let reply = sized("assistant", "the answer", 30);
        let mut prev = served(
            ex(1, 0, vec![sized("system", "s", 100), question.clone()]),
            120,
            0,
            120,
            120.0,
        );
        prev.output.content_chars = reply.chars;
        let cur = served(
            ex(
                2,
                200,
                vec![
                    sized("system", "t", 100),
                    question,
                    reply,
                    sized("user", "q2", 20),
                ],
            ),
            170,
            0,
            170,
            170.0,
        );
        let t = table(&[prev, cur]);
        let r = row(&t, 2);
        assert_eq!(r.break_cause, Some(BreakCause::SystemChanged));
        let client = r.lost_client.clone().unwrap();
        // 20 + 30 of history, plus the unchanged share of the edited system prompt (none: the
        // one-letter prompts differ entirely).
        assert_eq!(
            (client.cause.as_str(), client.tokens),
            ("system_changed", 50)
        );
    }

    #[test]
    fn unchanged_share_from_text() {
        let a = msg("system", "You are helpful. Today is Monday. Be brief.");
        let b = msg("system", "You are helpful. Today is Tuesday. Be brief.");
        let share = unchanged_share(&a, &b);
        let expected = (f64::from(b.chars) - 4.0) / f64::from(b.chars);
        assert!((share - expected).abs() < 1e-9, "{share} vs {expected}");
        assert_eq!(unchanged_share(&a, &a), 1.0);
    }

    #[test]
    fn unchanged_share_from_head_and_tail_in_digest_mode() {
        let body = "x".repeat(1000);
        let mut a = msg("system", &format!("{body}A{body}"));
        let mut b = msg("system", &format!("{body}B{body}"));
        a.text = None;
        b.text = None;
        assert_eq!(unchanged_share(&a, &b), 512.0 / 2001.0);
        let mut c = msg("system", &format!("C{body}{body}"));
        c.text = None;
        assert_eq!(unchanged_share(&a, &c), 256.0 / 2001.0);
    }

    fn link_pair(cur_counts: impl Fn(Exchange) -> Exchange, cur_messages: Vec<Msg>) -> Table {
        let turns = conversation(2);
        table(&[
            served(ex(1, 0, turns[0].clone()), 1100, 0, 1100, 1100.0),
            cur_counts(ex(2, 100, cur_messages)),
        ])
    }

    #[test]
    fn full_reuse_loses_nothing() {
        let turns = conversation(2);
        let t = link_pair(|x| served(x, 1300, 1100, 200, 200.0), turns[1].clone());
        let r = row(&t, 2);
        assert_eq!(
            (r.predicted_reuse, r.observed_reuse),
            (Some(1100.0 / 1300.0), Some(1100.0 / 1300.0))
        );
        assert_eq!(r.cause, None);
        assert!(r.loss_measured);
        assert_eq!(
            (r.lost_client.clone(), r.lost_external.clone()),
            (None, None)
        );
    }

    #[test]
    fn cold_server_after_a_clean_prefix_is_a_server_reset() {
        let turns = conversation(2);
        let t = link_pair(|x| served(x, 1300, 0, 1300, 1300.0), turns[1].clone());
        let r = row(&t, 2);
        assert_eq!(r.cause, Some(Cause::ServerReset));
        let loss = r.lost_external.clone().unwrap();
        assert_eq!((loss.cause.as_str(), loss.tokens), ("server_empty", 1100));
        assert_eq!(
            loss.ms,
            Some(Measured {
                value: 1100.0,
                source: Source::Server
            })
        );
        assert_eq!(r.lost_client, None);
    }

    #[test]
    fn server_loss_kinds_follow_where_reuse_stopped() {
        let turns = conversation(6);
        let kind = |reused: u32| {
            let t = table(&[
                served(ex(1, 0, turns[4].clone()), 1900, 0, 1900, 1900.0),
                served(
                    ex(2, 100, turns[5].clone()),
                    2100,
                    reused,
                    2100 - reused,
                    2100.0,
                ),
            ]);
            let r = row(&t, 2).clone();
            (r.cause, r.lost_external.map(|l| (l.cause, l.tokens)))
        };
        assert_eq!(
            kind(64),
            (
                Some(Cause::ServerReset),
                Some(("server_empty".into(), 1836))
            )
        );
        assert_eq!(
            kind(1100),
            (
                Some(Cause::Undetermined),
                Some(("server_head_only".into(), 800))
            )
        );
        assert_eq!(
            kind(1400),
            (
                Some(Cause::Undetermined),
                Some(("server_rollback".into(), 500))
            )
        );
        assert_eq!(kind(1500), (None, None));
    }

    #[test]
    fn cause_rules_in_order() {
        let side = Some(Cause::SideCall);
        let other = Some(Cause::OtherConversation);
        assert_eq!(cause(-21.0, true, true, None, false), None);
        assert_eq!(
            cause(-20.0, true, true, None, false),
            Some(Cause::Structural)
        );
        assert_eq!(cause(20.0, true, false, None, false), None);
        assert_eq!(
            cause(21.0, false, true, None, false),
            Some(Cause::Structural)
        );
        assert_eq!(
            cause(21.0, false, false, side, true),
            Some(Cause::Undetermined)
        );
        assert_eq!(cause(21.0, true, true, side, true), Some(Cause::SideCall));
        assert_eq!(
            cause(21.0, true, false, other, true),
            Some(Cause::OtherConversation)
        );
        assert_eq!(
            cause(21.0, true, false, None, true),
            Some(Cause::OtherModel)
        );
        assert_eq!(
            cause(21.0, true, false, None, false),
            Some(Cause::ServerReset)
        );
    }

    #[test]
    fn the_latest_request_in_between_takes_the_blame() {
        let a = thread("main agent", 2);
        let b = thread("subagent", 2);
        let side = || {
            let mut x = ex(0, 0, vec![msg("system", "Title?"), msg("user", "t")]);
            x.params.max_tokens = Some(8);
            x
        };
        let at = |mut x: Exchange, id: u64, t: i64| {
            x.id = id;
            x.t_start_ms = t;
            x
        };
        let run = |middle: Vec<Exchange>| {
            let mut xs = vec![served(ex(1, 0, a[0].clone()), 1100, 0, 1100, 1100.0)];
            xs.extend(middle);
            xs.push(served(ex(9, 100, a[1].clone()), 1300, 0, 1300, 1300.0));
            table(&xs).rows.iter().find(|r| r.id == 9).unwrap().cause
        };
        assert_eq!(
            run(vec![
                at(side(), 2, 10),
                ex(3, 20, b[0].clone()),
                ex(4, 30, b[1].clone())
            ]),
            Some(Cause::OtherConversation)
        );
        assert_eq!(
            run(vec![
                ex(3, 20, b[0].clone()),
                ex(4, 30, b[1].clone()),
                at(side(), 5, 40)
            ]),
            Some(Cause::SideCall)
        );
    }

    #[test]
    fn side_call_between_turns_takes_the_blame() {
        let turns = conversation(2);
        let mut side = ex(5, 50, vec![msg("system", "Title?"), msg("user", "t")]);
        side.params.max_tokens = Some(8);
        let t = table(&[
            served(ex(1, 0, turns[0].clone()), 1100, 0, 1100, 1100.0),
            side,
            served(ex(2, 100, turns[1].clone()), 1300, 0, 1300, 1300.0),
        ]);
        let r = row(&t, 2);
        assert_eq!(r.cause, Some(Cause::SideCall));
        assert_eq!(
            r.lost_external.clone().map(|l| (l.cause, l.tokens)),
            Some(("side_call".into(), 1100))
        );
    }

    #[test]
    fn other_model_between_turns_takes_the_blame() {
        let turns = conversation(2);
        let t = table(&[
            served(ex(1, 0, turns[0].clone()), 1100, 0, 1100, 1100.0),
            model(ex(6, 50, vec![msg("user", "x")]), "other"),
            served(ex(2, 100, turns[1].clone()), 1300, 0, 1300, 1300.0),
        ]);
        assert_eq!(row(&t, 2).cause, Some(Cause::OtherModel));
        assert_eq!(
            row(&t, 2).lost_external.clone().map(|l| l.cause),
            Some("other_model".into())
        );
    }

    /// An image's tokens are its message's: the server's count less the text goes to the
    /// message that holds it, and the system prompt keeps its own size; the provider's own
    /// tools' instructions go to the tool block, not to a tool's schema.
    #[test]
    fn media_and_provided_tools_count_where_they_are() {
        let mut image = msg("user", &"q".repeat(40));
        image.media = 1;
        let x = served(
            ex(1, 0, vec![msg("system", &"s".repeat(400)), image]),
            2_000,
            0,
            2_000,
            10.0,
        );
        let w = weights(&x);
        assert_eq!(w.messages, [100.0, 1_900.0]);
        let mut search = with_tools(ex(2, 0, vec![msg("user", &"q".repeat(400))]), &[("x", 0)]);
        search.tools = Arc::from(vec![ToolDef {
            name: "web_search".into(),
            hash: "h".into(),
            chars: 40,
            tokens: None,
            provided: true,
        }]);
        let search = served(search, 1_110, 0, 1_110, 10.0);
        let w = weights(&search);
        assert_eq!(w.messages, [100.0]);
        assert_eq!(w.tools, [10.0]);
        assert_eq!(w.tool_block, 1_010.0);
    }

    /// On a hosted API, a count far past the request's text (an MCP server's tools, a
    /// provider's own instructions) is left unattributed past twice the text, never charged
    /// to the system prompt; a local server's scales as llmp's does.
    #[test]
    fn a_hosted_count_scales_the_text_at_most_twice() {
        let x = ex(1, 0, vec![msg("system", &"s".repeat(400))]);
        let mut hosted = served(x.clone(), 1_000, 0, 1_000, 10.0);
        hosted.provider = crate::provider::Provider::Anthropic;
        assert_eq!(weights(&hosted).messages, [200.0]);
        let local = served(x, 1_000, 0, 1_000, 10.0);
        assert_eq!(weights(&local).messages, [1_000.0]);
    }

    #[test]
    fn client_loss_is_what_was_sent_before_but_not_reused() {
        let turns = conversation(2);
        let mut edited = turns[1].clone();
        edited[0] = sized("system", "other", 1000);
        let t = link_pair(|x| served(x, 1300, 0, 1300, 1300.0), edited);
        let r = row(&t, 2);
        assert_eq!(r.break_cause, Some(BreakCause::SystemChanged));
        assert_eq!(r.cause, Some(Cause::Structural));
        let client = r.lost_client.clone().unwrap();
        assert_eq!(
            (client.cause.as_str(), client.tokens),
            ("system_changed", 100)
        );
        assert_eq!(r.lost_external, None);
    }

    #[test]
    fn client_loss_counts_the_unchanged_share_of_an_edited_system_prompt() {
        let base = "x".repeat(4000);
        let prev = vec![msg("system", &format!("{base} Monday")), msg("user", "q")];
        let cur = vec![
            msg("system", &format!("{base} Tuesday")),
            msg("user", "q"),
            msg("assistant", "a"),
            msg("user", "r"),
        ];
        let t = table(&[
            served(ex(1, 0, prev), 1000, 0, 1000, 1000.0),
            served(ex(2, 100, cur), 1010, 0, 1010, 1010.0),
        ]);
        let r = row(&t, 2);
        assert_eq!(r.break_cause, Some(BreakCause::SystemChanged));
        let client = r.lost_client.clone().unwrap().tokens;
        assert!((1000..=1010).contains(&client), "{client}");
    }

    #[test]
    fn compaction_charges_nothing_to_the_client() {
        let long = conversation(20).pop().unwrap();
        let short = vec![
            long[0].clone(),
            long[1].clone(),
            sized("user", "summary", 200),
            sized("user", "next", 100),
        ];
        let t = table(&[
            served(ex(1, 0, long), 4900, 0, 4900, 4900.0),
            served(ex(2, 100, short), 1400, 1100, 300, 300.0),
        ]);
        let r = row(&t, 2);
        assert!(r.compaction);
        assert_eq!(r.lost_client, None);
        assert_eq!(r.cause, Some(Cause::Structural));
        assert_eq!(r.lost_external, None);
    }

    #[test]
    fn loss_never_exceeds_what_was_evaluated() {
        let turns = conversation(2);
        let t = link_pair(|x| served(x, 1300, 0, 300, 300.0), turns[1].clone());
        assert_eq!(row(&t, 2).lost_external.clone().unwrap().tokens, 300);
    }

    #[test]
    fn loss_needs_every_counter() {
        let turns = conversation(2);
        let without_prefill = |x: Exchange| {
            let mut x = served(x, 1300, 0, 1300, 0.0);
            x.counts.prefill_ms = None;
            x
        };
        let t = link_pair(without_prefill, turns[1].clone());
        let r = row(&t, 2);
        assert!(!r.loss_measured);
        assert_eq!(r.cause, Some(Cause::ServerReset));
        assert_eq!(r.lost_external, None);

        let without_reuse = |x: Exchange| {
            let mut x = served(x, 1300, 0, 1300, 1300.0);
            x.counts.reused_tokens = None;
            x
        };
        let t = link_pair(without_reuse, turns[1].clone());
        let r = row(&t, 2);
        assert!(!r.loss_measured);
        assert_eq!((r.cause, r.observed_reuse), (None, None));
    }

    #[test]
    fn time_uses_the_cheaper_of_own_and_bulk_rate() {
        let turns = conversation(3);
        let t = table(&[
            served(ex(1, 0, turns[0].clone()), 1100, 0, 1100, 550.0),
            served(ex(2, 100, turns[1].clone()), 1300, 1100, 200, 100.0),
            served(ex(3, 200, turns[2].clone()), 1500, 0, 20, 400.0),
        ]);
        let loss = row(&t, 3).lost_external.clone().unwrap();
        assert_eq!(loss.tokens, 20);
        let bulk = (550.0 + 100.0) / (1100.0 + 200.0);
        assert!((loss.ms.unwrap().value - 20.0 * bulk).abs() < 1e-9);
    }

    #[test]
    fn proxy_timed_loss_keeps_the_proxy_source() {
        let turns = conversation(2);
        let proxy_timed = |x: Exchange| {
            let mut x = served(x, 1300, 0, 1300, 0.0);
            x.counts.prefill_ms = Some(Measured {
                value: 2600.0,
                source: Source::Proxy,
            });
            x
        };
        let t = link_pair(proxy_timed, turns[1].clone());
        let loss = row(&t, 2).lost_external.clone().unwrap();
        assert_eq!(
            loss.ms,
            Some(Measured {
                value: 1100.0,
                source: Source::Proxy
            })
        );
    }

    fn agent(mut x: Exchange, user_agent: Option<&str>) -> Exchange {
        x.user_agent = user_agent.map(Arc::from);
        x
    }

    fn thread(system: &str, turns: usize) -> Vec<Vec<Msg>> {
        let mut history = vec![sized("system", system, 1000)];
        let mut out = Vec::new();
        for i in 0..turns {
            history.push(sized("user", &format!("{system} u{i}"), 100));
            out.push(history.clone());
            history.push(sized("assistant", &format!("{system} a{i}"), 100));
        }
        out
    }

    #[test]
    fn interleaved_conversations_link_to_their_own_turns() {
        let a = thread("main agent", 3);
        let b = thread("subagent", 2);
        let t = table(&[
            ex(1, 0, a[0].clone()),
            ex(2, 10, b[0].clone()),
            ex(3, 20, a[1].clone()),
            ex(4, 30, b[1].clone()),
            ex(5, 40, a[2].clone()),
        ]);
        type Link = (u64, Option<u64>, Option<u32>, Option<u32>);
        let links: Vec<Link> = t
            .rows
            .iter()
            .map(|r| (r.id, r.linked_to, r.conversation, r.turn))
            .collect();
        assert_eq!(
            links,
            vec![
                (1, None, Some(1), Some(1)),
                (2, None, Some(2), Some(1)),
                (3, Some(1), Some(1), Some(2)),
                (4, Some(2), Some(2), Some(2)),
                (5, Some(3), Some(1), Some(3)),
            ]
        );
        assert!(t.rows.iter().all(|r| r.break_cause.is_none()));
        assert_eq!(row(&t, 3).other_conversations_between, vec![2]);
        assert_eq!(row(&t, 5).other_conversations_between, vec![4]);
        assert!(row(&t, 3).side_calls_between.is_empty());
    }

    #[test]
    fn another_conversation_in_between_takes_the_blame() {
        let a = thread("main agent", 2);
        let b = thread("subagent", 2);
        let t = table(&[
            served(ex(1, 0, a[0].clone()), 1100, 0, 1100, 1100.0),
            served(ex(2, 10, b[0].clone()), 1100, 0, 1100, 1100.0),
            served(ex(3, 15, b[1].clone()), 1300, 1100, 200, 200.0),
            served(ex(4, 20, a[1].clone()), 1300, 0, 1300, 1300.0),
        ]);
        let r = row(&t, 4);
        assert_eq!(r.other_conversations_between, vec![2, 3]);
        assert_eq!(r.cause, Some(Cause::OtherConversation));
        let loss = r.lost_external.clone().unwrap();
        assert_eq!(
            (loss.cause.as_str(), loss.tokens),
            ("other_conversation", 1100)
        );
    }

    #[test]
    fn a_new_conversation_shares_only_the_system_prompt() {
        let first = thread("agent", 2);
        let second = vec![
            sized("system", "agent", 1000),
            sized("user", "a new task", 100),
        ];
        let t = table(&[
            served(ex(1, 0, first[1].clone()), 1300, 0, 1300, 1300.0),
            served(ex(2, 100, second), 1100, 0, 1100, 1100.0),
        ]);
        let r = row(&t, 2);
        assert!(r.new_conversation);
        assert_eq!(
            (r.linked_to, r.conversation, r.turn),
            (Some(1), Some(2), Some(1))
        );
        assert_eq!((r.break_cause, r.prefix_tokens), (None, Some(1000)));
        assert_eq!(r.lost_client, None);
        assert_eq!(r.cause, Some(Cause::ServerReset));
        assert_eq!(r.lost_external.clone().map(|l| l.tokens), Some(1000));
    }

    #[test]
    fn a_continuation_wins_over_a_more_recent_similar_request() {
        let main = thread("agent", 2);
        let other = vec![
            sized("system", "agent", 1000),
            sized("user", "a new task", 100),
        ];
        let t = table(&[
            ex(1, 0, main[0].clone()),
            ex(2, 10, other),
            ex(3, 20, main[1].clone()),
        ]);
        assert_eq!(row(&t, 3).linked_to, Some(1));
        assert_eq!(row(&t, 3).conversation, Some(1));
        assert_eq!(row(&t, 3).other_conversations_between, vec![2]);
    }

    #[test]
    fn different_session_ids_are_never_linked() {
        let turns = conversation(2);
        let session = |mut x: Exchange, id: &str| {
            x.session_id = Some(Arc::from(id));
            x
        };
        let t = table(&[
            session(ex(1, 0, turns[0].clone()), "a"),
            session(ex(2, 100, turns[1].clone()), "b"),
            session(ex(3, 200, turns[1].clone()), "a"),
        ]);
        assert_ne!(row(&t, 2).conversation, row(&t, 1).conversation);
        assert_eq!(row(&t, 3).conversation, row(&t, 1).conversation);
        assert_eq!(row(&t, 3).linked_to, Some(1));
    }

    #[test]
    fn different_user_agents_are_never_linked() {
        let a = thread("agent", 2);
        let t = table(&[
            agent(ex(1, 0, a[0].clone()), Some("one/1")),
            agent(ex(2, 10, a[1].clone()), Some("two/1")),
        ]);
        assert_eq!(row(&t, 2).linked_to, None);
        assert_ne!(row(&t, 1).conversation, row(&t, 2).conversation);
        assert_eq!(
            (row(&t, 1).client.as_str(), row(&t, 2).client.as_str()),
            ("one/1", "two/1")
        );
    }

    #[test]
    fn clients_split_a_shared_user_agent_by_tool_set() {
        let main = thread("main", 2);
        let sub = thread("sub", 1);
        let other = thread("other harness", 1);
        let sdk = Some("OpenAI/Python 1.54.0");
        let t = table(&[
            agent(
                with_tools(ex(1, 0, main[0].clone()), &[("read", 10), ("write", 10)]),
                sdk,
            ),
            agent(with_tools(ex(2, 10, sub[0].clone()), &[("read", 10)]), sdk),
            agent(
                with_tools(ex(3, 20, other[0].clone()), &[("grep", 10), ("edit", 10)]),
                sdk,
            ),
            agent(
                with_tools(ex(4, 30, main[1].clone()), &[("read", 10), ("write", 10)]),
                sdk,
            ),
            agent(ex(5, 40, vec![msg("user", "hello")]), None),
        ]);
        let clients: Vec<&str> = t.rows.iter().map(|r| r.client.as_str()).collect();
        assert_eq!(
            clients,
            vec![
                "OpenAI/Python 1.54.0 #1",
                "OpenAI/Python 1.54.0 #1",
                "OpenAI/Python 1.54.0 #2",
                "OpenAI/Python 1.54.0 #1",
                "unknown"
            ]
        );
        let summary: Vec<(&str, u32, u32, Vec<&str>)> = t
            .clients
            .iter()
            .map(|c| {
                (
                    c.client.as_str(),
                    c.requests,
                    c.conversations,
                    c.tools.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("OpenAI/Python 1.54.0 #1", 3, 2, vec!["read", "write"]),
                ("OpenAI/Python 1.54.0 #2", 1, 1, vec!["edit", "grep"]),
                ("unknown", 1, 0, vec![]),
            ]
        );
        assert_eq!(t.clients[2].user_agent, None);
        let tools: Vec<(&str, &str, u32)> = t
            .tools
            .iter()
            .map(|u| (u.client.as_str(), u.name.as_str(), u.offered))
            .collect();
        assert_eq!(
            tools,
            vec![
                ("OpenAI/Python 1.54.0 #1", "read", 3),
                ("OpenAI/Python 1.54.0 #1", "write", 2),
                ("OpenAI/Python 1.54.0 #2", "edit", 1),
                ("OpenAI/Python 1.54.0 #2", "grep", 1),
            ]
        );
    }

    #[test]
    fn one_tool_set_keeps_the_plain_user_agent() {
        let a = thread("agent", 1);
        let t = table(&[
            agent(
                with_tools(ex(1, 0, a[0].clone()), &[("read", 10)]),
                Some("aider/0.86"),
            ),
            agent(
                ex(2, 10, vec![msg("system", "Title?"), msg("user", "t")]),
                Some("aider/0.86"),
            ),
        ]);
        assert!(t.rows.iter().all(|r| r.client == "aider/0.86"));
        assert_eq!(t.clients.len(), 1);
    }

    #[test]
    fn tool_usage_counts_offers_and_distinct_calls() {
        let mut a = with_tools(
            ex(1, 0, vec![sized("user", "u", 100)]),
            &[("ls", 50), ("cat", 70)],
        );
        a.output.tool_calls = vec![ToolCall {
            id: Some("c1".into()),
            name: "ls".into(),
        }];
        let mut b = with_tools(
            ex(2, 100, vec![sized("user", "u", 100)]),
            &[("ls", 60), ("cat", 70)],
        );
        let mut assistant = sized("assistant", "call", 10);
        assistant.tool_calls = vec![
            ToolCall {
                id: Some("c1".into()),
                name: "ls".into(),
            },
            ToolCall {
                id: Some("c0".into()),
                name: "ls".into(),
            },
        ];
        b.messages.push(Arc::new(assistant));
        b.output.tool_calls = vec![
            ToolCall {
                id: None,
                name: "cat".into(),
            },
            ToolCall {
                id: None,
                name: "unknown".into(),
            },
        ];
        let t = table(&[a, b]);
        assert_eq!(
            t.tools,
            vec![
                ToolUsage {
                    client: "agent/1".into(),
                    name: "cat".into(),
                    schema_tokens: 70,
                    offered: 2,
                    called: 1
                },
                ToolUsage {
                    client: "agent/1".into(),
                    name: "ls".into(),
                    schema_tokens: 60,
                    offered: 2,
                    called: 2
                },
            ]
        );
    }
}
