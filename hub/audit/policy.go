package audit

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	auditinternal "k8s.io/apiserver/pkg/apis/audit"
	auditinstall "k8s.io/apiserver/pkg/apis/audit/install"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	auditvalidation "k8s.io/apiserver/pkg/apis/audit/validation"

	"github.com/tether-edge/tether/hub/auth"
)

// Attributes describe a request for policy evaluation.
type Attributes struct {
	// User is the authenticated user (before impersonation, as upstream
	// evaluates the policy); nil when authentication failed.
	User *auth.User
	// Verb is the Kubernetes verb of resource requests (get, list, ...)
	// and the lower-case HTTP method of others.
	Verb string
	// ResourceRequest is true for requests to /api/... and /apis/...
	// resources.
	ResourceRequest bool
	APIGroup        string
	Resource        string
	Subresource     string
	Namespace       string
	Name            string
	// Path is the request path, matched by nonResourceURLs.
	Path string
}

// Decision is what the policy decided for one request.
type Decision struct {
	// Level is the audit level; None means the request is not logged.
	Level auditv1.Level
	// OmitStages are the stages not logged.
	OmitStages []auditv1.Stage
	// OmitManagedFields drops metadata.managedFields from logged bodies.
	OmitManagedFields bool
}

// Omits reports whether stage is not to be logged.
func (d Decision) Omits(stage auditv1.Stage) bool {
	for _, s := range d.OmitStages {
		if s == stage {
			return true
		}
	}
	return false
}

// Logs reports whether the decision's level includes level l (None <
// Metadata < Request < RequestResponse).
func (d Decision) Logs(l auditv1.Level) bool {
	return auditinternal.Level(d.Level).GreaterOrEqual(auditinternal.Level(l))
}

// Policy decides the audit level of requests.
type Policy struct {
	p *auditinternal.Policy
}

// DefaultPolicy is the policy without a policy file: every request at
// Metadata level, without the RequestReceived stage (every request is
// still logged once it completes, and long-running ones when their
// response starts).
func DefaultPolicy() *Policy {
	return &Policy{p: &auditinternal.Policy{
		OmitStages: []auditinternal.Stage{auditinternal.StageRequestReceived},
		Rules:      []auditinternal.PolicyRule{{Level: auditinternal.LevelMetadata}},
	}}
}

// LoadPolicyFile reads an audit.k8s.io/v1 Policy from path (YAML or JSON).
// Unknown fields are tolerated, as upstream does; a file that does not
// decode, names no or another apiVersion, fails validation or has no
// rules is refused.
func LoadPolicyFile(path string) (*Policy, error) {
	if path == "" {
		return nil, errors.New("load audit policy: file path not specified")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("failed to read file path %q: %w", path, err)
	}
	p, err := LoadPolicy(b)
	if err != nil {
		return nil, fmt.Errorf("%v: from file %v", err, path)
	}
	return p, nil
}

// LoadPolicy decodes and validates a Policy (see LoadPolicyFile).
func LoadPolicy(b []byte) (*Policy, error) {
	scheme := runtime.NewScheme()
	auditinstall.Install(scheme)
	p := &auditinternal.Policy{}
	strict := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDecoder()
	_, gvk, err := strict.Decode(b, nil, p)
	if err != nil {
		if !runtime.IsStrictDecodingError(err) {
			return nil, fmt.Errorf("failed decoding: %w", err)
		}
		lenient := serializer.NewCodecFactory(scheme).UniversalDecoder(auditv1.SchemeGroupVersion)
		p = &auditinternal.Policy{}
		if _, gvk, err = lenient.Decode(b, nil, p); err != nil {
			return nil, fmt.Errorf("failed lenient decoding: %w", err)
		}
	}
	if gvk == nil || (schema.GroupVersion{Group: gvk.Group, Version: gvk.Version}) != auditv1.SchemeGroupVersion {
		return nil, fmt.Errorf("unknown group version field %v in policy", gvk)
	}
	if errs := auditvalidation.ValidatePolicy(p); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	if len(p.Rules) == 0 {
		return nil, errors.New("loaded illegal policy with 0 rules")
	}
	return &Policy{p: p}, nil
}

