package hub_test

import (
	"context"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/store/postgres/pgtest"
)

var hubScaleFull = flag.Bool("hubscale.full", false, "run the hub scaling benchmark at full length (20s of creates for each number of hubs)")

// scaleRun is what one number of hubs did in the measured window.
type scaleRun struct {
	hubs    int
	creates int           // acknowledged creates that ended in the window
	window  time.Duration // its length
	p99     time.Duration // of creates that started in it
	// CPU time spent in the window by the hub processes together, by the
	// PostgreSQL server (postmaster and backends), and by the test
	// process (the clients).
	hubCPU, pgCPU, clientCPU time.Duration
	// busy is the share of the machine's CPU time that was not idle in
	// the window, and other the CPU time of everything else on it (the
	// busy time less that of the hubs, PostgreSQL and the clients).
	busy  float64
	other time.Duration
	load  string // load average at the window's end
}

func (r scaleRun) rate() float64 { return float64(r.creates) / r.window.Seconds() }

// perK is CPU milliseconds per 1,000 creates.
func (r scaleRun) perK(d time.Duration) float64 {
	return float64(d) / 1e6 * 1000 / float64(r.creates)
}

// TestHubsCreateScaling measures how API throughput grows with the number
// of hubs on one PostgreSQL database: for 1, 2 and 3 hub processes, each
// set on a fresh database of one throw-away cluster, 32 client-go clients
// spread evenly over the hubs create ConfigMaps for a fixed time. It
// reports creates/s, the p99 create latency and the CPU time the hubs,
// PostgreSQL and the clients spent per 1,000 creates, and checks that
// every acknowledged create is stored. Short by default (1.5s of creates
// for each number of hubs); -hubscale.full creates for 20s.
func TestHubsCreateScaling(t *testing.T) {
	warm, window := 500*time.Millisecond, 1500*time.Millisecond
	if *hubScaleFull {
		warm, window = 3*time.Second, 20*time.Second
	}
	const clients = 32
	pg := pgtest.Start(t)
	secret := hubtest.SecretKeyFile(t)
	var runs []scaleRun
	for n := 1; n <= 3; n++ {
		t.Run(fmt.Sprintf("hubs=%d", n), func(t *testing.T) {
			dsn := pg.NewDatabase()
			hubs := hubtest.StartTogether(t, n, append([]string{"--datastore", dsn, "--secret-key-file", secret}, apiOnly...)...)
			r := measureCreates(t, hubs, dsn, clients, warm, window)
			// Stop the hubs together rather than one after another at
			// the end of the subtest.
			var wg sync.WaitGroup
			for _, h := range hubs {
				wg.Go(h.Stop)
			}
			wg.Wait()
			t.Logf("%d hubs: %.0f creates/s, p99 %v; CPU ms per 1,000 creates: hubs %.0f, postgres %.0f, clients %.0f, other processes %.0f; machine %.0f%% busy (load %s)",
				n, r.rate(), r.p99.Round(100*time.Microsecond), r.perK(r.hubCPU), r.perK(r.pgCPU), r.perK(r.clientCPU), r.perK(r.other), 100*r.busy, r.load)
			runs = append(runs, r)
		})
	}
	if len(runs) != 3 {
		return
	}
	mode := benchfmt.Mode(*hubScaleFull)
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	one := runs[0]
	for _, r := range runs {
		extra := []string{"clients=" + strconv.Itoa(clients), "window=" + window.String(),
			fmt.Sprintf("postgres_cpu_ms_per_1k=%.0f", r.perK(r.pgCPU)),
			fmt.Sprintf("client_cpu_ms_per_1k=%.0f", r.perK(r.clientCPU)),
			fmt.Sprintf("other_cpu_ms_per_1k=%.0f", r.perK(r.other)),
			fmt.Sprintf("machine_busy=%.2f", r.busy), "cpus=" + strconv.Itoa(runtime.NumCPU()),
			"load=" + strings.ReplaceAll(r.load, " ", ",")}
		figs := []benchfmt.Figure{
			{Name: fmt.Sprintf("hubs_creates_%d", r.hubs), Value: r.rate(), Unit: "creates/s", PeerValue: one.rate()},
			{Name: fmt.Sprintf("hubs_create_p99_%d", r.hubs), Value: ms(r.p99), Unit: "ms", PeerValue: ms(one.p99)},
			{Name: fmt.Sprintf("hubs_create_cpu_%d", r.hubs), Value: r.perK(r.hubCPU), Unit: "cpu-ms/1k-creates", PeerValue: one.perK(one.hubCPU)},
		}
		for _, f := range figs {
			if r.hubs > 1 {
				f.Peer = "one_hub"
			}
			f.Mode, f.Extra = mode, extra
			benchfmt.Report(t, f)
		}
	}
}

