package testbench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RuntimeRoot holds one directory per lab: its state file, logs and disks.
const RuntimeRoot = "/run/tether-lab"

// Config configures a lab.
type Config struct {
	// Spec is the topology.
	Spec Spec
	// Log receives the lab's own events. Nil means slog.Default().
	Log *slog.Logger
	// Output, when set, also receives every process's output, each line
	// prefixed with the host and process name. Nil means logs go to files
	// only.
	Output io.Writer
	// SampleInterval is how often process RSS and CPU are sampled. Zero
	// means one second.
	SampleInterval time.Duration
	// PlainDisks leaves node data dirs as bare tmpfs, without the FUSE
	// layer that SlowDisk needs (SlowDisk then returns
	// ErrSlowDiskUnsupported). Without /dev/fuse they are always bare.
	PlainDisks bool
}

// Lab is a running lab. Its methods are safe for concurrent use.
type Lab struct {
	cfg   Config
	log   *slog.Logger
	id    string
	dir   string
	hosts map[string]*Host
	sites map[string]*site

	mu     sync.Mutex
	state  state
	procs  map[string]*Process
	disks  map[string]*slowDisk
	closed bool
	stop   chan struct{}
	wg     sync.WaitGroup
}

// Host is one network namespace of the lab.
type Host struct {
	// Name is the host's name in the lab: "hub", "<site>-router" or
	// "<site>-n<i>" with i from 1.
	Name string
	// Netns is the namespace's name under /run/netns.
	Netns string
	// Addr is the host's address: the hub's, a router's public address or
	// a node's LAN address.
	Addr string
	// DataDir is a node's data directory, empty for other hosts: a tmpfs
	// seen through the lab's FUSE delay layer (see SlowDisk), or the bare
	// tmpfs with Config.PlainDisks or without /dev/fuse.
	DataDir string
}

type site struct {
	name   string
	num    int
	router *Host
	nodes  []*Host
	relay  *relay
	rebind int
}

func nsPath(name string) string { return filepath.Join("/run/netns", name) }

// ID returns the lab's id.
func (l *Lab) ID() string { return l.id }

// Dir returns the lab's runtime directory.
func (l *Lab) Dir() string { return l.dir }

// Host returns the named host or nil.
func (l *Lab) Host(name string) *Host { return l.hosts[name] }

// Hub returns the hub host.
func (l *Lab) Hub() *Host { return l.hosts["hub"] }

// Nodes returns a site's node hosts.
func (l *Lab) Nodes(siteName string) []*Host {
	if s := l.sites[siteName]; s != nil {
		return s.nodes
	}
	return nil
}

