package controllers

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/controllers/autoscaling"
	"github.com/tether-edge/tether/controllers/batch"
	"github.com/tether-edge/tether/controllers/clusterroleaggregation"
	"github.com/tether-edge/tether/controllers/daemonset"
	"github.com/tether-edge/tether/controllers/deployment"
	"github.com/tether-edge/tether/controllers/disruption"
	"github.com/tether-edge/tether/controllers/edgeupgrade"
	"github.com/tether-edge/tether/controllers/endpoints"
	"github.com/tether-edge/tether/controllers/imagestaging"
	"github.com/tether-edge/tether/controllers/nodelifecycle"
	"github.com/tether-edge/tether/controllers/podgc"
	"github.com/tether-edge/tether/controllers/replicaset"
	"github.com/tether-edge/tether/controllers/serviceaccount"
	"github.com/tether-edge/tether/controllers/servicelb"
	"github.com/tether-edge/tether/controllers/sitekeys"
	"github.com/tether-edge/tether/controllers/statefulset"
	"github.com/tether-edge/tether/controllers/volume"
)

// runner is a controller with its own loop.
type runner interface {
	Run(ctx context.Context) error
}

// builtin describes one controller the Manager can run on the shared typed
// informers.
type builtin struct {
	name  string
	build func(kube kubernetes.Interface, inf informers.SharedInformerFactory, workers int, log *slog.Logger, cfg *Config) (runner, error)
}

