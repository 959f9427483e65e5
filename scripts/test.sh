#!/usr/bin/env bash
# Runs every test of meshcat on a fresh machine: installs what the tests need (the
# real Envoy into .venv, the Kubernetes schema validator), checks formatting and
# lints, builds the binaries, validates the deployment manifests against them, then
# runs every Rust test (unit, black-box over real sockets, end-to-end with real Envoys).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
start=$SECONDS

echo "==> installing test dependencies"
MESHCAT_ENVOY=$(scripts/envoy.sh)
export MESHCAT_ENVOY
echo "envoy: $MESHCAT_ENVOY ($("$MESHCAT_ENVOY" --version | grep -o 'version: [^ ]*' | head -1))"

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> cargo build (binaries)"
cargo build --workspace --bins --locked

echo "==> deployment manifests"
scripts/check-deploy.sh

echo "==> cargo test"
cargo test --workspace --locked --no-fail-fast

echo "==> all tests passed in $((SECONDS - start)) s"
