package hub_test

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
)

var rbacBenchCheck = flag.Bool("rbacbench.check", false, "fail TestRBACCreateThroughput below the 0.95 target")

// TestRBACCreateThroughput measures API create throughput with RBAC
// deciding against without it, in the same hub and run: ConfigMaps
// created by a user whose one RoleBinding is among 5,000 (to 500 Roles),
// against the admin, whom system:masters lets through before RBAC looks at
// any binding. Rounds alternate to spread the noise of a shared machine.
// It reports creates/s with RBAC, beside the peer figure without it.
func TestRBACCreateThroughput(t *testing.T) {
	const (
		roles, bindings = 500, 5000
		perRound        = 600
		rounds          = 3
		clients         = 16
	)
	h := hubtest.Start(t, rbacControllers...)
	admin := clientFor(t, h)
	ctx := t.Context()
	mustKubectl(t, h, "create", "namespace", "bench")

	parallel(t, 32, roles, func(i int) error {
		_, err := admin.RbacV1().Roles("bench").Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("role-%d", i)},
			Rules: []rbacv1.PolicyRule{{Verbs: []string{"get", "list"}, APIGroups: []string{""},
				Resources: []string{"configmaps"}, ResourceNames: []string{fmt.Sprintf("cm-%d", i)}}},
		}, metav1.CreateOptions{})
		return err
	})
	parallel(t, 32, bindings, func(i int) error {
		_, err := admin.RbacV1().RoleBindings("bench").Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("binding-%d", i)},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: fmt.Sprintf("role-%d", i%roles)},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: fmt.Sprintf("user-%d", i)}},
		}, metav1.CreateOptions{})
		return err
	})
	mustKubectl(t, h, "create", "role", "cm-writer", "-n", "bench", "--verb=create", "--resource=configmaps")
	mustKubectl(t, h, "create", "rolebinding", "bencher", "-n", "bench", "--role=cm-writer", "--user=bencher")
	user := clientFrom(t, h.UserKubeconfig("bencher"))
	waitFor(t, "the bencher's binding to take effect", func() bool {
		_, err := user.CoreV1().ConfigMaps("bench").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}}, metav1.CreateOptions{})
		return err == nil
	})

	var seq atomic.Int64
	round := func(cs kubernetes.Interface) time.Duration {
		start := time.Now()
		parallel(t, clients, perRound, func(int) error {
			_, err := cs.CoreV1().ConfigMaps("bench").Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", seq.Add(1))},
				Data:       map[string]string{"k": "v"},
			}, metav1.CreateOptions{})
			return err
		})
		return time.Since(start)
	}
	round(admin) // warm up
	var on, off time.Duration
	for range rounds {
		off += round(admin)
		on += round(user)
	}
	n := float64(perRound * rounds)
	offRate, onRate := n/off.Seconds(), n/on.Seconds()
	ratio := onRate / offRate
	t.Logf("creates/s: RBAC off (admin) %.0f, on (user among %d bindings) %.0f", offRate, bindings, onRate)
	benchfmt.Report(t, benchfmt.Figure{Name: "rbac_create_throughput", Value: onRate, Unit: "creates/s",
		Target: "ratio>=0.95", Peer: "rbac_off", PeerValue: offRate, Mode: benchfmt.Mode(true)})
	if *rbacBenchCheck && ratio < 0.95 {
		t.Errorf("throughput with RBAC is %.3f of without, want >= 0.95", ratio)
	}
}

// parallel runs f(0..n-1) on workers goroutines and fails the test on the
// first error.
func parallel(t *testing.T, workers, n int, f func(i int) error) {
	t.Helper()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					errOnce.Do(func() { firstErr = err; cancel() })
					return
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
}
