package ingress

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/benchfmt"
)

var benchFull = flag.Bool("ingressbench.full", false,
	"run the ingress benchmark at full size (64 connections, 3 rounds of 10s per proxy and phase)")

// benchSize is one size of the benchmark.
type benchSize struct {
	conns  int           // concurrent keep-alive connections
	dur    time.Duration // of one round of one proxy
	rounds int           // rounds per proxy, alternating with the peer
}

// TestBenchIngressVsNginx measures the controller's proxy against nginx
// configured with the same routes, on the same two loopback backends, with
// the same load generator: N keep-alive HTTP/1.1 connections, each sending
// its next request when the last answer is read (requests/s at
// saturation), then a paced load of half nginx's rate on both (p99 at
// equal load). Rounds alternate between the two proxies, and the best
// round of each counts, so that noise from other work on the machine
// weighs on both alike. -ingressbench.full runs it at full size.
func TestBenchIngressVsNginx(t *testing.T) {
	nginx, err := exec.LookPath("nginx")
	if err != nil {
		t.Skip("needs nginx (Debian package nginx) as the peer")
	}
	size := benchSize{conns: 8, dur: 700 * time.Millisecond, rounds: 1}
	if *benchFull {
		size = benchSize{conns: 64, dur: 10 * time.Second, rounds: 3}
	}
	body := strings.Repeat("x", 256)
	var backends []string
	for i := 1; i <= 2; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("svc-%d ", i)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, name+body)
		})}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { srv.Close() })
		backends = append(backends, ln.Addr().String())
	}
	tether, tetherPID := startBenchController(t, backends)
	peer, nginxPID := startNginx(t, nginx, backends)

	// Both answer every route alike before any figure is taken.
	for _, addr := range []string{tether, peer} {
		for path, want := range map[string]string{"/a/x": "svc-1 ", "/b": "svc-2 ", "/other": "svc-1 "} {
			req, _ := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
			req.Host = "bench.example.com"
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("GET %s%s: %v", addr, path, err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.HasPrefix(string(b), want) {
				t.Fatalf("GET %s%s: %s %.20q, want %q", addr, path, resp.Status, b, want)
			}
		}
	}

	var best [2]loadResult
	var cpu [2]time.Duration // the proxies' CPU time at saturation
	var answered [2]int
	for r := 0; r < size.rounds; r++ {
		for i, addr := range []string{tether, peer} {
			pid := []int{tetherPID, nginxPID}[i]
			before := processCPU(pid)
			res, err := runLoad(addr, size.conns, size.dur, 0)
			if err != nil {
				t.Fatalf("load on %s: %v", addr, err)
			}
			cpu[i] += processCPU(pid) - before
			answered[i] += res.n
			if res.rps > best[i].rps {
				best[i] = res
			}
		}
	}
	rate := best[1].rps / 2
	var paced [2]loadResult
	for r := 0; r < size.rounds; r++ {
		for i, addr := range []string{tether, peer} {
			res, err := runLoad(addr, size.conns, size.dur, rate)
			if err != nil {
				t.Fatalf("paced load on %s: %v", addr, err)
			}
			if paced[i].p99 == 0 || res.p99 < paced[i].p99 {
				paced[i] = res
			}
		}
	}
	t.Logf("saturation, %d connections: tether %.0f req/s (p50 %v, p99 %v), nginx %.0f req/s (p50 %v, p99 %v), ratio %.2f",
		size.conns, best[0].rps, best[0].p50, best[0].p99, best[1].rps, best[1].p50, best[1].p99, best[0].rps/best[1].rps)
	// CPU time per request tells the proxies apart where requests/s
	// does not: on a machine busy with other work the load generator and
	// the backends wait for the CPU as much as the proxies do.
	t.Logf("CPU time per request at saturation: tether %.1f µs, nginx %.1f µs",
		float64(cpu[0].Microseconds())/float64(answered[0]), float64(cpu[1].Microseconds())/float64(answered[1]))
	t.Logf("paced at %.0f req/s: tether p50 %v p99 %v (%.0f req/s), nginx p50 %v p99 %v (%.0f req/s)",
		rate, paced[0].p50, paced[0].p99, paced[0].rps, paced[1].p50, paced[1].p99, paced[1].rps)
	mode := benchfmt.Mode(*benchFull)
	conns := fmt.Sprintf("connections=%d", size.conns)
	benchfmt.Report(t, benchfmt.Figure{Name: "ingress_rps", Value: best[0].rps, Unit: "req/s", Target: "ratio>=0.8",
		Peer: "nginx", PeerValue: best[1].rps, Mode: mode, Extra: []string{conns}})
	benchfmt.Report(t, benchfmt.Figure{Name: "ingress_p99", Value: float64(paced[0].p99) / 1e3, Unit: "µs",
		Peer: "nginx", PeerValue: float64(paced[1].p99) / 1e3, Mode: mode,
		Extra: []string{conns, fmt.Sprintf("rate=%.0f", rate)}})
}

