// Package repotest holds tests of the tether repository itself rather than of
// one package: the import rules of docs/architecture.md, checked against
// `go list`, that the edge-only build of cmd/tether (-tags edge) links no
// hub, store, scheduler or controllers package, and the committed eBPF
// objects of the dataplane, checked against what `go generate ./dataplane`
// produces from dataplane/bpf, and that scripts/up.sh stopped with Ctrl-C
// and followed by `tether edge reset --purge` leaves nothing on the node.
// It has no non-test code but this comment.
package repotest
