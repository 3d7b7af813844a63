package registry

import (
	"fmt"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// NewScheme returns a new scheme holding the types of every kind the hub
// can serve: client-go's built-in kinds, apiextensions.k8s.io/v1
// (CustomResourceDefinition), apiregistration.k8s.io/v1 (APIService),
// metrics.k8s.io/v1beta1 (NodeMetrics, PodMetrics) and the meta.k8s.io/v1
// types, with the conversions between the served versions of
// HorizontalPodAutoscaler. Each user gets a scheme of its own: nothing
// adds types to a scheme shared across the process.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme,
		apiextensionsv1.AddToScheme,
		apiregistrationv1.AddToScheme,
		AddHPAConversions,
		metricsv1beta1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, fmt.Errorf("build scheme: %w", err)
		}
	}
	metav1.AddToGroupVersion(s, metav1.SchemeGroupVersion)
	return s, nil
}
