#!/usr/bin/env bash
# Builds the pinned upstream kubectl into OUT (default ../../bin/kubectl),
# stamping the version so version-skew checks see a real release.
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-../../bin/kubectl}
ver=$(go list -m -f '{{.Version}}' k8s.io/kubectl)   # v0.X.Y
kube="v1.${ver#v0.}"
major=1; minor=$(echo "$ver" | cut -d. -f2)
flags=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  flags+=" -X $p.gitVersion=$kube -X $p.gitMajor=$major -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w$flags" -o "$out" .
