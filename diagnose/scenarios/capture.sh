#!/usr/bin/env bash
# Runs real Envoy failure scenarios and saves what an operator (and meshcat) would read
# into diagnose/tests/fixtures/<scenario>/. Usage: capture.sh [scenario...] (default: all).
# Needs bash, python3 (stdlib) and openssl; installs Envoy through scripts/envoy.sh.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
command -v openssl >/dev/null || { echo "openssl is required to make the scenario certificates" >&2; exit 1; }
envoy=${MESHCAT_ENVOY:-$("$root/scripts/envoy.sh")}
exec python3 "$here/capture.py" --envoy "$envoy" --scenarios "$here" --out "$root/diagnose/tests/fixtures" "$@"
