// Package tunnelbench measures the tunnel against its peers over the
// testbench lab's impaired links: head-of-line isolation against one
// TCP+TLS HTTP/2 connection, time to first byte of a hub→edge dial, goodput
// under loss against TCP+TLS, the idle uplink cost per edge, and the bulk
// lane: its goodput on lossy and on thin links, its share beside a cubic
// flow, and B1/B2 while it fills the uplink. Everything
// lives in its tests; they need root (network namespaces) and run short
// by default, long with -tunnelbench.full:
//
//	go test -v ./tunnel/tunnelbench
//	go test -v -timeout 20m ./tunnel/tunnelbench -tunnelbench.full
package tunnelbench
