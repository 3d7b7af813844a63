// Package peers lets the hubs that share one store (PostgreSQL) know each
// other: where edges and other hubs reach each of them, and which nodes'
// tunnels each holds.
//
// Each hub records its presence as a Lease in kube-system named
// tether-hub-<id>, labelled tether.io/hub-presence, as kube-apiserver
// records its identity: the annotations carry the hub's tunnel address
// for edges, its API address for the other hubs, and the nodes whose
// tunnels it holds with their heartbeats arriving. The hub renews it every
// Renew and rewrites it, at most once a second, when its nodes change;
// a hub that stops cleanly deletes it. The store thus sees O(hubs) writes,
// whatever the number of nodes or heartbeats.
//
// Every hub watches the others' presence. A presence whose renewTime is
// older than its leaseDurationSeconds is of a dead hub and ignored. From
// the live ones the hub learns:
//
//   - the addresses edges may dial (served to them at HubsPath, over their
//     tunnel), so that an edge whose hub dies moves to another;
//   - which nodes other hubs vouch for, until when (Vouched, fed to the
//     node Lease keeper, which renews their Leases in memory);
//   - which hub to ask for a stream to a node whose tunnel it does not
//     hold (Dial): logs, exec, attach, port-forward and node proxy work
//     from any hub.
//
// Hub-to-hub streams are HTTP/1.1 upgrades on the other hub's API port at
// DialPath, authenticated by TLS client certificates of the cluster CA in
// group HubGroup that every hub issues itself at start (the hubs of one
// store share the CA, see hub/datastore.go).
package peers
