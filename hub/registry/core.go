package registry

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// coreKinds returns the served kinds of the core (legacy) group, v1, in
// discovery order; Services and Nodes allocate from the given allocators.
func coreKinds(services *serviceAllocator, podCIDRs *podCIDRAllocator) []*Kind {
	return []*Kind{
		configMapKind,
		endpointsKind,
		eventKind,
		limitRangeKind,
		namespaceKind,
		newNodeKind(podCIDRs),
		pvcKind,
		pvKind,
		podKind,
		podTemplateKind,
		replicationControllerKind,
		resourceQuotaKind,
		secretKind,
		serviceAccountKind,
		newServiceKind(services),
	}
}

// maxConfigSize is the largest total size of a ConfigMap's or Secret's data.
const maxConfigSize = 1 << 20

// immutable reports a change to a field that may not change.
func immutable(newVal, oldVal any, path *field.Path) field.ErrorList {
	if apiequality.Semantic.DeepEqual(newVal, oldVal) {
		return nil
	}
	return field.ErrorList{field.Invalid(path, newVal, "field is immutable")}
}

var serviceAccountKind = &Kind{
	GVK:        corev1.SchemeGroupVersion.WithKind("ServiceAccount"),
	Resource:   "serviceaccounts",
	Singular:   "serviceaccount",
	Namespaced: true,
	ShortNames: []string{"sa"},
	Validate: func(obj runtime.Object) field.ErrorList {
		var errs field.ErrorList
		for i, s := range obj.(*corev1.ServiceAccount).ImagePullSecrets {
			if s.Name == "" {
				errs = append(errs, field.Required(field.NewPath("imagePullSecrets").Index(i).Child("name"), ""))
			}
		}
		return errs
	},
	Columns: []metav1.TableColumnDefinition{
		nameColumn,
		column("Secrets", "string", 0, "Secrets is a list of the secrets in the same namespace that pods running using this ServiceAccount are allowed to use."),
		ageColumn,
	},
	Cells: func(obj runtime.Object, now time.Time) []any {
		sa := obj.(*corev1.ServiceAccount)
		return []any{sa.Name, int64(len(sa.Secrets)), age(sa.CreationTimestamp, now)}
	},
}
