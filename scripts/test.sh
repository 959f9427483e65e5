#!/usr/bin/env bash
# Runs every test of meshcat on a fresh machine: installs what the tests need (the
# real Envoy into .venv, the Kubernetes schema validator, Chromium and Playwright),
# checks formatting and lints, builds the binaries, validates the deployment manifests
# against them, checks the alerting rules (promtool unit tests) and the Grafana
# dashboard's queries, then runs every Rust test (unit, black-box over real sockets,
# end-to-end with real Envoys, the dashboard in a real browser).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
start=$SECONDS

# The run links about sixty test, bench and program binaries. With line tables and
# incremental caches they took 8.9 GB of target/ and filled a CI machine's disk; the
# run needs neither (a failing test names its file and line without debug info), so
# it builds without them: 2.6 GB. Dependencies never carry debug info (Cargo.toml).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
export CARGO_PROFILE_DEV_DEBUG="${CARGO_PROFILE_DEV_DEBUG:-false}"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
mkdir -p "$target_dir"
free_kb=$(df -Pk "$target_dir" | awk 'NR == 2 { print $4 }')
echo "disk: $((free_kb / 1024)) MiB free for $target_dir (a build from nothing takes about 2,700 MiB)"
if [ "$free_kb" -lt $((3 * 1024 * 1024)) ]; then
  echo "warning: less than 3 GiB free; the build may run out of disk" >&2
fi

echo "==> installing test dependencies"
MESHCAT_ENVOY=$(scripts/envoy.sh)
export MESHCAT_ENVOY
echo "envoy: $MESHCAT_ENVOY ($("$MESHCAT_ENVOY" --version | grep -o 'version: [^ ]*' | head -1))"

# schemathesis, run against the API's OpenAPI document by tests/tests/e2e_schemathesis.rs.
if [ ! -x .venv/bin/schemathesis ]; then
  echo "==> installing schemathesis into .venv"
  .venv/bin/pip install --disable-pip-version-check -q "schemathesis==4.32.5"
fi
MESHCAT_SCHEMATHESIS="$root/.venv/bin/schemathesis"
export MESHCAT_SCHEMATHESIS
echo "schemathesis: $("$MESHCAT_SCHEMATHESIS" --version)"

# Prometheus and promtool (Debian's prometheus package) for the metrics tests and the
# alerting rules, amtool (prometheus-alertmanager) for the routing example; the
# packages' services are kept from starting (policy-rc.d answering 101 denies them).
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1 \
    || ! command -v amtool >/dev/null 2>&1; then
  [ "$(id -u)" = 0 ] || { echo "prometheus/promtool/amtool missing: apt-get install prometheus prometheus-alertmanager (needs root)" >&2; exit 1; }
  echo "==> installing prometheus, promtool and amtool (Debian packages prometheus, prometheus-alertmanager)"
  export DEBIAN_FRONTEND=noninteractive
  policy=/usr/sbin/policy-rc.d
  added_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && added_policy=1
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus prometheus-alertmanager >/dev/null
  if [ "$added_policy" = 1 ]; then rm -f "$policy"; fi
fi
echo "prometheus: $(prometheus --version 2>&1 | head -1)"
echo "amtool: $(amtool --version 2>&1 | head -1)"

# protoc to build the etcd client, etcd for the replica tests (Debian packages).
scripts/deps.sh build etcd
etcd_bin=$(command -v etcd || echo /usr/bin/etcd)
echo "etcd: $("$etcd_bin" --version | head -1)"

# zsh and fish (Debian), whose completion scripts the CLI tests parse.
scripts/deps.sh shells

# unshare and ip (Debian util-linux, iproute2): Envoys in network namespaces of their
# own, the sidecars whose admin stays on their pod's loopback (tests/tests/e2e_netns.rs).
# mount (util-linux too): the full-disk tests mount, fill and grow a tmpfs, as root
# (tests/tests/e2e_full_disk.rs).
scripts/deps.sh netns

# Chromium (Debian) and Playwright (PyPI, into .venv) for the dashboard's browser test.
# Playwright drives the system's Chromium (executable_path); `playwright install` is
# never run, so no browser is downloaded.
scripts/deps.sh browser
echo "chromium: $(chromium --version 2>/dev/null | head -1)"
if ! .venv/bin/python -c 'import playwright.sync_api' 2>/dev/null; then
  .venv/bin/pip install --disable-pip-version-check -q "playwright==1.65.2"
fi
echo "playwright: $(.venv/bin/python -c 'from importlib.metadata import version; print(version("playwright"))')"

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> cargo build (binaries)"
cargo build --workspace --bins --locked

echo "==> deployment manifests"
scripts/check-deploy.sh

echo "==> alerting rules and the Grafana dashboard"
scripts/check-monitoring.sh

echo "==> cargo test"
cargo test --workspace --locked --no-fail-fast

echo "==> all tests passed in $((SECONDS - start)) s"
