#!/usr/bin/env bash
# A whole meshcat mesh on one machine, for the quick start:
#   deploy/local/mesh.sh up [--foreground] [--envoy-only] [--ha]
#   deploy/local/mesh.sh status
#   deploy/local/mesh.sh stop
#   deploy/local/mesh.sh hold <instance>
#   deploy/local/mesh.sh release <instance>
#   deploy/local/mesh.sh identities
#   deploy/local/mesh.sh rotate [secret]
#   deploy/local/mesh.sh stop-rotation | start-rotation
#   deploy/local/mesh.sh expire <secret> [lifetime]
#   deploy/local/mesh.sh wrong-san | right-san
#
# `up` builds the binaries (cargo build --release), installs Envoy (scripts/envoy.sh),
# then starts on 127.0.0.1: the zone's xDS control server (meshcat-control-server,
# serving the mesh file .local-mesh/mesh.json over ADS), the aggregator (--dev, data
# in .local-mesh/data), an edge Envoy and two service Envoys (catalog, reviews) each
# in front of a python3 http.server upstream, one agent per Envoy; registers the zone
# `local` (its serverAddress is the control server) and its three clusters
# (`meshcat apply -f deploy/local/catalog.yaml`), sends some traffic through the edge,
# and prints what to try.
# Every Envoy keeps its listener and routes static in its bootstrap (with the access
# log its agent tails) and takes its clusters and their endpoints from the control
# server (CDS and EDS over ADS; LDS too, which the mesh file leaves empty).
# The edge calls catalog and reviews over mTLS: the control server's identity issuer
# gives each Envoy its certificate (secrets edge, catalog, reviews, SPIFFE ids
# spiffe://local/ns/local/sa/<name>) and the CA (secret ca) over SDS; the services'
# listeners demand a client certificate, the edge's clusters catalog and reviews
# present the edge's and check the service's SPIFFE id.
# `identities` lists the certificates the control server issued; `rotate [secret]`
# replaces one (or all) at once; `stop-rotation` lets them age (past half their
# lifetime, then expired), `start-rotation` replaces the overdue ones; `expire
# <secret> [lifetime]` issues one that lives only that long (default 10m);
# `wrong-san` makes the edge expect a SPIFFE id catalog does not present (every
# request to /catalog/ fails 503 UF), `right-san` puts it back. Each prints what
# changed and what the Envoys' own /certs show.
# `hold <instance>` keeps one sidecar on the snapshot it has and then gives the
# catalog a second upstream (127.0.0.1:18111): the other sidecars get it, the held one
# does not, and after the aggregator's --sync-grace `meshcat sync` shows it stale.
# `release <instance>` lets it catch up, then takes the second upstream away again.
# Every process runs in its own session, so `up` returns and the mesh stays up; their
# pids go to .local-mesh/pids and `stop` ends exactly those. With --foreground, `up`
# stays attached and Ctrl-C stops the mesh. --envoy-only starts just the control
# server, the Envoys and the upstreams (building only the control server, no
# meshcat). --ha starts three etcd members (Debian's etcd, installed by
# scripts/deps.sh etcd when missing) and three aggregator replicas on
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
CATALOG_PORT=18010 CATALOG_ADMIN=18911 CATALOG_APP=18110 CATALOG_APP_2=18111
REVIEWS_PORT=18020 REVIEWS_ADMIN=18921 REVIEWS_APP=18120
API_PORT=18080 QUIC_PORT=18443 OPS_PORT=18091
EDGE_AGENT_OPS=18092 CATALOG_AGENT_OPS=18093 REVIEWS_AGENT_OPS=18094
# The control server: ADS (gRPC, plaintext HTTP/2) and its HTTP admin API.
CONTROL_PORT=18600 CONTROL_ADMIN=18601
# How long a sidecar may differ from the control server before it is `stale`.
SYNC_GRACE=10s
# Workload identity: the SPIFFE id of each secret the control server issues, the
# CA's secret, each certificate's lifetime (replaced at half of it), the id the edge
# expects of catalog after `wrong-san`, and how long `expire` makes one live.
EDGE_ID=spiffe://local/ns/local/sa/edge
CATALOG_ID=spiffe://local/ns/local/sa/catalog
REVIEWS_ID=spiffe://local/ns/local/sa/reviews
CA_SECRET=ca
IDENTITY_LIFETIME=24h
WRONG_SAN=spiffe://local/ns/shop/sa/catalog
EXPIRE_LIFETIME=10m
EDGE_IDLE_MS=2000
# --ha: etcd members (client, peer), their plain-HTTP /health and /metrics, and the
# second and third replicas (api, quic, ops).
ETCD_PORTS=(18379 18380 18381 18382 18383 18384)
ETCD_METRICS=(18385 18386 18387)
HA_API=(18080 18081 18082) HA_QUIC=(18443 18444 18445) HA_OPS=(18091 18095 18096)
HA=0
ZONE=local
API="http://127.0.0.1:$API_PORT"
CONTROL="http://127.0.0.1:$CONTROL_ADMIN"
mesh="$state/mesh.json"
bin=${CARGO_TARGET_DIR:-$root/target}/release
# The sidecars, as `instance:admin port`; the instance is also the Envoy's node id.
SIDECARS=("edge-1:$EDGE_ADMIN" "catalog-1:$CATALOG_ADMIN" "reviews-1:$REVIEWS_ADMIN")
# The identities, as `secret:SPIFFE id`; secret <name> is the certificate of Envoy <name>-1.
IDENTITIES=("edge:$EDGE_ID" "catalog:$CATALOG_ID" "reviews:$REVIEWS_ID")

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

