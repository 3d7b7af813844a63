//go:build !edge

package main

import (
	"context"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-edge/tether/controllers"
	"github.com/tether-edge/tether/deploy"
	"github.com/tether-edge/tether/hub"
)

// kubernetesVersion is the Kubernetes API version the hub serves.
const kubernetesVersion = hub.KubernetesVersion

// commands are the subcommands of the full binary: the hub's, the join
// tokens', the users', the releases', the bundles', the agent's and the
// installer's.
func commands() []*cobra.Command {
	return []*cobra.Command{newHubCmd(), newStoreCmd(), newTokenCmd(), newUserCmd(), newReleaseCmd(), newBundleCmd(), newEdgeCmd(), newInstallCmd(), newUninstallCmd()}
}

func newHubCmd() *cobra.Command {
	var (
		cfg      hub.Config
		logLevel string
	)
	cmd := &cobra.Command{
		Use:   "hub --data-dir DIR",
		Short: "Run the hub: the Kubernetes API server over an embedded SQLite store or PostgreSQL",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			cfg.Logger = logger
			cfg.Version = version
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			h, err := hub.New(cfg)
			if err != nil {
				return err
			}
			return h.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", "", "directory for the store, certificates and admin.kubeconfig (required)")
	f.StringVar(&cfg.Listen, "listen", "0.0.0.0:6443", "address of the HTTPS API (TCP)")
	f.StringVar(&cfg.AdvertiseAddress, "advertise-address", "", "address clients and the kubernetes Service use to reach the API (default: the listen address, or the first non-loopback address when listening on all)")
	f.StringSliceVar(&cfg.SANs, "tls-san", nil, "extra DNS names or IPs for the serving certificate")
	f.StringVar(&cfg.ServiceCIDR, "service-cidr", "10.0.0.0/16", "range for Service cluster IPs")
	f.StringVar(&cfg.Datastore, "datastore", "", "where the store lives: empty for SQLite in --data-dir, or a postgres:// URL of a PostgreSQL database")
	f.StringVar(&cfg.SecretKeyFile, "secret-key-file", "", "file holding the secret (at least 32 bytes, the same on every hub) that encrypts the cluster's keys in a PostgreSQL datastore; required with --datastore")
	f.Int64Var(&cfg.ChangeLogRetain, "change-log-retain", 0, "revisions the change log keeps for resuming watches (0: 100000)")
	f.DurationVar(&cfg.CompactInterval, "compact-interval", 0, "how often the change log is compacted (0: 30s)")
	f.StringVar(&cfg.TunnelListen, "tunnel-listen", "", "UDP address of the edge tunnel (default: the API's address and port)")
	f.StringVar(&cfg.ClusterCIDR, "cluster-cidr", "10.42.0.0/16", "range node pod CIDRs are taken from")
	f.IntVar(&cfg.NodeCIDRMaskSize, "node-cidr-mask-size", 24, "prefix length of each node's pod CIDR")
	f.DurationVar(&cfg.NodeCertTTL, "node-cert-ttl", 365*24*time.Hour, "lifetime of node certificates (agents renew at two thirds)")
	f.DurationVar(&cfg.ClusterSigningDuration, "cluster-signing-duration", 365*24*time.Hour, "longest lifetime of client certificates issued for CertificateSigningRequests")
	f.Float64Var(&cfg.TunnelHandshakeRate, "tunnel-handshake-rate", 500, "edge connections admitted per second at most (token bucket)")
	f.IntVar(&cfg.TunnelHandshakeBurst, "tunnel-handshake-burst", 100, "burst of edge connections admitted at once")
	f.DurationVar(&cfg.TunnelIdleTimeout, "tunnel-idle-timeout", 45*time.Second, "an edge tunnel without traffic is closed after this; edges heartbeat at a third of it and notice a dead hub within it")
	f.DurationVar(&cfg.DrainWindow, "drain-window", 10*time.Second, "on shutdown, the window over which edges are told to spread their reconnects")
	f.StringSliceVar(&cfg.Controllers, "controllers", []string{"*"}, "controllers to run: '*' for all, 'name' to enable, '-name' to disable (names: "+strings.Join(controllers.Names(), ", ")+")")
	f.DurationVar(&cfg.HorizontalPodAutoscalerSyncPeriod, "horizontal-pod-autoscaler-sync-period", 15*time.Second, "how often each HorizontalPodAutoscaler is synced")
	f.DurationVar(&cfg.NodeMonitorGracePeriod, "node-monitor-grace-period", 40*time.Second, "how long a node's Lease may go unrenewed before the node is marked unreachable (Ready=Unknown and the unreachable taints); at least 15s")
	f.DurationVar(&cfg.SiteKeyRotation, "site-key-rotation", 24*time.Hour, "how often each site's gossip keys are rotated (the two previous keys stay valid)")
	f.StringVar(&cfg.LocalPathRoot, "local-path-root", "/var/lib/tether/storage", "directory of the nodes under which the local-path provisioner makes volumes (agents' --local-path-root must match)")
	f.BoolVar(&cfg.DisableScheduler, "disable-scheduler", false, "do not run the built-in scheduler")
	f.BoolVar(&cfg.DisableMetricsAPI, "disable-metrics-api", false, "do not serve metrics.k8s.io (kubectl top) from the usage edges push, e.g. to run metrics-server instead")
	f.BoolVar(&cfg.Profiling, "profiling", false, "serve the Go runtime's profiles at /debug/pprof/ to authorized users")
	f.StringVar(&cfg.Audit.Path, "audit-log-path", "", "if set, write audit.k8s.io/v1 events of API requests to this file, one JSON line each ('-' means standard out)")
	f.StringVar(&cfg.Audit.PolicyFile, "audit-policy-file", "", "audit.k8s.io/v1 Policy deciding what is logged (default: every request at Metadata level)")
	f.IntVar(&cfg.Audit.MaxSizeMB, "audit-log-maxsize", 0, "size in megabytes at which the audit log is rotated (0: 100)")
	f.IntVar(&cfg.Audit.MaxBackups, "audit-log-maxbackups", 0, "number of rotated audit log files kept (0: all)")
	f.IntVar(&cfg.Audit.MaxAgeDays, "audit-log-maxage", 0, "days rotated audit log files are kept (0: no limit)")
	f.BoolVar(&cfg.Audit.Compress, "audit-log-compress", false, "gzip rotated audit log files")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	_ = cmd.MarkFlagRequired("data-dir")
	return withConfigFile(cmd, deploy.Hub)
}
