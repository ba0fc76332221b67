//! Recorded text made safe for a terminal. Model names, user agents, message text and paths come
//! from clients, servers and recording files; printed raw, an ESC or BEL in them can set the
//! window title, clear the screen or worse. Every text output that prints recorded data goes
//! through here. Pure: depends on nothing else of the crate.

use std::borrow::Cow;
use std::fmt::Write;

/// `bytes` as text, invalid UTF-8 replaced (`String::from_utf8_lossy`'s result). Valid text,
/// the usual case, is checked by `str::from_utf8`, several times faster than the lossy scan on
/// its own (it takes eight ASCII bytes at a time).
pub fn utf8_lossy(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(text) => Cow::Borrowed(text),
        Err(_) => String::from_utf8_lossy(bytes),
    }
}

/// `text` with every control character written out visibly: C0 (`\x1b`, `\x07`, `\r`…), DEL
/// (`\x7f`) and C1 (`\u{9b}`…). `multiline` keeps `\n` and `\t` (a summary); otherwise they are
/// escaped too (one line per record).
pub fn escape_controls(text: &str, multiline: bool) -> Cow<'_, str> {
    let is_escaped = |c: char| c.is_control() && !(multiline && matches!(c, '\n' | '\t'));
    if !text.chars().any(is_escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !is_escaped(c) {
            out.push(c);
        } else if (c as u32) < 0x80 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// One line of output: every control character escaped, newlines and tabs included.
pub fn printable_line(text: &str) -> Cow<'_, str> {
    escape_controls(text, false)
}

/// Multi-line output: control characters escaped, `\n` and `\t` kept.
pub fn printable(text: &str) -> Cow<'_, str> {
    escape_controls(text, true)
}

/// JSON for a terminal: serde_json escapes C0 in strings but writes DEL and C1 as they are;
/// those become `\u007f`, `\u009b`… (the same JSON, read back to the same strings).
pub fn printable_json(json: &str) -> Cow<'_, str> {
    let is_raw = |c: char| c.is_control() && !matches!(c, '\n' | '\t' | '\r');
    if !json.chars().any(is_raw) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 8);
    for c in json.chars() {
        if is_raw(c) {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Whether `text` holds a character a terminal may act on (for a cell of the TUI's buffer).
pub fn has_controls(text: &str) -> bool {
    text.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_lossy_is_from_utf8_lossy() {
        let cases: [&[u8]; 6] = [
            b"",
            b"data: {\"a\":1}\n\n",
            "é \u{1F600} ok".as_bytes(),
            b"cut \xe2\x82",
            b"\xff\xfe bad \xc0\x80 start",
            b"ok \xed\xa0\x80 surrogate",
        ];
        for bytes in cases {
            assert_eq!(
                utf8_lossy(bytes),
                String::from_utf8_lossy(bytes),
                "{bytes:?}"
            );
        }
        assert!(matches!(utf8_lossy(b"plain"), Cow::Borrowed("plain")));
    }

    #[test]
    fn controls_are_written_out_and_the_rest_kept() {
        let hostile = "m\x1b]0;pwned\x07\x1b[2J\r\u{9b}31m\x7f é…";
        assert_eq!(
            printable_line(hostile),
            "m\\x1b]0;pwned\\x07\\x1b[2J\\x0d\\u{9b}31m\\x7f é…"
        );
        assert_eq!(printable("a\n\tb\x1bc"), "a\n\tb\\x1bc");
        assert_eq!(printable_line("a\nb"), "a\\x0ab");
        assert!(matches!(printable("plain … text\n"), Cow::Borrowed(_)));
        assert!(has_controls("\x07") && !has_controls("é"));
        let json = serde_json::to_string(&serde_json::json!({"m": "a\u{9b}b\x7f\x1b"})).unwrap();
        let printable = printable_json(&json);
        assert_eq!(printable, r#"{"m":"a\u009bb\u007f\u001b"}"#);
        let back: serde_json::Value = serde_json::from_str(&printable).unwrap();
        assert_eq!(back["m"], "a\u{9b}b\x7f\x1b");
    }
}
