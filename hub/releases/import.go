package releases

import (
	"context"
	"fmt"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// importStaged makes a Release of a staged executable: it reads what the
// executable is, and either finds the Release of its name holding the
// same digest (nothing changes but that this hub now holds the blob, too)
// or signs a new one, keeps the blob and creates the Release. The staged
// file is kept or discarded either way.
func (s *Store) importStaged(ctx context.Context, st *staged) (*fleetapi.Release, bool, error) {
	exe, err := fleetapi.ReadExecutable(st.f)
	if err != nil {
		st.discard()
		return nil, false, apierrors.NewBadRequest("the file is not an executable of tether this hub can import: " + err.Error())
	}
	if errs := validation.IsValidLabelValue(exe.Version); len(errs) > 0 {
		st.discard()
		return nil, false, apierrors.NewBadRequest(fmt.Sprintf("the executable's version %q cannot be a label value: %s",
			exe.Version, strings.Join(errs, "; ")))
	}
	name := fleetapi.ReleaseName(exe.Version, exe.Build, exe.Arch)
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		st.discard()
		return nil, false, apierrors.NewBadRequest(fmt.Sprintf("the executable's version %q makes no valid Release name (%q): %s",
			exe.Version, name, strings.Join(errs, "; ")))
	}
	digest := "sha256:" + st.hex
	client, err := s.client()
	if err != nil {
		st.discard()
		return nil, false, apierrors.NewInternalError(err)
	}
	res := client.Resource(fleetapi.ReleasesResource)
	for attempt := 0; ; attempt++ {
		cur, err := res.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			rel, err := s.existing(cur, name, digest)
			if err != nil {
				st.discard()
				return nil, false, err
			}
			// The Release may have been imported on another hub of the
			// cluster: this one holds the executable from now on too.
			if err := s.blobs.keep(st); err != nil {
				return nil, false, apierrors.NewInternalError(err)
			}
			return rel, false, nil
		}
		if !apierrors.IsNotFound(err) {
			st.discard()
			return nil, false, err
		}
		spec := fleetapi.ReleaseSpec{Version: exe.Version, Arch: exe.Arch, Build: exe.Build, Digest: digest, Size: st.size}
		key, certPEM, err := s.cfg.Signer()
		if err != nil {
			st.discard()
			return nil, false, apierrors.NewInternalError(err)
		}
		if err := fleetapi.Sign(&spec, key, certPEM); err != nil {
			st.discard()
			return nil, false, apierrors.NewInternalError(err)
		}
		// The blob first: an agent that sees the Release can download it.
		if err := s.blobs.keep(st); err != nil {
			return nil, false, apierrors.NewInternalError(err)
		}
		rel := &fleetapi.Release{
			TypeMeta: metav1.TypeMeta{APIVersion: fleetapi.Group + "/" + fleetapi.Version, Kind: fleetapi.ReleaseKind.Kind},
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
				fleetapi.LabelVersion: exe.Version, fleetapi.LabelArch: exe.Arch, fleetapi.LabelBuild: exe.Build}},
			Spec: spec,
		}
		u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(rel)
		if err != nil {
			return nil, false, apierrors.NewInternalError(err)
		}
		created, err := res.Create(ctx, &unstructured.Unstructured{Object: u}, metav1.CreateOptions{FieldManager: "tether-release-import"})
		if apierrors.IsAlreadyExists(err) && attempt < 3 {
			// Imported at the same time by someone else: compare with
			// theirs (the blob is kept, keep finds it held).
			continue
		}
		if err != nil {
			return nil, false, err
		}
		out, err := toRelease(created)
		return out, err == nil, err
	}
}

// existing checks the stored Release of name against the digest being
// imported: the same digest is the same release; another is a conflict.
func (s *Store) existing(cur *unstructured.Unstructured, name, digest string) (*fleetapi.Release, error) {
	rel, err := toRelease(cur)
	if err != nil {
		return nil, err
	}
	if rel.Spec.Digest != digest {
		return nil, apierrors.NewConflict(releasesResource, name, fmt.Errorf(
			"the Release holds another executable (%s) than this one (%s): delete the Release to import this one under its name",
			rel.Spec.Digest, digest))
	}
	return rel, nil
}

func toRelease(u *unstructured.Unstructured) (*fleetapi.Release, error) {
	rel := &fleetapi.Release{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, rel); err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("read Release %s: %w", u.GetName(), err))
	}
	return rel, nil
}

// clientOnce builds the API client at first use: the hub's API is not
// served yet when the store is made.
type clientOnce struct {
	once   sync.Once
	client dynamic.Interface
	err    error
}

func (s *Store) client() (dynamic.Interface, error) {
	c := &s.clientCache
	c.once.Do(func() { c.client, c.err = s.cfg.Client() })
	return c.client, c.err
}
