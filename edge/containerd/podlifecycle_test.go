package containerd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/testbench/images"
)

// eventLog collects the events a runtime reports.
type eventLog struct {
	mu     sync.Mutex
	events []edge.PodEvent
}

func (l *eventLog) add(ev edge.PodEvent) {
	l.mu.Lock()
	l.events = append(l.events, ev)
	l.mu.Unlock()
}

// find returns the events of reason whose message contains substr.
func (l *eventLog) find(reason, substr string) []edge.PodEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []edge.PodEvent
	for _, ev := range l.events {
		if ev.Reason == reason && strings.Contains(ev.Message, substr) {
			out = append(out, ev)
		}
	}
	return out
}

func (l *eventLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, ev := range l.events {
		b.WriteString(ev.Reason + ": " + ev.Message + "\n")
	}
	return b.String()
}

func recordEvents(r *Runtime) *eventLog {
	l := &eventLog{}
	r.ReportEvents(l.add)
	return l
}

// TestHostPathTypeChecks: the hostPath types are checked with the
// kubelet's messages, nothing is created for the types that only check,
// and the *OrCreate types create a directory 0755 or an empty file 0644.
func TestHostPathTypeChecks(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	missing := filepath.Join(dir, "missing")
	for _, tc := range []struct {
		typ     corev1.HostPathType
		path    string
		wantErr string
	}{
		{corev1.HostPathUnset, missing, ""},
		{corev1.HostPathDirectory, dir, ""},
		{corev1.HostPathDirectory, missing, "hostPath type check failed: " + missing + " is not a directory"},
		{corev1.HostPathDirectory, file, "hostPath type check failed: " + file + " is not a directory"},
		{corev1.HostPathFile, file, ""},
		{corev1.HostPathFile, missing, "hostPath type check failed: " + missing + " is not a file"},
		{corev1.HostPathFile, dir, "hostPath type check failed: " + dir + " is not a file"},
		{corev1.HostPathSocket, sock, ""},
		{corev1.HostPathSocket, file, "hostPath type check failed: " + file + " is not a socket file"},
		{corev1.HostPathCharDev, "/dev/null", ""},
		{corev1.HostPathCharDev, missing, "hostPath type check failed: " + missing + " is not a character device"},
		{corev1.HostPathBlockDev, "/dev/null", "hostPath type check failed: /dev/null is not a block device"},
		{corev1.HostPathDirectoryOrCreate, file, "hostPath type check failed: " + file + " is not a directory"},
		{corev1.HostPathFileOrCreate, dir, "hostPath type check failed: " + dir + " is not a file"},
		{"Nonsense", dir, "Nonsense is an invalid volume type"},
	} {
		typ := tc.typ
		err := hostPath(&corev1.HostPathVolumeSource{Path: tc.path, Type: &typ})
		if got := errText(err); got != tc.wantErr {
			t.Errorf("%s %s: error %q, want %q", tc.typ, tc.path, got, tc.wantErr)
		}
	}
	if _, err := os.Lstat(missing); !os.IsNotExist(err) {
		t.Errorf("a check created %s (%v)", missing, err)
	}

	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	newDir := filepath.Join(dir, "made", "dir")
	typ := corev1.HostPathDirectoryOrCreate
	if err := hostPath(&corev1.HostPathVolumeSource{Path: newDir, Type: &typ}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(newDir); err != nil || !st.IsDir() || st.Mode().Perm() != 0o755 {
		t.Errorf("DirectoryOrCreate made %v (%v), want a directory 0755", st.Mode(), err)
	}
	newFile := filepath.Join(dir, "made", "file")
	typ = corev1.HostPathFileOrCreate
	if err := hostPath(&corev1.HostPathVolumeSource{Path: newFile, Type: &typ}); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(newFile); err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o644 || st.Size() != 0 {
		t.Errorf("FileOrCreate made %v (%v), want an empty file 0644", st.Mode(), err)
	}
	// As upstream, FileOrCreate makes no parent directories.
	orphan := filepath.Join(dir, "nodir", "file")
	if err := hostPath(&corev1.HostPathVolumeSource{Path: orphan, Type: &typ}); err == nil {
		t.Errorf("FileOrCreate of %s in a missing directory succeeded", orphan)
	}
}

// TestVolumeWaitsForItsSource: a volume whose Secret or ConfigMap does not
// exist fails with the kubelet's FailedMount message and an error the
// agent waits out (ContainerCreating); optional ones are set up empty; a
// missing key is reported as upstream; an object the agent's watch does
// not know yet is waited for without an event.
func TestVolumeWaitsForItsSource(t *testing.T) {
	src := newFakeSources()
	r := &Runtime{src: src}
	events := recordEvents(r)
	p := &pod{uid: "u1", namespace: "shop", name: "web", dir: t.TempDir()}
	yes := true
	vol := func(name string, s corev1.VolumeSource) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: s}
	}
	spec := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "shop", UID: "u1"}}
	spec.Spec.Volumes = []corev1.Volume{
		vol("v", corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "later"}}),
		vol("cm", corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "conf"}}}),
		vol("opt", corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "nothere"}, Optional: &yes}}),
	}
	err := r.syncVolumes(context.Background(), p, spec)
	if !errors.Is(err, edge.ErrVolumeNotReady) {
		t.Fatalf("syncVolumes: %v, want an error wrapping ErrVolumeNotReady", err)
	}
	for _, want := range []string{
		`MountVolume.SetUp failed for volume "v" : secret "later" not found`,
		`MountVolume.SetUp failed for volume "cm" : configmap "conf" not found`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
		if evs := events.find("FailedMount", want); len(evs) != 1 || !evs[0].Warning || evs[0].FieldPath != "" {
			t.Errorf("FailedMount events %q: %+v, want one Warning about the pod\n%s", want, evs, events)
		}
	}
	if _, err := os.Stat(filepath.Join(p.dir, "volumes", "opt", "..data")); err != nil {
		t.Errorf("the optional volume of a missing ConfigMap was not set up empty: %v", err)
	}

	// Items naming keys the objects lack.
	src.secrets["shop/later"] = &corev1.Secret{Data: map[string][]byte{"a": []byte("1")}}
	src.cms["shop/conf"] = &corev1.ConfigMap{Data: map[string]string{"a": "1"}}
	spec.Spec.Volumes[0].Secret.Items = []corev1.KeyToPath{{Key: "b", Path: "b"}}
	spec.Spec.Volumes[1].ConfigMap.Items = []corev1.KeyToPath{{Key: "b", Path: "b"}}
	spec.Spec.Volumes = spec.Spec.Volumes[:2]
	err = r.syncVolumes(context.Background(), p, spec)
	for _, want := range []string{
		`MountVolume.SetUp failed for volume "v" : couldn't find key b in Secret shop/later`,
		`MountVolume.SetUp failed for volume "cm" : configmap references non-existent config key: b`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v lacks %q", err, want)
		}
	}

	// Not known yet: wait, but say nothing.
	before := len(events.find("FailedMount", ""))
	r.src = notReadySources{}
	if err := r.syncVolumes(context.Background(), p, spec); !errors.Is(err, edge.ErrVolumeNotReady) {
		t.Errorf("syncVolumes with the watch not synced: %v, want ErrVolumeNotReady", err)
	}
	if after := len(events.find("FailedMount", "")); after != before {
		t.Errorf("%d FailedMount events for objects the agent does not know yet", after-before)
	}
}

