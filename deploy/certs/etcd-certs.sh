#!/usr/bin/env bash
# Makes the certificates of the HA overlay's etcd (deploy/kubernetes/overlays/ha)
# with openssl, and prints (or, with --apply, runs) the kubectl commands that put
# them into the three Secrets the manifests mount:
#
#   meshcat-etcd-server-tls  ca.crt, meshcat-etcd-N.crt, meshcat-etcd-N.key
#                            each member's client-port certificate, and the CA that
#                            signs them and the aggregator's client certificate
#   meshcat-etcd-peer-tls    ca.crt, meshcat-etcd-N.crt, meshcat-etcd-N.key
#                            each member's peer certificate and the peer CA
#   meshcat-etcd-client-tls  tls.crt, tls.key, ca.crt (kubernetes.io/tls)
#                            the aggregator replicas' client certificate
#
#   deploy/certs/etcd-certs.sh [--out DIR] [--namespace NS] [--members N]
#                              [--cluster-domain DOMAIN] [--days DAYS] [--apply]
#
# Two CAs: the client CA (ca.crt) signs the members' server certificates and the
# aggregator's client certificate; the peer CA (peer-ca.crt) signs only peer
# certificates, so a client certificate can never join the cluster as a member.
# Member N's certificates name meshcat-etcd-N, meshcat-etcd-N.meshcat-etcd,
# meshcat-etcd-N.meshcat-etcd.NS, meshcat-etcd-N.meshcat-etcd.NS.svc,
# meshcat-etcd-N.meshcat-etcd.NS.svc.DOMAIN, localhost and 127.0.0.1, and carry both
# serverAuth and clientAuth (etcd's own gateway and its peers connect with them).
# Keys are ECDSA P-256 (PKCS#8), mode 0600.
#
# Run again to renew: existing CAs in DIR are kept (clients keep trusting the new
# certificates), every other certificate is issued anew. Delete DIR to start over.
# deploy/local/mesh.sh up --ha uses this script too, for its members on 127.0.0.1.
#
# Options (defaults in brackets):
#   --out DIR             where the files go [~/meshcat-etcd-certs]; keep them out
#                         of the repository
#   --namespace NS        namespace of the HA overlay [meshcat]
#   --members N           etcd members [3]
#   --cluster-domain D    the cluster's DNS domain [cluster.local]
#   --days DAYS           validity of member and client certificates [825];
#                         CAs get ten years
#   --apply               create or update the Secrets with kubectl instead of
#                         printing the commands
#   --quiet               print neither the file list nor the commands
set -euo pipefail

out=${HOME:-.}/meshcat-etcd-certs
namespace=meshcat
members=3
domain=cluster.local
days=825
apply=0
quiet=0

die() { printf 'etcd-certs.sh: %s\n' "$*" >&2; exit 1; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --out) [ $# -ge 2 ] || die "--out needs a directory"; out=$2; shift 2 ;;
    --namespace) [ $# -ge 2 ] || die "--namespace needs a name"; namespace=$2; shift 2 ;;
    --members) [ $# -ge 2 ] || die "--members needs a number"; members=$2; shift 2 ;;
    --cluster-domain) [ $# -ge 2 ] || die "--cluster-domain needs a domain"; domain=$2; shift 2 ;;
    --days) [ $# -ge 2 ] || die "--days needs a number"; days=$2; shift 2 ;;
    --apply) apply=1; shift ;;
    --quiet) quiet=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

[[ "$members" =~ ^[1-9][0-9]?$ ]] || die "--members must be a number from 1 to 99, not '$members'"
[[ "$days" =~ ^[1-9][0-9]{0,4}$ ]] || die "--days must be a positive number of days, not '$days'"
[[ "$namespace" =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]] ||
  die "--namespace '$namespace' is not a Kubernetes namespace name"
[[ "$domain" =~ ^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$ ]] || die "--cluster-domain '$domain' is not a DNS domain"
command -v openssl >/dev/null 2>&1 || die "openssl not found (Debian: apt-get install openssl)"
if [ "$apply" = 1 ]; then
  command -v kubectl >/dev/null 2>&1 || die "--apply needs kubectl on PATH"
fi

