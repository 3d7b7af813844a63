package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/platforms"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/imageshare"
)

// Name is the runtime's name in the node's containerRuntimeVersion.
const Name = "containerd"

// Namespace is the containerd namespace of tether's containers and images.
const Namespace = "tether"

// Config configures a Runtime. DataDir is required.
type Config struct {
	// DataDir holds the runtime's state: pod directories (volumes, hosts
	// files), container logs, CNI state and, when the runtime starts
	// containerd itself, containerd's root.
	DataDir string
	// Address is containerd's socket. When nothing answers there, the
	// runtime starts containerd itself (root and state under
	// DataDir/containerd) listening at Address. Empty means
	// DataDir/containerd/containerd.sock.
	Address string
	// ContainerdBinary is the containerd program to start; empty means
	// "containerd" on PATH.
	ContainerdBinary string
	// ImageDir holds image archives imported at start; empty means
	// DataDir/images.
	ImageDir string
	// SkipImport imports nothing at start, for a runtime that only
	// cleans up (Reset).
	SkipImport bool
	// ImageGCHighThresholdPercent and ImageGCLowThresholdPercent are the
	// kubelet's image garbage collection thresholds: when the disk of
	// ImageGCPath is fuller than the high one, unused images are removed,
	// least recently used first, until it is below the low one. Zero means
	// 85 and 80; a high threshold above 100 turns collection off. Images
	// imported from archives are never removed.
	ImageGCHighThresholdPercent, ImageGCLowThresholdPercent int
	// ImageGCPath is on the file system that holds containerd's content
	// store; empty means DataDir/containerd when the runtime starts
	// containerd, /var/lib/containerd otherwise.
	ImageGCPath string
	// ImageGCInterval is how often the disk is checked; zero means 5m.
	ImageGCInterval time.Duration
	// RegistryConfigDir holds registry host configuration in containerd's
	// layout (<dir>/<host>/hosts.toml with mirrors, plain HTTP endpoints,
	// CA and client certificates); empty means /etc/containerd/certs.d.
	RegistryConfigDir string
	// Snapshotter is containerd's snapshotter; empty means containerd's
	// default (overlayfs).
	Snapshotter string
	// CNIConfDir, when set, holds the user's CNI .conflist (the first in
	// lexical order is used); empty means a generated bridge + host-local
	// + loopback list over the node's pod CIDRs, with portmap unless the
	// agent's eBPF dataplane serves the host ports.
	CNIConfDir string
	// CNIBinDirs are searched for CNI plugins; empty means /usr/lib/cni
	// and /opt/cni/bin.
	CNIBinDirs []string
	// Bridge is the generated configuration's bridge; empty means
	// "tether0".
	Bridge string
	// MTU of the pods' interfaces; zero lets the bridge plugin choose.
	MTU int
	// ClusterDNS are the name servers of ClusterFirst pods; empty makes
	// ClusterFirst pods use the node's resolv.conf, as the kubelet does
	// without --cluster-dns.
	ClusterDNS []string
	// ClusterDomain is the cluster's DNS domain; empty means
	// cluster.local.
	ClusterDomain string
	// BackoffBase and BackoffMax shape the crash-loop back-off; zero
	// means 10s and 5m.
	BackoffBase, BackoffMax time.Duration
	// LogMaxSize is the size at which a container log is rotated; zero
	// means 10 MiB. LogMaxFiles is how many files (current included) are
	// kept; zero means 5.
	LogMaxSize  int64
	LogMaxFiles int
	// PidsLimit caps each container's processes; zero means 4096,
	// negative means no limit.
	PidsLimit int64
	// LocalPathRoot is the directory of the node's local-path volumes
	// (tether.io/local-path): their directories are created there with
	// mode 0777, and removed once the hub deleted their volume. Nothing
	// outside it is ever removed. Empty means /var/lib/tether/storage; it
	// must match the hub's --local-path-root.
	LocalPathRoot string
	// RuntimeHandlers are the runtime handlers RuntimeClasses may name,
	// by handler name, beyond DefaultRuntimeHandler (runc), which an
	// entry of that name replaces. A pod whose class names another
	// handler does not start.
	RuntimeHandlers map[string]RuntimeHandler
	// Capacity overrides what Info reports; missing entries come from the
	// host.
	Capacity corev1.ResourceList
	// Logger receives the runtime's logs; nil means slog.Default().
	Logger *slog.Logger
}

