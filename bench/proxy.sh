#!/usr/bin/env bash
# Proxy-overhead benchmark: prefixscope vs llmp vs direct, in front of a fast fake LLM server.
#
#   bash bench/proxy.sh
#
# What it does (see BENCHMARKS.md for the results and how to read them):
#   1. cargo build --release once, before any measurement.
#   2. nginx (own config in a temp dir, 1 worker, 127.0.0.1 only) as the fake llama.cpp server:
#        127.0.0.1:18480  POST /v1/chat/completions -> fixed chat.completion JSON (application/json)
#        127.0.0.1:18479  POST /v1/chat/completions -> fixed SSE stream (text/event-stream, chunked):
#                         4 `data: {...}` chunk events and `data: [DONE]`
#      Two ports, not two paths, because llmp takes only HOST:PORT as its upstream: this way the
#      three targets send exactly the same request to exactly the same path.
#   3. Proxies, each recording full bodies to a file in the temp dir:
#        prefixscope record --upstream http://127.0.0.1:PORT --listen 127.0.0.1:18481 -o FILE --quiet
#        llmp proxy --upstream 127.0.0.1:PORT --listen 127.0.0.1:18482 --out FILE
#      and "direct" (wrk straight to nginx).
#   4. wrk + bench/wrk-chat.lua (POST, ~1 KB chat body), per mode (non-streamed, streamed), the
#      three targets interleaved: a 2 s warm-up (2 threads, 64 connections) of each; then
#      ROUNDS x (1 connection / 1 thread / 10 s --latency of each) -> median p50, p99; then one
#      more 1-connection run of each with everything pinned to CPU 0 (a diagnostic: no cross-vCPU
#      wake-ups); then ROUNDS x (64 connections / 2 threads / 10 s of each) -> median requests/s.
#      Each run also notes the CPU time of the target's processes, of wrk, and of anything else
#      on the machine (from /proc/stat), and whether a compiler was running.
#      The machine may be shared (another session compiling on the same 2 cores): before each run
#      the script waits (up to QUIET_WAIT s) until no compiler runs; a run during which a compiler
#      was seen, other processes used > OTHER_MAX_PCT % of the machine's CPU, or the hypervisor
#      stole > STEAL_MAX_PCT %, is run again (up to RETRIES times); the discarded attempt still
#      counts for the records check.
#   5. Each proxy is stopped with SIGINT and waited for; the lines of its recording are compared
#      with the requests wrk counted as completed through it (all its runs, warm-up included,
#      plus the one curl check request).
#   6. Prints a table and the checks against the aims.
#
# Environment knobs (defaults are the documented benchmark): DURATION=10 WARMUP=2 CONNS=64
# THREADS=2 ROUNDS=3 QUIET_WAIT=900 RETRIES=3 OTHER_MAX_PCT=10 STEAL_MAX_PCT=5 PS_FLAGS= (extra flags for
# `prefixscope record`, e.g. --no-probe) PS_COMPARE_BIN= (a built binary, e.g. an earlier commit's:
# the fourth target below runs it instead of this tree's build) PS_COMPARE_FLAGS= (when set, or
# PS_COMPARE_BIN is, a fourth target,
# `ps-compare`: a second `prefixscope record` with these flags, e.g. "--metrics 127.0.0.1:9464",
# interleaved with the others in every round, so the two prefixscopes are compared in one run)
# PROXY_BOUND=0 (1 adds a fifth target, `nginx-proxy`: a second nginx, 2 workers, proxy_pass with
# kept-alive upstream connections, recording nothing: what the machine lets any HTTP/1 proxy
# reach here, the bound on the throughput aim; its ratio to llmp is printed with the aims)
# KEEP=0 (1 keeps the recordings;
# the wrk logs, proxy logs and results.tsv are always kept in the work dir, printed at the end).
set -euo pipefail
PS_FLAGS=${PS_FLAGS:-}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CONNS=${CONNS:-64}
THREADS=${THREADS:-2}
KEEP=${KEEP:-0}
ROUNDS=${ROUNDS:-3}
PORT_PLAIN=18480 # fake server, non-streamed
PORT_SSE=18479   # fake server, streamed
PORT_PS=18481    # prefixscope
PORT_LLMP=18482  # llmp
PORT_PS2=18483   # prefixscope with PS_COMPARE_FLAGS
PORT_BOUND=18484 # nginx as a plain reverse proxy (PROXY_BOUND=1), 18485 for the stream
PROXY_BOUND=${PROXY_BOUND:-0}
PS_COMPARE_FLAGS=${PS_COMPARE_FLAGS:-}
PS_COMPARE_BIN=${PS_COMPARE_BIN:-}
LUA="$ROOT/bench/wrk-chat.lua"
PS_BIN="$ROOT/target/release/prefixscope"
LLMP_BIN=${LLMP_BIN:-$(command -v llmp || echo "$HOME/.cargo/bin/llmp")}

