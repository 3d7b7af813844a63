package containerd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/testbench/images"
)

var (
	imagesOnce sync.Once
	imagesTar  string
	imagesErr  error
)

// testImages builds the test image archive once per test binary.
func testImages(t testing.TB) string {
	imagesOnce.Do(func() {
		dir, err := os.MkdirTemp("", "tether-images")
		if err != nil {
			imagesErr = err
			return
		}
		imagesTar = filepath.Join(dir, "test-images.tar")
		imagesErr = images.Build(imagesTar)
	})
	if imagesErr != nil {
		t.Fatalf("build test images: %v", imagesErr)
	}
	return imagesTar
}

// requireContainerd skips unless the test can run containers: root,
// containerd, runc and the CNI plugins.
func requireContainerd(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run containers")
	}
	for _, bin := range []string{"containerd", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("needs %s: %v", bin, err)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		if _, err2 := os.Stat("/opt/cni/bin/bridge"); err2 != nil {
			t.Skip("needs the CNI plugins (containernetworking-plugins)")
		}
	}
}

// testEnv is a runtime with its own containerd, bridge and pod range.
type testEnv struct {
	rt     *Runtime
	dir    string
	bridge string
	net    edge.Network
	src    *fakeSources
	daemon int // pid of the containerd the first runtime started
	// localPathRoot is the runtime's local-path root; empty: a
	// directory of the test.
	localPathRoot string
	// handlers are the runtime's handlers beyond runc.
	handlers map[string]RuntimeHandler
}

// newTestRuntime starts a runtime (and its containerd) whose state is
// removed at the end of the test, pods, mounts, namespaces and bridge
// included.
func newTestRuntime(t *testing.T, cidr string) *testEnv {
	t.Helper()
	requireContainerd(t)
	tar := testImages(t)
	// A short path: containerd's socket path must fit in sun_path.
	dir, err := os.MkdirTemp("", "tc")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "images"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(tar, filepath.Join(dir, "images", "test.tar")); err != nil {
		b, _ := os.ReadFile(tar)
		os.WriteFile(filepath.Join(dir, "images", "test.tar"), b, 0o644)
	}
	bridge := "tt" + strings.ReplaceAll(strings.Split(cidr, "/")[0], ".", "")[3:]
	env := &testEnv{dir: dir, bridge: bridge, src: newFakeSources()}
	env.net = edge.Network{HostIPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, PodCIDRs: []netip.Prefix{netip.MustParsePrefix(cidr)}}
	t.Cleanup(func() { env.cleanup(t) })
	env.rt = env.start(t)
	return env
}

func (e *testEnv) config() Config {
	root := e.localPathRoot
	if root == "" {
		root = filepath.Join(e.dir, "storage")
	}
	return Config{DataDir: e.dir, Bridge: e.bridge, BackoffBase: time.Second, BackoffMax: 4 * time.Second, LocalPathRoot: root,
		RuntimeHandlers: e.handlers}
}

func (e *testEnv) start(t *testing.T) *Runtime {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt, err := New(ctx, e.config())
	if err != nil {
		t.Fatal(err)
	}
	rt.SetSources(e.src)
	if pid := rt.DaemonPID(); pid != 0 {
		e.daemon = pid
	}
	return rt
}

func (e *testEnv) cleanup(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if e.rt != nil {
		e.rt.mu.Lock()
		var uids []types.UID
		for uid := range e.rt.pods {
			uids = append(uids, uid)
		}
		e.rt.mu.Unlock()
		for _, uid := range uids {
			if err := e.rt.RemovePod(ctx, uid); err != nil {
				t.Logf("cleanup: remove pod %s: %v", uid, err)
			}
		}
		// Whatever is left in the namespace (interrupted starts).
		if conts, err := e.rt.client.Containers(ctx); err == nil {
			for _, c := range conts {
				e.rt.deleteContainer(ctx, c)
			}
		}
		e.rt.StopDaemon()
		e.rt.Close()
	}
	// A runtime started after a restart uses the first one's containerd.
	if e.daemon != 0 {
		if p, err := os.FindProcess(e.daemon); err == nil {
			p.Signal(syscall.SIGTERM)
			for i := 0; i < 100 && p.Signal(syscall.Signal(0)) == nil; i++ {
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	exec.Command("ip", "link", "del", e.bridge).Run()
	// Unmount anything left below the directory before removing it.
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		var mps []string
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && strings.HasPrefix(f[4], e.dir+"/") {
				mps = append(mps, f[4])
			}
		}
		for i := len(mps) - 1; i >= 0; i-- {
			exec.Command("umount", "-l", mps[i]).Run()
		}
	}
	os.RemoveAll(e.dir)
}

type fakeSources struct {
	mu      sync.Mutex
	cms     map[string]*corev1.ConfigMap
	secrets map[string]*corev1.Secret
	pvcs    map[string]*corev1.PersistentVolumeClaim
	pvs     map[string]*corev1.PersistentVolume
	// serviceEnv is what ServiceEnv returns (serviceenv_test.go).
	serviceEnv map[string]string
	// classes are the RuntimeClasses' handlers by class name.
	classes map[string]string
}

func newFakeSources() *fakeSources {
	return &fakeSources{cms: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{},
		pvcs: map[string]*corev1.PersistentVolumeClaim{}, pvs: map[string]*corev1.PersistentVolume{}}
}

func (f *fakeSources) PersistentVolumeClaim(ns, name string) (*corev1.PersistentVolumeClaim, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.pvcs[ns+"/"+name]; ok {
		return c, nil
	}
	return nil, edge.ErrSourceNotFound
}

func (f *fakeSources) PersistentVolume(name string) (*corev1.PersistentVolume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if v, ok := f.pvs[name]; ok {
		return v, nil
	}
	return nil, edge.ErrSourceNotFound
}

func (f *fakeSources) ConfigMap(ns, name string) (*corev1.ConfigMap, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c, ok := f.cms[ns+"/"+name]; ok {
		return c, nil
	}
	return nil, edge.ErrSourceNotFound
}

func (f *fakeSources) Secret(ns, name string) (*corev1.Secret, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s, ok := f.secrets[ns+"/"+name]; ok {
		return s, nil
	}
	return nil, edge.ErrSourceNotFound
}

func (f *fakeSources) RuntimeHandler(class string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if h, ok := f.classes[class]; ok {
		return h, nil
	}
	return "", classNotFound(class)
}

// classNotFound is the agent's error for a RuntimeClass the hub does not
// have.
type classNotFound string

func (c classNotFound) Error() string {
	return fmt.Sprintf("runtimeclass.node.k8s.io %q not found", string(c))
}

func (classNotFound) Is(target error) bool { return target == edge.ErrSourceNotFound }

func (f *fakeSources) ServiceAccountToken(context.Context, *corev1.Pod, string, int64) (string, time.Time, error) {
	return "token-for-tests", time.Now().Add(time.Hour), nil
}

var uidSeq int

func testPod(name string, containers ...corev1.Container) *corev1.Pod {
	uidSeq++
	for i := range containers {
		if containers[i].ImagePullPolicy == "" {
			containers[i].ImagePullPolicy = corev1.PullNever
		}
		if containers[i].TerminationMessagePath == "" {
			containers[i].TerminationMessagePath = "/dev/termination-log"
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name + "-uid-" + time.Now().Format("150405.000000000"))},
		Spec:       corev1.PodSpec{NodeName: "n1", Containers: containers, RestartPolicy: corev1.RestartPolicyAlways},
	}
}

