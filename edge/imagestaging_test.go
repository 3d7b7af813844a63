package edge

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/edge/localstate"
	"github.com/tether-edge/tether/internal/fleetapi"
)

// fakeStager records what the agent asks of an ImageStager.
type fakeStager struct {
	staged  map[string]int64 // image → the cap it was pulled with
	fail    map[string]bool
	kept    []string
	attempt int
}

func (f *fakeStager) Images(context.Context) ([]corev1.ContainerImage, error) { return nil, nil }
func (f *fakeStager) StageImage(_ context.Context, im string, limit int64) (bool, error) {
	f.attempt++
	if f.fail[im] {
		return false, errors.New("refused")
	}
	_, had := f.staged[im]
	f.staged[im] = limit
	return !had, nil
}
func (f *fakeStager) SetStaged(_ context.Context, ims []string) error { f.kept = ims; return nil }

func TestImageStagingWanted(t *testing.T) {
	a := &Agent{name: "n1", cfg: Config{Zone: "shop", ImageStagingInterval: time.Minute}}
	a.log = slog.New(slog.NewTextHandler(t.Output(), nil))
	a.node = &nodeSync{a: a, kick: make(chan struct{}, 1), node: &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1",
		Labels: map[string]string{LabelZone: "shop", "tier": "retail"}}}}
	a.eventsStopped.Store(true) // no recorder in this test
	f := &fakeStager{staged: map[string]int64{}, fail: map[string]bool{"bad:v1": true}}
	s := &imageStaging{a: a, stager: f, store: cache.NewStore(cache.MetaNamespaceKeyFunc), wake: make(chan struct{}, 1), failed: map[string]time.Time{}}
	q := func(v string) *resource.Quantity { r := resource.MustParse(v); return &r }
	now := time.Now().UTC()
	shut := &fleetapi.MaintenanceWindow{Start: now.Add(2 * time.Hour).Format("15:04"), Duration: metav1.Duration{Duration: time.Hour}}
	for _, st := range []*fleetapi.ImageStaging{
		{ObjectMeta: metav1.ObjectMeta{Name: "a", UID: types.UID("a")}, Spec: fleetapi.ImageStagingSpec{
			Images: []string{"app:v1", "bad:v1"}, BandwidthLimit: q("1Mi"),
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "retail"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Spec: fleetapi.ImageStagingSpec{Images: []string{"app:v1"}, BandwidthLimit: q("64Ki")}},
		{ObjectMeta: metav1.ObjectMeta{Name: "c"}, Spec: fleetapi.ImageStagingSpec{Images: []string{"other:v1"},
			NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "depot"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Spec: fleetapi.ImageStagingSpec{Images: []string{"later:v1"}, Window: shut}},
	} {
		if err := s.store.Add(st); err != nil {
			t.Fatal(err)
		}
	}
	s.stage(context.Background())
	// app:v1 with the strictest cap of the two stagings; other:v1 not
	// for this node; later:v1 waits for its window; bad:v1 failed.
	if len(f.staged) != 1 || f.staged["app:v1"] != 64<<10 {
		t.Errorf("staged %v, want app:v1 capped at 64Ki", f.staged)
	}
	if want := []string{"app:v1", "bad:v1", "later:v1"}; len(f.kept) != 3 || f.kept[0] != want[0] || f.kept[1] != want[1] || f.kept[2] != want[2] {
		t.Errorf("kept %v, want %v", f.kept, want)
	}
	if _, ok := s.failed["bad:v1"]; !ok {
		t.Error("the failed image is not remembered")
	}
	// A failed image waits stagingRetry before the next attempt.
	attempts := f.attempt
	s.stage(context.Background())
	if f.attempt != attempts+1 { // app:v1 again (present: a no-op), not bad:v1
		t.Errorf("%d attempts on the second pass, want 1", f.attempt-attempts)
	}
}

func TestNodeStatusImages(t *testing.T) {
	in := nodeInput{name: "n1", now: time.Now(), images: []corev1.ContainerImage{{Names: []string{"r/app:v1"}, SizeBytes: 3 << 20}}}
	a := buildNodeStatus(in, nil)
	if len(a.Images) != 1 || a.Images[0].Names[0] != "r/app:v1" {
		t.Fatalf("images %v", a.Images)
	}
	in.images = append(in.images, corev1.ContainerImage{Names: []string{"r/other:v1"}, SizeBytes: 1 << 20})
	b := buildNodeStatus(in, &a)
	if sameNodeStatus(a, b) {
		t.Error("a new image does not change the status")
	}
	p, err := statusPatch(corev1.Node{Status: a}, corev1.Node{Status: b}, corev1.Node{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p) > 200 {
		t.Errorf("patch of one new image is %d bytes: %s", len(p), p)
	}
}

// TestImageStagingsKeptOffline: the stagings a node saw load from its
// local state at the next start, before the hub answers.
func TestImageStagingsKeptOffline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	spec := func(st *localstate.State) localstate.Spec {
		return localstate.Spec{State: st, Kind: keptImageStagings, Watch: keptImageStagings}
	}
	st, err := localstate.Open(path, localstate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	list := func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		return &fleetapi.ImageStagingList{ListMeta: metav1.ListMeta{ResourceVersion: "5"}, Items: []fleetapi.ImageStaging{{
			ObjectMeta: metav1.ObjectMeta{Name: "pos", UID: "u1", ResourceVersion: "5"},
			Spec:       fleetapi.ImageStagingSpec{Images: []string{"r/app:v1"}}}}}, nil
	}
	idle := func(ctx context.Context, _ metav1.ListOptions) (watch.Interface, error) {
		return watch.NewFake(), nil
	}
	_, ctrl := localstate.NewInformer(spec(st), list, idle, &fleetapi.ImageStaging{}, cache.ResourceEventHandlerFuncs{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ctrl.RunWithContext(ctx); close(done) }()
	if !cache.WaitForCacheSync(ctx.Done(), ctrl.HasSynced) {
		t.Fatal("not synced")
	}
	cancel()
	<-done
	st.Close()

	st, err = localstate.Open(path, localstate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	offline := func(context.Context, metav1.ListOptions) (runtime.Object, error) {
		return nil, errors.New("hub unreachable")
	}
	store, _ := localstate.NewInformer(spec(st), offline, func(context.Context, metav1.ListOptions) (watch.Interface, error) {
		return nil, errors.New("hub unreachable")
	}, &fleetapi.ImageStaging{}, cache.ResourceEventHandlerFuncs{})
	objs := store.List()
	if len(objs) != 1 || objs[0].(*fleetapi.ImageStaging).Spec.Images[0] != "r/app:v1" {
		t.Fatalf("loaded %v, want the staging pos", objs)
	}
}