# Bootstrap of one Envoy: node id `<name>-1` (the instance its agent reports) and
# cluster `<name>`; its clusters (CDS, EDS) and listeners (LDS) come over ADS from the
# control server through the static HTTP/2 cluster `xds`. Its HTTP listener stays
# static: its routes map path prefixes to those clusters (not checked at load, since
# the clusters arrive later over CDS) and its access lines go into the same log file
# as Envoy's own log. With $6 = mtls the listener demands mTLS: it presents the
# certificate of secret <name> and accepts clients whose certificate the CA (secret
# ca) signed, both over SDS from the control server (ADS). The admin listens on
# loopback.
write_bootstrap() {
  local file=$1 name=$2 port=$3 admin=$4 routes=$5 tls=${6:-}
  local chain="- filters:"
  if [ "$tls" = mtls ]; then
    chain="- transport_socket:
            name: envoy.transport_sockets.tls
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext
              require_client_certificate: true
              common_tls_context:
                tls_certificate_sds_secret_configs:
                  - name: $name
                    sds_config: { ads: {}, resource_api_version: V3 }
                validation_context_sds_secret_config:
                  name: $CA_SECRET
                  sds_config: { ads: {}, resource_api_version: V3 }
          filters:"
  fi
  cat >"$file" <<YAML
node: { id: $name-1, cluster: $name }
admin:
  address: { socket_address: { address: 127.0.0.1, port_value: $admin } }
dynamic_resources:
  ads_config:
    api_type: GRPC
    transport_api_version: V3
    grpc_services:
      - envoy_grpc: { cluster_name: xds }
        retry_policy: { retry_back_off: { base_interval: 0.5s, max_interval: 5s } }
  cds_config: { ads: {}, resource_api_version: V3 }
  lds_config: { ads: {}, resource_api_version: V3 }
static_resources:
  listeners:
    - name: ingress
      address: { socket_address: { address: 127.0.0.1, port_value: $port } }
      filter_chains:
        $chain
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
                  validate_clusters: false
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
    - name: xds
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: { http2_protocol_options: {} }
      load_assignment:
        cluster_name: xds
        endpoints:
          - lb_endpoints:
              - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $CONTROL_PORT } } }
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

# The UpstreamTlsContext of an edge cluster: the edge's certificate and the CA over
# SDS, the service's certificate required to carry URI SAN $1.
edge_tls() {
  printf '{"certificate_sds": "edge", "ca": {"sds": "%s"}, "match_sans": [{"san_type": "URI", "matcher": {"exact": "%s"}}]}' \
    "$CA_SECRET" "$1"
}

# The SPIFFE id the edge expects of catalog: its own, or after `wrong-san` one it
# does not present.
catalog_expected() {
  if [ -f "$state/wrong-san" ]; then echo "$WRONG_SAN"; else echo "$CATALOG_ID"; fi
}

# How many catalog upstreams the mesh file lists now (2 while a sidecar is held).
app_count() {
  if [ -f "$mesh" ] && grep -q "\"port\": $CATALOG_APP_2" "$mesh"; then echo 2; else echo 1; fi
}

# The mesh the control server serves (its --mesh file, re-read when it changes):
# `catalog` and `reviews` are the service sidecars' listeners (what the edge routes
# to, over mTLS: only the edge gets them, as they carry its certificate; their idle
# connections close after $EDGE_IDLE_MS ms, so that a request after a pause makes a
# new handshake with the certificates of the moment),
# `catalog-app` and `reviews-app` the upstreams behind them (every sidecar gets
# them). $1: how many catalog upstreams (1, or 2 while a sidecar is held).
# Written to a temporary file first, then renamed, so it is never read half-written.
write_mesh() {
  local app2=""
  if [ "$1" = 2 ]; then app2=", {\"address\": \"127.0.0.1\", \"port\": $CATALOG_APP_2}"; fi
  cat >"$mesh.tmp" <<JSON
{
  "clusters": [
    {"name": "catalog", "node_clusters": ["edge"], "endpoints": [{"address": "127.0.0.1", "port": $CATALOG_PORT}],
     "idle_timeout_ms": $EDGE_IDLE_MS, "tls": $(edge_tls "$(catalog_expected)")},
    {"name": "reviews", "node_clusters": ["edge"], "endpoints": [{"address": "127.0.0.1", "port": $REVIEWS_PORT}],
     "idle_timeout_ms": $EDGE_IDLE_MS, "tls": $(edge_tls "$REVIEWS_ID")},
    {"name": "catalog-app", "endpoints": [{"address": "127.0.0.1", "port": $CATALOG_APP}$app2]},
    {"name": "reviews-app", "endpoints": [{"address": "127.0.0.1", "port": $REVIEWS_APP}]}
  ],
  "listeners": []
}
JSON
  mv -f "$mesh.tmp" "$mesh"
}

