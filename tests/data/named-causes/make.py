"""Writes the named-cause fixtures (see README.md): python3 make.py"""
import json

SYSTEM = ("You are Claude Code, Anthropic's official CLI for Claude. You are an interactive agent that helps users with software engineering tasks. "
          "Use the instructions below and the tools available to you to assist the user. ") * 6
TOOLS = [
    {"name": "Read", "description": "Reads a file from the local filesystem. Give an absolute path.", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}},
    {"name": "Grep", "description": "A search tool built on ripgrep. Supports full regex syntax.", "input_schema": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]}},
    {"name": "Bash", "description": "Executes a bash command in a persistent shell session with an optional timeout.", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}},
]
QUESTIONS = ["Where does the config parser handle missing keys?",
             "Make the missing-key error name the key and the line number.",
             "Add a test for an empty value.",
             "Run the tests."]
ANSWERS = ["In src/config.rs, parse_line returns None for a missing key.",
           "Done: the error now reads `missing key {key} at line {line}`.",
           "Added test_empty_value in tests/config.rs.",
           "All 14 tests pass."]


def record(i, t, req, resp, ua):
    body, rbody = json.dumps(req), json.dumps(resp)
    return {"v": 1, "id": i, "conn": 1, "t_start_ms": t, "t_first_byte_ms": t + 400, "t_end_ms": t + 900,
            "request": {"method": "POST", "path": "/v1/messages", "headers": {"content-length": str(len(body)), "content-type": "application/json", "user-agent": ua}, "body_bytes": len(body), "body": req, "body_text": None, "digest": None},
            # Streamed, as Claude Code asks: the record keeps the merged message.
            "response": {"status": 200, "headers": {"content-type": "text/event-stream"}, "stream": "sse", "chunks": 6, "bad_chunks": 0, "body_bytes": len(rbody), "truncated": False, "body": resp, "body_text": None, "digest": None},
            "error": None, "tokens": None}


def prompt_of(i):
    return 1400 + 120 * i


def session(name, system_of, tools_of, cached_of):
    out, messages, t = [], [], 1796150000000
    for i, (q, a) in enumerate(zip(QUESTIONS, ANSWERS), start=1):
        messages.append({"role": "user", "content": [{"type": "text", "text": q}]})
        req = {"model": "claude-sonnet-4-5", "max_tokens": 32000, "system": system_of(i), "tools": tools_of(i), "messages": list(messages), "stream": False}
        prompt, cached = prompt_of(i), cached_of(i)
        resp = {"id": f"msg_{i:04d}", "type": "message", "role": "assistant", "model": "/models/qwen2.5-coder-7b-q4_k_m.gguf",
                "content": [{"type": "text", "text": a}], "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": prompt - cached, "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0, "output_tokens": 20}}
        out.append(record(i, t, req, resp, "claude-cli/2.1.197 (external, cli)"))
        messages.append({"role": "assistant", "content": [{"type": "text", "text": a}]})
        t += 20000
    with open(name, "w") as f:
        f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in out))


# Claude Code's attribution line changes on every request: nothing after it is reused.
session("claude-code-attribution.jsonl",
        lambda i: [{"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.197.c4e; cc_entrypoint=cli; cch={(i * 7919) % 65536:04x};"},
                   {"type": "text", "text": SYSTEM}],
        lambda i: TOOLS,
        lambda i: 0 if i == 1 else 12)
# The same three tools in another order from the third request on (an MCP reconnect).
session("tools-reordered.jsonl",
        lambda i: [{"type": "text", "text": SYSTEM}],
        lambda i: TOOLS if i < 3 else [TOOLS[2], TOOLS[0], TOOLS[1]],
        lambda i: 0 if i in (1, 3) else prompt_of(i - 1))


def chat_record(i, t, req, resp):
    body, rbody = json.dumps(req), json.dumps(resp)
    return {"v": 1, "id": i, "conn": 1, "t_start_ms": t, "t_first_byte_ms": t + 400, "t_end_ms": t + 900,
            "request": {"method": "POST", "path": "/v1/chat/completions", "headers": {"content-length": str(len(body)), "content-type": "application/json", "user-agent": "OpenAI/Python 2.20.0"}, "body_bytes": len(body), "body": req, "body_text": None, "digest": None},
            "response": {"status": 200, "headers": {"content-type": "application/json"}, "stream": None, "chunks": None, "bad_chunks": None, "body_bytes": len(rbody), "truncated": False, "body": resp, "body_text": None, "digest": None},
            "error": None, "tokens": None}


# A client that sends its replies back with their reasoning_content on the next turn, and
# without it on the one after: the messages' identities match (llmp's leave reasoning out),
# the server's template renders the reasoning, and it keeps only the system prompt.
def reasoning_session(name):
    system = {"role": "system", "content": "You are a careful coding assistant. " * 20}
    turns = [("Where is the config parsed?", "In src/config.rs.", "The user asks where the config is parsed; the parser lives in src/config.rs, so answer that."),
             ("And the errors?", "In src/error.rs.", "Errors are defined in src/error.rs; name the file."),
             ("Thanks, anything else?", "No.", "Nothing else to add.")]
    prompts, cached = [180, 260, 330], [0, 250, 40]
    out, history, t = [], [system], 1796160000000
    for i, ((q, a, r), prompt, reuse) in enumerate(zip(turns, prompts, cached), start=1):
        history.append({"role": "user", "content": q})
        req = {"model": "qwen3", "messages": [dict(m) for m in history]}
        resp = {"id": f"chatcmpl-{i}", "object": "chat.completion", "created": 1796160000 + i, "model": "/models/Qwen3-8B-Q4_K_M.gguf",
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": a, "reasoning_content": r}}],
                "usage": {"prompt_tokens": prompt, "completion_tokens": 30, "total_tokens": prompt + 30},
                "timings": {"cache_n": reuse, "prompt_n": prompt - reuse, "prompt_ms": (prompt - reuse) * 2.0, "predicted_n": 30, "predicted_ms": 600.0}}
        out.append(chat_record(i, t, req, resp))
        history.append({"role": "assistant", "content": a, "reasoning_content": r})
        # From the third request on the client sends earlier replies without their reasoning.
        if i == 2:
            for m in history:
                m.pop("reasoning_content", None)
        t += 20000
    with open(name, "w") as f:
        f.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in out))


reasoning_session("reasoning-dropped.jsonl")
