#!/usr/bin/env bash
# Instructions per catalog read, counted by valgrind's callgrind: the aggregator's
# `GET /clusters/{name}` beside the baseline of bench/catalog.sh (meshcat-bench-hello
# serving the very bytes of that answer from one static axum handler), REQUESTS
# requests each, one after the other on one kept-alive connection. CPU time per
# request moves with whatever else the machine runs; the instruction count does not,
# so this shows what the read path adds to the answer and where: per request, the
# instructions of each server (user space, every thread), their ratio, and the
# aggregator's TOP functions by inclusive instructions.
#
# Usage: bench/read-instructions.sh. Environment: REQUESTS (2000), CLUSTERS (100),
# TOP (30), AGGREGATOR (the aggregator binary to measure: the one built),
# CARGO_TARGET_DIR (./target). Needs valgrind and python3.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh

REQUESTS=${REQUESTS:-2000}
CLUSTERS=${CLUSTERS:-100}
TOP=${TOP:-30}
command -v valgrind >/dev/null || { echo "valgrind is needed (Debian: apt-get install valgrind)"; exit 1; }

build_release
new_work
hello_pid=""
trap 'stop "$hello_pid"; stop_work' EXIT

# reads ADDR PATH N: N requests for PATH on one connection to ADDR, each answer read
# whole (by its Content-Length) before the next is sent.
reads() {
    python3 - "$@" <<'EOF'
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
path, n = sys.argv[2], int(sys.argv[3])
s = socket.create_connection((host, int(port)))
request = f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
for _ in range(n):
    s.sendall(request)
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += s.recv(65536)
    head, _, body = buf.partition(b"\r\n\r\n")
    status = head.split(b"\r\n")[0]
    if b" 200 " not in status:
        sys.exit(f"{path}: {status.decode()}")
    length = next(int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += s.recv(65536)
s.close()
EOF
}

# count NAME PID ADDR PATH: zeroes the counts of callgrind's process PID, sends the
# reads, dumps the counts and prints the dump's path.
count() {
    local name=$1 p=$2 addr=$3 path=$4
    reads "$addr" "$path" 5
    callgrind_control -z "$p" >/dev/null
    reads "$addr" "$path" "$REQUESTS"
    callgrind_control -d "$p" >/dev/null
    ls -t "$work/$name".cg.* | head -1
}

# total FILE: the instructions a callgrind file counted.
total() {
    callgrind_annotate --auto=no "$1" | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}

echo "==> the aggregator under callgrind, $CLUSTERS clusters"
aggregator_wrap=(valgrind --tool=callgrind --callgrind-out-file="$work/aggregator.cg")
start_seconds=120
start_aggregator "$bin" --allow-anonymous-writes
"$target/release/meshcat-bench-writes" --api "http://$api" --writers 4 \
    --clusters "$CLUSTERS" --zones 5 --prefix svc >/dev/null
path=/clusters/svc-$(printf %06d $((CLUSTERS / 2)))
curl -sf "http://$api$path" >"$work/record.json"
echo "==> $REQUESTS reads of $path ($(wc -c <"$work/record.json") bytes)"
agg_file=$(count aggregator "$pid" "$api" "$path")

echo "==> the static record under callgrind"
valgrind --tool=callgrind --callgrind-out-file="$work/static.cg" \
    "$target/release/meshcat-bench-hello" --json "$work/record.json" >"$work/hello" 2>"$work/hello.log" &
hello_pid=$!
hello=$(listening_addr "$work/hello" 60)
[ -n "$hello" ] || { echo "the static server did not start"; cat "$work/hello.log"; exit 1; }
static_file=$(count static "$hello_pid" "$hello" /)

agg=$(total "$agg_file")
static=$(total "$static_file")
echo
machine
echo "instructions per request: aggregator $((agg / REQUESTS)), static record $((static / REQUESTS));" \
    "static / aggregator = $(awk -v a="$agg" -v s="$static" 'BEGIN {printf "%.2fx", s / a}')"
echo
echo "The aggregator's functions by instructions per request, inclusive (what each runs, callees"
echo "included), below the runtime's and the connection's frames (over 90% of the whole):"
callgrind_annotate --auto=no --inclusive=yes --threshold=99.9 "$agg_file" |
    awk -v n="$REQUESTS" -v top="$TOP" -v whole="$agg" '
        /^ *[0-9,]+ / && !/PROGRAM TOTALS/ {
            ir = $1; gsub(",", "", ir); ir += 0
            name = $0; sub(/^ *[0-9,]+ +(\([ 0-9.%]+\) +)?/, "", name)
            sub(/ \[[^]]*\]$/, "", name); sub(/^[^:]*\.rs:/, "", name)
            if (seen[name]++ || ir > 0.9 * whole || ir / n < 50) next
            printf "%8.0f  %s\n", ir / n, substr(name, 1, 150)
            if (++shown == top) exit
        }'
