#!/usr/bin/env bash
# Builds cert-manager's controller from the github.com/cert-manager/cert-manager
# module pinned here into OUT (default ../../bin/cert-manager-controller),
# stamping the version as upstream's release build does, and copies the
# CustomResourceDefinitions of the same module version (deploy/crds) to
# OUT-crds.yaml.
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-../../bin/cert-manager-controller}
ver=$(go list -m -f '{{.Version}}' github.com/cert-manager/cert-manager)   # vX.Y.Z
dir=$(go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)
p=github.com/cert-manager/cert-manager/pkg/util
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X $p.AppVersion=$ver" -o "$out" .
for f in "$dir"/deploy/crds/*.yaml; do
  case $f in *.yaml) cat "$f"; echo ;; esac
done >"$out-crds.yaml.tmp"
mv "$out-crds.yaml.tmp" "$out-crds.yaml"
