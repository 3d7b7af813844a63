package hub

import (
	"context"
	"slices"

	"github.com/tether-edge/tether/hub/aggregator"
	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/servicedial"
)

// aggregatorUser is the identity the aggregator writes APIServices and
// kube-system/extension-apiserver-authentication under.
const aggregatorUser = "system:kube-aggregator"

// newAggregator builds API aggregation (see hub/aggregator): the
// front-proxy certificate, the service dialer through the edges' tunnels
// and the Local APIServices of what reg serves.
func (r *run) newAggregator(reg *registry.Registry) error {
	fp, err := r.authority.FrontProxy()
	if err != nil {
		return err
	}
	r.agg, err = aggregator.New(aggregator.Config{
		Dialer:       &servicedial.Dialer{Storage: r.objs, DialPod: r.dialPod},
		FrontProxy:   fp,
		ClusterCAPEM: r.authority.CAPEM(),
		Kinds:        func() []*registry.Kind { return append(slices.Clone(reg.Kinds()), registry.ReviewKinds()...) },
		Changed:      reg.Changed,
		Logger:       r.cfg.Logger.With("component", "aggregator"),
	})
	return err
}

// startAggregator runs the aggregator's controllers until ctx ends.
func (r *run) startAggregator(ctx context.Context) {
	rc := localConfig(r.api, r.url, aggregatorUser, pki.AdminGroup, "system:authenticated")
	rc.QPS = -1
	go func() {
		if err := r.agg.Run(ctx, rc); err != nil && ctx.Err() == nil {
			r.h.log.Error("aggregator stopped", "err", err)
		}
	}()
}
