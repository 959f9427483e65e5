#!/usr/bin/env bash
# Benchmark of the agent ingest against the whole aggregator (see docs/benchmarks.md):
# builds the release binaries, starts the aggregator (--dev) on free ports with a
# temporary data directory, pinned to one core, and runs meshcat-bench-agents pinned
# to the other: AGENTS simulated agents over QUIC, each reporting INSTANCES instances
# every INTERVAL, each instance with UPSTREAMS upstream clusters whose traffic
# counters move on every report. It prints the reports accepted and rejected, the
# aggregator's CPU (of one core), the acknowledgement latency (report to visible)
# and the aggregator's memory over DURATION after the ramp-up and one interval.
#
# Environment: AGENTS (10000), INSTANCES (10), UPSTREAMS (5), INTERVAL (5s),
# DURATION (30s), CONNECT_RATE (300), LARGE (0: agents whose first instance knows
# LARGE_CLUSTERS (20000) idle upstream clusters), WHOLE (set: every report whole, as
# agents of protocol version 1 sent them), AGGREGATOR_FLAGS (more flags for the aggregator,
# e.g. `--history-max-entries 0`), AGGREGATOR (the aggregator binary to measure: the
# one built), CARGO_TARGET_DIR (./target).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh

AGENTS=${AGENTS:-10000}
INSTANCES=${INSTANCES:-10}
UPSTREAMS=${UPSTREAMS:-5}
INTERVAL=${INTERVAL:-5s}
DURATION=${DURATION:-30s}
CONNECT_RATE=${CONNECT_RATE:-300}
LARGE=${LARGE:-0}
LARGE_CLUSTERS=${LARGE_CLUSTERS:-20000}

build_release

new_work

echo "==> starting the aggregator"
# Every simulated agent presents the development certificate: its bound on
# instances is raised to the fleet's.
read -r -a extra <<< "${AGGREGATOR_FLAGS:-}"
start_aggregator "$bin" --dev --max-instances-per-credential "$((AGENTS * INSTANCES * 2))" \
    "${FLEET_FLAGS[@]}" "${extra[@]}"
wait_quic
# The aggregator on core 1, the load generator on core 0: on a 2-core machine they
# would otherwise take each other's time.
taskset -a -pc 1 "$pid" >/dev/null
ulimit -n "$((AGENTS + 1024))" 2>/dev/null || true

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
taskset -c 0 "$target/release/meshcat-bench-agents" --agents "$AGENTS" --instances "$INSTANCES" \
    --upstreams "$UPSTREAMS" --interval "$INTERVAL" --duration "$DURATION" \
    --connect-rate "$CONNECT_RATE" --addr "$quic" --pid "$pid" --data-dir "$work/data" \
    --large "$LARGE" --large-clusters "$LARGE_CLUSTERS" ${WHOLE:+--whole}
machine
