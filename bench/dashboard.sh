#!/usr/bin/env bash
# Benchmark of the dashboard (see docs/benchmarks.md): builds the release aggregator,
# starts it on free ports with a temporary data directory, registers CLUSTERS clusters
# in ZONES zones (meshcat-bench-writes), then loads /ui/ RUNS times in Debian's
# Chromium through Playwright (bench/dashboard.py) and reports the bytes the page and
# its data cost, first contentful paint, the time to the first table rows, one search
# keystroke over every cluster and the page's JavaScript heap.
#
#     bench/dashboard.sh --graph
# measures the graph view instead: dashboard.py registers GRAPH_NODES clusters (1000)
# in GRAPH_ZONES zones (5), each declaring 3 others (3,000 edges), then reports the
# first canvas frame with every node, the frame rate while panning and zooming, and
# the page's main thread per frame drawn (CPU and wall time, from a Chromium trace
# of the same input); its last line reads `graph view: first frame <ms> ms, <fps> fps, <nodes> nodes,
# <edges> edges`. GRAPH_UI_DIR=<folder> serves the page's files from that folder (the
# aggregator/ui of another build) to compare two builds' pages.
#
# Needs what scripts/test.sh installs: chromium and Playwright in .venv.
# Environment: CLUSTERS (10000), ZONES (20), RUNS (5), MESHCAT_CHROMIUM (chromium),
# CARGO_TARGET_DIR (./target).
set -euo pipefail
mode=${1:-}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh

CLUSTERS=${CLUSTERS:-10000}
ZONES=${ZONES:-20}
RUNS=${RUNS:-5}
chromium=${MESHCAT_CHROMIUM:-$(command -v chromium || echo /usr/bin/chromium)}

build_release

new_work

echo "==> starting the aggregator"
# Writes without a token: the benchmark registers through the API on loopback.
start_aggregator "$bin" --allow-anonymous-writes

machine=$(machine)
if [ "$mode" = "--graph" ]; then
    echo "==> the graph view, $RUNS loads in $("$chromium" --version 2>/dev/null | head -1); $machine"
    # Last, so the script's own last line is the output's last line.
    .venv/bin/python bench/dashboard.py --graph "http://$api" "$chromium" "$RUNS"
    exit
fi

echo "==> registering $CLUSTERS clusters in $ZONES zones"
"$target/release/meshcat-bench-writes" --api "http://$api" --writers 8 --bulk 500 \
    --clusters "$CLUSTERS" --zones "$ZONES" --prefix svc

echo "==> loading the dashboard $RUNS times in $("$chromium" --version 2>/dev/null | head -1)"
.venv/bin/python bench/dashboard.py "http://$api" "$chromium" "$RUNS"
echo "$machine"
