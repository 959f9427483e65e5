#!/usr/bin/env bash
# Benchmark of the dependency graph (see docs/benchmarks.md): builds the release
# binaries, starts the aggregator (--dev) on free ports with a temporary data
# directory, registers CLUSTERS clusters in ZONES zones, then meshcat-bench-graph
# runs AGENTS simulated agents over the real QUIC ingest reporting one instance of
# every cluster, first without upstream traffic and then each calling UPSTREAMS
# clusters of its zone (CLUSTERS x UPSTREAMS edges). It reads the aggregator's
# resident memory without and with the edges (memory per edge: the difference
# divided by the edge count) and measures GET /graph over one keep-alive connection
# with Accept-Encoding: gzip for DURATION.
#
# The last line reads `graph: p99 <ms> ms, <bytes> bytes per edge, <nodes> nodes,
# <edges> edges`.
#
# Environment: CLUSTERS (10000), ZONES (20), UPSTREAMS (5), AGENTS (100),
# DURATION (20s), WINDOW (60s, the aggregator's --graph-window, waited out before
# memory is read), CARGO_TARGET_DIR (./target).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh

CLUSTERS=${CLUSTERS:-10000}
ZONES=${ZONES:-20}
UPSTREAMS=${UPSTREAMS:-5}
AGENTS=${AGENTS:-100}
DURATION=${DURATION:-20s}
WINDOW=${WINDOW:-60s}

build_release

new_work

start_graph_mesh
bench_graph | tee "$work/graph.out"
machine
tail -1 "$work/graph.out"
