// Package admissionregistration serves the admissionregistration.k8s.io/v1
// kinds: ValidatingWebhookConfiguration, MutatingWebhookConfiguration,
// ValidatingAdmissionPolicy and ValidatingAdmissionPolicyBinding, with
// kube-apiserver's defaults, validation (CEL expressions compiled with
// k8s.io/apiserver's admission CEL environment) and table columns. The
// admission they configure is dispatched by hub/webhooks.
package admissionregistration

import (
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/validation/field"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/cel/environment"

	"github.com/tether-edge/tether/hub/registry"
)

var gv = admissionregistrationv1.SchemeGroupVersion

// Kinds returns the served admissionregistration.k8s.io/v1 kinds.
func Kinds() []*registry.Kind {
	v := &validator{envs: environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion())}
	v.compiler = plugincel.NewCompiler(v.envs)
	return []*registry.Kind{
		{
			GVK:        gv.WithKind("ValidatingWebhookConfiguration"),
			Resource:   "validatingwebhookconfigurations",
			Singular:   "validatingwebhookconfiguration",
			Categories: []string{"api-extensions"},
			Default: func(obj runtime.Object) {
				c := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration)
				for i := range c.Webhooks {
					w := &c.Webhooks[i]
					defaultWebhook(&w.FailurePolicy, &w.MatchPolicy, &w.NamespaceSelector, &w.ObjectSelector, &w.TimeoutSeconds, w.Rules, &w.ClientConfig)
				}
			},
			Validate: func(obj runtime.Object) field.ErrorList {
				return v.validatingWebhooks(obj.(*admissionregistrationv1.ValidatingWebhookConfiguration).Webhooks)
			},
			Columns: columns(
				column("Webhooks", "integer", "Webhooks indicates the number of webhooks registered in this configuration"),
			),
			Cells: func(obj runtime.Object, now time.Time) []any {
				c := obj.(*admissionregistrationv1.ValidatingWebhookConfiguration)
				return []any{c.Name, int64(len(c.Webhooks)), age(c.CreationTimestamp, now)}
			},
		},
		{
			GVK:        gv.WithKind("MutatingWebhookConfiguration"),
			Resource:   "mutatingwebhookconfigurations",
			Singular:   "mutatingwebhookconfiguration",
			Categories: []string{"api-extensions"},
			Default: func(obj runtime.Object) {
				c := obj.(*admissionregistrationv1.MutatingWebhookConfiguration)
				for i := range c.Webhooks {
					w := &c.Webhooks[i]
					defaultWebhook(&w.FailurePolicy, &w.MatchPolicy, &w.NamespaceSelector, &w.ObjectSelector, &w.TimeoutSeconds, w.Rules, &w.ClientConfig)
					if w.ReinvocationPolicy == nil {
						p := admissionregistrationv1.NeverReinvocationPolicy
						w.ReinvocationPolicy = &p
					}
				}
			},
			Validate: func(obj runtime.Object) field.ErrorList {
				return v.mutatingWebhooks(obj.(*admissionregistrationv1.MutatingWebhookConfiguration).Webhooks)
			},
			Columns: columns(
				column("Webhooks", "integer", "Webhooks indicates the number of webhooks registered in this configuration"),
			),
			Cells: func(obj runtime.Object, now time.Time) []any {
				c := obj.(*admissionregistrationv1.MutatingWebhookConfiguration)
				return []any{c.Name, int64(len(c.Webhooks)), age(c.CreationTimestamp, now)}
			},
		},
		{
			GVK:        gv.WithKind("ValidatingAdmissionPolicy"),
			Resource:   "validatingadmissionpolicies",
			Singular:   "validatingadmissionpolicy",
			Categories: []string{"api-extensions"},
			HasStatus:  true,
			HasSpec:    true,
			Default: func(obj runtime.Object) {
				s := &obj.(*admissionregistrationv1.ValidatingAdmissionPolicy).Spec
				if s.FailurePolicy == nil {
					p := admissionregistrationv1.Fail
					s.FailurePolicy = &p
				}
				defaultMatchResources(s.MatchConstraints)
			},
			Validate: func(obj runtime.Object) field.ErrorList {
				return v.policy(&obj.(*admissionregistrationv1.ValidatingAdmissionPolicy).Spec)
			},
			Columns: columns(
				column("Validations", "integer", "Validations indicates the number of validation rules defined in this configuration"),
				column("ParamKind", "string", "ParamKind specifies the kind of resources used to parameterize this policy"),
			),
			Cells: func(obj runtime.Object, now time.Time) []any {
				p := obj.(*admissionregistrationv1.ValidatingAdmissionPolicy)
				paramKind := "<unset>"
				if k := p.Spec.ParamKind; k != nil {
					paramKind = k.APIVersion + "/" + k.Kind
				}
				return []any{p.Name, int64(len(p.Spec.Validations)), paramKind, age(p.CreationTimestamp, now)}
			},
		},
		{
			GVK:        gv.WithKind("ValidatingAdmissionPolicyBinding"),
			Resource:   "validatingadmissionpolicybindings",
			Singular:   "validatingadmissionpolicybinding",
			Categories: []string{"api-extensions"},
			HasSpec:    true,
			Default: func(obj runtime.Object) {
				s := &obj.(*admissionregistrationv1.ValidatingAdmissionPolicyBinding).Spec
				defaultMatchResources(s.MatchResources)
				if s.ParamRef != nil && s.ParamRef.ParameterNotFoundAction == nil {
					a := admissionregistrationv1.DenyAction
					s.ParamRef.ParameterNotFoundAction = &a
				}
			},
			Validate: func(obj runtime.Object) field.ErrorList {
				return validateBinding(&obj.(*admissionregistrationv1.ValidatingAdmissionPolicyBinding).Spec)
			},
			Columns: columns(
				column("PolicyName", "string", "PolicyName indicates the policy definition which the policy binding binded to"),
				column("ParamRef", "string", "ParamRef indicates the param resource which sets the configration param"),
			),
			Cells: func(obj runtime.Object, now time.Time) []any {
				b := obj.(*admissionregistrationv1.ValidatingAdmissionPolicyBinding)
				paramRef := "<unset>"
				if r := b.Spec.ParamRef; r != nil {
					switch {
					case r.Name != "" && r.Namespace != "":
						paramRef = r.Namespace + "/" + r.Name
					case r.Name != "":
						paramRef = r.Name
					case r.Selector != nil:
						paramRef = "*/" + metav1.FormatLabelSelector(r.Selector)
					}
				}
				return []any{b.Name, b.Spec.PolicyName, paramRef, age(b.CreationTimestamp, now)}
			},
		},
	}
}

