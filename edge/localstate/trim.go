package localstate

import corev1 "k8s.io/api/core/v1"

// trimForCache drops from an object, before a kept informer keeps it in
// its store and the local state, what the agent never reads: the hub's
// record of field owners (metadata.managedFields) and, on every kind but
// pods, the copy of the whole object that `kubectl apply` keeps in an
// annotation, which doubles the size of applied Services, ConfigMaps and
// Secrets. Pods keep their annotations: the downward API exposes them.
func trimForCache(obj protoObject) {
	obj.SetManagedFields(nil)
	if _, ok := obj.(*corev1.Pod); ok {
		return
	}
	a := obj.GetAnnotations()
	if _, ok := a[corev1.LastAppliedConfigAnnotation]; !ok {
		return
	}
	delete(a, corev1.LastAppliedConfigAnnotation)
	if len(a) == 0 {
		obj.SetAnnotations(nil)
	}
}
