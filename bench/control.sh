#!/usr/bin/env bash
# Benchmark of the zone's control server (see docs/benchmarks.md): builds the release
# binaries, writes a mesh of CLUSTERS clusters of ENDPOINTS endpoints each
# (meshcat-bench-agents --write-mesh), serves it with meshcat-control-server and
# starts the aggregator (--dev) on free loopback ports with a temporary data
# directory, the aggregator pinned to one core and everything else to the other.
# It measures, with meshcat-bench-control and meshcat-bench-agents:
#
# 1. the time from registering the zone (POST /zones, serverAddress = the control
#    server) to its whole view in the catalog (GET /zones/{z}/control polled every
#    POLL);
# 2. the aggregator's resident memory before the registration and with the view,
#    once settled: bytes per endpoint; and, with meshcat-bench-control-heap (the
#    control component, the catalog and a graph build in one process under a
#    counting allocator), the heap that stays allocated for the view, exactly, over
#    Delta xDS and over state of the world;
# 3. the aggregator's CPU with AGENTS simulated agents of INSTANCES instances, each
#    with UPSTREAMS upstream clusters, reporting every INTERVAL for DURATION: sidecars
#    connected over xDS and in sync with the mesh (--xds), so every report is
#    compared with the view; then the same load against an aggregator started with
#    --control-plane=false (no view, the derivation stops at "unknown"). The
#    difference is the sync derivation's cost;
# 4. CHANGES times, one endpoint added to one cluster in the mesh file and the
#    control server told to re-read it at once (SIGHUP): the time to the cluster's
#    controlPlane.endpoints in the catalog;
# 5. under the load of 3 (with the view), the aggregator restarted with the
#    smallest sync grace (--sync-grace 1ns: it rejects 0, and the derivation counts
#    the grace in whole milliseconds, so 1ns is none): the first FLIP_INSTANCES
#    sidecars of each of the first FLIP_AGENTS agents alternate, report by report,
#    between the mesh's host set of one upstream cluster and one lacking an
#    endpoint, so each report makes them stale or synced again; a watcher follows
#    GET /sync (the stale ones) with blocking queries. The time from each such
#    report's send to the first answer showing its state.
#
# Environment: CLUSTERS (10000), ENDPOINTS (10), POLL (10ms), CHANGES (20), AGENTS
# (1000), INSTANCES (10), UPSTREAMS (10), INTERVAL (5s), DURATION (30s),
# CONNECT_RATE (300), ROUNDS (2: the runs of 3, with and without the view, one after
# the other), FLIP_AGENTS (50), FLIP_INSTANCES (1), CARGO_TARGET_DIR (./target).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh

CLUSTERS=${CLUSTERS:-10000}
ENDPOINTS=${ENDPOINTS:-10}
POLL=${POLL:-10ms}
CHANGES=${CHANGES:-20}
AGENTS=${AGENTS:-1000}
INSTANCES=${INSTANCES:-10}
UPSTREAMS=${UPSTREAMS:-10}
INTERVAL=${INTERVAL:-5s}
DURATION=${DURATION:-30s}
CONNECT_RATE=${CONNECT_RATE:-300}
ROUNDS=${ROUNDS:-2}
FLIP_AGENTS=${FLIP_AGENTS:-50}
FLIP_INSTANCES=${FLIP_INSTANCES:-1}
ZONE=zone-0
# The cluster the endpoint changes go to: the mesh's last, which no simulated
# sidecar holds (their upstreams are among the first 200).
CHANGED="service-$((CLUSTERS - 1))"

build_release
cargo build --release -p meshcat-control-server
agents="$target/release/meshcat-bench-agents"
control="$target/release/meshcat-bench-control"

new_work
cpid=""
counter=""
watcher=""
# Stops every process the script started, whatever their exit status.
cleanup() {
    set +e
    for p in $watcher $counter $cpid $pid; do
        kill "$p" 2>/dev/null
        wait "$p" 2>/dev/null
    done
    rm -rf "$work"
}
trap cleanup EXIT
loads=()
note_load() { loads+=("$1 $(cut -d' ' -f1-3 /proc/loadavg)"); }
note_load "start:"

echo "==> writing the mesh"
"$agents" --write-mesh "$work/mesh.json" --mesh-clusters "$CLUSTERS" --mesh-endpoints "$ENDPOINTS"

echo "==> starting the control server"
RUST_LOG=info taskset -c 0 "$target/release/meshcat-control-server" --listen 127.0.0.1:0 \
    --mesh "$work/mesh.json" 2>"$work/control.log" &
cpid=$!
server=""
for _ in $(seq 1 400); do
    grep -q 'mesh loaded' "$work/control.log" &&
        server=$(grep 'control server listening' "$work/control.log" | grep -o 'addr=[^ ]*' | head -1 | cut -d= -f2)
    [ -n "$server" ] && break
    sleep 0.05