say() { printf '%s\n' "$*" >&2; }
die() { say "proxy.sh: $*"; exit 1; }

for tool in nginx wrk curl ss awk cargo taskset pgrep git; do
    command -v "$tool" >/dev/null || die "$tool not found"
done
[ -x "$LLMP_BIN" ] || die "llmp not found (cargo install llmp)"
[ -x /usr/bin/time ] || die "/usr/bin/time (GNU time) not found"
[ -f "$LUA" ] || die "$LUA missing"
for port in $PORT_PLAIN $PORT_SSE $PORT_PS $PORT_LLMP; do
    if ss -Hltn "sport = :$port" | grep -q .; then
        die "port $port is already in use (a previous run still alive?)"
    fi
done

# --- 1. build, once, before anything is measured ------------------------------------------------
say "== cargo build --release (waits if another cargo holds the build lock)"
T_START=$(date +%s)
LOAD0=$(cut -d" " -f1-3 /proc/loadavg)
(cd "$ROOT" && cargo build --release)
[ -x "$PS_BIN" ] || die "$PS_BIN not built"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/prefixscope-bench.XXXXXX")
# Run a copy: another session's cargo may replace target/release/prefixscope while we measure.
cp "$PS_BIN" "$WORK/prefixscope"
PS_BIN="$WORK/prefixscope"
PS2_BIN="$PS_BIN"
if [ -n "$PS_COMPARE_BIN" ]; then
    [ -x "$PS_COMPARE_BIN" ] || die "PS_COMPARE_BIN $PS_COMPARE_BIN is not an executable"
    cp "$PS_COMPARE_BIN" "$WORK/ps-compare"
    PS2_BIN="$WORK/ps-compare"
