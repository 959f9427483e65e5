# Shared by the bench scripts (sourced, not run).

# build_release: builds the release aggregator and the bench tools; sets target (the
# cargo target folder, CARGO_TARGET_DIR or ./target) and bin (the aggregator, or the
# binary AGGREGATOR names: another build to compare, such as one before a change).
build_release() {
    target=${CARGO_TARGET_DIR:-$root/target}
    echo "==> building release"
    cargo build --release -p meshcat-aggregator -p meshcat-bench
    bin=${AGGREGATOR:-$target/release/meshcat-aggregator}
}

# new_work: a temporary folder, $work, removed at exit with the aggregator that
# start_aggregator starts in it ($pid).
new_work() {
    work=$(mktemp -d)
    pid=""
    trap stop_work EXIT
}

stop_work() {
    stop "$pid"
    rm -rf "$work"
}

# stop PID...: ends each process named (an empty one is skipped) and waits for it.
# Never fails: under `set -e` a killed process's status (143) would end an exit trap
# before the rest of its cleanup.
stop() {
    local p
    for p in "$@"; do
        [ -n "$p" ] || continue
        kill "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
}

# listening_addr FILE [SECONDS]: waits until FILE (a server's output) says
# `listening on ADDR`, as meshcat-bench-hello does, and prints ADDR; prints nothing
# when it has not within SECONDS (10).
listening_addr() {
    local addr=""
    for _ in $(seq 1 $((${2:-10} * 10))); do
        addr=$(awk '/listening on/ {print $3}' "$1")
        [ -n "$addr" ] && break
        sleep 0.1
    done
    echo "$addr"
}

# machine: a line naming the machine and its load average now.
machine() {
    echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
}

# start_aggregator BINARY [FLAGS...]: starts `BINARY serve FLAGS` on free loopback
# ports with its data in $work/data and its JSON log in $work/log, and waits until it
# logs its API and ops addresses. Sets pid, api and ops; exits with the log when it
# does not start. BENCH_RUST_LOG replaces its log filter (for example
# `warn,meshcat_aggregator=info,meshcat_aggregator::graph=debug` logs each graph
# build with its duration). The array aggregator_wrap, when set, runs it under a
# command (valgrind, say; $pid is then that command's), and start_seconds (10) is how
# long it may take to start.
start_aggregator() {
    local binary=$1
    shift
    RUST_LOG=${BENCH_RUST_LOG:-warn,meshcat_aggregator=info} \
        ${aggregator_wrap[@]+"${aggregator_wrap[@]}"} "$binary" serve "$@" \
        --api-addr 127.0.0.1:0 --ops-addr 127.0.0.1:0 --quic-addr 127.0.0.1:0 \
        --data-dir "$work/data" --log-format json 2>"$work/log" &
    pid=$!
    api=""
    ops=""
    for _ in $(seq 1 $((${start_seconds:-10} * 20))); do
        api=$(grep -o '"api":"[^"]*"' "$work/log" | head -1 | cut -d'"' -f4 || true)
        ops=$(grep -o '"ops":"[^"]*"' "$work/log" | head -1 | cut -d'"' -f4 || true)
        [ -n "$api" ] && [ -n "$ops" ] && break
        sleep 0.05
    done
    [ -n "$api" ] && [ -n "$ops" ] || { echo "aggregator did not start"; cat "$work/log"; exit 1; }
    echo "api: http://$api (pid $pid)"
}

# wait_quic: after start_aggregator (with agent credentials, e.g. --dev), waits until
# the log names the QUIC ingest's address. Sets quic; exits with the log when it does
# not start.
wait_quic() {
    quic=""
    for _ in $(seq 1 100); do
        quic=$(grep 'Agent ingest listening' "$work/log" | grep -o '"addr":"[^"]*"' | head -1 | cut -d'"' -f4 || true)
        [ -n "$quic" ] && break
        sleep 0.05
    done
    [ -n "$quic" ] || { echo "the ingest did not start"; cat "$work/log"; exit 1; }
}

# The simulated agents all present the development agent certificate: its bounds on
# connections, report streams and new instances are raised to a whole fleet's.
FLEET_FLAGS=(--max-connections-per-credential 1000000 --max-streams-per-credential 1000000
    --max-new-instances-per-minute 1000000)

# start_graph_mesh [MORE FLAGS...]: the mesh of bench/graph.sh and bench/metrics.sh,
# after build_release and new_work: starts the aggregator (--dev, --graph-window
# $WINDOW, MORE FLAGS; sets pid, api, ops and quic) and registers $CLUSTERS clusters
# in $ZONES zones with meshcat-bench-writes.
start_graph_mesh() {
    echo "==> starting the aggregator"
    # --dev: the simulated agents present the development agent certificate; they
    # all share it, so its bound on instances is raised to the cluster count.
    start_aggregator "$bin" --dev --graph-window "$WINDOW" \
        --max-instances-per-credential "$((CLUSTERS * 2))" "${FLEET_FLAGS[@]}" "$@"
    wait_quic

    echo "==> registering $CLUSTERS clusters in $ZONES zones"
    "$target/release/meshcat-bench-writes" --api "http://$api" --writers 8 --bulk 500 \
        --clusters "$CLUSTERS" --zones "$ZONES" --prefix svc
}

# bench_graph [MORE ARGS...]: after start_graph_mesh, meshcat-bench-graph with
# $AGENTS agents reporting one instance of every cluster, each calling $UPSTREAMS
# clusters of its zone, measuring GET /graph for $DURATION, with MORE ARGS added.
bench_graph() {
    echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    "$target/release/meshcat-bench-graph" --api "http://$api" --quic "$quic" --pid "$pid" \
        --data-dir "$work/data" --clusters "$CLUSTERS" --zones "$ZONES" --prefix svc \
        --upstreams "$UPSTREAMS" --agents "$AGENTS" --window "$WINDOW" --duration "$DURATION" \
        "$@"
}
