package apiextensions

import (
	"context"
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/internal/fleetapi"
	"github.com/tether-edge/tether/internal/fleetapi/crds"
)

// TestInstall: definitions are created once, left alone when unchanged
// (no new generation at the next start) and brought back to the shipped
// spec when it differs.
func TestInstall(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, filepath.Join(t.TempDir(), "db"))
	defs, err := crds.All()
	if err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, f.st, f.reg, defs); err != nil {
		t.Fatal(err)
	}
	first := f.get(t, "releases.fleet.tether.io")
	if err := Install(ctx, f.st, f.reg, defs); err != nil {
		t.Fatal(err)
	}
	if again := f.get(t, "releases.fleet.tether.io"); again.ResourceVersion != first.ResourceVersion {
		t.Errorf("an unchanged definition was written again: resourceVersion %s → %s", first.ResourceVersion, again.ResourceVersion)
	}
	// A user's edit of the spec is undone at the next start.
	edited := first.DeepCopy()
	edited.Spec.Versions[0].AdditionalPrinterColumns = nil
	if _, err := f.st.Update(ctx, f.crd, "", edited.Name, edited, storage.Options{FieldManager: "test"}); err != nil {
		t.Fatal(err)
	}
	if err := Install(ctx, f.st, f.reg, defs); err != nil {
		t.Fatal(err)
	}
	got := f.get(t, "releases.fleet.tether.io")
	if len(got.Spec.Versions[0].AdditionalPrinterColumns) == 0 {
		t.Error("the edited spec was not restored")
	}
	if got.Generation != 3 {
		t.Errorf("generation %d after an edit and its repair, want 3", got.Generation)
	}
	// Installed before the controller starts, they are served once it
	// synced.
	f.start(t)
	for _, gvr := range []schema.GroupVersionResource{fleetapi.ReleasesResource, fleetapi.EdgeUpgradesResource} {
		if f.reg.Lookup(gvr) == nil {
			t.Errorf("%s not served after the controller synced", gvr.Resource)
		}
	}
}