fi
PIDS=()
WRK_PID=""
cleanup() {
    local pid
    [ -z "$WRK_PID" ] || kill -INT "$WRK_PID" 2>/dev/null || true
    for pid in "${PIDS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            kill -INT "$pid" 2>/dev/null || true
        fi
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [ "$KEEP" != 1 ]; then
        rm -f "$WORK"/*.jsonl "$WORK/prefixscope"
    fi
    say "work dir (wrk logs, proxy logs): $WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_port() { # port pid
    local i
    for i in $(seq 1 100); do
        ss -Hltn "sport = :$1" | grep -q . && return 0
        kill -0 "$2" 2>/dev/null || die "process $2 (port $1) exited; see $WORK/*.log"
        sleep 0.05
    done
    die "nothing listening on port $1"
}

# stop_proc pid: SIGINT, wait for the exit (so recordings are complete), forget the pid.
stop_proc() {
    local pid=$1 rc=0 p rest=()
    kill -INT "$pid" 2>/dev/null || true
    wait "$pid" || rc=$?
    for p in "${PIDS[@]}"; do [ "$p" = "$pid" ] || rest+=("$p"); done
    PIDS=("${rest[@]+"${rest[@]}"}")
    return $rc
}

cpu_ticks() { # utime+stime of a pid, in clock ticks
    awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0
}

compilers() { # running compilers (anyone's), e.g. "cargo x1 rustc x2"
    pgrep -x 'rustc|cargo|cc1|cc1plus|ld|ld.lld|cc' 2>/dev/null | while read -r p; do cat "/proc/$p/comm" 2>/dev/null; done |
        sort | uniq -c | awk '{printf "%s%s x%d", (NR > 1 ? " " : ""), $2, $1}' || true
}
wait_quiet() { # max seconds: until no compiler runs (another session may share the cores)
    local waited=0
    while [ -n "$(compilers)" ] && [ "$waited" -lt "$1" ]; do
        [ "$waited" = 0 ] && say "   (waiting up to ${1}s for other compilers to finish: $(compilers))"
        sleep 5
        waited=$((waited + 5))
    done
}
QUIET_WAIT=${QUIET_WAIT:-900}
CLK_TCK=$(getconf CLK_TCK)
RETRIES=${RETRIES:-3}
OTHER_MAX_PCT=${OTHER_MAX_PCT:-10}
STEAL_MAX_PCT=${STEAL_MAX_PCT:-5}
NCPU=$(nproc)
wait_quiet "$QUIET_WAIT"
LOAD1=$(cut -d" " -f1-3 /proc/loadavg)

# --- 2. nginx as the fake llama.cpp server --------------------------------------------------------
mkdir -p "$WORK/nginx/logs"
# Bodies are nginx single-quoted strings: \n is a newline, no ' and no $ inside.
JSON_BODY='{"choices":[{"finish_reason":"stop","index":0,"message":{"role":"assistant","content":"It prints the number of command-line arguments, including the program name, so the count is one more than the arguments given. Use std::env::args().skip(1).count() if you want only the arguments."}}],"created":1789988971,"model":"gemma-4-E2B-it-qat-UD-Q4_K_XL.gguf","system_fingerprint":"b10015-5d3321c","object":"chat.completion","usage":{"completion_tokens":44,"prompt_tokens":262,"total_tokens":306,"prompt_tokens_details":{"cached_tokens":198}},"id":"chatcmpl-A1wHROB5EJMIBkfxAlKqpus9nYwfB681","timings":{"cache_n":198,"prompt_n":64,"prompt_ms":41.873,"prompt_per_token_ms":0.654265625,"prompt_per_second":1528.4312,"predicted_n":44,"predicted_ms":371.912,"predicted_per_token_ms":8.45254545,"predicted_per_second":118.3075}}'
SSE_HEAD='"created":1789988971,"id":"chatcmpl-A1wHROB5EJMIBkfxAlKqpus9nYwfB681","model":"gemma-4-E2B-it-qat-UD-Q4_K_XL.gguf","system_fingerprint":"b10015-5d3321c","object":"chat.completion.chunk"'
SSE_BODY="data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}],$SSE_HEAD}\\n\\n"
SSE_BODY+="data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\"It prints the number of command-line arguments, including the program name.\"}}],$SSE_HEAD}\\n\\n"
SSE_BODY+="data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\" Use std::env::args().skip(1).count() for the arguments only.\"}}],$SSE_HEAD}\\n\\n"
SSE_BODY+="data: {\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"delta\":{}}],$SSE_HEAD,\"usage\":{\"completion_tokens\":30,\"prompt_tokens\":262,\"total_tokens\":292,\"prompt_tokens_details\":{\"cached_tokens\":198}},\"timings\":{\"cache_n\":198,\"prompt_n\":64,\"prompt_ms\":41.873,\"prompt_per_token_ms\":0.654265625,\"prompt_per_second\":1528.4312,\"predicted_n\":30,\"predicted_ms\":253.576,\"predicted_per_token_ms\":8.45253333,\"predicted_per_second\":118.3077}}\\n\\n"
SSE_BODY+='data: [DONE]\n\n'

cat >"$WORK/nginx/nginx.conf" <<EOF
# Fake llama.cpp server for bench/proxy.sh (generated; not the system config).
worker_processes 1;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    client_body_buffer_size 64k;
    client_body_temp_path $WORK/nginx/body;
    proxy_temp_path $WORK/nginx/proxy;
    fastcgi_temp_path $WORK/nginx/fastcgi;
    uwsgi_temp_path $WORK/nginx/uwsgi;
    scgi_temp_path $WORK/nginx/scgi;
    server_tokens off;

    server { # non-streamed
        listen 127.0.0.1:$PORT_PLAIN;
        location = /v1/chat/completions {
            default_type application/json;
            return 200 '$JSON_BODY';
        }
        location / { return 404; }
    }

    server { # streamed
        listen 127.0.0.1:$PORT_SSE;
        location = /v1/chat/completions {
            default_type text/event-stream;
            add_header Cache-Control no-cache;
            # A sub_filter that never matches: it only drops Content-Length, so the stream goes
            # out with Transfer-Encoding: chunked like llama.cpp's.
            sub_filter_types text/event-stream;
            sub_filter 'never-matches-8d1f' '';
            return 200 '$SSE_BODY';
        }
        location / { return 404; }
    }
}
EOF
say "== nginx (fake server) on 127.0.0.1:$PORT_PLAIN (json) and 127.0.0.1:$PORT_SSE (sse)"
nginx -t -q -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/logs/error.log"
nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/logs/error.log" \
    >"$WORK/nginx.log" 2>&1 &
NGINX_PID=$!
PIDS+=("$NGINX_PID")
wait_port $PORT_PLAIN $NGINX_PID
wait_port $PORT_SSE $NGINX_PID

# --- 3./4. the runs ----------------------------------------------------------------------------
# results.tsv, one line per wrk run:
#  1 mode  2 target  3 kind (warmup|c1|c1pin|cN)  4 round  5 requests  6 duration_us  7 p50_us
#  8 p99_us  9 connect 10 read 11 write 12 status(non-2xx) 13 timeout 14 target_cpu_ticks
# 15 wrk_cpu_ticks 16 other_cpu_ticks 17 steal_ticks 18 body_bytes 19 max_us 20 attempt
# 21 state: ok | disturbed (last attempt, still disturbed) | retried (discarded, run again)
RESULTS="$WORK/results.tsv"
: >"$RESULTS"
# counts.tsv: mode target records records_200 client_disconnected wrk_completed(+curl) max_in_flight proxy_exit
COUNTS="$WORK/counts.tsv"
: >"$COUNTS"
ALL_CPUS="0-$((NCPU - 1))"
KIND_N="c$CONNS"


# CPU time of each thread of a process, by thread name (where a proxy spends its CPU).
thread_cpu() { # pid label
    local t
    for t in /proc/"$1"/task/*; do # the main thread is called "main", the others by their name
        printf '%s\t%s\n' "$([ "${t##*/}" = "$1" ] && echo main || cat "$t/comm")" "$(awk '{print $14 + $15}' "$t/stat")"
    done | awk -v l="$2" -v tck="$CLK_TCK" '{ s[$1] += $2; n[$1]++ }
        END { printf "   %s CPU by thread:", l; for (k in s) printf " %s(x%d) %.2fs", k, n[k], s[k] / tck; print "" }' >&2
}

