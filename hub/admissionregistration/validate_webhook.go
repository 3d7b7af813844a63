package admissionregistration

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/sets"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	apiservercel "k8s.io/apiserver/pkg/cel"
	"k8s.io/apiserver/pkg/cel/environment"
	webhookutil "k8s.io/apiserver/pkg/util/webhook"
)

// acceptedReviewVersions are the AdmissionReview versions tether sends,
// most preferred first.
var acceptedReviewVersions = []string{"v1", "v1beta1"}

// maxMatchConditions is upstream's limit of matchConditions per webhook
// or policy.
const maxMatchConditions = 64

// validator validates admissionregistration objects; it holds the CEL
// environment expressions compile in.
type validator struct {
	envs     *environment.EnvSet
	compiler plugincel.Compiler
}

// webhookFields is what validating and mutating webhooks share.
type webhookFields struct {
	name               string
	clientConfig       admissionregistrationv1.WebhookClientConfig
	rules              []admissionregistrationv1.RuleWithOperations
	failurePolicy      *admissionregistrationv1.FailurePolicyType
	matchPolicy        *admissionregistrationv1.MatchPolicyType
	namespaceSelector  *metav1.LabelSelector
	objectSelector     *metav1.LabelSelector
	sideEffects        *admissionregistrationv1.SideEffectClass
	timeoutSeconds     *int32
	reviewVersions     []string
	matchConditions    []admissionregistrationv1.MatchCondition
	reinvocationPolicy *admissionregistrationv1.ReinvocationPolicyType
	mutating           bool
}

func (v *validator) validatingWebhooks(hooks []admissionregistrationv1.ValidatingWebhook) field.ErrorList {
	var errs field.ErrorList
	names := sets.New[string]()
	for i, h := range hooks {
		p := field.NewPath("webhooks").Index(i)
		errs = append(errs, v.webhook(p, webhookFields{name: h.Name, clientConfig: h.ClientConfig, rules: h.Rules,
			failurePolicy: h.FailurePolicy, matchPolicy: h.MatchPolicy, namespaceSelector: h.NamespaceSelector,
			objectSelector: h.ObjectSelector, sideEffects: h.SideEffects, timeoutSeconds: h.TimeoutSeconds,
			reviewVersions: h.AdmissionReviewVersions, matchConditions: h.MatchConditions})...)
		if names.Has(h.Name) {
			errs = append(errs, field.Duplicate(p.Child("name"), h.Name))
		}
		names.Insert(h.Name)
	}
	return errs
}

func (v *validator) mutatingWebhooks(hooks []admissionregistrationv1.MutatingWebhook) field.ErrorList {
	var errs field.ErrorList
	names := sets.New[string]()
	for i, h := range hooks {
		p := field.NewPath("webhooks").Index(i)
		errs = append(errs, v.webhook(p, webhookFields{name: h.Name, clientConfig: h.ClientConfig, rules: h.Rules,
			failurePolicy: h.FailurePolicy, matchPolicy: h.MatchPolicy, namespaceSelector: h.NamespaceSelector,
			objectSelector: h.ObjectSelector, sideEffects: h.SideEffects, timeoutSeconds: h.TimeoutSeconds,
			reviewVersions: h.AdmissionReviewVersions, matchConditions: h.MatchConditions,
			reinvocationPolicy: h.ReinvocationPolicy, mutating: true})...)
		if names.Has(h.Name) {
			errs = append(errs, field.Duplicate(p.Child("name"), h.Name))
		}
		names.Insert(h.Name)
	}
	return errs
}

