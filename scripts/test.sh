#!/usr/bin/env bash
# Runs tether's whole test suite on a Debian machine: installs what the tests
# need (when run as root), builds the pinned upstream kubectl and Helm the
# end-to-end tests drive (and Helm 3, cert-manager's controller and a sample
# operator), checks formatting and vet, runs every package's
# tests (the privileged ones for real when root) and runs each fuzz target
# briefly.
#
#   TETHER_FUZZTIME   how long each fuzz target runs (default 5s)
#   TETHER_TEST_ARGS  extra arguments for `go test` (e.g. -run TestKubectl)
#   TETHER_STEPS      the steps to run, space-separated (default: all of
#                     gofmt vet staticcheck test race fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

source "$root/scripts/go-env.sh"

# step reports whether a step is to run.
step() {
  [[ " ${TETHER_STEPS:-gofmt vet staticcheck test race fuzz} " == *" $1 "* ]]
}

# The modules of tether and of the upstream tools the tests build are
# fetched in the background while the packages install and the linters
# run: on a fresh machine that is network time the CPU-bound steps need
# not wait for.
tools=(kubectl helm helm3 certmanager sampleoperator)
downloads=$(mktemp)
(
  go mod download
  if step test || step race; then
    for t in "${tools[@]}"; do (cd "tools/$t" && go mod download); done
  fi
) >"$downloads" 2>&1 &
downloading=$!
trap 'kill "$downloading" 2>/dev/null || true; rm -f "$downloads"' EXIT

# Debian packages: a C compiler for the SQLite driver (cgo); iproute2,
# nftables and conntrack for the network lab and the dataplane tests;
# iptables for the dataplane's kube-proxy-style comparison and, with ipset,
# for the network policy benchmark's kube-router-style peer; clang, llvm
# (llvm-strip) and libbpf-dev to regenerate the eBPF objects and check that
# the committed ones match (internal/repotest). containerd, runc, the CNI
# plugins and a static busybox (the shell inside the test images) for the
# edge's container runtime. Chromium for the fleet page's browser test.
# PostgreSQL for the store's PostgreSQL backend (store/postgres/pgtest
# starts throw-away clusters with its initdb and pg_ctl); nginx for the
# ingress controller's benchmark, which compares with it.
packages=(gcc libc6-dev postgresql iproute2 nftables conntrack iptables ipset clang llvm libbpf-dev containerd runc containernetworking-plugins busybox-static chromium nginx)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  missing=()
  for p in "${packages[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "== installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
fi

echo "== go $(go env GOVERSION)"

# Packages whose tests also run under the race detector: the ones with the
# most concurrency whose tests take seconds, not minutes. Their tests run
# only with -race, in the race step, not twice. The store benchmarks
# (store/storebench) are not among them: they drive the stores the store
# packages' own tests already race, and under the detector they took 76 s
# to say nothing more.
race_pkgs=($(go list ./store/... | grep -vx 'github.com/tether-edge/tether/store/storebench') ./tunnel/ ./scheduler/ ./controllers/internal/kit/ ./edge/state/ ./edge/localstate/)

# Test binaries are linked without DWARF (-w): stack traces and profiles
# come from the symbol tables Go keeps anyway, and a test binary of the
# hub's size links in about two thirds of the CPU time without it.
link_flags=-ldflags=-w

# Packages whose tests take minutes, mostly longest first. go test starts
# packages in the order it is given them, so these start first and the
# short packages fill in beside them, instead of the longest one starting
# late and running alone at the end. Most of their time is spent waiting:
# on shaped links, on containerd, on a hub process, on timeouts the tests
# exercise. On a 2-core machine the containerd lab and the tunnel
# benchmarks running together kept less than one core busy, and a hub's
# end-to-end test about one, so the test step runs three packages at once
# rather than one per core.
slow_pkgs=(./testbench/ ./hub/ ./edge/containerd/ ./tunnel/tunnelbench/ ./edge/)