start_control_server() {
  say "control server (ADS 127.0.0.1:$CONTROL_PORT, admin $CONTROL, identities edge, catalog, reviews)"
  rm -f "$state/held" "$state/wrong-san"
  write_mesh 1
  local ids=() id
  for id in "${IDENTITIES[@]}"; do ids+=(--identity "${id%%:*}=${id#*:},${id%%:*}.local"); done
  spawn control-server "$bin/meshcat-control-server" --listen "127.0.0.1:$CONTROL_PORT" \
    --mesh "$mesh" --admin "127.0.0.1:$CONTROL_ADMIN" "${ids[@]}" \
    --identity-lifetime "$IDENTITY_LIFETIME" --ca-secret "$CA_SECRET"
  wait_for "control server admin" 15 curl -fsS "$CONTROL/nodes"
}

start_data_plane() {
  say "envoy"
  ENVOY=$("$root/scripts/envoy.sh")
  "$ENVOY" --version | grep -o 'version: [^ ]*' | head -1

  mkdir -p "$state/envoy" "$state/www/catalog" "$state/www/reviews" "$state/www/catalog-2"
  for svc in catalog reviews; do
    printf '<h1>%s</h1><p>served by python3 http.server behind its Envoy sidecar</p>\n' "$svc" \
      >"$state/www/$svc/index.html"
    printf '{"service": "%s", "ok": true}\n' "$svc" >"$state/www/$svc/health.json"
  done
  printf '<h1>catalog</h1><p>served by the second catalog upstream (127.0.0.1:%s)</p>\n' \
    "$CATALOG_APP_2" >"$state/www/catalog-2/index.html"
  printf '{"service": "catalog", "upstream": 2, "ok": true}\n' >"$state/www/catalog-2/health.json"

  write_bootstrap "$state/envoy/edge.yaml" edge "$EDGE_PORT" "$EDGE_ADMIN" \
    "$(route /catalog/ catalog /; route /reviews/ reviews /)"
  write_bootstrap "$state/envoy/catalog.yaml" catalog "$CATALOG_PORT" "$CATALOG_ADMIN" \
    "$(route / catalog-app /)" mtls
  write_bootstrap "$state/envoy/reviews.yaml" reviews "$REVIEWS_PORT" "$REVIEWS_ADMIN" \
    "$(route / reviews-app /)" mtls

  start_control_server
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
  local dev="$state/data/dev"
  local lists=("127.0.0.1:$QUIC_PORT" "127.0.0.1:$QUIC_PORT" "127.0.0.1:$QUIC_PORT")
  if [ "$HA" = 1 ]; then
    start_etcd
    local store="etcd://127.0.0.1:${ETCD_PORTS[0]},127.0.0.1:${ETCD_PORTS[2]},127.0.0.1:${ETCD_PORTS[4]}/meshcat-local" i
    local tls="$state/etcd-tls"
    for i in 0 1 2; do
      say "aggregator replica $i (--dev, --store etcd over TLS, --sync-grace $SYNC_GRACE)"
      spawn "aggregator-$i" "$bin/meshcat-aggregator" serve --dev --data-dir "$state/data" \
        --store "$store" --etcd-ca-file "$tls/ca.crt" \
        --etcd-cert "$tls/client/aggregator.crt" --etcd-key "$tls/client/aggregator.key" \
        --api-addr "127.0.0.1:${HA_API[$i]}" --advertise-addr "127.0.0.1:${HA_API[$i]}" \
        --quic-addr "127.0.0.1:${HA_QUIC[$i]}" --ops-addr "127.0.0.1:${HA_OPS[$i]}" \
        --cluster-metrics --sync-grace "$SYNC_GRACE"
      # The first replica writes the development certificates the others read.
      wait_for "replica $i /readyz" 30 curl -fsS "http://127.0.0.1:${HA_OPS[$i]}/readyz"
    done
    # Each agent starts on a different replica and knows the other two.
    local q=("127.0.0.1:${HA_QUIC[0]}" "127.0.0.1:${HA_QUIC[1]}" "127.0.0.1:${HA_QUIC[2]}")
    lists=("${q[0]},${q[1]},${q[2]}" "${q[1]},${q[2]},${q[0]}" "${q[2]},${q[0]},${q[1]}")
  else
    say "aggregator (--dev, --sync-grace $SYNC_GRACE)"
    spawn aggregator "$bin/meshcat-aggregator" serve --dev --data-dir "$state/data" \
      --api-addr "127.0.0.1:$API_PORT" --quic-addr "127.0.0.1:$QUIC_PORT" \
      --ops-addr "127.0.0.1:$OPS_PORT" --cluster-metrics --sync-grace "$SYNC_GRACE"
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
  wait_for "zone $ZONE connected to its control server" 20 zone_connected
}

