//! prefixscope: the client causes users keep reporting, named beside llmp's `break_cause`
//! (which keeps llmp's meaning): Claude Code's attribution header, a date in the system prompt,
//! the same tools in another order (an MCP server reconnecting) apart from tools added, removed
//! or re-described, earlier replies' reasoning dropped or changed when sent back. Each has its
//! own fix. Pure.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::normalize::exchange::{Msg, ToolDef};
use crate::normalize::measured::Source;

/// Claude Code's `x-anthropic-billing-header: … cch=…;` line at the front of its system prompt.
pub(crate) const ATTRIBUTION_HEADER: &str = "attribution_header";
/// A date or time in the system prompt that moved on.
pub(crate) const DATE_IN_SYSTEM_PROMPT: &str = "date_in_system_prompt";
/// The same tools (same schemas) in another order.
pub(crate) const TOOLS_REORDERED: &str = "tools_reordered";
/// The same tool names, a schema or description changed.
pub(crate) const TOOLS_SCHEMA_CHANGED: &str = "tools_schema_changed";
/// Tools added or removed.
pub(crate) const TOOLS_ADDED_REMOVED: &str = "tools_added_removed";
/// An earlier reply's reasoning was dropped or changed when sent back (its identity, llmp's,
/// leaves reasoning out, so llmp sees no break; a template that renders it does).
pub(crate) const REASONING_CHANGED: &str = "reasoning_changed";

/// An identical message of the matched prefix now weighs other tokens in the server's own
/// layout (`tokenize::layout`): the chat template renders earlier turns differently once they
/// are not the last (Qwen3's drops their reasoning), so the server cannot reuse them.
pub(crate) const TEMPLATE_RERENDERED: &str = "template_rerendered";

/// Causes llmp cannot see (its identities match) that make a `server_*` loss the client's.
pub(crate) fn unseen_by_llmp(cause: &str) -> bool {
    cause == REASONING_CHANGED || cause == TEMPLATE_RERENDERED
}

/// Whether an identical message of the matched prefix (`upto`) weighs other tokenizer counts
/// now than in the previous request (equal text tokenizes alike, so the template made it).
/// Only messages whose next message matched too: a layout's message runs to the next one's
/// content, so the previous request's last message carried the generation prompt.
pub(crate) fn template_rerendered(before: &[Arc<Msg>], after: &[Arc<Msg>], upto: usize) -> bool {
    before
        .iter()
        .zip(after)
        .take(upto.saturating_sub(1))
        .any(|(a, b)| {
            matches!((a.tokens, b.tokens), (Some(x), Some(y))
            if x.source == Source::Tokenizer && y.source == Source::Tokenizer && x.value != y.value)
        })
}

/// Whether a message of the matched prefix (`upto`) came back with another reasoning than the
/// previous request sent with it.
pub(crate) fn reasoning_changed(before: &[Arc<Msg>], after: &[Arc<Msg>], upto: usize) -> bool {
    before
        .iter()
        .zip(after)
        .take(upto)
        .any(|(a, b)| a.reasoning_chars > 0 && a.reasoning_chars != b.reasoning_chars)
}

/// Claude Code's attribution line (`x-anthropic-billing-header: … cch=…`), which changes on every
/// request at the start of its system prompt.
pub(crate) fn is_claude_code_billing(text: &str) -> bool {
    text.contains("x-anthropic-billing-header") || text.contains("cch=")
}

/// A date or time in the changed text (`2026-03-14`, `Monday`, `12:01`).
pub(crate) fn looks_like_date(text: &str) -> bool {
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let digits = text.chars().filter(char::is_ascii_digit).count();
    DAYS.iter().any(|d| text.contains(d))
        || (digits >= 4 && (text.contains('-') || text.contains(':') || text.contains('/')))
}

/// A system prompt change by what changed (`before` / `after`: the changed text, as the break
/// location has it; empty in digest recordings, which name nothing).
pub(crate) fn of_system_change(before: &str, after: &str) -> Option<&'static str> {
    if is_claude_code_billing(before) || is_claude_code_billing(after) {
        Some(ATTRIBUTION_HEADER)
    } else if looks_like_date(before) || looks_like_date(after) {
        Some(DATE_IN_SYSTEM_PROMPT)
    } else {
        None
    }
}

/// A tool array change by what changed: the same tools in another order, the same names with
/// another schema, or tools added or removed.
pub(crate) fn of_tools_change(before: &[ToolDef], after: &[ToolDef]) -> &'static str {
    let set = |tools: &[ToolDef], key: fn(&ToolDef) -> &str| -> BTreeSet<String> {
        tools.iter().map(|t| key(t).to_string()).collect()
    };
    let (names_before, names_after) = (set(before, |t| &t.name), set(after, |t| &t.name));
    let (hashes_before, hashes_after) = (set(before, |t| &t.hash), set(after, |t| &t.hash));
    if names_before != names_after {
        TOOLS_ADDED_REMOVED
    } else if hashes_before == hashes_after && before.len() == after.len() {
        TOOLS_REORDERED
    } else {
        TOOLS_SCHEMA_CHANGED
    }
}