// Runtime runs pods with containerd. It implements edge.Runtime.
type Runtime struct {
	cfg      Config
	log      *slog.Logger
	events   atomic.Pointer[func(edge.PodEvent)]
	client   *containerd.Client
	daemon   *daemon
	version  string
	stateDir string // DataDir
	podsDir  string
	logsDir  string
	fifoDir  string
	net      *network

	mu      sync.Mutex
	pods    map[types.UID]*pod
	notify  func(types.UID)
	src     edge.Sources
	closing bool
	// imageUsed is when a container last started from each image, for
	// image garbage collection; stopGC ends its loop.
	imageUsed map[string]time.Time
	stopGC    context.CancelFunc
	// imageSizes caches the size of images by target digest, for the
	// node's status.images (staging.go).
	imageSizes map[string]int64
	// share, when set, makes pulls fetch blobs from the site's members
	// first (staging.go).
	share atomic.Pointer[imageshare.Sharer]
}

var _ edge.Runtime = (*Runtime)(nil)

func platformMatcher() platforms.MatchComparer {
	return platforms.Only(platforms.DefaultSpec())
}

// New connects to containerd (starting it when none answers), imports
// the image archives of ImageDir and adopts the containers of the pods
// the runtime ran before, running ones included.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("create containerd runtime: no data directory")
	}
	if cfg.Address == "" {
		cfg.Address = filepath.Join(cfg.DataDir, "containerd", "containerd.sock")
	}
	if cfg.ImageDir == "" {
		cfg.ImageDir = filepath.Join(cfg.DataDir, "images")
	}
	if len(cfg.CNIBinDirs) == 0 {
		cfg.CNIBinDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}
	}
	if cfg.Bridge == "" {
		cfg.Bridge = "tether0"
	}
	if cfg.ClusterDomain == "" {
		cfg.ClusterDomain = "cluster.local"
	}
	if cfg.LogMaxSize <= 0 {
		cfg.LogMaxSize = 10 << 20
	}
	if cfg.LogMaxFiles <= 0 {
		cfg.LogMaxFiles = 5
	}
	if cfg.PidsLimit == 0 {
		cfg.PidsLimit = 4096
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ImageGCHighThresholdPercent == 0 {
		cfg.ImageGCHighThresholdPercent = 85
	}
	if cfg.ImageGCLowThresholdPercent == 0 {
		cfg.ImageGCLowThresholdPercent = 80
	}
	if cfg.LocalPathRoot == "" {
		cfg.LocalPathRoot = edge.DefaultLocalPathRoot
	}
	if cfg.ImageGCInterval <= 0 {
		cfg.ImageGCInterval = 5 * time.Minute
	}
	r := &Runtime{
		cfg: cfg, log: cfg.Logger.With("component", "containerd-runtime"),
		stateDir:  cfg.DataDir,
		podsDir:   filepath.Join(cfg.DataDir, "pods"),
		logsDir:   filepath.Join(cfg.DataDir, "logs"),
		fifoDir:   filepath.Join(cfg.DataDir, "fifo"),
		pods:      map[types.UID]*pod{},
		imageUsed: map[string]time.Time{}, imageSizes: map[string]int64{},
	}
	for _, d := range []string{r.podsDir, r.logsDir, r.fifoDir} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, fmt.Errorf("create containerd runtime: %w", err)
		}
	}
	r.net = newNetwork(&r.cfg, cfg.DataDir)
	c, d, err := connect(ctx, cfg.Address, filepath.Join(cfg.DataDir, "containerd"), cfg.ContainerdBinary, r.log)
	if err != nil {
		return nil, fmt.Errorf("create containerd runtime: %w", err)
	}
	r.client, r.daemon = c, d
	if err := recordAddress(cfg.DataDir, cfg.Address); err != nil {
		r.log.Warn("reset will not find this containerd without --containerd-address", "err", err)
	}
	v, err := c.Version(ctx)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("read containerd version: %w", err)
	}
	r.version = v.Version
	if !cfg.SkipImport {
		r.importDir(ctx)
	}
	// Adopted tasks keep their IO for as long as they run, beyond the
	// caller's context.
	if err := r.recover(context.WithoutCancel(ctx)); err != nil {
		r.Close()
		return nil, fmt.Errorf("adopt existing containers: %w", err)
	}
	if d != nil {
		go r.superviseDaemon()
	}
	if r.cfg.ImageGCPath == "" {
		r.cfg.ImageGCPath = "/var/lib/containerd"
		if d != nil {
			r.cfg.ImageGCPath = filepath.Join(cfg.DataDir, "containerd")
		}
	}
	if r.cfg.ImageGCHighThresholdPercent <= 100 {
		gcCtx, stop := context.WithCancel(context.Background())
		r.stopGC = stop
		go r.imageGCLoop(gcCtx)
	}
	return r, nil
}

