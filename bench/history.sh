#!/usr/bin/env bash
# Benchmark of the history (see docs/benchmarks.md): builds the release binaries,
# records ENTRIES entries into a fresh data directory through the history's own
# queue and writer thread (appends per second, recording to durable; bytes on disk
# per entry), starts the aggregator on that data directory and reads GET /history
# over one keep-alive connection for every filter the API offers, alone and
# combined, common ones and rare ones (3 entries among ENTRIES), then runs
# bench/ingest.sh ROUNDS times with the history off and on, interleaved (each round
# in the other order), and compares the aggregator's CPU per report.
#
# The last line reads `history: <n> appends/s, newest 100 p99 <ms> ms, worst filter
# p99 <ms> ms (<filter>), <bytes> bytes per entry, <n> entries`.
#
# With FLOOD_INSTANCES, it then floods a fresh history: that many instances flipping
# every FLOOD_EVERY seconds and diagnoses at --history-max-diagnoses, until
# FLOOD_BYTES are full (or FLOOD_ENTRIES held), reading the newest 100 entries
# meanwhile (meshcat-bench-history flood).
#
# Environment: ENTRIES (10000000), CHURN (0: entries recorded beyond ENTRIES, each
# making the history drop its oldest, as a full history does), REQUESTS (2000),
# ROUNDS (2; 0 skips the ingest comparison), INGEST_AGENTS (2000), INGEST_DURATION
# (15s), FLOOD_INSTANCES (0: no flood), FLOOD_EVERY (5), FLOOD_BYTES (536870912),
# FLOOD_ENTRIES (100000000), MAX_BYTES (64GiB: the history's --history-max-bytes, past
# what ENTRIES take), CARGO_TARGET_DIR (./target).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh

ENTRIES=${ENTRIES:-10000000}
CHURN=${CHURN:-0}
REQUESTS=${REQUESTS:-2000}
ROUNDS=${ROUNDS:-2}
INGEST_AGENTS=${INGEST_AGENTS:-2000}
INGEST_DURATION=${INGEST_DURATION:-15s}
FLOOD_INSTANCES=${FLOOD_INSTANCES:-0}
FLOOD_EVERY=${FLOOD_EVERY:-5}
FLOOD_BYTES=${FLOOD_BYTES:-536870912}
FLOOD_ENTRIES=${FLOOD_ENTRIES:-100000000}
MAX_BYTES=${MAX_BYTES:-68719476736}

build_release
bench="$target/release/meshcat-bench-history"

new_work

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "==> recording $((ENTRIES + CHURN)) entries, keeping $ENTRIES"
"$bench" fill --data-dir "$work/data" --entries "$((ENTRIES + CHURN))" --keep "$ENTRIES" \
    --max-bytes "$MAX_BYTES" | tee "$work/fill.out"
appends=$(grep -o '[0-9]* appends/s' "$work/fill.out" | cut -d' ' -f1)
per_entry=$(grep -o '[0-9]* bytes per entry' "$work/fill.out" | cut -d' ' -f1)

echo "==> GET /history against the aggregator on that data directory"
start_aggregator "$bin" --history-max-entries "$ENTRIES" --history-max-bytes "$MAX_BYTES"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$bench" read --api "http://$api" --requests "$REQUESTS" | tee "$work/read.out"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
p99=$(grep '^GET /history? (newest' "$work/read.out" | grep -o 'p99 [0-9.]*' | cut -d' ' -f2)
worst=$(grep '^worst p99' "$work/read.out" | cut -d' ' -f3-)
kill "$pid" && wait "$pid" 2>/dev/null || true
pid=""

if [ "$ROUNDS" -gt 0 ]; then
    echo "==> bench/ingest.sh, $INGEST_AGENTS agents, history off and on, interleaved"
    for round in $(seq 1 "$ROUNDS"); do
        # Each round in the other order: whichever runs second gets a machine the
        # first just warmed.
        order="off on"
        [ $((round % 2)) = 0 ] && order="on off"
        for mode in $order; do
            flags=""
            [ "$mode" = off ] && flags="--history-max-entries 0"
            AGENTS=$INGEST_AGENTS DURATION=$INGEST_DURATION AGGREGATOR_FLAGS="$flags" \
                bench/ingest.sh >"$work/ingest-$mode-$round.out" 2>&1 || {
                    cat "$work/ingest-$mode-$round.out"; exit 1; }
            accepted=$(grep -o 'reports accepted [0-9]* ([0-9]*/s' "$work/ingest-$mode-$round.out" | grep -o '([0-9]*' | tr -d '(')
            cpu=$(grep -o 'ingest cpu [0-9.]*%' "$work/ingest-$mode-$round.out" | grep -o '[0-9.]*')
            p99ack=$(grep -o 'p99 [0-9.]*' "$work/ingest-$mode-$round.out" | head -1 | cut -d' ' -f2)
            echo "round $round, history $mode: $accepted reports/s, aggregator cpu $cpu% of one core, ack p99 $p99ack ms" \
                | tee -a "$work/ingest.summary"
        done
    done
    awk '/history off/ { split($0, a, "cpu "); off += a[2] + 0; n_off++ }
         /history on/  { split($0, a, "cpu "); on += a[2] + 0; n_on++ }
         END { if (n_off && n_on) printf "ingest cpu: history off %.1f%%, on %.1f%% (%+.1f%%)\n",
               off / n_off, on / n_on, (on / n_on - off / n_off) / (off / n_off) * 100 }' "$work/ingest.summary"
fi
if [ "$FLOOD_INSTANCES" -gt 0 ]; then
    echo "==> flood: $FLOOD_INSTANCES instances flipping on every report, until $FLOOD_BYTES bytes"
    "$bench" flood --data-dir "$work/flood" --instances "$FLOOD_INSTANCES" \
        --report-every "$FLOOD_EVERY" --max-bytes "$FLOOD_BYTES" --max-entries "$FLOOD_ENTRIES"
fi
machine
echo "history: $appends appends/s, newest 100 p99 $p99 ms, worst filter p99 $worst, $per_entry bytes per entry, $ENTRIES entries"