// measureCreates runs clients creating ConfigMaps through the hubs, spread
// evenly, for warm and then window, and measures the window. Every create
// must succeed; at the end every acknowledged one must be listed.
func measureCreates(t *testing.T, hubs []*hubtest.Hub, dsn string, clients int, warm, window time.Duration) scaleRun {
	t.Helper()
	postmaster, err := postmasterOf(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cs := make([]kubernetes.Interface, len(hubs))
	for i, h := range hubs {
		cs[i] = clientOf(t, h)
	}
	// Four values of 64 bytes, as in the custom resource benchmark.
	data := map[string]string{}
	for i := range 4 {
		data[fmt.Sprintf("key%d", i)] = strings.Repeat(string(rune('a'+i)), 64)
	}
	scaleLabels := map[string]string{"bench": "hubscale"}
	type sample struct {
		hub, pg, self time.Duration
		busy, total   uint64
	}
	take := func() sample {
		var s sample
		for _, h := range hubs {
			d, err := h.CPU()
			if err != nil {
				t.Error(err)
			}
			s.hub += d
		}
		d, err := treeCPU(postmaster)
		if err != nil {
			t.Error(err)
		}
		s.pg = d
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Error(err)
		}
		s.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		s.busy, s.total = machineCPU(t)
		return s
	}

	ctx, cancel := context.WithTimeout(t.Context(), warm+window+time.Minute)
	defer cancel()
	begin := time.Now().Add(warm)
	end := begin.Add(window)
	var (
		mu      sync.Mutex
		lat     []time.Duration
		done    int // creates that ended in the window
		acked   int
		firstEr error
		wg      sync.WaitGroup
	)
	for c := range clients {
		wg.Go(func() {
			client := cs[c%len(cs)].CoreV1().ConfigMaps("default")
			var mine []time.Duration
			n, in := 0, 0
			for ; time.Now().Before(end); n++ {
				start := time.Now()
				_, err := client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("c%d-%d", c, n), Labels: scaleLabels}, Data: data},
					metav1.CreateOptions{})
				took := time.Since(start)
				if err != nil {
					mu.Lock()
					if firstEr == nil {
						firstEr = fmt.Errorf("client %d through hub %d: create %d: %w", c, c%len(cs), n, err)
					}
					mu.Unlock()
					cancel()
					return
				}
				if !start.Before(begin) {
					mine = append(mine, took)
				}
				if at := start.Add(took); !at.Before(begin) && at.Before(end) {
					in++
				}
			}
			mu.Lock()
			lat, done, acked = append(lat, mine...), done+in, acked+n
			mu.Unlock()
		})
	}
	time.Sleep(time.Until(begin))
	s0 := take()
	time.Sleep(time.Until(end))
	s1 := take()
	wg.Wait()
	if firstEr != nil {
		t.Fatal(firstEr)
	}
	if len(lat) == 0 || done == 0 {
		t.Fatalf("no create ended in the %v window", window)
	}
	list, err := cs[len(cs)-1].CoreV1().ConfigMaps("default").List(t.Context(), metav1.ListOptions{LabelSelector: "bench=hubscale"})
	if err != nil {
		t.Fatal(err)
	}
	if stored := len(list.Items); stored != acked {
		t.Fatalf("%d ConfigMaps stored, %d creates acknowledged", stored, acked)
	}
	r := scaleRun{hubs: len(hubs), creates: done, window: window, p99: pct(lat, 0.99),
		hubCPU: s1.hub - s0.hub, pgCPU: s1.pg - s0.pg, clientCPU: s1.self - s0.self}
	if s1.total > s0.total {
		r.busy = float64(s1.busy-s0.busy) / float64(s1.total-s0.total)
	}
	r.other = time.Duration(s1.busy-s0.busy)*clockTick - r.hubCPU - r.pgCPU - r.clientCPU
	r.load = loadavg()
	return r
}

// clockTick is the unit of the CPU times in /proc (USER_HZ), 1/100 s on
// every platform Go supports.
const clockTick = 10 * time.Millisecond

// procStat reads a process's parent and CPU times from /proc/PID/stat:
// its own user and system time, and that of its children it has reaped.
func procStat(pid int) (ppid int, self, reaped time.Duration, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	// The command name may hold spaces; the fields after it are fixed:
	// state, ppid, ... utime (14th field of the line), stime, cutime,
	// cstime.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 15 {
		return 0, 0, 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	var n [5]int64
	for i, idx := range []int{1, 11, 12, 13, 14} {
		if n[i], err = strconv.ParseInt(f[idx], 10, 64); err != nil {
			return 0, 0, 0, fmt.Errorf("parse /proc/%d/stat: %w", pid, err)
		}
	}
	return int(n[0]), time.Duration(n[1]+n[2]) * clockTick, time.Duration(n[3]+n[4]) * clockTick, nil
}

// postmasterOf finds the PostgreSQL server process of a pgtest DSN: the
// one started with the data directory under the DSN's socket directory.
func postmasterOf(dsn string) (int, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return 0, fmt.Errorf("parse the datastore DSN: %w", err)
	}
	data := filepath.Join(u.Query().Get("host"), "data")
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		for i := range len(args) - 1 {
			if args[i] == "-D" && filepath.Clean(args[i+1]) == data {
				return strconv.Atoi(filepath.Base(filepath.Dir(p)))
			}
		}
	}
	return 0, fmt.Errorf("no PostgreSQL server of %s running", data)
}

// treeCPU is the CPU time of a process and its children, the reaped ones
// included.
func treeCPU(pid int) (time.Duration, error) {
	_, self, reaped, err := procStat(pid)
	if err != nil {
		return 0, fmt.Errorf("read the CPU time of process %d: %w", pid, err)
	}
	total := self + reaped
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		child, err := strconv.Atoi(filepath.Base(p))
		if err != nil {
			continue
		}
		// A process that ended since the glob is gone: its time is in
		// the parent's reaped time at the next reading.
		if ppid, cself, creaped, err := procStat(child); err == nil && ppid == pid {
			total += cself + creaped
		}
	}
	return total, nil
}

// machineCPU reads the machine's CPU time from /proc/stat in clock ticks:
// not idle (iowait counts as idle), and in all.
func machineCPU(t *testing.T) (busy, total uint64) {
	t.Helper()
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		t.Fatalf("unexpected /proc/stat: %q", line)
	}
	// user nice system idle iowait irq softirq steal: guest time is
	// already in user time.
	for i, s := range f[1:9] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("parse /proc/stat: %v", err)
		}
		total += v
		if i != 3 && i != 4 {
			busy += v
		}
	}
	return busy, total
}
