package containerd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tether-edge/tether/edge"
)

// ensureProbes starts the probe loop of a running instance once.
func (r *Runtime) ensureProbes(p *pod, cs *ctr, c *corev1.Container) {
	p.mu.Lock()
	inst := cs.cur
	if inst == nil || !inst.running || inst.stop != nil {
		p.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	inst.stop = cancel
	if c.StartupProbe == nil && c.ReadinessProbe == nil && (!cs.isInit || cs.sidecar) {
		inst.ready = true
	}
	p.mu.Unlock()
	c = c.DeepCopy()
	if c.StartupProbe == nil && c.LivenessProbe == nil && c.ReadinessProbe == nil {
		return
	}
	go r.probeLoop(ctx, p, cs, inst, c)
}

// probeLoop runs the startup probe until it succeeds, then the liveness
// and readiness probes, each on its own schedule.
func (r *Runtime) probeLoop(ctx context.Context, p *pod, cs *ctr, inst *instance, c *corev1.Container) {
	if c.StartupProbe != nil {
		ok := r.probeUntil(ctx, p, cs, inst, c.StartupProbe, "Startup")
		if ctx.Err() != nil {
			return
		}
		if !ok {
			r.killForProbe(p, cs, inst, c, "startup")
			return
		}
		p.mu.Lock()
		inst.startupDone = true
		if c.ReadinessProbe == nil {
			inst.ready = true
		}
		p.mu.Unlock()
		r.changed(p.uid)
	}
	if c.ReadinessProbe != nil {
		go r.readinessLoop(ctx, p, cs, inst, c.ReadinessProbe)
	}
	if c.LivenessProbe != nil {
		if !r.probeUntil(ctx, p, cs, inst, c.LivenessProbe, "Liveness") && ctx.Err() == nil {
			r.killForProbe(p, cs, inst, c, "liveness")
		}
	}
}

func probeTiming(pr *corev1.Probe) (initial, period, timeout time.Duration, success, failure int32) {
	initial = time.Duration(pr.InitialDelaySeconds) * time.Second
	period = time.Duration(max(pr.PeriodSeconds, 1)) * time.Second
	timeout = time.Duration(max(pr.TimeoutSeconds, 1)) * time.Second
	return initial, period, timeout, max(pr.SuccessThreshold, 1), max(pr.FailureThreshold, 1)
}

// probeUntil runs a probe on its period. For a startup probe it returns
// true at the first success; for liveness it returns false after
// failureThreshold consecutive failures (and never returns true).
func (r *Runtime) probeUntil(ctx context.Context, p *pod, cs *ctr, inst *instance, pr *corev1.Probe, kind string) bool {
	startup := kind == "Startup"
	initial, period, timeout, _, failure := probeTiming(pr)
	if !sleepCtx(ctx, initial) {
		return false
	}
	fails := int32(0)
	for {
		err := r.probe(ctx, p, inst, &pr.ProbeHandler, timeout)
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			fails = 0
			if startup {
				return true
			}
		} else {
			fails++
			r.log.Debug("probe failed", "pod", p.key(), "instance", inst.id, "err", err, "failures", fails)
			r.event(p, cs, true, "Unhealthy", "%s probe failed: %v", kind, err)
			if fails >= failure {
				return false
			}
		}
		if !sleepCtx(ctx, period) {
			return false
		}
	}
}

func (r *Runtime) readinessLoop(ctx context.Context, p *pod, cs *ctr, inst *instance, pr *corev1.Probe) {
	initial, period, timeout, success, failure := probeTiming(pr)
	if !sleepCtx(ctx, initial) {
		return
	}
	var oks, fails int32
	for {
		err := r.probe(ctx, p, inst, &pr.ProbeHandler, timeout)
		if ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		was := inst.ready
		if err == nil {
			oks, fails = oks+1, 0
			if oks >= success {
				inst.ready = true
			}
		} else {
			oks, fails = 0, fails+1
			if fails >= failure {
				inst.ready = false
			}
		}
		now := inst.ready
		p.mu.Unlock()
		if err != nil {
			r.event(p, cs, true, "Unhealthy", "Readiness probe failed: %v", err)
		}
		if was != now {
			r.changed(p.uid)
		}
		if !sleepCtx(ctx, period) {
			return
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// killForProbe stops an instance whose liveness or startup probe failed;
// the restart policy then decides on a new instance.
func (r *Runtime) killForProbe(p *pod, cs *ctr, inst *instance, c *corev1.Container, which string) {
	p.mu.Lock()
	inst.killReason = fmt.Sprintf("Container %s failed %s probe, will be restarted", c.Name, which)
	spec := p.spec
	p.mu.Unlock()
	r.log.Info("container failed its probe; killing it", "pod", p.key(), "container", c.Name, "probe", which)
	r.event(p, cs, false, "Killing", "Container %s failed %s probe, will be restarted", c.Name, which)
	grace := 30 * time.Second
	if spec != nil && spec.Spec.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*spec.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	pr := c.LivenessProbe
	if which == "startup" {
		pr = c.StartupProbe
	}
	if pr != nil && pr.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pr.TerminationGracePeriodSeconds) * time.Second
	}
	r.stopInstance(context.Background(), p, spec, cs, grace)
}

// probe runs one probe attempt.
func (r *Runtime) probe(ctx context.Context, p *pod, inst *instance, h *corev1.ProbeHandler, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case h.Exec != nil:
		return r.execProbe(ctx, inst, h.Exec.Command)
	case h.HTTPGet != nil:
		return r.httpGet(ctx, p, h.HTTPGet)
	case h.TCPSocket != nil:
		host, port, err := r.target(p, h.TCPSocket.Host, h.TCPSocket.Port)
		if err != nil {
			return err
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, port))
		if err != nil {
			return err
		}
		return conn.Close()
	case h.GRPC != nil:
		return r.grpcProbe(ctx, p, h.GRPC)
	}
	return fmt.Errorf("probe has no handler")
}

