#!/usr/bin/env bash
# Builds tether and runs a hub on this machine, with its SQLite store,
# certificates and admin kubeconfig in $TETHER_DATA (default ~/.tether), and
# a local edge agent joined to it through the tunnel. Installs what the
# build needs when run as root on Debian. Stop both with Ctrl-C.
#
# The local edge runs the simulated runtime: pods are scheduled, started,
# reported and logged like real ones but run no containers.
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
listen=${TETHER_LISTEN:-127.0.0.1:6443}
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait' EXIT INT TERM

echo "== starting the hub (logs: $data/hub.log)"
mkdir -p "$data"
bin/tether hub --data-dir "$data" --listen "$listen" >>"$data/hub.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 300); do
  [ -s "$data/admin.kubeconfig" ] && bin/kubectl --kubeconfig "$data/admin.kubeconfig" get --raw /readyz >/dev/null 2>&1 && break
  sleep 0.2
done

node=$(hostname | tr 'A-Z_' 'a-z-')
token=""
[ -s "$data/edge/node.crt" ] || token=$(bin/tether token create --data-dir "$data" --ttl 1h)
echo "== starting the local edge $node (logs: $data/edge.log)"
bin/tether edge --hub "https://$listen" ${token:+--token "$token"} --data-dir "$data/edge" \
  --name "$node" --runtime sim >>"$data/edge.log" 2>&1 &
pids+=($!)

cat <<TXT
== tether is up; in another shell:
   export KUBECONFIG=$data/admin.kubeconfig
   $root/bin/kubectl get nodes
   $root/bin/kubectl create deployment hello --image=hello --replicas=3
   $root/bin/kubectl get pods -o wide
TXT
wait -n "${pids[@]}"
