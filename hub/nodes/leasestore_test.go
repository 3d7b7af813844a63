package nodes

import (
	"maps"
	"slices"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A relist of kube-node-lease forgets what the hub knew of a Lease
// deleted while its watch was down, as the deletion event would have.
func TestLeasesRelistForgetsDeleted(t *testing.T) {
	l := NewLeases(Config{})
	lease := func(name, rv string) coordinationv1.Lease {
		return coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv}}
	}
	list := func(rv string, items ...coordinationv1.Lease) *coordinationv1.LeaseList {
		return &coordinationv1.LeaseList{ListMeta: metav1.ListMeta{ResourceVersion: rv}, Items: items}
	}
	if err := l.replaceStored(list("5", lease("a", "3"), lease("b", "4"))); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	l.mu.Lock()
	l.renewals["a"] = renewal{base: 3}
	l.renewals["b"] = renewal{base: 4}
	l.written["b"] = writtenMark{rv: 6, at: now}
	l.written["c"] = writtenMark{rv: 9, at: now} // not yet seen by the list below
	l.mu.Unlock()

	if err := l.replaceStored(list("8", lease("a", "3"))); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if got := slices.Sorted(maps.Keys(l.stored)); !slices.Equal(got, []string{"a"}) {
		t.Errorf("stored %v, want [a]", got)
	}
	if got := slices.Sorted(maps.Keys(l.renewals)); !slices.Equal(got, []string{"a"}) {
		t.Errorf("renewals of %v, want [a]", got)
	}
	if got := slices.Sorted(maps.Keys(l.written)); !slices.Equal(got, []string{"c"}) {
		t.Errorf("written marks of %v, want [c]", got)
	}
}
