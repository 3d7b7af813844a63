package kit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// combinedPrefix is what client-go's EventCorrelator puts before the
// message of an event that stands for many similar ones.
const combinedPrefix = "(combined from similar events): "

// TestRecorderAggregates checks that a controller creating many pods
// writes a bounded number of events: nine distinct SuccessfulCreate
// events, then one combined event whose count goes up, all within the
// per-object burst of 25 writes; and that a repeated event is counted.
func TestRecorderAggregates(t *testing.T) {
	client := fake.NewClientset()
	var mu sync.Mutex
	creates, patches := 0, 0
	client.PrependReactor("*", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		switch a.(type) {
		case k8stesting.CreateAction:
			creates++
		case k8stesting.PatchAction:
			patches++
		}
		return false, nil, nil
	})
	r := NewRecorder(client, "test-controller", nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.Start(ctx)

	owner := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "rs-1"}}
	for i := range 500 {
		r.Eventf(owner, corev1.EventTypeNormal, ReasonSuccessfulCreate, "Created pod: web-%05d", i)
	}
	other := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "db", Namespace: "default", UID: "rs-2"}}
	for range 5 {
		r.Eventf(other, corev1.EventTypeWarning, ReasonFailedCreate, "Error creating: %v", fmt.Errorf("quota"))
	}
	// Events are written in order: once the last repeat is counted,
	// everything before it has been written or dropped.
	var list *corev1.EventList
	deadline := time.Now().Add(10 * time.Second)
	for {
		var err error
		if list, err = client.CoreV1().Events("default").List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
		done := false
		for _, ev := range list.Items {
			if ev.InvolvedObject.UID == "rs-2" && ev.Count == 5 {
				done = true
			}
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the repeated event was not counted to 5: %+v", list.Items)
		}
		time.Sleep(10 * time.Millisecond)
	}

	mu.Lock()
	defer mu.Unlock()
	// rs-2's event: one create and four patches.
	// rs-1: nine distinct events, one combined one, 15 count updates.
	if creates != 9+1+1 || creates+patches != 25+5 {
		t.Errorf("%d creates and %d patches, want %d creates and %d writes in all", creates, patches, 9+1+1, 25+5)
	}
	var combined int
	for _, ev := range list.Items {
		if ev.InvolvedObject.UID == "rs-1" && strings.HasPrefix(ev.Message, combinedPrefix) {
			combined++
			if want := int32(25 - 9); ev.Count != want {
				t.Errorf("combined event count %d, want %d", ev.Count, want)
			}
		}
	}
	if combined != 1 {
		t.Errorf("%d combined events, want 1", combined)
	}
}

// TestRecorderNeverBlocks: recording a burst far beyond what the hub
// takes returns at once; what does not fit the queue is dropped.
func TestRecorderNeverBlocks(t *testing.T) {
	client := fake.NewClientset()
	block := make(chan struct{})
	client.PrependReactor("*", "events", func(k8stesting.Action) (bool, runtime.Object, error) {
		<-block
		return false, nil, nil
	})
	defer close(block)
	r := NewRecorder(client, "test-controller", nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.Start(ctx)
	start := time.Now()
	for i := range 5000 {
		owner := &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("rs", i), Namespace: "default", UID: "u"}}
		r.Eventf(owner, corev1.EventTypeNormal, ReasonSuccessfulCreate, "Created pod: x")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("recording 5000 events with the hub stuck took %v", d)
	}
}
