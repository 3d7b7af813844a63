// Command sampleoperator is a small controller-runtime operator for
// tether's end-to-end tests. For each Shelf (crd.yaml) it keeps a ConfigMap
// owned by the Shelf, holds a finalizer on the Shelf until it has seen the
// deletion, and reports status with observedGeneration and a Ready
// condition. Replicas elect a leader by Lease; only the leader reconciles.
// On becoming leader it prints "leading <replica>" on standard output.
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

func main() {
	var (
		replica  = flag.String("replica", "", "name printed when this replica becomes leader")
		leaseNS  = flag.String("leader-election-namespace", "default", "namespace of the leader election Lease")
		leaseDur = flag.Duration("lease-duration", 15*time.Second, "leader election lease duration")
		renewDur = flag.Duration("renew-deadline", 10*time.Second, "leader election renew deadline")
		retryDur = flag.Duration("retry-period", 2*time.Second, "leader election retry period")
	)
	klog.InitFlags(nil)
	flag.Parse()
	ctrl.SetLogger(klog.NewKlogr())
	if err := run(*replica, *leaseNS, *leaseDur, *renewDur, *retryDur); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// run starts the manager and blocks until a signal stops it.
// The API server is the one of controller-runtime's --kubeconfig flag or
// $KUBECONFIG.
func run(replica, leaseNS string, leaseDur, renewDur, retryDur time.Duration) error {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("build scheme: %w", err)
	}
	if err := addToScheme(scheme); err != nil {
		return fmt.Errorf("build scheme: %w", err)
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress:  "0",
		LeaderElection:          true,
		LeaderElectionID:        "sampleoperator.sample.tether.dev",
		LeaderElectionNamespace: leaseNS,
		LeaseDuration:           &leaseDur,
		RenewDeadline:           &renewDur,
		RetryPeriod:             &retryDur,
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	r := &reconciler{client: mgr.GetClient(), scheme: scheme}
	if err := ctrl.NewControllerManagedBy(mgr).For(&Shelf{}).Owns(&corev1.ConfigMap{}).Complete(r); err != nil {
		return fmt.Errorf("create controller: %w", err)
	}
	go func() {
		<-mgr.Elected()
		fmt.Printf("leading %s\n", replica)
	}()
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		return fmt.Errorf("run manager: %w", err)
	}
	return nil
}