// Up sweeps leftovers of dead labs and builds a new lab from cfg.Spec.
// On error everything already created is removed again.
func Up(ctx context.Context, cfg Config) (*Lab, error) {
	if err := cfg.Spec.validate(); err != nil {
		return nil, err
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.SampleInterval == 0 {
		cfg.SampleInterval = time.Second
	}
	if cfg.Spec.DiskSize == 0 {
		cfg.Spec.DiskSize = 64
	}
	if err := requireTools(); err != nil {
		return nil, err
	}
	raisePriority(cfg.Log)
	if _, err := Sweep(cfg.Log); err != nil {
		return nil, err
	}
	id := cfg.Spec.ID
	if id == "" {
		b := make([]byte, 3)
		rand.Read(b)
		id = hex.EncodeToString(b)
	}
	l := &Lab{cfg: cfg, log: cfg.Log.With("lab", id), id: id,
		dir: filepath.Join(RuntimeRoot, id), hosts: map[string]*Host{},
		sites: map[string]*site{}, procs: map[string]*Process{}, disks: map[string]*slowDisk{}, stop: make(chan struct{})}
	if _, err := os.Stat(l.dir); err == nil {
		return nil, fmt.Errorf("create lab: lab %s is already running", id)
	}
	if err := os.MkdirAll(filepath.Join(l.dir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("create lab dir: %w", err)
	}
	l.state = state{ID: id, OwnerPID: os.Getpid(), OwnerStart: procStart(os.Getpid())}
	if err := l.saveState(); err != nil {
		return nil, err
	}
	if err := l.build(ctx); err != nil {
		l.Close()
		return nil, fmt.Errorf("build lab %s: %w", id, err)
	}
	l.wg.Add(1)
	go l.sampleLoop()
	l.log.Info("lab up", "dir", l.dir, "sites", len(l.sites))
	return l, nil
}

func requireTools() error {
	for _, t := range []string{"ip", "nft", "conntrack"} {
		if _, err := exec.LookPath(t); err != nil {
			return fmt.Errorf("find %s (install iproute2, nftables, conntrack): %w", t, err)
		}
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		return fmt.Errorf("find tun device: %w", err)
	}
	return nil
}

// run runs a command and returns its combined output in the error.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("run %s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// nsRun runs a command inside the namespace of host h.
func nsRun(ctx context.Context, ns string, args ...string) error {
	return run(ctx, "ip", append([]string{"netns", "exec", ns}, args...)...)
}

func (l *Lab) addNetns(ctx context.Context, h *Host) error {
	if err := run(ctx, "ip", "netns", "add", h.Netns); err != nil {
		return err
	}
	l.mu.Lock()
	l.state.Netns = append(l.state.Netns, h.Netns)
	l.mu.Unlock()
	if err := l.saveState(); err != nil {
		return err
	}
	l.hosts[h.Name] = h
	return nsRun(ctx, h.Netns, "ip", "link", "set", "lo", "up")
}

func (l *Lab) build(ctx context.Context) error {
	hub := &Host{Name: "hub", Netns: "tl" + l.id + "-hub", Addr: "10.213.0.1"}
	if err := l.addNetns(ctx, hub); err != nil {
		return err
	}
	// The hub address sits on lo so that every site tun can use it as its
	// local end.
	if err := nsRun(ctx, hub.Netns, "ip", "addr", "add", hub.Addr+"/32", "dev", "lo"); err != nil {
		return err
	}
	for i, ss := range l.cfg.Spec.Sites {
		num := i + 1
		s := &site{name: ss.Name, num: num}
		pub := fmt.Sprintf("10.213.%d.2", num)
		s.router = &Host{Name: ss.Name + "-router", Netns: fmt.Sprintf("tl%s-%s-r", l.id, ss.Name), Addr: pub}
		if err := l.addNetns(ctx, s.router); err != nil {
			return err
		}
		r := s.router.Netns
		lan := fmt.Sprintf("10.213.%d", 100+num)
		hubTun := fmt.Sprintf("up%d", num)
		steps := [][]string{
			{"ip", "tuntap", "add", "dev", "wan", "mode", "tun"},
			{"ip", "addr", "add", pub, "peer", hub.Addr + "/32", "dev", "wan"},
			{"ip", "link", "set", "wan", "up"},
			{"ip", "route", "add", "default", "dev", "wan"},
			{"ip", "link", "add", "br0", "type", "bridge"},
			{"ip", "addr", "add", lan + ".1/24", "dev", "br0"},
			{"ip", "link", "set", "br0", "up"},
			{"sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"},
		}
		for _, st := range steps {
			if err := nsRun(ctx, r, st...); err != nil {
				return err
			}
		}
		if err := l.setNAT(ctx, s, 0); err != nil {
			return err
		}
		for _, st := range [][]string{
			{"ip", "tuntap", "add", "dev", hubTun, "mode", "tun"},
			{"ip", "addr", "add", hub.Addr, "peer", pub + "/32", "dev", hubTun},
			{"ip", "link", "set", hubTun, "up"},
		} {
			if err := nsRun(ctx, hub.Netns, st...); err != nil {
				return err
			}
		}
		siteF, err := openTun(nsPath(r), "wan")
		if err != nil {
			return err
		}
		hubF, err := openTun(nsPath(hub.Netns), hubTun)
		if err != nil {
			siteF.Close()
			return err
		}
		s.relay = newRelay(siteF, hubF, ss.Link)
		l.sites[ss.Name] = s
		for j := 1; j <= ss.Nodes; j++ {
			n := &Host{Name: fmt.Sprintf("%s-n%d", ss.Name, j),
				Netns: fmt.Sprintf("tl%s-%s-n%d", l.id, ss.Name, j),
				Addr:  fmt.Sprintf("%s.%d", lan, 9+j)}
			if err := l.addNetns(ctx, n); err != nil {
				return err
			}
			port := fmt.Sprintf("p%d", j)
			if err := run(ctx, "ip", "link", "add", "eth0", "netns", n.Netns, "type", "veth",
				"peer", "name", port, "netns", r); err != nil {
				return err
			}
			for _, st := range [][]string{
				{"ip", "link", "set", port, "master", "br0"},
				{"ip", "link", "set", port, "up"},
			} {
				if err := nsRun(ctx, r, st...); err != nil {
					return err
				}
			}
			for _, st := range [][]string{
				{"ip", "addr", "add", n.Addr + "/24", "dev", "eth0"},
				{"ip", "link", "set", "eth0", "up"},
				{"ip", "route", "add", "default", "via", lan + ".1"},
			} {
				if err := nsRun(ctx, n.Netns, st...); err != nil {
					return err
				}
			}
			if err := l.addDisk(ctx, n); err != nil {
				return err
			}
			s.nodes = append(s.nodes, n)
		}
	}
	return nil
}

// addDisk gives node n a tmpfs data dir. With FUSE the tmpfs is mounted
// on the hidden <lab>/disk/.<node> and a pass-through FUSE file system,
// served by the lab process, on <lab>/disk/<node>; both are recorded
// before use so that Sweep unmounts them after a crash.
func (l *Lab) addDisk(ctx context.Context, n *Host) error {
	dir := filepath.Join(l.dir, "disk", n.Name)
	slow := !l.cfg.PlainDisks && fuseAvailable()
	tmp := dir
	if slow {
		tmp = filepath.Join(l.dir, "disk", "."+n.Name)
	}
	for _, d := range []string{dir, tmp} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create disk dir: %w", err)
		}
	}
	if err := run(ctx, "mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm", l.cfg.Spec.DiskSize),
		"tl"+l.id, tmp); err != nil {
		return err
	}
	if err := l.recordMount(tmp); err != nil {
		return err
	}
	if slow {
		if err := l.recordMount(dir); err != nil {
			return err
		}
		d, err := mountSlowDisk(tmp, dir, "tl"+l.id)
		if err != nil {
			return err
		}
		l.mu.Lock()
		l.disks[n.Name] = d
		l.mu.Unlock()
	}
	n.DataDir = dir
	return nil
}

