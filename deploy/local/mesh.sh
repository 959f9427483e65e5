#!/usr/bin/env bash
# A whole meshcat mesh on one machine, for the quick start:
#   deploy/local/mesh.sh up [--foreground] [--envoy-only] [--ha]
#   deploy/local/mesh.sh status
#   deploy/local/mesh.sh stop
#
# `up` builds the binaries (cargo build --release), installs Envoy (scripts/envoy.sh),
# then starts on 127.0.0.1: the aggregator (--dev, data in .local-mesh/data), an edge
# Envoy and two service Envoys (catalog, reviews) each in front of a python3
# http.server upstream, one agent per Envoy; registers the zone `local` and its three
# clusters (`meshcat apply -f deploy/local/catalog.yaml`), sends some traffic through
# the edge, and prints what to try.
# Every process runs in its own session, so `up` returns and the mesh stays up; their
# pids go to .local-mesh/pids and `stop` ends exactly those. With --foreground, `up`
# stays attached and Ctrl-C stops the mesh. --envoy-only starts just the Envoys and
# upstreams (no build, no meshcat). --ha starts three etcd members (Debian's etcd,
# installed by scripts/deps.sh etcd when missing) and three aggregator replicas on
# them instead of one aggregator; the agents are spread over the replicas, each
# with the whole list so it moves on when its replica stops. etcd is never open,
# not even here: clients and peers speak TLS and must present a certificate, made
# by deploy/certs/etcd-certs.sh into .local-mesh/etcd-tls; the replicas get the
# client certificate (--etcd-ca-file, --etcd-cert, --etcd-key).
# State and logs live in .local-mesh/ at the repository root (logs in .local-mesh/logs).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
state="$root/.local-mesh"
pids="$state/pids"
logs="$state/logs"

# Fixed ports, documented in deploy/local/README.md.
EDGE_PORT=18000 EDGE_ADMIN=18901
CATALOG_PORT=18010 CATALOG_ADMIN=18911 CATALOG_APP=18110
REVIEWS_PORT=18020 REVIEWS_ADMIN=18921 REVIEWS_APP=18120
API_PORT=18080 QUIC_PORT=18443 OPS_PORT=18091
EDGE_AGENT_OPS=18092 CATALOG_AGENT_OPS=18093 REVIEWS_AGENT_OPS=18094
# --ha: etcd members (client, peer), their plain-HTTP /health and /metrics, and the
# second and third replicas (api, quic, ops).
ETCD_PORTS=(18379 18380 18381 18382 18383 18384)
ETCD_METRICS=(18385 18386 18387)
HA_API=(18080 18081 18082) HA_QUIC=(18443 18444 18445) HA_OPS=(18091 18095 18096)
HA=0
ZONE=local
API="http://127.0.0.1:$API_PORT"

say() { printf '==> %s\n' "$*"; }
die() { printf 'mesh.sh: %s\n' "$*" >&2; exit 1; }

# Polls a command until it succeeds or the deadline (seconds) passes.
wait_for() {
  local what=$1 deadline=$2; shift 2
  local end=$((SECONDS + deadline))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$end" ] || die "$what not ready after ${deadline}s (see $logs/)"
    sleep 0.2
  done
}

record() { echo "$1 $2" >>"$pids"; }

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# True when pid $1 still runs the program recorded as $2, so a recycled pid is never hit.
is_ours() {
  alive "$1" && tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -q -- "$2"
}

live_pids() {
  [ -f "$pids" ] || return 0
  while read -r pid name; do
    if is_ours "$pid" "$name"; then echo "$pid $name"; fi
  done <"$pids"
}

check_ports() {
  local tcp=("$@")
  python3 - "$QUIC_PORT" "${tcp[@]}" <<'PY' || die "ports in use (see above); stop what holds them or run: deploy/local/mesh.sh stop"
import socket, sys
udp, tcp = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
busy = []
for port, kind in [(p, socket.SOCK_STREAM) for p in tcp] + [(udp, socket.SOCK_DGRAM)]:
    s = socket.socket(socket.AF_INET, kind)
    # Servers set SO_REUSEADDR too: connections in TIME_WAIT do not block them.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", port))
    except OSError as e:
        busy.append(f"{port}/{'tcp' if kind == socket.SOCK_STREAM else 'udp'} ({e.strerror})")
    finally:
        s.close()
if busy:
    print("busy: " + ", ".join(busy), file=sys.stderr)
    sys.exit(1)
PY
}

# Starts a program in its own session, detached from this shell; records its pid.
spawn() {
  local name=$1; shift
  setsid nohup "$@" >"$logs/$name.out" 2>&1 </dev/null &
  record $! "$(basename "$1")"
}

