package nodes

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/storage"
	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/sqlite"
)

// countingStore counts the writes of Leases and of Nodes that reach the
// store.
type countingStore struct {
	store.Store
	leaseWrites atomic.Int64
	nodeWrites  atomic.Int64
}

func (c *countingStore) count(k store.Key) {
	switch k.Resource {
	case "leases.coordination.k8s.io":
		c.leaseWrites.Add(1)
	case "nodes":
		c.nodeWrites.Add(1)
	}
}

func (c *countingStore) Create(ctx context.Context, obj store.Object) (int64, error) {
	c.count(obj.Key)
	return c.Store.Create(ctx, obj)
}

func (c *countingStore) Update(ctx context.Context, obj store.Object, expected int64) (int64, error) {
	c.count(obj.Key)
	return c.Store.Update(ctx, obj, expected)
}

func (c *countingStore) Delete(ctx context.Context, key store.Key, expected int64) (store.Object, error) {
	c.count(key)
	return c.Store.Delete(ctx, key, expected)
}

type admin struct{}

func (admin) Authenticate(*http.Request) (*auth.User, bool, error) {
	return &auth.User{Name: "admin", Groups: []string{"system:masters", auth.GroupAuthenticated}}, true, nil
}

// leaseHub is the part of a hub node Leases need: a store that counts
// Lease writes, the storage, the Lease keeper and the API server serving
// what the keeper's Serve returns, with a client of it.
type leaseHub struct {
	st     *countingStore
	stg    *storage.Storage
	leases *Leases
	client *kubernetes.Clientset
	stop   func()
}