# True when the aggregator holds an ADS stream to the zone's control server.
zone_connected() {
  curl -fsS --max-time 2 "$API/zones/$ZONE/control" | grep -q '"state": *"connected"'
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
  control server      ADS 127.0.0.1:$CONTROL_PORT, admin $CONTROL/nodes, mesh file .local-mesh/mesh.json
  identities          edge -> catalog, reviews over mTLS; certificates over SDS: $CONTROL/identities
TXT
  if [ "$1" = full ]; then
    cat <<TXT
  dashboard           $API/ui/
  catalog API         $API/summary   $API/services   $API/openapi.json
  aggregator metrics  http://127.0.0.1:$OPS_PORT/metrics

Try (docs/cli.md):
  export MESHCAT_API=$API PATH="${CARGO_TARGET_DIR:-$root/target}/release:\$PATH"
  meshcat get clusters
  meshcat get zones
  meshcat sync
  meshcat describe cluster catalog --zone $ZONE
  meshcat check
  meshcat diagnose catalog --zone $ZONE --symptom no_healthy_upstream
  curl -s '$API/metrics/catalog/catalog-1?zoneName=$ZONE' | python3 -m json.tool

A sidecar that falls behind its control server (stale after --sync-grace $SYNC_GRACE):
  deploy/local/mesh.sh hold catalog-1
  deploy/local/mesh.sh release catalog-1
TXT
  fi
  cat <<TXT

Workload identity (each Envoy's own /certs shows its certificate, "path": "<inline>"):
  curl -s http://127.0.0.1:$CATALOG_ADMIN/certs | python3 -m json.tool
  deploy/local/mesh.sh identities
  deploy/local/mesh.sh rotate catalog            # a new serial, pushed to catalog-1
  deploy/local/mesh.sh expire catalog 2m         # a certificate that expires in 2 minutes
  deploy/local/mesh.sh stop-rotation             # certificates age, then expire
  deploy/local/mesh.sh start-rotation
  deploy/local/mesh.sh wrong-san                 # the edge expects a SAN catalog lacks: 503 UF
  deploy/local/mesh.sh right-san
TXT
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
  rm -f "$pids" "$state"/envoy-*.pid "$state/held" "$state/catalog-app-2.pid" "$state/wrong-san"
  echo "local mesh stopped"
}

cmd_status() {
  [ -f "$pids" ] || { echo "local mesh is not running"; return 0; }
  local pid name
  while read -r pid name; do
    if is_ours "$pid" "$name"; then echo "running  $pid  $name"; else echo "stopped  $pid  $name"; fi
  done <"$pids"
  local urls=("http://127.0.0.1:$EDGE_PORT/catalog/" "$CONTROL/nodes")
  if grep -q ' meshcat-aggregator$' "$pids"; then urls+=("http://127.0.0.1:$OPS_PORT/readyz"); fi
  if grep -q ' etcd$' "$pids"; then
    urls+=("http://127.0.0.1:${HA_OPS[1]}/readyz" "http://127.0.0.1:${HA_OPS[2]}/readyz")
    urls+=("http://127.0.0.1:${ETCD_METRICS[0]}/health" "http://127.0.0.1:${ETCD_METRICS[1]}/health")
    urls+=("http://127.0.0.1:${ETCD_METRICS[2]}/health")
  fi
  for url in "${urls[@]}"; do
    printf '%s  %s\n' "$(curl -s -o /dev/null -w '%{http_code}' "$url" || true)" "$url"
  done
  # The control server's nodes: which sidecars (and meshcat replicas) hold a stream.
  curl -fsS --max-time 2 "$CONTROL/nodes" 2>/dev/null | python3 -c '
import json, sys
for n in json.load(sys.stdin):
    print("node     %s  (cluster %s)%s" % (n["id"], n["cluster"], "  HELD" if n["held"] else ""))
' || true
  if [ -s "$state/held" ]; then
    echo "held: $(cat "$state/held") (deploy/local/mesh.sh release $(cat "$state/held"))"
  fi
  # The certificates the control server issued (no key is ever shown).
  curl -fsS --max-time 2 "$CONTROL/identities" 2>/dev/null | python3 -c '
import json, sys
v = json.load(sys.stdin)
print("rotation %s" % ("running" if v["rotation"] else "STOPPED (deploy/local/mesh.sh start-rotation)"))
for i in v["identities"]:
    print("identity %-8s serial %s  expires %s" % (i["secret"], i["serial"], i["expiresAt"]))
' || true
  if [ -f "$state/wrong-san" ]; then
    echo "the edge expects $WRONG_SAN of catalog (deploy/local/mesh.sh right-san)"
  fi
}

# The admin port of a sidecar instance; fails for an unknown one.
admin_of() {
  local s
  for s in "${SIDECARS[@]}"; do
    if [ "${s%%:*}" = "$1" ]; then echo "${s##*:}"; return 0; fi
  done
  return 1
}

# The instance names, for messages.
sidecar_names() {
  local s out=""
  for s in "${SIDECARS[@]}"; do out+="${s%%:*}, "; done
  echo "${out%, }"
}

# The hosts of the sidecar at admin port $1 in cluster catalog-app, comma-separated.
app_hosts() {
  curl -fsS --max-time 2 "http://127.0.0.1:$1/clusters" |
    sed -n 's/^catalog-app::\([0-9.]*:[0-9]*\)::health_flags::.*/\1/p' | sort -u | paste -sd, - | sed 's/,/, /g'
}

# True when the sidecar at admin port $1 has the second catalog upstream.
has_app_2() {
  curl -fsS --max-time 2 "http://127.0.0.1:$1/clusters" | grep -q "^catalog-app::127.0.0.1:$CATALOG_APP_2::"
}

lacks_app_2() { ! has_app_2 "$@"; }

# The nodes the control server holds, space-separated.
held_nodes() {
  curl -fsS --max-time 2 "$CONTROL/nodes" |
    python3 -c 'import json, sys; print(" ".join(n["id"] for n in json.load(sys.stdin) if n["held"]))'
}

node_connected() {
  curl -fsS --max-time 2 "$CONTROL/nodes" |
    python3 -c 'import json, sys; sys.exit(0 if any(n["id"] == sys.argv[1] for n in json.load(sys.stdin)) else 1)' "$1"
}

# Checks the instance names a sidecar of the running mesh, connected to the control
# server; prints its admin port.
sidecar_arg() {
  local instance=$1 admin
  [ -n "$instance" ] || die "name the sidecar instance: $(sidecar_names)"
  admin=$(admin_of "$instance") || die "no sidecar instance $instance (the sidecars are $(sidecar_names))"
  curl -fsS --max-time 2 "$CONTROL/nodes" >/dev/null 2>&1 ||
    die "the control server does not answer at $CONTROL (deploy/local/mesh.sh up first)"
  node_connected "$instance" || die "$instance is not connected to the control server (see $CONTROL/nodes)"
  echo "$admin"
}

# Holds a sidecar on its snapshot (control server POST /hold/<node>), then adds a
# second catalog upstream to the mesh file: every other sidecar gets it over EDS,
# the held one keeps the one it had.
cmd_hold() {
  local instance=${1:-} admin held s other
  admin=$(sidecar_arg "$instance")
  held=$(cat "$state/held" 2>/dev/null || true)
  [ -z "$held" ] || die "$held is held already; deploy/local/mesh.sh release $held first"
  say "holding $instance on its snapshot (POST $CONTROL/hold/$instance)"
  curl -fsS -X POST "$CONTROL/hold/$instance" >/dev/null
  echo "$instance" >"$state/held"
  say "adding a second catalog upstream (http.server 127.0.0.1:$CATALOG_APP_2) to the mesh file"
  if ! is_ours "$(cat "$state/catalog-app-2.pid" 2>/dev/null || true)" python3; then
    spawn catalog-app-2 python3 -m http.server "$CATALOG_APP_2" --bind 127.0.0.1 \
      --directory "$state/www/catalog-2"
    tail -n 1 "$pids" | cut -d' ' -f1 >"$state/catalog-app-2.pid"
    wait_for "second catalog upstream" 10 curl -fsS "http://127.0.0.1:$CATALOG_APP_2/health.json"
  fi
  write_mesh 2
  for s in "${SIDECARS[@]}"; do
    other=${s%%:*}
    [ "$other" != "$instance" ] || continue
    wait_for "$other to get the second catalog upstream" 15 has_app_2 "${s##*:}"
  done
  # The held sidecar must not have moved; give the others a moment to be reported.
  sleep 1
  ! has_app_2 "$admin" || die "$instance got the new upstream although it is held"
  local cluster=${instance%-*} diagnose
  # The diagnosis looks at a service's sidecars and at the edge's view of that service;
  # the edge's own stale upstream (catalog-app) is no service of its routes.
  diagnose="meshcat diagnose $cluster --zone $ZONE     # step control_server names the stale sidecar"
  if [ "$cluster" = edge ]; then
    diagnose="meshcat diagnose catalog --zone $ZONE    # passes: the edge's view of catalog is in sync"
  fi
  cat <<TXT

$instance is held on its snapshot. The control server now lists two catalog upstreams:
  catalog-app  127.0.0.1:$CATALOG_APP, 127.0.0.1:$CATALOG_APP_2
  $instance has  $(app_hosts "$admin")   (curl -s http://127.0.0.1:$admin/clusters | grep ^catalog-app::)
The other sidecars have both. After the aggregator's --sync-grace ($SYNC_GRACE), try:
  export MESHCAT_API=$API PATH="$bin:\$PATH"
  meshcat sync                               # $instance stale: cluster catalog-app: 1 missing (127.0.0.1:$CATALOG_APP_2)
  meshcat sync --state stale -o json
  $diagnose
  meshcat describe cluster $cluster --zone $ZONE   # the instance's SYNC column
  meshcat check                              # fails: a stale sidecar
  dashboard $API/ui/#/c/$ZONE/$cluster   (the instance's sync badge and detail)
  curl -s $CONTROL/nodes | python3 -m json.tool   # held: true
Let it catch up with: deploy/local/mesh.sh release $instance
TXT
}

# Releases a held sidecar: it catches up with the second catalog upstream; then the
# mesh file goes back to one catalog upstream, as `up` wrote it, and the second
# upstream stops, so `hold` can be tried again.
cmd_release() {
  local instance=${1:-} admin held s pid
  admin=$(sidecar_arg "$instance")
  held=$(cat "$state/held" 2>/dev/null || true)
  say "releasing $instance (POST $CONTROL/release/$instance)"
  curl -fsS -X POST "$CONTROL/release/$instance" >/dev/null
  if [ "$held" != "$instance" ]; then
    echo "$instance was not held by mesh.sh hold${held:+ ($held is)}; nothing else to do"
    return 0
  fi
  if grep -q "\"port\": $CATALOG_APP_2" "$mesh"; then
    wait_for "$instance to catch up" 15 has_app_2 "$admin"
    echo "$instance caught up: catalog-app $(app_hosts "$admin")"
  fi
  say "back to one catalog upstream (the mesh as up wrote it)"
  write_mesh 1
  for s in "${SIDECARS[@]}"; do
    wait_for "${s%%:*} to drop the second catalog upstream" 15 lacks_app_2 "${s##*:}"
  done
  pid=$(cat "$state/catalog-app-2.pid" 2>/dev/null || true)
  if is_ours "$pid" python3; then
    kill -TERM "$pid" 2>/dev/null || true
    grep -v "^$pid python3\$" "$pids" >"$pids.tmp" || true
    mv -f "$pids.tmp" "$pids"
  fi
  rm -f "$state/held" "$state/catalog-app-2.pid"
  cat <<TXT

$instance is released and every sidecar has catalog-app $(app_hosts "$admin") again.
  meshcat sync                               # $instance synced again
TXT
}

# Calls the control server's admin API ($1 method, $2 path) and prints its JSON
# answer; dies with the error it gives.
control() {
  local out code
  out=$(curl -sS --max-time 10 -X "$1" -w '\n%{http_code}' "$CONTROL$2" 2>/dev/null) ||
    die "the control server does not answer at $CONTROL (deploy/local/mesh.sh up first)"
  code=${out##*$'\n'}
  out=${out%$'\n'*}
  if [ "$code" != 200 ]; then
    die "$1 $CONTROL$2 answered $code: $(printf '%s' "$out" |
      python3 -c 'import json, sys; print(json.load(sys.stdin)["error"])' 2>/dev/null || printf '%s' "$out")"
  fi
  printf '%s\n' "$out"
}

# The secret names, for messages.
identity_names() {
  local id out=""
  for id in "${IDENTITIES[@]}"; do out+="${id%%:*}, "; done
  echo "${out%, }"
}

# Checks $1 names an identity; prints the admin port of the Envoy that holds it.
identity_admin() {
  [ -n "$1" ] || die "name the secret: $(identity_names)"
  admin_of "$1-1" || die "no identity $1 (the identities are $(identity_names))"
}

# The chain certificates Envoy (admin port $1) lists in /certs, each once (a TLS
# context used twice lists its certificate twice): `serial expiration_time path days`.
shown_certs() {
  curl -fsS --max-time 2 "http://127.0.0.1:$1/certs" | python3 -c '
import json, sys
seen = set()
for ctx in json.load(sys.stdin).get("certificates", []):
    for c in ctx.get("cert_chain", []):
        if c["serial_number"] not in seen:
            seen.add(c["serial_number"])
            print(c["serial_number"], c["expiration_time"], c["path"], c["days_until_expiration"])
'
}

shows_serial() { shown_certs "$1" | grep -q "^$2 "; }

# Prints the certificates issued (a JSON rotation, or a list of them, on stdin).
print_rotations() {
  python3 -c '
import json, sys
v = json.load(sys.stdin)
for r in v if isinstance(v, list) else [v]:
    print("  %-8s serial %s -> %s" % (r["secret"], r.get("previousSerial") or "(none)", r["serial"]))
    print("  %-8s valid %s .. %s (the old one until %s)" % ("", r["validFrom"], r["expiresAt"], r.get("previousExpiresAt") or "-"))
'
}

# Waits until each Envoy shows the certificate issued for it (JSON rotations on
# stdin), and prints what its /certs says.
wait_certs() {
  local secret serial admin
  while read -r secret serial; do
    admin=$(admin_of "$secret-1") || continue
    wait_for "$secret-1 to show serial $serial" 15 shows_serial "$admin" "$serial"
    printf '  %-8s %s-1 /certs: %s\n' "$secret" "$secret" "$(shown_certs "$admin" | grep "^$serial " |
      awk '{printf "serial %s, path %s, expiration_time %s, days_until_expiration \"%s\"", $1, $3, $2, $4}')"
  done < <(python3 -c '
import json, sys
v = json.load(sys.stdin)
for r in v if isinstance(v, list) else [v]:
    print(r["secret"], r["serial"])
')
}

# One field of GET /identities: `rotation`, or `<secret>.<field>` of an identity.
identity_field() {
  control GET /identities | python3 -c '
import json, sys
v, key = json.load(sys.stdin), sys.argv[1]
if "." in key:
    secret, field = key.split(".", 1)
    v = next(i for i in v["identities"] if i["secret"] == secret)[field]
else:
    v = v[key]
print(str(v).lower() if isinstance(v, bool) else v)
' "$1"
}

# `identities`: the CA and each certificate the control server issued, and whether
# each Envoy shows it.
cmd_identities() {
  local json s
  json=$(control GET /identities)
  printf '%s' "$json" | python3 -c '
import json, sys
v = json.load(sys.stdin)
ca = v["ca"]
print("rotation %s: each certificate lives %ss and is replaced after %s of it" % (
    "running" if v["rotation"] else "STOPPED", v["lifetimeSeconds"], v["rotateAt"]))
print("CA (secret %s) %s  serial %s  expires %s" % (ca["secret"], ca["subject"], ca["serial"], ca["expiresAt"]))
print("%-8s %-32s %-20s %-20s %-20s %s" % ("SECRET", "SERIAL", "VALID FROM", "EXPIRES", "ROTATES AFTER", "SANS"))
for i in v["identities"]:
    print("%-8s %-32s %-20s %-20s %-20s %s" % (i["secret"], i["serial"], i["validFrom"], i["expiresAt"],
          i["rotateAfter"], ",".join(i["sans"])))
'
  for s in "${SIDECARS[@]}"; do
    printf '%-10s /certs: %s\n' "${s%%:*}" "$(shown_certs "${s##*:}" 2>/dev/null |
      awk '{printf "%s (%s, expires %s) ", $1, $3, $2}')"
  done
}

# `rotate [secret]`: replaces one certificate, or every one, at once.
cmd_rotate() {
  local path=/rotate json
  if [ -n "${1:-}" ]; then identity_admin "$1" >/dev/null; path="/rotate/$1"; fi
  say "rotating ${1:-every certificate} (POST $CONTROL$path)"
  json=$(control POST "$path")
  printf '%s' "$json" | print_rotations
  say "pushed over SDS; what the Envoys show"
  printf '%s' "$json" | wait_certs
  cat <<TXT
Envoy serves a new certificate at once: new handshakes use it, open connections keep
the old one. See it in Envoy's own admin (curl -s http://127.0.0.1:$CATALOG_ADMIN/certs) and
its SDS secret with its version in
curl -s 'http://127.0.0.1:$CATALOG_ADMIN/config_dump?resource=dynamic_active_secrets'.
TXT
}

# `stop-rotation`: certificates are no longer replaced; they age and expire.
cmd_stop_rotation() {
  say "stopping rotation (POST $CONTROL/rotation/stop)"
  control POST /rotation/stop >/dev/null
  control GET /identities | python3 -c '
import json, sys
for i in json.load(sys.stdin)["identities"]:
    print("  %-8s serial %s: was due for rotation at %s, expires at %s" % (
        i["secret"], i["serial"], i["rotateAfter"], i["expiresAt"]))
'
  cat <<TXT
No certificate is replaced from now on: each passes its rotation point and then expires,
and Envoy goes on serving an expired one (days_until_expiration "0"); once catalog's has
expired, the edge refuses it at its next handshake and /catalog/ answers 503. With $IDENTITY_LIFETIME
certificates that takes hours: deploy/local/mesh.sh expire catalog 2m issues one that
expires in two minutes. deploy/local/mesh.sh start-rotation replaces the overdue ones.
TXT
}

# `start-rotation`: rotation runs again; overdue certificates are replaced at once.
cmd_start_rotation() {
  local json
  say "starting rotation (POST $CONTROL/rotation/start)"
  json=$(control POST /rotation/start)
  if [ "$(printf '%s' "$json" | python3 -c 'import json, sys; print(len(json.load(sys.stdin)["rotated"]))')" = 0 ]; then
    echo "  nothing was overdue; each certificate is replaced at its rotation point:"
    control GET /identities | python3 -c '
import json, sys
for i in json.load(sys.stdin)["identities"]:
    print("  %-8s serial %s rotates after %s" % (i["secret"], i["serial"], i["rotateAfter"]))
'
    return 0
  fi
  echo "  replaced at once, as their rotation was overdue:"
  printf '%s' "$json" | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["rotated"]))' | print_rotations
  printf '%s' "$json" | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["rotated"]))' | wait_certs
}

