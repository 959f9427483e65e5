#!/usr/bin/env bash
# Benchmark of the catalog API (see docs/benchmarks.md): builds the release binary,
# starts the aggregator on free ports with a temporary data directory, registers
# 10,000 clusters in 20 zones, then runs wrk against the hot read paths and reports
# throughput, latency percentiles and the aggregator's resident memory.
#
# Environment: CLUSTERS (10000), ZONES (20), DURATION (10s), CONNECTIONS (64),
# THREADS (2), CARGO_TARGET_DIR (./target).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

CLUSTERS=${CLUSTERS:-10000}
ZONES=${ZONES:-20}
DURATION=${DURATION:-10s}
CONNECTIONS=${CONNECTIONS:-64}
THREADS=${THREADS:-2}
target=${CARGO_TARGET_DIR:-$root/target}

echo "==> building release"
cargo build --release -p meshcat-aggregator
bin="$target/release/meshcat-aggregator"

if ! command -v wrk >/dev/null; then
    echo "==> installing wrk"
    sudo_cmd=""
    [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
    $sudo_cmd apt-get update -qq && $sudo_cmd apt-get install -y -qq wrk >/dev/null
fi

work=$(mktemp -d)
pid=""
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

echo "==> starting the aggregator"
RUST_LOG=warn,meshcat_aggregator=info "$bin" serve \
    --api-addr 127.0.0.1:0 --ops-addr 127.0.0.1:0 --quic-addr 127.0.0.1:0 \
    --data-dir "$work/data" --log-format json 2>"$work/log" &
pid=$!
api=""
for _ in $(seq 1 200); do
    api=$(grep -o '"api":"[^"]*"' "$work/log" | head -1 | cut -d'"' -f4 || true)
    [ -n "$api" ] && break
    sleep 0.05
done
[ -n "$api" ] || { echo "aggregator did not start"; cat "$work/log"; exit 1; }
echo "api: http://$api (pid $pid)"

echo "==> registering $CLUSTERS clusters in $ZONES zones"
load_start=$(date +%s.%N)
python3 - "$api" "$CLUSTERS" "$ZONES" <<'PY'
import http.client, json, sys, threading
addr, n, zones = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
host, port = addr.rsplit(":", 1)

def conn():
    return http.client.HTTPConnection(host, int(port), timeout=30)

def post(c, path, body):
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    if r.status != 201:
        raise SystemExit(f"POST {path} answered {r.status}")

c = conn()
for z in range(zones):
    post(c, "/zones", {"zoneName": f"zone-{z:02}", "serverAddress": f"cp-{z}.mesh:50000"})

def worker(first, step):
    c = conn()
    for i in range(first, n, step):
        post(c, "/clusters", {
            "clusterName": f"svc-{i:05}", "zoneName": f"zone-{i % zones:02}",
            "name": f"Service {i}", "version": f"1.{i % 7}", "owner": f"team-{i % 50}",
            "capability": f"cap-{i % 30}", "prometheusJob": f"job-{i}",
            "documentation": "/docs/service", "description": "A benchmark service.",
            "minInstances": 1, "maxInstances": 4, "protocols": ["http", "grpc"],
            "businessImpact": ["low", "medium", "high"][i % 3],
        })

threads = [threading.Thread(target=worker, args=(t, 8)) for t in range(8)]
for t in threads: t.start()
for t in threads: t.join()
PY
load_end=$(date +%s.%N)
echo "loaded in $(echo "$load_end - $load_start" | bc) s"

rss() { awk '/VmRSS/ {printf "%.1f MiB", $2 / 1024}' "/proc/$pid/status"; }
echo "RSS after load: $(rss)"

results="$work/results"
: >"$results"
run() {
    local label=$1 path=$2 conns=${3:-$CONNECTIONS} threads=${4:-$THREADS} hdr=${5:-}
    echo "==> wrk $label: GET $path with $conns connections ${hdr:+($hdr)}"
    wrk -t"$threads" -c"$conns" -d"$DURATION" --latency ${hdr:+-H "$hdr"} "http://$api$path" >"$work/wrk.out"
    cat "$work/wrk.out"
    local rps p50 p99
    rps=$(awk '/Requests\/sec/ {print $2}' "$work/wrk.out")
    p50=$(awk '$1 == "50%" {print $2}' "$work/wrk.out")
    p99=$(awk '$1 == "99%" {print $2}' "$work/wrk.out")
    printf "| %-32s | %5s | %10s | %9s | %9s |\n" "$label" "$conns" "$rps" "$p50" "$p99" >>"$results"
}
run "GET /clusters/{name}" "/clusters/svc-04242"
run "GET /clusters?owner=..." "/clusters?owner=team-7"
run "GET /clusters (all 10,000)" "/clusters"
run "GET /summary" "/summary"
# The summary holds every cluster twice (zones and meshes, about 11 MB with 10,000
# clusters): with one connection its latency is the time to produce and send one.
run "GET /summary" "/summary" 1 1
# Dashboards (browsers) accept gzip: the compressed body is cached per change too.
run "GET /summary, gzip" "/summary" 1 1 "Accept-Encoding: gzip"
run "GET /summary, gzip" "/summary" "$CONNECTIONS" "$THREADS" "Accept-Encoding: gzip"
run "GET /clusters (all), gzip" "/clusters" "$CONNECTIONS" "$THREADS" "Accept-Encoding: gzip"

echo
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "clusters: $CLUSTERS in $ZONES zones; wrk -t$THREADS -d$DURATION --latency"
echo "summary body: $(curl -s "http://$api/summary" | wc -c) bytes ($(curl -s -H 'Accept-Encoding: gzip' "http://$api/summary" | wc -c) gzip);" \
    "full list: $(curl -s "http://$api/clusters" | wc -c) bytes"
echo
echo "| endpoint                         | conns |   req/s    |    p50    |    p99    |"
echo "|----------------------------------|-------|------------|-----------|-----------|"
cat "$results"
echo
echo "aggregator RSS after the runs: $(rss)"
