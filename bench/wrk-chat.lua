-- wrk script for bench/proxy.sh: POST /v1/chat/completions with a small (~1 KB)
-- llama.cpp-style chat body. PS_BENCH_STREAM=1 sets "stream": true.
-- done() prints one machine-readable RESULT line (latencies in microseconds).

local stream = os.getenv("PS_BENCH_STREAM") == "1"

local system = "You are a coding agent working in a small Rust repository. "
  .. "Read files before changing them, keep changes minimal, and explain what you did "
  .. "in one or two sentences. Prefer the standard library; do not add dependencies "
  .. "unless asked. Run the tests after every change and report failures verbatim. "
  .. "When a tool call fails, say so and try a different approach instead of repeating it. "
  .. "Never print secrets or the contents of .env files. Keep answers short: the user "
  .. "reads them in a terminal. Today is Monday, 30 November 2026."

local user = "What does src/main.rs do, and is there anything obviously wrong with it? "
  .. "It collects the command-line arguments and prints how many there are; I think "
  .. "the count is off by one because it includes the program name. Please check and "
  .. "suggest the smallest fix, with a test if one fits."

wrk.method = "POST"
wrk.path = "/v1/chat/completions"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["User-Agent"] = "prefixscope-bench/1"
wrk.body = string.format(
  '{"model":"gemma","messages":[{"role":"system","content":"%s"},{"role":"user","content":"%s"}],'
  .. '"max_tokens":160,"temperature":0,"seed":1,"stream":%s}',
  system, user, stream and "true" or "false")

function done(summary, latency, requests)
  io.write(string.format(
    "RESULT requests=%d duration_us=%d bytes=%d connect=%d read=%d write=%d status=%d timeout=%d p50_us=%d p99_us=%d max_us=%d body_bytes=%d\n",
    summary.requests, summary.duration, summary.bytes,
    summary.errors.connect, summary.errors.read, summary.errors.write,
    summary.errors.status, summary.errors.timeout,
    math.floor(latency:percentile(50)), math.floor(latency:percentile(99)),
    math.floor(latency.max), #wrk.body))
end
