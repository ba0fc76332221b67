//! What never reaches a recording, a screen or a file of ours although it passed through the
//! proxy: credentials in the request's query string, session headers that are not ids. (The
//! proxy forwards everything unchanged; only what we keep and print is held back.) Pure:
//! depends on nothing else of the crate.

use std::borrow::Cow;

/// What a credential's value becomes.
pub const REDACTED: &str = "REDACTED";

/// Query parameter names whose values are recorded as sent (compared lowercase, percent-decoded,
/// `-` and `.` read as `_`): what LLM APIs put in a query that is not a secret. Every other
/// parameter's value is recorded as `REDACTED`, whatever its name, separator or encoding: a
/// list of secret names let `passphrase`, `hmac`, `ticket`, `Policy`, `key[]` or `token%00`
/// through.
const HARMLESS_NAMES: [&str; 14] = [
    "model",
    "stream",
    "api_version",
    "version",
    "beta",
    "alt",
    "format",
    "limit",
    "order",
    "after",
    "before",
    "page",
    "per_page",
    "n",
];

/// Whether a query parameter of this name (as sent: it may be percent-encoded) is recorded with
/// its value.
pub fn is_harmless_name(name: &str) -> bool {
    let name: String = percent_decoded(name)
        .chars()
        .map(|c| match c {
            '-' | '.' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    HARMLESS_NAMES.contains(&name.as_str())
}

/// The request target with the value of every query parameter not known to be harmless
/// replaced by `REDACTED` (pairs split at `&` and `;`); the path, the names, the separators and
/// the harmless values as they were.
pub fn redact_query(target: &str) -> Cow<'_, str> {
    let Some((path, query)) = target.split_once('?') else {
        return Cow::Borrowed(target);
    };
    let secret = |pair: &str| {
        pair.split_once('=')
            .is_some_and(|(name, value)| !value.is_empty() && !is_harmless_name(name))
    };
    if !query.split(['&', ';']).any(secret) {
        return Cow::Borrowed(target);
    }
    let mut out = format!("{path}?");
    let mut rest = query;
    loop {
        let end = rest.find(['&', ';']).unwrap_or(rest.len());
        let pair = &rest[..end];
        match pair.split_once('=') {
            Some((name, _)) if secret(pair) => {
                out.push_str(name);
                out.push('=');
                out.push_str(REDACTED);
            }
            _ => out.push_str(pair),
        }
        if end == rest.len() {
            break;
        }
        out.push_str(&rest[end..end + 1]);
        rest = &rest[end + 1..];
    }
    Cow::Owned(out)
}

/// Whether a header value looks like a credential although it has an id's characters: a key of
/// a known provider's shape (`sk-…`, `AKIA…`, `ghp_…`, `xoxb-…`, `AIza…`), a JWT (three
/// dot-separated base64url parts, `eyJ…`), or a long opaque token (40 or more characters mixing
/// upper case, lower case and digits with no `-`). Such values are not recorded even under a
/// session header's name.
pub fn is_credential_shaped(value: &str) -> bool {
    const PREFIXES: [&str; 15] = [
        "sk-",
        "sk_",
        "pk-",
        "pk_",
        "rk_",
        "ghp_",
        "gho_",
        "ghs_",
        "github_pat_",
        "xoxb-",
        "xoxp-",
        "AKIA",
        "ASIA",
        "AIza",
        "eyJ",
    ];
    if PREFIXES.iter().any(|p| value.starts_with(p)) {
        return true;
    }
    let base64url = |part: &str| {
        part.len() >= 8
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
    };
    let parts: Vec<&str> = value.split('.').collect();
    if parts.len() == 3 && parts.iter().all(|p| base64url(p)) {
        return true;
    }
    value.len() >= 40
        && !value.contains('-')
        && value.bytes().any(|b| b.is_ascii_uppercase())
        && value.bytes().any(|b| b.is_ascii_lowercase())
        && value.bytes().any(|b| b.is_ascii_digit())
}

/// The session and conversation headers recorded (beside llmp's four): an allowlist of names
/// harnesses and routers use for ids, compared lowercase. A blocklist let anything through
/// that merely contained `session` (`x-session-signature`, `x-session-passphrase`).
const SESSION_HEADERS: [&str; 10] = [
    "session-id",
    "session_id",
    "x-session-id",
    "x-session-affinity",
    "conversation-id",
    "conversation_id",
    "x-conversation-id",
    "x-claude-code-session-id",
    "x-opencode-session",
    "x-client-session-id",
];

/// Longest session id value recorded.
pub const MAX_SESSION_ID_LEN: usize = 128;

/// Whether a request header of this name may be recorded as a session or conversation id.
pub fn is_session_header(name: &str) -> bool {
    SESSION_HEADERS
        .iter()
        .any(|allowed| allowed.eq_ignore_ascii_case(name))
}

/// Whether a value looks like an id (1 to 128 of `A-Z a-z 0-9 . _ : -`), not like a token or
/// a sentence: only those are recorded.
pub fn is_id_value(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= MAX_SESSION_ID_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// `%5F` → `_` and so on; a malformed escape stays as written.
fn percent_decoded(text: &str) -> Cow<'_, str> {
    if !text.contains('%') && !text.contains('+') {
        return Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                (Some(high), Some(low)) => {
                    out.push((high * 16 + low) as u8);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            byte => out.push(byte),
        }
        i += 1;
    }
    Cow::Owned(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_headers_by_name_and_id_shape() {
        for name in [
            "X-Session-Id",
            "x-claude-code-session-id",
            "conversation_id",
        ] {
            assert!(is_session_header(name), "{name}");
        }
        for name in [
            "x-session-signature",
            "x-conversation-jwt",
            "x-session-passphrase",
            "x-session-bearer",
            "x-conversation",
            "x-session-token",
        ] {
            assert!(!is_session_header(name), "{name}");
        }
        assert!(is_id_value("3f2b9c1e-8a7d-4e55-9b1a-0c2d3e4f5a6b"));
        assert!(is_id_value("ses_01J:abc.def"));
        for value in ["", "Bearer abc", "a=b", "eyJ...+/=", &"a".repeat(129)] {
            assert!(!is_id_value(value), "{value}");
        }
    }

    #[test]
    fn only_harmless_query_values_are_kept() {
        assert_eq!(
            redact_query("/v1/chat/completions?api_key=sk-1&stream=true&key=AIza2"),
            "/v1/chat/completions?api_key=REDACTED&stream=true&key=REDACTED"
        );
        for name in [
            "KEY",
            "Api-Key",
            "api%5Fkey",
            "X-Amz-Signature",
            "passphrase",
            "hmac",
            "otp",
            "ticket",
            "session",
            "access-key-id",
            "Key-Pair-Id",
            "Policy",
            "key[]",
            "token%00",
            "a",
        ] {
            assert!(!is_harmless_name(name), "{name}");
            assert_eq!(
                redact_query(&format!("/p?{name}=s3cr3t&model=m")),
                format!("/p?{name}=REDACTED&model=m"),
                "{name}"
            );
        }
        // `;` separates pairs too, and is kept.
        assert_eq!(
            redact_query("/p?model=m;token=s3cr3t&api-version=2024-10-21"),
            "/p?model=m;token=REDACTED&api-version=2024-10-21"
        );
        for name in [
            "model",
            "Stream",
            "api-version",
            "api.version",
            "beta",
            "alt",
        ] {
            assert!(is_harmless_name(name), "{name}");
        }
        assert_eq!(redact_query("/v1/models"), "/v1/models");
        assert_eq!(redact_query("/p?key&key="), "/p?key&key=");
        assert!(matches!(
            redact_query("/p?model=a&stream=b"),
            Cow::Borrowed(_)
        ));
        assert_eq!(percent_decoded("a%2"), "a%2");
        assert_eq!(percent_decoded("a%zz"), "a%zz");
    }

    #[test]
    fn credential_shaped_values_are_told_from_ids() {
        for value in [
            "sk-live-4f8a9b2c",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "AKIAIOSFODNN7EXAMPLE",
            "ghp_16C7e42F292c6912E7710c838347Ae178B4a",
            "Zk9vQmFyQmF6UXV4UXV1eDEyMzQ1Njc4OTBhYmNkZWY",
        ] {
            assert!(is_credential_shaped(value), "{value}");
        }
        for value in [
            "3f2b9c1e-8a7d-4e55-9b1a-0c2d3e4f5a6b",
            "ses_01J:abc.def",
            "conversation-42",
            "c1",
        ] {
            assert!(!is_credential_shaped(value), "{value}");
        }
    }
}