// Evaluate returns the decision of the first rule matching a, or level
// None when none does. Requests for sensitive resources (see Sensitive)
// get Metadata at most.
func (p *Policy) Evaluate(a *Attributes) Decision {
	d := Decision{Level: auditv1.LevelNone, OmitManagedFields: p.p.OmitManagedFields}
	for i := range p.p.Rules {
		r := &p.p.Rules[i]
		if !ruleMatches(r, a) {
			continue
		}
		d.Level = auditv1.Level(r.Level)
		d.OmitStages = stages(p.p.OmitStages, r.OmitStages)
		if r.OmitManagedFields != nil {
			d.OmitManagedFields = *r.OmitManagedFields
		}
		break
	}
	if d.Level != auditv1.LevelNone && d.Level != auditv1.LevelMetadata &&
		a.ResourceRequest && Sensitive(a.APIGroup, a.Resource, a.Subresource) {
		d.Level = auditv1.LevelMetadata
	}
	return d
}

// Sensitive reports whether the bodies of requests to a resource may
// carry credentials and are therefore never logged: secrets, TokenRequests
// (serviceaccounts/token) and TokenReviews.
func Sensitive(group, resource, subresource string) bool {
	switch {
	case group == "" && resource == "secrets":
		return true
	case group == "" && resource == "serviceaccounts" && subresource == "token":
		return true
	case group == "authentication.k8s.io" && resource == "tokenreviews":
		return true
	}
	return false
}

func stages(policy, rule []auditinternal.Stage) []auditv1.Stage {
	out := make([]auditv1.Stage, 0, len(policy)+len(rule))
	for _, s := range policy {
		out = append(out, auditv1.Stage(s))
	}
	for _, s := range rule {
		out = append(out, auditv1.Stage(s))
	}
	return out
}

func ruleMatches(r *auditinternal.PolicyRule, a *Attributes) bool {
	if len(r.Users) > 0 && (a.User == nil || !has(r.Users, a.User.Name)) {
		return false
	}
	if len(r.UserGroups) > 0 {
		if a.User == nil {
			return false
		}
		found := false
		for _, g := range a.User.Groups {
			if has(r.UserGroups, g) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	if len(r.Verbs) > 0 && !has(r.Verbs, a.Verb) {
		return false
	}
	if len(r.Namespaces) > 0 || len(r.Resources) > 0 {
		return ruleMatchesResource(r, a)
	}
	if len(r.NonResourceURLs) > 0 {
		if a.ResourceRequest {
			return false
		}
		for _, spec := range r.NonResourceURLs {
			if pathMatches(a.Path, spec) {
				return true
			}
		}
		return false
	}
	return true
}

func ruleMatchesResource(r *auditinternal.PolicyRule, a *Attributes) bool {
	if !a.ResourceRequest {
		return false
	}
	if len(r.Namespaces) > 0 && !has(r.Namespaces, a.Namespace) {
		return false
	}
	if len(r.Resources) == 0 {
		return true
	}
	combined := a.Resource
	if a.Subresource != "" {
		combined += "/" + a.Subresource
	}
	for _, gr := range r.Resources {
		if gr.Group != a.APIGroup {
			continue
		}
		if len(gr.Resources) == 0 {
			return true
		}
		if len(gr.ResourceNames) > 0 && !has(gr.ResourceNames, a.Name) {
			continue
		}
		for _, res := range gr.Resources {
			switch {
			case res == "*" || res == combined:
				return true
			case a.Subresource != "" && strings.HasPrefix(res, "*/") && res[2:] == a.Subresource:
				return true
			case strings.HasSuffix(res, "/*") && strings.TrimSuffix(res, "/*") == a.Resource:
				return true
			}
		}
	}
	return false
}

func pathMatches(path, spec string) bool {
	if spec == "*" || spec == path {
		return true
	}
	return strings.HasSuffix(spec, "*") && strings.HasPrefix(path, strings.TrimRight(spec, "*"))
}

func has(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
