package dataplane

import (
	"slices"
	"testing"
)

func TestRangeAlloc(t *testing.T) {
	a := rangeAlloc{size: 100}
	x, _ := a.alloc(10) // 0-9
	y, _ := a.alloc(20) // 10-29
	z, _ := a.alloc(30) // 30-59
	if x != 0 || y != 10 || z != 30 {
		t.Fatalf("bump allocation: %d %d %d", x, y, z)
	}
	if _, ok := a.alloc(41); ok {
		t.Fatal("allocated past the end")
	}
	// Freed ranges cool for one commit before they are reused.
	a.retire([]extent{{0, 10}, {10, 20}})
	if s, _ := a.alloc(5); s != 60 {
		t.Fatalf("reused a cooling range: %d", s)
	}
	a.retire(nil)
	if !slices.Equal(a.free, []extent{{0, 30}}) {
		t.Fatalf("adjacent ranges not merged: %v", a.free)
	}
	if s, _ := a.alloc(30); s != 0 {
		t.Fatalf("first fit: %d", s)
	}
	// Freeing the top range gives it back to the tail.
	a.retire([]extent{{60, 5}, {30, 30}})
	a.retire(nil)
	if a.next != 30 || len(a.free) != 0 {
		t.Fatalf("tail not reclaimed: next %d free %v", a.next, a.free)
	}
	if s, ok := a.alloc(70); !ok || s != 30 {
		t.Fatalf("tail allocation: %d %v", s, ok)
	}

	var b rangeAlloc
	b.size = 50
	if err := b.reserve([]extent{{20, 5}, {0, 10}}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(b.free, []extent{{10, 10}}) || b.next != 25 {
		t.Fatalf("reserve: free %v next %d", b.free, b.next)
	}
	if err := b.reserve([]extent{{0, 10}, {5, 10}}); err == nil {
		t.Fatal("overlapping ranges accepted")
	}
}
