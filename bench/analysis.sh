#!/usr/bin/env bash
# The analysis benchmark (BENCHMARKS.md, "Analysis"): generated traffic of interleaved agents
# completing out of start order, analysed by prefixscope (parse, normalization, batch analysis
# and incremental push, each in its own process) and, up to LLMP_MAX records, by `llmp analyze`
# (cargo install llmp --version 0.1.0), side by side.
#
#   bash bench/analysis.sh [SIZES...]     default: 2400 9600 100000
#   LLMP_MAX=10000 WORK=/tmp/prefixscope-analysis-bench
set -euo pipefail
cd "$(dirname "$0")/.."
sizes=("${@:-2400 9600 100000}")
read -r -a sizes <<<"${sizes[*]}"
work=${WORK:-/tmp/prefixscope-analysis-bench}
llmp_max=${LLMP_MAX:-10000}
mkdir -p "$work"
cargo build --release --example analysis_bench --example workload >/dev/null 2>&1
bin=target/release/examples
for n in "${sizes[@]}"; do
    file=$work/w$n.jsonl
    [ -s "$file" ] || "$bin/workload" --records "$n" --seed 1 -o "$file" >&2
    for mode in parse normalize batch incremental; do
        /usr/bin/time -f "{\"max_rss_mib\": %M}" -o "$work/time.json" \
            "$bin/analysis_bench" "$file" "$mode" >"$work/out.json"
        python3 - "$work/out.json" "$work/time.json" <<'PY'
import json, sys
out = json.load(open(sys.argv[1]))
out["max_rss_mib"] = round(json.load(open(sys.argv[2]))["max_rss_mib"] / 1024, 1)
print(json.dumps(out))
PY
    done
    if [ "$n" -le "$llmp_max" ] && command -v llmp >/dev/null; then
        start=$(date +%s.%N)
        /usr/bin/time -f "%M" -o "$work/llmp.rss" llmp analyze "$file" >/dev/null 2>&1 || true
        end=$(date +%s.%N)
        echo "{\"tool\": \"llmp analyze\", \"records\": $n, \"wall_s\": $(echo "$end - $start" | bc), \"max_rss_mib\": $(( $(cat "$work/llmp.rss") / 1024 ))}"
    fi
done
