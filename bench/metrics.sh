#!/usr/bin/env bash
# Benchmark of the per-cluster and per-edge series on the aggregator's ops port (see
# docs/benchmarks.md, "Cluster metrics"): the same mesh as bench/graph.sh (CLUSTERS
# clusters in ZONES zones registered by meshcat-bench-writes, one instance of each
# reported by AGENTS simulated agents over the real QUIC ingest, each calling
# UPSTREAMS clusters of its zone), then meshcat-bench-graph, after its graph
# measurement, reads GET /metrics on the ops port: the exposition's size and series,
# SCRAPES scrapes in a row in identity encoding and SCRAPES with Accept-Encoding:
# gzip as Prometheus asks (time to the last byte, the aggregator's CPU per scrape),
# and SCRAPES gzip scrapes each after a registration change (each builds the graph
# afresh).
#
# The last line reads `metrics: <bytes> bytes (<bytes> gzip), <series> series (<n>
# cluster and edge); scrape p50 .. p99 .. (.. CPU), gzip p50 .. p99 .. (.. CPU),
# after a change p50 .. p99 ..`.
#
# Environment: CLUSTERS (10000), ZONES (20), UPSTREAMS (5), AGENTS (100), SCRAPES
# (20), WINDOW (60s, the --graph-window), DURATION (5s, of the GET /graph
# measurement that comes first), CARGO_TARGET_DIR (./target).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh

CLUSTERS=${CLUSTERS:-10000}
ZONES=${ZONES:-20}
UPSTREAMS=${UPSTREAMS:-5}
AGENTS=${AGENTS:-100}
SCRAPES=${SCRAPES:-20}
WINDOW=${WINDOW:-60s}
DURATION=${DURATION:-5s}

build_release

new_work

# The series measured here are served only with --cluster-metrics.
start_graph_mesh --cluster-metrics
bench_graph --ops "http://$ops" --scrapes "$SCRAPES" | tee "$work/metrics.out"
machine
grep '^metrics: ' "$work/metrics.out"
