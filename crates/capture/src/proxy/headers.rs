//! Which headers are forwarded (all but hop-by-hop, RFC 9110 §7.6.1) and which are recorded
//! (llmp's four, plus session and conversation ids by allowlist, id-shaped values only:
//! `prefixscope_core::privacy`).

use std::collections::BTreeMap;

use hyper::header::{self, HeaderMap, HeaderName};

use prefixscope_core::privacy::{is_credential_shaped, is_id_value, is_session_header};

const RECORDED: [&str; 4] = [
    "user-agent",
    "content-type",
    "content-length",
    "transfer-encoding",
];

/// The hop-by-hop headers every message loses (besides the names `connection` lists).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::PROXY_AUTHENTICATE
        || name == header::PROXY_AUTHORIZATION
        || name == header::TE
        || name == header::TRAILER
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name.as_str() == "proxy-connection"
        || name.as_str() == "keep-alive"
}

pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one pass over the few headers there are finds that, where a
    // removal by name of each of the nine costs a hash and a probe.
    if !headers.keys().any(is_hop_by_hop) {
        return;
    }
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    let present: Vec<HeaderName> = headers
        .keys()
        .filter(|n| is_hop_by_hop(n))
        .cloned()
        .collect();
    for name in present {
        headers.remove(name);
    }
}

/// Whether a header (by name) is kept in the recording; a session header's value must also
/// look like an id.
pub fn is_recorded(name: &str) -> bool {
    RECORDED.iter().any(|r| r.eq_ignore_ascii_case(name)) || is_session_header(name)
}

/// The recorded headers of a message: names lowercased, a repeated header's values joined
/// with ", " in their order.
pub(crate) fn recorded_headers(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (name, value) in headers {
        let name = name.as_str();
        if is_recorded(name) {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            if is_session_header(name) && (!is_id_value(&value) || is_credential_shaped(&value)) {
                continue;
            }
            out.entry(name.to_string())
                .and_modify(|v: &mut String| {
                    v.push_str(", ");
                    v.push_str(&value);
                })
                .or_insert(value);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    #[test]
    fn hop_by_hop_headers_go_and_end_to_end_stay() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Private"),
        );
        headers.insert("x-private", HeaderValue::from_static("1"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert(
            header::TRANSFER_ENCODING,
            HeaderValue::from_static("chunked"),
        );
        headers.insert(header::UPGRADE, HeaderValue::from_static("h2c"));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer x"));
        strip_hop_by_hop(&mut headers);
        let mut left: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        left.sort();
        assert_eq!(left, vec!["authorization", "content-type"]);
    }

    #[test]
    fn hop_by_hop_headers_go_without_a_connection_header_and_others_stay_in_order() {
        let mut headers = HeaderMap::new();
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("Proxy-Connection", HeaderValue::from_static("keep-alive"));
        headers.insert(header::TRAILER, HeaderValue::from_static("x-checksum"));
        headers.append("x-repeated", HeaderValue::from_static("1"));
        headers.append("x-repeated", HeaderValue::from_static("2"));
        strip_hop_by_hop(&mut headers);
        let left: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(left, vec![("x-repeated", "1"), ("x-repeated", "2")]);

        let mut none = HeaderMap::new();
        none.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        none.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        let before = none.clone();
        strip_hop_by_hop(&mut none);
        assert_eq!(none, before);
    }

    #[test]
    fn recorded_headers_in_any_case_keep_their_order_and_join_repeats() {
        let pairs: [(&str, &[u8]); 6] = [
            ("User-Agent", b"a/1"),
            ("X-Session-Id", b"s-1"),
            ("Content-Type", b"application/json"),
            ("user-agent", b"b/2"),
            ("Authorization", b"Bearer x"),
            ("x-session-id", b"not an id, with spaces"),
        ];
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_bytes(value).unwrap(),
            );
        }
        let from_pairs = recorded_headers(&map);
        assert_eq!(from_pairs["user-agent"], "a/1, b/2");
        assert!(!from_pairs.contains_key("authorization"));
    }

    #[test]
    fn session_headers_are_recorded_and_credentials_never() {
        for name in [
            "user-agent",
            "content-type",
            "x-session-id",
            "x-claude-code-session-id",
            "conversation-id",
        ] {
            assert!(is_recorded(name), "{name}");
        }
        for name in [
            "authorization",
            "cookie",
            "x-api-key",
            "api-key",
            "x-session-token",
            "session-key",
            "X-Conversation",
            "x-session-signature",
            "x-conversation-jwt",
            "x-session-passphrase",
            "x-session-bearer",
            "proxy-authorization",
            "accept",
            "host",
        ] {
            assert!(!is_recorded(name), "{name}");
        }
    }

    #[test]
    fn a_credential_under_a_session_header_s_name_is_not_recorded() {
        let mut map = HeaderMap::new();
        map.insert("session_id", HeaderValue::from_static("sk-live-4f8a9b2c"));
        map.insert(
            "x-session-id",
            HeaderValue::from_static("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmN"),
        );
        map.insert(
            "x-conversation-id",
            HeaderValue::from_static("3f2b9c1e-8a7d-4e55-9b1a-0c2d3e4f5a6b"),
        );
        let recorded = recorded_headers(&map);
        assert_eq!(
            recorded.keys().collect::<Vec<_>>(),
            ["x-conversation-id"],
            "{recorded:?}"
        );
    }
}