// notReadySources knows no object yet.
type notReadySources struct{ edge.Sources }

func (notReadySources) Secret(ns, name string) (*corev1.Secret, error) {
	return nil, edge.ErrSourceNotReady
}

func (notReadySources) ConfigMap(ns, name string) (*corev1.ConfigMap, error) {
	return nil, edge.ErrSourceNotReady
}

// TestHTTPProbeAndHookResults: an HTTP probe fails on a status outside
// 200-399 with the kubelet's output, while an HTTP lifecycle hook fails
// only when no response comes, with the kubelet's hook message.
func TestHTTPProbeAndHookResults(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		code, _ := strconv.Atoi(strings.TrimPrefix(req.URL.Path, "/"))
		w.WriteHeader(code)
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	r := &Runtime{}
	p := &pod{uid: "u2", namespace: "shop", name: "web", ips: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}
	get := func(path string, port int) *corev1.HTTPGetAction {
		return &corev1.HTTPGetAction{Path: path, Port: intstr.FromInt(port)}
	}
	ctx := context.Background()
	if err := r.httpGet(ctx, p, get("/200", port)); err != nil {
		t.Errorf("probe of 200: %v", err)
	}
	if err := r.httpGet(ctx, p, get("/500", port)); errText(err) != "HTTP probe failed with statuscode: 500" {
		t.Errorf("probe of 500: %v", err)
	}
	if err := r.httpHook(ctx, p, get("/500", port)); err != nil {
		t.Errorf("hook answered 500 failed: %v", err)
	}
	if got, want := userAgent("probe"), "kube-probe/"+strings.Join(strings.SplitN(strings.TrimPrefix(edge.KubernetesVersion, "v"), ".", 3)[:2], "."); got != want {
		t.Errorf("probe User-Agent %q, want %q", got, want)
	}
	if got := userAgent("lifecycle"); !strings.HasPrefix(got, "kube-lifecycle/1.") || strings.Count(got, ".") != 1 {
		t.Errorf("hook User-Agent %q, want kube-lifecycle/<major>.<minor>", got)
	}
	closed := freePort(t)
	c := &corev1.Container{Name: "app"}
	msg, err := r.runHook(ctx, p, nil, c, &corev1.LifecycleHandler{HTTPGet: get("/start", closed)})
	if err == nil {
		t.Fatal("a hook whose server is not there succeeded")
	}
	want := `HTTP lifecycle hook (/start) for Container "app" in Pod "web_shop(u2)" failed - error: Get "http://127.0.0.1:` +
		strconv.Itoa(closed) + `/start": dial tcp 127.0.0.1:` + strconv.Itoa(closed) + `: connect: connection refused`
	if msg != want {
		t.Errorf("hook message:\n%s\nwant:\n%s", msg, want)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestLifecycleOnContainerd runs containers whose hooks and probes
// succeed and fail, on a real containerd.
func TestLifecycleOnContainerd(t *testing.T) {
	e := newTestRuntime(t, "10.231.9.0/24")
	events := recordEvents(e.rt)
	ctx := context.Background()
	waitEvent := func(t *testing.T, reason, substr string) edge.PodEvent {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			if evs := events.find(reason, substr); len(evs) > 0 {
				return evs[0]
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("no %s event with %q; events:\n%s", reason, substr, events)
		return edge.PodEvent{}
	}
	sh := func(script string) []string { return []string{"/bin/sh", "-c", script} }

	t.Run("postStart runs before Running", func(t *testing.T) {
		pod := testPod("hooked", corev1.Container{
			Name: "app", Image: images.Sleeper,
			Lifecycle: &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{
				Exec: &corev1.ExecAction{Command: sh("sleep 1; echo done > /tmp/hook")},
			}},
		})
		synced := make(chan error, 1)
		go func() { synced <- e.rt.SyncPod(ctx, pod, e.net) }()
		sawHook := false
	watch:
		for {
			select {
			case err := <-synced:
				if err != nil {
					t.Fatal(err)
				}
				break watch
			case <-time.After(20 * time.Millisecond):
			}
			st, err := e.rt.PodStatus(ctx, pod.UID)
			if err != nil {
				continue
			}
			c := containerStatus(st, "app")
			switch {
			case c.State == edge.ContainerRunning:
				var out strings.Builder
				if _, err := e.rt.Exec(ctx, pod.UID, "app", []string{"cat", "/tmp/hook"}, edge.Streams{Stdout: &out}); err != nil || out.String() != "done\n" {
					t.Fatalf("reported Running before its postStart hook ended (hook output %q, %v)", out.String(), err)
				}
			case c.State == edge.ContainerWaiting && c.ID != "":
				if c.Reason != "ContainerCreating" {
					t.Errorf("during the hook: %+v, want Waiting ContainerCreating", c)
				}
				sawHook = true
			}
		}
		if !sawHook {
			t.Error("never saw the container waiting for its postStart hook")
		}
		e.syncUntil(t, pod, 10*time.Second, "running after the hook", running("app"))
		if err := e.rt.RemovePod(ctx, pod.UID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("failing postStart kills and restarts", func(t *testing.T) {
		cmd := sh("echo oops; echo bad >&2; exit 3")
		pod := testPod("badhook", corev1.Container{
			Name: "app", Image: images.Sleeper,
			Lifecycle: &corev1.Lifecycle{
				PostStart: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: cmd}},
				PreStop:   &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: sh("exit 1")}},
			},
		})
		grace := int64(2)
		pod.Spec.TerminationGracePeriodSeconds = &grace
		if err := e.rt.SyncPod(ctx, pod, e.net); err != nil {
			t.Fatal(err)
		}
		want := `Exec lifecycle hook ([/bin/sh -c echo oops; echo bad >&2; exit 3]) for Container "app" in Pod "badhook_default(` +
			string(pod.UID) + `)" failed - error: command '/bin/sh -c echo oops; echo bad >&2; exit 3' exited with 3: bad` + "\n" +
			`, message: "oops\nbad\n"`
		ev := waitEvent(t, "FailedPostStartHook", "Exec lifecycle hook")
		if ev.Message != want || !ev.Warning || ev.Container != "app" {
			t.Errorf("FailedPostStartHook event %+v, want the message:\n%s", ev, want)
		}
		waitEvent(t, "Killing", "FailedPostStartHook")
		waitEvent(t, "FailedPreStopHook", `Exec lifecycle hook ([/bin/sh -c exit 1]) for Container "app"`)
		st, err := e.rt.PodStatus(ctx, pod.UID)
		if err != nil {
			t.Fatal(err)
		}
		if c := containerStatus(st, "app"); c.State != edge.ContainerWaiting || c.Reason != reasonPostStartHookError || c.Last == nil {
			t.Errorf("after the failed hook: %+v, want Waiting %s with the killed instance as last state", c, reasonPostStartHookError)
		}
		e.syncUntil(t, pod, 20*time.Second, "restarted after the back-off", func(st *edge.PodStatus) bool {
			return containerStatus(st, "app").RestartCount >= 1
		})
		if err := e.rt.RemovePod(ctx, pod.UID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("failing httpGet postStart", func(t *testing.T) {
		port := freePort(t)
		pod := testPod("httphook", corev1.Container{
			Name: "app", Image: images.Sleeper,
			Lifecycle: &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{
				HTTPGet: &corev1.HTTPGetAction{Path: "/started", Port: intstr.FromInt(port), Host: "127.0.0.1"},
			}},
		})
		grace := int64(1)
		pod.Spec.TerminationGracePeriodSeconds = &grace
		if err := e.rt.SyncPod(ctx, pod, e.net); err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf(`HTTP lifecycle hook (/started) for Container "app" in Pod "httphook_default(%s)" failed - error: Get "http://127.0.0.1:%d/started": dial tcp 127.0.0.1:%d: connect: connection refused`, pod.UID, port, port)
		if ev := waitEvent(t, "FailedPostStartHook", "HTTP lifecycle hook"); ev.Message != want {
			t.Errorf("event %q, want %q", ev.Message, want)
		}
		if err := e.rt.RemovePod(ctx, pod.UID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("app restart keeps init", func(t *testing.T) {
		// Init containers run again only with a new sandbox (see
		// TestLabNodeRebootOffline); a restart of an app container in
		// the same sandbox does not run them.
		work := []corev1.VolumeMount{{Name: "work", MountPath: "/work"}}
		pod := testPod("reinit", corev1.Container{
			Name: "app", Image: images.Sleeper, VolumeMounts: work,
			Command: sh("if [ ! -f /work/once ]; then touch /work/once; exit 1; fi; exec sleep 3600"),
		})
		pod.Spec.InitContainers = []corev1.Container{{
			Name: "init", Image: images.Sleeper, ImagePullPolicy: corev1.PullNever, VolumeMounts: work,
			TerminationMessagePath: "/dev/termination-log", Command: sh("echo ran >> /work/inits"),
		}}
		pod.Spec.Volumes = []corev1.Volume{{Name: "work", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		e.syncUntil(t, pod, 30*time.Second, "app restarted once and running", func(st *edge.PodStatus) bool {
			c := containerStatus(st, "app")
			return c.RestartCount == 1 && c.State == edge.ContainerRunning
		})
		var out strings.Builder
		if _, err := e.rt.Exec(ctx, pod.UID, "app", []string{"cat", "/work/inits"}, edge.Streams{Stdout: &out}); err != nil || out.String() != "ran\n" {
			t.Errorf("init runs after an app restart: %q (%v), want one", out.String(), err)
		}
		if err := e.rt.RemovePod(ctx, pod.UID); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("probe failures", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) }))
		defer srv.Close()
		port := srv.Listener.Addr().(*net.TCPAddr).Port
		closed := freePort(t)
		probe := func(h corev1.ProbeHandler) *corev1.Probe {
			return &corev1.Probe{ProbeHandler: h, PeriodSeconds: 1, FailureThreshold: 1000}
		}
		pod := testPod("probed", corev1.Container{
			Name: "http", Image: images.Sleeper,
			LivenessProbe: probe(corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt(port)}}),
		}, corev1.Container{
			Name: "exec", Image: images.Sleeper,
			ReadinessProbe: probe(corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: sh("echo not ready; exit 1")}}),
		}, corev1.Container{
			Name: "tcp", Image: images.Sleeper,
			LivenessProbe: probe(corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt(closed)}}),
		})
		pod.Spec.HostNetwork = true
		e.syncUntil(t, pod, 20*time.Second, "running", func(st *edge.PodStatus) bool {
			return running("http")(st) && running("exec")(st) && running("tcp")(st)
		})
		for _, tc := range []struct{ container, msg string }{
			{"http", "Liveness probe failed: HTTP probe failed with statuscode: 500"},
			{"exec", "Readiness probe failed: not ready\n"},
			{"tcp", fmt.Sprintf("Liveness probe failed: dial tcp 127.0.0.1:%d: connect: connection refused", closed)},
		} {
			ev := waitEvent(t, "Unhealthy", tc.msg)
			if ev.Message != tc.msg || ev.Container != tc.container || !ev.Warning {
				t.Errorf("%s: event %+v, want the message %q", tc.container, ev, tc.msg)
			}
		}
		if err := e.rt.RemovePod(ctx, pod.UID); err != nil {
			t.Fatal(err)
		}
	})
}
