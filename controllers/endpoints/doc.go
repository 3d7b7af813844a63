// Package endpoints keeps the EndpointSlices and the legacy Endpoints
// object of every Service that has a selector, and mirrors the Endpoints of
// Services without one into EndpointSlices.
//
// For each such Service it lists the pods the selector matches and turns
// each into an endpoint: its addresses of the slice's family, ready,
// serving and terminating conditions, node name and zone, hostname and a
// reference to the pod. Endpoints are grouped by address type and by the
// port numbers their pod resolves the Service's target ports to, so pods
// that give a named port different numbers land in different slices. A
// slice holds at most MaxEndpointsPerSlice endpoints.
//
// Updates keep churn low, because every slice write is sent to every node
// that watches Services: endpoints are changed where they are, new ones
// fill slices already being written, then go to one slice that has room
// for them all, and only then to new slices; a slice whose content did not
// change is never written. Services without a selector are left to their
// users, except that Mirror, as upstream's endpointslice-mirroring
// controller, mirrors their hand-written Endpoints into EndpointSlices
// managed by endpointslicemirroring-controller.k8s.io, which the
// EndpointSlice controller never touches.
//
// Pod changes are handled as they arrive, with no batching delay, so a
// readiness change reaches the slices within one API round trip.
package endpoints