# Envoy exits when the process that spawned it dies (PR_SET_PDEATHSIG), so a small
# sh in its own session stays as its parent; stopping Envoy ends that sh too.
spawn_envoy() {
  local name=$1 config=$2 base_id=$3
  local pidfile="$state/envoy-$name.pid"
  rm -f "$pidfile"
  setsid nohup sh -c '"$@" & echo $! >"'"$pidfile"'"; wait $!' meshcat-envoy-"$name" \
    "$ENVOY" --config-path "$config" --base-id "$base_id" \
    --log-path "$logs/$name.log" --file-flush-interval-msec 200 \
    --service-cluster "$name" --service-node "$name-1" \
    >"$logs/$name.out" 2>&1 </dev/null &
  record $! "meshcat-envoy-$name"
  wait_for "envoy $name pid" 10 test -s "$pidfile"
  record "$(cat "$pidfile")" "$ENVOY"
  # A stopped Envoy leaves its hot restart region in /dev/shm; stop removes it.
  echo "$base_id" >"$state/envoy-$name.base"
}

# Bootstrap of one Envoy: an HTTP listener whose routes map path prefixes to clusters,
# an admin on loopback, access lines into the same log file as Envoy's own log.
write_bootstrap() {
  local file=$1 name=$2 port=$3 admin=$4 routes=$5 clusters=$6
  cat >"$file" <<YAML
node: { id: $name-1, cluster: $name }
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: $admin } }
static_resources:
  listeners:
    - name: ingress
      address: { socket_address: { address: 127.0.0.1, port_value: $port } }
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress_http
                access_log:
                  - name: envoy.access_loggers.file
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
                      path: $logs/$name.log
                route_config:
                  name: $name
                  virtual_hosts:
                    - name: $name
                      domains: ["*"]
                      routes:
$routes
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
$clusters
YAML
}

route() { # prefix cluster rewrite
  cat <<YAML
                        - match: { prefix: "$1" }
                          route:
                            cluster: $2
                            prefix_rewrite: "$3"
                            retry_policy: { retry_on: "connect-failure,reset", num_retries: 1 }
YAML
}

cluster() { # name port
  cat <<YAML
    - name: $1
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: $1
        endpoints:
          - lb_endpoints:
              - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $2 } } }
YAML
}

start_data_plane() {
  say "envoy"
  ENVOY=$("$root/scripts/envoy.sh")
  "$ENVOY" --version | grep -o 'version: [^ ]*' | head -1

  mkdir -p "$state/envoy" "$state/www/catalog" "$state/www/reviews"
  for svc in catalog reviews; do
    printf '<h1>%s</h1><p>served by python3 http.server behind its Envoy sidecar</p>\n' "$svc" \
      >"$state/www/$svc/index.html"
    printf '{"service": "%s", "ok": true}\n' "$svc" >"$state/www/$svc/health.json"
  done

  write_bootstrap "$state/envoy/edge.yaml" edge "$EDGE_PORT" "$EDGE_ADMIN" \
    "$(route /catalog/ catalog /; route /reviews/ reviews /)" \
    "$(cluster catalog "$CATALOG_PORT"; cluster reviews "$REVIEWS_PORT")"
  write_bootstrap "$state/envoy/catalog.yaml" catalog "$CATALOG_PORT" "$CATALOG_ADMIN" \
    "$(route / catalog /)" "$(cluster catalog "$CATALOG_APP")"
  write_bootstrap "$state/envoy/reviews.yaml" reviews "$REVIEWS_PORT" "$REVIEWS_ADMIN" \
    "$(route / reviews /)" "$(cluster reviews "$REVIEWS_APP")"

  say "upstreams and Envoys"
  spawn catalog-app python3 -m http.server "$CATALOG_APP" --bind 127.0.0.1 --directory "$state/www/catalog"
  spawn reviews-app python3 -m http.server "$REVIEWS_APP" --bind 127.0.0.1 --directory "$state/www/reviews"
  spawn_envoy catalog "$state/envoy/catalog.yaml" "$CATALOG_ADMIN"
  spawn_envoy reviews "$state/envoy/reviews.yaml" "$REVIEWS_ADMIN"
  spawn_envoy edge "$state/envoy/edge.yaml" "$EDGE_ADMIN"
  for admin in "$EDGE_ADMIN" "$CATALOG_ADMIN" "$REVIEWS_ADMIN"; do
    wait_for "envoy admin :$admin" 30 curl -fsS "http://127.0.0.1:$admin/ready"
  done
  wait_for "catalog through the edge" 15 curl -fsS "http://127.0.0.1:$EDGE_PORT/catalog/health.json"
  wait_for "reviews through the edge" 15 curl -fsS "http://127.0.0.1:$EDGE_PORT/reviews/health.json"
}

