package admissionregistration

import (
	"fmt"
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	utilvalidation "k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/cel/environment"
)

var (
	supportedReasons = sets.New(string(metav1.StatusReasonForbidden), string(metav1.StatusReasonInvalid),
		string(metav1.StatusReasonRequestEntityTooLarge), string(metav1.StatusReasonUnauthorized))
	supportedValidationActions = sets.New(string(admissionregistrationv1.Deny), string(admissionregistrationv1.Warn),
		string(admissionregistrationv1.Audit))
	supportedParamNotFoundActions = sets.New(string(admissionregistrationv1.DenyAction), string(admissionregistrationv1.AllowAction))
)

// policy validates a ValidatingAdmissionPolicy's spec, compiling its
// variables, matchConditions, validations and audit annotations in one
// composition environment as upstream does.
func (v *validator) policy(s *admissionregistrationv1.ValidatingAdmissionPolicySpec) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("spec")
	if s.FailurePolicy == nil {
		errs = append(errs, field.Required(p.Child("failurePolicy"), ""))
	} else if !supportedFailurePolicies.Has(string(*s.FailurePolicy)) {
		errs = append(errs, field.NotSupported(p.Child("failurePolicy"), *s.FailurePolicy, sets.List(supportedFailurePolicies)))
	}
	if k := s.ParamKind; k != nil {
		kp := p.Child("paramKind")
		if k.APIVersion == "" {
			errs = append(errs, field.Required(kp.Child("apiVersion"), ""))
		} else if gv, err := schema.ParseGroupVersion(k.APIVersion); err != nil {
			errs = append(errs, field.Invalid(kp.Child("apiVersion"), k.APIVersion, err.Error()))
		} else if gv.Version == "" {
			errs = append(errs, field.Invalid(kp.Child("apiVersion"), k.APIVersion, "version must be specified"))
		}
		if k.Kind == "" {
			errs = append(errs, field.Required(kp.Child("kind"), ""))
		} else if msgs := utilvalidation.IsDNS1035Label(strings.ToLower(k.Kind)); len(msgs) > 0 {
			errs = append(errs, field.Invalid(kp.Child("kind"), k.Kind, strings.Join(msgs, ",")))
		}
	}
	if s.MatchConstraints == nil {
		errs = append(errs, field.Required(p.Child("matchConstraints"), ""))
	} else {
		errs = append(errs, validateMatchResources(s.MatchConstraints, p.Child("matchConstraints"))...)
		if len(s.MatchConstraints.ResourceRules) == 0 {
			errs = append(errs, field.Required(p.Child("matchConstraints", "resourceRules"), ""))
		}
	}
	if len(s.Validations) == 0 && len(s.AuditAnnotations) == 0 {
		errs = append(errs, field.Required(p.Child("validations"), "validations or auditAnnotations must contain at least one item"))
	}

	vars := plugincel.OptionalVariableDeclarations{HasParams: s.ParamKind != nil, HasAuthorizer: true}
	compiler, err := plugincel.NewCompositedCompiler(v.envs)
	if err != nil {
		return append(errs, field.InternalError(p, fmt.Errorf("build CEL environment: %w", err)))
	}
	names := sets.New[string]()
	for i, vr := range s.Variables {
		vp := p.Child("variables").Index(i)
		switch {
		case vr.Name == "":
			errs = append(errs, field.Required(vp.Child("name"), ""))
		case !isCELIdentifier(vr.Name):
			errs = append(errs, field.Invalid(vp.Child("name"), vr.Name, "name is not a valid CEL identifier"))
		case names.Has(vr.Name):
			errs = append(errs, field.Duplicate(vp.Child("name"), vr.Name))
		}
		names.Insert(vr.Name)
		if vr.Expression == "" {
			errs = append(errs, field.Required(vp.Child("expression"), ""))
			continue
		}
		res := compiler.CompileAndStoreVariable(&validating.Variable{Name: vr.Name, Expression: vr.Expression}, vars, environment.NewExpressions)
		if res.Error != nil {
			errs = append(errs, field.Invalid(vp.Child("expression"), vr.Expression, res.Error.Detail))
		}
	}
	errs = append(errs, v.compiledMatchConditions(compiler, s.MatchConditions, vars, p.Child("matchConditions"))...)
	for i, val := range s.Validations {
		vp := p.Child("validations").Index(i)
		if val.Expression == "" {
			errs = append(errs, field.Required(vp.Child("expression"), ""))
		} else {
			errs = append(errs, v.compile(compiler, &validating.ValidationCondition{Expression: val.Expression}, vars, vp.Child("expression"))...)
		}
		if val.MessageExpression != "" {
			errs = append(errs, v.compile(compiler, &validating.MessageExpressionCondition{MessageExpression: val.MessageExpression},
				vars, vp.Child("messageExpression"))...)
		}
		if strings.ContainsAny(val.Message, "\r\n") {
			errs = append(errs, field.Invalid(vp.Child("message"), val.Message, "must not contain line breaks"))
		} else if len(strings.TrimSpace(val.Message)) == 0 && val.Message != "" {
			errs = append(errs, field.Invalid(vp.Child("message"), val.Message, "must be non-empty if specified"))
		}
		if val.Reason != nil && !supportedReasons.Has(string(*val.Reason)) {
			errs = append(errs, field.NotSupported(vp.Child("reason"), *val.Reason, sets.List(supportedReasons)))
		}
	}
	keys := sets.New[string]()
	for i, a := range s.AuditAnnotations {
		ap := p.Child("auditAnnotations").Index(i)
		if a.Key == "" {
			errs = append(errs, field.Required(ap.Child("key"), ""))
		} else {
			for _, m := range utilvalidation.IsQualifiedName("validating.example.com/" + a.Key) {
				errs = append(errs, field.Invalid(ap.Child("key"), a.Key, m))
			}
			if keys.Has(a.Key) {
				errs = append(errs, field.Duplicate(ap.Child("key"), a.Key))
			}
			keys.Insert(a.Key)
		}
		if a.ValueExpression == "" {
			errs = append(errs, field.Required(ap.Child("valueExpression"), ""))
		} else {
			errs = append(errs, v.compile(compiler, &validating.AuditAnnotationCondition{Key: a.Key, ValueExpression: a.ValueExpression},
				vars, ap.Child("valueExpression"))...)
		}
	}
	return errs
}

