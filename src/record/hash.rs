//! FNV-1a 64 and canonical JSON, exactly as llmp defines them, so hashes agree across tools.

use serde_json::Value;

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
    hex(canonical_json(value).as_bytes())
}

/// No whitespace, object keys sorted by their UTF-8 bytes at every depth, strings escaped as
/// serde_json does, numbers as parsed.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
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