// benchProxyEnv, set to the backends' addresses, makes the test binary
// the benchmark's tether proxy: a process of its own, as nginx is, so that
// neither shares its CPU with the load generator and the backends.
const benchProxyEnv = "TETHER_INGRESSBENCH_PROXY"

func TestMain(m *testing.M) {
	if backends := os.Getenv(benchProxyEnv); backends != "" {
		if err := runBenchProxy(strings.Split(backends, ",")); err != nil {
			fmt.Fprintln(os.Stderr, "ingress benchmark proxy:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runBenchProxy serves the benchmark's routes with the controller on a
// loopback port it prints, until its standard input closes: host
// bench.example.com, /a to svc-1, /b to svc-2, and svc-1 as the
// defaultBackend, the Services' cluster IPs dialled as the backends.
func runBenchProxy(backends []string) error {
	targets := map[string]string{"10.96.0.1:80": backends[0], "10.96.0.2:80": backends[1]}
	c, err := New(Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			real, ok := targets[addr]
			if !ok {
				return nil, fmt.Errorf("no backend at %s", addr)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, real)
		}})
	if err != nil {
		return err
	}
	s := testState()
	for _, svc := range s.services {
		c.UpsertService(svc)
	}
	for _, ss := range s.slices {
		for _, es := range ss {
			c.UpsertEndpointSlice(es)
		}
	}
	for _, cl := range s.classes {
		c.UpsertIngressClass(cl)
	}
	prefix := networkingv1.PathTypePrefix
	c.UpsertIngress(ingress("bench", "tether", 0, networkingv1.IngressSpec{
		DefaultBackend: ptr.To(be("svc-1")),
		Rules:          []networkingv1.IngressRule{rule("bench.example.com", path("/a", prefix, "svc-1"), path("/b", prefix, "svc-2"))},
	}))
	c.Rebuild()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	if prof := os.Getenv("TETHER_INGRESSBENCH_CPUPROFILE"); prof != "" {
		f, err := os.Create(prof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); cancel() }()
	fmt.Println(ln.Addr().String())
	return c.Serve(ctx, ln, nil)
}

// startBenchController runs the test binary as the benchmark's tether
// proxy (benchProxyEnv) and returns its address and process ID.
func startBenchController(t *testing.T, backends []string) (string, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), benchProxyEnv+"="+strings.Join(backends, ","))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the tether proxy: %v", err)
	}
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("the tether proxy's address: %v", err)
	}
	return strings.TrimSpace(addr), cmd.Process.Pid
}

