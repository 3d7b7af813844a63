package hub

import (
	"context"
	"fmt"
	"time"

	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/servicedial"
	"github.com/tether-edge/tether/hub/webhooks"
)

// startWebhooks starts admission configured through the API (webhooks and
// ValidatingAdmissionPolicies) over in-process clients and, once their
// informers have synced, makes storage call it on every write.
func (r *run) startWebhooks(ctx, bgCtx context.Context) error {
	sch, err := registry.NewScheme()
	if err != nil {
		return err
	}
	adm, err := webhooks.New(webhooks.Config{
		RestConfig: localConfig(r.api, "https://localhost", "system:apiserver", pki.AdminGroup, "system:authenticated"),
		Services:   &servicedial.Dialer{Storage: r.objs, DialPod: r.dialPod},
		Scheme:     sch,
		Kinds:      r.reg.Kinds,
		Authorizer: r.authz,
		Logger:     r.cfg.Logger.With("component", "webhooks"),
	})
	if err != nil {
		return err
	}
	adm.Start(bgCtx)
	syncCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if !adm.WaitSynced(syncCtx) {
		return fmt.Errorf("load admission webhook configurations: %w", syncCtx.Err())
	}
	r.objs.SetExternalAdmission(adm)
	return nil
}
