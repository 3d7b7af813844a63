// Package nodes is the hub's side of edge nodes: it joins them (bootstrap
// tokens, node certificates, renewal and re-attestation), authorizes what a
// node's credentials may do (the node authorizer), and keeps the Lease of
// every node whose tunnel is up and the heartbeats of their status.
//
// # Node Leases
//
// Edges do not write their Leases: the hub renews the Lease of every node
// whose tunnel is up and whose heartbeats arrive ([Leases]), every
// LeaseRenew. A renewal moves only spec.renewTime, and only in memory;
// the store is written when a Lease is created, when the stored holder or
// duration is not the node's (a client changed them), and at the first
// renewal of each tunnel session. renewTime is not persisted otherwise,
// not even at shutdown: after a restart the node lifecycle controller
// starts every node's grace period afresh from what it observes, and each
// reconnecting node's first renewal is a store write anyway. So the store
// sees a write per node connection, not per heartbeat.
//
// [Leases.Serve] wraps the storage the API server uses; only leases in
// kube-node-lease (or in all namespaces) take the detour:
//
//   - GET and LIST return the stored Lease with the renewTime of the
//     renewal in memory, if one was made on the stored state (same
//     resourceVersion) and is newer. The object keeps the stored
//     resourceVersion, so a read-modify-write works as ever; a list keeps
//     the store revision it reflects.
//   - A renewal belongs to no store revision. A watch sends it as MODIFIED
//     with the resourceVersion of the last event the watch delivered (or
//     the one it started from), so resourceVersions never go down in a
//     watch, and sends it only once the watch has delivered the stored
//     state it renews: a stored change still on its way can never come
//     after a renewal with a higher resourceVersion, so resuming from any
//     resourceVersion a client saw skips no stored change and replays from
//     the change log like any other watch (410 only below its window).
//   - Renewals are not in the change log. Each remembers the store revision
//     current when it was made (read after every open watch was told of
//     it); a watch resuming from resourceVersion N sends again every
//     renewal remembered at N or later, which covers every renewal the
//     client cannot have seen (it may see a few twice; informers take an
//     identical update as a no-op). A watch with initial events starts
//     from a list with renewals applied, then stored changes from the
//     list's revision; its initial-events-end bookmark carries that
//     revision. Bookmarks carry the watch's last resourceVersion.
//   - Writes from clients win: they go to the store as they come. A
//     resourceVersion from a renewal event (not older than the stored
//     Lease, not newer than the store) is taken as the stored one; an
//     update whose renewTime is older than the renewal in memory was read
//     before it and conflicts (409), as it would have after a stored
//     renewal; a patch applies to the Lease as read, renewal included, and
//     server-side apply stores the renewal first. Renewals of a Lease wait
//     while a client writes it, until the hub's watch of the store shows
//     the write, so that no renewal reaches a watch after a write that
//     carries an older renewTime. A write voids the renewal in memory; the
//     next one renews the Lease as written (if it still names the node as
//     holder with its duration; else the hub writes those back, as a
//     kubelet re-acquiring its Lease would).
//
// # Node status heartbeats
//
// An agent reports its Node's status when something in it changes and at
// least every five minutes, as a kubelet does; a report with nothing new
// moves only its conditions' lastHeartbeatTime. [Heartbeats.Serve] keeps
// such reports in memory: a status patch whose result differs from the
// stored Node only in heartbeats that are later than the stored ones
// writes nothing. The reply, GET and LIST show the Node as stored with
// the latest heartbeat of each condition held for it; the object keeps the
// stored resourceVersion. Watches are not told of them: no store revision
// carries them, and a Node's liveness is its Lease (above), not its
// heartbeats. Every other write is stored as it comes, and a stored status
// whose heartbeats have caught up ends the hold. Nothing held is persisted:
// after a restart reads show the stored heartbeats until each agent's next
// report, at most five minutes later, and another hub in front of the same
// store shows its own. A fleet at rest so costs the store no write per
// node every five minutes, and its sites' watchers of Nodes no event. The
// price is paid by lists of Nodes: while any heartbeat is held they are
// encoded object by object rather than served from the stored bytes
// (about 25 ms for 1,000 Nodes instead of 1.4 ms).
package nodes

import (
	"crypto/x509"
	"log/slog"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/join"
)

// DefaultCertTTL is how long a node certificate is valid unless configured.
const DefaultCertTTL = 365 * 24 * time.Hour

// Config configures the node services.
type Config struct {
	// Storage reads and writes objects. Required.
	Storage storage.API
	// Authority signs node certificates. Required.
	Authority *pki.Authority
	// CertTTL is the lifetime of node certificates; zero means one year.
	// Agents renew at two thirds of it.
	CertTTL time.Duration
	// LeaseDuration is leaseDurationSeconds of node Leases; zero means 40s,
	// as the kubelet's.
	LeaseDuration time.Duration
	// LeaseRenew is how old a connected node's Lease may get before the
	// hub renews it; zero means 7s, which keeps renewTime under 10s old
	// with room for a slow write.
	LeaseRenew time.Duration
	// HeartbeatTimeout is how long after its last heartbeat a connected
	// node still counts as alive; zero means 25s: agents send one every
	// 15s, so this allows one late by 10s. A node whose agent died without
	// closing its tunnel (a crash, a power cut) stops having its Lease
	// renewed then, long before the tunnel's idle timeout (45s) ends the
	// session, so the node turns Unknown about as soon after its death as
	// a dead kubelet's would.
	HeartbeatTimeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Logger receives logs; nil means slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults() {
	if c.CertTTL <= 0 {
		c.CertTTL = DefaultCertTTL
	}
	if c.LeaseDuration <= 0 {
		c.LeaseDuration = 40 * time.Second
	}
	if c.LeaseRenew <= 0 {
		c.LeaseRenew = 7 * time.Second
	}
	if c.HeartbeatTimeout <= 0 {
		c.HeartbeatTimeout = 25 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

var (
	nodesKind   = mustKind(schema.GroupVersionResource{Version: "v1", Resource: "nodes"})
	podsKind    = mustKind(schema.GroupVersionResource{Version: "v1", Resource: "pods"})
	secretsKind = mustKind(schema.GroupVersionResource{Version: "v1", Resource: "secrets"})
	pvsKind     = mustKind(schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumes"})
	leasesKind  = mustKind(schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"})
)

func mustKind(gvr schema.GroupVersionResource) *registry.Kind {
	k := registry.Lookup(gvr)
	if k == nil {
		panic("nodes: kind not served: " + gvr.String())
	}
	return k
}

// Identify maps the verified client certificate of a tunnel to the node it
// belongs to: only node certificates (CN system:node:<name>, O
// system:nodes) may open a tunnel.
func Identify(cert *x509.Certificate) (string, error) {
	name, ok := join.NodeName(cert.Subject.CommonName)
	if !ok {
		return "", errNotNode(cert.Subject.CommonName)
	}
	for _, o := range cert.Subject.Organization {
		if o == join.NodesGroup {
			return name, nil
		}
	}
	return "", errNotNode(cert.Subject.CommonName)
}

type errNotNode string

func (e errNotNode) Error() string {
	return "certificate of " + string(e) + " is not a node certificate (CN system:node:<name>, O system:nodes)"
}
