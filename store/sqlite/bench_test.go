package sqlite

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-edge/tether/store"
)

// podValue is a pod of about 1.5 KB of JSON (1,490 bytes).
var podValue = []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web-7d9f8b6c5-abcde","namespace":"default","uid":"5f0c1f7e-8a1b-4c3d-9e2f-1a2b3c4d5e6f","creationTimestamp":"2026-01-01T00:00:00Z","labels":{"app":"web","pod-template-hash":"7d9f8b6c5"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web-7d9f8b6c5","uid":"0e1d2c3b-4a59-6877-8695-a4b3c2d1e0f9","controller":true,"blockOwnerDeletion":true}]},"spec":{"volumes":[{"name":"kube-api-access","projected":{"sources":[{"serviceAccountToken":{"expirationSeconds":3607,"path":"token"}},{"configMap":{"name":"kube-root-ca.crt","items":[{"key":"ca.crt","path":"ca.crt"}]}}],"defaultMode":420}}],"containers":[{"name":"web","image":"registry.example/web:1.2.3","ports":[{"containerPort":8080,"protocol":"TCP"}],"resources":{"limits":{"cpu":"500m","memory":"256Mi"},"requests":{"cpu":"100m","memory":"128Mi"}},"volumeMounts":[{"name":"kube-api-access","readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}],"imagePullPolicy":"IfNotPresent"}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","serviceAccountName":"default","serviceAccount":"default","nodeName":"edge-node-17","schedulerName":"default-scheduler","priority":0},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True","lastProbeTime":null,"lastTransitionTime":"2026-01-01T00:00:05Z"}],"hostIP":"10.0.0.17","podIP":"10.244.17.5","startTime":"2026-01-01T00:00:00Z","qosClass":"Burstable"}}`)

func benchPod(i int64) store.Object {
	name := fmt.Sprintf("web-%08d", i)
	return store.Object{
		Key:    store.Key{Resource: "pods", Namespace: "default", Name: name},
		Value:  podValue,
		Labels: map[string]string{"app": "web", "pod-template-hash": "7d9f8b6c5"},
		Fields: map[string]string{"metadata.name": name, "metadata.namespace": "default", "spec.nodeName": "edge-node-17", "status.phase": "Running"},
	}
}

func BenchmarkCreate(b *testing.B) {
	for _, writers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			s := openAt(b, b.TempDir(), Config{})
			defer s.Close()
			ctx := context.Background()
			var next atomic.Int64
			work := make(chan struct{}, writers)
			var wg sync.WaitGroup
			for range writers {
				wg.Go(func() {
					for range work {
						if _, err := s.Create(ctx, benchPod(next.Add(1))); err != nil {
							b.Error(err)
						}
					}
				})
			}
			start := time.Now()
			for b.Loop() {
				work <- struct{}{}
			}
			close(work)
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "creates/s")
		})
	}
}

func BenchmarkUpdate(b *testing.B) {
	for _, writers := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			s := openAt(b, b.TempDir(), Config{})
			defer s.Close()
			ctx := context.Background()
			const objects = 1000
			for i := range int64(objects) {
				if _, err := s.Create(ctx, benchPod(i)); err != nil {
					b.Fatal(err)
				}
			}
			var next atomic.Int64
			work := make(chan struct{}, writers)
			var wg sync.WaitGroup
			for range writers {
				wg.Go(func() {
					for range work {
						k := benchPod(next.Add(1) % objects).Key
						for {
							cur, err := s.Get(ctx, k)
							if err != nil {
								b.Error(err)
								return
							}
							cur.Value = append(cur.Value[:len(cur.Value)-1], ' ', '}')
							if len(cur.Value) > 4000 {
								cur.Value = podValue
							}
							if _, err := s.Update(ctx, cur, cur.Revision); err == nil {
								break
							}
						}
					}
				})
			}
			start := time.Now()
			for b.Loop() {
				work <- struct{}{}
			}
			close(work)
			wg.Wait()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "updates/s")
		})
	}
}

func BenchmarkList10000(b *testing.B) {
	dir := b.TempDir()
	s := openAt(b, dir, Config{})
	defer s.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := range int64(64) {
		wg.Go(func() {
			for i := g; i < 10000; i += 64 {
				if _, err := s.Create(ctx, benchPod(i)); err != nil {
					b.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if _, err := s.cdb.Exec(`PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		b.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "tether.db"))
	if err != nil {
		b.Fatal(err)
	}
	var durs []time.Duration
	for b.Loop() {
		t0 := time.Now()
		res, err := s.List(ctx, store.ListOptions{Resource: "pods"})
		if err != nil || len(res.Objects) != 10000 {
			b.Fatalf("List: %d objects, %v", len(res.Objects), err)
		}
		durs = append(durs, time.Since(t0))
	}
	sortDurations(durs)
	b.ReportMetric(float64(durs[len(durs)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(fi.Size())/(1<<20), "db-MiB")
}

func sortDurations(d []time.Duration) {
	for i := 1; i < len(d); i++ {
		for j := i; j > 0 && d[j] < d[j-1]; j-- {
			d[j], d[j-1] = d[j-1], d[j]
		}
	}
}

// BenchmarkFsync measures one write plus fsync of a small file in the
// benchmark's temporary directory: the floor under every commit.
func BenchmarkFsync(b *testing.B) {
	f, err := os.Create(filepath.Join(b.TempDir(), "f"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := []byte(strings.Repeat("x", 4096))
	for b.Loop() {
		if _, err := f.WriteAt(buf, 0); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}
