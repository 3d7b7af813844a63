package hub_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// writeLoad writes ConfigMaps through every hub at once, one client per
// hub, and watches them on every hub, so that a test can check after a
// hub dies that nothing acknowledged was lost and that each surviving
// hub's watch saw every write once and in the store's order.
type writeLoad struct {
	ns string

	mu    sync.Mutex
	acked map[string]int64 // name → resourceVersion the create returned
	seen  [][]seenWrite    // by hub, in the order its watch gave them
	ended []string         // by hub, why its watch ended, if it did

	stop context.CancelFunc
	done sync.WaitGroup
}

type seenWrite struct {
	name string
	rv   int64
}

// startWriteLoad creates namespace ns, starts a watch on each hub from
// the namespace's creation and a writer through each hub, one create
// every 20ms. The writers stop in check, the watches when the test ends.
func startWriteLoad(t *testing.T, cs []kubernetes.Interface, ns string) *writeLoad {
	t.Helper()
	watchCtx, stopWatches := context.WithCancel(context.Background())
	t.Cleanup(stopWatches)
	ctx, cancel := context.WithCancel(watchCtx)
	w := &writeLoad{ns: ns, acked: map[string]int64{}, seen: make([][]seenWrite, len(cs)), ended: make([]string, len(cs)), stop: cancel}
	t.Cleanup(cancel)
	created, err := cs[0].CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cs {
		wi, err := c.CoreV1().ConfigMaps(ns).Watch(watchCtx, metav1.ListOptions{ResourceVersion: created.ResourceVersion})
		if err != nil {
			t.Fatalf("watch through hub %d: %v", i, err)
		}
		go func() {
			defer wi.Stop()
			for ev := range wi.ResultChan() {
				if ev.Type == watch.Error {
					w.mu.Lock()
					w.ended[i] = fmt.Sprintf("error event: %v", apierrors.FromObject(ev.Object))
					w.mu.Unlock()
					continue
				}
				cm, ok := ev.Object.(*corev1.ConfigMap)
				if ev.Type != watch.Added || !ok {
					continue
				}
				rv, _ := strconv.ParseInt(cm.ResourceVersion, 10, 64)
				w.mu.Lock()
				w.seen[i] = append(w.seen[i], seenWrite{cm.Name, rv})
				w.mu.Unlock()
			}
		}()
	}
	for i, c := range cs {
		w.done.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				name := fmt.Sprintf("w-%d-%d", i, n)
				cm, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
				if err == nil {
					rv, _ := strconv.ParseInt(cm.ResourceVersion, 10, 64)
					w.mu.Lock()
					w.acked[name] = rv
					w.mu.Unlock()
				}
				select {
				case <-ctx.Done():
				case <-time.After(20 * time.Millisecond):
				}
			}
		})
	}
	return w
}

// ackedThrough counts the creates hub i acknowledged.
func (w *writeLoad) ackedThrough(i int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for name := range w.acked {
		if strings.HasPrefix(name, fmt.Sprintf("w-%d-", i)) {
			n++
		}
	}
	return n
}

// check stops the writers and checks, on each surviving hub (cs[i] not
// nil): every acknowledged write is stored, and its watch gave every
// acknowledged write, none twice, in increasing resourceVersions, in the
// same order as every other surviving hub's watch.
func (w *writeLoad) check(t *testing.T, cs []kubernetes.Interface) {
	t.Helper()
	w.stop()
	w.done.Wait()
	w.mu.Lock()
	acked := slices.Collect(maps.Keys(w.acked))
	w.mu.Unlock()
	var first []seenWrite
	for i, c := range cs {
		if c == nil {
			continue
		}
		list, err := c.CoreV1().ConfigMaps(w.ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list through hub %d: %v", i, err)
		}
		stored := map[string]bool{}
		for _, cm := range list.Items {
			stored[cm.Name] = true
		}
		for _, name := range acked {
			if !stored[name] {
				t.Errorf("hub %d: acknowledged write %s is not stored", i, name)
			}
		}
		// The watch may lag the list: wait for it to give every write
		// the list holds.
		var seen []seenWrite
		deadline := time.Now().Add(20 * time.Second)
		for {
			w.mu.Lock()
			seen = slices.Clone(w.seen[i])
			ended := w.ended[i]
			w.mu.Unlock()
			got := map[string]bool{}
			for _, s := range seen {
				got[s.name] = true
			}
			var missing []string
			for _, cm := range list.Items {
				if strings.HasPrefix(cm.Name, "w-") && !got[cm.Name] {
					missing = append(missing, cm.Name+"@"+cm.ResourceVersion)
				}
			}
			if len(missing) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("hub %d: its watch has not given %d of the %d stored writes after 20s: %v (watch ended: %q; last given %v)",
					i, len(missing), len(stored), missing, ended, seen[max(0, len(seen)-3):])
			}
			time.Sleep(100 * time.Millisecond)
		}
		names := map[string]bool{}
		var last int64
		for _, s := range seen {
			if names[s.name] {
				t.Errorf("hub %d: watch gave %s twice", i, s.name)
			}
			names[s.name] = true
			if s.rv <= last {
				t.Errorf("hub %d: watch gave %s at resourceVersion %d after %d", i, s.name, s.rv, last)
			}
			last = s.rv
		}
		if first == nil {
			first = seen
		} else if n := min(len(first), len(seen)); !slices.Equal(first[:n], seen[:n]) {
			t.Errorf("hub %d's watch gave the writes in another order than the first surviving hub's", i)
		}
	}
	t.Logf("%d writes acknowledged, every one stored and watched once, in order, on every surviving hub", len(acked))
}
