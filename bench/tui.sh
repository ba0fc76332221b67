#!/usr/bin/env bash
# The TUI benchmark (BENCHMARKS.md, "TUI"): `replay --instant` of a generated recording into the
# app state (push time per record, one view rebuild, frame time on a 120×40 TestBackend:
# examples/tui_bench.rs), then the real binary in tmux: its CPU use while idle after the replay.
#
#   bash bench/tui.sh [RECORDS]      default 100000; WORK=/tmp/prefixscope-analysis-bench
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-100000}
work=${WORK:-/tmp/prefixscope-analysis-bench}
mkdir -p "$work"
cargo build --release --example tui_bench --example workload >/dev/null 2>&1
cargo build --release >/dev/null 2>&1
file=$work/w$n.jsonl
[ -s "$file" ] || target/release/examples/workload --records "$n" --seed 1 -o "$file" >&2
target/release/examples/tui_bench "$file"

# Idle CPU: the replay is done, nothing arrives, the screen stands still.
socket=prefixscope-bench-$$
tmux -L "$socket" -f /dev/null new-session -d -x 120 -y 40 "$PWD/target/release/prefixscope replay --instant $file"
trap 'tmux -L "$socket" kill-server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
    tmux -L "$socket" capture-pane -p | grep -q "replay finished" && break
    sleep 1
done
pid=$(pgrep -f "prefixscope replay --instant $file" | head -1)
sleep 3
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
before=$(ticks)
sleep 10
after=$(ticks)
echo "{\"idle_cpu_percent_over_10s\": $(echo "scale=2; ($after - $before) * 100 / $hz / 10" | bc), \"records\": $n}"
