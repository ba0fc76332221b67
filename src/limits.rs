//! Bounds on the numbers prefixscope reads from servers, recordings, logs and traces, checked
//! before any of them sizes an allocation (DESIGN.md, "Limits"). A count past its bound is a
//! bad value: counted and shown where bad lines are, then treated as not reported.

/// The most prompt tokens one request may claim: 16,777,216, above every context window in
/// use (the largest, 10M tokens), so no real count is refused.
pub const MAX_PROMPT_TOKENS: u64 = 1 << 24;

/// Tokens a tokenizer can make of one character, at most: byte-fallback vocabularies give one
/// token per UTF-8 byte, and a character is at most four bytes.
pub const MAX_TOKENS_PER_CHAR: f64 = 4.0;

/// Tokens a prompt may hold beyond its text: the chat template's markers and media (an image
/// is a few hundred to a few thousand tokens whatever the length of its URL).
pub const TEMPLATE_AND_MEDIA_TOKENS: u64 = 1 << 17;

/// Replay and demo speeds: ×0.01 to ×1000. Slower shows nothing for minutes; faster paces below
/// what a sleep resolves, and a speed near zero turned a sleep into a `Duration` overflow (a
/// panic in the simulated server's worker, then a hang).
pub const MIN_SPEED: f64 = 0.01;
pub const MAX_SPEED: f64 = 1000.0;

/// The longest `--connect-timeout`, in whole seconds: a day. (`1e20` seconds panicked
/// converting to a `Duration`.)
pub const MAX_CONNECT_TIMEOUT_SECS: u64 = 86_400;

/// The most slots the simulated server (`demo --slots`) runs.
pub const MAX_SIM_SLOTS: usize = 64;

/// Whether `speed` is a replay or demo speed we run at.
pub fn valid_speed(speed: f64) -> bool {
    (MIN_SPEED..=MAX_SPEED).contains(&speed)
}

/// A token count read from a server or a file, or `None` when it is past every context window.
pub fn plausible_tokens(count: u64) -> Option<u64> {
    (count <= MAX_PROMPT_TOKENS).then_some(count)
}

/// The most tokens a prompt of `chars` characters can be: its text at four tokens a character,
/// plus the template and media allowance, and never past `MAX_PROMPT_TOKENS`.
pub fn max_tokens_for_chars(chars: u64) -> u64 {
    chars
        .saturating_mul(MAX_TOKENS_PER_CHAR as u64)
        .saturating_add(TEMPLATE_AND_MEDIA_TOKENS)
        .min(MAX_PROMPT_TOKENS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_counts_pass_and_huge_ones_do_not() {
        assert_eq!(plausible_tokens(10_000_000), Some(10_000_000));
        assert_eq!(plausible_tokens(1 << 32), None);
        assert_eq!(plausible_tokens(u64::MAX), None);
    }

    #[test]
    fn a_prompt_bound_follows_its_text_and_stops_at_the_maximum() {
        assert_eq!(max_tokens_for_chars(0), TEMPLATE_AND_MEDIA_TOKENS);
        assert_eq!(max_tokens_for_chars(1000), 4000 + TEMPLATE_AND_MEDIA_TOKENS);
        assert_eq!(max_tokens_for_chars(u64::MAX), MAX_PROMPT_TOKENS);
    }
}