// compiledMatchConditions is matchConditions compiled with a policy's
// composition compiler, so they may use its variables.
func (v *validator) compiledMatchConditions(c plugincel.Compiler, conds []admissionregistrationv1.MatchCondition, vars plugincel.OptionalVariableDeclarations, p *field.Path) field.ErrorList {
	w := *v
	w.compiler = c
	return w.matchConditions(conds, vars, p)
}

func isCELIdentifier(s string) bool {
	for i, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return s != ""
}

func validateMatchResources(m *admissionregistrationv1.MatchResources, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if m.MatchPolicy == nil {
		errs = append(errs, field.Required(p.Child("matchPolicy"), ""))
	} else if !supportedMatchPolicies.Has(string(*m.MatchPolicy)) {
		errs = append(errs, field.NotSupported(p.Child("matchPolicy"), *m.MatchPolicy, sets.List(supportedMatchPolicies)))
	}
	if m.NamespaceSelector != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(m.NamespaceSelector, metav1validation.LabelSelectorValidationOptions{}, p.Child("namespaceSelector"))...)
	}
	if m.ObjectSelector != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(m.ObjectSelector, metav1validation.LabelSelectorValidationOptions{}, p.Child("objectSelector"))...)
	}
	for i, r := range m.ResourceRules {
		errs = append(errs, validateNamedRule(&r, p.Child("resourceRules").Index(i))...)
	}
	for i, r := range m.ExcludeResourceRules {
		errs = append(errs, validateNamedRule(&r, p.Child("excludeResourceRules").Index(i))...)
	}
	return errs
}

func validateNamedRule(r *admissionregistrationv1.NamedRuleWithOperations, p *field.Path) field.ErrorList {
	errs := validateRuleWithOperations(&r.RuleWithOperations, p)
	for i, n := range r.ResourceNames {
		for _, m := range utilvalidation.IsDNS1123Subdomain(n) {
			errs = append(errs, field.Invalid(p.Child("resourceNames").Index(i), n, m))
		}
	}
	return errs
}

// validateBinding validates a ValidatingAdmissionPolicyBinding's spec.
func validateBinding(s *admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("spec")
	if s.PolicyName == "" {
		errs = append(errs, field.Required(p.Child("policyName"), ""))
	} else {
		for _, m := range utilvalidation.IsDNS1123Subdomain(s.PolicyName) {
			errs = append(errs, field.Invalid(p.Child("policyName"), s.PolicyName, m))
		}
	}
	if r := s.ParamRef; r != nil {
		rp := p.Child("paramRef")
		switch {
		case r.Name != "" && r.Selector != nil:
			errs = append(errs, field.Forbidden(rp.Child("name"), "name and selector are mutually exclusive"))
		case r.Name == "" && r.Selector == nil:
			errs = append(errs, field.Required(rp, "one of name or selector must be set"))
		case r.Selector != nil:
			errs = append(errs, metav1validation.ValidateLabelSelector(r.Selector, metav1validation.LabelSelectorValidationOptions{}, rp.Child("selector"))...)
		}
		if r.ParameterNotFoundAction == nil {
			errs = append(errs, field.Required(rp.Child("parameterNotFoundAction"), ""))
		} else if !supportedParamNotFoundActions.Has(string(*r.ParameterNotFoundAction)) {
			errs = append(errs, field.NotSupported(rp.Child("parameterNotFoundAction"), *r.ParameterNotFoundAction, sets.List(supportedParamNotFoundActions)))
		}
	}
	if s.MatchResources != nil {
		errs = append(errs, validateMatchResources(s.MatchResources, p.Child("matchResources"))...)
	}
	ap := p.Child("validationActions")
	if len(s.ValidationActions) == 0 {
		errs = append(errs, field.Required(ap, ""))
	}
	seen := sets.New[string]()
	for i, a := range s.ValidationActions {
		if !supportedValidationActions.Has(string(a)) {
			errs = append(errs, field.NotSupported(ap.Index(i), a, sets.List(supportedValidationActions)))
		}
		if seen.Has(string(a)) {
			errs = append(errs, field.Duplicate(ap.Index(i), a))
		}
		seen.Insert(string(a))
	}
	if seen.Has(string(admissionregistrationv1.Deny)) && seen.Has(string(admissionregistrationv1.Warn)) {
		errs = append(errs, field.Invalid(ap, s.ValidationActions, "must not contain both Deny and Warn (repeating the same validation failure information in the API response and headers serves no purpose)"))
	}
	return errs
}
