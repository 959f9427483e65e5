#!/usr/bin/env bash
# Benchmark of the catalog API (see docs/benchmarks.md): builds the release binary,
# starts the aggregator on free ports with a temporary data directory, registers
# 10,000 clusters in 20 zones, then runs wrk against the hot read paths and reports
# throughput, latency percentiles and the aggregator's resident memory.
#
# The registrations are written by meshcat-bench-writes (WRITERS concurrent writers,
# then again as bulk arrays), which prints durable writes per second. An axum
# handler answering one static JSON record (meshcat-bench-hello serving the very
# answer of `GET /clusters/svc-004242`, so the same bytes) is measured before and
# after `GET /clusters/{name}` in the same run, with NAME_CONNECTIONS connections,
# as its baseline; the script prints the ratio, and the ratio of the two servers'
# CPU per request (user and system time over the requests served). The
# one-connection `GET /summary` has the same handler serving the summary's bytes as
# its baseline.
#
# The pair is then measured again in NAME_ROUNDS alternations of ROUND_DURATION each
# (the static record, then the read), and the script prints their ratio in all and
# each round's.
#
# Environment: CLUSTERS (10000), ZONES (20), DURATION (10s), CONNECTIONS (64),
# NAME_CONNECTIONS (32), NAME_ROUNDS (5), ROUND_DURATION (5s), THREADS (2), WRITERS
# (64), AGGREGATOR (the aggregator binary to measure: the one built), CARGO_TARGET_DIR
# (./target).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh

CLUSTERS=${CLUSTERS:-10000}
ZONES=${ZONES:-20}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-64}
NAME_CONNECTIONS=${NAME_CONNECTIONS:-32}
NAME_ROUNDS=${NAME_ROUNDS:-5}
ROUND_DURATION=${ROUND_DURATION:-5s}
THREADS=${THREADS:-2}
WRITERS=${WRITERS:-64}

build_release

if ! command -v wrk >/dev/null; then
    echo "==> installing wrk"
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq && $sudo_cmd apt-get install -y -qq wrk >/dev/null
fi

work=$(mktemp -d)
pid=""
hello_pid=""
summary_pid=""
server=""
cleanup() {
    stop "$summary_pid" "$pid" "$hello_pid"
    rm -rf "$work"
}
trap cleanup EXIT

echo "==> starting the aggregator"
# Writes without a token: the benchmark registers through the API on loopback.
start_aggregator "$bin" --allow-anonymous-writes

echo "==> registering $CLUSTERS clusters in $ZONES zones with $WRITERS concurrent writers"
"$target/release/meshcat-bench-writes" --api "http://$api" --writers "$WRITERS" \
    --clusters "$CLUSTERS" --zones "$ZONES" --prefix svc | tee "$work/writes"

rss() { awk '/VmRSS/ {printf "%.1f MiB", $2 / 1024}' "/proc/$pid/status"; }
echo "RSS after load: $(rss)"

results="$work/results"
: >"$results"
# cpu_ticks PID: the process's user and system CPU so far, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
tick_us=$((1000000 / $(getconf CLK_TCK)))
# run LABEL PATH [CONNS] [THREADS] [HEADER]: wrk against $api (served by process
# $server, the aggregator unless run_at says otherwise); adds a row to the results
# with the server's CPU per request, which the load generator sharing the cores
# moves less than the request rate.
run() {
    local label=$1 path=$2 conns=${3:-$CONNECTIONS} threads=${4:-$THREADS} hdr=${5:-}
    local who=${server:-$pid} c0 c1
    echo "==> wrk $label: GET $path with $conns connections ${hdr:+($hdr)}"
    c0=$(cpu_ticks "$who")
    wrk -t"$threads" -c"$conns" -d"$DURATION" --latency ${hdr:+-H "$hdr"} "http://$api$path" >"$work/wrk.out"
    c1=$(cpu_ticks "$who")
    cat "$work/wrk.out"
    local rps p50 p99 n
    rps=$(awk '/Requests\/sec/ {print $2}' "$work/wrk.out")
    p50=$(awk '$1 == "50%" {print $2}' "$work/wrk.out")
    p99=$(awk '$1 == "99%" {print $2}' "$work/wrk.out")
    n=$(awk '/ requests in / {print $1}' "$work/wrk.out")
    last_cpu=$(awk -v t=$((c1 - c0)) -v us="$tick_us" -v n="$n" 'BEGIN {printf "%.2f", (n > 0 ? t * us / n : 0)}')
    printf "| %-32s | %5s | %10s | %9s | %9s | %10s |\n" "$label" "$conns" "$rps" "$p50" "$p99" "$last_cpu" >>"$results"
    last_rps=$rps
}
# serve_static FILE: serves FILE's bytes from meshcat-bench-hello in the background
# and waits until it listens; sets static_pid and static_addr.
serve_static() {
    local out=$1.hello
    "$target/release/meshcat-bench-hello" --json "$1" >"$out" &
    static_pid=$!
    static_addr=$(listening_addr "$out")
    [ -n "$static_addr" ] || { echo "the static server of $1 did not start"; exit 1; }
}
# One cluster the writes registered (svc-004242 at the default size).
name_path=/clusters/svc-$(printf %06d $((CLUSTERS > 4242 ? 4242 : CLUSTERS / 2)))
curl -sf "http://$api$name_path" >"$work/record.json"
serve_static "$work/record.json"
hello_pid=$static_pid
hello=$static_addr
# run_at ADDR PID ARGS...: run ARGS against the server at ADDR, process PID.
run_at() {
    local saved=$api
    api=$1
    server=$2
    shift 2
    run "$@"
    api=$saved
    server=""
}
run_at "$hello" "$hello_pid" "axum static record (baseline)" "/" "$NAME_CONNECTIONS"
before=$last_rps
before_cpu=$last_cpu
run "GET /clusters/{name}" "$name_path" "$NAME_CONNECTIONS"
by_name=$last_rps
by_name_cpu=$last_cpu
run_at "$hello" "$hello_pid" "axum static record (baseline)" "/" "$NAME_CONNECTIONS"
after=$last_rps
after_cpu=$last_cpu
# The same pair again in NAME_ROUNDS short alternations (the static record, then the
# read, ROUND_DURATION each): on a shared machine the rate of either server drifts by
# a fifth from one minute to the next, and alternating moves both with it.
round_rate() {
    wrk -t"$THREADS" -c"$NAME_CONNECTIONS" -d"$ROUND_DURATION" "http://$1$2" |
        awk '/Requests\/sec/ {print $2}'
}
rounds=""
for round in $(seq 1 "$NAME_ROUNDS"); do
    echo "==> round $round of $NAME_ROUNDS: the static record, then GET $name_path"
    static_rate=$(round_rate "$hello" /)
    read_rate=$(round_rate "$api" "$name_path")
    rounds+="$static_rate $read_rate"$'\n'
