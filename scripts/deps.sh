#!/usr/bin/env bash
# Installs Debian packages meshcat needs when their commands are missing:
#   scripts/deps.sh build   protoc (protobuf-compiler) and protobuf's own definitions
#                           (libprotobuf-dev): the etcd client compiles etcd's protobuf
#                           definitions, which import google/protobuf/*.proto, when the
#                           aggregator is built
#   scripts/deps.sh etcd    etcd and etcdctl (etcd-server, etcd-client): the replica
#                           tests and `deploy/local/mesh.sh up --ha`
#   scripts/deps.sh browser Chromium (chromium): the dashboard's browser test drives it
#                           with Playwright, which never downloads a browser of its own
#   scripts/deps.sh shells  zsh and fish: the CLI's tests parse the completion scripts
#                           `meshcat completion` prints for them (bash is always there)
#   scripts/deps.sh netns   unshare (util-linux) and ip (iproute2): the tests start
#                           Envoys in network namespaces of their own, as pods' sidecars;
#                           mount (util-linux): the full-disk tests mount a tmpfs
# Needs root (or sudo) only when something is missing. Package services are kept from
# starting: a policy-rc.d answering 101 denies them while the packages install.
set -euo pipefail

need=()
for what in "$@"; do
  case "$what" in
    build)
      command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
      [ -e /usr/include/google/protobuf/descriptor.proto ] || need+=(libprotobuf-dev)
      ;;
    etcd)
      { command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ]; } || need+=(etcd-server)
      command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
      ;;
    browser)
      command -v chromium >/dev/null 2>&1 || need+=(chromium)
      ;;
    shells)
      command -v zsh >/dev/null 2>&1 || need+=(zsh)
      command -v fish >/dev/null 2>&1 || need+=(fish)
      ;;
    netns)
      { command -v unshare && command -v mount; } >/dev/null 2>&1 || need+=(util-linux)
      command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || need+=(iproute2)
      ;;
    *) echo "deps.sh: unknown group $what (build, etcd, browser, shells, netns)" >&2; exit 64 ;;
  esac
done
[ ${#need[@]} -eq 0 ] && exit 0

sudo=()
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then
    sudo=(sudo)
  else
    echo "deps.sh: ${need[*]} missing: apt-get install ${need[*]} (needs root)" >&2
    exit 1
  fi
fi
echo "deps.sh: installing ${need[*]} (Debian packages)" >&2
export DEBIAN_FRONTEND=noninteractive
policy=/usr/sbin/policy-rc.d
added_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
  "${sudo[@]}" chmod +x "$policy"
  added_policy=1
fi
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
if [ "$added_policy" = 1 ]; then "${sudo[@]}" rm -f "$policy"; fi
