#!/usr/bin/env bash
# Builds tether and runs a hub on this machine, with its SQLite store,
# certificates and admin kubeconfig in $TETHER_DATA (default ~/.tether).
# Installs what the build needs when run as root on Debian. Stop with Ctrl-C.
#
#   TETHER_DATA    data directory            (default ~/.tether)
#   TETHER_LISTEN  address of the HTTPS API  (default 127.0.0.1:6443)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  for p in gcc libc6-dev; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
source "$root/scripts/go-env.sh"

echo "== building tether"
go build -ldflags "-X main.version=$(git describe --always --dirty 2>/dev/null || echo devel)" -o bin/tether ./cmd/tether
if [ ! -x bin/kubectl ]; then
  echo "== building kubectl"
  bash tools/kubectl/build.sh "$root/bin/kubectl"
fi

data=${TETHER_DATA:-$HOME/.tether}
cat <<TXT
== starting the hub; in another shell:
   export KUBECONFIG=$data/admin.kubeconfig
   $root/bin/kubectl get namespaces
TXT
exec bin/tether hub --data-dir "$data" --listen "${TETHER_LISTEN:-127.0.0.1:6443}"