func startLeaseHub(t *testing.T, path string, cfg Config) *leaseHub {
	t.Helper()
	sq, err := sqlite.Open(sqlite.Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	h := &leaseHub{st: &countingStore{Store: sq}}
	h.stg = newStorageOn(t, h.st, storage.Config{BookmarkInterval: 200 * time.Millisecond})
	cfg.Storage, cfg.Logger = h.stg, quiet
	h.leases = NewLeases(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	go h.leases.Run(ctx)
	api, err := apiserver.New(apiserver.Config{Storage: h.leases.Serve(h.stg), Kinds: registry.All(), Authenticator: admin{}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewTLSServer(api.Handler())
	h.client = kubernetes.NewForConfigOrDie(&rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
	var once sync.Once
	h.stop = func() {
		once.Do(func() {
			cancel()
			// No new connections (an informer's next watch), then
			// none open: Close waits for active ones.
			srv.Listener.Close()
			srv.CloseClientConnections()
			srv.Close()
			sq.Close()
		})
	}
	t.Cleanup(h.stop)
	return h
}

// heartbeats connects nodes and sends their heartbeats until the test
// ends, as the tunnel server would.
func (h *leaseHub) heartbeats(t *testing.T, nodes ...string) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	for _, n := range nodes {
		if _, err := h.stg.Create(ctx, nodesKind, "", &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, storage.Options{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		h.leases.Connected(n)
	}
	go func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				for _, n := range nodes {
					h.leases.Heartbeat(n)
				}
			}
		}
	}()
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func rvOf(t *testing.T, obj metav1.Object) int64 {
	t.Helper()
	n, err := strconv.ParseInt(obj.GetResourceVersion(), 10, 64)
	if err != nil {
		t.Fatalf("resourceVersion %q of %s: %v", obj.GetResourceVersion(), obj.GetName(), err)
	}
	return n
}

// watchRecorder checks one watch's events as they come: resourceVersions
// never go down, and each Lease's renewTime never goes back.
type watchRecorder struct {
	t  *testing.T
	mu sync.Mutex
	// modified counts renewals seen (renewTime moved) per Lease.
	modified map[string]int
	renew    map[string]time.Time
	last     int64
	lastObj  map[string]*coordinationv1.Lease
	labelled chan *coordinationv1.Lease
	err      string
}

func record(t *testing.T, w watch.Interface, from int64) *watchRecorder {
	r := &watchRecorder{t: t, modified: map[string]int{}, renew: map[string]time.Time{}, last: from,
		lastObj: map[string]*coordinationv1.Lease{}, labelled: make(chan *coordinationv1.Lease, 10)}
	go func() {
		for ev := range w.ResultChan() {
			r.mu.Lock()
			switch ev.Type {
			case watch.Error:
				r.err = apierrors.FromObject(ev.Object).Error()
			case watch.Added, watch.Modified:
				l := ev.Object.(*coordinationv1.Lease)
				rv, _ := strconv.ParseInt(l.ResourceVersion, 10, 64)
				if rv < r.last && ev.Type == watch.Modified {
					r.err = "resourceVersion went down from " + strconv.FormatInt(r.last, 10) + " to " + l.ResourceVersion
				}
				r.last = max(r.last, rv)
				if prev, ok := r.renew[l.Name]; ok && l.Spec.RenewTime.Time.Before(prev) {
					r.err = "renewTime of " + l.Name + " went back"
				}
				if prev, ok := r.renew[l.Name]; ok && ev.Type == watch.Modified && l.Spec.RenewTime.Time.After(prev) {
					r.modified[l.Name]++
				}
				r.renew[l.Name] = l.Spec.RenewTime.Time
				r.lastObj[l.Name] = l
				if l.Labels["checked"] != "" {
					select {
					case r.labelled <- l:
					default:
					}
				}
			}
			r.mu.Unlock()
		}
	}()
	return r
}

func (r *watchRecorder) check(what string, nodes []string, atLeast int) {
	r.t.Helper()
	waitUntil(r.t, what, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.err != "" {
			r.t.Fatalf("%s: %s", what, r.err)
		}
		for _, n := range nodes {
			if r.modified[n] < atLeast {
				return false
			}
		}
		return true
	})
}

func (r *watchRecorder) latest(name string) (*coordinationv1.Lease, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastObj[name].DeepCopy(), r.last
}

// TestNodeLeasesFromMemory: renewals of node Leases move renewTime for
// GET, LIST, raw watches and client-go informers, with resourceVersions
// that never go down and that a watch resumes from, while the store sees
// no Lease write per renewal; a client's write wins, and the Leases
// survive a restart.
func TestNodeLeasesFromMemory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	h := startLeaseHub(t, path, Config{LeaseRenew: 100 * time.Millisecond})
	ctx := t.Context()
	nodes := []string{"n1", "n2"}
	leasesOf := h.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	h.heartbeats(t, nodes...)
	first := map[string]*coordinationv1.Lease{}
	waitUntil(t, "leases", func() bool {
		for _, n := range nodes {
			l, err := leasesOf.Get(ctx, n, metav1.GetOptions{})
			if err != nil {
				return false
			}
			first[n] = l
		}
		return true
	})
	for _, n := range nodes {
		l := first[n]
		if *l.Spec.HolderIdentity != n || *l.Spec.LeaseDurationSeconds != 40 || len(l.OwnerReferences) != 1 {
			t.Fatalf("lease %+v", l)
		}
	}
	// The first renewal of each session is stored; the rest are not.
	waitUntil(t, "renewals in memory", func() bool { return h.leases.Stats().Memory >= 4 })
	writes, stored := h.st.leaseWrites.Load(), h.leases.Stats().Store

	// A raw watch from a list's resourceVersion, and an informer.
	list, err := leasesOf.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	listRV, _ := strconv.ParseInt(list.ResourceVersion, 10, 64)
	w, err := leasesOf.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion, AllowWatchBookmarks: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	raw := record(t, w, listRV)

	factory := informers.NewSharedInformerFactoryWithOptions(h.client, 0, informers.WithNamespace(corev1.NamespaceNodeLease))
	inf := factory.Coordination().V1().Leases().Informer()
	var imu sync.Mutex
	updates := map[string]int{}
	var informerErr string
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{UpdateFunc: func(o, n any) {
		old, cur := o.(*coordinationv1.Lease), n.(*coordinationv1.Lease)
		imu.Lock()
		defer imu.Unlock()
		if a, b := rvOf(t, old), rvOf(t, cur); b < a {
			informerErr = "informer resourceVersion went down"
		}
		if cur.Spec.RenewTime.After(old.Spec.RenewTime.Time) {
			updates[cur.Name]++
		}
	}}); err != nil {
		t.Fatal(err)
	}
	stopInf := make(chan struct{})
	stopInformer := sync.OnceFunc(func() { close(stopInf); factory.Shutdown() })
	defer stopInformer()
	factory.Start(stopInf)
	raw.check("renewals on the raw watch", nodes, 3)
	waitUntil(t, "renewals in the informer", func() bool {
		imu.Lock()
		defer imu.Unlock()
		if informerErr != "" {
			t.Fatal(informerErr)
		}
		return updates["n1"] >= 3 && updates["n2"] >= 3
	})

	// GET and LIST (one namespace and all) show renewTime moving.
	for _, n := range nodes {
		l, err := leasesOf.Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !l.Spec.RenewTime.After(first[n].Spec.RenewTime.Time) {
			t.Errorf("GET %s: renewTime %v, first %v", n, l.Spec.RenewTime, first[n].Spec.RenewTime)
		}
	}
	all, err := h.client.CoordinationV1().Leases("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range all.Items {
		if !l.Spec.RenewTime.After(first[l.Name].Spec.RenewTime.Time) {
			t.Errorf("LIST: %s renewTime %v, first %v", l.Name, l.Spec.RenewTime, first[l.Name].Spec.RenewTime)
		}
	}
	if got := h.st.leaseWrites.Load(); got != writes {
		t.Errorf("%d Lease writes reached the store during %d renewals", got-writes, h.leases.Stats().Memory)
	}
	if got := h.leases.Stats().Store; got != stored {
		t.Errorf("stored renewals went from %d to %d", stored, got)
	}

	// A client's update with the resourceVersion of a renewal event is
	// stored as written; the watch and the next renewals show it.
	// One read before a later renewal conflicts, as it would have after
	// a stored renewal: the client reads again.
	var updated *coordinationv1.Lease
	var lastRV int64
	for try := 0; updated == nil || err != nil; try++ {
		var seen *coordinationv1.Lease
		seen, lastRV = raw.latest("n1")
		seen.Labels = map[string]string{"checked": "yes"}
		updated, err = leasesOf.Update(ctx, seen, metav1.UpdateOptions{})
		if err != nil && (!apierrors.IsConflict(err) || try == 20) {
			t.Fatalf("update with a renewal's resourceVersion: %v", err)
		}
	}
	if rvOf(t, updated) <= lastRV {
		t.Errorf("update stored at %s, not after %d", updated.ResourceVersion, lastRV)
	}
	select {
	case l := <-raw.labelled:
		if l.ResourceVersion != updated.ResourceVersion {
			t.Errorf("watch saw the update at %s, stored at %s", l.ResourceVersion, updated.ResourceVersion)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not see the update")
	}
	// A stale resourceVersion still conflicts.
	if _, err := leasesOf.Update(ctx, first["n1"], metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("update of n1 with a resourceVersion from before a write: %v, want a conflict", err)
	}
	// A patch that pins a renewal's resourceVersion applies too.
	seen, _ := raw.latest("n2")
	patch := []byte(`{"metadata":{"resourceVersion":"` + seen.ResourceVersion + `","labels":{"patched":"yes"}}}`)
	if _, err := leasesOf.Patch(ctx, "n2", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Errorf("patch pinning a renewal's resourceVersion: %v", err)
	}
	raw.check("renewals after the writes", []string{"n1"}, 5)
	got, err := leasesOf.Get(ctx, "n1", metav1.GetOptions{})
	if err != nil || got.Labels["checked"] != "yes" || got.Spec.RenewTime.Before(updated.Spec.RenewTime) {
		t.Errorf("after the update: %+v %v", got, err)
	}

	// A watch resumes from the last resourceVersion a client saw: no
	// 410, renewals keep coming; and one from that list's revision
	// replays the stored changes since.
	_, lastRV = raw.latest("n1")
	w2, err := leasesOf.Watch(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatInt(lastRV, 10)})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Stop()
	record(t, w2, lastRV).check("renewals on a resumed watch", nodes, 2)
	w3, err := leasesOf.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w3.Stop()
	replay := record(t, w3, listRV)
	select {
	case <-replay.labelled:
	case <-time.After(5 * time.Second):
		t.Fatal("a watch from the list's revision did not replay the update")
	}

	// A streaming list: the Leases as ADDED with renewals applied, the
	// end bookmark at the list's revision, then renewals.
	w4, err := leasesOf.Watch(ctx, metav1.ListOptions{SendInitialEvents: ptr.To(true), AllowWatchBookmarks: true,
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
	if err != nil {
		t.Fatal(err)
	}
	defer w4.Stop()
	added, bookmarkRV, renewals := 0, int64(0), 0
	for timeout := time.After(5 * time.Second); renewals < 2; {
		select {
		case ev := <-w4.ResultChan():
			l, _ := ev.Object.(*coordinationv1.Lease)
			switch ev.Type {
			case watch.Added:
				added++
				if !l.Spec.RenewTime.After(first[l.Name].Spec.RenewTime.Time) {
					t.Errorf("initial event of %s without its renewals", l.Name)
				}
			case watch.Bookmark:
				if l.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
					bookmarkRV = rvOf(t, l)
				}
			case watch.Modified:
				if bookmarkRV == 0 || rvOf(t, l) < bookmarkRV {
					t.Fatalf("renewal at %s before the end bookmark (%d)", l.ResourceVersion, bookmarkRV)
				}
				renewals++
			}
		case <-timeout:
			t.Fatalf("streaming list: %d added, bookmark %d, %d renewals", added, bookmarkRV, renewals)
		}
	}
	if added != 2 {
		t.Errorf("streaming list sent %d Leases, want 2", added)
	}
	if got := h.st.leaseWrites.Load(); got != writes+2 {
		t.Errorf("%d Lease writes reached the store, want the 2 clients' writes", got-writes)
	}

	// What `kubectl get lease -w` asks for: a watch of Table rows.
	_, lastRV = raw.latest("n1")
	body, err := h.client.CoordinationV1().RESTClient().Get().AbsPath("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases").
		Param("watch", "true").Param("resourceVersion", strconv.FormatInt(lastRV, 10)).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(body)
	for rows := 0; rows < 4; {
		var ev struct {
			Type   string
			Object metav1.Table
		}
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("table watch: %v", err)
		}
		if ev.Type != "MODIFIED" || ev.Object.Kind != "Table" || len(ev.Object.Rows) != 1 {
			t.Fatalf("table watch event %s %s with %d rows", ev.Type, ev.Object.Kind, len(ev.Object.Rows))
		}
		rows++
	}
	body.Close()

	// A watch's selectors select its renewals too.
	_, lastRV = raw.latest("n1")
	w6, err := leasesOf.Watch(ctx, metav1.ListOptions{ResourceVersion: strconv.FormatInt(lastRV, 10), FieldSelector: "metadata.name=n2"})
	if err != nil {
		t.Fatal(err)
	}
	defer w6.Stop()
	selected := record(t, w6, lastRV)
	selected.check("renewals of the selected Lease", []string{"n2"}, 3)
	selected.mu.Lock()
	if selected.lastObj["n1"] != nil {
		t.Errorf("a watch of n2 got an event of n1: %+v", selected.lastObj["n1"])
	}
	selected.mu.Unlock()

	// A watch from below the change log ends with 410 Expired, and
	// nothing before it.
	if err := h.st.Store.(*sqlite.Store).Compact(ctx, h.st.Revision()); err != nil {
		t.Fatal(err)
	}
	w5, err := leasesOf.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w5.Stop()
	select {
	case ev := <-w5.ResultChan():
		if ev.Type != watch.Error || !apierrors.IsResourceExpired(apierrors.FromObject(ev.Object)) {
			t.Errorf("watch from a compacted revision: %s %v, want 410 Expired", ev.Type, ev.Object)
		}
	case <-time.After(5 * time.Second):
		t.Error("watch from a compacted revision: no event")
	}

	// A restart keeps the Leases, holder and duration, with the renewTime
	// last stored.
	stopInformer()
	h.stop()
	h2 := startLeaseHub(t, path, Config{LeaseRenew: 100 * time.Millisecond})
	for _, n := range nodes {
		l, err := h2.client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, n, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("lease %s after a restart: %v", n, err)
		}
		if *l.Spec.HolderIdentity != n || *l.Spec.LeaseDurationSeconds != 40 || len(l.OwnerReferences) != 1 {
			t.Errorf("lease after a restart %+v", l)
		}
	}
}
