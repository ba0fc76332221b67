#!/usr/bin/env python3
"""Plays one scripted traffic scenario through a proxy in front of a llama.cpp server.

Usage: scenarios.py SCENARIO BASE_URL
  append      one agent appending five turns, replies of up to 64 tokens
  alternate   three agents taking turns (for one slot, host cache off), replies of 64 tokens
  short-first the same without tools, first turns at max_tokens 20 (as a title call looks)
  date        a 1,000-character system prompt whose last words (the date) change after 3 turns
  two-slots   three agents taking turns (for a server of two slots)
  tool-calls  one agent; after each answer the harness sends a call of read_file in its place,
              with the tool's result, then asks for the next answer
Only the standard library. No session ids: conversations are found from the messages, as for
a local server. Temperature 0; replies are never read by the tests, only counted.
"""
import json, sys, urllib.request

SCENARIO, BASE = sys.argv[1], sys.argv[2].rstrip("/")
UA = "prefixscope-scenarios/1"

TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the repository.",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]
QUESTIONS = [
    "Describe what a Rust crate's src/main.rs usually holds, in detail.",
    "Now explain what Cargo.toml declares and why each section matters.",
    "Write a paragraph on how unit tests are organised in a Rust project.",
    "Explain how cargo resolves dependency versions, step by step.",
    "Summarise everything so far as advice for a new contributor.",
]


def post(body):
    req = urllib.request.Request(BASE + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", "user-agent": UA})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read().decode())


def turn(messages, max_tokens=64, tools=True):
    body = {"model": "smollm2", "max_tokens": max_tokens, "temperature": 0, "messages": messages}
    if tools:
        body["tools"] = TOOLS
    reply = post(body)["choices"][0]["message"].get("content") or ""
    messages.append({"role": "assistant", "content": reply})


def system(name):
    return (f"You are {name}, a careful coding assistant for a small Rust repository. Answer in "
            "full sentences and explain your reasoning before any code.")


def agents(count, first_max_tokens=64, tools=True, rounds=3):
    convs = [[{"role": "system", "content": system(name)}]
             for name in ["Ada", "Brook", "Cyril"][:count]]
    for r in range(rounds):
        for i, messages in enumerate(convs):
            messages.append({"role": "user", "content": QUESTIONS[(r + i) % len(QUESTIONS)]})
            turn(messages, max_tokens=first_max_tokens if r == 0 else 64, tools=tools)


if SCENARIO == "append":
    messages = [{"role": "system", "content": system("Ada")}]
    for question in QUESTIONS:
        messages.append({"role": "user", "content": question})
        turn(messages)
elif SCENARIO == "alternate":
    agents(3)
elif SCENARIO == "short-first":
    agents(3, first_max_tokens=20, tools=False)
elif SCENARIO == "two-slots":
    agents(3)
elif SCENARIO == "date":
    rules = ("Follow the repository's conventions: rustfmt defaults, clippy clean, no unwrap on "
             "input, errors with context, tests beside the code they test, and short commit "
             "subjects. Prefer the standard library; add a dependency only when it removes real "
             "code. Keep functions short and names plain. When you change behaviour, say what "
             "changed and why in one or two sentences, and list the files you touched. Never "
             "invent a file's contents: read it first. When unsure, ask one precise question. ")
    head = system("Ada") + " " + rules * 2
    head = head[:1000 - len(" Today is Monday 7 December 2026.")]
    dated = lambda day: head + f" Today is {day}."
    messages = [{"role": "system", "content": dated("Monday 7 December 2026")}]
    for k, question in enumerate(QUESTIONS):
        if k == 3:
            messages[0] = {"role": "system", "content": dated("Tuesday 8 December 2026")}
        messages.append({"role": "user", "content": question})
        turn(messages)
elif SCENARIO == "tool-calls":
    # SmolLM2 calls no tools, so the harness's part is scripted: after each answer it sends
    # back a call of read_file in its place, with the tool's result (the template renders
    # such a call as an empty assistant message).
    messages = [{"role": "system", "content": system("Ada")}]
    for k, question in enumerate(QUESTIONS[:3]):
        messages.append({"role": "user", "content": question + " Read src/main.rs first."})
        post({"model": "smollm2", "max_tokens": 64, "temperature": 0, "messages": messages,
              "tools": TOOLS})
        call = {"id": f"call_{k}", "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": "src/main.rs"})}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"],
                         "content": f"fn main() {{ println!(\"turn {k}\"); }}"})
        turn(messages)
else:
    sys.exit(f"unknown scenario {SCENARIO}")
