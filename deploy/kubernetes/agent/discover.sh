#!/bin/sh
# Keeps the agent's pods file in step with the sidecar pods of this node. Every
# DISCOVERY_INTERVAL seconds it lists the running pods on NODE_NAME labelled
# meshcat.io/scrape=true, as kubectl's JSON, and replaces the file atomically
# (rename) only when its content changed, so the agent re-reads it only then.
# The file holds Kubernetes' own pod objects, unchanged: the agent (--pods-file)
# derives each target from them (zone = namespace, admin = pod IP, log file inside
# the pod's own log folder), so nothing here interprets an annotation.
set -eu
: "${NODE_NAME:?NODE_NAME must be set from the downward API}"
out=${PODS_FILE:-/var/run/meshcat/targets/pods.json}
interval=${DISCOVERY_INTERVAL:-15}
tmp="$out.tmp"

while :; do
  if kubectl get pods --all-namespaces \
      --field-selector "spec.nodeName=$NODE_NAME,status.phase=Running" \
      --selector meshcat.io/scrape=true \
      --output json >"$tmp"; then
    if ! cmp -s "$tmp" "$out"; then
      mv "$tmp" "$out"
      echo "pods file updated: $(grep -c '"podIP"' "$out") pod(s)"
    fi
  else
    # Keep the last good file: the agent goes on scraping what it knew.
    echo "listing pods failed; keeping the previous pods file" >&2
  fi
  sleep "$interval"
done
