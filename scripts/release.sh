#!/usr/bin/env bash
# Builds tether's release: for each architecture a tarball
# tether-VERSION-linux-ARCH.tar.gz holding
#
#   tether        the hub and the edge agent (cmd/tether)
#   tether-edge   the edge agent alone (cmd/tether built with -tags edge)
#   systemd/      the units `tether install` writes (deploy/systemd)
#   INSTALL.md    how to install from the tarball (deploy/INSTALL.md)
#
# and SHA256SUMS over the tarballs. Binaries are stripped (-s -w), built
# with -trimpath and report VERSION (`tether version`); cgo builds SQLite
# with gcc for amd64 and Debian's cross compiler aarch64-linux-gnu-gcc
# (package gcc-aarch64-linux-gnu) for arm64. Tarballs are reproducible:
# sorted, owned by root, dated from the last commit.
#
#   scripts/release.sh VERSION OUTDIR
#   TETHER_RELEASE_ARCHES    architectures (default "amd64 arm64")
#   TETHER_RELEASE_TRIMPATH  0 builds without -trimpath, reusing the packages
#                            `go test` compiled (the tests' tarball; the
#                            binaries then name this checkout's paths)
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: scripts/release.sh VERSION OUTDIR" >&2
  exit 2
fi
version=$1
out=$2
case $version in
  *[!A-Za-z0-9._+-]* | "") echo "release.sh: bad version $version (letters, digits, . _ + - only)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
root=$PWD
source scripts/go-env.sh
mkdir -p "$out"
out=$(cd "$out" && pwd)
epoch=$(git log -1 --format=%ct 2>/dev/null || echo 0)
ldflags="-s -w -X main.version=$version"
trimpath=-trimpath
if [ "${TETHER_RELEASE_TRIMPATH:-1}" = 0 ]; then
  trimpath=
fi

for arch in ${TETHER_RELEASE_ARCHES:-amd64 arm64}; do
  case $arch in
    amd64) cc=${CC_AMD64:-gcc} ;;
    arm64) cc=${CC_ARM64:-aarch64-linux-gnu-gcc} ;;
    *) echo "release.sh: unknown architecture $arch" >&2; exit 2 ;;
  esac
  if ! command -v "$cc" >/dev/null; then
    echo "release.sh: $cc not found (Debian: apt-get install gcc-aarch64-linux-gnu for arm64)" >&2
    exit 1
  fi
  name=tether-$version-linux-$arch
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  dir=$stage/$name
  mkdir -p "$dir/systemd"
  start=$SECONDS
  export CGO_ENABLED=1 GOOS=linux GOARCH=$arch CC=$cc
  go build $trimpath -ldflags="$ldflags" -o "$dir/tether" ./cmd/tether
  go build $trimpath -ldflags="$ldflags" -tags edge -o "$dir/tether-edge" ./cmd/tether
  unset CGO_ENABLED GOOS GOARCH CC
  cp deploy/systemd/tether-hub.service deploy/systemd/tether-edge.service "$dir/systemd/"
  sed "s/@VERSION@/$version/g; s/@ARCH@/$arch/g" deploy/INSTALL.md >"$dir/INSTALL.md"
  chmod 0755 "$dir/tether" "$dir/tether-edge"
  chmod 0644 "$dir/systemd/"* "$dir/INSTALL.md"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$epoch" -C "$stage" -cf - "$name" |
    gzip -n -9 >"$out/$name.tar.gz"
  rm -rf "$stage"
  trap - EXIT
  echo "== $name.tar.gz ($(stat -c %s "$out/$name.tar.gz") bytes, built in $((SECONDS - start))s)"
done
(cd "$out" && sha256sum tether-"$version"-linux-*.tar.gz >SHA256SUMS)
cat "$out/SHA256SUMS"
