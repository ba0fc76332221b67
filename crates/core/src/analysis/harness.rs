//! Which agent harness sent a request, from what it says about itself: Claude Code, opencode
//! and Codex name themselves in the user-agent; aider sends the OpenAI Python SDK's and is
//! known by the first words of its system prompt (full recordings only).

use crate::normalize::exchange::Exchange;

/// User-agent products and the harness each names.
const BY_USER_AGENT: [(&str, &str); 5] = [
    ("claude-cli/", "Claude Code"),
    ("opencode/", "opencode"),
    ("codex_exec/", "Codex"),
    ("codex_cli_rs/", "Codex"),
    ("aider/", "aider"),
];

/// aider's system prompts (its edit formats) start so.
const AIDER_SYSTEM_STARTS: [&str; 2] = [
    "Act as an expert software developer",
    "Act as an expert code analyst",
];

/// The harness a user-agent names, without version (`Claude Code`).
pub(crate) fn product_name(user_agent: &str) -> Option<&'static str> {
    BY_USER_AGENT
        .iter()
        .find(|(product, _)| user_agent.starts_with(product))
        .map(|(_, name)| *name)
}

/// The harness named by a user-agent, with its version when it gives one (`Claude Code 2.1.197`).
pub(crate) fn from_user_agent(user_agent: &str) -> Option<String> {
    let (product, name) = BY_USER_AGENT
        .iter()
        .find(|(product, _)| user_agent.starts_with(product))?;
    let version = user_agent[product.len()..]
        .split(|c: char| c.is_whitespace() || c == ';' || c == ')')
        .next()
        .filter(|v| {
            !v.is_empty()
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
        });
    Some(match version {
        Some(version) => format!("{name} {version}"),
        None => name.to_string(),
    })
}

/// The harness of a request: its user-agent, else (aider) its system prompt's first words.
pub(crate) fn of(x: &Exchange) -> Option<String> {
    if let Some(name) = x.user_agent.as_deref().and_then(from_user_agent) {
        return Some(name);
    }
    let system = x.messages.iter().find(|m| m.role == "system")?;
    let text = system.text.as_deref()?;
    AIDER_SYSTEM_STARTS
        .iter()
        .any(|start| text.starts_with(start))
        .then(|| "aider".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harnesses_by_their_user_agents() {
        for (user_agent, harness) in [
            (
                "claude-cli/2.1.197 (external, sdk-cli)",
                Some("Claude Code 2.1.197"),
            ),
            (
                "opencode/1.18.33 ai-sdk/provider-utils/4.0.23 runtime/bun/1.3.14",
                Some("opencode 1.18.33"),
            ),
            (
                "codex_exec/0.171.0 (Debian 12.0.0; x86_64) dumb (codex_exec; 0.171.0)",
                Some("Codex 0.171.0"),
            ),
            ("OpenAI/Python 2.20.0", None),
            ("Bun/1.4.0", None),
        ] {
            assert_eq!(
                from_user_agent(user_agent).as_deref(),
                harness,
                "{user_agent}"
            );
        }
    }
}
