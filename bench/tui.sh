#!/usr/bin/env bash
# The TUI benchmark (BENCHMARKS.md, "TUI"), at two sizes and on two kinds of traffic:
#   - generated interleaved agents (crates/workload), RECORDS records (default 20000);
#   - the real llama.cpp recording parallel-nocache.jsonl replicated to BIG records (default
#     100000, 405 MB) by bench/make_big_recording.py.
# For each, examples/tui_bench.rs runs what `replay --instant` runs (a reader thread, the live
# engine on its thread, the real app loop on a 120x40 TestBackend) while a typist thread sends a
# key every 20 ms across the replay, then `q`: key latency (taken in-process, from the loop
# taking a key to the end of the draw that shows it), q → exit, snapshot build cost, how long a
# record waited to be in a published snapshot, push cost per record, peak RSS.
# Then the real binary in tmux on the big file: time to the first screen, `q` pressed in the
# middle of the replay → the shell prompt, and CPU use while idle after the replay.
#
#   bash bench/tui.sh [RECORDS [BIG]]      WORK=/tmp/prefixscope-analysis-bench
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20000}
big=${2:-100000}
work=${WORK:-/tmp/prefixscope-analysis-bench}
mkdir -p "$work"
cargo build --release --example tui_bench --example workload >/dev/null 2>&1
cargo build --release >/dev/null 2>&1
generated=$work/w$n.jsonl
[ -s "$generated" ] || target/release/examples/workload --records "$n" --seed 1 -o "$generated" >&2
real=$work/parallel-nocache-x$big.jsonl
[ -s "$real" ] || python3 bench/make_big_recording.py \
    recordings/llmp/llama.cpp/parallel-nocache.jsonl "$real" "$big" >&2

echo "== in-process (examples/tui_bench.rs)"
target/release/examples/tui_bench "$generated" 300
target/release/examples/tui_bench "$real" 300

echo "== the binary in tmux: first screen, q in the middle of the replay, idle CPU"
socket=prefixscope-bench-$$
trap 'tmux -L "$socket" kill-server 2>/dev/null || true' EXIT
now_ms() { date +%s%3N; }
start=$(now_ms)
tmux -L "$socket" -f /dev/null new-session -d -x 120 -y 40 \
    "$PWD/target/release/prefixscope replay --instant $real; echo EXITED; sleep 600"
until tmux -L "$socket" capture-pane -p | grep -q "Conversations"; do sleep 0.02; done
first=$(( $(now_ms) - start ))
sleep 3
tmux -L "$socket" send-keys q
pressed=$(now_ms)
until tmux -L "$socket" capture-pane -p | grep -q "EXITED"; do sleep 0.02; done
quit=$(( $(now_ms) - pressed ))
tmux -L "$socket" kill-server
echo "{\"first_screen_ms\": $first, \"q_to_prompt_ms\": $quit, \"records\": $big}"

tmux -L "$socket" -f /dev/null new-session -d -x 120 -y 40 "$PWD/target/release/prefixscope replay --instant $real"
for _ in $(seq 1 600); do
    tmux -L "$socket" capture-pane -p | grep -q "replay finished" && break
    sleep 1
done
pid=$(pgrep -x -f "$PWD/target/release/prefixscope replay --instant $real" | head -1)
peak=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
sleep 3
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
hz=$(getconf CLK_TCK)
before=$(ticks)
sleep 10
after=$(ticks)
echo "{\"idle_cpu_percent_over_10s\": $(echo "scale=2; ($after - $before) * 100 / $hz / 10" | bc), \"peak_rss_mib\": $((peak / 1024)), \"records\": $big}"
