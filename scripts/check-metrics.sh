#!/usr/bin/env bash
# Checks that running meshcat processes expose valid Prometheus text format:
#   scripts/check-metrics.sh AGGREGATOR_OPS AGENT_OPS [MORE_OPS...]
# Each argument is host:port (or a bare port on 127.0.0.1) of an ops listener.
# Fetches /metrics from each and runs `promtool check metrics` on it (syntax and the
# naming lints); also `promtool check config` on deploy/monitoring/prometheus.yml.
# Installs Debian's prometheus package when promtool is missing (needs root, as in CI),
# without starting its service. Exits non-zero on any problem.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

[ $# -ge 2 ] || { echo "usage: scripts/check-metrics.sh AGGREGATOR_OPS AGENT_OPS [MORE_OPS...]" >&2; exit 2; }

if ! command -v promtool >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "check-metrics: promtool missing; install the prometheus package (needs root)" >&2; exit 1; }
  echo "==> installing promtool (Debian package prometheus)"
  export DEBIAN_FRONTEND=noninteractive
  # Keep the package's service from starting: policy-rc.d answering 101 denies it.
  policy=/usr/sbin/policy-rc.d
  added_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added_policy=1
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

failed=0
# One trap for both: the temporary file and a policy-rc.d this script added.
tmp=$(mktemp)
trap 'rm -f "$tmp"; [ "${added_policy:-0}" = 1 ] && rm -f /usr/sbin/policy-rc.d; true' EXIT

if ! out=$(promtool check config --syntax-only "$root/deploy/monitoring/prometheus.yml" 2>&1); then
  echo "$out"
  echo "FAIL deploy/monitoring/prometheus.yml"
  failed=$((failed + 1))
fi

checked=0
for target in "$@"; do
  case "$target" in *:*) addr=$target ;; *) addr=127.0.0.1:$target ;; esac
  url="http://$addr/metrics"
  if ! curl -fsS --max-time 5 -o "$tmp" "$url"; then
    echo "FAIL $url: not reachable"
    failed=$((failed + 1))
    continue
  fi
  families=$(grep -c '^# TYPE ' "$tmp" || true)
  if [ "$families" -eq 0 ]; then
    echo "FAIL $url: no metric families"
    failed=$((failed + 1))
    continue
  fi
  if out=$(promtool check metrics <"$tmp" 2>&1); then
    echo "ok   $url ($families families)"
    checked=$((checked + 1))
  else
    echo "$out" | sed 's/^/     /'
    echo "FAIL $url"
    failed=$((failed + 1))
  fi
done

if [ "$failed" -gt 0 ]; then
  echo "check-metrics: FAILED: $failed problem(s), $checked endpoint(s) valid"
  exit 1
fi
echo "check-metrics: OK: $checked endpoint(s) valid for promtool check metrics, prometheus.yml valid"