# `expire <secret> [lifetime]`: issues a certificate that lives only that long.
cmd_expire() {
  local secret=${1:-} lifetime=${2:-$EXPIRE_LIFETIME} json
  identity_admin "$secret" >/dev/null
  say "issuing $secret a certificate that lives $lifetime (POST $CONTROL/issue/$secret?lifetime=$lifetime)"
  json=$(control POST "/issue/$secret?lifetime=$lifetime")
  printf '%s' "$json" | print_rotations
  printf '%s' "$json" | wait_certs
  if [ "$(identity_field rotation)" = true ]; then
    cat <<TXT
Rotation is running: it replaces this certificate at $(identity_field "$secret.rotateAfter"),
half its life, with a $IDENTITY_LIFETIME one. To watch it expire instead, stop rotation
before then: deploy/local/mesh.sh stop-rotation
TXT
  else
    cat <<TXT
Rotation is stopped: this certificate expires at $(identity_field "$secret.expiresAt") and Envoy goes on
serving it (days_until_expiration "0"); deploy/local/mesh.sh start-rotation replaces it.
TXT
  fi
}

# True when the edge's cluster catalog (its /config_dump) names SAN $1.
edge_expects() {
  curl -fsS --max-time 2 "http://127.0.0.1:$EDGE_ADMIN/config_dump?resource=dynamic_active_clusters" |
    grep -q -- "$1"
}

