package kit

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// ControllerIndex is the name of an informer index of objects by the UID
// of their controller; objects without one are indexed as
// OrphanIndexKey(namespace). It lets a controller find its pods (or
// ReplicaSets, or revisions) and the orphans it could adopt without
// scanning the whole namespace.
const ControllerIndex = "tether.dev/controller-uid"

// OrphanIndexKey is the ControllerIndex value of objects with no
// controller in namespace ns.
func OrphanIndexKey(ns string) string { return "orphan/" + ns }

func controllerIndexFunc(obj any) ([]string, error) {
	m, err := metaAccessor(obj)
	if err != nil {
		return nil, nil
	}
	if ref := metav1.GetControllerOfNoCopy(m); ref != nil {
		return []string{string(ref.UID)}, nil
	}
	return []string{OrphanIndexKey(m.GetNamespace())}, nil
}

func metaAccessor(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no object metadata", obj)
	}
	return m, nil
}

// AddControllerIndex adds ControllerIndex to informer unless a controller
// sharing the informer already did. Call it before the informer starts.
func AddControllerIndex(informer cache.SharedIndexInformer) error {
	if _, ok := informer.GetIndexer().GetIndexers()[ControllerIndex]; ok {
		return nil
	}
	if err := informer.AddIndexers(cache.Indexers{ControllerIndex: controllerIndexFunc}); err != nil {
		return fmt.Errorf("add controller index: %w", err)
	}
	return nil
}

// ByIndex returns the objects of indexer under ControllerIndex value v,
// typed; objects of another type are skipped.
func ByIndex[T any](indexer cache.Indexer, v string) []T {
	objs, err := indexer.ByIndex(ControllerIndex, v)
	if err != nil {
		return nil
	}
	out := make([]T, 0, len(objs))
	for _, o := range objs {
		if t, ok := o.(T); ok {
			out = append(out, t)
		}
	}
	return out
}
