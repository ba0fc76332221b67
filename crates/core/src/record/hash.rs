//! FNV-1a 64 and canonical JSON, exactly as llmp defines them, so hashes agree across tools.

use serde_json::Value;
use xxhash_rust::xxh3::Xxh3;

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(OFFSET_BASIS, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    })
}

/// 16 lowercase hex digits of the FNV-1a 64 hash.
pub fn hex(bytes: &[u8]) -> String {
    format!("{:016x}", fnv1a64(bytes))
}

pub fn hex_value(value: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    hex(&out)
}

/// No whitespace, object keys sorted by their UTF-8 bytes at every depth, strings escaped as
/// serde_json does, numbers as parsed.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    // Only serde_json's escaping of valid strings and ASCII punctuation were written.
    String::from_utf8(out).unwrap_or_default()
}

/// Appends the canonical form of `value` to `out` (no intermediate strings: the digest of a
/// long conversation serializes every message once per request).
pub fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            out.push(b'{');
            // serde_json's default map is a BTreeMap, already in byte order; sort only when a
            // dependency turned on `preserve_order`.
            if map.keys().is_sorted_by(|a, b| a.as_bytes() <= b.as_bytes()) {
                write_entries(map.iter(), out);
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                write_entries(entries.into_iter(), out);
            }
            out.push(b'}');
        }
        Value::String(text) => write_string(text, out),
        Value::Number(number) => out.extend_from_slice(number.to_string().as_bytes()),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Null => out.extend_from_slice(b"null"),
    }
}

fn write_entries<'a>(entries: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut Vec<u8>) {
    for (i, (key, item)) in entries.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_string(key, out);
        out.push(b':');
        write_canonical(item, out);
    }
}

/// A JSON string escaped exactly as serde_json escapes it.
pub fn write_string(text: &str, out: &mut Vec<u8>) {
    // Writing to a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, text);
}

/// Feeds a tagged, length-prefixed form of `value` to a 128-bit hasher: a cheap key for
/// remembering work done on equal values (no escaping, no sorting). Two values with equal keys
/// are equal but for a hash collision; unequal key order only costs a miss.
pub fn feed_structure(value: &Value, hasher: &mut Xxh3) {
    match value {
        Value::Null => hasher.update(b"n"),
        Value::Bool(b) => hasher.update(if *b { b"t" } else { b"f" }),
        Value::Number(n) => {
            let text = n.to_string();
            hasher.update(b"#");
            feed_bytes(text.as_bytes(), hasher);
        }
        Value::String(text) => {
            hasher.update(b"s");
            feed_bytes(text.as_bytes(), hasher);
        }
        Value::Array(items) => {
            hasher.update(b"[");
            hasher.update(&(items.len() as u64).to_le_bytes());
            for item in items {
                feed_structure(item, hasher);
            }
        }
        Value::Object(map) => {
            hasher.update(b"{");
            hasher.update(&(map.len() as u64).to_le_bytes());
            for (key, item) in map {
                feed_bytes(key.as_bytes(), hasher);
                feed_structure(item, hasher);
            }
        }
    }
}

pub fn feed_bytes(bytes: &[u8], hasher: &mut Xxh3) {
    hasher.update(&(bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fnv1a64_reference_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(hex(b"a"), "af63dc4c8601ec8c");
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_depth_and_escapes_as_serde() {
        let a = json!({"b": 1, "a": {"y": [1, {"d": null, "c": "x"}], "x": true}});
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"x":true,"y":[1,{"c":"x","d":null}]},"b":1}"#
        );
        let v = json!({"k\"ey": "line\nbreak \u{e9}"});
        assert_eq!(canonical_json(&v), "{\"k\\\"ey\":\"line\\nbreak \u{e9}\"}");
    }
}
