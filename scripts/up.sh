#!/usr/bin/env bash
# Builds tether and runs a hub on this machine, with its SQLite store,
# certificates and admin kubeconfig in $TETHER_DATA (default ~/.tether), and
# a local edge agent joined to it through the tunnel. Installs what the
# build needs when run as root on Debian. Stop both with Ctrl-C.
#
# As root on Debian the local edge runs real containers with containerd
# (installed if missing; the agent starts its own daemon) and a demo
# Deployment and Service from an image the project builds and imports. As
# another user it runs the simulated runtime: pods are scheduled, started,
# reported and logged like real ones but run no containers.
#
#   TETHER_DATA    data directory            (default ~/.tether)
#   TETHER_LISTEN  address of the HTTPS API  (default 127.0.0.1:6443)
#   TETHER_KUBECTL kubectl to use, built if missing (default bin/kubectl)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
runtime=sim
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  runtime=containerd
  missing=()
  for p in gcc libc6-dev containerd runc containernetworking-plugins; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi
source "$root/scripts/go-env.sh"

echo "== building tether"
go build -ldflags "-X main.version=$(git describe --always --dirty 2>/dev/null || echo devel)" -o bin/tether ./cmd/tether
kubectl_bin=${TETHER_KUBECTL:-$root/bin/kubectl}
if [ ! -x "$kubectl_bin" ]; then
  echo "== building kubectl"
  bash tools/kubectl/build.sh "$kubectl_bin"
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
  [ -s "$data/admin.kubeconfig" ] && "$kubectl_bin" --kubeconfig "$data/admin.kubeconfig" get --raw /readyz >/dev/null 2>&1 && break
  sleep 0.2
done

node=$(hostname | tr 'A-Z_' 'a-z-')
token=""
[ -s "$data/edge/node.crt" ] || token=$(bin/tether token create --data-dir "$data" --ttl 1h)
edge_args=(--runtime sim)
if [ "$runtime" = containerd ]; then
  # The demo image: a static Go web server packed as an OCI archive, which
  # the agent imports from its images directory at start.
  mkdir -p "$data/edge/images"
  [ -s "$data/edge/images/demo.tar" ] || go run ./testbench/images/cmd/build-images -demo -out "$data/edge/images"
  edge_args=(--runtime containerd --containerd-address "$data/edge/containerd.sock")
fi
echo "== starting the local edge $node with the $runtime runtime (logs: $data/edge.log)"
bin/tether edge --hub "https://$listen" ${token:+--token "$token"} --data-dir "$data/edge" \
  --name "$node" "${edge_args[@]}" >>"$data/edge.log" 2>&1 &
pids+=($!)

kubectl=("$kubectl_bin" --kubeconfig "$data/admin.kubeconfig")
if [ "$runtime" = containerd ]; then
  "${kubectl[@]}" apply -f - >/dev/null <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: demo}
spec:
  replicas: 2
  selector: {matchLabels: {app: demo}}
  template:
    metadata: {labels: {app: demo}}
    spec:
      containers:
      - name: demo
        image: docker.io/tether/demo:v1
        imagePullPolicy: IfNotPresent
        ports: [{containerPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: demo}
spec:
  selector: {app: demo}
  ports: [{port: 80, targetPort: 8080}]
YAML
  cat <<TXT
== tether is up, with a demo Deployment and Service; in another shell:
   export KUBECONFIG=$data/admin.kubeconfig
   $kubectl_bin get nodes,pods,svc,endpointslices -o wide
   $kubectl_bin logs deploy/demo
   $kubectl_bin port-forward svc/demo 8080:80 & curl localhost:8080
== Ctrl-C stops the hub and the edge; the pods' containers and the edge's containerd keep
   running, as they do across an agent restart. To remove what the edge put on this machine
   (pods, containerd, pod network, eBPF programs, DNS interface) and its data directory:
   $root/bin/tether edge reset --purge --data-dir $data/edge
TXT
else
  cat <<TXT
== tether is up; in another shell:
   export KUBECONFIG=$data/admin.kubeconfig
   $kubectl_bin get nodes
   $kubectl_bin create deployment hello --image=hello --replicas=3
   $kubectl_bin get pods -o wide
== Ctrl-C stops the hub and the edge; to remove the edge's data directory afterwards:
   $root/bin/tether edge reset --runtime sim --purge --data-dir $data/edge
TXT
fi
wait -n "${pids[@]}"