func (v *validator) webhook(p *field.Path, h webhookFields) field.ErrorList {
	errs := utilvalidation.IsFullyQualifiedName(p.Child("name"), h.name)
	for i, r := range h.rules {
		errs = append(errs, validateRuleWithOperations(&r, p.Child("rules").Index(i))...)
	}
	if h.failurePolicy != nil && !supportedFailurePolicies.Has(string(*h.failurePolicy)) {
		errs = append(errs, field.NotSupported(p.Child("failurePolicy"), *h.failurePolicy, sets.List(supportedFailurePolicies)))
	}
	if h.matchPolicy != nil && !supportedMatchPolicies.Has(string(*h.matchPolicy)) {
		errs = append(errs, field.NotSupported(p.Child("matchPolicy"), *h.matchPolicy, sets.List(supportedMatchPolicies)))
	}
	switch {
	case h.sideEffects == nil:
		errs = append(errs, field.Required(p.Child("sideEffects"), fmt.Sprintf("must specify one of %v", strings.Join(sets.List(supportedSideEffects), ", "))))
	case !supportedSideEffects.Has(string(*h.sideEffects)):
		errs = append(errs, field.NotSupported(p.Child("sideEffects"), *h.sideEffects, sets.List(supportedSideEffects)))
	}
	if h.timeoutSeconds != nil && (*h.timeoutSeconds > 30 || *h.timeoutSeconds < 1) {
		errs = append(errs, field.Invalid(p.Child("timeoutSeconds"), *h.timeoutSeconds, "the timeout value must be between 1 and 30 seconds"))
	}
	if h.namespaceSelector != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(h.namespaceSelector, metav1validation.LabelSelectorValidationOptions{}, p.Child("namespaceSelector"))...)
	}
	if h.objectSelector != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(h.objectSelector, metav1validation.LabelSelectorValidationOptions{}, p.Child("objectSelector"))...)
	}
	if h.mutating && h.reinvocationPolicy != nil && !supportedReinvocationPolicies.Has(string(*h.reinvocationPolicy)) {
		errs = append(errs, field.NotSupported(p.Child("reinvocationPolicy"), *h.reinvocationPolicy, sets.List(supportedReinvocationPolicies)))
	}
	errs = append(errs, validateReviewVersions(h.reviewVersions, p.Child("admissionReviewVersions"))...)
	errs = append(errs, validateClientConfig(&h.clientConfig, p.Child("clientConfig"))...)
	errs = append(errs, v.matchConditions(h.matchConditions, plugincel.OptionalVariableDeclarations{HasAuthorizer: true}, p.Child("matchConditions"))...)
	return errs
}

var (
	supportedFailurePolicies      = sets.New(string(admissionregistrationv1.Ignore), string(admissionregistrationv1.Fail))
	supportedMatchPolicies        = sets.New(string(admissionregistrationv1.Exact), string(admissionregistrationv1.Equivalent))
	supportedSideEffects          = sets.New(string(admissionregistrationv1.SideEffectClassNone), string(admissionregistrationv1.SideEffectClassNoneOnDryRun))
	supportedReinvocationPolicies = sets.New(string(admissionregistrationv1.NeverReinvocationPolicy), string(admissionregistrationv1.IfNeededReinvocationPolicy))
	supportedOperations           = sets.New(string(admissionregistrationv1.OperationAll), string(admissionregistrationv1.Create),
		string(admissionregistrationv1.Update), string(admissionregistrationv1.Delete), string(admissionregistrationv1.Connect))
	supportedScopes = sets.New(string(admissionregistrationv1.AllScopes), string(admissionregistrationv1.ClusterScope), string(admissionregistrationv1.NamespacedScope))
)

// validateClientConfig checks that exactly one of url and service is set,
// that a url is https, that a service reference is complete, and that the
// caBundle holds PEM certificates.
func validateClientConfig(cc *admissionregistrationv1.WebhookClientConfig, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch {
	case (cc.URL == nil) == (cc.Service == nil):
		errs = append(errs, field.Required(p, "exactly one of url or service is required"))
	case cc.URL != nil:
		errs = append(errs, webhookutil.ValidateWebhookURL(p.Child("url"), *cc.URL, true)...)
	default:
		port := int32(443)
		if cc.Service.Port != nil {
			port = *cc.Service.Port
		}
		errs = append(errs, webhookutil.ValidateWebhookService(p.Child("service"), cc.Service.Namespace, cc.Service.Name, cc.Service.Path, port)...)
	}
	if len(cc.CABundle) > 0 {
		for _, e := range webhookutil.ValidateCABundle(p.Child("caBundle"), cc.CABundle) {
			// The bundle itself is no use in a message.
			e.BadValue = field.OmitValueType{}
			errs = append(errs, e)
		}
	}
	return errs
}

