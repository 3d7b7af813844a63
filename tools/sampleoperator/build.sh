#!/usr/bin/env bash
# Builds the sample controller-runtime operator into OUT (default
# ../../bin/sampleoperator). Its CustomResourceDefinition is crd.yaml here.
set -euo pipefail
cd "$(dirname "$0")"
out=${1:-../../bin/sampleoperator}
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out" .
