#!/usr/bin/env bash
# Builds the pinned upstream Helm 3 CLI (helm.sh/helm/v3/cmd/helm) into OUT
# (default ../../bin/helm3), stamping the version as upstream's release
# build does, so that `helm version` and the User-Agent name a real release.
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-../../bin/helm3}
ver=$(go list -m -f '{{.Version}}' helm.sh/helm/v3)   # vX.Y.Z
p=helm.sh/helm/v3/internal/version
flags=" -X $p.version=$ver -X $p.metadata= -X $p.gitTreeState=clean"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w$flags" -o "$out" helm.sh/helm/v3/cmd/helm
