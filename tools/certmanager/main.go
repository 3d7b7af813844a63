// Command cert-manager-controller is cert-manager's controller, built from
// the github.com/cert-manager/cert-manager module at the version pinned in
// this module, for tether's end-to-end tests: a real operator with its own
// CustomResourceDefinitions issuing certificates through the hub.
//
// Upstream's controller binary lives in a nested module of cert-manager's
// repository that is not published to the Go module proxy (its module path
// does not match its directory and it replaces the main module with a
// relative path), so this file wires the published packages together as
// upstream's binary does: the controller context factory, the controllers
// registered by the imported packages, their informers, and leader election
// by Lease. It runs the controllers that issue with the SelfSigned and CA
// issuers; ACME, Vault and Venafi need networks a test does not have.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	// The controllers, registered by their packages' init functions, and
	// the issuer types they set up.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func main() {
	var (
		kubeconfig  = flag.String("kubeconfig", "", "path to a kubeconfig")
		leaderElect = flag.Bool("leader-elect", true, "elect a leader by Lease before running the controllers")
		leaseNS     = flag.String("leader-election-namespace", "kube-system", "namespace of the leader election Lease")
		leaseDur    = flag.Duration("leader-election-lease-duration", 60*time.Second, "leader election lease duration")
		renewDur    = flag.Duration("leader-election-renew-deadline", 40*time.Second, "leader election renew deadline")
		retryDur    = flag.Duration("leader-election-retry-period", 15*time.Second, "leader election retry period")
		clusterNS   = flag.String("cluster-resource-namespace", "kube-system", "namespace of the Secrets of cluster-scoped issuers")
		workers     = flag.Int("concurrent-workers", 5, "workers per controller")
	)
	klog.InitFlags(nil)
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := klog.NewKlogr()
	ctx = logf.NewContext(ctx, log)

	opts := controllerpkg.ContextOptions{
		Kubeconfig:         *kubeconfig,
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		IssuerOptions: controllerpkg.IssuerOptions{
			ClusterResourceNamespace:        *clusterNS,
			ClusterIssuerAmbientCredentials: true,
		},
		CertificateOptions: controllerpkg.CertificateOptions{
			CopiedAnnotationPrefixes:                 []string{"*", "-kubectl.kubernetes.io/", "-fluxcd.io/", "-argocd.argoproj.io/"},
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
		SchedulerOptions: controllerpkg.SchedulerOptions{MaxConcurrentChallenges: 60},
	}
	if err := run(ctx, log, opts, *leaderElect, *leaseNS, *leaseDur, *renewDur, *retryDur, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// run builds the controllers and runs them, as leader when leaderElect.
func run(ctx context.Context, log logr.Logger, opts controllerpkg.ContextOptions, leaderElect bool, leaseNS string, leaseDur, renewDur, retryDur time.Duration, workers int) error {
	factory, err := controllerpkg.NewContextFactory(ctx, opts)
	if err != nil {
		return fmt.Errorf("build controller context: %w", err)
	}
	if !leaderElect {
		return runControllers(ctx, log, factory, workers)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", opts.Kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("build client: %w", err)
	}
	host, err := os.Hostname()
	if err != nil {
		return fmt.Errorf("read hostname: %w", err)
	}
	id := fmt.Sprintf("%s-%d", host, os.Getpid())
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: leaseNS, Name: "cert-manager-controller"},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	errc := make(chan error, 1)
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   leaseDur,
		RenewDeadline:   renewDur,
		RetryPeriod:     retryDur,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				log.Info("became leader", "identity", id)
				errc <- runControllers(ctx, log, factory, workers)
			},
			OnStoppedLeading: func() { log.Info("leader election lost", "identity", id) },
		},
	})
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// runControllers starts every registered controller and the informers
// they use, and waits until ctx ends or a controller fails.
func runControllers(ctx context.Context, log logr.Logger, factory *controllerpkg.ContextFactory, workers int) error {
	known := controllerpkg.Known()
	names := make([]string, 0, len(known))
	for n := range known {
		names = append(names, n)
	}
	sort.Strings(names)
	g, gctx := errgroup.WithContext(ctx)
	for _, n := range names {
		c, err := known[n](factory)
		if err != nil {
			return fmt.Errorf("build controller %s: %w", n, err)
		}
		log.Info("starting controller", "controller", n)
		g.Go(func() error { return c.Run(workers, gctx) })
	}
	base, err := factory.Build()
	if err != nil {
		return fmt.Errorf("build controller context: %w", err)
	}
	base.KubeSharedInformerFactory.Start(gctx.Done())
	base.SharedInformerFactory.Start(gctx.Done())
	base.HTTP01ResourceMetadataInformersFactory.Start(gctx.Done())
	if base.GatewaySolverEnabled {
		base.GWShared.Start(gctx.Done())
	}
	return g.Wait()
}
