package postgres

import (
	"context"
	"fmt"
	"testing"

	"github.com/tether-edge/tether/store"
	"github.com/tether-edge/tether/store/postgres/pgtest"
	"github.com/tether-edge/tether/store/storebench"
)

// BenchmarkList lists 10,000 pods of about 1.5 KB, each created and updated
// once, as storebench's comparison does. Profile it with
// go test -run '^$' -bench BenchmarkList -cpuprofile cpu.out ./store/postgres/.
func BenchmarkList(b *testing.B) {
	const n = 10000
	c := pgtest.Start(b)
	ctx := context.Background()
	s, err := Open(ctx, Config{DSN: c.NewDatabase()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	obj := func(name string, gen int) store.Object {
		return store.Object{
			Key:    store.Key{Resource: "pods", Namespace: "bench", Name: name},
			Value:  storebench.Pod("bench", name, gen),
			Labels: map[string]string{"app": "web", "tier": "frontend", "pod-template-hash": "7c9f8d6b5c"},
			Fields: map[string]string{"metadata.name": name, "metadata.namespace": "bench", "spec.nodeName": "edge-001", "status.phase": "Running"},
		}
	}
	errs := make(chan error, n)
	for i := range n {
		go func() {
			name := fmt.Sprintf("web-%06d", i)
			rev, err := s.Create(ctx, obj(name, 0))
			if err == nil {
				_, err = s.Update(ctx, obj(name, 1), rev)
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res, err := s.List(ctx, store.ListOptions{Resource: "pods"})
		if err != nil {
			b.Fatal(err)
		}
		if len(res.Objects) != n {
			b.Fatalf("listed %d objects, want %d", len(res.Objects), n)
		}
	}
}
