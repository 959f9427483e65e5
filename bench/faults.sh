#!/usr/bin/env bash
# Faults tried on the release aggregator (see docs/reliability.md). Builds the release
# binaries, then:
#
#   kill  ROUNDS rounds of `kill -9` of the aggregator while WRITERS concurrent writers
#         register clusters (POST /clusters, each on its own curl loop), killed after
#         a random 1 to 3 s; each round restarts it on the same data directory and
#         measures the time from the restart to GET /readyz 200, then checks that
#         every registration answered 201 before the kill is listed (lost
#         acknowledged writes) and that nothing is listed that was never written.
#   disk  ROUNDS rounds of a full disk: the data directory on a tmpfs of 24 MiB
#         (needs root: mount), filled to its last byte while the aggregator runs,
#         registrations until one answers 507, more refused for a random 1 to 3 s,
#         then the tmpfs grown to 96 MiB and a registration tried every 10 ms: the
#         time from space returning (the remount) to the first 201, and whether every
#         acknowledged registration is listed.
#
# Usage: bench/faults.sh [kill|disk|all] (default all). Environment: ROUNDS (5),
# WRITERS (8), CARGO_TARGET_DIR (./target). Each round prints one line; a last line
# per mode sums them up.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# shellcheck source=bench/lib.sh
. bench/lib.sh

MODE=${1:-all}
ROUNDS=${ROUNDS:-5}
WRITERS=${WRITERS:-8}

build_release
new_work
writers=()
disk=""
cleanup() {
    for w in "${writers[@]}"; do kill "$w" 2>/dev/null || true; done
    if [ -n "$pid" ]; then
        kill -9 "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    pid=""
    if [ -n "$disk" ]; then umount -l "$disk" 2>/dev/null || true; fi
    stop_work
}
trap cleanup EXIT

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# A description that makes each record take a few KiB.
desc=$(printf 'x%.0s' $(seq 1 2000))

# post NAME: the status of POST /clusters for cluster NAME of zone z.
post() {
    curl -s -o /dev/null -w '%{http_code}' -m 10 -H 'content-type: application/json' \
        -d "{\"zoneName\":\"z\",\"clusterName\":\"$1\",\"name\":\"$1\",\"description\":\"$desc\"}" \
        "http://$api/clusters" || true
}

# listed: the cluster names GET /clusters lists, one a line, sorted.
listed() {
    curl -sf "http://$api/clusters" | grep -o '"clusterName":"[^"]*"' | cut -d'"' -f4 | sort
}

# wait_ready: waits until GET /readyz answers 200.
wait_ready() {
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://$ops/readyz" || true)" = 200 ]; do
        sleep 0.005
    done
}

# writer N ROUND: registers clusters w<ROUND>-<N>-<i> until killed; appends each name
# answered 201 to $work/acked.
writer() {
    local i=0
    while :; do
        local name="w$2-$1-$i"
        if [ "$(post "$name")" = 201 ]; then echo "$name" >>"$work/acked"; fi
        i=$((i + 1))
    done
}

