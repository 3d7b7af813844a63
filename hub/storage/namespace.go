package storage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/store"
)

// Namespace lifecycle, as upstream's NamespaceLifecycle admission keeps
// it: some namespaces are never deleted, and one being deleted takes no
// new content.

// protectedNamespace reports whether the namespace name may never be
// deleted. Upstream's NamespaceLifecycle admission protects default,
// kube-system and kube-public. tether protects kube-node-lease as well:
// its node lifecycle reads every node's liveness from the Leases there,
// and emptying it would make every node of the fleet look silent at
// once. Upstream lets it be deleted; a refusal is the safer difference.
func protectedNamespace(name string) bool {
	switch name {
	case metav1.NamespaceDefault, metav1.NamespaceSystem, metav1.NamespacePublic, corev1.NamespaceNodeLease:
		return true
	}
	return false
}

// namespaceAdmits enforces the namespace lifecycle on create.
func (s *Storage) namespaceAdmits(ctx context.Context, k *registry.Kind, name, namespace string) error {
	o, err := s.st.Get(ctx, store.Key{Resource: "namespaces", Name: namespace})
	if errors.Is(err, store.ErrNotFound) {
		return apierrors.NewNotFound(corev1.Resource("namespaces"), namespace)
	}
	if err != nil {
		return storeError(err, corev1.Resource("namespaces"), namespace)
	}
	terminating, err := s.nsTerminating(o)
	if err != nil {
		return apierrors.NewInternalError(fmt.Errorf("decode namespace %s: %w", namespace, err))
	}
	if terminating {
		err := apierrors.NewForbidden(k.GroupResource(), name,
			fmt.Errorf("unable to create new content in namespace %s because it is being terminated", namespace))
		err.ErrStatus.Details.Causes = append(err.ErrStatus.Details.Causes, metav1.StatusCause{
			Type:    corev1.NamespaceTerminatingCause,
			Message: fmt.Sprintf("namespace %s is being terminated", namespace),
			Field:   "metadata.namespace",
		})
		return err
	}
	return nil
}

// nsState is what namespace admission needs of one stored namespace.
type nsState struct {
	rev         int64
	terminating bool
}

// nsTerminating reports whether the stored namespace o is being deleted.
// Every namespaced create asks, so the answer is kept per namespace until
// the namespace changes instead of decoding it each time.
func (s *Storage) nsTerminating(o store.Object) (bool, error) {
	s.nsMu.Lock()
	st, ok := s.nsCache[o.Key.Name]
	s.nsMu.Unlock()
	if ok && st.rev == o.Revision {
		return st.terminating, nil
	}
	var ns corev1.Namespace
	if err := json.Unmarshal(o.Value, &ns); err != nil {
		return false, err
	}
	st = nsState{rev: o.Revision, terminating: ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating}
	s.nsMu.Lock()
	if cur, ok := s.nsCache[o.Key.Name]; !ok || cur.rev < st.rev {
		s.nsCache[o.Key.Name] = st
	}
	s.nsMu.Unlock()
	return st.terminating, nil
}
