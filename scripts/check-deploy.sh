#!/usr/bin/env bash
# Checks deploy/kubernetes: schema validation (kubernetes-validate, strict, pinned
# Kubernetes version), kustomize rendering when kubectl is present, every --flag and
# MESHCAT_* setting against what the binaries accept, contract ports and probe paths,
# the Dockerfile's binaries, and the security defaults of contract section 10: tokens
# and keys from Secrets, etcd on TLS with client certificates for clients and peers
# (the HA overlay's aggregator with --etcd-ca-file, --etcd-cert, --etcd-key), and the
# NetworkPolicies of the aggregator, the agent and etcd. Those last checks first run
# on broken copies of the HA overlay (a self-test) and fail if one is not caught.
# Privileges (contract section 18): no host namespace, added capability or privilege
# anywhere, except the loopback-admin overlay's agent, which has hostPID and adds
# exactly SYS_ADMIN and SYS_PTRACE with everything else dropped; the base DaemonSet
# has neither (with a self-test on broken copies of both). Overlays are checked as
# rendered too: their flags and settings, ports and probes.
# Prints one summary line; exits non-zero on any problem.
#
# Flags and settings are read from `--help` of the built debug binaries
# (${CARGO_TARGET_DIR:-target}/debug/meshcat-{aggregator,agent}); when they are not
# built, from docs/configuration.md. Under CI=true the binaries are required.
#
# Environment: K8S_VERSION (default 1.31.0), MESHCAT_BIN_DIR (where the binaries are).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

k8s_version=${K8S_VERSION:-1.31.0}
venv="$root/.venv"
validator="kubernetes-validate==1.37.0"
pyyaml="PyYAML>=6,<7"

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import kubernetes_validate, yaml' 2>/dev/null; then
  echo "==> installing $validator and PyYAML into .venv"
  "$venv/bin/pip" install --disable-pip-version-check -q "$validator" "$pyyaml"
fi

bin_dir=${MESHCAT_BIN_DIR:-${CARGO_TARGET_DIR:-$root/target}/debug}
args=(--root "$root" --kubernetes-version "$k8s_version")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ -x "$bin_dir/meshcat-aggregator" ] && [ -x "$bin_dir/meshcat-agent" ]; then
  # The aggregator's flags may sit on the top level or on its `serve` subcommand.
  { "$bin_dir/meshcat-aggregator" --help; "$bin_dir/meshcat-aggregator" serve --help 2>/dev/null || true; } \
    >"$tmp/aggregator.txt"
  "$bin_dir/meshcat-agent" --help >"$tmp/agent.txt"
  args+=(--aggregator-help "$tmp/aggregator.txt" --agent-help "$tmp/agent.txt")
elif [ "${CI:-}" = "true" ]; then
  echo "check-deploy: FAILED: $bin_dir/meshcat-{aggregator,agent} are not built (CI requires them; run cargo build first)" >&2
  exit 1
elif [ -f "$root/docs/configuration.md" ]; then
  echo "note: binaries not built in $bin_dir; checking flags against docs/configuration.md"
  args+=(--config-doc "$root/docs/configuration.md")
else
  echo "check-deploy: FAILED: neither built binaries in $bin_dir nor docs/configuration.md to check flags against" >&2
  exit 1
fi

if command -v kubectl >/dev/null 2>&1; then
  args+=(--kubectl "$(command -v kubectl)")
fi

exec "$venv/bin/python" "$root/deploy/tools/check_deploy.py" "${args[@]}"
