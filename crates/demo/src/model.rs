//! The simulated model, pure: a reply that is a deterministic function of the request (and a
//! seed), so the same run gives the same traffic. With tools offered it calls some: the tool
//! the user's last message names first, then a few more picked by hash, then it answers in text.

use serde_json::{Map, Value, json};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use prefixscope_core::normalize::digest::content_text_newline_joined;

/// Most tool calls the model makes after one user message.
pub const MAX_TOOL_STEPS: u64 = 3;
/// Tools the model never picks on its own (only when the user names them).
const ONLY_WHEN_NAMED: [&str; 1] = ["task"];

const WORDS: [&str; 48] = [
    "the", "parser", "reads", "each", "line", "and", "returns", "a", "config", "value", "error",
    "when", "missing", "tests", "cover", "edge", "cases", "file", "module", "function", "calls",
    "handler", "request", "cache", "prefix", "slot", "token", "buffer", "so", "we", "keep", "it",
    "small", "change", "fixed", "now", "passes", "check", "build", "uses", "path", "input",
    "output", "step", "loop", "done", "clear", "simple",
];

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// JSON text, as the OpenAI API carries it.
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: &'static str,
}

fn hash(seed: u64, parts: &[&str]) -> u64 {
    let mut h = seed;
    for part in parts {
        h = xxh3_64_with_seed(part.as_bytes(), h);
    }
    h
}

/// `n` words picked by `h`, as a sentence.
pub fn sentence(h: u64, n: usize) -> String {
    let mut state = h | 1;
    let mut words = Vec::with_capacity(n);
    for _ in 0..n {
        // xorshift: cheap, deterministic, good enough to vary words.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        words.push(WORDS[(state % WORDS.len() as u64) as usize]);
    }
    let mut text = words.join(" ");
    if let Some(first) = text.get(..1) {
        text = first.to_uppercase() + &text[1..];
    }
    text.push('.');
    text
}

/// The reply to a chat request. `max_tokens` cuts text replies (finish reason `length`).
pub fn reply(body: &Value, seed: u64, request_number: u64) -> Reply {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let tools: Vec<&Value> = body
        .get("tools")
        .and_then(Value::as_array)
        .map(|tools| tools.iter().collect())
        .unwrap_or_default();
    fn role(m: &Value) -> &str {
        m.get("role").and_then(Value::as_str).unwrap_or_default()
    }
    let last_user = messages.iter().rposition(|m| role(m) == "user");
    let user_text = last_user
        .map(|i| content_text_newline_joined(messages[i].get("content")))
        .unwrap_or_default();
    let steps_done = last_user.map_or(0, |i| {
        messages[i + 1..]
            .iter()
            .filter(|m| role(m) == "assistant")
            .count() as u64
    });
    // The plan depends on the user's message only; each step's choice on the step too.
    let plan = hash(seed, &[&user_text]);
    let h = hash(plan, &[&steps_done.to_string()]);
    let max_tokens = body
        .get("max_tokens")
        .or_else(|| body.get("max_completion_tokens"))
        .and_then(Value::as_u64);

    let name_of = |tool: &Value| {
        tool.pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let named = tools
        .iter()
        .map(|t| name_of(t))
        .find(|name| !name.is_empty() && user_text.contains(name.as_str()));
    let planned = match &named {
        Some(_) => 1 + plan % 2,
        None => plan % (MAX_TOOL_STEPS + 1),
    };
    let pickable: Vec<&Value> = tools
        .iter()
        .copied()
        .filter(|t| !ONLY_WHEN_NAMED.contains(&name_of(t).as_str()))
        .collect();
    if !tools.is_empty() && steps_done < planned {
        let tool = match (&named, steps_done) {
            (Some(name), 0) => tools.iter().copied().find(|t| &name_of(t) == name),
            _ if pickable.is_empty() => None,
            _ => Some(pickable[(h % pickable.len() as u64) as usize]),
        };
        if let Some(tool) = tool {
            let name = name_of(tool);
            return Reply {
                content: None,
                tool_calls: vec![ToolCall {
                    id: format!("call_{request_number:06}_{:08x}", h as u32),
                    arguments: arguments(tool, h, &user_text),
                    name,
                }],
                finish_reason: "tool_calls",
            };
        }
    }
    let words = 6 + (h % 20) as usize;
    let text = sentence(h, words);
    match max_tokens {
        // About one token per word: a short budget cuts the reply.
        Some(limit) if (limit as usize) < words => Reply {
            content: Some(sentence(h, limit as usize)),
            tool_calls: Vec::new(),
            finish_reason: "length",
        },
        _ => Reply {
            content: Some(text),
            tool_calls: Vec::new(),
            finish_reason: "stop",
        },
    }
}

/// Arguments for each property the tool's schema names: a path for `path`, the user's request
/// for `prompt`, a word otherwise.
fn arguments(tool: &Value, h: u64, user_text: &str) -> String {
    let properties = tool
        .pointer("/function/parameters/properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut args = Map::new();
    for (i, name) in properties.keys().enumerate() {
        let pick = WORDS[((h >> (i * 5)) % WORDS.len() as u64) as usize];
        let value = match name.as_str() {
            "path" | "file" => format!("src/{pick}.rs"),
            "prompt" | "task" | "description" => user_text.chars().take(200).collect(),
            "command" => format!("cargo test {pick}"),
            _ => pick.to_string(),
        };
        args.insert(name.clone(), json!(value));
    }
    Value::Object(args).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Value {
        json!({"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "properties": {"path": {"type": "string"}}}}})
    }

    #[test]
    fn the_same_request_gets_the_same_reply() {
        let body = json!({"messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(reply(&body, 7, 1), reply(&body, 7, 1));
        assert_eq!(reply(&body, 7, 1).finish_reason, "stop");
    }

    #[test]
    fn a_named_tool_is_called_first_and_the_loop_ends_in_text() {
        let mut messages = vec![json!({"role": "user", "content": "Use read_file on main."})];
        let tools = json!([tool("read_file"), tool("grep")]);
        let first = reply(&json!({"messages": messages, "tools": tools}), 1, 1);
        assert_eq!(first.tool_calls[0].name, "read_file");
        assert!(first.tool_calls[0].arguments.contains("\"path\":\"src/"));
        for step in 0..=MAX_TOOL_STEPS {
            let r = reply(&json!({"messages": messages, "tools": tools}), 1, step);
            if r.tool_calls.is_empty() {
                assert!(r.content.is_some());
                return;
            }
            messages.push(json!({"role": "assistant", "content": null}));
            messages.push(json!({"role": "tool", "content": "ok"}));
        }
        panic!("the model never answered in text");
    }

    #[test]
    fn max_tokens_cuts_the_reply() {
        let body = json!({"messages": [{"role": "user", "content": "title"}], "max_tokens": 5});
        let r = reply(&body, 3, 1);
        assert_eq!(r.finish_reason, "length");
        assert_eq!(r.content.unwrap().split(' ').count(), 5);
    }
}