# Three members on 127.0.0.1 with TLS for clients and peers, each demanding a
# certificate of its CA (--client-cert-auth, --peer-client-cert-auth); /health is
# served in plain HTTP on a port of its own. Certificates: deploy/certs/etcd-certs.sh
# (member N uses meshcat-etcd-N, which names 127.0.0.1).
start_etcd() {
  local etcd_bin cluster="" i tls="$state/etcd-tls"
  etcd_bin=$(command -v etcd || echo /usr/bin/etcd)
  say "etcd certificates ($tls)"
  "$root/deploy/certs/etcd-certs.sh" --out "$tls" --members 3 --quiet
  for i in 0 1 2; do cluster+="m$i=https://127.0.0.1:${ETCD_PORTS[$((2 * i + 1))]},"; done
  say "etcd (three members, TLS with client certificates)"
  for i in 0 1 2; do
    local client=https://127.0.0.1:${ETCD_PORTS[$((2 * i))]} peer=https://127.0.0.1:${ETCD_PORTS[$((2 * i + 1))]}
    ETCD_UNSUPPORTED_ARCH=$(uname -m) spawn "etcd-$i" "$etcd_bin" --name "m$i" \
      --data-dir "$state/etcd/m$i" --listen-client-urls "$client" --advertise-client-urls "$client" \
      --listen-peer-urls "$peer" --initial-advertise-peer-urls "$peer" \
      --listen-metrics-urls "http://127.0.0.1:${ETCD_METRICS[$i]}" \
      --initial-cluster "${cluster%,}" --initial-cluster-state new --max-txn-ops 4096 \
      --client-cert-auth --trusted-ca-file "$tls/ca.crt" \
      --cert-file "$tls/server/meshcat-etcd-$i.crt" --key-file "$tls/server/meshcat-etcd-$i.key" \
      --peer-client-cert-auth --peer-trusted-ca-file "$tls/peer-ca.crt" \
      --peer-cert-file "$tls/peer/meshcat-etcd-$i.crt" --peer-key-file "$tls/peer/meshcat-etcd-$i.key"
  done
  for i in 0 1 2; do
    wait_for "etcd member $i healthy" 30 etcd_healthy "$i"
  done
  # Without a client certificate a member must refuse the connection.
  if curl -sS --max-time 3 -o /dev/null --cacert "$tls/ca.crt" \
      "https://127.0.0.1:${ETCD_PORTS[0]}/version" 2>/dev/null; then
    die "etcd member 0 answered a client without a certificate; check its flags in $logs/etcd-0.out"
  fi
}

# True when member $1 reports itself healthy (needs a leader).
etcd_healthy() {
  curl -fsS --max-time 2 "http://127.0.0.1:${ETCD_METRICS[$1]}/health" | grep -q '"health":"true"'
}