cpu_ticks() { # utime+stime of a pid (all its threads), in clock ticks
    awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0
}
sys_ticks() { # machine-wide "user+nice+system+irq+softirq steal" in clock ticks (/proc/stat is
    # not namespaced; a process's stime includes the softirq work done in its context)
    awk '$1 == "cpu" {print $2 + $3 + $4 + $7 + $8, $9}' /proc/stat
}

url_of() { # target
    case $1 in
        direct) echo "http://127.0.0.1:$UPSTREAM_PORT/v1/chat/completions" ;;
        llmp) echo "http://127.0.0.1:$PORT_LLMP/v1/chat/completions" ;;
        prefixscope) echo "http://127.0.0.1:$PORT_PS/v1/chat/completions" ;;
        ps-compare) echo "http://127.0.0.1:$PORT_PS2/v1/chat/completions" ;;
        nginx-proxy) echo "http://127.0.0.1:$BOUND_PORT/v1/chat/completions" ;;
    esac
}
pids_of() { # target -> the processes that serve the target's requests
    case $1 in
        direct) echo "$NGINX_WORKER" ;;
        llmp) echo "$LLMP_PID $NGINX_WORKER" ;;
        prefixscope) echo "$PS_PID $NGINX_WORKER" ;;
        ps-compare) echo "$PS2_PID $NGINX_WORKER" ;;
        nginx-proxy) echo "$BOUND_WORKERS $NGINX_WORKER" ;;
    esac
}
own_pids() { # target -> the processes whose CPU is the target's own (not the fake server's)
    case $1 in
        nginx-proxy) echo "$BOUND_WORKERS" ;; # both of its workers
        *) pids_of "$1" | cut -d' ' -f1 ;;
    esac
}
own_ticks() { # target
    local pid sum=0
    for pid in $(own_pids "$1"); do sum=$((sum + $(cpu_ticks "$pid"))); done
    echo "$sum"
}
pin_all() { # cpu list: nginx worker and both proxies, all threads
    local pid
    for pid in "$NGINX_WORKER" "$PS_PID" "$LLMP_PID" ${PS2_PID:+"$PS2_PID"} $BOUND_WORKERS; do taskset -apc "$1" "$pid" >/dev/null; done
}

