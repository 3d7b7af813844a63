package hub

import (
	"context"
	"fmt"
	"path/filepath"

	"k8s.io/client-go/dynamic"

	"github.com/tether-edge/tether/hub/apiextensions"
	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/releases"
	"github.com/tether-edge/tether/internal/fleetapi/crds"
)

// The fleet.tether.io kinds (Release, EdgeUpgrade) are custom resources
// the hub ships: their definitions are written at every start, before
// the definitions controller first lists, so they are served before the
// hub reports ready like built-in kinds. The release store (hub/releases)
// keeps the executables under DataDir/releases and serves their imports
// and downloads behind the API server's authorization.

// installFleetDefinitions creates or repairs the definitions of the
// fleet.tether.io kinds.
func (r *run) installFleetDefinitions(ctx context.Context) error {
	defs, err := crds.All()
	if err != nil {
		return fmt.Errorf("read the fleet definitions: %w", err)
	}
	if err := apiextensions.Install(ctx, r.objs, r.reg, defs); err != nil {
		return fmt.Errorf("install the fleet definitions: %w", err)
	}
	return nil
}

// openReleases opens the release store; its client of the hub's own API
// (an administrator, as the hub writes only what an authorized import
// asked for) is made at its first import, once the API is served.
func (r *run) openReleases() (*releases.Store, error) {
	return releases.New(releases.Config{
		Dir:    filepath.Join(r.cfg.DataDir, "releases"),
		Signer: r.authority.ReleaseSigner,
		Client: func() (dynamic.Interface, error) {
			rc := localConfig(r.api, r.url, "system:apiserver", pki.AdminGroup, "system:authenticated")
			rc.QPS = -1 // in-process: no client-side throttling
			return dynamic.NewForConfig(rc)
		},
		Logger: r.cfg.Logger.With("component", "releases"),
	})
}