// grpcProbe asks the pod's gRPC health service (grpc.health.v1.Health)
// for the probe's service; only SERVING passes, as with the kubelet.
func (r *Runtime) grpcProbe(ctx context.Context, p *pod, g *corev1.GRPCAction) error {
	host, port, err := r.target(p, "", intstr.FromInt32(g.Port))
	if err != nil {
		return err
	}
	addr := net.JoinHostPort(host, port)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("failed to connect service %q: %w", addr, err)
	}
	defer conn.Close()
	service := ""
	if g.Service != nil {
		service = *g.Service
	}
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("timeout: health rpc did not complete within the probe's timeout: %w", err)
		}
		return fmt.Errorf("failed to connect service %q: %w", addr, err)
	}
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("service unhealthy (responded with %q)", resp.GetStatus().String())
	}
	return nil
}

// target resolves a probe's host (the pod's IP by default) and port
// (named ports included).
func (r *Runtime) target(p *pod, host string, port intstr.IntOrString) (string, string, error) {
	p.mu.Lock()
	spec := p.spec
	if host == "" && len(p.ips) > 0 {
		host = p.ips[0].String()
	}
	p.mu.Unlock()
	if host == "" {
		return "", "", fmt.Errorf("the pod has no address")
	}
	if port.Type == intstr.Int {
		return host, strconv.Itoa(port.IntValue()), nil
	}
	if spec != nil {
		for _, c := range append(append([]corev1.Container{}, spec.Spec.InitContainers...), spec.Spec.Containers...) {
			for _, cp := range c.Ports {
				if cp.Name == port.StrVal {
					return host, strconv.Itoa(int(cp.ContainerPort)), nil
				}
			}
		}
	}
	if n, err := strconv.Atoi(port.StrVal); err == nil {
		return host, strconv.Itoa(n), nil
	}
	return "", "", fmt.Errorf("no port named %q", port.StrVal)
}

var probeClient = &http.Client{
	Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // probes do not verify, as upstream
		DisableKeepAlives: true,
	},
	CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return http.ErrUseLastResponse
		}
		return nil
	},
}

func (r *Runtime) httpGet(ctx context.Context, p *pod, g *corev1.HTTPGetAction) error {
	return r.httpRequest(ctx, p, g, "probe")
}

// userAgent is the kubelet's User-Agent for purpose ("probe" or
// "lifecycle"): kube-probe/<major>.<minor>.
func userAgent(purpose string) string {
	v := strings.TrimPrefix(edge.KubernetesVersion, "v")
	if major, rest, ok := strings.Cut(v, "."); ok {
		minor, _, _ := strings.Cut(rest, ".")
		v = major + "." + minor
	}
	return "kube-" + purpose + "/" + v
}

// httpRequest sends a probe's or hook's GET; a status outside 200-399
// is an httpStatusError.
func (r *Runtime) httpRequest(ctx context.Context, p *pod, g *corev1.HTTPGetAction, purpose string) error {
	host, port, err := r.target(p, g.Host, g.Port)
	if err != nil {
		return err
	}
	scheme := strings.ToLower(string(g.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	path := g.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	u := &url.URL{Scheme: scheme, Host: net.JoinHostPort(host, port)}
	u, err = u.Parse(path)
	if err != nil {
		return fmt.Errorf("probe URL: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", userAgent(purpose))
	for _, h := range g.HTTPHeaders {
		if strings.EqualFold(h.Name, "Host") {
			req.Host = h.Value
			continue
		}
		req.Header.Add(h.Name, h.Value)
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 10<<10))
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 400 {
		return httpStatusError(resp.StatusCode)
	}
	return nil
}

// httpStatusError is an HTTP answer whose status fails a probe.
type httpStatusError int

func (e httpStatusError) Error() string {
	return fmt.Sprintf("HTTP probe failed with statuscode: %d", int(e))
}

// execProbe runs an exec probe's command in the instance. A command that
// exits with another status than 0 fails the probe with its output as
// the reason, as the kubelet reports it ("Liveness probe failed: <output>").
func (r *Runtime) execProbe(ctx context.Context, inst *instance, cmd []string) error {
	out := &cappedBuffer{max: maxProbeOutput}
	code, err := r.execInstance(ctx, inst, cmd, edge.Streams{Stdout: out, Stderr: out})
	if ctx.Err() != nil {
		return fmt.Errorf("command %q timed out", strings.Join(cmd, " "))
	}
	if err != nil {
		return err
	}
	if code != 0 {
		return errors.New(out.String())
	}
	return nil
}

// maxProbeOutput is how much of a probe's or hook's output is kept, as
// the kubelet's 10 KiB.
const maxProbeOutput = 10 << 10

// cappedBuffer keeps the first max bytes written to it.
type cappedBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n := b.max - len(b.buf); n > 0 {
		b.buf = append(b.buf, p[:min(n, len(p))]...)
	}
	return len(p), nil
}

func (b *cappedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