func (l *Lab) recordMount(dir string) error {
	l.mu.Lock()
	l.state.Mounts = append(l.state.Mounts, dir)
	l.mu.Unlock()
	return l.saveState()
}

// setNAT (re)writes the site router's masquerade table. Each generation
// uses its own source port range, so after a conntrack flush existing flows
// are mapped to new public ports.
func (l *Lab) setNAT(ctx context.Context, s *site, gen int) error {
	lo := 20000 + (gen%8)*5000
	rules := fmt.Sprintf(`table ip tether_lab_nat
delete table ip tether_lab_nat
table ip tether_lab_nat {
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "wan" meta l4proto { tcp, udp } masquerade to :%d-%d random
		oifname "wan" masquerade
	}
}
`, lo, lo+4999)
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", s.router.Netns, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("set nat on %s: %w: %s", s.name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Close stops every process, removes every namespace, mount and file the
// lab created, and returns the errors it met.
func (l *Lab) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.stop)
	procs := make([]*Process, 0, len(l.procs))
	for _, p := range l.procs {
		procs = append(procs, p)
	}
	l.mu.Unlock()
	l.wg.Wait()
	var errs []error
	for _, p := range procs {
		p.kill()
	}
	for _, s := range l.sites {
		if s.relay != nil {
			s.relay.close()
		}
	}
	l.mu.Lock()
	st := l.state
	disks := l.disks
	l.mu.Unlock()
	for _, d := range disks {
		// removeState detaches what could not be unmounted here.
		if err := d.close(); err != nil {
			l.log.Warn("fuse unmount", "err", err)
		}
	}
	errs = append(errs, removeState(st))
	l.log.Info("lab down")
	return errors.Join(errs...)
}

// HostNames returns the names of every host, hub first, then each site's
// router and nodes in spec order.
func (l *Lab) HostNames() []string {
	names := []string{"hub"}
	for _, ss := range l.cfg.Spec.Sites {
		s := l.sites[ss.Name]
		if s == nil {
			continue
		}
		names = append(names, s.router.Name)
		for _, n := range s.nodes {
			names = append(names, n.Name)
		}
	}
	return names
}

// raisePriority renices every thread of the lab process to -10. The relay
// lives in this process, and on a busy machine (CI runs many builds on
// few cores) scheduling delays would otherwise show up as link jitter.
// Linux nice values are per thread; threads the runtime starts later
// inherit the value from the thread that creates them.
func raisePriority(log *slog.Logger) {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		log.Warn("cannot raise lab priority", "err", err)
		return
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, -10); err != nil {
			log.Warn("cannot raise lab priority", "tid", tid, "err", err)
		}
	}
}
