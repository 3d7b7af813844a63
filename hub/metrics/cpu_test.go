package metrics

import (
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/internal/usage"
)

// TestStoreCPU: what taking in the pushes of 2,000 nodes × 30 pods (two
// containers each) costs the hub's CPU at the default period of 15s,
// every value changing in every push. The payloads are encoded before
// the clock starts; the figure is the process's CPU time (user and
// system, garbage collection included) to decode and keep four rounds,
// one minute's worth.
func TestStoreCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("fills 60,000 pods")
	}
	const nodes, pods, rounds = 2000, 30, 4
	st := NewStore(Config{})
	rng := rand.New(rand.NewPCG(3, 4))
	now := time.Now()
	sessions := make([]*session, nodes)
	payloads := make([][][]byte, rounds)
	for n := range nodes {
		sessions[n] = newSession(fmt.Sprintf("edge-%04d", n))
		smp := sampleOf(now, 1e9)
		for p := range pods {
			smp.Pods = append(smp.Pods, usage.Pod{Namespace: fmt.Sprintf("team-%d", p%5), Name: fmt.Sprintf("web-%04d-%02d-7d9f8b6c5-x2k4q", n, p),
				Containers: []usage.Container{{Name: "app"}, {Name: "sidecar"}}})
		}
		var e usage.Encoder
		sessions[n].push(st, encode(t, &e, smp))
		for r := range rounds {
			smp.Time = smp.Time.Add(15 * time.Second)
			smp.Node.CPUNanoCores = uint64(rng.IntN(2e9))
			for p := range smp.Pods {
				for c := range smp.Pods[p].Containers {
					smp.Pods[p].Containers[c].Usage = usage.Resources{CPUNanoCores: uint64(rng.IntN(5e8)), MemoryWorkingSetBytes: uint64(64<<20 + rng.IntN(8<<20))}
				}
			}
			payloads[r] = append(payloads[r], encode(t, &e, smp))
		}
	}
	before := cpuTime(t)
	for r := range rounds {
		for n, s := range sessions {
			s.push(st, payloads[r][n])
		}
	}
	used := cpuTime(t) - before
	if st.Stats().Nodes != nodes {
		t.Fatalf("nodes with samples: %d", st.Stats().Nodes)
	}
	if got := st.Stats(); got.Refused != 0 {
		t.Fatalf("refused payloads: %+v", got)
	}
	t.Logf("a minute of pushes of %d nodes × %d pods took %v of CPU", nodes, pods, used)
	benchfmt.Report(t, benchfmt.Figure{Name: "metrics_store_cpu_2000_nodes_30_pods", Value: used.Seconds(), Unit: "cpu-s/min",
		Mode: benchfmt.Mode(false), Extra: []string{fmt.Sprintf("pushes_per_min=%d", nodes*rounds), "period_s=15"}})
}

func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
