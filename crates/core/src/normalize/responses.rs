//! The OpenAI Responses API (`/v1/responses`, Codex CLI's only API) in chat form:
//! `instructions` becomes a leading system message, `developer` messages are system messages,
//! content parts (`input_text`, `output_text`) text parts, `function_call` items the assistant's
//! tool calls, `function_call_output` items tool messages; `reasoning` items are dropped (the
//! model's, like Anthropic's thinking). Items of other types stay, as a message of that role, so
//! a change in them still shows.

use serde_json::{Map, Value, json};

/// The request's `instructions` and `input` as chat messages.
pub(crate) fn chat_messages(body: &Value) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    if let Some(Value::String(text)) = body.get("instructions")
        && !text.is_empty()
    {
        out.push(json!({"role": "system", "content": text}));
    }
    match body.get("input") {
        Some(Value::String(text)) => out.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => {
            for item in items {
                push_item(item, &mut out);
            }
        }
        _ => {}
    }
    out
}

/// Whether the body is a Responses request the analysis can read.
pub(crate) fn has_input(body: &Value) -> bool {
    matches!(body.get("input"), Some(Value::String(_) | Value::Array(_)))
}

/// Function tools in chat form (`{type, function: {name, description, parameters}}`); built-in
/// tools (`web_search`) keep their shape, named by their type.
pub(crate) fn chat_tools(body: &Value) -> Vec<Value> {
    body.get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|tool| match tool.get("type").and_then(Value::as_str) {
            Some("function") => {
                let mut function = Map::new();
                for key in ["name", "description", "parameters", "strict"] {
                    if let Some(value) = tool.get(key) {
                        function.insert(key.into(), value.clone());
                    }
                }
                json!({"type": "function", "function": Value::Object(function)})
            }
            other => {
                let mut tool = tool.clone();
                if let (Some(map), Some(kind)) = (tool.as_object_mut(), other)
                    && !map.contains_key("name")
                {
                    map.insert("name".into(), Value::from(kind));
                }
                tool
            }
        })
        .collect()
}

/// A (merged) response's `output` as one assistant message: its text parts and function calls.
pub(crate) fn chat_reply(body: &Value) -> Value {
    let mut messages = Vec::new();
    for item in body
        .get("output")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        push_item(item, &mut messages);
    }
    let mut content = Vec::new();
    let mut calls = Vec::new();
    for message in messages
        .iter()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
    {
        if let Some(Value::Array(parts)) = message.get("content") {
            content.extend(parts.iter().cloned());
        }
        if let Some(Value::Array(more)) = message.get("tool_calls") {
            calls.extend(more.iter().cloned());
        }
    }
    let mut reply = Map::new();
    reply.insert("role".into(), Value::from("assistant"));
    reply.insert("content".into(), Value::Array(content));
    if !calls.is_empty() {
        reply.insert("tool_calls".into(), Value::Array(calls));
    }
    Value::Object(reply)
}

fn push_item(item: &Value, out: &mut Vec<Value>) {
    let kind = item.get("type").and_then(Value::as_str);
    match kind {
        Some("message") | None if item.get("role").is_some() => {
            let role = match item.get("role").and_then(Value::as_str) {
                Some("developer") => "system",
                Some(role) => role,
                None => "user",
            };
            out.push(json!({"role": role, "content": content(item.get("content"))}));
        }
        Some("function_call" | "custom_tool_call") => {
            let call = json!({
                "id": item.get("call_id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {
                    "name": item.get("name").cloned().unwrap_or(Value::Null),
                    "arguments": item.get("arguments").or_else(|| item.get("input")).cloned().unwrap_or(Value::Null),
                },
            });
            // Calls right after an assistant message (or each other) belong to it.
            match out.last_mut() {
                Some(Value::Object(last))
                    if last.get("role").and_then(Value::as_str) == Some("assistant") =>
                {
                    let calls = last
                        .entry("tool_calls")
                        .or_insert_with(|| Value::Array(Vec::new()));
                    if let Value::Array(calls) = calls {
                        calls.push(call);
                    }
                }
                _ => out.push(json!({"role": "assistant", "content": [], "tool_calls": [call]})),
            }
        }
        Some("function_call_output" | "custom_tool_call_output") => out.push(json!({
            "role": "tool",
            "tool_call_id": item.get("call_id").cloned().unwrap_or(Value::Null),
            "content": content(item.get("output")),
        })),
        Some("reasoning") => {}
        Some(other) => {
            // An item the analysis does not know: kept whole (without its id, which the server
            // assigns) so that a change in it is still a change.
            let mut item = item.clone();
            if let Some(map) = item.as_object_mut() {
                map.remove("id");
            }
            out.push(json!({"role": other, "content": item}));
        }
        None => {}
    }
}

/// Content parts as chat text parts; a string stays a string; other parts (images, files)
/// stay as they are.
fn content(content: Option<&Value>) -> Value {
    match content {
        Some(Value::Array(parts)) => Value::Array(
            parts
                .iter()
                .map(|part| match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        json!({"type": "text", "text": part.get("text").cloned().unwrap_or(Value::Null)})
                    }
                    _ => part.clone(),
                })
                .collect(),
        ),
        Some(other) => other.clone(),
        None => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codex_input_in_chat_form() {
        let body = json!({
            "instructions": "Be brief.",
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ls?"}]},
                {"type": "function_call", "call_id": "c1", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            ],
        });
        let messages = chat_messages(&body);
        let roles: Vec<&str> = messages
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "system", "user", "assistant", "tool"]);
        assert_eq!(
            messages[1]["content"],
            json!([{"type": "text", "text": "rules"}])
        );
        assert_eq!(messages[3]["tool_calls"][0]["id"], "c1");
        assert_eq!(
            messages[3]["tool_calls"][0]["function"]["name"],
            "exec_command"
        );
        assert_eq!(messages[4]["tool_call_id"], "c1");
    }

    #[test]
    fn reply_and_tools() {
        let reply = chat_reply(&json!({"output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
            {"type": "function_call", "call_id": "c2", "name": "x", "arguments": "{}"},
        ]}));
        assert_eq!(reply["content"], json!([{"type": "text", "text": "done"}]));
        assert_eq!(reply["tool_calls"][0]["id"], "c2");
        let tools = chat_tools(&json!({"tools": [
            {"type": "function", "name": "exec_command", "parameters": {}},
            {"type": "web_search"},
        ]}));
        assert_eq!(tools[0]["function"]["name"], "exec_command");
        assert_eq!(tools[1]["name"], "web_search");
    }
}