kill_rounds() {
    echo "==> kill -9 under $WRITERS writers, $ROUNDS rounds"
    : >"$work/acked"
    start_aggregator "$bin" --allow-anonymous-writes
    wait_ready
    curl -sf -o /dev/null -H 'content-type: application/json' \
        -d '{"zoneName":"z","serverAddress":"cp:50000"}' "http://$api/zones"
    local total_lost=0 readies=()
    for r in $(seq 1 "$ROUNDS"); do
        writers=()
        for n in $(seq 1 "$WRITERS"); do
            writer "$n" "$r" &
            writers+=($!)
        done
        sleep "$((1 + RANDOM % 3)).$((RANDOM % 10))"
        kill -9 "$pid"
        wait "$pid" 2>/dev/null || true
        pid=""
        for w in "${writers[@]}"; do kill "$w" 2>/dev/null || true; done
        wait "${writers[@]}" 2>/dev/null || true
        writers=()
        local t0
        t0=$(now_ms)
        start_aggregator "$bin" --allow-anonymous-writes
        wait_ready
        local ready=$(($(now_ms) - t0))
        readies+=("$ready")
        listed >"$work/listed"
        sort -u "$work/acked" >"$work/acked.sorted"
        local lost
        lost=$(comm -23 "$work/acked.sorted" "$work/listed" | wc -l)
        # Every listed cluster was written by a writer (w<round>-...).
        local foreign
        foreign=$(grep -cv '^w[0-9]*-[0-9]*-[0-9]*$' "$work/listed" || true)
        total_lost=$((total_lost + lost))
        echo "round $r: $(wc -l <"$work/acked.sorted") acknowledged in all, $lost lost, $foreign never written, ready ${ready} ms after the restart"
    done
    echo "kill: $ROUNDS rounds, $total_lost acknowledged writes lost, ready after ${readies[*]} ms"
    kill "$pid" && wait "$pid" 2>/dev/null || true
    pid=""
}

disk_rounds() {
    echo "==> a full disk, $ROUNDS rounds"
    local heals=()
    for r in $(seq 1 "$ROUNDS"); do
        disk="$work/disk"
        mkdir -p "$disk"
        mount -t tmpfs -o size=24m tmpfs "$disk"
        mkdir "$disk/data"
        rm -rf "$work/data"
        ln -s "$disk/data" "$work/data"
        : >"$work/acked"
        start_aggregator "$bin" --allow-anonymous-writes
        wait_ready
        curl -sf -o /dev/null -H 'content-type: application/json' \
            -d '{"zoneName":"z","serverAddress":"cp:50000"}' "http://$api/zones"
        # Fill to the last byte: large blocks first, then ever smaller ones.
        for bs in 1M 64k 4k 512 1; do
            dd if=/dev/zero of="$disk/filler-$bs" bs="$bs" status=none 2>/dev/null || true
        done
        local i=0 code
        while :; do
            code=$(post "d$r-$i")
            [ "$code" = 201 ] && echo "d$r-$i" >>"$work/acked"
            [ "$code" != 201 ] && break
            i=$((i + 1))
        done
        [ "$code" = 507 ] || { echo "round $r: a write on the full disk answered $code, not 507"; exit 1; }
        # Full for a random 1 to 3 s, writes refused meanwhile.
        local until_ms=$(($(now_ms) + 1000 + RANDOM % 2000)) refused=1
        while [ "$(now_ms)" -lt "$until_ms" ]; do
            code=$(post "d$r-x")
            [ "$code" = 507 ] || { echo "round $r: a write on the full disk answered $code, not 507"; exit 1; }
            refused=$((refused + 1))
            sleep 0.05
        done
        local t0 healed
        t0=$(now_ms)
        mount -o remount,size=96m "$disk"
        i=0
        until [ "$(post "h$r-$i")" = 201 ]; do
            i=$((i + 1))
            sleep 0.01
        done
        healed=$(($(now_ms) - t0))
        echo "h$r-$i" >>"$work/acked"
        heals+=("$healed")
        listed >"$work/listed"
        sort -u "$work/acked" >"$work/acked.sorted"
        local lost
        lost=$(comm -23 "$work/acked.sorted" "$work/listed" | wc -l)
        echo "round $r: 507 after $(($(wc -l <"$work/acked.sorted") - 1)) registrations ($refused refused while full), writes back ${healed} ms after space returned ($i tries refused after), $lost acknowledged lost"
        kill "$pid" && wait "$pid" 2>/dev/null || true
        pid=""
        umount "$disk"
        disk=""
    done
    echo "disk: $ROUNDS rounds, writes back after ${heals[*]} ms"
}

machine
case "$MODE" in
kill) kill_rounds ;;
disk) disk_rounds ;;
all)
    kill_rounds
    disk_rounds
    ;;
*)
    echo "usage: $0 [kill|disk|all]"
    exit 64
    ;;
esac
machine
