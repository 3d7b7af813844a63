// Package storebench drives the same Kubernetes-shaped storage workload
// against tether's store and its peers (kine over SQLite, embedded etcd) and
// prints the results side by side with ratios.
//
// The workload is the one the Kubernetes API server puts on its storage:
// pod objects of about 1.5 KB under keys like /registry/pods/<ns>/<name>,
// created with a compare-and-put on "does not exist", updated with a
// compare-and-put on the revision last read, and listed with one range read
// of the resource prefix. The package uses the standard library only so that
// the peer programs, each in its own module, can import it cheaply.
package storebench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Target is one store under test. Keys are given as namespace and name of a
// pod; a peer maps them to /registry/pods/<ns>/<name>.
type Target interface {
	// Create stores a new object if the key does not exist and returns
	// its revision.
	Create(ctx context.Context, ns, name string, value []byte) (int64, error)
	// Update replaces the object if its current revision is expected and
	// returns the new revision.
	Update(ctx context.Context, ns, name string, value []byte, expected int64) (int64, error)
	// List reads every pod in one range read and returns how many it got.
	List(ctx context.Context) (int, error)
	// Size is the number of bytes the store occupies on disk.
	Size() (int64, error)
	// Close releases the target.
	Close() error
}

// Config shapes a run. Zero values take the defaults given per field.
type Config struct {
	// Name labels the result, e.g. "tether", "kine", "etcd".
	Name string `json:"name"`
	// Objects is how many pods each write phase creates and then updates
	// once; 0 means 10,000.
	Objects int `json:"objects"`
	// Writers lists the concurrency of the write phases, run in order;
	// nil means 1, 16, 64. Size and lists are measured after the first
	// phase, when the store holds exactly Objects pods that were each
	// created and updated once.
	Writers []int `json:"writers"`
	// Lists is how many full lists are timed; 0 means 50.
	Lists int `json:"lists"`
}

func (c Config) withDefaults() Config {
	if c.Objects <= 0 {
		c.Objects = 10000
	}
	if len(c.Writers) == 0 {
		c.Writers = []int{1, 16, 64}
	}
	if c.Lists <= 0 {
		c.Lists = 50
	}
	return c
}

// Phase is the outcome of one write phase.
type Phase struct {
	Writers       int     `json:"writers"`
	Creates       int     `json:"creates"`
	CreatesPerSec float64 `json:"creates_per_sec"`
	Updates       int     `json:"updates"`
	UpdatesPerSec float64 `json:"updates_per_sec"`
}

// Result is the outcome of a run.
type Result struct {
	Name       string  `json:"name"`
	Objects    int     `json:"objects"`
	ValueBytes int     `json:"value_bytes"`
	Phases     []Phase `json:"phases"`
	// ListObjects is how many objects each timed list returned.
	ListObjects int     `json:"list_objects"`
	ListP50ms   float64 `json:"list_p50_ms"`
	ListP99ms   float64 `json:"list_p99_ms"`
	// SizeBytes is the on-disk size after the first phase.
	SizeBytes int64 `json:"size_bytes"`
}

// Phase returns the phase run with the given number of writers.
func (r Result) Phase(writers int) (Phase, bool) {
	for _, p := range r.Phases {
		if p.Writers == writers {
			return p, true
		}
	}
	return Phase{}, false
}

// Run drives the workload against t. It does not close t.
func Run(ctx context.Context, t Target, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	res := Result{Name: cfg.Name, Objects: cfg.Objects}
	for i, w := range cfg.Writers {
		ns := fmt.Sprintf("bench-w%d", w)
		revs := make([]int64, cfg.Objects)
		start := time.Now()
		if err := parallel(ctx, w, cfg.Objects, func(j int) error {
			v := Pod(ns, podName(j), 0)
			if i == 0 && j == 0 {
				res.ValueBytes = len(v)
			}
			rev, err := t.Create(ctx, ns, podName(j), v)
			revs[j] = rev
			if err != nil {
				return fmt.Errorf("create %s/%s: %w", ns, podName(j), err)
			}
			return nil
		}); err != nil {
			return res, err
		}
		created := time.Since(start)
		start = time.Now()
		if err := parallel(ctx, w, cfg.Objects, func(j int) error {
			rev, err := t.Update(ctx, ns, podName(j), Pod(ns, podName(j), 1), revs[j])
			if err != nil {
				return fmt.Errorf("update %s/%s: %w", ns, podName(j), err)
			}
			revs[j] = rev
			return nil
		}); err != nil {
			return res, err
		}
		updated := time.Since(start)
		res.Phases = append(res.Phases, Phase{
			Writers:       w,
			Creates:       cfg.Objects,
			CreatesPerSec: float64(cfg.Objects) / created.Seconds(),
			Updates:       cfg.Objects,
			UpdatesPerSec: float64(cfg.Objects) / updated.Seconds(),
		})
		if i > 0 {
			continue
		}
		size, err := t.Size()
		if err != nil {
			return res, fmt.Errorf("measure size: %w", err)
		}
		res.SizeBytes = size
		lat := make([]time.Duration, cfg.Lists)
		for k := range lat {
			s := time.Now()
			n, err := t.List(ctx)
			if err != nil {
				return res, fmt.Errorf("list: %w", err)
			}
			lat[k] = time.Since(s)
			if n != cfg.Objects {
				return res, fmt.Errorf("list: got %d objects, want %d", n, cfg.Objects)
			}
			res.ListObjects = n
		}
		slices.Sort(lat)
		res.ListP50ms = ms(percentile(lat, 0.50))
		res.ListP99ms = ms(percentile(lat, 0.99))
	}
	return res, nil
}