umask 077
mkdir -p "$out/server" "$out/peer" "$out/client"
out=$(cd "$out" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

new_key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# ca NAME SUBJECT: keeps an existing CA, else makes a self-signed one.
ca() {
  local name=$1 subject=$2
  if [ -s "$out/$name.crt" ] && [ -s "$out/$name.key" ]; then
    openssl x509 -in "$out/$name.crt" -noout -checkend 0 >/dev/null ||
      die "$out/$name.crt has expired: delete $out to start over"
    return 0
  fi
  new_key "$out/$name.key"
  openssl req -x509 -new -key "$out/$name.key" -subj "/CN=$subject" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -addext "subjectKeyIdentifier=hash" \
    -out "$out/$name.crt"
  chmod 0644 "$out/$name.crt"
}

# leaf CA FILE CN USAGES [SAN]: a key and a certificate signed by CA (its .crt/.key).
leaf() {
  local ca=$1 file=$2 cn=$3 usages=$4 san=${5:-}
  new_key "$file.key"
  openssl req -new -key "$file.key" -subj "/CN=$cn" -out "$tmp/req.csr"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature"
    echo "extendedKeyUsage=$usages"
    echo "subjectKeyIdentifier=hash"
    echo "authorityKeyIdentifier=keyid"
    if [ -n "$san" ]; then echo "subjectAltName=$san"; fi
  } >"$tmp/ext.cnf"
  openssl x509 -req -in "$tmp/req.csr" -CA "$out/$ca.crt" -CAkey "$out/$ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days "$days" -sha256 \
    -extfile "$tmp/ext.cnf" -out "$file.crt" 2>/dev/null
  chmod 0644 "$file.crt"
  openssl verify -CAfile "$out/$ca.crt" "$file.crt" >/dev/null ||
    die "$file.crt does not verify against $out/$ca.crt"
}

ca ca "meshcat etcd client CA"
ca peer-ca "meshcat etcd peer CA"

for ((i = 0; i < members; i++)); do
  m="meshcat-etcd-$i"
  san="DNS:$m,DNS:$m.meshcat-etcd,DNS:$m.meshcat-etcd.$namespace,DNS:$m.meshcat-etcd.$namespace.svc"
  san+=",DNS:$m.meshcat-etcd.$namespace.svc.$domain,DNS:localhost,IP:127.0.0.1"
  leaf ca "$out/server/$m" "$m" "serverAuth,clientAuth" "$san"
  leaf peer-ca "$out/peer/$m" "$m" "serverAuth,clientAuth" "$san"
done
leaf ca "$out/client/aggregator" meshcat-aggregator clientAuth

# The Secrets, as kubectl command lines (one argument per element).
server_cmd=(kubectl -n "$namespace" create secret generic meshcat-etcd-server-tls
  "--from-file=ca.crt=$out/ca.crt")
peer_cmd=(kubectl -n "$namespace" create secret generic meshcat-etcd-peer-tls
  "--from-file=ca.crt=$out/peer-ca.crt")
for ((i = 0; i < members; i++)); do
  m="meshcat-etcd-$i"
  server_cmd+=("--from-file=$m.crt=$out/server/$m.crt" "--from-file=$m.key=$out/server/$m.key")
  peer_cmd+=("--from-file=$m.crt=$out/peer/$m.crt" "--from-file=$m.key=$out/peer/$m.key")
done
client_cmd=(kubectl -n "$namespace" create secret generic meshcat-etcd-client-tls
  --type=kubernetes.io/tls "--from-file=tls.crt=$out/client/aggregator.crt"
  "--from-file=tls.key=$out/client/aggregator.key" "--from-file=ca.crt=$out/ca.crt")

# secret CMD...: with --apply, creates or replaces the Secret (rendered by kubectl,
# then applied); otherwise prints the command, one flag a line.
secret() {
  if [ "$apply" = 1 ]; then
    "$@" --dry-run=client -o yaml | kubectl apply -f -
  elif [ "$quiet" = 0 ]; then
    printf '%q ' "$@" | sed -e 's/ $//' -e 's/ --/ \\\n    --/g'
    echo
  fi
}

if [ "$apply" = 0 ] && [ "$quiet" = 0 ]; then
  echo "wrote to $out:"
  echo "  ca.crt, ca.key            client CA: signs the members' server certificates and the aggregator's"
  echo "  peer-ca.crt, peer-ca.key  peer CA: signs the members' peer certificates"
  echo "  server/meshcat-etcd-N.*   member N's client-port certificate and key (N = 0..$((members - 1)))"
  echo "  peer/meshcat-etcd-N.*     member N's peer certificate and key"
  echo "  client/aggregator.*       the aggregator replicas' client certificate and key"
  echo "Keep the CA keys offline; the Secrets need none of them. Create the Secrets with:"
  echo
fi
secret "${server_cmd[@]}"
secret "${peer_cmd[@]}"
secret "${client_cmd[@]}"
