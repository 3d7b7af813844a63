package fleet_test

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/controllers/nodelifecycle"
	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/fleetapi"
)

// chromium returns Debian's Chromium, which CI installs.
func chromium(t *testing.T) string {
	for _, p := range []string{"chromium", "chromium-browser"} {
		if path, err := exec.LookPath(p); err == nil {
			return path
		}
	}
	t.Skip("needs Chromium (Debian's chromium package) for the fleet page's browser test")
	return ""
}

// proxy runs `kubectl proxy` against the hub, as a person opening the page
// would, and returns its address.
func proxy(t *testing.T, h *hubtest.Hub) string {
	cmd := exec.Command(h.Kubectl, "--kubeconfig", h.Kubeconfig, "proxy", "--port=0", "--address=127.0.0.1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("kubectl proxy: %v", err)
	}
	// "Starting to serve on 127.0.0.1:PORT"
	_, addr, ok := strings.Cut(strings.TrimSpace(line), "serve on ")
	if !ok {
		t.Fatalf("kubectl proxy said %q", line)
	}
	go func() { _, _ = io.Copy(io.Discard, out) }()
	return addr
}

func setReady(t *testing.T, c kubernetes.Interface, name string, status corev1.ConditionStatus, msg string) {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(t.Context(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Message: msg,
		Reason: "Test", LastHeartbeatTime: now, LastTransitionTime: now}}
	if _, err := c.CoreV1().Nodes().UpdateStatus(t.Context(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestFleetPageInChromium opens the fleet page through kubectl proxy in
// headless Chromium: it shows both sites with their nodes and pods, an
// agent rollout under way and an image staging, takes a
// screenshot, and marks a site dark when the hub's node lifecycle does,
// without a reload. A user who may not list nodes gets upstream's 403.
func TestFleetPageInChromium(t *testing.T) {
	browser := chromium(t)
	// No node lifecycle controller: the test writes the conditions it
	// would.
	h := hubtest.Start(t, "--controllers=garbagecollector,namespace", "--disable-scheduler")
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c := kubernetes.NewForConfigOrDie(cfg)
	for _, n := range []struct{ name, site string }{{"alpha-1", "alpha"}, {"alpha-2", "alpha"}, {"beta-1", "beta"}} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{corev1.LabelTopologyZone: n.site}}}
		if _, err := c.CoreV1().Nodes().Create(t.Context(), node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		setReady(t, c, n.name, corev1.ConditionTrue, "ready")
	}
	// The service account controller does not run either.
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := c.CoreV1().ServiceAccounts("default").Create(t.Context(), sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for i, n := range []string{"alpha-1", "alpha-1", "alpha-2", "beta-1"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("shop-%d", i), Namespace: "default"},
			Spec: corev1.PodSpec{NodeName: n, Containers: []corev1.Container{{Name: "app", Image: "registry.example/app:1"}}}}
		if _, err := c.CoreV1().Pods("default").Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// alpha-1's heartbeat, as the hub keeps it.
	renew := metav1.NewMicroTime(time.Now())
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "alpha-1", Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("alpha-1"), LeaseDurationSeconds: ptr.To(int32(40)), RenewTime: &renew}}
	if _, err := c.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(t.Context(), lease, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A rollout under way, with the status its controller would write,
	// and alpha-2's agent downloading.
	startRollout(t, cfg)
	startStaging(t, cfg)
	n, err := c.CoreV1().Nodes().Get(t.Context(), "alpha-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: fleetapi.ConditionAgentUpgrade, Status: corev1.ConditionFalse,
		Reason: fleetapi.ReasonDownloading, Message: "v2-edge-amd64: downloading the delta: 0.1 of 0.2 MB"})
	if _, err := c.CoreV1().Nodes().UpdateStatus(t.Context(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	// Only users who may list nodes see the page.
	other := kubernetes.NewForConfigOrDie(func() *rest.Config {
		cc, err := clientcmd.BuildConfigFromFlags("", h.UserKubeconfig("cashier"))
		if err != nil {
			t.Fatal(err)
		}
		return cc
	}())
	err = other.CoreV1().RESTClient().Get().AbsPath("/fleet/").Do(t.Context()).Error()
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `User "cashier" cannot list resource "nodes" in API group "" at the cluster scope`) {
		t.Errorf("the fleet page for a user who may not list nodes: %v", err)
	}

	addr := proxy(t, h)
	url := "http://" + addr + "/fleet/"
	if resp, err := http.Post(url, "text/plain", nil); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST to the fleet page: %v %v", resp, err)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1200, 800))
	actx, cancelAlloc := chromedp.NewExecAllocator(t.Context(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, cancelT := context.WithTimeout(ctx, 90*time.Second)
	defer cancelT()

	if err := chromedp.Do(ctx,
		chromedp.Navigate(url),
		chromedp.WaitVisible(`section[data-site="alpha"][data-link="connected"]`),
		chromedp.WaitVisible(`section[data-site="beta"][data-link="connected"]`),
		chromedp.WaitVisible(`tr[data-rollout="to-v2"][data-phase="Progressing"]`),
		chromedp.WaitVisible(`tr[data-staging="shop-apps"][data-phase="Pending"]`),
	); err != nil {
		t.Fatalf("open the fleet page: %v", err)
	}
	text, err := chromedp.Run(ctx, chromedp.Text(`#fleet`))
	if err != nil {
		t.Fatal(err)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"2 sites, 3 nodes, 4 pods", "alpha-1", "alpha-2", "beta-1", "s ago", "never",
		"Agent rollouts", "to-v2", "Progressing", "1/3", "Image staging", "shop-apps", "registry.example/app:2", "2/3", "beta-1: RolledBack: not healthy", "Downloading: v2-edge-amd64: downloading the delta"} {
		if !strings.Contains(text, want) {
			t.Errorf("the page lacks %q:\n%s", want, text)
		}
	}
	if len(shot) < 1000 {
		t.Errorf("screenshot of %d bytes", len(shot))
	}
	// TETHER_FLEET_SCREENSHOT keeps the screenshot where it names.
	png := cmp.Or(os.Getenv("TETHER_FLEET_SCREENSHOT"), filepath.Join(t.TempDir(), "fleet.png"))
	if err := os.WriteFile(png, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the fleet page: %s (%d bytes)", png, len(shot))

	// alpha's link goes down: the lifecycle marks its nodes so, and the
	// open page follows within its refresh.
	marked := time.Now()
	for _, n := range []string{"alpha-1", "alpha-2"} {
		setReady(t, c, n, corev1.ConditionUnknown, nodelifecycle.MessageSiteDark)
	}
	if err := chromedp.Do(ctx,
		chromedp.WaitVisible(`section[data-site="alpha"][data-link="dark"] tr[data-node="alpha-1"][data-link="dark"]`),
	); err != nil {
		t.Fatalf("the page did not mark alpha dark: %v", err)
	}
	if text, err = chromedp.Run(ctx, chromedp.Text(`section[data-site="alpha"]`)); err != nil {
		t.Fatal(err)
	}
	t.Logf("the open page showed alpha dark %v after its nodes were marked", time.Since(marked).Round(time.Millisecond))
	if !strings.Contains(text, "dark: site cut off") || !strings.Contains(text, nodelifecycle.MessageSiteDark) {
		t.Errorf("alpha's section when dark:\n%s", text)
	}
}

// startRollout creates a Release and an EdgeUpgrade to it, and writes the
// status the rollout controller (not running here) would: one node of
// three upgraded, one failed.
func startRollout(t *testing.T, cfg *rest.Config) {
	t.Helper()
	dc := dynamic.NewForConfigOrDie(cfg)
	spec := fleetapi.ReleaseSpec{Version: "v2", Arch: "amd64", Build: fleetapi.BuildEdge,
		Digest: "sha256:" + strings.Repeat("ab", 32), Size: 1000, Signature: "c2ln", Signer: "unused here"}
	rel := map[string]any{"apiVersion": fleetapi.Group + "/" + fleetapi.Version, "kind": "Release",
		"metadata": map[string]any{"name": "v2-edge-amd64", "labels": map[string]any{fleetapi.LabelVersion: "v2", fleetapi.LabelArch: "amd64", fleetapi.LabelBuild: fleetapi.BuildEdge}}}
	var err error
	if rel["spec"], err = runtime.DefaultUnstructuredConverter.ToUnstructured(&spec); err != nil {
		t.Fatal(err)
	}
	if _, err := dc.Resource(fleetapi.ReleasesResource).Create(t.Context(), &unstructured.Unstructured{Object: rel}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	up := &unstructured.Unstructured{Object: map[string]any{"apiVersion": fleetapi.Group + "/" + fleetapi.Version, "kind": "EdgeUpgrade",
		"metadata": map[string]any{"name": "to-v2"}, "spec": map[string]any{"version": "v2", "batchSize": int64(2)}}}
	up, err = dc.Resource(fleetapi.EdgeUpgradesResource).Create(t.Context(), up, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	up.Object["status"] = map[string]any{"phase": fleetapi.PhaseProgressing, "nodes": int64(3), "upgraded": int64(1), "upgrading": int64(1), "failed": int64(1),
		"failures": []any{map[string]any{"node": "beta-1", "release": "v2-edge-amd64", "reason": fleetapi.ReasonRolledBack,
			"message": "not healthy", "time": time.Now().UTC().Format(time.RFC3339)}}}
	if _, err := dc.Resource(fleetapi.EdgeUpgradesResource).UpdateStatus(t.Context(), up, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// startStaging creates an ImageStaging and writes the status its
// controller (not running here) would: two nodes of three hold it.
func startStaging(t *testing.T, cfg *rest.Config) {
	t.Helper()
	dc := dynamic.NewForConfigOrDie(cfg)
	st := &unstructured.Unstructured{Object: map[string]any{"apiVersion": fleetapi.Group + "/" + fleetapi.Version, "kind": "ImageStaging",
		"metadata": map[string]any{"name": "shop-apps"}, "spec": map[string]any{"images": []any{"registry.example/app:2"}}}}
	st, err := dc.Resource(fleetapi.ImageStagingsResource).Create(t.Context(), st, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st.Object["status"] = map[string]any{"phase": fleetapi.StagingPending, "nodes": int64(3), "staged": int64(2),
		"images": []any{map[string]any{"image": "registry.example/app:2", "nodes": int64(2)}}}
	if _, err := dc.Resource(fleetapi.ImageStagingsResource).UpdateStatus(t.Context(), st, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}