start_meshcat() {
  local bin=${CARGO_TARGET_DIR:-$root/target}/release
  local dev="$state/data/dev"
  local lists=("127.0.0.1:$QUIC_PORT" "127.0.0.1:$QUIC_PORT" "127.0.0.1:$QUIC_PORT")
  if [ "$HA" = 1 ]; then
    start_etcd
    local store="etcd://127.0.0.1:${ETCD_PORTS[0]},127.0.0.1:${ETCD_PORTS[2]},127.0.0.1:${ETCD_PORTS[4]}/meshcat-local" i
    local tls="$state/etcd-tls"
    for i in 0 1 2; do
      say "aggregator replica $i (--dev, --store etcd over TLS)"
      spawn "aggregator-$i" "$bin/meshcat-aggregator" serve --dev --data-dir "$state/data" \
        --store "$store" --etcd-ca-file "$tls/ca.crt" \
        --etcd-cert "$tls/client/aggregator.crt" --etcd-key "$tls/client/aggregator.key" \
        --api-addr "127.0.0.1:${HA_API[$i]}" --advertise-addr "127.0.0.1:${HA_API[$i]}" \
        --quic-addr "127.0.0.1:${HA_QUIC[$i]}" --ops-addr "127.0.0.1:${HA_OPS[$i]}" \
        --cluster-metrics
      # The first replica writes the development certificates the others read.
      wait_for "replica $i /readyz" 30 curl -fsS "http://127.0.0.1:${HA_OPS[$i]}/readyz"
    done
    # Each agent starts on a different replica and knows the other two.
    local q=("127.0.0.1:${HA_QUIC[0]}" "127.0.0.1:${HA_QUIC[1]}" "127.0.0.1:${HA_QUIC[2]}")
    lists=("${q[0]},${q[1]},${q[2]}" "${q[1]},${q[2]},${q[0]}" "${q[2]},${q[0]},${q[1]}")
  else
    say "aggregator (--dev)"
    spawn aggregator "$bin/meshcat-aggregator" serve --dev --data-dir "$state/data" \
      --api-addr "127.0.0.1:$API_PORT" --quic-addr "127.0.0.1:$QUIC_PORT" \
      --ops-addr "127.0.0.1:$OPS_PORT" --cluster-metrics
    wait_for "aggregator /readyz" 30 curl -fsS "http://127.0.0.1:$OPS_PORT/readyz"
  fi
  wait_for "dev certificates in $dev" 10 test -s "$dev/agent-key.pem"

  say "agents"
  local name admin ops n=0
  for spec in "edge $EDGE_ADMIN $EDGE_AGENT_OPS" "catalog $CATALOG_ADMIN $CATALOG_AGENT_OPS" \
              "reviews $REVIEWS_ADMIN $REVIEWS_AGENT_OPS"; do
    read -r name admin ops <<<"$spec"
    spawn "agent-$name" "$bin/meshcat-agent" --aggregator "${lists[$n]}" \
      --server-name localhost --ca-file "$dev/ca.pem" --cert "$dev/agent.pem" \
      --key "$dev/agent-key.pem" --sidecar-admin "127.0.0.1:$admin" --zone "$ZONE" \
      --cluster "$name" --instance "$name-1" --sidecar-log-file "$logs/$name.log" \
      --ops-addr "127.0.0.1:$ops" --interval 2s
    n=$((n + 1))
  done
  for ops in "$EDGE_AGENT_OPS" "$CATALOG_AGENT_OPS" "$REVIEWS_AGENT_OPS"; do
    wait_for "agent ops :$ops" 20 curl -fsS "http://127.0.0.1:$ops/healthz"
  done

  say "registrations (meshcat apply -f deploy/local/catalog.yaml)"
  "$bin/meshcat" --api "$API" apply -f "$root/deploy/local/catalog.yaml"
}

traffic() {
  say "traffic through the edge"
  local ok=0 i
  for i in $(seq 1 20); do
    curl -fsS -o /dev/null "http://127.0.0.1:$EDGE_PORT/catalog/" && ok=$((ok + 1))
    curl -fsS -o /dev/null "http://127.0.0.1:$EDGE_PORT/reviews/health.json" && ok=$((ok + 1))
  done
  echo "$ok/40 requests answered 200"
}

print_help() {
  cat <<TXT

meshcat local mesh is up (state and logs in .local-mesh/).
  edge (entry)        http://127.0.0.1:$EDGE_PORT/catalog/   http://127.0.0.1:$EDGE_PORT/reviews/
  Envoy admins        http://127.0.0.1:$EDGE_ADMIN/  :$CATALOG_ADMIN  :$REVIEWS_ADMIN
TXT
  if [ "$1" = full ]; then
    cat <<TXT
  dashboard           $API/ui/
  catalog API         $API/summary   $API/services   $API/openapi.json
  aggregator metrics  http://127.0.0.1:$OPS_PORT/metrics

Try (docs/cli.md):
  export MESHCAT_API=$API PATH="${CARGO_TARGET_DIR:-$root/target}/release:\$PATH"
  meshcat get clusters
  meshcat describe cluster catalog --zone $ZONE
  meshcat check
  meshcat diagnose catalog --zone $ZONE --symptom no_healthy_upstream
  curl -s '$API/metrics/catalog/catalog-1?zoneName=$ZONE' | python3 -m json.tool
TXT
  fi
  echo
  echo "Stop it with: deploy/local/mesh.sh stop"
}

