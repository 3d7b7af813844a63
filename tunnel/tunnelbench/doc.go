// Package tunnelbench measures the tunnel against its peers over the
// testbench lab's impaired links: head-of-line isolation against one
// TCP+TLS HTTP/2 connection, time to first byte of a hub→edge dial, goodput
// under loss against TCP+TLS, and the idle uplink cost per edge. Everything
// lives in its tests; they need root (network namespaces) and run short
// by default, long with -tunnelbench.full:
//
//	go test -v ./tunnel/tunnelbench
//	go test -v -timeout 20m ./tunnel/tunnelbench -tunnelbench.full
package tunnelbench