// parallel runs fn(0..n-1) on w goroutines, each taking the next index.
func parallel(ctx context.Context, w, n int, fn func(int) error) error {
	var (
		mu    sync.Mutex
		next  int
		first error
		wg    sync.WaitGroup
	)
	for range w {
		wg.Go(func() {
			for {
				mu.Lock()
				if first != nil || next >= n || ctx.Err() != nil {
					mu.Unlock()
					return
				}
				j := next
				next++
				mu.Unlock()
				if err := fn(j); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	return first
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.5) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func podName(j int) string { return fmt.Sprintf("web-%06d", j) }

// DirSize sums the sizes of the regular files under dir, as ls -l shows
// them (preallocated files count in full).
func DirSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			total += fi.Size()
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("walk %s: %w", dir, err)
	}
	return total, nil
}

// FilesSize sums the sizes of the named files; missing files count as 0.
func FilesSize(paths ...string) (int64, error) {
	var total int64
	for _, p := range paths {
		fi, err := os.Stat(p)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("stat %s: %w", p, err)
		}
		total += fi.Size()
	}
	return total, nil
}

// Pod returns a realistic pod encoded as JSON, about 1.5 KB: labels, two
// containers with resources, and a status. gen distinguishes successive
// versions of the same pod so that every update changes the value.
func Pod(ns, name string, gen int) []byte {
	uid := fmt.Sprintf("%08x-%04x-4%03x-8%03x-%012x", rand.Uint32(), rand.Uint32()&0xffff,
		rand.Uint32()&0xfff, rand.Uint32()&0xfff, rand.Uint64()&0xffffffffffff)
	phase, ready := "Pending", "False"
	if gen > 0 {
		phase, ready = "Running", "True"
	}
	node := fmt.Sprintf("edge-%03d", len(name)*7%97)
	return fmt.Appendf(nil, `{"kind":"Pod","apiVersion":"v1","metadata":{"name":%q,"namespace":%q,"uid":%q,`+
		`"generation":%d,"creationTimestamp":"2026-11-21T02:00:00Z","labels":{"app":"web","pod-template-hash":"7c9f8d6b5c",`+
		`"tier":"frontend"},"annotations":{"tether.dev/revision":"%d"},"ownerReferences":[{"apiVersion":"apps/v1",`+
		`"kind":"ReplicaSet","name":"web-7c9f8d6b5c","uid":"5e0c7a52-3f1e-4b8e-9a55-1c2d3e4f5a6b","controller":true,`+
		`"blockOwnerDeletion":true}]},"spec":{"volumes":[{"name":"config","configMap":{"name":"web-config",`+
		`"defaultMode":420}}],"containers":[{"name":"web","image":"registry.example.com/shop/web:1.24.3",`+
		`"ports":[{"name":"http","containerPort":8080,"protocol":"TCP"}],"env":[{"name":"LOG_LEVEL","value":"info"}],`+
		`"resources":{"limits":{"cpu":"500m","memory":"256Mi"},"requests":{"cpu":"100m","memory":"64Mi"}},`+
		`"volumeMounts":[{"name":"config","mountPath":"/etc/web"}],"imagePullPolicy":"IfNotPresent"},`+
		`{"name":"metrics","image":"registry.example.com/shop/metrics-agent:0.9.1","ports":[{"name":"metrics",`+
		`"containerPort":9100,"protocol":"TCP"}],"resources":{"limits":{"cpu":"100m","memory":"64Mi"},`+
		`"requests":{"cpu":"20m","memory":"32Mi"}},"imagePullPolicy":"IfNotPresent"}],"restartPolicy":"Always",`+
		`"terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","nodeName":%q,"schedulerName":"default-scheduler",`+
		`"tolerations":[{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute",`+
		`"tolerationSeconds":300}]},"status":{"phase":%q,"conditions":[{"type":"Ready","status":%q,`+
		`"lastTransitionTime":"2026-11-21T02:00:0%dZ"},{"type":"PodScheduled","status":"True",`+
		`"lastTransitionTime":"2026-11-21T02:00:00Z"}],"hostIP":"10.20.0.7","podIP":"10.42.3.%d",`+
		`"startTime":"2026-11-21T02:00:00Z","qosClass":"Burstable"}}`,
		name, ns, uid, gen+1, gen, node, phase, ready, gen%10, len(name)%250)
}

// ParseWriters parses a comma-separated list of writer counts such as
// "1,16,64".
func ParseWriters(s string) ([]int, error) {
	var ws []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("parse writers %q: bad count %q", s, f)
		}
		ws = append(ws, n)
	}
	return ws, nil
}