cmd_stop() {
  [ -f "$pids" ] || { echo "nothing to stop"; return 0; }
  local pid name left
  # Reverse start order: agents before the aggregator, Envoys before their upstreams.
  # An Envoy's wrapper sh is left alone: it reaps its Envoy and then exits by itself.
  while read -r pid name; do
    case "$name" in meshcat-envoy-* | etcd) continue ;; esac
    if is_ours "$pid" "$name"; then kill -TERM "$pid" 2>/dev/null || true; fi
  done < <(tac "$pids")
  # etcd members one at a time (--ha): stopped together, each leader hands its
  # leadership to a member that is going away too and waits seconds for it.
  local end
  while read -r pid name; do
    if [ "$name" != etcd ] || ! is_ours "$pid" "$name"; then continue; fi
    kill -TERM "$pid" 2>/dev/null || true
    end=$((SECONDS + 6))
    while is_ours "$pid" "$name" && [ "$SECONDS" -lt "$end" ]; do sleep 0.1; done
  done < <(tac "$pids")
  end=$((SECONDS + 6))
  while left=$(live_pids) && [ -n "$left" ] && [ "$SECONDS" -lt "$end" ]; do sleep 0.2; done
  if [ -n "$left" ]; then
    echo "still running after SIGTERM, sending SIGKILL: $(echo "$left" | tr '\n' ' ')"
    while read -r pid name; do kill -KILL "$pid" 2>/dev/null || true; done <<<"$left"
  fi
  local f
  for f in "$state"/envoy-*.base; do
    [ -f "$f" ] || continue
    rm -f "/dev/shm/envoy_shared_memory_$(($(cat "$f") * 10))" "$f"
  done
  rm -f "$pids" "$state"/envoy-*.pid
  echo "local mesh stopped"
}

cmd_status() {
  [ -f "$pids" ] || { echo "local mesh is not running"; return 0; }
  local pid name
  while read -r pid name; do
    if is_ours "$pid" "$name"; then echo "running  $pid  $name"; else echo "stopped  $pid  $name"; fi
  done <"$pids"
  local urls=("http://127.0.0.1:$EDGE_PORT/catalog/" "http://127.0.0.1:$OPS_PORT/readyz")
  if grep -q ' etcd$' "$pids"; then
    urls+=("http://127.0.0.1:${HA_OPS[1]}/readyz" "http://127.0.0.1:${HA_OPS[2]}/readyz")
    urls+=("http://127.0.0.1:${ETCD_METRICS[0]}/health" "http://127.0.0.1:${ETCD_METRICS[1]}/health")
    urls+=("http://127.0.0.1:${ETCD_METRICS[2]}/health")
  fi
  for url in "${urls[@]}"; do
    printf '%s  %s\n' "$(curl -s -o /dev/null -w '%{http_code}' "$url" || true)" "$url"
  done
}

# EXIT trap of `up`: stops what was started when `up` fails.
stop_on_failure() {
  local rc=$?
  if [ "$rc" -ne 0 ]; then cmd_stop; fi
}

cmd_up() {
  local foreground=0 envoy_only=0
  for a in "$@"; do
    case "$a" in
      --foreground) foreground=1 ;;
      --envoy-only) envoy_only=1 ;;
      --ha) HA=1 ;;
      *) die "unknown option $a (use --foreground, --envoy-only, --ha)" ;;
    esac
  done
  [ -z "$(live_pids)" ] || die "already up (deploy/local/mesh.sh status); stop it first"
  mkdir -p "$logs"
  : >"$pids"
  check_ports "$EDGE_PORT" "$EDGE_ADMIN" "$CATALOG_PORT" "$CATALOG_ADMIN" "$CATALOG_APP" \
    "$REVIEWS_PORT" "$REVIEWS_ADMIN" "$REVIEWS_APP" "$API_PORT" "$OPS_PORT" \
    "$EDGE_AGENT_OPS" "$CATALOG_AGENT_OPS" "$REVIEWS_AGENT_OPS"
  if [ "$HA" = 1 ]; then
    check_ports "${ETCD_PORTS[@]}" "${ETCD_METRICS[@]}" "${HA_API[@]:1}" "${HA_OPS[@]:1}"
    "$root/scripts/deps.sh" etcd
    # Each `up --ha` starts a fresh etcd cluster.
    rm -rf "$state/etcd"
  fi
  # A failure half-way leaves nothing behind.
  trap stop_on_failure EXIT
  if [ "$foreground" = 1 ]; then
    trap 'echo; cmd_stop; trap - EXIT; exit 0' INT TERM
  fi
  if [ "$envoy_only" = 0 ]; then
    say "building meshcat (cargo build --release)"
    "$root/scripts/deps.sh" build
    (cd "$root" && cargo build --release --locked -p meshcat-aggregator -p meshcat-agent -p meshcat-cli)
  fi
  start_data_plane
  if [ "$envoy_only" = 0 ]; then
    start_meshcat
  fi
  traffic
  if [ "$envoy_only" = 0 ]; then print_help full; else print_help envoy; fi
  if [ "$foreground" = 1 ]; then
    echo "Running in the foreground: Ctrl-C stops the mesh."
    while [ -n "$(live_pids)" ]; do sleep 1; done
    echo "every process of the mesh has exited"
    cmd_stop
  fi
  trap - EXIT
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *) echo "usage: deploy/local/mesh.sh up [--foreground] [--envoy-only] [--ha] | status | stop" >&2; exit 2 ;;
esac
