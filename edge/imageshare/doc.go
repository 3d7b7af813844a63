// Package imageshare shares image content among the nodes of a site, so
// that a site's uplink carries each blob of an image once, however many
// of its nodes pull the image.
//
// Every agent of a site serves the blobs of its containerd content store,
// read-only and by digest only (GET /blobs/sha256:HEX, with Range), over
// TLS with mutual authentication by the node certificates the cluster's
// CA issued: a client must present a certificate of a node of this
// cluster (system:node:NAME in group system:nodes), and a client checks
// that the server presents the certificate of the member it meant to
// reach.
//
// Its nouns:
//
//   - A member is a node of the site that gossip sees alive; Peers lists
//     them with the address of their share server.
//   - The owner of a blob is the member that ranks first for its digest
//     by rendezvous hashing (Rank). The owner fetches the blob from the
//     registry and the other members fetch it from the owner: asked for a
//     blob it lacks, with through=1, the owner pulls it through (one
//     download, however many ask at once, shared with its own pull).
//   - An ingest writes a blob into the local content store under the
//     blob's digest and size: containerd's writer checks both at commit,
//     so a peer's wrong bytes are never kept. A failed ingest is aborted
//     and the next source is tried: the owner, then the other members
//     (only what they hold), then the registry.
//
// Manifests and indexes, small, always come from the registry; so does
// everything when no member answers.
package imageshare