// builtins are the typed controllers, by the names kube-controller-manager
// gives them in its --controllers flag.
var builtins = []builtin{
	{"replicaset", func(k kubernetes.Interface, inf informers.SharedInformerFactory, w int, l *slog.Logger, _ *Config) (runner, error) {
		return replicaset.New(replicaset.Config{Client: k, Informers: inf, Workers: w, Logger: l})
	}},
	// ReplicationControllers, run by the ReplicaSet controller's logic.
	{"replicationcontroller", func(k kubernetes.Interface, inf informers.SharedInformerFactory, w int, l *slog.Logger, _ *Config) (runner, error) {
		return replicaset.NewForReplicationControllers(replicaset.Config{Client: k, Informers: inf, Workers: w, Logger: l})
	}},
	{"deployment", func(k kubernetes.Interface, inf informers.SharedInformerFactory, w int, l *slog.Logger, _ *Config) (runner, error) {
		return deployment.New(deployment.Config{Client: k, Informers: inf, Workers: w, Logger: l})
	}},
	{"statefulset", func(k kubernetes.Interface, inf informers.SharedInformerFactory, w int, l *slog.Logger, _ *Config) (runner, error) {
		return statefulset.New(statefulset.Config{Client: k, Informers: inf, Workers: w, Logger: l})
	}},
	{"daemonset", func(k kubernetes.Interface, inf informers.SharedInformerFactory, w int, l *slog.Logger, _ *Config) (runner, error) {
		return daemonset.New(daemonset.Config{Client: k, Informers: inf, Workers: w, Logger: l})
	}},
	// One controller runs both Jobs and CronJobs.
	{"job", func(k kubernetes.Interface, inf informers.SharedInformerFactory, w int, l *slog.Logger, _ *Config) (runner, error) {
		return batch.New(batch.Config{Client: k, Informers: inf, Workers: w, Logger: l})
	}},
	// EndpointSlices and the legacy Endpoints alongside them.
	{"endpointslice", func(k kubernetes.Interface, inf informers.SharedInformerFactory, w int, l *slog.Logger, _ *Config) (runner, error) {
		return endpoints.New(endpoints.Config{Client: k, Informers: inf, Workers: w, Logger: l})
	}},
	// EndpointSlices mirroring the Endpoints of selector-less Services.
	{"endpointslice-mirroring", func(k kubernetes.Interface, inf informers.SharedInformerFactory, w int, l *slog.Logger, _ *Config) (runner, error) {
		return endpoints.NewMirroring(endpoints.MirrorConfig{Client: k, Informers: inf, Workers: w, Logger: l})
	}},
	{"nodelifecycle", func(k kubernetes.Interface, inf informers.SharedInformerFactory, w int, l *slog.Logger, c *Config) (runner, error) {
		return nodelifecycle.New(nodelifecycle.Config{Client: k, Informers: inf, Workers: w, Logger: l, Peers: c.SitePeers, SiteHeard: c.SiteHeard, DeadGrace: c.SiteDeadGrace,
			GracePeriod: c.NodeMonitorGracePeriod})
	}},
	// Pods of deleted nodes, unscheduled terminating pods and finished
	// pods beyond the threshold.
	{"pod-garbage-collector", func(k kubernetes.Interface, inf informers.SharedInformerFactory, _ int, l *slog.Logger, c *Config) (runner, error) {
		return podgc.New(podgc.Config{Client: k, Informers: inf, Logger: l, TerminatedPodThreshold: c.TerminatedPodGCThreshold, Quarantine: c.PodGCQuarantine})
	}},
	{"disruption", func(k kubernetes.Interface, inf informers.SharedInformerFactory, w int, l *slog.Logger, _ *Config) (runner, error) {
		return disruption.New(disruption.Config{Client: k, Informers: inf, Workers: w, Logger: l})
	}},
	// Claims bound to volumes, and local-path volumes provisioned.
	{"persistentvolume-binder", func(k kubernetes.Interface, inf informers.SharedInformerFactory, w int, l *slog.Logger, c *Config) (runner, error) {
		return volume.New(volume.Config{Client: k, Informers: inf, Workers: w, Logger: l, LocalPathRoot: c.LocalPathRoot})
	}},
	// LoadBalancer Services' ingress: the addresses of the nodes.
	{servicelb.Name, func(k kubernetes.Interface, inf informers.SharedInformerFactory, _ int, l *slog.Logger, _ *Config) (runner, error) {
		return servicelb.New(servicelb.Config{Client: k, Informers: inf, Logger: l})
	}},
	// The default ServiceAccount and kube-root-ca.crt of every namespace.
	{"serviceaccount", func(k kubernetes.Interface, inf informers.SharedInformerFactory, w int, l *slog.Logger, c *Config) (runner, error) {
		return serviceaccount.New(serviceaccount.Config{Client: k, Informers: inf, Workers: w, Logger: l, RootCA: c.RootCA})
	}},
	// The gossip keys of every site (zone), rotated.
	{"sitekeys", func(k kubernetes.Interface, inf informers.SharedInformerFactory, _ int, l *slog.Logger, c *Config) (runner, error) {
		return sitekeys.New(sitekeys.Config{Client: k, Informers: inf, Logger: l, Rotation: c.SiteKeyRotation})
	}},
	// HorizontalPodAutoscalers, scaling their targets through /scale.
	{"horizontalpodautoscaling", func(k kubernetes.Interface, inf informers.SharedInformerFactory, w int, l *slog.Logger, c *Config) (runner, error) {
		return autoscaling.New(autoscaling.Config{Client: k, Informers: inf, Workers: w, Logger: l, RestConfig: c.clientConfig("horizontalpodautoscaling"), SyncPeriod: c.HorizontalPodAutoscalerSyncPeriod})
	}},
	// The rules of aggregated ClusterRoles (admin, edit, view, ...).
	{"clusterrole-aggregation", func(k kubernetes.Interface, inf informers.SharedInformerFactory, _ int, l *slog.Logger, _ *Config) (runner, error) {
		return clusterroleaggregation.New(clusterroleaggregation.Config{Client: k, Informers: inf, Logger: l})
	}},
	// tether's own: rollouts of agent versions (fleet.tether.io
	// EdgeUpgrades) through the Node annotations agents read.
	{edgeupgrade.Name, func(k kubernetes.Interface, inf informers.SharedInformerFactory, _ int, l *slog.Logger, c *Config) (runner, error) {
		return edgeupgrade.New(edgeupgrade.Config{Client: k, Informers: inf, Logger: l, RestConfig: c.clientConfig(edgeupgrade.Name), ResyncPeriod: c.ResyncPeriod})
	}},
	// tether's own: fleet.tether.io ImageStagings' status, counted from
	// the selected Nodes' status.images.
	{imagestaging.Name, func(_ kubernetes.Interface, inf informers.SharedInformerFactory, _ int, l *slog.Logger, c *Config) (runner, error) {
		return imagestaging.New(imagestaging.Config{Informers: inf, Logger: l, RestConfig: c.clientConfig(imagestaging.Name), ResyncPeriod: c.ResyncPeriod})
	}},
}

// Names returns the names of every controller, for --controllers.
func Names() []string {
	names := []string{"garbagecollector", "namespace"}
	for _, b := range builtins {
		names = append(names, b.name)
	}
	return names
}

// Enabled reports whether the controller name runs under spec, which reads
// like kube-controller-manager's --controllers: "*" turns on every
// controller, "name" one, and "-name" turns one off. An empty spec means
// "*".
func Enabled(spec []string, name string) bool {
	if len(spec) == 0 {
		return true
	}
	if slices.Contains(spec, "-"+name) {
		return false
	}
	return slices.Contains(spec, name) || slices.Contains(spec, "*")
}

// CheckNames rejects names in spec that name no controller.
func CheckNames(spec []string) error {
	known := Names()
	for _, s := range spec {
		n := strings.TrimPrefix(s, "-")
		if n != "*" && !slices.Contains(known, n) {
			return fmt.Errorf("unknown controller %q (known: %s)", n, strings.Join(known, ", "))
		}
	}
	return nil
}
