#!/usr/bin/env bash
# The whole cache profile of the Mooncake conversation trace (12,031 requests, 512-token blocks:
# FIFO, LRU and optimal at 32 … 32,768 blocks, the ceiling, the leaderboards), side by side:
#
#   prefixscope profile          (release build of this repository)
#   kvcache-simulator run        (kvcache.ai, C++ backend; `pip install kvcache-simulator`)
#   llmtrafficlens profile       (`pip install llmtrafficlens`; flat LRU at 7 sizes + leaderboards)
#
# Each is run RUNS times (default 5), interleaved, after one untimed run (kvcache-simulator
# compiles its C++ core on first use); the table gives the median wall time, the median CPU time
# (user + system of all threads and children) and the largest peak RSS, each run measured by
# getrusage of its own parent. The script also checks that prefixscope's and
# kvcache-simulator's figures agree to the token.
#
# Usage: bash bench/cache.sh [RUNS]
#   PS_COMPARE_BIN=<a built prefixscope, e.g. an earlier commit's> adds it as a fourth tool,
#   interleaved with the others and checked to give the same report.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-5}
for tool in kvcache-simulator llmtrafficlens; do
    command -v "$tool" >/dev/null || { echo "missing $tool: pip install kvcache-simulator llmtrafficlens" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trace="$work/conversation_trace.jsonl"
gzip -dc tests/data/mooncake/conversation_trace.jsonl.gz > "$trace"
cargo build --release --quiet
prefixscope=$PWD/target/release/prefixscope
compare=${PS_COMPARE_BIN:-}
if [ -n "$compare" ]; then
    [ -x "$compare" ] || { echo "PS_COMPARE_BIN $compare is not an executable" >&2; exit 1; }
    cp "$compare" "$work/ps-compare"
fi

# GLM-5.2 caches 95,232 bytes per token: a 512-token block is 93 × 2^19 bytes, so
# blocks × 93 / 2048 GiB is exact and floors back to 32, 128, 512, 2048, 8192, 32768 blocks.
budgets=1.453125,5.8125,23.25,93,372,1488

commands=(
    "prefixscope|$prefixscope profile $trace --format mooncake --block-size 512 --policies fifo,lru,optimal --capacities 32b,128b,512b,2048b,8192b,32768b -o $work/prefixscope.json"
    "kvcache-simulator (C++)|kvcache-simulator run --trace $trace --model glm-5.2 --block-size 512 --budgets-gib $budgets --policies fifo,lru,optimal --backend cpp --no-progress --format json -o $work/kvcache.json"
    "llmtrafficlens|llmtrafficlens profile $trace --format mooncake -o $work/ltl"
)
if [ -n "$compare" ]; then
    commands+=("prefixscope (PS_COMPARE_BIN)|$work/ps-compare profile $trace --format mooncake --block-size 512 --policies fifo,lru,optimal --capacities 32b,128b,512b,2048b,8192b,32768b -o $work/compare.json")
fi

for entry in "${commands[@]}"; do
    (cd "$work" && ${entry#*|} >/dev/null 2>&1) # untimed: compiles, warms the page cache
done
# Interleaved: round i runs every tool once, so a change in the machine's load between rounds
# weighs on all of them alike. Each run is timed by its own parent (wall from a monotonic clock,
# CPU and peak RSS from getrusage of that one child), to the microsecond: /usr/bin/time's
# hundredths of a second are a sixth of a 60 ms run.
python3 - "$runs" "$work" "${commands[@]}" > "$work/rows" <<'PY'
import os, resource, statistics, subprocess, sys, time
runs, work, entries = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
measure = """
import resource, subprocess, sys, time
start = time.perf_counter()
code = subprocess.call(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
wall = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(code, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss)
"""
figures = {entry: ([], [], []) for entry in entries}
for round in range(runs):
    # Each round starts with the next tool, so none always runs after the same one.
    for entry in entries[round % len(entries):] + entries[:round % len(entries)]:
        command = entry.split("|", 1)[1].split()
        out = subprocess.run([sys.executable, "-c", measure, *command], cwd=work,
                             capture_output=True, text=True, check=True).stdout.split()
        if out[0] != "0":
            sys.exit(f"{entry}: exit {out[0]}")
        for series, value in zip(figures[entry], out[1:]):
            series.append(float(value))
for entry, (walls, cpus, rss) in figures.items():
    name = entry.split("|", 1)[0]
    print(f"{name}|{statistics.median(walls):.4f}|{statistics.median(cpus):.4f}|{max(rss) / 1024:.0f}")
PY

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
rows = [line.strip().split("|") for line in open(f"{work}/rows")]
ours = next(r for r in rows if r[0] == "prefixscope")
print("| tool | wall (median, s) | CPU user+sys (median, s) | peak RSS (MiB) | wall vs prefixscope | CPU vs prefixscope |")
print("|---|---:|---:|---:|---:|---:|")
for name, wall, cpu, rss in rows:
    print(f"| {name} | {float(wall):.4f} | {float(cpu):.4f} | {rss} | "
          f"{float(wall) / float(ours[1]):.1f}× | {float(cpu) / float(ours[2]):.1f}× |")

# The figures agree to the token.
ps = json.load(open(f"{work}/prefixscope.json"))
kv = json.load(open(f"{work}/kvcache.json"))
assert ps["ceiling"]["hit_tokens"] == kv["ceiling"]["hitTokens"], "ceiling differs"
checked = 0
for point in kv["points"]:
    for policy, result in point["results"].items():
        ours = next(p for p in ps["points"]
                    if p["policy"] == policy and p["capacity_blocks"] == point["cacheBlocks"])
        assert ours["hit_tokens"] == result["hitTokens"], (policy, point["cacheBlocks"])
        assert ours["measured_tokens"] == result["totalTokens"]
        checked += 1
ltl = json.load(open(f"{work}/ltl.json"))
try:
    earlier = json.load(open(f"{work}/compare.json"))
    assert earlier == ps, "PS_COMPARE_BIN's report differs"
    print("\nPS_COMPARE_BIN's report is the same")
except FileNotFoundError:
    pass
print(f"\nprefixscope = kvcache-simulator on all {checked} points and the ceiling "
      f"({ps['ceiling']['hit_tokens']:,} of {ps['measured_tokens']:,} tokens); "
      f"llmtrafficlens ceiling {ltl['reuse_potential']['ceiling']:.2%}; "
      f"AIPerf rate {ps['aiperf_cache_hit_rate']!r}")
PY