done
run "GET /clusters?owner=..." "/clusters?owner=team-7"
run "GET /clusters (all)" "/clusters"
run "GET /summary" "/summary"
# The summary holds every cluster twice (zones and meshes, about 29 MB with 10,000
# clusters): with one connection its latency is the time to produce and send one.
# Its baseline is the same bytes from the static axum handler, also on one
# connection: what the socket alone costs for a body of that size, in the same run.
curl -sf "http://$api/summary" >"$work/summary.json"
serve_static "$work/summary.json"
summary_pid=$static_pid
run_at "$static_addr" "$summary_pid" "axum static summary (baseline)" "/" 1 1
run "GET /summary" "/summary" 1 1
stop "$summary_pid"
summary_pid=""
# Dashboards (browsers) accept gzip: the compressed body is cached per change too.
run "GET /summary, gzip" "/summary" 1 1 "Accept-Encoding: gzip"
run "GET /summary, gzip" "/summary" "$CONNECTIONS" "$THREADS" "Accept-Encoding: gzip"
run "GET /clusters (all), gzip" "/clusters" "$CONNECTIONS" "$THREADS" "Accept-Encoding: gzip"

# After the reads, so they ran over CLUSTERS clusters.
echo "==> the same count again in bulk arrays of 500 (all or nothing each)"
"$target/release/meshcat-bench-writes" --api "http://$api" --writers 8 --bulk 500 \
    --clusters "$CLUSTERS" --zones "$ZONES" --prefix bulk | tee -a "$work/writes"

echo
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "clusters: $CLUSTERS in $ZONES zones; wrk -t$THREADS -d$DURATION --latency"
echo "summary body: $(curl -s "http://$api/summary" | wc -c) bytes ($(curl -s -H 'Accept-Encoding: gzip' "http://$api/summary" | wc -c) gzip);" \
    "full list: $(curl -s "http://$api/clusters" | wc -c) bytes;" \
    "one record: $(wc -c <"$work/record.json") bytes"
echo "GET /clusters/{name} against the static record: $by_name / mean($before, $after) =" \
    "$(awk -v n="$by_name" -v a="$before" -v b="$after" 'BEGIN {printf "%.2fx", 2 * n / (a + b)}')"
echo "its server CPU per request: mean($before_cpu, $after_cpu) / $by_name_cpu us =" \
    "$(awk -v n="$by_name_cpu" -v a="$before_cpu" -v b="$after_cpu" 'BEGIN {printf "%.2fx", (n > 0 ? (a + b) / 2 / n : 0)}')"
each=$(printf '%s' "$rounds" | awk '{printf "%s%.2f", (NR > 1 ? ", " : ""), $2 / $1}')
median=$(printf '%s' "$rounds" | awk '{print $2 / $1}' | sort -n |
    awk '{v[NR] = $1} END {printf "%.2f", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')
echo "in $NAME_ROUNDS alternated rounds of $ROUND_DURATION: read / static =" \
    "$(printf '%s' "$rounds" | awk '{s += $1; r += $2} END {printf "%.2f", r / s}')x in all," \
    "median round ${median}x (rounds: $each)"
echo
echo "| endpoint                         | conns |   req/s    |    p50    |    p99    | CPU us/req |"
echo "|----------------------------------|-------|------------|-----------|-----------|------------|"
cat "$results"
echo
echo "aggregator RSS after the runs: $(rss)"
echo
cat "$work/writes"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
