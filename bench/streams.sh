#!/usr/bin/env bash
# Benchmark of the event streams' bounds (see docs/benchmarks.md, "Live updates"):
# builds the release binaries, starts the aggregator on free loopback ports with a
# temporary data directory, fills the catalog with BULK bulk writes of BULK_SIZE
# records and SINGLES single writes, opens READERS `GET /events` streams that read
# everything and STALLED connections (each with a 4 KiB receive buffer) that resume
# from the oldest retained id and never read, then makes RATE changes a second for
# DURATION seconds. Each record carries a DESCRIPTION-byte description.
# meshcat-bench-streams reports the aggregator's resident memory (VmRSS, VmHWM) and
# CPU (utime + stime) at each step.
#
# Environment: READERS (1000), STALLED (200), BULK (3), BULK_SIZE (1000),
# SINGLES (1000), DESCRIPTION (600), RATE (100), DURATION (10),
# CARGO_TARGET_DIR (./target),
# AGGREGATOR (an aggregator binary to measure instead of the one built here).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh

READERS=${READERS:-1000}
STALLED=${STALLED:-200}
BULK=${BULK:-3}
BULK_SIZE=${BULK_SIZE:-1000}
SINGLES=${SINGLES:-1000}
DESCRIPTION=${DESCRIPTION:-600}
RATE=${RATE:-100}
DURATION=${DURATION:-10}
build_release
binary=${AGGREGATOR:-$bin}

# Every stream is a socket on both sides.
ulimit -n "$(ulimit -Hn)"

new_work

# Room for every stream of the run (a binary without the cap has no such flag).
flags=(--dev)
if "$binary" --help | grep -q -- --max-event-streams; then
    flags+=(--max-event-streams "$((READERS + STALLED))")
fi
echo "==> starting the aggregator: $binary ${flags[*]}"
start_aggregator "$binary" "${flags[@]}"

"$target/release/meshcat-bench-streams" --api "http://$api" --pid "$pid" \
    --readers "$READERS" --stalled "$STALLED" --bulk "$BULK" --bulk-size "$BULK_SIZE" \
    --singles "$SINGLES" --description "$DESCRIPTION" --rate "$RATE" --duration "$DURATION" --clk-tck "$(getconf CLK_TCK)"
echo
machine
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
