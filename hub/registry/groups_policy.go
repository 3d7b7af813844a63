package registry

import (
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ---- Lease ----

var leaseKind = &Kind{
	GVK:        coordinationv1.SchemeGroupVersion.WithKind("Lease"),
	Resource:   "leases",
	Singular:   "lease",
	Namespaced: true,
	Validate:   func(obj runtime.Object) field.ErrorList { return validateLeaseSpec(&obj.(*coordinationv1.Lease).Spec) },
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Holder", "string", 0, "The holder of the lease."),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		l := obj.(*coordinationv1.Lease)
		holder := ""
		if l.Spec.HolderIdentity != nil {
			holder = *l.Spec.HolderIdentity
		}
		return []any{l.Name, holder, age(l.CreationTimestamp, now)}
	},
}

func validateLeaseSpec(s *coordinationv1.LeaseSpec) field.ErrorList {
	var errs field.ErrorList
	if s.LeaseDurationSeconds != nil && *s.LeaseDurationSeconds <= 0 {
		errs = append(errs, field.Invalid(gSpec.Child("leaseDurationSeconds"), *s.LeaseDurationSeconds, "must be greater than 0"))
	}
	if s.LeaseTransitions != nil {
		errs = append(errs, nonNegative(int64(*s.LeaseTransitions), gSpec.Child("leaseTransitions"))...)
	}
	if s.Strategy != nil {
		// Custom strategies are prefixed names ("example.com/mine").
		st := string(*s.Strategy)
		if strings.Contains(st, "/") {
			for _, m := range validation.IsQualifiedName(st) {
				errs = append(errs, field.Invalid(gSpec.Child("strategy"), st, m))
			}
		} else if *s.Strategy != coordinationv1.OldestEmulationVersion {
			errs = append(errs, field.NotSupported(gSpec.Child("strategy"), *s.Strategy, []string{string(coordinationv1.OldestEmulationVersion)}))
		}
	}
	if s.PreferredHolder != nil && *s.PreferredHolder != "" && (s.Strategy == nil || *s.Strategy == "") {
		errs = append(errs, field.Forbidden(gSpec.Child("preferredHolder"), "may only be specified if `strategy` is defined"))
	}
	return errs
}

// ---- PodDisruptionBudget ----

var podDisruptionBudgetKind = &Kind{
	GVK:        policyv1.SchemeGroupVersion.WithKind("PodDisruptionBudget"),
	Resource:   "poddisruptionbudgets",
	Singular:   "poddisruptionbudget",
	Namespaced: true,
	ShortNames: []string{"pdb"},
	HasStatus:  true,
	HasSpec:    true,
	Validate: func(obj runtime.Object) field.ErrorList {
		return validatePDBSpec(&obj.(*policyv1.PodDisruptionBudget).Spec)
	},
	ValidateStatusUpdate: func(obj, old runtime.Object) field.ErrorList {
		s := obj.(*policyv1.PodDisruptionBudget).Status
		p := field.NewPath("status")
		var errs field.ErrorList
		errs = append(errs, nonNegative(int64(s.DisruptionsAllowed), p.Child("disruptionsAllowed"))...)
		errs = append(errs, nonNegative(int64(s.CurrentHealthy), p.Child("currentHealthy"))...)
		errs = append(errs, nonNegative(int64(s.DesiredHealthy), p.Child("desiredHealthy"))...)
		errs = append(errs, nonNegative(int64(s.ExpectedPods), p.Child("expectedPods"))...)
		return append(errs, metav1validation.ValidateConditions(s.Conditions, p.Child("conditions"))...)
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Min Available", "string", 0, "The minimum number of pods that must be available simultaneously.  This can be either an integer or a string specifying a percentage, e.g. \"28%\"."),
		column("Max Unavailable", "string", 0, "The maximum number of pods that may be unavailable simultaneously.  This can be either an integer or a string specifying a percentage, e.g. \"28%\"."),
		column("Allowed Disruptions", "integer", 0, "Calculated number of pods that may be disrupted at this time."),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		p := obj.(*policyv1.PodDisruptionBudget)
		minA, maxU := "N/A", "N/A"
		if p.Spec.MinAvailable != nil {
			minA = p.Spec.MinAvailable.String()
		}
		if p.Spec.MaxUnavailable != nil {
			maxU = p.Spec.MaxUnavailable.String()
		}
		return []any{p.Name, minA, maxU, int64(p.Status.DisruptionsAllowed), age(p.CreationTimestamp, now)}
	},
}

