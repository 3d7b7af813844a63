#!/usr/bin/env bash
# Builds the pinned upstream Helm CLI into OUT (default ../../bin/helm),
# stamping the version as upstream's release build does, so that
# `helm version` and the User-Agent name a real release.
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-../../bin/helm}
ver=$(go list -m -f '{{.Version}}' helm.sh/helm/v4)   # vX.Y.Z
p=helm.sh/helm/v4/internal/version
flags=" -X $p.version=$ver -X $p.metadata= -X $p.gitTreeState=clean"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w$flags" -o "$out" .
