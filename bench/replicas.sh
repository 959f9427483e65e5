#!/usr/bin/env bash
# Benchmark of replicas on etcd (see docs/benchmarks.md): starts a three-member etcd
# cluster and three aggregator replicas (release build) on loopback, then
#  1. meshcat-bench-replicas: writes on replica 0, each awaited on replica 1
#     (acknowledged writes/s, ack and write-to-visible latency p50/p99);
#  2. the same against one aggregator on redb (read from itself), for comparison;
#  3. AGENTS simulated agents (meshcat-bench-agents, INSTANCES each) reporting to
#     replica 0 every 5 s, and the etcd writes per second they cause in steady
#     state (etcd's own put/txn/delete counters over MEASURE seconds after ramp-up).
# Environment: CLUSTERS (2000), WRITERS (16), AGENTS (10000), INSTANCES (1),
# MEASURE (30), CARGO_TARGET_DIR (./target).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
CLUSTERS=${CLUSTERS:-2000}
WRITERS=${WRITERS:-16}
AGENTS=${AGENTS:-10000}
INSTANCES=${INSTANCES:-1}
MEASURE=${MEASURE:-30}
target=${CARGO_TARGET_DIR:-$root/target}

scripts/deps.sh build etcd
cargo build --release -p meshcat-aggregator -p meshcat-bench
bin="$target/release"
etcd_bin=$(command -v etcd || echo /usr/bin/etcd)
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_url() { for _ in $(seq 1 300); do curl -fsS "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done; echo "timeout: $1" >&2; return 1; }

cluster="" ; clients=()
for i in 0 1 2; do cp[$i]=$(port); pp[$i]=$(port); cluster+="m$i=http://127.0.0.1:${pp[$i]},"; clients+=("127.0.0.1:${cp[$i]}"); done
for i in 0 1 2; do
  ETCD_UNSUPPORTED_ARCH=$(uname -m) "$etcd_bin" --name "m$i" --data-dir "$work/m$i" \
    --listen-client-urls "http://127.0.0.1:${cp[$i]}" --advertise-client-urls "http://127.0.0.1:${cp[$i]}" \
    --listen-peer-urls "http://127.0.0.1:${pp[$i]}" --initial-advertise-peer-urls "http://127.0.0.1:${pp[$i]}" \
    --initial-cluster "${cluster%,}" --initial-cluster-state new --max-txn-ops 4096 \
    >"$work/etcd-$i.log" 2>&1 &
  pids+=($!)
done
for i in 0 1 2; do wait_url "http://127.0.0.1:${cp[$i]}/health"; done
store="etcd://$(IFS=,; echo "${clients[*]}")/bench"

mkdir -p "$work/data"
for i in 0 1 2; do
  api[$i]=$(port); ops[$i]=$(port); quic[$i]=$(port)
  "$bin/meshcat-aggregator" --dev --data-dir "$work/data" --store "$store" \
    --api-addr "127.0.0.1:${api[$i]}" --advertise-addr "127.0.0.1:${api[$i]}" \
    --ops-addr "127.0.0.1:${ops[$i]}" --quic-addr "127.0.0.1:${quic[$i]}" >"$work/replica-$i.log" 2>&1 &
  pids+=($!); rpid[$i]=$!
  wait_url "http://127.0.0.1:${ops[$i]}/readyz"
done

echo "==> 3 replicas on etcd: write on replica 0, visible on replica 1"
"$bin/meshcat-bench-replicas" --write "http://127.0.0.1:${api[0]}" --read "http://127.0.0.1:${api[1]}" \
  --writers "$WRITERS" --clusters "$CLUSTERS"

echo "==> one aggregator on redb"
rapi=$(port); rops=$(port); rquic=$(port)
"$bin/meshcat-aggregator" --data-dir "$work/redb" --api-addr "127.0.0.1:$rapi" \
  --ops-addr "127.0.0.1:$rops" --quic-addr "127.0.0.1:$rquic" >"$work/redb.log" 2>&1 &
pids+=($!); redb_pid=$!
wait_url "http://127.0.0.1:$rops/readyz"
"$bin/meshcat-bench-replicas" --write "http://127.0.0.1:$rapi" --read "http://127.0.0.1:$rapi" \
  --writers "$WRITERS" --clusters "$CLUSTERS"
kill "$redb_pid"

etcd_writes() {
  curl -fsS "http://127.0.0.1:${cp[0]}/metrics" |
    awk '/^etcd_mvcc_(put|delete|txn)_total /{s+=$2} END{printf "%d\n", s}'
}
echo "==> $AGENTS agents ($INSTANCES instances each, every 5 s) on replica 0: etcd writes in steady state"
"$bin/meshcat-bench-agents" --agents "$AGENTS" --instances "$INSTANCES" --addr "127.0.0.1:${quic[0]}" \
  --pid "${rpid[0]}" --data-dir "$work/data" --duration "$((MEASURE + 40))s" >"$work/agents.out" 2>&1 &
apid=$!; pids+=($apid)
# Ramp-up (about 300 connections/s here) and every agent's first publications,
# then measure the steady state.
sleep $((AGENTS / 250 + 30))
w0=$(etcd_writes); t0=$(date +%s)
sleep "$MEASURE"
w1=$(etcd_writes); t1=$(date +%s)
echo "etcd writes (put+delete+txn) during $((t1 - t0)) s of steady state: $((w1 - w0)) ($(awk -v w=$((w1 - w0)) -v t=$((t1 - t0)) 'BEGIN{printf "%.2f", w/t}')/s)"
published=$(curl -fsS "http://127.0.0.1:${api[1]}/services" | python3 -c 'import json,sys; print(sum(len(c.get("instances",[])) for c in json.load(sys.stdin)))')
echo "instances shown on replica 1 (published by replica 0): $published"
wait "$apid" || true
cat "$work/agents.out"
