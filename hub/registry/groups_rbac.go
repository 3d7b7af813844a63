package registry

import (
	"strings"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/validate/content"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// rbacNameRule: RBAC object names are path segments, not DNS names.
func rbacNameRule(name string, prefix bool) []string { return content.IsPathSegmentName(name) }

var createdAtColumn = column("Created At", "date", 0, "CreationTimestamp is a timestamp representing the server time when this object was created.")

func createdAt(m *metav1.ObjectMeta) string { return m.CreationTimestamp.UTC().Format(time.RFC3339) }

var roleKind = &Kind{
	GVK:        rbacv1.SchemeGroupVersion.WithKind("Role"),
	Resource:   "roles",
	Singular:   "role",
	Namespaced: true,
	NameRule:   rbacNameRule,
	Validate:   func(obj runtime.Object) field.ErrorList { return validatePolicyRules(obj.(*rbacv1.Role).Rules, true) },
	Columns:    []metav1.TableColumnDefinition{nameColumn, createdAtColumn},
	Cells: func(obj runtime.Object, now time.Time) []any {
		r := obj.(*rbacv1.Role)
		return []any{r.Name, createdAt(&r.ObjectMeta)}
	},
}

var clusterRoleKind = &Kind{
	GVK:      rbacv1.SchemeGroupVersion.WithKind("ClusterRole"),
	Resource: "clusterroles",
	Singular: "clusterrole",
	NameRule: rbacNameRule,
	Validate: func(obj runtime.Object) field.ErrorList {
		r := obj.(*rbacv1.ClusterRole)
		errs := validatePolicyRules(r.Rules, false)
		if a := r.AggregationRule; a != nil {
			ap := field.NewPath("aggregationRule", "clusterRoleSelectors")
			if len(a.ClusterRoleSelectors) == 0 {
				errs = append(errs, field.Required(ap, "at least one clusterRoleSelector required if aggregationRule is non-nil"))
			}
			for i := range a.ClusterRoleSelectors {
				errs = append(errs, metav1validation.ValidateLabelSelector(&a.ClusterRoleSelectors[i], metav1validation.LabelSelectorValidationOptions{}, ap.Index(i))...)
			}
		}
		return errs
	},
	Columns: []metav1.TableColumnDefinition{nameColumn, createdAtColumn},
	Cells: func(obj runtime.Object, now time.Time) []any {
		r := obj.(*rbacv1.ClusterRole)
		return []any{r.Name, createdAt(&r.ObjectMeta)}
	},
}

func validatePolicyRules(rules []rbacv1.PolicyRule, namespaced bool) field.ErrorList {
	var errs field.ErrorList
	for i, r := range rules {
		p := field.NewPath("rules").Index(i)
		if len(r.Verbs) == 0 {
			errs = append(errs, field.Required(p.Child("verbs"), "verbs must contain at least one value"))
		}
		if len(r.NonResourceURLs) > 0 {
			if namespaced {
				errs = append(errs, field.Invalid(p.Child("nonResourceURLs"), r.NonResourceURLs, "namespaced rules cannot apply to non-resource URLs"))
			}
			if len(r.APIGroups) > 0 || len(r.Resources) > 0 || len(r.ResourceNames) > 0 {
				errs = append(errs, field.Invalid(p.Child("nonResourceURLs"), r.NonResourceURLs, "rules cannot apply to both regular resources and non-resource URLs"))
			}
			continue
		}
		if len(r.APIGroups) == 0 {
			errs = append(errs, field.Required(p.Child("apiGroups"), "resource rules must supply at least one api group"))
		}
		if len(r.Resources) == 0 {
			errs = append(errs, field.Required(p.Child("resources"), "resource rules must supply at least one resource"))
		}
	}
	return errs
}

var bindingColumns = []metav1.TableColumnDefinition{
	nameColumn,
	column("Role", "string", 0, "RoleRef can reference a Role in the current namespace or a ClusterRole in the global namespace."),
	ageColumn,
	column("Users", "string", 1, "Users in the roleBinding"),
	column("Groups", "string", 1, "Groups in the roleBinding"),
	column("ServiceAccounts", "string", 1, "ServiceAccounts in the roleBinding"),
}

func bindingCells(m *metav1.ObjectMeta, ref rbacv1.RoleRef, subjects []rbacv1.Subject, now time.Time) []any {
	var users, groups, sas []string
	for _, s := range subjects {
		switch s.Kind {
		case rbacv1.UserKind:
			users = append(users, s.Name)
		case rbacv1.GroupKind:
			groups = append(groups, s.Name)
		case rbacv1.ServiceAccountKind:
			sas = append(sas, s.Namespace+":"+s.Name)
		}
	}
	return []any{m.Name, ref.Kind + "/" + ref.Name, age(m.CreationTimestamp, now),
		strings.Join(users, ", "), strings.Join(groups, ", "), strings.Join(sas, ", ")}
}

// defaultBinding fills the API groups upstream defaults in a binding: the
// roleRef's and each subject's (empty for service accounts).
func defaultBinding(ref *rbacv1.RoleRef, subjects []rbacv1.Subject) {
	if ref.APIGroup == "" {
		ref.APIGroup = rbacv1.GroupName
	}
	for i := range subjects {
		s := &subjects[i]
		if s.APIGroup != "" {
			continue
		}
		switch s.Kind {
		case rbacv1.UserKind, rbacv1.GroupKind:
			s.APIGroup = rbacv1.GroupName
		}
	}
}

var roleBindingKind = &Kind{
	GVK:        rbacv1.SchemeGroupVersion.WithKind("RoleBinding"),
	Resource:   "rolebindings",
	Singular:   "rolebinding",
	Namespaced: true,
	NameRule:   rbacNameRule,
	Default: func(obj runtime.Object) {
		b := obj.(*rbacv1.RoleBinding)
		defaultBinding(&b.RoleRef, b.Subjects)
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		b := obj.(*rbacv1.RoleBinding)
		return validateBinding(b.RoleRef, b.Subjects, true)
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		b, o := obj.(*rbacv1.RoleBinding), old.(*rbacv1.RoleBinding)
		errs := validateBinding(b.RoleRef, b.Subjects, true)
		if b.RoleRef != o.RoleRef {
			errs = append(errs, field.Invalid(field.NewPath("roleRef"), b.RoleRef, "cannot change roleRef"))
		}
		return errs
	},
	Columns: bindingColumns,
	Cells: func(obj runtime.Object, now time.Time) []any {
		b := obj.(*rbacv1.RoleBinding)
		return bindingCells(&b.ObjectMeta, b.RoleRef, b.Subjects, now)
	},
}

var clusterRoleBindingKind = &Kind{
	GVK:      rbacv1.SchemeGroupVersion.WithKind("ClusterRoleBinding"),
	Resource: "clusterrolebindings",
	Singular: "clusterrolebinding",
	NameRule: rbacNameRule,
	Default: func(obj runtime.Object) {
		b := obj.(*rbacv1.ClusterRoleBinding)
		defaultBinding(&b.RoleRef, b.Subjects)
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		b := obj.(*rbacv1.ClusterRoleBinding)
		return validateBinding(b.RoleRef, b.Subjects, false)
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		b, o := obj.(*rbacv1.ClusterRoleBinding), old.(*rbacv1.ClusterRoleBinding)
		errs := validateBinding(b.RoleRef, b.Subjects, false)
		if b.RoleRef != o.RoleRef {
			errs = append(errs, field.Invalid(field.NewPath("roleRef"), b.RoleRef, "cannot change roleRef"))
		}
		return errs
	},
	Columns: bindingColumns,
	Cells: func(obj runtime.Object, now time.Time) []any {
		b := obj.(*rbacv1.ClusterRoleBinding)
		return bindingCells(&b.ObjectMeta, b.RoleRef, b.Subjects, now)
	},
}

func validateBinding(ref rbacv1.RoleRef, subjects []rbacv1.Subject, namespaced bool) field.ErrorList {
	var errs field.ErrorList
	rp := field.NewPath("roleRef")
	if ref.APIGroup != rbacv1.GroupName {
		errs = append(errs, field.NotSupported(rp.Child("apiGroup"), ref.APIGroup, []string{rbacv1.GroupName}))
	}
	if namespaced {
		if ref.Kind != "Role" && ref.Kind != "ClusterRole" {
			errs = append(errs, field.NotSupported(rp.Child("kind"), ref.Kind, []string{"Role", "ClusterRole"}))
		}
	} else if ref.Kind != "ClusterRole" {
		errs = append(errs, field.NotSupported(rp.Child("kind"), ref.Kind, []string{"ClusterRole"}))
	}
	if ref.Name == "" {
		errs = append(errs, field.Required(rp.Child("name"), ""))
	} else {
		for _, m := range content.IsPathSegmentName(ref.Name) {
			errs = append(errs, field.Invalid(rp.Child("name"), ref.Name, m))
		}
	}
	for i, s := range subjects {
		sp := field.NewPath("subjects").Index(i)
		if s.Name == "" {
			errs = append(errs, field.Required(sp.Child("name"), ""))
		}
		switch s.Kind {
		case rbacv1.ServiceAccountKind:
			if s.Name != "" {
				for _, m := range dnsSubdomainMsgs(s.Name) {
					errs = append(errs, field.Invalid(sp.Child("name"), s.Name, m))
				}
			}
			if s.APIGroup != "" {
				errs = append(errs, field.NotSupported(sp.Child("apiGroup"), s.APIGroup, []string{""}))
			}
			if !namespaced && s.Namespace == "" {
				errs = append(errs, field.Required(sp.Child("namespace"), ""))
			}
		case rbacv1.UserKind, rbacv1.GroupKind:
			if s.APIGroup != rbacv1.GroupName {
				errs = append(errs, field.NotSupported(sp.Child("apiGroup"), s.APIGroup, []string{rbacv1.GroupName}))
			}
		default:
			errs = append(errs, field.NotSupported(sp.Child("kind"), s.Kind,
				[]string{rbacv1.ServiceAccountKind, rbacv1.UserKind, rbacv1.GroupKind}))
		}
	}
	return errs
}
