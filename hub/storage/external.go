package storage

import (
	"context"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/tether-edge/tether/hub/registry"
)

// ExternalAdmission is admission configured through the API: admission
// webhooks and ValidatingAdmissionPolicies. Storage calls Mutate after the
// kind's Mutate and before PrepareFor*/validation, and Validate after
// validation and the Admitters, on create, update (main resource and
// subresources) and delete. Neither is called for kinds with NotStored.
// The user is auth.UserFrom(ctx).
type ExternalAdmission interface {
	// Mutate may change a.Object.
	Mutate(ctx context.Context, a *AdmissionRequest) error
	// Validate must not change a.Object.
	Validate(ctx context.Context, a *AdmissionRequest) error
}

// AdmissionRequest is one write as external admission sees it.
type AdmissionRequest struct {
	Kind            *registry.Kind
	Operation       string // "CREATE", "UPDATE", "DELETE"
	Subresource     string
	Namespace, Name string
	// Object is nil on DELETE; OldObject nil on CREATE.
	Object, OldObject runtime.Object
	// Options is *metav1.CreateOptions, *metav1.UpdateOptions or
	// *metav1.DeleteOptions.
	Options runtime.Object
	DryRun  bool
}

// externalAdmission holds the ExternalAdmission of a Storage; it can be
// set after the Storage is built, since its clients are served by the API
// the Storage backs.
type externalAdmission struct {
	v atomic.Pointer[ExternalAdmission]
}

// SetExternalAdmission makes ext the external admission of later writes
// (nil: none).
func (s *Storage) SetExternalAdmission(ext ExternalAdmission) {
	if ext == nil {
		s.external.v.Store(nil)
		return
	}
	s.external.v.Store(&ext)
}

func (s *Storage) externalFor(k *registry.Kind) ExternalAdmission {
	if k.NotStored {
		return nil
	}
	p := s.external.v.Load()
	if p == nil {
		return nil
	}
	return *p
}

// mutateExternal runs external mutating admission on a create or update.
func (s *Storage) mutateExternal(ctx context.Context, k *registry.Kind, obj, old runtime.Object, opts Options) error {
	ext := s.externalFor(k)
	if ext == nil {
		return nil
	}
	if err := ext.Mutate(ctx, writeRequest(k, obj, old, opts)); err != nil {
		return admitError(err)
	}
	return nil
}

// validateExternal runs external validating admission on a create or
// update.
func (s *Storage) validateExternal(ctx context.Context, k *registry.Kind, obj, old runtime.Object, opts Options) error {
	ext := s.externalFor(k)
	if ext == nil {
		return nil
	}
	if err := ext.Validate(ctx, writeRequest(k, obj, old, opts)); err != nil {
		return admitError(err)
	}
	return nil
}

// validateExternalDelete runs external validating admission on a delete
// of cur.
func (s *Storage) validateExternalDelete(ctx context.Context, k *registry.Kind, cur runtime.Object, opts *metav1.DeleteOptions, dryRun bool) error {
	ext := s.externalFor(k)
	if ext == nil {
		return nil
	}
	m, err := accessor(cur)
	if err != nil {
		return err
	}
	if err := ext.Validate(ctx, &AdmissionRequest{Kind: k, Operation: "DELETE", Namespace: m.GetNamespace(),
		Name: m.GetName(), OldObject: cur, Options: opts, DryRun: dryRun}); err != nil {
		return admitError(err)
	}
	return nil
}

func writeRequest(k *registry.Kind, obj, old runtime.Object, opts Options) *AdmissionRequest {
	m, _ := accessor(obj)
	a := &AdmissionRequest{Kind: k, Subresource: opts.Subresource, Object: obj, OldObject: old, DryRun: opts.DryRun}
	if m != nil {
		a.Namespace, a.Name = m.GetNamespace(), m.GetName()
	}
	var dryRun []string
	if opts.DryRun {
		dryRun = []string{metav1.DryRunAll}
	}
	if old == nil {
		a.Operation = "CREATE"
		a.Options = &metav1.CreateOptions{DryRun: dryRun, FieldManager: opts.FieldManager}
	} else {
		a.Operation = "UPDATE"
		a.Options = &metav1.UpdateOptions{DryRun: dryRun, FieldManager: opts.FieldManager}
	}
	return a
}
