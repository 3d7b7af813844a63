package audit

import (
	"strings"
	"testing"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/tether-edge/tether/hub/auth"
)

const testPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
omitManagedFields: true
rules:
- level: None
  users: [system:kube-proxy]
  verbs: [watch]
- level: None
  userGroups: [system:nodes]
  nonResourceURLs: ["/healthz*", /version]
- level: RequestResponse
  resources:
  - group: ""
    resources: [secrets, configmaps]
- level: Request
  resources:
  - group: apps
    resources: ["deployments/*"]
  namespaces: [prod]
  omitStages: [ResponseStarted]
  omitManagedFields: false
- level: Metadata
  resources:
  - group: ""
    resources: ["*/status"]
    resourceNames: [special]
- level: None
  resources: [{group: ""}]
  namespaces: [""]
- level: Metadata
`

func TestPolicyEvaluate(t *testing.T) {
	p, err := LoadPolicy([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	admin := &auth.User{Name: "admin", Groups: []string{"system:masters"}}
	node := &auth.User{Name: "system:node:n1", Groups: []string{"system:nodes"}}
	proxy := &auth.User{Name: "system:kube-proxy"}
	res := func(u *auth.User, verb, group, resource, sub, ns, name string) *Attributes {
		return &Attributes{User: u, Verb: verb, ResourceRequest: true, APIGroup: group, Resource: resource,
			Subresource: sub, Namespace: ns, Name: name}
	}
	for _, tc := range []struct {
		name  string
		a     *Attributes
		level auditv1.Level
	}{
		{"user and verb", res(proxy, "watch", "", "services", "", "", ""), auditv1.LevelNone},
		{"user, other verb", res(proxy, "list", "", "services", "", "", ""), auditv1.LevelNone}, // cluster-scoped core: rule 6
		{"group and path prefix", &Attributes{User: node, Verb: "get", Path: "/healthz/ping"}, auditv1.LevelNone},
		{"group and exact path", &Attributes{User: node, Verb: "get", Path: "/version"}, auditv1.LevelNone},
		{"other group, path", &Attributes{User: admin, Verb: "get", Path: "/version"}, auditv1.LevelMetadata},
		{"secrets capped at Metadata", res(admin, "get", "", "secrets", "", "default", "s"), auditv1.LevelMetadata},
		{"configmaps", res(admin, "get", "", "configmaps", "", "default", "c"), auditv1.LevelRequestResponse},
		{"resource/* matches the resource", res(admin, "get", "apps", "deployments", "", "prod", "d"), auditv1.LevelRequest},
		{"resource/* matches subresources", res(admin, "update", "apps", "deployments", "scale", "prod", "d"), auditv1.LevelRequest},
		{"namespace mismatch", res(admin, "get", "apps", "deployments", "", "dev", "d"), auditv1.LevelMetadata},
		{"*/status with its name", res(admin, "update", "", "pods", "status", "default", "special"), auditv1.LevelMetadata},
		{"cluster-scoped core", res(admin, "get", "", "nodes", "", "", "n"), auditv1.LevelNone},
		{"token requests capped", res(admin, "create", "", "serviceaccounts", "token", "", "sa"), auditv1.LevelNone},
	} {
		d := p.Evaluate(tc.a)
		if d.Level != tc.level {
			t.Errorf("%s: level %s, want %s", tc.name, d.Level, tc.level)
		}
	}
	d := p.Evaluate(res(admin, "get", "apps", "deployments", "", "prod", "d"))
	if !d.Omits(auditv1.StageRequestReceived) || !d.Omits(auditv1.StageResponseStarted) || d.Omits(auditv1.StageResponseComplete) || d.OmitManagedFields {
		t.Errorf("rule stages and managed fields: %+v", d)
	}
	if d := p.Evaluate(res(admin, "get", "", "configmaps", "", "default", "c")); !d.OmitManagedFields {
		t.Errorf("policy's omitManagedFields not inherited: %+v", d)
	}
	// Upstream's own recommendation cannot lift a secret above Metadata.
	all, err := LoadPolicy([]byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: RequestResponse\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []*Attributes{
		res(admin, "create", "", "secrets", "", "default", ""),
		res(admin, "list", "", "secrets", "", "", ""),
		res(admin, "create", "", "serviceaccounts", "token", "default", "sa"),
		res(admin, "create", "authentication.k8s.io", "tokenreviews", "", "", ""),
	} {
		if d := all.Evaluate(a); d.Level != auditv1.LevelMetadata {
			t.Errorf("%s %s/%s at %s, want Metadata", a.Verb, a.Resource, a.Subresource, d.Level)
		}
	}
	if d := DefaultPolicy().Evaluate(res(nil, "get", "", "pods", "", "default", "p")); d.Level != auditv1.LevelMetadata ||
		!d.Omits(auditv1.StageRequestReceived) {
		t.Errorf("default policy: %+v", d)
	}
}

func TestLoadPolicyErrors(t *testing.T) {
	for policy, want := range map[string]string{
		"apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: Loud\n":                                             `rules[0].level: Unsupported value: "Loud"`,
		"apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: None\n  nonResourceURLs: [/a]\n  resources: [{}]\n": "rules[0].nonResourceURLs: Invalid value",
		"apiVersion: audit.k8s.io/v1\nkind: Policy\n":                                                                    "loaded illegal policy with 0 rules",
		"apiVersion: audit.k8s.io/v2\nkind: Policy\nrules:\n- level: None\n":                                             "failed decoding",
		"kind: Policy\nrules:\n- level: None\n":                                                                          "unknown group version field",
	} {
		_, err := LoadPolicy([]byte(policy))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("policy %q: error %v, want %q", policy, err, want)
		}
	}
	// Unknown fields are tolerated, as upstream does.
	if _, err := LoadPolicy([]byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nfoo: bar\nrules:\n- level: None\n")); err != nil {
		t.Errorf("unknown field: %v", err)
	}
}