// startNginx runs nginx with the benchmark's routes, proxying as the
// controller does: HTTP/1.1 to the backends over kept-alive connections,
// the Host kept and X-Forwarded-* set, no access log. It returns the
// address and the master process's ID.
func startNginx(t *testing.T, bin string, backends []string) (string, int) {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;"
	}
	conf := fmt.Sprintf(`%[1]s
worker_processes auto;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path %[2]s/body;
  proxy_temp_path %[2]s/proxy;
  fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi;
  scgi_temp_path %[2]s/scgi;
  keepalive_requests 1000000;
  upstream svc1 { server %[3]s; keepalive 64; }
  upstream svc2 { server %[4]s; keepalive 64; }
  proxy_http_version 1.1;
  proxy_set_header Connection "";
  proxy_set_header Host $http_host;
  proxy_set_header X-Forwarded-For $remote_addr;
  proxy_set_header X-Forwarded-Host $http_host;
  proxy_set_header X-Forwarded-Proto $scheme;
  server {
    listen %[5]s default_server;
    location / { proxy_pass http://svc1; }
  }
  server {
    listen %[5]s;
    server_name bench.example.com;
    location /a { proxy_pass http://svc1; }
    location /b { proxy_pass http://svc2; }
    location / { proxy_pass http://svc1; }
  }
}
`, user, dir, backends[0], backends[1], addr)
	file := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(file, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-e", filepath.Join(dir, "error.log"), "-c", file, "-p", dir, "-g", "daemon off;")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start nginx: %v", err)
	}
	// SIGTERM: the master stops its workers before it exits.
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			return addr, cmd.Process.Pid
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("nginx does not listen on %s: %v\n%s", addr, err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// loadResult is what one run of the load generator measured.
type loadResult struct {
	rps      float64
	n        int // requests answered
	p50, p99 time.Duration
}

// benchRequests are the requests the load cycles through: both paths
// of the host, and the defaultBackend.
var benchRequests = []string{
	"GET /a/item HTTP/1.1\r\nHost: bench.example.com\r\nUser-Agent: bench\r\n\r\n",
	"GET /b HTTP/1.1\r\nHost: bench.example.com\r\nUser-Agent: bench\r\n\r\n",
	"GET /other HTTP/1.1\r\nHost: bench.example.com\r\nUser-Agent: bench\r\n\r\n",
}

// runLoad keeps conns keep-alive connections to addr busy for dur: each
// sends a request when it has read the last answer, or, with rate > 0,
// at its share of rate requests per second. It returns the requests per
// second answered and their latencies' percentiles.
func runLoad(addr string, conns int, dur time.Duration, rate float64) (loadResult, error) {
	var wg sync.WaitGroup
	lat := make([][]time.Duration, conns)
	errs := make([]error, conns)
	start := time.Now()
	end := start.Add(dur)
	for w := 0; w < conns; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs[w] = err
				return
			}
			defer c.Close()
			br := bufio.NewReader(c)
			var every time.Duration
			next := time.Now()
			if rate > 0 {
				every = time.Duration(float64(conns) / rate * float64(time.Second))
				next = next.Add(time.Duration(w) * every / time.Duration(conns))
			}
			for i := w; ; i++ {
				if every > 0 {
					if d := time.Until(next); d > 0 {
						time.Sleep(d)
					}
					next = next.Add(every)
				}
				sent := time.Now()
				if sent.After(end) {
					return
				}
				if _, err := io.WriteString(c, benchRequests[i%len(benchRequests)]); err != nil {
					errs[w] = err
					return
				}
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					errs[w] = err
					return
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					errs[w] = fmt.Errorf("answer %d: %s, %v", i, resp.Status, err)
					return
				}
				lat[w] = append(lat[w], time.Since(sent))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return loadResult{}, err
	}
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return loadResult{}, errors.New("no request answered")
	}
	slices.Sort(all)
	return loadResult{n: len(all), rps: float64(len(all)) / elapsed.Seconds(), p50: all[len(all)/2], p99: all[len(all)*99/100]}, nil
}

// processCPU is the CPU time (user and system) used so far by process pid
// and its children that still run (nginx's workers), from /proc; 0 where
// /proc cannot tell.
func processCPU(pid int) time.Duration {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var ticks int64
	for _, e := range ents {
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime stime: fields 14 and 15.
		s := string(st)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 13 || e.Name() != strconv.Itoa(pid) && f[1] != strconv.Itoa(pid) {
			continue
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		ticks += utime + stime
	}
	// USER_HZ is 100 on Linux.
	return time.Duration(ticks) * 10 * time.Millisecond
}