done
[ -n "$server" ] || { echo "the control server did not start"; cat "$work/control.log"; exit 1; }
echo "control server: $server (pid $cpid)"

# start_pinned [FLAGS...]: the aggregator (--dev: the simulated agents present the
# development certificate, whose bounds are raised to the fleet's) on core 1.
start_pinned() {
    start_aggregator "$bin" --dev --max-instances-per-credential "$((AGENTS * INSTANCES * 2))" \
        "${FLEET_FLAGS[@]}" "$@"
    wait_quic
    taskset -a -pc 1 "$pid" >/dev/null
}

echo "==> starting the aggregator"
start_pinned
ulimit -n "$((AGENTS + 1024))" 2>/dev/null || true

echo "==> 1, 2: registering $ZONE at the control server ($CLUSTERS clusters, $((CLUSTERS * ENDPOINTS)) endpoints)"
taskset -c 0 "$control" --api "http://$api" --zone "$ZONE" connect --server "$server" \
    --pid "$pid" --clusters "$CLUSTERS" --endpoints "$((CLUSTERS * ENDPOINTS))" --poll "$POLL" |
    tee "$work/connect"
note_load "after the view:"
for protocol in delta sotw; do
    flag=""
    [ "$protocol" = sotw ] && flag=--sotw
    # shellcheck disable=SC2086
    taskset -c 1 "$target/release/meshcat-bench-control-heap" --clusters "$CLUSTERS" \
        --endpoints "$ENDPOINTS" $flag | tee "$work/heap-$protocol"
done

echo "==> 4: $CHANGES endpoint changes of $CHANGED"
taskset -c 0 "$control" --api "http://$api" --zone "$ZONE" change --mesh "$work/mesh.json" \
    --control-pid "$cpid" --control-log "$work/control.log" --cluster "$CHANGED" \
    --times "$CHANGES" | tee "$work/change"
note_load "after the changes:"

# seconds DURATION: whole seconds of "30s" or "500ms".
seconds() {
    case $1 in
    *ms) echo $((${1%ms} / 1000)) ;;
    *s) echo "${1%s}" ;;
    *) echo "$1" ;;
    esac
}

# run_agents NAME [MORE FLAGS...]: the simulated sidecars against the aggregator,
# connected over xDS and in sync with the mesh, all in $ZONE, with MORE FLAGS added;
# the output in $work/NAME. The sidecars' sync states (and the load average) are
# read halfway through the measured time.
run_agents() {
    local name=$1
    shift
    local halfway=$((AGENTS / CONNECT_RATE + 2 + $(seconds "$INTERVAL") + $(seconds "$DURATION") / 2))
    taskset -c 0 "$control" --api "http://$api" --zone "$ZONE" sync --after "${halfway}s" \
        >"$work/$name.sync" 2>&1 &
    counter=$!
    taskset -c 0 "$agents" --agents "$AGENTS" --instances "$INSTANCES" --upstreams "$UPSTREAMS" \
        --interval "$INTERVAL" --duration "$DURATION" --connect-rate "$CONNECT_RATE" \
        --addr "$quic" --pid "$pid" --data-dir "$work/data" --zones 1 --xds \
        --mesh-endpoints "$ENDPOINTS" "$@" | tee "$work/$name"
    wait "$counter" || true
    counter=""
    tee -a "$work/$name" <"$work/$name.sync"
    loads+=("$name, halfway: $(grep -o 'load average [0-9. ]*' "$work/$name.sync" | cut -d' ' -f3-)")
}

# restart [FLAGS...]: the aggregator again on the same data directory (the zone
# stays registered).
restart() {
    kill "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null || true
    pid=""
    start_pinned "$@"
}

for round in $(seq 1 "$ROUNDS"); do
    if [ "$round" -gt 1 ]; then
        echo "==> round $round: the aggregator with the view again"
        restart
        # The mesh as the changes of 4 left it.
        taskset -c 0 "$control" --api "http://$api" --zone "$ZONE" wait-view \
            --clusters "$CLUSTERS" --endpoints "$((CLUSTERS * ENDPOINTS + CHANGES))"
    fi
    echo "==> 3, round $round: $AGENTS agents x $INSTANCES instances, $UPSTREAMS upstreams, every $INTERVAL, with the view"
    note_load "round $round with the view, before:"
    run_agents "sync-on-$round"
    echo "==> 3, round $round: the same load, --control-plane=false"
    # The zone stays registered, its state disabled.
    restart --control-plane=false
    note_load "round $round without a view, before:"
    run_agents "sync-off-$round"
done

echo "==> 5: agent report -> /sync, $FLIP_INSTANCES flipping sidecars of each of $FLIP_AGENTS agents, under the load of 3"
# --sync-grace does not take 0: 1ns is its smallest value, and none in whole
# milliseconds, the derivation's unit.
restart --sync-grace 1ns
taskset -c 0 "$control" --api "http://$api" --zone "$ZONE" wait-view \
    --clusters "$CLUSTERS" --endpoints "$((CLUSTERS * ENDPOINTS + CHANGES))"