# One wrk run. Another session may compile on the same cores: before each attempt we wait for
# its compilers to finish, during the attempt we look for them every second, and we compare the
# machine's CPU time (/proc/stat) with what wrk, nginx and the proxy used. A disturbed attempt
# (a compiler seen, or "other" CPU above OTHER_MAX of the machine) is kept in results.tsv but
# marked "retried" and run again, up to RETRIES times; the last attempt counts either way.
run_wrk() { # mode target kind round threads conns duration cpus
    local mode=$1 target=$2 kind=$3 round=$4 threads=$5 conns=$6 dur=$7 cpus=$8
    local log="$WORK/wrk-$mode-$target-$kind-$round.txt" main pid t0 t1 s0 s1 st0 st1 line
    local attempt=0 wpid seen c i wu ws wrk_t other state
    while :; do
        attempt=$((attempt + 1))
        wait_quiet "$QUIET_WAIT"
        t0=0; for pid in $(pids_of "$target"); do t0=$((t0 + $(cpu_ticks "$pid"))); done
        c0=$(own_ticks "$target")
        read -r s0 st0 < <(sys_ticks)
        PS_BENCH_STREAM=$STREAM /usr/bin/time -f '%U %S' -o "$WORK/wrk.time" \
            taskset -c "$cpus" wrk -t"$threads" -c"$conns" -d"${dur}s" --latency \
            -s "$LUA" "$(url_of "$target")" >"$log" 2>&1 &
        wpid=$!
        WRK_PID=$wpid
        seen=""
        for ((i = 0; i < dur; i++)); do
            sleep 1
            c=$(compilers)
            [ -z "$c" ] || seen=$c
        done
        wait "$wpid" || die "wrk failed; see $log"
        WRK_PID=""
        read -r s1 st1 < <(sys_ticks)
        c1=$(own_ticks "$target")
        t1=0; for pid in $(pids_of "$target"); do t1=$((t1 + $(cpu_ticks "$pid"))); done
        read -r wu ws <"$WORK/wrk.time"
        wrk_t=$(awk -v u="$wu" -v s="$ws" -v tck="$CLK_TCK" 'BEGIN { printf "%d", (u + s) * tck + 0.5 }')
        # /proc/stat is sampled at ticks and under-counts a CPU that idles often (1-connection
        # ping-pong), so "other" can come out negative there; it is a heuristic, not an account.
        other=$(((s1 - s0) - (t1 - t0) - wrk_t))
        state=ok
        if [ -n "$seen" ] || [ "$other" -gt $((OTHER_MAX_PCT * dur * NCPU * CLK_TCK / 100)) ] ||
            [ $((st1 - st0)) -gt $((STEAL_MAX_PCT * dur * NCPU * CLK_TCK / 100)) ]; then
            state=disturbed
            echo "$mode $target $kind round $round attempt $attempt: other CPU $((other * 1000 / CLK_TCK)) ms, steal $(((st1 - st0) * 1000 / CLK_TCK)) ms${seen:+, compilers: $seen}" >>"$WORK/busy.txt"
            [ "$attempt" -gt "$RETRIES" ] || state=retried
        fi
        line=$(grep '^RESULT ' "$log") || die "no RESULT line in $log"
        cp "$log" "${log%.txt}.attempt$attempt.txt"
        echo "$line" | awk -v m="$mode" -v t="$target" -v k="$kind" -v r="$round" -v cpu=$((c1 - c0)) \
            -v wrk="$wrk_t" -v other="$other" -v steal=$((st1 - st0)) -v a="$attempt" -v st="$state" '{
            for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
            print m, t, k, r, v["requests"], v["duration_us"], v["p50_us"], v["p99_us"], v["connect"],
                v["read"], v["write"], v["status"], v["timeout"], cpu, wrk, other, steal, v["body_bytes"],
                v["max_us"], a, st
        }' OFS='\t' >>"$RESULTS"
        say "   $(printf '%-4s %-11s %-6s %s' "$mode" "$target" "$kind" "$round") $(tail -1 "$RESULTS" | awk -F'\t' '{
            printf "%7d req %8.0f req/s  p50 %5d us  p99 %6d us  errors %d  cpu: target %.2fs wrk %.2fs other %.2fs steal %.2fs  %s",
                $5, $5 / ($6 / 1e6), $7, $8, $9 + $10 + $11 + $12 + $13, $14 / tck, $15 / tck, $16 / tck, $17 / tck, $21 }' tck="$CLK_TCK")${seen:+ (compilers: $seen)}"
        [ "$state" = retried ] || break
    done
}

TARGETS=(direct llmp prefixscope)
[ -z "$PS_COMPARE_FLAGS$PS_COMPARE_BIN" ] || TARGETS+=(ps-compare)
BOUND_WORKERS=""
if [ "$PROXY_BOUND" = 1 ]; then
    TARGETS+=(nginx-proxy)
    # The bound: nginx as a plain reverse proxy in front of the same server, one port per mode,
    # upstream connections kept alive, the stream passed on as it comes, nothing recorded.
    mkdir -p "$WORK/bound/logs"
    cat >"$WORK/bound/nginx.conf" <<EOF
