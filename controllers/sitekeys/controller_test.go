package sitekeys

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/internal/sitedigest"
)

const rotation = 24 * time.Hour

type env struct {
	t     *testing.T
	kube  *fake.Clientset
	clock *testingclock.FakeClock
	stop  func()
}

// start runs a controller against the env's client until stop.
func (e *env) start() {
	factory := informers.NewSharedInformerFactory(e.kube, 0)
	c, err := New(Config{Client: e.kube, Informers: factory, Rotation: rotation, Clock: e.clock,
		Logger: slog.New(slog.NewTextHandler(e.t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	factory.Start(ctx.Done())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	e.stop = sync.OnceFunc(func() {
		cancel()
		<-done
		factory.Shutdown()
	})
	e.t.Cleanup(e.stop)
}

func (e *env) restart() {
	e.stop()
	e.start()
}

func (e *env) secret(site string) *corev1.Secret {
	s, err := e.kube.CoreV1().Secrets(sitedigest.KeySecretNamespace).Get(context.Background(), sitedigest.KeySecretName(site), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func (e *env) keys(site string) []byte {
	if s := e.secret(site); s != nil {
		return s.Data[sitedigest.KeySecretKey]
	}
	return nil
}

// waitKeys waits until site's Secret holds n keys satisfying ok.
func (e *env) waitKeys(what, site string, ok func(keys []byte) bool) []byte {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		k := e.keys(site)
		if k != nil && ok(k) {
			return k
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s (site %s has %d key bytes)", what, site, len(k))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// settle lets the controller act on what it has seen.
func settle() { time.Sleep(200 * time.Millisecond) }

// step moves the clock by d once the controller has settled. Stepping
// while the work queue's delay loop is between reading the clock and
// setting its timer would set that timer late by the whole step (client-go's
// delaying queue over a fake clock), and the requeue it waits for would
// not come.
func (e *env) step(d time.Duration) {
	settle()
	e.clock.Step(d)
}

func node(name, zone string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if zone != "" {
		n.Labels = map[string]string{corev1.LabelTopologyZone: zone}
	}
	return n
}

func count(n int) func([]byte) bool { return func(k []byte) bool { return len(k) == n*KeySize } }

// TestSiteKeys: every site gets a Secret with one key, a site a node
// moves to as well; keys rotate every Rotation, the new one first and the
// previous two kept; a restarted controller rotates neither early nor
// late; a deleted or damaged Secret comes back.
func TestSiteKeys(t *testing.T) {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	e := &env{t: t, clock: testingclock.NewFakeClock(start),
		kube: fake.NewClientset(node("a1", "site-a"), node("a2", "site-a"), node("b1", "Site_B"), node("c1", ""))}
	e.start()

	a0 := e.waitKeys("site-a's keys", "site-a", count(1))
	e.waitKeys("Site_B's keys", "Site_B", count(1))
	s := e.secret("site-a")
	if s.Type != sitedigest.KeySecretType || s.Labels[LabelSite] != "site-a" || s.Annotations[AnnotationRotated] != "2026-03-01T12:00:00Z" {
		t.Fatalf("secret %s: type %q labels %v annotations %v", s.Name, s.Type, s.Labels, s.Annotations)
	}
	if bytes.Equal(a0, e.keys("Site_B")) {
		t.Fatal("two sites share a key")
	}
	list, err := e.kube.CoreV1().Secrets(sitedigest.KeySecretNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(list.Items) != 2 {
		t.Fatalf("%d secrets (%v), want one per site", len(list.Items), err)
	}

	// Not before Rotation.
	e.step(rotation - time.Minute)
	settle()
	if !bytes.Equal(e.keys("site-a"), a0) {
		t.Fatal("keys rotated early")
	}
	e.step(time.Minute)
	a1 := e.waitKeys("first rotation", "site-a", count(2))
	if !bytes.Equal(a1[KeySize:], a0) || bytes.Equal(a1[:KeySize], a0) {
		t.Fatal("rotation did not put a new key before the old one")
	}
	e.waitKeys("Site_B rotated too", "Site_B", count(2))
	e.step(rotation)
	a2 := e.waitKeys("second rotation", "site-a", count(3))
	e.step(rotation)
	a3 := e.waitKeys("third rotation", "site-a", func(k []byte) bool { return !bytes.Equal(k, a2) })
	if len(a3) != Kept*KeySize || !bytes.Equal(a3[KeySize:], a2[:2*KeySize]) {
		t.Fatalf("third rotation kept %d bytes, want the new key and the two before it", len(a3))
	}

	// A restart half-way does not rotate early, nor late.
	e.step(rotation / 2)
	e.restart()
	e.kube.CoreV1().Nodes().Create(context.Background(), node("d1", "site-d"), metav1.CreateOptions{})
	e.waitKeys("new site's keys", "site-d", count(1))
	// A node that moves to a new site brings that site its keys.
	if _, err := e.kube.CoreV1().Nodes().Update(context.Background(), node("c1", "site-e"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitKeys("keys of the site a node moved to", "site-e", count(1))
	settle()
	if !bytes.Equal(e.keys("site-a"), a3) {
		t.Fatal("restarted controller rotated early")
	}
	e.step(rotation / 2)
	a4 := e.waitKeys("rotation on time after a restart", "site-a", func(k []byte) bool { return !bytes.Equal(k, a3) })
	e.stop()
	e.step(2 * rotation)
	e.start()
	e.waitKeys("overdue rotation at start", "site-a", func(k []byte) bool { return !bytes.Equal(k, a4) })

	// Deleted: back with a fresh key. Damaged: replaced.
	if err := e.kube.CoreV1().Secrets(sitedigest.KeySecretNamespace).Delete(context.Background(), sitedigest.KeySecretName("Site_B"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitKeys("deleted secret back", "Site_B", count(1))
	s = e.secret("site-a")
	s.Data[sitedigest.KeySecretKey] = []byte("short")
	if _, err := e.kube.CoreV1().Secrets(sitedigest.KeySecretNamespace).Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitKeys("damaged keys replaced", "site-a", count(1))
}