func validateReviewVersions(versions []string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(versions) == 0 {
		return append(errs, field.Required(p, fmt.Sprintf("must specify one of %v", strings.Join(acceptedReviewVersions, ", "))))
	}
	seen := sets.New[string]()
	recognized := false
	for i, v := range versions {
		if seen.Has(v) {
			errs = append(errs, field.Invalid(p.Index(i), v, "duplicate version"))
			continue
		}
		seen.Insert(v)
		for _, m := range utilvalidation.IsDNS1035Label(v) {
			errs = append(errs, field.Invalid(p.Index(i), v, m))
		}
		for _, a := range acceptedReviewVersions {
			recognized = recognized || v == a
		}
	}
	if !recognized {
		errs = append(errs, field.Invalid(p, versions, fmt.Sprintf("must include at least one of %v", strings.Join(acceptedReviewVersions, ", "))))
	}
	return errs
}

func validateRuleWithOperations(r *admissionregistrationv1.RuleWithOperations, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	ops := p.Child("operations")
	if len(r.Operations) == 0 {
		errs = append(errs, field.Required(ops, ""))
	}
	if len(r.Operations) > 1 && hasWildcard(r.Operations) {
		errs = append(errs, field.Invalid(ops, r.Operations, "if '*' is present, must not specify other operations"))
	}
	for i, op := range r.Operations {
		if !supportedOperations.Has(string(op)) {
			errs = append(errs, field.NotSupported(ops.Index(i), op, sets.List(supportedOperations)))
		}
	}
	return append(errs, validateRule(&r.Rule, p, true)...)
}

func hasWildcard[T ~string](vals []T) bool {
	for _, v := range vals {
		if v == "*" {
			return true
		}
	}
	return false
}

func validateRule(r *admissionregistrationv1.Rule, p *field.Path, allowSubresources bool) field.ErrorList {
	var errs field.ErrorList
	if len(r.APIGroups) == 0 {
		errs = append(errs, field.Required(p.Child("apiGroups"), ""))
	}
	if len(r.APIGroups) > 1 && hasWildcard(r.APIGroups) {
		errs = append(errs, field.Invalid(p.Child("apiGroups"), r.APIGroups, "if '*' is present, must not specify other API groups"))
	}
	if len(r.APIVersions) == 0 {
		errs = append(errs, field.Required(p.Child("apiVersions"), ""))
	}
	if len(r.APIVersions) > 1 && hasWildcard(r.APIVersions) {
		errs = append(errs, field.Invalid(p.Child("apiVersions"), r.APIVersions, "if '*' is present, must not specify other API versions"))
	}
	for i, v := range r.APIVersions {
		if v == "" {
			errs = append(errs, field.Required(p.Child("apiVersions").Index(i), ""))
		}
	}
	if allowSubresources {
		errs = append(errs, validateResources(r.Resources, p.Child("resources"))...)
	} else {
		errs = append(errs, validateResourcesNoSubResources(r.Resources, p.Child("resources"))...)
	}
	if r.Scope != nil && !supportedScopes.Has(string(*r.Scope)) {
		errs = append(errs, field.NotSupported(p.Child("scope"), *r.Scope, sets.List(supportedScopes)))
	}
	return errs
}

