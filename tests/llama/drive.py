#!/usr/bin/env python3
"""Plays a short scripted agent session through a proxy, OpenAI and Anthropic APIs.

Usage: drive.py BASE_URL
Only the standard library. The model (SmolLM2-135M) is too small to call tools on its own, so the
assistant's tool calls in the history are scripted, as a harness replaying a session would send.
"""
import json, sys, urllib.request

BASE = sys.argv[1].rstrip("/")
UA = "prefixscope-drive/1"
SYSTEM = ("You are a coding agent working in a small Rust repository. Read files before changing "
          "them, keep changes minimal, and explain what you did in one or two sentences. "
          "Today is Monday.")
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
    {"type": "function", "function": {"name": "list_dir", "description": "List a directory.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]


def post(path, body, stream):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", "user-agent": UA,
                                          "x-session-id": "drive-session-1"})
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read().decode()
    if not stream:
        return json.loads(raw)
    return raw


def chat(messages, stream, usage=False, tools=True, max_tokens=24):
    body = {"model": "smollm2", "max_tokens": max_tokens, "temperature": 0, "messages": messages, "stream": stream}
    if tools:
        body["tools"] = TOOLS
    if usage:
        body["stream_options"] = {"include_usage": True}
    out = post("/v1/chat/completions", body, stream)
    if stream:
        text = ""
        for line in out.splitlines():
            if line.startswith("data: ") and line[6:] != "[DONE]":
                for c in json.loads(line[6:]).get("choices", []):
                    text += c.get("delta", {}).get("content") or ""
        return text
    return out["choices"][0]["message"].get("content") or ""


# OpenAI chat: a conversation with a tool round trip, streamed and not.
m = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is in src/?"}]
m.append({"role": "assistant", "content": chat(m, stream=False)})
m.append({"role": "user", "content": "Read src/main.rs please."})
m.append({"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function",
          "function": {"name": "read_file", "arguments": json.dumps({"path": "src/main.rs"})}}]})
m.append({"role": "tool", "tool_call_id": "call_1", "content": "fn main() {\n    println!(\"hello\");\n}\n"})
m.append({"role": "assistant", "content": chat(m, stream=True)})
# A title side-call: no tools, a one-shot prompt.
chat([{"role": "user", "content": "Write a 3-word title for: reading main.rs"}], stream=False, tools=False, max_tokens=8)
m.append({"role": "user", "content": "Make it print hello world."})
m.append({"role": "assistant", "content": chat(m, stream=True, usage=True)})
# The date changes at the end of the system prompt: the prefix breaks there.
m[0] = {"role": "system", "content": SYSTEM.replace("Monday", "Tuesday")}
m.append({"role": "user", "content": "Thanks. Anything else to check?"})
chat(m, stream=False)

# Anthropic Messages: system blocks with cache_control, a tool_use / tool_result round trip.
a_tools = [{"name": "read_file", "description": "Read a file.",
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]
msgs = [{"role": "user", "content": [{"type": "text", "text": "Read Cargo.toml"}]}]
def messages(stream):
    body = {"model": "smollm2", "max_tokens": 24, "temperature": 0, "stream": stream,
            "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}],
            "tools": a_tools, "messages": msgs}
    return post("/v1/messages", body, stream)
messages(False)
msgs.append({"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "Cargo.toml"}}]})
msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "[package]\nname = \"demo\"\n"}]})
messages(True)
msgs.append({"role": "assistant", "content": [{"type": "text", "text": "It names the package demo."}]})
msgs.append({"role": "user", "content": "Add a dependency on serde."})
messages(False)
print("drive: done", file=sys.stderr)
