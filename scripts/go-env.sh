# Sourced by tether's scripts: makes sure a Go toolchain new enough for
# go.mod is on PATH. Go 1.21 and later fetch the exact toolchain go.mod asks
# for through the module proxy by themselves.
if ! command -v go >/dev/null 2>&1; then
  for d in /usr/local/go/bin /usr/lib/go/bin; do
    [ -x "$d/go" ] && export PATH="$d:$PATH" && break
  done
fi
if ! command -v go >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq golang-go >/dev/null
  fi
fi
if ! command -v go >/dev/null 2>&1; then
  echo "tether needs Go (1.21 or newer to bootstrap; go.mod asks for 1.26): install it and retry" >&2
  exit 1
fi
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto}
