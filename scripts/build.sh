#!/usr/bin/env bash
# Builds tether's release binaries and prints their sizes:
#
#   tether       the hub and the edge agent (cmd/tether)
#   tether-edge  the edge agent alone: cmd/tether built with -tags edge,
#                which links none of the hub, store, scheduler or
#                controllers code (commands: edge, edge images,
#                edge reset, version)
#
# Both are stripped (-ldflags '-s -w': no symbol table, no DWARF) and built
# with -trimpath.
#
#   scripts/build.sh [OUTDIR]   (default: bin)
#   TETHER_VERSION  what `tether version` reports (default: git describe)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/go-env.sh

out=${1:-bin}
version=${TETHER_VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo devel)}
ldflags="-s -w -X main.version=$version"
mkdir -p "$out"
go build -trimpath -ldflags="$ldflags" -o "$out/tether" ./cmd/tether
go build -trimpath -ldflags="$ldflags" -tags edge -o "$out/tether-edge" ./cmd/tether
for b in tether tether-edge; do
  size=$(stat -c %s "$out/$b")
  awk -v f="$out/$b" -v s="$size" 'BEGIN { printf "%-20s %10d bytes  %6.1f MiB\n", f, s, s / 1048576 }'
done