# Packages that keep every core busy: the hollow fleets, thousands of
# agents in one process. Their tests run after the others, alone: they
# assert a deadline (2,000 agents reconnected within 30 s of a hub's
# restart), and beside the containerd lab or the tunnel benchmarks the
# machine's load passed 20 at that moment.
alone_pkgs=(./testbench/hollow/)

if step gofmt; then
echo "== gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:"; echo "$unformatted"; exit 1
fi

fi

if step vet; then
echo "== go vet"
go vet ./...
fi

if step staticcheck; then
# staticcheck at a pinned version with the checks of staticcheck.conf; the
# findings listed in scripts/staticcheck-exclude.txt (file and check) pass.
staticcheck_version=v0.8.2
echo "== staticcheck $staticcheck_version"
GOBIN=$root/bin go install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_version"
findings=$(mktemp)
# It exits 1 when it reports something, which the list below judges.
status=0
"$root/bin/staticcheck" ./... >"$findings" 2>&1 || status=$?
if [ "$status" -gt 1 ]; then
  cat "$findings"; echo "staticcheck failed (exit status $status)"; exit 1
fi
exclude=scripts/staticcheck-exclude.txt
left=$(awk 'NR == FNR { if ($0 !~ /^(#|[[:space:]]*$)/) ex[$1 " " $2] = 1; next }
  { f = $0; sub(/:.*/, "", f); c = $NF; gsub(/[()]/, "", c); if (!((f " " c) in ex)) print }' "$exclude" "$findings")
awk 'NR == FNR { f = $0; sub(/:.*/, "", f); c = $NF; gsub(/[()]/, "", c); seen[f " " c] = 1; next }
  $0 !~ /^(#|[[:space:]]*$)/ && !(($1 " " $2) in seen) { print "-- " FILENAME ": nothing left to exclude for " $1 " " $2 }' "$findings" "$exclude"
rm -f "$findings"
if [ -n "$left" ]; then
  echo "$left"; exit 1
fi
fi

if step test || step race; then
  if ! wait "$downloading"; then
    cat "$downloads"; echo "go mod download failed"; exit 1
  fi
  echo "== building kubectl (k8s.io/kubectl $(cd tools/kubectl && go list -m -f '{{.Version}}' k8s.io/kubectl))"
  bash tools/kubectl/build.sh "$root/bin/kubectl"
  export TETHER_KUBECTL=$root/bin/kubectl
  echo "== building helm (helm.sh/helm/v4 $(cd tools/helm && go list -m -f '{{.Version}}' helm.sh/helm/v4))"
  bash tools/helm/build.sh "$root/bin/helm"
  export TETHER_HELM=$root/bin/helm
  echo "== building helm 3 (helm.sh/helm/v3 $(cd tools/helm3 && go list -m -f '{{.Version}}' helm.sh/helm/v3))"
  bash tools/helm3/build.sh "$root/bin/helm3"
  export TETHER_HELM3=$root/bin/helm3
  echo "== building cert-manager's controller (github.com/cert-manager/cert-manager $(cd tools/certmanager && go list -m -f '{{.Version}}' github.com/cert-manager/cert-manager))"
  bash tools/certmanager/build.sh "$root/bin/cert-manager-controller"
  export TETHER_CERTMANAGER=$root/bin/cert-manager-controller
  echo "== building the sample operator"
  bash tools/sampleoperator/build.sh "$root/bin/sampleoperator"
  export TETHER_SAMPLEOPERATOR=$root/bin/sampleoperator
  # The hub binary the end-to-end tests run (hub/hubtest), linked once
  # here: each test package would otherwise link its own copy, about half
  # a minute of CPU each.
  echo "== building tether for the tests"
  go build -o "$root/bin/tether" ./cmd/tether
  export TETHER_BIN=$root/bin/tether
fi

# run_tests runs `go test` with the given arguments. A failing test's
# output can be long (a lab test prints its processes' logs), so on failure
# the failures and the lines the tests wrote (file:line) are printed once
# more at the end, where a reader of a cut log still finds them.
run_tests() {
  local out status=0
  out=$(mktemp)
  go test "$@" 2>&1 | tee "$out" || status=$?
  if [ "$status" != 0 ]; then
    echo "== failing tests and their messages, again"
    grep -E '^[[:space:]]*--- FAIL|^[[:space:]]+[A-Za-z0-9_]+\.go:[0-9]+: |^panic: |^FAIL' "$out" | tail -n 250
  fi
  rm -f "$out"
  return "$status"
}

if step test; then
# The install test (deploy) installs a hub and an edge from a release
# tarball of this machine's architecture, built once here. Without
# -trimpath its packages are the ones the tests compile, so it costs two
# links rather than a second full build.
echo "== release tarball for linux/$(go env GOARCH) (scripts/release.sh)"
TETHER_RELEASE_ARCHES=$(go env GOARCH) TETHER_RELEASE_TRIMPATH=0 bash scripts/release.sh ci "$root/bin/release"
export TETHER_RELEASE_DIR=$root/bin/release
echo "== go test"
# shellcheck disable=SC2046,SC2086
run_tests -p 3 -count=1 -timeout 25m "$link_flags" ${TETHER_TEST_ARGS:-} $({ go list "${slow_pkgs[@]}"; go list ./... | grep -vxF -f <(go list "${slow_pkgs[@]}"); } | grep -vxF -f <(go list "${race_pkgs[@]}" "${alone_pkgs[@]}"))
echo "== go test ${alone_pkgs[*]}"
# shellcheck disable=SC2086
run_tests -count=1 -timeout 25m "$link_flags" ${TETHER_TEST_ARGS:-} "${alone_pkgs[@]}"
fi

if step race; then
echo "== go test -race ${race_pkgs[*]}"
# shellcheck disable=SC2086
run_tests -race -count=1 -timeout 15m "$link_flags" ${TETHER_TEST_ARGS:-} "${race_pkgs[@]}"
fi

if step fuzz; then
echo "== fuzz"
fuzztime=${TETHER_FUZZTIME:-5s}
# fuzz_one runs one target. A failing input is always written to
# testdata/fuzz/<target>/ and fails the run. Go 1.26's fuzzing coordinator
# can also end a clean run with a bare "context deadline exceeded" when the
# -fuzztime deadline meets a busy worker (golang/go#75804, fixed in Go
# 1.27); that outcome, with no input written, is run again, up to three
# times in all.
fuzz_inputs() {
  if [ -d "$1" ]; then find "$1" -type f | wc -l; else echo 0; fi
}
fuzz_one() {
  local pkg=$1 dir=$2 f=$3 out try before after
  out=$(mktemp)
  for try in 1 2 3; do
    before=$(fuzz_inputs "$dir/testdata/fuzz/$f")
    if go test "$link_flags" -run '^$' -fuzz "^$f\$" -fuzztime "$fuzztime" "$pkg" 2>&1 | tee "$out"; then
      rm -f "$out"
      return 0
    fi
    after=$(fuzz_inputs "$dir/testdata/fuzz/$f")
    if [ "$after" != "$before" ] || ! grep -qx '    context deadline exceeded' "$out"; then
      rm -f "$out"
      return 1
    fi
    echo "-- $f: the fuzzing coordinator's deadline race, no failing input written; running it again"
  done
  rm -f "$out"
  echo "-- $f: three runs ended in the coordinator's deadline race with no failing input: not counted as a failure"
}
# One go list for every package's directory: one per package took about
# 20 s on a 2-core machine.
mapfile -t pkg_dirs < <(go list -f '{{.ImportPath}} {{.Dir}}' ./...)
for pd in "${pkg_dirs[@]}"; do
  pkg=${pd%% *} dir=${pd#* }
  for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //'); do
    echo "-- $pkg $f ($fuzztime)"
    fuzz_one "$pkg" "$dir" "$f"
  done
done
fi
echo "== all tests passed"