// Close releases the connection to containerd. Containers keep running,
// and so does a containerd the runtime started: stopping the agent must
// not stop the node's pods.
func (r *Runtime) Close() error {
	r.mu.Lock()
	r.closing = true
	if r.stopGC != nil {
		r.stopGC()
	}
	pods := make([]*pod, 0, len(r.pods))
	for _, p := range r.pods {
		pods = append(pods, p)
	}
	r.mu.Unlock()
	for _, p := range pods {
		p.stopWatchers()
	}
	if r.client != nil {
		return r.client.Close()
	}
	return nil
}

// StopDaemon stops the containerd the runtime started, if it did; tests
// and uninstalls use it.
func (r *Runtime) StopDaemon() error {
	if r.daemon == nil {
		return errNoDaemon
	}
	r.mu.Lock()
	r.closing = true
	r.mu.Unlock()
	r.daemon.stop()
	return nil
}

// Address is the socket of the containerd the runtime uses.
func (r *Runtime) Address() string { return r.cfg.Address }

// DaemonPID is the process ID of the containerd the runtime started, or 0.
func (r *Runtime) DaemonPID() int {
	if r.daemon == nil {
		return 0
	}
	return r.daemon.cmd.Process.Pid
}

// superviseDaemon starts containerd again when the one the runtime
// started dies: the shims keep the containers running meanwhile, and the
// new daemon finds them.
func (r *Runtime) superviseDaemon() {
	for {
		<-r.daemon.done
		r.mu.Lock()
		closing := r.closing
		r.mu.Unlock()
		if closing {
			return
		}
		r.log.Warn("containerd exited; starting it again")
		time.Sleep(200 * time.Millisecond)
		d, err := startDaemon(filepath.Join(r.cfg.DataDir, "containerd"), r.cfg.Address, r.cfg.ContainerdBinary, r.log)
		if err != nil {
			r.log.Error("restart containerd", "err", err)
			time.Sleep(5 * time.Second)
			continue
		}
		r.daemon = d
		if c, err := dial(context.Background(), r.cfg.Address, 20*time.Second); err == nil {
			c.Close()
		}
		if err := r.client.Reconnect(); err != nil {
			r.log.Warn("reconnect to containerd", "err", err)
		}
		r.rewatch()
	}
}

// Info implements edge.Runtime.
func (r *Runtime) Info(ctx context.Context) (edge.RuntimeInfo, error) {
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourcePods:   resource.MustParse("110"),
		corev1.ResourceMemory: *resource.NewQuantity(hostMemory(), resource.BinarySI),
	}
	if n := diskSize(r.cfg.DataDir); n > 0 {
		capacity[corev1.ResourceEphemeralStorage] = *resource.NewQuantity(n, resource.BinarySI)
	}
	for k, v := range r.cfg.Capacity {
		capacity[k] = v.DeepCopy()
	}
	if !r.connected() {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if ok, err := r.client.IsServing(sctx); !ok || err != nil {
			return edge.RuntimeInfo{}, fmt.Errorf("containerd is not serving: %v", err)
		}
	}
	return edge.RuntimeInfo{Name: Name, Version: r.version, Capacity: capacity}, nil
}

// connected tells whether the connection to containerd is up. Info, which
// the agent calls every few seconds for the node status, asks containerd's
// health service only when it is not: a call touches several megabytes of
// the executable (gRPC, protobuf, HTTP/2), which an idle agent would keep
// resident for that check alone. A containerd that exits closes the
// connection; one idle for long (gRPC's idle timeout, 30 minutes) is asked
// again.
func (r *Runtime) connected() bool {
	c, ok := r.client.Conn().(*grpc.ClientConn)
	return ok && c.GetState() == connectivity.Ready
}

// Notify implements edge.Runtime.
func (r *Runtime) Notify(fn func(uid types.UID)) {
	r.mu.Lock()
	r.notify = fn
	r.mu.Unlock()
}

// SetSources implements edge.SourceUser.
func (r *Runtime) SetSources(s edge.Sources) {
	r.mu.Lock()
	r.src = s
	r.mu.Unlock()
}

func (r *Runtime) sources() edge.Sources {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.src
}

// changed tells the agent about uid.
func (r *Runtime) changed(uid types.UID) {
	r.mu.Lock()
	fn := r.notify
	r.mu.Unlock()
	if fn != nil {
		fn(uid)
	}
}

func (r *Runtime) pod(uid types.UID) *pod {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pods[uid]
}
