package main

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// groupVersion is the API group and version of Shelf (crd.yaml).
var groupVersion = schema.GroupVersion{Group: "sample.tether.dev", Version: "v1"}

// Shelf asks for a ConfigMap that lists a number of books.
type Shelf struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ShelfSpec   `json:"spec,omitempty"`
	Status ShelfStatus `json:"status,omitempty"`
}

// ShelfSpec is what the user wants.
type ShelfSpec struct {
	// Books is how many books the shelf holds.
	Books int32 `json:"books"`
	// Color is copied to the ConfigMap.
	Color string `json:"color,omitempty"`
}

// ShelfStatus is what the operator saw and did.
type ShelfStatus struct {
	ObservedGeneration int64              `json:"observedGeneration,omitempty"`
	ConfigMap          string             `json:"configMap,omitempty"`
	Conditions         []metav1.Condition `json:"conditions,omitempty"`
}

// ShelfList is a list of Shelves.
type ShelfList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Shelf `json:"items"`
}

// addToScheme registers Shelf and ShelfList.
func addToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(groupVersion, &Shelf{}, &ShelfList{})
	metav1.AddToGroupVersion(s, groupVersion)
	return nil
}

// DeepCopyObject implements runtime.Object.
func (s *Shelf) DeepCopyObject() runtime.Object { return s.DeepCopy() }

// DeepCopy returns a deep copy of s.
func (s *Shelf) DeepCopy() *Shelf {
	if s == nil {
		return nil
	}
	out := *s
	s.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if s.Status.Conditions != nil {
		out.Status.Conditions = make([]metav1.Condition, len(s.Status.Conditions))
		for i := range s.Status.Conditions {
			s.Status.Conditions[i].DeepCopyInto(&out.Status.Conditions[i])
		}
	}
	return &out
}

// DeepCopyObject implements runtime.Object.
func (l *ShelfList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := *l
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]Shelf, len(l.Items))
		for i := range l.Items {
			out.Items[i] = *l.Items[i].DeepCopy()
		}
	}
	return &out
}
