#!/bin/sh
# Keeps the agent's targets file in step with the sidecar pods of this node.
# Every DISCOVERY_INTERVAL seconds it lists the running pods on NODE_NAME labelled
# meshcat.io/scrape=true, renders targets.tmpl, and replaces the file atomically
# (rename) only when its content changed, so the agent re-reads it only then.
set -eu
: "${NODE_NAME:?NODE_NAME must be set from the downward API}"
out=${TARGETS_FILE:-/var/run/meshcat/targets/targets.json}
interval=${DISCOVERY_INTERVAL:-15}
template=$(dirname "$0")/targets.tmpl
tmp="$out.tmp"

while :; do
  if kubectl get pods --all-namespaces \
      --field-selector "spec.nodeName=$NODE_NAME,status.phase=Running" \
      --selector meshcat.io/scrape=true \
      --output "go-template-file=$template" >"$tmp"; then
    if ! cmp -s "$tmp" "$out"; then
      mv "$tmp" "$out"
      echo "targets file updated: $(grep -c '"admin"' "$out") target(s)"
    fi
  else
    # Keep the last good file: the agent goes on scraping what it knew.
    echo "listing pods failed; keeping the previous targets file" >&2
  fi
  sleep "$interval"
done