note_load "5, before:"
taskset -c 0 "$control" --api "http://$api" --zone "$ZONE" sync-latency --flips "$work/flips" \
    >"$work/report-sync" 2>&1 &
watcher=$!
run_agents "sync-flip" --flip-agents "$FLIP_AGENTS" --flip-instances "$FLIP_INSTANCES" \
    --flip-log "$work/flips"
# The last reports' states reach /sync before the watch ends.
sleep 2
kill -TERM "$watcher"
wait "$watcher" || echo "meshcat-bench-control sync-latency failed"
watcher=""
cat "$work/report-sync"
note_load "end:"

figure() { grep "^figure $1 " "$2" | cut -d' ' -f3-; }
cpu_of() { grep -o 'ingest cpu [0-9.]*%' "$1" | grep -o '[0-9.]*'; }
accepted_of() { grep -o 'reports accepted [0-9]* ([0-9]*/s' "$1" | grep -o '([0-9]*' | tr -d '('; }
cpus() { for r in $(seq 1 "$ROUNDS"); do cpu_of "$work/sync-$1-$r"; done | paste -sd' ' -; }
mean() { tr ' ' '\n' | awk '{s += $1; n++} END {printf "%.1f", s / n}'; }
on=$(cpus on | mean)
off=$(cpus off | mean)
endpoints=$((CLUSTERS * ENDPOINTS))
echo
echo "==================== the zone's control server ===================="
machine
echo "memory: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
printf '  %s\n' "${loads[@]/#/load average }"
echo "1. whole view ($CLUSTERS clusters, $endpoints endpoints) in the catalog after POST /zones: $(figure view_ms "$work/connect") ms (target: within 2000 ms)"
echo "2. aggregator resident $(figure rss_before_mib "$work/connect") MiB before, $(figure rss_after_mib "$work/connect") MiB with the view (settled): $(figure bytes_per_endpoint "$work/connect") bytes per endpoint (target: at most 200)"
for protocol in delta sotw; do
    echo "   heap held (exact, counted in one process) over $protocol: $(figure heap_bytes_per_endpoint "$work/heap-$protocol") bytes per endpoint: the view and its stream $(figure heap_view_bytes_per_endpoint "$work/heap-$protocol"), the catalog's entries $(figure heap_catalog_bytes_per_endpoint "$work/heap-$protocol"), the graph's nodes $(figure heap_graph_bytes_per_endpoint "$work/heap-$protocol")"
done
echo "3. aggregator CPU, $((AGENTS * INSTANCES)) instances x $UPSTREAMS upstreams every $INTERVAL ($(accepted_of "$work/sync-on-1") reports/s), $ROUNDS rounds:"
echo "   with the view: $(cpus on)% of one core, mean $on% (sidecars halfway: $(figure sync_states "$work/sync-on-1")),"
echo "   without (--control-plane=false): $(cpus off)%, mean $off% (sidecars halfway: $(figure sync_states "$work/sync-off-1")):"
echo "   derivation (mean with - mean without) $(awk -v a="$on" -v b="$off" 'BEGIN {printf "%.1f", a - b}')% of one core (target: at most 5%)"
echo "4. endpoint change ($CHANGES, one endpoint added to $CHANGED each), mesh file written + SIGHUP -> controlPlane.endpoints in the catalog:"
echo "   p50 $(figure change_p50_ms "$work/change") ms, p99 $(figure change_p99_ms "$work/change") ms;"
echo "   of which file written + SIGHUP -> the control server's 'mesh reloaded' line p50 $(figure reload_p50_ms "$work/change") ms, p99 $(figure reload_p99_ms "$work/change") ms,"
echo "   and that line -> the catalog p50 $(figure after_reload_p50_ms "$work/change") ms, p99 $(figure after_reload_p99_ms "$work/change") ms"
echo "   (target: within 100 ms p99 of the agents' next report)"
echo "5. agent report -> GET /sync ($((FLIP_AGENTS * FLIP_INSTANCES)) sidecars alternating stale and synced, --sync-grace 1ns, under the load of 3; sidecars halfway: $(figure sync_states "$work/sync-flip")):"
echo "   report written to its QUIC stream -> first answer of a blocking GET /sync showing the state it causes:"
echo "   p50 $(figure sync_report_p50_ms "$work/report-sync") ms, p99 $(figure sync_report_p99_ms "$work/report-sync") ms, max $(figure sync_report_max_ms "$work/report-sync") ms ($(figure sync_report_count "$work/report-sync") reports; $(figure sync_report_missed "$work/report-sync") not seen before the next);"
echo "   one plain GET of the same list meanwhile p50 $(figure sync_rtt_p50_ms "$work/report-sync") ms, p99 $(figure sync_rtt_p99_ms "$work/report-sync") ms (target: within 100 ms p99)"
