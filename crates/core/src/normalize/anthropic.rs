//! The Anthropic Messages API in chat form: the `system` field becomes a leading system message,
//! `tool_use` blocks become tool calls and `tool_result` blocks tool messages. `cache_control`
//! markers are removed first, because clients move them every turn and they are not content.

use serde_json::{Map, Value, json};

use crate::record::hash;

/// The request's messages as chat messages, system first.
pub fn chat_messages(body: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    match body.get("system") {
        Some(Value::String(text)) => out.push(json!({"role": "system", "content": text})),
        Some(Value::Array(blocks)) if !blocks.is_empty() => {
            out.push(json!({"role": "system", "content": without_cache_control(&Value::Array(blocks.clone()))}))
        }
        _ => {}
    }
    for message in body
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        push_message(message, &mut out);
    }
    out
}

/// Tool definitions without `cache_control`.
pub fn chat_tools(body: &Value) -> Vec<Value> {
    body.get("tools")
        .and_then(Value::as_array)
        .map(|tools| tools.iter().map(without_cache_control).collect())
        .unwrap_or_default()
}

/// An Anthropic tool definition (`name`, `description`, `input_schema`) in the chat API's
/// function form, as llama.cpp converts it; any other tool as it is. A missing description
/// stays missing.
pub fn function_tool(tool: &Value) -> Value {
    if tool.get("function").is_some() || tool.get("input_schema").is_none() {
        return tool.clone();
    }
    let mut function = serde_json::Map::new();
    function.insert(
        "name".into(),
        tool.get("name").cloned().unwrap_or(Value::Null),
    );
    if let Some(description) = tool.get("description") {
        function.insert("description".into(), description.clone());
    }
    function.insert(
        "parameters".into(),
        tool.get("input_schema").cloned().unwrap_or(Value::Null),
    );
    serde_json::json!({"type": "function", "function": Value::Object(function)})
}

/// A (merged) response's reply as a chat message: text parts, `thinking`, tool calls.
pub(crate) fn chat_reply(body: &Value) -> Value {
    let mut text = Vec::new();
    let mut thinking: Option<String> = None;
    let mut calls = Vec::new();
    for block in body
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push(
                json!({"type": "text", "text": block.get("text").cloned().unwrap_or(Value::Null)}),
            ),
            Some("thinking") => thinking.get_or_insert_with(String::new).push_str(
                block
                    .get("thinking")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            ),
            // The provider's own tools (web search, code execution) are calls too: a tool
            // offered and used on the server is not unused.
            Some("tool_use" | "server_tool_use" | "mcp_tool_use") => calls.push(tool_call(block)),
            _ => {}
        }
    }
    let mut message = Map::new();
    message.insert("role".into(), Value::from("assistant"));
    message.insert("content".into(), Value::Array(text));
    if let Some(thinking) = thinking {
        message.insert("thinking".into(), Value::from(thinking));
    }
    if !calls.is_empty() {
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    Value::Object(message)
}

fn push_message(message: &Value, out: &mut Vec<Value>) {
    let role = message.get("role").cloned().unwrap_or(Value::Null);
    let blocks = match message.get("content") {
        Some(Value::Array(blocks)) => blocks,
        other => {
            out.push(json!({"role": role, "content": other.cloned().unwrap_or(Value::Null)}));
            return;
        }
    };
    let mut parts: Vec<Value> = Vec::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut thinking = String::new();
    let flush = |parts: &mut Vec<Value>,
                 calls: &mut Vec<Value>,
                 thinking: &mut String,
                 out: &mut Vec<Value>| {
        if parts.is_empty() && calls.is_empty() {
            return;
        }
        let mut m = Map::new();
        m.insert("role".into(), role.clone());
        m.insert("content".into(), Value::Array(std::mem::take(parts)));
        if !calls.is_empty() {
            m.insert("tool_calls".into(), Value::Array(std::mem::take(calls)));
        }
        // Not part of the message's identity; kept so a changed reasoning can be named.
        if !thinking.is_empty() {
            m.insert("thinking".into(), Value::from(std::mem::take(thinking)));
        }
        out.push(Value::Object(m));
    };
    for block in blocks {
        match block.get("type").and_then(Value::as_str) {
            Some("tool_use") => calls.push(tool_call(block)),
            Some("tool_result") => {
                flush(&mut parts, &mut calls, &mut thinking, out);
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": block.get("tool_use_id").cloned().unwrap_or(Value::Null),
                    "content": without_cache_control(block.get("content").unwrap_or(&Value::Null)),
                }));
            }
            // Thinking is the model's, re-sent for the server's benefit; it is not a message
            // of its own, and not part of the message's identity.
            Some("thinking") => thinking.push_str(
                block
                    .get("thinking")
                    .and_then(Value::as_str)
                    .unwrap_or_default(),
            ),
            Some("redacted_thinking") => {}
            _ => parts.push(without_cache_control(block)),
        }
    }
    flush(&mut parts, &mut calls, &mut thinking, out);
}

fn tool_call(block: &Value) -> Value {
    json!({
        "id": block.get("id").cloned().unwrap_or(Value::Null),
        "type": "function",
        "function": {
            "name": block.get("name").cloned().unwrap_or(Value::Null),
            "arguments": hash::canonical_json(block.get("input").unwrap_or(&Value::Null)),
        },
    })
}

fn without_cache_control(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, _)| key.as_str() != "cache_control")
                .map(|(key, value)| (key.clone(), without_cache_control(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_cache_control).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_string_and_blocks_lead() {
        let a =
            chat_messages(&json!({"system": "S", "messages": [{"role": "user", "content": "u"}]}));
        assert_eq!(
            a,
            vec![
                json!({"role": "system", "content": "S"}),
                json!({"role": "user", "content": "u"})
            ]
        );
        let b = chat_messages(
            &json!({"system": [{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}], "messages": []}),
        );
        assert_eq!(
            b,
            vec![json!({"role": "system", "content": [{"type": "text", "text": "S"}]})]
        );
    }

    #[test]
    fn reply_maps_blocks() {
        let reply = chat_reply(
            &json!({"content": [{"type": "text", "text": "a"}, {"type": "tool_use", "id": "t", "name": "ls", "input": {"p": 1}}]}),
        );
        assert_eq!(reply["tool_calls"][0]["function"]["arguments"], "{\"p\":1}");
        assert_eq!(reply["content"][0]["text"], "a");
    }
}