func validatePDBSpec(s *policyv1.PodDisruptionBudgetSpec) field.ErrorList {
	var errs field.ErrorList
	if s.MinAvailable != nil && s.MaxUnavailable != nil {
		errs = append(errs, field.Invalid(gSpec, s, "minAvailable and maxUnavailable cannot be both set"))
	}
	errs = append(errs, validateIntOrPercent(s.MinAvailable, gSpec.Child("minAvailable"))...)
	errs = append(errs, notMoreThan100Percent(s.MinAvailable, gSpec.Child("minAvailable"))...)
	errs = append(errs, validateIntOrPercent(s.MaxUnavailable, gSpec.Child("maxUnavailable"))...)
	errs = append(errs, notMoreThan100Percent(s.MaxUnavailable, gSpec.Child("maxUnavailable"))...)
	if s.Selector != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(s.Selector, metav1validation.LabelSelectorValidationOptions{}, gSpec.Child("selector"))...)
	}
	if p := s.UnhealthyPodEvictionPolicy; p != nil && *p != policyv1.IfHealthyBudget && *p != policyv1.AlwaysAllow {
		errs = append(errs, field.NotSupported(gSpec.Child("unhealthyPodEvictionPolicy"), *p,
			[]string{string(policyv1.AlwaysAllow), string(policyv1.IfHealthyBudget)}))
	}
	return errs
}

// ---- PriorityClass ----

// highestUserPriority is the largest value a priority class not named
// system-* may have.
const highestUserPriority = 1000000000

var knownSystemPriorityClasses = map[string]int32{
	"system-node-critical":    2000001000,
	"system-cluster-critical": 2000000000,
}

var priorityClassKind = &Kind{
	GVK:        schedulingv1.SchemeGroupVersion.WithKind("PriorityClass"),
	Resource:   "priorityclasses",
	Singular:   "priorityclass",
	ShortNames: []string{"pc"},
	Default: func(obj runtime.Object) {
		pc := obj.(*schedulingv1.PriorityClass)
		if pc.PreemptionPolicy == nil {
			pc.PreemptionPolicy = ptrTo(corev1.PreemptLowerPriority)
		}
	},
	Validate: func(obj runtime.Object) field.ErrorList {
		return validatePriorityClass(obj.(*schedulingv1.PriorityClass))
	},
	ValidateUpdate: func(obj, old runtime.Object) field.ErrorList {
		pc, o := obj.(*schedulingv1.PriorityClass), old.(*schedulingv1.PriorityClass)
		var errs field.ErrorList
		if pc.Value != o.Value {
			errs = append(errs, field.Forbidden(field.NewPath("value"), "may not be changed in an update."))
		}
		return append(errs, apivalidation.ValidateImmutableField(pc.PreemptionPolicy, o.PreemptionPolicy, field.NewPath("preemptionPolicy"))...)
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Value", "integer", 0, "The value of this priority class. This is the actual priority that pods receive when they have the name of this class in their pod spec."),
		column("Global-Default", "boolean", 0, "globalDefault specifies whether this PriorityClass should be considered as the default priority for pods that do not have any priority class."),
		ageColumn,
		column("PreemptionPolicy", "string", 0, "PreemptionPolicy is the Policy for preempting pods with lower priority."),
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		pc := obj.(*schedulingv1.PriorityClass)
		policy := "<unset>"
		if pc.PreemptionPolicy != nil {
			policy = string(*pc.PreemptionPolicy)
		}
		return []any{pc.Name, int64(pc.Value), pc.GlobalDefault, age(pc.CreationTimestamp, now), policy}
	},
}

func validatePriorityClass(pc *schedulingv1.PriorityClass) field.ErrorList {
	var errs field.ErrorList
	if strings.HasPrefix(pc.Name, "system-") {
		const reserved = "priority class names with 'system-' prefix are reserved for system use only. error: "
		if v, ok := knownSystemPriorityClasses[pc.Name]; !ok {
			errs = append(errs, field.Forbidden(field.NewPath("metadata", "name"), reserved+pc.Name+" is not a known system priority class"))
		} else if pc.Value != v {
			errs = append(errs, field.Forbidden(field.NewPath("metadata", "name"), reserved+"value of "+pc.Name+" PriorityClass must be "+itoa32(v)))
		} else if pc.GlobalDefault {
			errs = append(errs, field.Forbidden(field.NewPath("metadata", "name"), reserved+"globalDefault of "+pc.Name+" PriorityClass must be false"))
		}
	} else if pc.Value > highestUserPriority {
		errs = append(errs, field.Forbidden(field.NewPath("value"), "maximum allowed value of a user defined priority is 1000000000"))
	}
	if p := pc.PreemptionPolicy; p != nil && *p != corev1.PreemptLowerPriority && *p != corev1.PreemptNever {
		errs = append(errs, field.NotSupported(field.NewPath("preemptionPolicy"), *p,
			[]string{string(corev1.PreemptLowerPriority), string(corev1.PreemptNever)}))
	}
	return errs
}
