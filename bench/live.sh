#!/usr/bin/env bash
# Benchmark of live updates (see docs/benchmarks.md): builds the release binaries,
# starts the aggregator on free ports with a temporary data directory, opens STREAMS
# `GET /events` streams, and makes RATE catalog changes a second (PUT of registered
# clusters) for DURATION seconds. meshcat-bench-live reports the aggregator's CPU
# over that window (utime + stime from /proc), its memory (VmRSS, VmHWM), and the
# latency from each change being applied (the write answered) to each stream
# receiving its event (p50, p99, max).
#
# Environment: STREAMS (1000), RATE (100), DURATION (30), CLUSTERS (100),
# CARGO_TARGET_DIR (./target).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh

STREAMS=${STREAMS:-1000}
RATE=${RATE:-100}
DURATION=${DURATION:-30}
CLUSTERS=${CLUSTERS:-100}
build_release

# Every stream is a socket on both sides.
ulimit -n "$(ulimit -Hn)"

new_work

echo "==> starting the aggregator"
start_aggregator "$bin" --dev

live() {
    "$target/release/meshcat-bench-live" --api "http://$api" --pid "$pid" --rate "$RATE" \
        --duration "$DURATION" --clusters "$CLUSTERS" --clk-tck "$(getconf CLK_TCK)" "$@"
}
# The same writes without streams first: what the streams add is the difference.
echo "==> baseline: no stream, $RATE changes/s for ${DURATION}s"
live --streams 0 --prefix base
echo
echo "==> $STREAMS streams, $RATE changes/s for ${DURATION}s"
live --streams "$STREAMS" --prefix live
echo
machine
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