// syncUntil calls SyncPod until ok says the status is what the test waits
// for.
func (e *testEnv) syncUntil(t *testing.T, pod *corev1.Pod, timeout time.Duration, what string, ok func(*edge.PodStatus) bool) *edge.PodStatus {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last *edge.PodStatus
	var lastErr error
	for time.Now().Before(deadline) {
		lastErr = e.rt.SyncPod(context.Background(), pod, e.net)
		st, err := e.rt.PodStatus(context.Background(), pod.UID)
		if err == nil {
			last = st
			if ok(st) {
				return st
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v; last status %+v; last sync error %v", what, timeout, last, lastErr)
	return nil
}

func running(name string) func(*edge.PodStatus) bool {
	return func(st *edge.PodStatus) bool {
		for _, c := range st.Containers {
			if c.Name == name && c.State == edge.ContainerRunning {
				return true
			}
		}
		return false
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	var lastErr error
	for i := 0; i < 50; i++ {
		resp, err := http.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return string(b)
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("GET %s: %v", url, lastErr)
	return ""
}

func TestRuntimePodLifecycle(t *testing.T) {
	e := newTestRuntime(t, "10.231.1.0/24")
	pod := testPod("web", corev1.Container{
		Name: "web", Image: images.Echo,
		Env: []corev1.EnvVar{
			{Name: "GREETING", Value: "hi"},
			{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			{Name: "MSG", Value: "$(GREETING) there"},
		},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi"), corev1.ResourceCPU: resource.MustParse("500m")}},
	})
	st := e.syncUntil(t, pod, 30*time.Second, "web running", running("web"))
	if len(st.IPs) == 0 {
		t.Fatal("no pod IP")
	}
	ip := st.IPs[0].String()
	body := httpGet(t, "http://"+ip+":8080/env")
	for _, want := range []string{"GREETING=hi", "POD_IP=" + ip, "MSG=hi there"} {
		if !strings.Contains(body, want) {
			t.Errorf("env lacks %q:\n%s", want, body)
		}
	}
	if h := httpGet(t, "http://"+ip+":8080/"); !strings.Contains(h, "hello from web") {
		t.Errorf("hostname: %q", h)
	}
	var out bytes.Buffer
	code, err := e.rt.Exec(context.Background(), pod.UID, "web", []string{"/testapp", "crash", "3"}, edge.Streams{Stdout: &out})
	if err != nil || code != 3 || !strings.Contains(out.String(), "crashing with 3") {
		t.Fatalf("exec: code %d err %v out %q", code, err, out.String())
	}
	var logs bytes.Buffer
	if err := e.rt.ContainerLogs(context.Background(), pod.UID, "web", edge.LogOptions{TailLines: -1}, &logs); err != nil || !strings.Contains(logs.String(), "listening on :8080") {
		t.Fatalf("logs: %v %q", err, logs.String())
	}
	// cgroup limits
	id := containerID(pod.UID, "web", 0)
	if b, err := os.ReadFile("/sys/fs/cgroup/memory/tether/" + id + "/memory.limit_in_bytes"); err == nil && strings.TrimSpace(string(b)) != "67108864" {
		t.Errorf("memory limit %s", b)
	}
	if err := e.rt.KillPod(context.Background(), pod.UID, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	st, _ = e.rt.PodStatus(context.Background(), pod.UID)
	if st.Containers[0].State != edge.ContainerExited {
		t.Fatalf("after kill: %+v", st.Containers[0])
	}
	if err := e.rt.RemovePod(context.Background(), pod.UID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(netnsDir, netnsName(pod.UID))); !os.IsNotExist(err) {
		t.Errorf("netns left: %v", err)
	}
}