// validateResources checks resource[/subresource] names and their
// wildcards as upstream does.
func validateResources(resources []string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(resources) == 0 {
		errs = append(errs, field.Required(p, ""))
	}
	// x/*: every subresource of x; */y: subresource y of every resource.
	withSub := sets.New[string]()
	subOfAll := sets.New[string]()
	hasDoubleWildcard, hasSingleWildcard, hasResourceWithoutSub := false, false, false
	for i, r := range resources {
		if r == "" {
			errs = append(errs, field.Required(p.Index(i), ""))
			continue
		}
		switch r {
		case "*/*":
			hasDoubleWildcard = true
		case "*":
			hasSingleWildcard = true
		}
		parts := strings.SplitN(r, "/", 2)
		if len(parts) == 1 {
			hasResourceWithoutSub = true
			continue
		}
		res, sub := parts[0], parts[1]
		if withSub.Has(res) {
			errs = append(errs, field.Invalid(p.Index(i), r, fmt.Sprintf("if '%s/*' is present, must not specify %s", res, r)))
		}
		if subOfAll.Has(sub) {
			errs = append(errs, field.Invalid(p.Index(i), r, fmt.Sprintf("if '*/%s' is present, must not specify %s", sub, r)))
		}
		if sub == "*" {
			withSub.Insert(res)
		}
		if res == "*" {
			subOfAll.Insert(sub)
		}
	}
	if len(resources) > 1 && hasDoubleWildcard {
		errs = append(errs, field.Invalid(p, resources, "if '*/*' is present, must not specify other resources"))
	}
	if hasSingleWildcard && hasResourceWithoutSub && len(resources) > 1 {
		for _, r := range resources {
			if r != "*" && !strings.Contains(r, "/") {
				errs = append(errs, field.Invalid(p, resources, "if '*' is present, must not specify other resources without subresources"))
				break
			}
		}
	}
	return errs
}

func validateResourcesNoSubResources(resources []string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(resources) == 0 {
		errs = append(errs, field.Required(p, ""))
	}
	for i, r := range resources {
		if r == "" {
			errs = append(errs, field.Required(p.Index(i), ""))
		}
		if strings.Contains(r, "/") {
			errs = append(errs, field.Invalid(p.Index(i), r, "must not specify subresources"))
		}
	}
	if len(resources) > 1 && hasWildcard(resources) {
		errs = append(errs, field.Invalid(p, resources, "if '*' is present, must not specify other resources"))
	}
	return errs
}

// matchConditions checks names (qualified, unique) and compiles each
// expression in the admission CEL environment.
func (v *validator) matchConditions(conds []admissionregistrationv1.MatchCondition, vars plugincel.OptionalVariableDeclarations, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(conds) > maxMatchConditions {
		errs = append(errs, field.TooMany(p, len(conds), maxMatchConditions))
	}
	names := sets.New[string]()
	for i, c := range conds {
		cp := p.Index(i)
		if c.Name == "" {
			errs = append(errs, field.Required(cp.Child("name"), ""))
		} else {
			for _, m := range utilvalidation.IsQualifiedName(c.Name) {
				errs = append(errs, field.Invalid(cp.Child("name"), c.Name, m))
			}
			if names.Has(c.Name) {
				errs = append(errs, field.Duplicate(cp.Child("name"), c.Name))
			}
			names.Insert(c.Name)
		}
		if c.Expression == "" {
			errs = append(errs, field.Required(cp.Child("expression"), ""))
			continue
		}
		mc := matchconditions.MatchCondition(c)
		errs = append(errs, v.compile(v.compiler, &mc, vars, cp.Child("expression"))...)
	}
	return errs
}

// compile compiles one expression and reports its error as upstream does.
func (v *validator) compile(c plugincel.Compiler, e plugincel.ExpressionAccessor, vars plugincel.OptionalVariableDeclarations, p *field.Path) field.ErrorList {
	res := c.CompileCELExpression(e, vars, environment.NewExpressions)
	if res.Error == nil {
		return nil
	}
	switch res.Error.Type {
	case apiservercel.ErrorTypeRequired:
		return field.ErrorList{field.Required(p, res.Error.Detail)}
	case apiservercel.ErrorTypeInvalid:
		return field.ErrorList{field.Invalid(p, e.GetExpression(), res.Error.Detail)}
	default:
		return field.ErrorList{field.InternalError(p, res.Error)}
	}
}
