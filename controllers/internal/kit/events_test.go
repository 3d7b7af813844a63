package kit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestRecorderAggregates checks that a controller creating many pods
// writes a bounded number of events: ten distinct SuccessfulCreate
// events, then one combined event whose count goes up, all within the
// per-object burst.
func TestRecorderAggregates(t *testing.T) {
	client := fake.NewClientset()
	r := NewRecorder(client, "test-controller", nil)
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	owner := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "rs-1"}}
	ctx := context.Background()
	drain := func() {
		for {
			select {
			case q := <-r.ch:
				if err := r.write(ctx, q.ev, q.key); err != nil {
					t.Fatal(err)
				}
			default:
				return
			}
		}
	}
	for i := range 1000 {
		r.Eventf(owner, "Normal", ReasonSuccessfulCreate, "Created pod: web-%05d", i)
		now = now.Add(time.Millisecond)
		drain()
	}
	creates, patches := 0, 0
	for _, a := range client.Actions() {
		if a.GetResource().Resource != "events" {
			continue
		}
		switch a.(type) {
		case k8stesting.CreateAction:
			creates++
		case k8stesting.PatchAction:
			patches++
		}
	}
	if creates != aggregateAfter+1 || creates+patches != spamBurst {
		t.Errorf("%d creates and %d patches, want %d creates and %d writes in all", creates, patches, aggregateAfter+1, spamBurst)
	}
	list, err := client.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var combined int
	for _, ev := range list.Items {
		if strings.HasPrefix(ev.Message, combinedPrefix) {
			combined++
			if want := int32(spamBurst - aggregateAfter); ev.Count != want {
				t.Errorf("combined event count %d, want %d", ev.Count, want)
			}
		}
	}
	if combined != 1 {
		t.Errorf("%d combined events, want 1", combined)
	}

	// The same message again is a repeat, not a new similar event.
	other := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default", UID: "rs-2"}}
	for range 5 {
		r.Eventf(other, "Warning", ReasonFailedCreate, "Error creating: %v", fmt.Errorf("quota"))
		drain()
	}
	list, _ = client.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	for _, ev := range list.Items {
		if ev.InvolvedObject.UID == "rs-2" && ev.Count != 5 {
			t.Errorf("repeated event count %d, want 5", ev.Count)
		}
	}
}
