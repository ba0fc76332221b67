//! What never reaches a recording, a screen or a file of ours although it passed through the
//! proxy: credentials in the request's query string, session headers that are not ids. (The
//! proxy forwards everything unchanged; only what we keep and print is held back.) Pure:
//! depends on nothing else of the crate.

use std::borrow::Cow;

/// What a credential's value becomes.
pub const REDACTED: &str = "REDACTED";

/// Query parameter names that are credentials as a whole (compared lowercase, `-` and `.` read
/// as `_`).
const CREDENTIAL_NAMES: [&str; 22] = [
    "key",
    "apikey",
    "api_key",
    "token",
    "access_token",
    "auth",
    "authorization",
    "auth_token",
    "secret",
    "client_secret",
    "password",
    "passwd",
    "pwd",
    "pass",
    "signature",
    "sig",
    "code",
    "jwt",
    "bearer",
    "credential",
    "credentials",
    "session_key",
];

/// Endings that make a name a credential: `*_key`, `*token` (`x_amz_security_token`), and the
/// rest of the list's words after a separator (`x_amz_signature`, `db_password`).
const CREDENTIAL_ENDINGS: [&str; 8] = [
    "_key",
    "token",
    "_secret",
    "_password",
    "_signature",
    "_sig",
    "_credential",
    "_auth",
];

/// Whether a query parameter of this name holds a credential (the name as sent: it may be
/// percent-encoded).
pub fn is_credential_name(name: &str) -> bool {
    let name: String = percent_decoded(name)
        .chars()
        .map(|c| match c {
            '-' | '.' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    CREDENTIAL_NAMES.contains(&name.as_str())
        || CREDENTIAL_ENDINGS.iter().any(|end| name.ends_with(end))
}

/// The request target with the value of every credential-named query parameter replaced by
/// `REDACTED`; everything else (path, other parameters, their order and encoding) as it was.
pub fn redact_query(target: &str) -> Cow<'_, str> {
    let Some((path, query)) = target.split_once('?') else {
        return Cow::Borrowed(target);
    };
    let secret = |pair: &str| {
        pair.split_once('=')
            .is_some_and(|(name, value)| !value.is_empty() && is_credential_name(name))
    };
    if !query.split('&').any(secret) {
        return Cow::Borrowed(target);
    }
    let pairs: Vec<Cow<'_, str>> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if secret(pair) => Cow::Owned(format!("{name}={REDACTED}")),
            _ => Cow::Borrowed(pair),
        })
        .collect();
    Cow::Owned(format!("{path}?{}", pairs.join("&")))
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
    fn credential_values_are_redacted_and_the_rest_is_kept() {
        assert_eq!(
            redact_query("/v1/chat/completions?api_key=sk-1&stream=true&key=AIza2"),
            "/v1/chat/completions?api_key=REDACTED&stream=true&key=REDACTED"
        );
        for name in [
            "KEY",
            "Api-Key",
            "api.key",
            "token",
            "access_token",
            "x-goog-api-key",
            "X-Amz-Signature",
            "X-Amz-Security-Token",
            "sig",
            "password",
            "auth",
            "api%5Fkey",
            "refresh_token",
            "client_secret",
        ] {
            assert!(is_credential_name(name), "{name}");
            assert_eq!(
                redact_query(&format!("/p?{name}=s3cr3t&a=1")),
                format!("/p?{name}=REDACTED&a=1"),
                "{name}"
            );
        }
        for name in ["model", "stream", "keys_only", "monkeys", "limit", "tokens"] {
            assert!(!is_credential_name(name), "{name}");
        }
        assert_eq!(redact_query("/v1/models"), "/v1/models");
        assert_eq!(redact_query("/p?key&key="), "/p?key&key=");
        assert!(matches!(redact_query("/p?a=1&b=2"), Cow::Borrowed(_)));
        assert_eq!(percent_decoded("a%2"), "a%2");
        assert_eq!(percent_decoded("a%zz"), "a%zz");
    }
}
