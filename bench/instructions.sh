#!/usr/bin/env bash
# Instructions of the aggregator per agent report, counted by valgrind's callgrind:
# on a shared machine, where CPU time moves with the neighbours' load, the number of
# instructions does not. Runs each BINARY (a release meshcat-aggregator, for example
# one built before a change and one after) ROUNDS times, interleaved, under callgrind
# with AGENTS simulated agents (meshcat-bench-agents, as bench/ingest.sh runs them:
# INSTANCES instances of UPSTREAMS upstreams each, every INTERVAL, DURATION measured,
# LARGE agents with a 20,000-cluster sidecar), then prints per run the instructions
# executed (Ir) over the aggregator's whole life, the reports it applied
# (`meshcat_reports_received_total`), Ir per report, and per report the Ir spent on
# the source lines of each FILE:FIRST-LAST range of FILES (the code under test,
# inlined or not). A FILE is a path under the repository, or an absolute one (the
# debug information names each source by the absolute path it was built from, so a
# binary built from another checkout counts only the ranges of its own files).
#
# Usage: bench/instructions.sh BINARY... Environment: AGENTS (200), INSTANCES (10),
# UPSTREAMS (5), INTERVAL (5s), DURATION (30s), LARGE (0), ROUNDS (2), AGENTS_BIN
# (target/release/meshcat-bench-agents), FILES (the per-instance bound checks:
# aggregator/src/ingest/bounds.rs and the held sizes in the live instances),
# CARGO_TARGET_DIR (./target). Needs valgrind and python3.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh

AGENTS=${AGENTS:-200}
INSTANCES=${INSTANCES:-10}
UPSTREAMS=${UPSTREAMS:-5}
INTERVAL=${INTERVAL:-5s}
DURATION=${DURATION:-30s}
LARGE=${LARGE:-0}
ROUNDS=${ROUNDS:-2}
target=${CARGO_TARGET_DIR:-$root/target}
AGENTS_BIN=${AGENTS_BIN:-$target/release/meshcat-bench-agents}
# The bound checks: the rule (bounds.rs, all of it), and the held sizes the live
# instances compute (held_after, upstreams_after, the cluster set's host total).
FILES=${FILES:-"aggregator/src/ingest/bounds.rs:1-170 $(
    awk '/fn held_after\(/{s=NR} s&&/^    }$/{print "aggregator/src/store/instances.rs:" s "-" NR; exit}' aggregator/src/store/instances.rs
) $(
    awk '/pub fn upstreams_after\(/{s=NR} s&&/^    }$/{print "aggregator/src/store/traffic.rs:" s "-" NR; exit}' aggregator/src/store/traffic.rs
)"}
[ "$#" -ge 1 ] || { echo "usage: $0 BINARY..."; exit 64; }
command -v valgrind >/dev/null || { echo "valgrind is needed (Debian: valgrind)"; exit 1; }

new_work
machine
echo "lines counted: $FILES"

# run BINARY OUT: one run under callgrind; prints its line.
run() {
    local binary=$1 out=$2
    rm -rf "$work/data"
    : >"$work/log"
    RUST_LOG=warn,meshcat_aggregator=info valgrind --tool=callgrind --callgrind-out-file="$out" \
        --compress-strings=no --compress-pos=no \
        "$binary" serve --dev --max-instances-per-credential "$((AGENTS * INSTANCES * 2))" \
        "${FLEET_FLAGS[@]}" --api-addr 127.0.0.1:0 --ops-addr 127.0.0.1:0 \
        --quic-addr 127.0.0.1:0 --data-dir "$work/data" --log-format json 2>"$work/log" &
    pid=$!
    local quic="" ops=""
    for _ in $(seq 1 1200); do
        quic=$(grep 'Agent ingest listening' "$work/log" | grep -o '"addr":"[^"]*"' | head -1 | cut -d'"' -f4 || true)
        ops=$(grep -o '"ops":"[^"]*"' "$work/log" | head -1 | cut -d'"' -f4 || true)
        [ -n "$quic" ] && [ -n "$ops" ] && break
        sleep 0.1
    done
    [ -n "$quic" ] || { echo "the aggregator did not start"; cat "$work/log"; exit 1; }
    "$AGENTS_BIN" --agents "$AGENTS" --instances "$INSTANCES" --upstreams "$UPSTREAMS" \
        --interval "$INTERVAL" --duration "$DURATION" --connect-rate 50 --addr "$quic" \
        --pid "$pid" --data-dir "$work/data" --large "$LARGE" >"$work/agents" 2>&1
    # The agents are gone: the count no longer moves once the ops port renders again.
    sleep 6
    local reports
    reports=$(curl -sf "http://$ops/metrics" | awk '$1=="meshcat_reports_received_total"{print $2}')
    kill "$pid"
    wait "$pid" 2>/dev/null || true
    pid=""
    python3 - "$out" "$reports" "$binary" "$root" $FILES <<'EOF'
import os, sys
out, reports, binary, root, ranges = sys.argv[1], int(float(sys.argv[2])), sys.argv[3], sys.argv[4], sys.argv[5:]
want = []
for r in ranges:
    path, span = r.rsplit(":", 1)
    lo, hi = (int(x) for x in span.split("-"))
    want.append((r, os.path.join(root, path), lo, hi))
total = 0
counted = {r: 0 for r, _, _, _ in want}
fl = fi = None
skip = False
with open(out, errors="replace") as f:
    for line in f:
        if line.startswith(("fl=", "fi=", "fe=")):
            name = line[3:].strip()
            if line.startswith("fl="):
                fl = fi = name
            else:
                fi = name
            continue
        if line.startswith("fn="):
            fi = fl
            continue
        if line.startswith("calls="):
            skip = True
            continue
        if not line[:1].isdigit():
            continue
        if skip:
            skip = False
            continue
        parts = line.split()
        if len(parts) < 2:
            continue
        n, ir = int(parts[0]), int(parts[1])
        total += ir
        for r, path, lo, hi in want:
            if fi == path and lo <= n <= hi:
                counted[r] += ir
per = lambda ir: ir / reports if reports else 0
print(f"{binary}: Ir {total:,} over {reports:,} reports applied: {per(total):,.0f} Ir per report")
for r, ir in counted.items():
    if ir:
        print(f"    {r}: {per(ir):,.1f} Ir per report ({100 * ir / total:.4f}% of all)")
EOF
    grep -E "^(connected|measured)" "$work/agents" | sed 's/^/    /'
}

for round in $(seq 1 "$ROUNDS"); do
    i=0
    for binary in "$@"; do
        i=$((i + 1))
        run "$binary" "$work/callgrind.$round.$i"
    done
done
machine
