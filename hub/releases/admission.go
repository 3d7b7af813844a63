package releases

import (
	"context"
	"fmt"
	"sync"
	"time"
	// The hub checks time zones by name on any host, also one without
	// a zoneinfo database (a minimal container image).
	_ "time/tzdata"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/internal/fleetapi"
)

// Admission checks EdgeUpgrades as they are written (a storage.Admitter
// and storage.UpdateAdmitter): the version must be one the hub holds a
// Release of, and the window's time zone one the hub knows. The version
// is checked on create and when an update changes it, so a rollout whose
// Releases were deleted since can still be paused or edited.
type Admission struct {
	reg *registry.Registry
	mu  sync.RWMutex
	st  storage.API
}

// NewAdmission returns the admission of EdgeUpgrades; SetStorage must be
// called before it admits anything.
func NewAdmission(reg *registry.Registry) *Admission { return &Admission{reg: reg} }

// SetStorage gives the admission the storage it reads Releases from (the
// storage it admits for, made after it).
func (a *Admission) SetStorage(st storage.API) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.st = st
}

// AdmitCreate implements storage.Admitter.
func (a *Admission) AdmitCreate(ctx context.Context, k *registry.Kind, obj runtime.Object, _ bool) (func(), error) {
	if k.GVK.GroupKind() != fleetapi.EdgeUpgradeKind.GroupKind() {
		return nil, nil
	}
	return nil, a.admit(ctx, obj, nil)
}

// AdmitUpdate implements storage.UpdateAdmitter.
func (a *Admission) AdmitUpdate(ctx context.Context, k *registry.Kind, obj, old runtime.Object, _ bool) error {
	if k.GVK.GroupKind() != fleetapi.EdgeUpgradeKind.GroupKind() {
		return nil
	}
	return a.admit(ctx, obj, old)
}

// admit checks an EdgeUpgrade about to be created (old nil) or to replace
// old.
func (a *Admission) admit(ctx context.Context, obj, old runtime.Object) error {
	cur, err := specOf(obj)
	if err != nil {
		return err
	}
	var prev upgradeFields
	if old != nil {
		if prev, err = specOf(old); err != nil {
			return err
		}
	}
	var errs field.ErrorList
	if old == nil || cur.version != prev.version {
		held, err := a.holdsVersion(ctx, cur.version)
		if err != nil {
			return err
		}
		if !held {
			errs = append(errs, &field.Error{Type: field.ErrorTypeNotFound, Field: "spec.version", BadValue: cur.version,
				Detail: "the hub holds no release of this version (tether release import FILE)"})
		}
	}
	if cur.timeZone != "" && (old == nil || cur.timeZone != prev.timeZone) {
		if _, err := time.LoadLocation(cur.timeZone); err != nil {
			errs = append(errs, field.Invalid(field.NewPath("spec", "window", "timeZone"), cur.timeZone,
				"not a time zone the hub knows (an IANA name such as Europe/Berlin)"))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(fleetapi.EdgeUpgradeKind.GroupKind(), cur.name, errs)
}

// holdsVersion reports whether a Release of version is stored.
func (a *Admission) holdsVersion(ctx context.Context, version string) (bool, error) {
	a.mu.RLock()
	st := a.st
	a.mu.RUnlock()
	k := a.reg.Lookup(fleetapi.ReleasesResource)
	if st == nil || k == nil {
		return false, nil
	}
	list, err := st.List(ctx, k, "", storage.ListOptions{Label: labels.Set{fleetapi.LabelVersion: version}.AsSelector()})
	if err != nil {
		return false, fmt.Errorf("list the releases of %s: %w", version, err)
	}
	return meta.LenList(list) > 0, nil
}

// upgradeFields are the fields of an EdgeUpgrade admission checks.
type upgradeFields struct {
	name, version, timeZone string
}

// specOf reads the checked fields of an EdgeUpgrade, which storage hands
// as unstructured (a custom kind) or, from other callers, typed.
func specOf(obj runtime.Object) (upgradeFields, error) {
	var m map[string]any
	switch o := obj.(type) {
	case *unstructured.Unstructured:
		m = o.Object
	default:
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
		if err != nil {
			return upgradeFields{}, apierrors.NewInternalError(fmt.Errorf("read EdgeUpgrade: %w", err))
		}
		m = u
	}
	var f upgradeFields
	f.name, _, _ = unstructured.NestedString(m, "metadata", "name")
	f.version, _, _ = unstructured.NestedString(m, "spec", "version")
	f.timeZone, _, _ = unstructured.NestedString(m, "spec", "window", "timeZone")
	return f, nil
}
