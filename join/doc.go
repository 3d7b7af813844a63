// Package join defines how an edge node joins a tether hub and keeps its
// identity: the join token (a bootstrap token plus the pin of the hub's CA),
// the node's key and certificate request, and the HTTP exchanges through
// which a node obtains, renews and re-attests its certificate.
//
// Both sides import it: the hub serves the exchanges, the edge agent calls
// them. It depends on neither.
//
// The exchanges are JSON over HTTPS:
//
//   - POST JoinPath with "Authorization: Bearer <id>.<secret>" and a Request
//     holding a certificate request: the hub checks the bootstrap token and
//     signs a certificate for system:node:<node> in group system:nodes.
//     The client has no CA yet; it accepts the hub only if the CA the hub
//     presents in its chain hashes to the pin in the token.
//   - POST RenewPath, authenticated as the node (normally over the tunnel),
//     with a Request for the same node: a fresh certificate.
//   - POST ReattestPath, for a node whose certificate expired while it was
//     offline: the Request carries the expired certificate and a request
//     signed by the same key, which proves the node still holds it. The hub
//     signs again only while the Node object exists.
//
// Errors come back as a Kubernetes Status; the client functions return its
// message.
package join