# bench/proxy.sh PROXY_BOUND=1: nginx proxying to the fake server, recording nothing (generated).
worker_processes 2;
daemon off;
pid $WORK/bound/nginx.pid;
error_log $WORK/bound/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    client_body_buffer_size 64k;
    client_body_temp_path $WORK/bound/body;
    proxy_temp_path $WORK/bound/proxy;
    fastcgi_temp_path $WORK/bound/fastcgi;
    uwsgi_temp_path $WORK/bound/uwsgi;
    scgi_temp_path $WORK/bound/scgi;
    upstream plain { server 127.0.0.1:$PORT_PLAIN; keepalive 128; keepalive_requests 1000000; }
    upstream sse { server 127.0.0.1:$PORT_SSE; keepalive 128; keepalive_requests 1000000; }
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    proxy_buffering off;
    server { listen 127.0.0.1:$PORT_BOUND; location / { proxy_pass http://plain; } }
    server { listen 127.0.0.1:$((PORT_BOUND + 1)); location / { proxy_pass http://sse; } }
}
EOF
    nginx -t -q -p "$WORK/bound" -c "$WORK/bound/nginx.conf" -e "$WORK/bound/logs/error.log"
    nginx -p "$WORK/bound" -c "$WORK/bound/nginx.conf" -e "$WORK/bound/logs/error.log" \
        >"$WORK/nginx-proxy.log" 2>&1 &
    BOUND_PID=$!
    PIDS+=("$BOUND_PID")
    wait_port $PORT_BOUND $BOUND_PID
    wait_port $((PORT_BOUND + 1)) $BOUND_PID
    BOUND_WORKERS=$(pgrep -P "$BOUND_PID" | paste -sd' ')
fi
PS2_PID=""
for mode in json sse; do
    if [ "$mode" = json ]; then UPSTREAM_PORT=$PORT_PLAIN STREAM=0 BOUND_PORT=$PORT_BOUND; else UPSTREAM_PORT=$PORT_SSE STREAM=1 BOUND_PORT=$((PORT_BOUND + 1)); fi
    NGINX_WORKER=$(pgrep -P "$NGINX_PID" | head -1)
    say "== mode $mode: upstream 127.0.0.1:$UPSTREAM_PORT"
    PS_OUT="$WORK/prefixscope-$mode.jsonl"
    LLMP_OUT="$WORK/llmp-$mode.jsonl"
    rm -f "$PS_OUT" "$LLMP_OUT" "${PS_OUT%.jsonl}".[0-9]*.jsonl
    "$PS_BIN" record --upstream "http://127.0.0.1:$UPSTREAM_PORT" --listen "127.0.0.1:$PORT_PS" \
        -o "$PS_OUT" --quiet $PS_FLAGS >"$WORK/prefixscope-$mode.log" 2>&1 &
    PS_PID=$!
    PIDS+=("$PS_PID")
    "$LLMP_BIN" proxy --upstream "127.0.0.1:$UPSTREAM_PORT" --listen "127.0.0.1:$PORT_LLMP" \
        --out "$LLMP_OUT" >"$WORK/llmp-$mode.log" 2>&1 &
    LLMP_PID=$!
    PIDS+=("$LLMP_PID")
    wait_port $PORT_PS $PS_PID
    wait_port $PORT_LLMP $LLMP_PID
    PS2_OUT="$WORK/ps-compare-$mode.jsonl"
    if [ -n "$PS_COMPARE_FLAGS$PS_COMPARE_BIN" ]; then
        rm -f "$PS2_OUT" "${PS2_OUT%.jsonl}".[0-9]*.jsonl
        # shellcheck disable=SC2086 # the flags are words
        "$PS2_BIN" record --upstream "http://127.0.0.1:$UPSTREAM_PORT" --listen "127.0.0.1:$PORT_PS2" \
            -o "$PS2_OUT" --quiet $PS_FLAGS $PS_COMPARE_FLAGS >"$WORK/ps-compare-$mode.log" 2>&1 &
        PS2_PID=$!
        PIDS+=("$PS2_PID")
        wait_port $PORT_PS2 $PS2_PID
    fi

    # One request through each target: the proxies must return the server's bytes unchanged.
    for target in "${TARGETS[@]}"; do
        curl -sS --max-time 5 -X POST -H 'Content-Type: application/json' \
            --data-binary "{\"model\":\"gemma\",\"messages\":[{\"role\":\"user\",\"content\":\"check\"}],\"max_tokens\":8,\"stream\":$([ "$STREAM" = 1 ] && echo true || echo false)}" \
            -o "$WORK/check-$mode-$target.out" -D "$WORK/check-$mode-$target.headers" "$(url_of "$target")" \
            || die "curl through $target failed"
    done
    for target in "${TARGETS[@]:1}"; do
        cmp -s "$WORK/check-$mode-direct.out" "$WORK/check-$mode-$target.out" \
            || die "$target changed the $mode response body; see $WORK/check-$mode-*.out"
    done

    for target in "${TARGETS[@]}"; do run_wrk "$mode" "$target" warmup 1 "$THREADS" "$CONNS" "$WARMUP" "$ALL_CPUS"; done
    for round in $(seq 1 "$ROUNDS"); do
        for target in "${TARGETS[@]}"; do run_wrk "$mode" "$target" c1 "$round" 1 1 "$DURATION" "$ALL_CPUS"; done
    done
    # Diagnostic: everything (wrk, nginx, both proxies) on CPU 0, so no request waits for another
    # vCPU to wake up: what is left is the proxy's own work on the request path.
    pin_all 0
    for target in "${TARGETS[@]}"; do run_wrk "$mode" "$target" c1pin 1 1 1 "$DURATION" 0; done
    pin_all "$ALL_CPUS"
    for round in $(seq 1 "$ROUNDS"); do
        for target in "${TARGETS[@]}"; do run_wrk "$mode" "$target" "$KIND_N" "$round" "$THREADS" "$CONNS" "$DURATION" "$ALL_CPUS"; done
    done

    # --- 5. records vs requests ---
    thread_cpu "$PS_PID" "prefixscope $mode"
    thread_cpu "$LLMP_PID" "llmp $mode"
    [ -z "$PS2_PID" ] || thread_cpu "$PS2_PID" "ps-compare $mode"
    for target in "${TARGETS[@]:1}"; do
        case $target in
            nginx-proxy) continue ;; # records nothing
            llmp) pid=$LLMP_PID out=$LLMP_OUT ;;
            prefixscope) pid=$PS_PID out=$PS_OUT ;;
            ps-compare) pid=$PS2_PID out=$PS2_OUT ;;
        esac
        rc=0
        stop_proc "$pid" || rc=$?
        records=0 ok=0 disc=0
        for f in "$out" "${out%.jsonl}".[0-9]*.jsonl; do # --max-size rotation would add rec.N.jsonl
            [ -f "$f" ] || continue
            # The server's probes (`"probe":true`, prefixscope's own GETs) are not traffic.
            records=$((records + $(grep -vc '"probe":true' "$f" || true)))
            ok=$((ok + $(grep -c '"response":{"status":200,' "$f" || true)))
            disc=$((disc + $(grep -c '"error":"client_disconnected"' "$f" || true)))
        done
        # completed: wrk's "N requests in" over all runs, + the curl check.
        # in flight when a run stopped: at most one per connection (wrk does not pipeline), + errors.
        awk -v m="$mode" -v t="$target" -v r="$records" -v ok="$ok" -v disc="$disc" -v rc="$rc" '
            $1 == m && $2 == t { done += $5; inflight += ($3 ~ /^c1/ ? 1 : conns) + $10 + $11 + $13 }
            END { print m, t, r, ok, disc, done + 1, inflight, rc }' conns="$CONNS" OFS='\t' "$RESULTS" >>"$COUNTS"
        say "   $target stopped (exit $rc): $records records ($ok status 200, $disc client_disconnected); $(tail -1 "$WORK/$target-$mode.log" 2>/dev/null)"
        if [ "$KEEP" != 1 ]; then rm -f "$out" "${out%.jsonl}".[0-9]*.jsonl; fi
    done
