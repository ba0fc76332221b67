#!/usr/bin/env python3
"""What the server's layout costs the server: the `/apply-template` and `/tokenize` requests
`record` and `watch` send for each chat request, timed against that request's own prefill.

Usage: layout_cost.py BASE_URL [ROUNDS [WORDS...]]
  BASE_URL  a llama.cpp server (tests/llama/xllamacpp_serve.py MODEL PORT 1 40960)
  WORDS     system prompt sizes in words (default 900 26000: about 1k and 27k tokens)
For prompts of about 1k and 30k tokens: the chat request (cold: a new system prompt each round,
so its prefill is whole), then the layout's requests as prefixscope sends them (render with the
tools, tokenize with pieces, render without the tools to weigh them, tokenize that), each timed
by the wall clock; the prefill by the server's own `timings.prompt_ms`. Prints one line per
size: the medians and their ratio. Only the standard library.
"""
import json, statistics, sys, time, urllib.request

BASE = sys.argv[1].rstrip("/")
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
WORDS = ("the parser reads each key and reports the line where a value is missing so the "
         "error names both the key and the file ").split()


def post(path, body):
    request = urllib.request.Request(BASE + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=3600) as response:
        value = json.loads(response.read())
    return value, (time.perf_counter() - started) * 1000.0


def text(words, salt):
    return f"Round {salt}. " + " ".join(WORDS[i % len(WORDS)] for i in range(words))


def one(words, salt):
    messages = [{"role": "system", "content": text(words, salt)},
                {"role": "user", "content": "Where is the missing key reported?"}]
    reply, _ = post("/v1/chat/completions", {"messages": messages, "tools": TOOLS,
                                             "max_tokens": 1, "temperature": 0})
    prefill = reply["timings"]["prompt_ms"]
    prompt_tokens = reply["usage"]["prompt_tokens"]
    layout = 0.0
    rendered, ms = post("/apply-template", {"messages": messages, "tools": TOOLS})
    layout += ms
    _, ms = post("/tokenize", {"content": rendered["prompt"], "with_pieces": True})
    layout += ms
    bare, ms = post("/apply-template", {"messages": messages})
    layout += ms
    _, ms = post("/tokenize", {"content": bare["prompt"]})
    layout += ms
    return prompt_tokens, prefill, layout


for words in [int(w) for w in sys.argv[3:]] or [900, 26000]:
    rows = [one(words, f"{words}-{r}-{time.time_ns()}") for r in range(ROUNDS)]
    tokens = statistics.median(r[0] for r in rows)
    prefill = statistics.median(r[1] for r in rows)
    layout = statistics.median(r[2] for r in rows)
    print(f"{tokens:>7,.0f} prompt tokens: prefill {prefill:>9.1f} ms, layout {layout:>6.1f} ms "
          f"({100 * layout / prefill:.2f}% of the prefill), {ROUNDS} rounds")
