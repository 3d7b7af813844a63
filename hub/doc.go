// Package hub is tether's control plane process: it opens the store, loads or
// creates the certificate authority, serves the Kubernetes API over HTTPS
// (HTTP/2 and HTTP/1.1), serves the edges' tunnel (QUIC on the API port's
// UDP side, the TCP+TLS fallback on the API port by ALPN) and the API
// requests arriving through it, runs the scheduler and the controllers
// in-process as clients of its own API, and writes an admin kubeconfig once
// it serves.
//
// Several hubs may serve one cluster from one PostgreSQL datastore. The
// scheduler and the controllers then run on one of them at a time, elected
// by Leases in kube-system as upstream's components are (leader.go), and
// the addresses, ports and ranges admission hands out are claimed in the
// store so that no two hubs give out the same one (see docs/hubs.md).
//
// A Hub is built with [New] from a [Config] and runs until its context ends;
// on SIGTERM the command cancels that context and Run sends edges a drain
// notice, drains requests, ends watches and closes the store, so every
// acknowledged write is on disk.
package hub