done

# --- 6. the table -------------------------------------------------------------------------------
T_END=$(date +%s)
REV=$(git -C "$ROOT" rev-parse --short HEAD)
DIRTY=$(git -C "$ROOT" status --porcelain -- src Cargo.toml Cargo.lock | awk '{print $2}' | paste -sd' ')
[ -z "$DIRTY" ] || REV="$REV+uncommitted changes in $DIRTY"
echo
echo "prefixscope $REV | $("$LLMP_BIN" --version 2>&1) | $(nginx -v 2>&1 | sed 's/.*: //') | $(wrk -v 2>&1 | head -1 | awk '{print "wrk " $2}')"
echo "$NCPU cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(date -u '+%Y-%m-%d %H:%M UTC'); load average before the build: $LOAD0, before measuring: $LOAD1"
echo "request body $(awk 'NR == 1 {print $18}' "$RESULTS") B; ${DURATION}s runs, ${WARMUP}s warm-up, $ROUNDS rounds; c1 = 1 connection/1 thread, @$CONNS = $CONNS connections/$THREADS threads"
echo
awk -v kn="$KIND_N" -v tck="$CLK_TCK" -v tl="${TARGETS[*]}" '
    function median(list,    a, n, i, j, x) {
        n = split(substr(list, 2), a, " ")
        for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { k = $1 SUBSEP $2; errs[k] += $9 + $10 + $11 + $12 + $13 }
    $21 == "retried" { next }
    $21 == "disturbed" { dist[k] = "*" }
    { if ($3 == "c1") { p50[k] = p50[k] " " $7; p99[k] = p99[k] " " $8; r50[k] = r50[k] (r50[k] == "" ? "" : "/") $7 }
      if ($3 == "c1pin") pin[k] = $7
      if ($3 == kn) { rps[k] = rps[k] " " $5 / ($6 / 1e6); rr[k] = rr[k] (rr[k] == "" ? "" : "/") sprintf("%.0f", $5 / ($6 / 1e6))
                      q99[k] = q99[k] " " $8; cpu[k] += $14; req[k] += $5 } }
    END {
      printf "| target | mode | p50 µs | p99 µs | +p50 µs | +p99 µs | p50 per round | p50 pinned µs | +p50 pinned | req/s @%s | req/s per round | p99 µs @%s | ×direct | prefixscope/llmp | CPU µs/req | wrk errors |\n", substr(kn, 2), substr(kn, 2)
      print "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
      split("json sse", modes, " "); nt = split(tl, targets, " ")
      for (i = 1; i <= 2; i++) {
        m = modes[i]; d = m SUBSEP "direct"
        d50 = median(p50[d]); d99 = median(p99[d]); drps = median(rps[d])
        for (j = 1; j <= nt; j++) {
          t = targets[j]; k = m SUBSEP t
          m50 = median(p50[k]); m99 = median(p99[k]); mrps = median(rps[k])
          dir = (t == "direct")
          printf "| %s%s | %s | %d | %d | %s | %s | %s | %d | %s | %.0f | %s | %d | %s | %s | %.1f | %d |\n",
            t, dist[k], (m == "json" ? "non-streamed" : "streamed"), m50, m99,
            dir ? "" : sprintf("%+d", m50 - d50), dir ? "" : sprintf("%+d", m99 - d99), r50[k],
            pin[k], dir ? "" : sprintf("%+d", pin[k] - pin[d]),
            mrps, rr[k], median(q99[k]), dir ? "1" : sprintf("%.2f", mrps / drps),
            (t ~ /^p|^nginx-proxy/) ? sprintf("%.2f", mrps / median(rps[m SUBSEP "llmp"])) : "",
            cpu[k] / tck * 1e6 / req[k], errs[k]
        }
      }
    }' "$RESULTS"
echo
echo "| proxy | mode | records written | of them 200 complete | of them client_disconnected | requests wrk completed (+1 curl) | records − completed | in flight at wrk's cut-offs (max) | proxy exit |"
echo "|---|---|--:|--:|--:|--:|--:|--:|--:|"
awk '{ printf "| %s | %s | %d | %d | %d | %d | %+d | %d | %d |\n", $2, ($1 == "json" ? "non-streamed" : "streamed"), $3, $4, $5, $6, $3 - $6, $7, $8 }' "$COUNTS"
echo
echo "p50/p99: medians over the rounds of the 1-connection runs; +: minus direct's. pinned: one 1-connection"
echo "run with wrk, nginx and the proxy all on CPU 0. req/s, p99 @$CONNS: medians over the @$CONNS rounds."
echo "CPU µs/req: the proxy's own CPU time (all threads; nginx worker's for direct, both workers' for nginx-proxy) over its @$CONNS runs / requests."
echo "wrk errors: socket (connect/read/write/timeout) + non-2xx responses, all runs of the target."
echo "Runs disturbed by other load are run again (see below); * marks a target with a disturbed run kept."
echo

# --- the aims -------------------------------------------------------------------------------------
awk -v kn="$KIND_N" -v flags="${PS_COMPARE_BIN:+$PS_COMPARE_BIN }$PS_COMPARE_FLAGS" '
    function median(list,    a, n, i, j, x) {
        n = split(substr(list, 2), a, " ")
        for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    $21 == "retried" { next }
    $3 == "c1" { p50[$1, $2] = p50[$1, $2] " " $7; p99[$1, $2] = p99[$1, $2] " " $8 }
    $3 == kn { rps[$1, $2] = rps[$1, $2] " " $5 / ($6 / 1e6) }
    END {
      split("json sse", modes, " ")
      for (i = 1; i <= 2; i++) { m = modes[i]
        a50 = median(p50[m, "prefixscope"]) - median(p50[m, "direct"])
        a99 = median(p99[m, "prefixscope"]) - median(p99[m, "direct"])
        r = median(rps[m, "prefixscope"]) / median(rps[m, "llmp"])
        printf "aim %-4s added p50 <= 60 us: %+d us %s | added p99: %+d us | >= 2x llmp @%s: %.2fx %s\n", m,
          a50, (a50 <= 60 ? "MET" : "NOT MET"), a99, substr(kn, 2), r, (r >= 2 ? "MET" : "NOT MET")
        if (rps[m, "nginx-proxy"] != "") {
          b = median(rps[m, "nginx-proxy"]) / median(rps[m, "llmp"])
          printf "bound %-4s nginx as a plain proxy (records nothing) @%s: %.2fx llmp, %.2fx prefixscope: 2x llmp is %s\n", m,
            substr(kn, 2), b, median(rps[m, "nginx-proxy"]) / median(rps[m, "prefixscope"]),
            (b >= 2 ? "within what a proxy reaches here" : "beyond even a proxy that records nothing, here")
        }
        if (rps[m, "ps-compare"] != "") {
          c = median(rps[m, "ps-compare"]) / median(rps[m, "prefixscope"])
          # The 5% aim is for --metrics (issue #18); other flags, or another build, are compared.
          if (flags ~ /--metrics/)
            printf "aim %-4s ps-compare (%s) req/s within 5%% of prefixscope @%s: %+.1f%% %s\n", m, flags,
              substr(kn, 2), (c - 1) * 100, (c >= 0.95 ? "MET" : "NOT MET")
          else
            printf "compare %-4s ps-compare (%s) req/s against prefixscope @%s: %+.1f%%\n", m, flags,
              substr(kn, 2), (c - 1) * 100
        }
      }
    }' "$RESULTS"
# Lost: a request wrk saw answered with no complete (200) record. Records beyond wrk's count must
# fit in the requests cut off when wrk stopped a run (or that errored).
awk '{ if ($4 < $6) lost += $6 - $4; if ($3 - $6 > $7) odd = odd " " $2 "/" $1 }
     END { printf "aim zero records lost: %s%s\n", (lost ? "NOT MET (" lost " fewer complete records than completed requests)" : "MET"),
           (odd ? "; more records than requests sent:" odd : "") }' "$COUNTS"
awk '$21 == "retried" { n++ } $21 == "disturbed" { d++ }
     END { if (n + d) printf "disturbed runs (other CPU > '"$OTHER_MAX_PCT"'%% or steal > '"$STEAL_MAX_PCT"'%% of the machine, or a compiler running): %d run again, %d kept (* in the table):\n", n, d }' "$RESULTS"
[ ! -s "$WORK/busy.txt" ] || sed 's/^/  /' "$WORK/busy.txt"
echo "took $((T_END - T_START)) s (build included)"