/// What to change, for a named cause.
pub(crate) fn fix(cause: &str) -> Option<&'static str> {
    Some(match cause {
        ATTRIBUTION_HEADER => {
            "Claude Code's attribution header (x-anthropic-billing-header … cch=) changes on every request: set CLAUDE_CODE_ATTRIBUTION_HEADER=0"
        }
        DATE_IN_SYSTEM_PROMPT => {
            "a date or time in the system prompt: move it after the stable part (the end of the system prompt, or the latest user message)"
        }
        TOOLS_REORDERED => {
            "the same tools came in another order (an MCP server reconnecting lists its tools anew): keep their order stable (build the tool array once, sorted by name, for every request)"
        }
        TOOLS_SCHEMA_CHANGED => {
            "a tool's schema or description changed mid-conversation: keep each tool's definition fixed for the whole conversation (no counters, dates or state in descriptions)"
        }
        TOOLS_ADDED_REMOVED => {
            "tools were added or removed mid-conversation: keep the tool array stable (same tools, same order, same schemas) for the whole conversation"
        }
        REASONING_CHANGED => {
            "earlier replies' reasoning was dropped or changed when sent back, and the server's template renders it: send each reply's reasoning back as it came (reasoning_content, thinking blocks), or serve a template that leaves earlier turns' reasoning out"
        }
        TEMPLATE_RERENDERED => {
            "the chat template renders earlier turns differently once they are no longer the last (the server's own layout counts them anew), so their cache is lost every turn: serve a template that renders history as it rendered it (llama-server --chat-template-file), or send history the way the template renders it"
        }
        _ => return None,
    })
}

/// For a person: `attribution header changed`.
pub fn client_cause_label(cause: &str) -> Option<&'static str> {
    Some(match cause {
        ATTRIBUTION_HEADER => "attribution header changed",
        DATE_IN_SYSTEM_PROMPT => "date in system prompt",
        TOOLS_REORDERED => "tools reordered",
        TOOLS_SCHEMA_CHANGED => "tool schema changed",
        TOOLS_ADDED_REMOVED => "tools added/removed",
        REASONING_CHANGED => "reasoning re-sent changed",
        TEMPLATE_RERENDERED => "earlier turns re-rendered",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, hash: &str) -> ToolDef {
        ToolDef {
            name: name.into(),
            hash: hash.into(),
            chars: 10,
            tokens: None,
            provided: false,
        }
    }

    #[test]
    fn tools_reordered_apart_from_added_and_re_described() {
        let (a, b) = (tool("read", "h1"), tool("grep", "h2"));
        let before = [a.clone(), b.clone()];
        assert_eq!(
            of_tools_change(&before, &[b.clone(), a.clone()]),
            TOOLS_REORDERED
        );
        assert_eq!(
            of_tools_change(&before, &[a.clone(), tool("grep", "h3")]),
            TOOLS_SCHEMA_CHANGED
        );
        assert_eq!(
            of_tools_change(&before, std::slice::from_ref(&a)),
            TOOLS_ADDED_REMOVED
        );
        assert_eq!(
            of_tools_change(&before, &[a, b, tool("web", "h4")]),
            TOOLS_ADDED_REMOVED
        );
    }

    #[test]
    fn system_changes_by_what_changed() {
        assert_eq!(
            of_system_change(
                "x-anthropic-billing-header: cc_version=2.1; cch=ab12;",
                "cch=cd34;"
            ),
            Some(ATTRIBUTION_HEADER)
        );
        assert_eq!(
            of_system_change("Today is 2026-03-14.", "Today is 2026-03-15."),
            Some(DATE_IN_SYSTEM_PROMPT)
        );
        assert_eq!(of_system_change("nonce a8f3", "nonce 77c1"), None);
        assert_eq!(of_system_change("", ""), None);
        for cause in [
            ATTRIBUTION_HEADER,
            DATE_IN_SYSTEM_PROMPT,
            TOOLS_REORDERED,
            TOOLS_SCHEMA_CHANGED,
            TOOLS_ADDED_REMOVED,
            REASONING_CHANGED,
            TEMPLATE_RERENDERED,
        ] {
            assert!(
                fix(cause).is_some() && client_cause_label(cause).is_some(),
                "{cause}"
            );
        }
        assert!(
            fix(ATTRIBUTION_HEADER)
                .unwrap()
                .contains("CLAUDE_CODE_ATTRIBUTION_HEADER=0")
        );
    }
}
