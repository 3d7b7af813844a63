package testbench

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/tether-edge/tether/edge/imageshare"
	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/internal/fleetapi"
	testimages "github.com/tether-edge/tether/testbench/images"
)

// TestImageStaging stages an image of incompressible bytes to two sites
// of containerd nodes behind shaped uplinks, from a registry on the hub's
// side of the WAN that counts the blob bytes it serves: site "p2p" shares
// image content among its nodes (the default), site "each" does not
// (--image-share-port 0), so each of its nodes downloads the image.
//
// Short mode (CI): 3 nodes per site, a 2 MiB payload (3 MB with busybox), 4 Mbit/s uplinks.
// TETHER_IMAGES_FULL=1: 10 nodes per site, a 50 MiB payload, 10 Mbit/s.
//
// It checks that every node of both sites holds the image and the
// stagings say so (3/3); that p2p's uplink carried each blob once and the
// other nodes got it from their peers; that a blob rotten on its owner's
// disk is refused by the peers fetching it from there, which fetch it
// elsewhere; and that a pod of the image starts on a p2p node without pulling. It
// reports WAN bytes and time per site, shared against each-pulls.
func TestImageStaging(t *testing.T) {
	requireContainerdNode(t)
	full := os.Getenv("TETHER_IMAGES_FULL") != ""
	nodes, payload, rate := 3, 2<<20, int64(4_000_000)
	if full {
		nodes, payload, rate = 10, 50<<20, 10_000_000
	}
	dir := t.TempDir()
	const name = "docker.io/tether/staged:v1"
	archive := filepath.Join(dir, "staged.tar")
	if err := testimages.BuildPayload(archive, name, payload); err != nil {
		t.Fatalf("build the image: %v", err)
	}
	l, err := Up(context.Background(), Config{
		Spec: Spec{DiskSize: 512, Sites: []SiteSpec{
			{Name: "p2p", Nodes: nodes, Link: LinkParams{Rate: rate, QueueLimit: 256 << 10}},
			{Name: "each", Nodes: nodes, Link: LinkParams{Rate: rate, QueueLimit: 256 << 10}},
		}},
		PlainDisks: true,
		Log:        slog.New(slog.NewTextHandler(t.Output(), nil)),
	})
	if err != nil {
		t.Fatalf("Up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	h := startLabHub(t, l)
	// The hub serves the kind once its definition is applied.
	h.mustRun("apply", "-f", filepath.Join(moduleRootDir(t), "internal", "fleetapi", "crds", "imagestagings.yaml"))
	h.mustRun("wait", "--for", "condition=Established", "--timeout", "60s", "crd/imagestagings.fleet.tether.io")

	// The registry, in the hub's namespace: what the sites pull crosses
	// their uplinks.
	reg, err := testimages.NewRegistry(archive)
	if err != nil {
		t.Fatal(err)
	}
	rotArchive := filepath.Join(dir, "rot.tar")
	if err := testimages.WriteArchive(rotArchive, testimages.Image{Name: "docker.io/tether/rot:v1", Entrypoint: []string{"/payload"},
		Layer: []testimages.File{{Path: "payload", Mode: 0o644, Data: randomBytes(t, 256<<10)}}}); err != nil {
		t.Fatal(err)
	}
	rot, err := testimages.NewRegistry(rotArchive)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v2/tether/rot/", rot)
	mux.Handle("/", reg)
	counter := &blobCounter{next: mux}
	regAddr := l.Hub().Addr + ":5000"
	ln, _ := listenIn(t, l, "hub", "tcp", regAddr)
	srv := &http.Server{Handler: counter}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	ref := regAddr + "/tether/staged:v1"
	rotRef := regAddr + "/tether/rot:v1"

	// containerd reaches the registry over plain HTTP through hosts.toml.
	hostsDir := filepath.Join(dir, "certs.d")
	if err := os.MkdirAll(filepath.Join(hostsDir, regAddr), 0o755); err != nil {
		t.Fatal(err)
	}
	hosts := fmt.Sprintf("server = \"http://%[1]s\"\n\n[host.\"http://%[1]s\"]\n  capabilities = [\"pull\", \"resolve\"]\n", regAddr)
	if err := os.WriteFile(filepath.Join(hostsDir, regAddr, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		t.Fatal(err)
	}

	ctrNodes := map[string]*ctrNode{}
	var names []string
	for _, s := range []string{"p2p", "each"} {
		for _, host := range l.Nodes(s) {
			args := []string{"--registry-config-dir", hostsDir, "--image-staging-interval", "5s"}
			if s == "each" {
				args = append(args, "--image-share-port", "0")
			}
			names = append(names, host.Name)
			ctrNodes[host.Name] = startCtrNode(t, l, h, host.Name, s, nil, args...)
		}
	}
	h.waitReady(3*time.Minute, names...)
	var p2p []string
	for _, host := range l.Nodes("p2p") {
		p2p = append(p2p, host.Name)
	}
	// Sharing needs the site's gossip: every p2p node sees the others.
	eventually(t, 2*time.Minute, "p2p's gossip formed", func() (bool, string) {
		for _, n := range p2p {
			out, err := h.run("get", "--raw", "/api/v1/nodes/"+n+"/proxy/metrics")
			if err != nil {
				return false, err.Error()
			}
			if v := metricValue(out, "tether_gossip_members"); v != float64(nodes) {
				return false, fmt.Sprintf("%s sees %v members", n, v)
			}
		}
		return true, ""
	})

	blobs := reg.BlobSizes("tether/staged:v1")
	var imageBytes int64
	for _, s := range blobs {
		imageBytes += s
	}
	t.Logf("image %s: %d blobs, %d bytes", ref, len(blobs), imageBytes)

	type result struct {
		wan  int64
		took time.Duration
	}
	stage := func(site string) result {
		before := counter.blobBytes()
		began := time.Now()
		h.applyManifest(t, fmt.Sprintf(`apiVersion: fleet.tether.io/v1alpha1
kind: ImageStaging
metadata: {name: %[1]s}
spec:
  images: [%[2]q]
  nodeSelector: {matchLabels: {topology.kubernetes.io/zone: %[1]s}}
`, site, ref))
		eventually(t, 10*time.Minute, "site "+site+" staged", func() (bool, string) {
			st, err := stagingStatus(h, site)
			if err != nil {
				return false, err.Error()
			}
			return st.Phase == fleetapi.StagingStaged && st.Nodes == int32(nodes) && st.Staged == int32(nodes),
				fmt.Sprintf("%+v; registry blob bytes %d", st, counter.blobBytes()-before)
		})
		r := result{wan: counter.blobBytes() - before, took: time.Since(began)}
		t.Logf("site %s: %d nodes staged %d bytes in %v; the WAN carried %d blob bytes", site, nodes, imageBytes, r.took.Round(time.Millisecond), r.wan)
		return r
	}

	shared := stage("p2p")
	if shared.wan != imageBytes {
		t.Errorf("p2p's uplink carried %d blob bytes, want %d: each blob once", shared.wan, imageBytes)
	}
	var fromPeers float64
	for _, n := range p2p {
		out, _ := h.run("get", "--raw", "/api/v1/nodes/"+n+"/proxy/metrics")
		fromPeers += metricValue(out, "tether_edge_image_share_fetched_bytes_total", `source="peer"`)
	}
	if want := float64(int64(nodes-1) * imageBytes); fromPeers < want*0.9 {
		t.Errorf("p2p's nodes fetched %v bytes from their peers, want about %v", fromPeers, want)
	}

	eachPulls := stage("each")
	if eachPulls.wan != int64(nodes)*imageBytes {
		t.Errorf("each's uplink carried %d blob bytes, want %d: every node pulls", eachPulls.wan, int64(nodes)*imageBytes)
	}
	mode := benchfmt.Mode(full)
	extra := []string{fmt.Sprintf("nodes=%d", nodes), fmt.Sprintf("image_bytes=%d", imageBytes), fmt.Sprintf("uplink_bps=%d", rate)}
	benchfmt.Report(t, benchfmt.Figure{Name: "image_staging_wan_bytes", Value: float64(shared.wan), Unit: "B",
		Target: fmt.Sprintf("ratio<=%.3f", 1.5/float64(nodes)), Peer: "each_node_pulls", PeerValue: float64(eachPulls.wan), Mode: mode, Extra: extra})
	benchfmt.Report(t, benchfmt.Figure{Name: "image_staging_time", Value: shared.took.Seconds(), Unit: "s",
		Target: "ratio<=0.8", Peer: "each_node_pulls", PeerValue: eachPulls.took.Seconds(), Mode: mode, Extra: extra})

	if !t.Failed() {
		t.Run("RottenBlob", func(t *testing.T) { rottenBlob(t, h, ctrNodes, p2p, rotRef, rot.BlobSizes("tether/rot:v1")) })
		t.Run("PodWithoutPull", func(t *testing.T) { podWithoutPull(t, h, p2p[0], ref, reg) })
		t.Run("FailureEvent", func(t *testing.T) { failureEvent(t, h, regAddr+"/tether/missing:v1") })
	}
}

// rottenBlob stages the small image rot to the owner of its layer only,
// rots the layer on the owner's disk, then stages the image to the whole
// site: the other nodes ask the owner first, refuse its bytes, and fetch
// the layer elsewhere; each ends up with the layer whole.
func rottenBlob(t *testing.T, h *labHub, ctrNodes map[string]*ctrNode, p2p []string, ref string, blobs map[string]int64) {
	var layer string
	for d, s := range blobs {
		if layer == "" || s > blobs[layer] {
			layer = d
		}
	}
	order := imageshare.Rank(layer, p2p)
	owner := ctrNodes[order[0]]
	staging := func(sel string) {
		h.applyManifest(t, fmt.Sprintf(`apiVersion: fleet.tether.io/v1alpha1
kind: ImageStaging
metadata: {name: rot}
spec:
  images: [%q]
  nodeSelector: {matchLabels: {%s}}
`, ref, sel))
	}
	staging("kubernetes.io/hostname: " + owner.name)
	eventually(t, 3*time.Minute, "rot staged on its layer's owner "+owner.name, func() (bool, string) {
		st, err := stagingStatus(h, "rot")
		return err == nil && st.Nodes == 1 && st.Staged == 1, fmt.Sprintf("%+v %v", st, err)
	})
	path := filepath.Join(owner.data, "containerd", "root", "io.containerd.content.v1.content", "blobs", "sha256", strings.TrimPrefix(layer, "sha256:"))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the owner's copy: %v", err)
	}
	for i := 0; i < len(b); i += 4096 {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}

	staging("topology.kubernetes.io/zone: p2p")
	eventually(t, 3*time.Minute, "rot staged on every p2p node", func() (bool, string) {
		st, err := stagingStatus(h, "rot")
		return err == nil && st.Nodes == int32(len(p2p)) && st.Staged == int32(len(p2p)), fmt.Sprintf("%+v %v", st, err)
	})
	var rejected float64
	for _, name := range order[1:] {
		out, _ := h.run("get", "--raw", "/api/v1/nodes/"+name+"/proxy/metrics")
		rejected += metricValue(out, "tether_edge_image_share_rejected_total")
		checkBlob(t, ctrNodes[name], layer, blobs[layer])
	}
	if rejected < 1 {
		t.Errorf("no node refused the owner's rotten layer")
	}
}

// checkBlob checks that n holds the blob d whole.
func checkBlob(t *testing.T, n *ctrNode, d string, size int64) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := containerd.New(n.sock, containerd.WithDefaultNamespace("tether"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ra, err := c.ContentStore().ReaderAt(ctx, imageDesc(d, size))
	if err != nil {
		t.Errorf("%s: %v", n.name, err)
		return
	}
	defer ra.Close()
	dg := digest.SHA256.Digester()
	if _, err := io.Copy(dg.Hash(), io.NewSectionReader(ra, 0, ra.Size())); err != nil {
		t.Fatal(err)
	}
	if dg.Digest().String() != d {
		t.Errorf("%s holds a blob of digest %s for %s", n.name, dg.Digest(), d)
	}
}

// podWithoutPull runs a pod of the staged image on node and checks that
// the registry was not asked for it.
func podWithoutPull(t *testing.T, h *labHub, node, ref string, reg *testimages.Registry) {
	resolves := reg.Resolves("tether/staged:v1")
	h.applyManifest(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: staged}
spec:
  nodeSelector: {kubernetes.io/hostname: %s}
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: %s
    imagePullPolicy: IfNotPresent
`, node, ref))
	eventually(t, 2*time.Minute, "pod staged running", func() (bool, string) {
		p, err := h.pod("staged")
		if err != nil {
			return false, err.Error()
		}
		cs, ok := containerState(p, "web")
		return ok && cs.State.Running != nil, fmt.Sprintf("%+v", p.Status.ContainerStatuses)
	})
	out := h.mustRun("get", "events", "--field-selector", "involvedObject.name=staged", "-o", "jsonpath={range .items[*]}{.reason}: {.message}{\"\\n\"}{end}")
	if !strings.Contains(out, "already present on machine") || strings.Contains(out, "Pulling") {
		t.Errorf("the pod's events do not say the image was present:\n%s", out)
	}
	if got := reg.Resolves("tether/staged:v1"); got != resolves {
		t.Errorf("the registry was asked for the image %d more times", got-resolves)
	}
}

// failureEvent stages an image the registry does not have and waits for
// the agents' ImageStagingFailed Events on the staging.
func failureEvent(t *testing.T, h *labHub, ref string) {
	h.applyManifest(t, fmt.Sprintf(`apiVersion: fleet.tether.io/v1alpha1
kind: ImageStaging
metadata: {name: missing}
spec:
  images: [%q]
  nodeSelector: {matchLabels: {topology.kubernetes.io/zone: p2p}}
`, ref))
	eventually(t, time.Minute, "an ImageStagingFailed event on staging missing", func() (bool, string) {
		out, err := h.run("get", "events", "-A", "--field-selector", "involvedObject.name=missing,reason="+fleetapi.ReasonImageStagingFailed,
			"-o", "jsonpath={range .items[*]}{.involvedObject.kind} {.type}: {.message}{\"\\n\"}{end}")
		return err == nil && strings.Contains(out, "ImageStaging Warning: node p2p-"), out + fmt.Sprint(err)
	})
	if st, err := stagingStatus(h, "missing"); err != nil || st.Phase != fleetapi.StagingPending || st.Staged != 0 {
		t.Errorf("status %+v (%v), want Pending with nothing staged", st, err)
	}
}

// stagingStatus reads the status of ImageStaging name.
func stagingStatus(h *labHub, name string) (fleetapi.ImageStagingStatus, error) {
	out, err := h.run("get", "imagestaging", name, "-o", "json")
	if err != nil {
		return fleetapi.ImageStagingStatus{}, err
	}
	var st fleetapi.ImageStaging
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return fleetapi.ImageStagingStatus{}, err
	}
	return st.Status, nil
}

// metricValue sums the samples of a Prometheus text exposition's metric
// name whose labels hold every match.
func metricValue(exposition, name string, match ...string) float64 {
	var sum float64
	for _, line := range strings.Split(exposition, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		all := true
		for _, m := range match {
			all = all && strings.Contains(rest, m)
		}
		var v float64
		f := strings.Fields(rest)
		if all && len(f) > 0 {
			if _, err := fmt.Sscan(f[len(f)-1], &v); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// blobCounter counts the bytes of blobs a registry handler writes.
type blobCounter struct {
	next  http.Handler
	mu    sync.Mutex
	bytes int64
}

func (c *blobCounter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/blobs/") {
		c.next.ServeHTTP(w, r)
		return
	}
	cw := &countWriter{ResponseWriter: w}
	c.next.ServeHTTP(cw, r)
	c.mu.Lock()
	c.bytes += cw.n
	c.mu.Unlock()
}

func (c *blobCounter) blobBytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}

type countWriter struct {
	http.ResponseWriter
	n int64
}

func (w *countWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n += int64(n)
	return n, err
}

// imageDesc describes a blob by digest and size.
func imageDesc(d string, size int64) ocispec.Descriptor {
	return ocispec.Descriptor{Digest: digest.Digest(d), Size: size}
}

// moduleRootDir is the repository's root, from the test's directory.
func moduleRootDir(t *testing.T) string {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(wd)
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}