edge_forgot() { ! edge_expects "$@"; }

# The last access line of the edge after line $1 that answered 503 on an upstream
# connection failure (UF); fails when there is none.
uf_line_after() {
  tail -n +"$(($1 + 1))" "$logs/edge.log" | grep -E '" 503 [A-Z,]*UF' | tail -n 1 | grep .
}

catalog_answers() {
  [ "$(curl -s -o /dev/null --max-time 5 -w '%{http_code}' "http://127.0.0.1:$EDGE_PORT/catalog/")" = "$1" ]
}

# `wrong-san`: the edge expects of catalog a SPIFFE id catalog does not present.
cmd_wrong_san() {
  local seen
  control GET /nodes >/dev/null
  seen=$(wc -l <"$logs/edge.log")
  touch "$state/wrong-san"
  write_mesh "$(app_count)"
  say "the edge's cluster catalog now expects $WRONG_SAN; catalog presents $CATALOG_ID"
  wait_for "the edge to take the new SAN matcher" 15 edge_expects "$WRONG_SAN"
  wait_for "requests to /catalog/ to fail" 15 catalog_answers 503
  wait_for "the edge's access line" 5 uf_line_after "$seen"
  cat <<TXT
  curl -s localhost:$EDGE_PORT/catalog/ -> $(curl -s --max-time 5 "http://127.0.0.1:$EDGE_PORT/catalog/")
  the edge's access line: $(uf_line_after "$seen")
  cluster.catalog.ssl.fail_verify_san: $(curl -fsS "http://127.0.0.1:$EDGE_ADMIN/stats?filter=^cluster\.catalog\.ssl\.fail_verify_san$" | sed 's/.*: //')
Every handshake of the edge with catalog fails on the SAN check: both Envoys'
certificates are valid, but the edge's cluster catalog requires URI SAN
$WRONG_SAN (curl -s 'http://127.0.0.1:$EDGE_ADMIN/config_dump?resource=dynamic_active_clusters'
shows match_typed_subject_alt_names) and catalog-1's certificate carries $CATALOG_ID
(curl -s http://127.0.0.1:$CATALOG_ADMIN/certs). Put it back with: deploy/local/mesh.sh right-san
TXT
}

# `right-san`: the edge expects catalog's own SPIFFE id again.
cmd_right_san() {
  control GET /nodes >/dev/null
  rm -f "$state/wrong-san"
  write_mesh "$(app_count)"
  say "the edge's cluster catalog expects $CATALOG_ID again"
  wait_for "the edge to drop the wrong SAN matcher" 15 edge_forgot "$WRONG_SAN"
  wait_for "requests to /catalog/ to succeed" 15 catalog_answers 200
  echo "  curl -s localhost:$EDGE_PORT/catalog/health.json -> $(curl -s --max-time 5 "http://127.0.0.1:$EDGE_PORT/catalog/health.json")"
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
    "$EDGE_AGENT_OPS" "$CATALOG_AGENT_OPS" "$REVIEWS_AGENT_OPS" "$CONTROL_PORT" "$CONTROL_ADMIN" \
    "$CATALOG_APP_2"
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
  say "building meshcat (cargo build --release)"
  "$root/scripts/deps.sh" build
  if [ "$envoy_only" = 0 ]; then
    (cd "$root" && cargo build --release --locked -p meshcat-control-server \
      -p meshcat-aggregator -p meshcat-agent -p meshcat-cli)
  else
    # The Envoys take their clusters from the control server: it is built and run too.
    (cd "$root" && cargo build --release --locked -p meshcat-control-server)
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
  hold) shift; cmd_hold "${1:-}" ;;
  release) shift; cmd_release "${1:-}" ;;
  identities) cmd_identities ;;
  rotate) shift; cmd_rotate "${1:-}" ;;
  stop-rotation) cmd_stop_rotation ;;
  start-rotation) cmd_start_rotation ;;
  expire) shift; cmd_expire "$@" ;;
  wrong-san) cmd_wrong_san ;;
  right-san) cmd_right_san ;;
  *)
    echo "usage: deploy/local/mesh.sh up [--foreground] [--envoy-only] [--ha] | status | stop | hold <instance> | release <instance> | identities | rotate [secret] | stop-rotation | start-rotation | expire <secret> [lifetime] | wrong-san | right-san" >&2
    exit 2
    ;;
esac
