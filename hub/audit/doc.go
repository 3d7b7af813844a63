// Package audit writes the hub's audit log: one audit.k8s.io/v1 Event per
// request stage, as JSON lines, chosen by an audit.k8s.io/v1 Policy, the
// way kube-apiserver's --audit-log-path and --audit-policy-file do.
//
// What comes from libraries: the Policy and Event types, their scheme
// (decoding, defaulting, conversion of a policy file) and the policy's
// validation come from k8s.io/apiserver/pkg/apis/audit, so a policy file
// written for kube-apiserver is read, and refused, exactly as upstream
// does. Size-based rotation is gopkg.in/natefinch/lumberjack.v2, the
// rotator kube-apiserver uses, with the same flag semantics.
//
// What is written here and why: the rule matching of a policy (Evaluate)
// follows upstream's k8s.io/apiserver/pkg/audit/policy checker, which is
// not imported because that package depends on k8s.io/apiserver/pkg/audit
// and through it on k8s.io/component-base's metrics registry and the
// Prometheus client (global registries registered at init), a tree far
// larger than the hundred lines of matching it would save. The writer is
// written here too: upstream's log backend writes each event on the request
// path; this one queues events and writes them in batches from one
// goroutine (see [Log]).
//
// Secrets' bodies are never logged: whatever a policy says, requests for
// secrets, serviceaccounts/token (TokenRequest) and tokenreviews are
// audited at Metadata level at most (see [Sensitive]).
//
// Only the hub links this package: the edge build (-tags edge) does not.
package audit