// defaultWebhook sets the defaults kube-apiserver gives every webhook of
// a configuration.
func defaultWebhook(failure **admissionregistrationv1.FailurePolicyType, match **admissionregistrationv1.MatchPolicyType,
	nsSel, objSel **metav1.LabelSelector, timeout **int32, rules []admissionregistrationv1.RuleWithOperations,
	cc *admissionregistrationv1.WebhookClientConfig) {
	if *failure == nil {
		p := admissionregistrationv1.Fail
		*failure = &p
	}
	if *match == nil {
		p := admissionregistrationv1.Equivalent
		*match = &p
	}
	if *nsSel == nil {
		*nsSel = &metav1.LabelSelector{}
	}
	if *objSel == nil {
		*objSel = &metav1.LabelSelector{}
	}
	if *timeout == nil {
		t := int32(10)
		*timeout = &t
	}
	for i := range rules {
		defaultScope(&rules[i].Rule)
	}
	if cc.Service != nil && cc.Service.Port == nil {
		p := int32(443)
		cc.Service.Port = &p
	}
}

func defaultScope(r *admissionregistrationv1.Rule) {
	if r.Scope == nil {
		s := admissionregistrationv1.AllScopes
		r.Scope = &s
	}
}

func defaultMatchResources(m *admissionregistrationv1.MatchResources) {
	if m == nil {
		return
	}
	if m.MatchPolicy == nil {
		p := admissionregistrationv1.Equivalent
		m.MatchPolicy = &p
	}
	if m.NamespaceSelector == nil {
		m.NamespaceSelector = &metav1.LabelSelector{}
	}
	if m.ObjectSelector == nil {
		m.ObjectSelector = &metav1.LabelSelector{}
	}
	for i := range m.ResourceRules {
		defaultScope(&m.ResourceRules[i].Rule)
	}
	for i := range m.ExcludeResourceRules {
		defaultScope(&m.ExcludeResourceRules[i].Rule)
	}
}

func column(name, typ, desc string) metav1.TableColumnDefinition {
	return metav1.TableColumnDefinition{Name: name, Type: typ, Description: desc}
}

// columns puts Name first and Age last, as upstream's printers do.
func columns(cols ...metav1.TableColumnDefinition) []metav1.TableColumnDefinition {
	out := []metav1.TableColumnDefinition{{Name: "Name", Type: "string", Format: "name",
		Description: metav1.ObjectMeta{}.SwaggerDoc()["name"]}}
	out = append(out, cols...)
	return append(out, column("Age", "string", metav1.ObjectMeta{}.SwaggerDoc()["creationTimestamp"]))
}

func age(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}
