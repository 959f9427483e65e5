#!/usr/bin/env bash
# Starts a development aggregator from the sources: installs protoc when missing
# (scripts/deps.sh build; the etcd client compiles etcd's protobuf definitions), then
# `cargo run --release -p meshcat-aggregator -- --dev` with any further flags given.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/deps.sh" build
cd "$root"
exec cargo run --release --locked -p meshcat-aggregator -- --dev "$@"
