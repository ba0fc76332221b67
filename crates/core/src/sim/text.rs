//! The simulated model's text side, pure: a tokenizer stand-in (words with their leading space,
//! punctuation one character at a time, chat-template markers whole) and a ChatML-style
//! rendering of a chat request into the prompt the slots cache.
//!
//! Token ids are a hash of the piece, so `/tokenize` needs no vocabulary and equal text always
//! gives equal tokens: what prefix reuse depends on.

use serde_json::Value;
use xxhash_rust::xxh3::xxh3_64;

use super::kv::Token;
use crate::normalize::digest::content_text_newline_joined;

/// Vocabulary size of the stand-in (SmolLM2's, whose samples the responses are shaped on).
pub const VOCAB: u32 = 49_152;
/// Ids below this are the template's special tokens.
const FIRST_WORD_ID: u64 = 256;

/// Splits `text` into token pieces: `<|...|>` markers, a word with the spaces before it, each
/// punctuation character, each newline.
pub fn pieces(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if text[i..].starts_with("<|")
            && let Some(end) = text[i..].find("|>")
        {
            if start < i {
                out.push(&text[start..i]);
            }
            out.push(&text[i..i + end + 2]);
            i += end + 2;
            start = i;
            continue;
        }
        let Some(c) = text[i..].chars().next() else {
            break;
        };
        let width = c.len_utf8();
        if c == '\n' || (!c.is_alphanumeric() && c != ' ' && c != '_') {
            if start < i {
                out.push(&text[start..i]);
            }
            out.push(&text[i..i + width]);
            start = i + width;
        } else if c == ' ' && start < i && !text[start..i].chars().all(|x| x == ' ') {
            // A space ends the word before it and starts the next one.
            out.push(&text[start..i]);
            start = i;
        }
        i += width;
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

pub fn token_id(piece: &str) -> Token {
    if let Some(name) = piece.strip_prefix("<|").and_then(|p| p.strip_suffix("|>")) {
        return (xxh3_64(name.as_bytes()) % FIRST_WORD_ID) as Token;
    }
    (FIRST_WORD_ID + xxh3_64(piece.as_bytes()) % (u64::from(VOCAB) - FIRST_WORD_ID)) as Token
}

pub fn tokenize(text: &str) -> Vec<Token> {
    pieces(text).into_iter().map(token_id).collect()
}

/// The prompt llama-server would evaluate for a chat request, ChatML-style: tools inside the
/// system block (after the system text), each message in `<|im_start|>role … <|im_end|>`, and the
/// generation prompt last.
pub fn render_chat(body: &Value) -> String {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let tools = body
        .get("tools")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut out = String::new();
    let tools_block = (!tools.is_empty()).then(|| {
        let mut block = String::from("\n\n# Tools\n");
        for tool in tools {
            block.push_str(&serde_json::to_string(tool).unwrap_or_default());
            block.push('\n');
        }
        block
    });
    let starts_with_system = messages
        .first()
        .and_then(|m| m.get("role"))
        .and_then(Value::as_str)
        == Some("system");
    if !starts_with_system && let Some(block) = &tools_block {
        out.push_str("<|im_start|>system");
        out.push_str(block);
        out.push_str("<|im_end|>\n");
    }
    for (i, message) in messages.iter().enumerate() {
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("user");
        out.push_str("<|im_start|>");
        out.push_str(role);
        out.push('\n');
        out.push_str(&content_text_newline_joined(message.get("content")));
        if let Some(calls) = message.get("tool_calls").and_then(Value::as_array) {
            for call in calls {
                let function = call.get("function");
                let name = function
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let arguments = function
                    .and_then(|f| f.get("arguments"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                out.push_str("\n<tool_call>\n{\"name\": \"");
                out.push_str(name);
                out.push_str("\", \"arguments\": ");
                out.push_str(arguments);
                out.push_str("}\n</tool_call>");
            }
        }
        if i == 0
            && starts_with_system
            && let Some(block) = &tools_block
        {
            out.push_str(block);
        }
        out.push_str("<|im_end|>\n");
    }
    out.push_str("<|im_start|>assistant\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pieces_are_words_punctuation_and_markers() {
        assert_eq!(pieces("hello world"), ["hello", " world"]);
        assert_eq!(
            pieces("<|im_start|>user\nToday is Monday."),
            ["<|im_start|>", "user", "\n", "Today", " is", " Monday", "."]
        );
        assert_eq!(pieces("a  b"), ["a", "  b"]);
        assert_eq!(pieces("x(y)"), ["x", "(", "y", ")"]);
        assert_eq!(pieces("é ü"), ["é", " ü"]);
        assert!(pieces("").is_empty());
        // Every character is in exactly one piece.
        let text = "fn main() {\n    println!(\"{}\", 1);\n}";
        assert_eq!(pieces(text).concat(), text);
    }

    #[test]
    fn a_change_late_in_the_system_prompt_keeps_the_tokens_before_it() {
        let day = |d: &str| {
            json!({"messages": [
                {"role": "system", "content": format!("You are a coding agent. Today is {d}.")},
                {"role": "user", "content": "hi"}
            ]})
        };
        let (a, b) = (
            tokenize(&render_chat(&day("Monday"))),
            tokenize(&render_chat(&day("Tuesday"))),
        );
        let shared = super::super::kv::common_prefix(&a, &b);
        assert!(
            shared > 5 && shared < a.len() - 5,
            "{shared} of {}",
            a.len()
        );
    }

    #[test]
    fn tools_sit_in_the_system_block() {
        let body = json!({
            "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
            "tools": [{"type": "function", "function": {"name": "read_file"}}]
        });
        let text = render_chat(&body);
        let tools = text.find("read_file").unwrap();
        assert!(text.find("S").unwrap() < tools && tools < text.find("U").unwrap());
        assert!(text.ends_with("<|im_start|>assistant\n"));
    }
}
