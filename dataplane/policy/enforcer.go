package policy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Config configures an Enforcer.
type Config struct {
	// CgroupPath is the cgroup v2 directory whose sockets' traffic is
	// judged: one that parents every pod. Default: the cgroup v2 root.
	CgroupPath string
	// BPFFSPath is the dataplane's bpffs directory; the policy pins live
	// in its policy/ subdirectory. Default /sys/fs/bpf/tether.
	BPFFSPath string
	// Logger receives the enforcer's logs. Default slog.Default().
	Logger *slog.Logger
}

// Enforcer owns the policy programs and maps of a node.
type Enforcer struct {
	cfg   Config
	dir   string
	objs  policyObjects
	links []link.Link

	mu     sync.Mutex
	kernel *Rules // what the maps hold
}

// Stats are the programs' counters since the maps were created.
type Stats struct {
	Judged, Allowed, Dropped, ReplyHits uint64
}

// New loads the programs, adopting the maps and links pinned by an earlier
// agent (whose rules keep being enforced until the first Apply), and
// attaches them to Config.CgroupPath.
func New(cfg Config) (*Enforcer, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.BPFFSPath == "" {
		cfg.BPFFSPath = "/sys/fs/bpf/tether"
	}
	if cfg.CgroupPath == "" {
		root, err := cgroup2Root()
		if err != nil {
			return nil, err
		}
		cfg.CgroupPath = root
	}
	e := &Enforcer{cfg: cfg, dir: filepath.Join(cfg.BPFFSPath, "policy")}
	mapsDir, linksDir := filepath.Join(e.dir, "maps"), filepath.Join(e.dir, "links")
	if err := ensureBPFFS(cfg.BPFFSPath); err != nil {
		return nil, err
	}
	for _, d := range []string{mapsDir, linksDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("create pin directory %s: %w", d, err)
		}
	}
	spec, err := loadPolicy()
	if err != nil {
		return nil, fmt.Errorf("parse embedded policy object: %w", err)
	}
	// Pins this build cannot use (another layout) are replaced.
	for name, ms := range spec.Maps {
		pin := filepath.Join(mapsDir, name)
		m, err := ebpf.LoadPinnedMap(pin, nil)
		if err != nil {
			continue
		}
		cerr := ms.Compatible(m)
		m.Close()
		if cerr != nil {
			cfg.Logger.Warn("replacing a pinned policy map of another layout", "map", name, "err", cerr)
			if err := os.Remove(pin); err != nil {
				return nil, fmt.Errorf("replace pinned map %s: %w", pin, err)
			}
		}
	}
	if err := spec.LoadAndAssign(&e.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: mapsDir}}); err != nil {
		var verr *ebpf.VerifierError
		if errors.As(err, &verr) {
			return nil, fmt.Errorf("load policy programs: verifier rejected a program: %+v", verr)
		}
		return nil, fmt.Errorf("load policy programs: %w", err)
	}
	if e.kernel, err = e.readMaps(); err != nil {
		e.objs.Close()
		return nil, err
	}
	if err := e.attach(linksDir); err != nil {
		e.objs.Close()
		return nil, err
	}
	return e, nil
}

// attach attaches or adopts the two programs; a pinned link is updated to
// the new program in place, so no packet passes unjudged.
func (e *Enforcer) attach(linksDir string) error {
	var st unix.Stat_t
	if err := unix.Stat(e.cfg.CgroupPath, &st); err != nil {
		return fmt.Errorf("stat cgroup %s: %w", e.cfg.CgroupPath, err)
	}
	for _, p := range []struct {
		name   string
		prog   *ebpf.Program
		attach ebpf.AttachType
	}{
		{"ingress", e.objs.PolicyIngress, ebpf.AttachCGroupInetIngress},
		{"egress", e.objs.PolicyEgress, ebpf.AttachCGroupInetEgress},
	} {
		pin := filepath.Join(linksDir, "cgroup_"+p.name)
		if l, err := link.LoadPinnedLink(pin, nil); err == nil {
			info, ierr := l.Info()
			if ierr == nil && info.Cgroup() != nil && info.Cgroup().CgroupId == st.Ino {
				if err := l.Update(p.prog); err != nil {
					l.Close()
					return fmt.Errorf("update pinned policy %s link: %w", p.name, err)
				}
				e.links = append(e.links, l)
				continue
			}
			l.Unpin()
			l.Close()
		}
		l, err := link.AttachCgroup(link.CgroupOptions{Path: e.cfg.CgroupPath, Attach: p.attach, Program: p.prog})
		if err != nil {
			return fmt.Errorf("attach policy %s program to cgroup %s: %w", p.name, e.cfg.CgroupPath, err)
		}
		if err := l.Pin(pin); err != nil {
			l.Close()
			return fmt.Errorf("pin policy %s link: %w", p.name, err)
		}
		e.links = append(e.links, l)
	}
	return nil
}

// Apply makes the maps hold r, writing only the differences, in an order
// that never opens more than r or the old rules allow: allows and
// identities first, then isolation, then what is gone. It returns how long
// the writes took.
func (e *Enforcer) Apply(r *Rules) (time.Duration, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	start := time.Now()
	k := e.kernel
	var errs []error
	try := func(err error, what string) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	for ip, id := range r.IDs {
		if old, ok := k.IDs[ip]; (!ok || old != id) && ip.Is4() {
			if err := e.objs.PolIds.Put(addrKey(ip), id); err == nil {
				k.IDs[ip] = id
			} else {
				try(err, "write pol_ids")
			}
		}
	}
	for key, s := range r.AllowID {
		if old, ok := k.AllowID[key]; !ok || old != s {
			if err := e.objs.PolAllowId.Put(idKey(key), portsValue(s)); err == nil {
				k.AllowID[key] = s
			} else {
				try(err, "write pol_allow_id")
			}
		}
	}
	for key, s := range r.AllowCIDR {
		if old, ok := k.AllowCIDR[key]; !ok || old != s {
			if err := e.objs.PolAllowCidr.Put(cidrKey(key), portsValue(s)); err == nil {
				k.AllowCIDR[key] = s
			} else {
				try(err, "write pol_allow_cidr")
			}
		}
	}
	for ep, name := range r.Isolated {
		if _, ok := k.Isolated[ep]; ok {
			k.Isolated[ep] = name
			continue
		}
		// The drop counter first, so that the first drop is counted.
		zero := make([]uint64, ebpf.MustPossibleCPU())
		if err := e.objs.PolDrops.Update(epKey(ep), zero, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
			try(err, "write pol_drops")
		}
		if err := e.objs.PolIsolated.Put(epKey(ep), uint32(1)); err == nil {
			k.Isolated[ep] = name
		} else {
			try(err, "write pol_isolated")
		}
	}
	for ep := range k.Isolated {
		if _, ok := r.Isolated[ep]; !ok {
			if err := e.objs.PolIsolated.Delete(epKey(ep)); err == nil || errors.Is(err, ebpf.ErrKeyNotExist) {
				delete(k.Isolated, ep)
				e.objs.PolDrops.Delete(epKey(ep))
			} else {
				try(err, "delete pol_isolated")
			}
		}
	}
	for key := range k.AllowCIDR {
		if _, ok := r.AllowCIDR[key]; !ok {
			if err := e.objs.PolAllowCidr.Delete(cidrKey(key)); err == nil || errors.Is(err, ebpf.ErrKeyNotExist) {
				delete(k.AllowCIDR, key)
			} else {
				try(err, "delete pol_allow_cidr")
			}
		}
	}
	for key := range k.AllowID {
		if _, ok := r.AllowID[key]; !ok {
			if err := e.objs.PolAllowId.Delete(idKey(key)); err == nil || errors.Is(err, ebpf.ErrKeyNotExist) {
				delete(k.AllowID, key)
			} else {
				try(err, "delete pol_allow_id")
			}
		}
	}
	for ip := range k.IDs {
		if _, ok := r.IDs[ip]; !ok {
			if err := e.objs.PolIds.Delete(addrKey(ip)); err == nil || errors.Is(err, ebpf.ErrKeyNotExist) {
				delete(k.IDs, ip)
			} else {
				try(err, "delete pol_ids")
			}
		}
	}
	took := time.Since(start)
	if len(errs) > 0 {
		return took, fmt.Errorf("apply network policy rules: %w", errors.Join(errs...))
	}
	return took, nil
}

// Drops returns the packets dropped per isolated local endpoint.
func (e *Enforcer) Drops() map[Endpoint]uint64 {
	out := map[Endpoint]uint64{}
	var k policyPolEp
	var v []uint64
	it := e.objs.PolDrops.Iterate()
	for it.Next(&k, &v) {
		var sum uint64
		for _, n := range v {
			sum += n
		}
		out[Endpoint{addrOf(k.Ip), Dir(k.Dir)}] = sum
	}
	return out
}

// Stats sums the programs' counters over the CPUs.
func (e *Enforcer) Stats() (Stats, error) {
	var s Stats
	for i, dst := range []*uint64{&s.Judged, &s.Allowed, &s.Dropped, &s.ReplyHits} {
		var v []uint64
		if err := e.objs.PolStats.Lookup(uint32(i), &v); err != nil {
			return s, fmt.Errorf("read pol_stats: %w", err)
		}
		for _, n := range v {
			*dst += n
		}
	}
	return s, nil
}

// Close releases the enforcer's handles. The programs stay attached and the
// maps pinned: the node keeps enforcing its last rules with no agent.
func (e *Enforcer) Close() error {
	for _, l := range e.links {
		l.Close()
	}
	return e.objs.Close()
}

// Uninstall detaches the programs and removes the pins: no traffic is
// judged any more.
func (e *Enforcer) Uninstall() error {
	for _, l := range e.links {
		l.Unpin()
	}
	err := e.Close()
	return errors.Join(err, os.RemoveAll(e.dir))
}

// readMaps reads what the pinned maps hold (an earlier agent's rules).
func (e *Enforcer) readMaps() (*Rules, error) {
	r := &Rules{
		IDs:       map[netip.Addr]uint32{},
		Isolated:  map[Endpoint]string{},
		AllowID:   map[IDKey]PortSet{},
		AllowCIDR: map[CIDRKey]PortSet{},
	}
	var ip, id uint32
	it := e.objs.PolIds.Iterate()
	for it.Next(&ip, &id) {
		r.IDs[addrOf(ip)] = id
	}
	errs := []error{it.Err()}
	var ep policyPolEp
	var one uint32
	it = e.objs.PolIsolated.Iterate()
	for it.Next(&ep, &one) {
		r.Isolated[Endpoint{addrOf(ep.Ip), Dir(ep.Dir)}] = ""
	}
	errs = append(errs, it.Err())
	var ik policyPolIdKey
	var pv policyPolPorts
	it = e.objs.PolAllowId.Iterate()
	for it.Next(&ik, &pv) {
		r.AllowID[IDKey{addrOf(ik.Ip), ik.Peer, Dir(ik.Dir)}] = portSetOf(&pv)
	}
	errs = append(errs, it.Err())
	var ck policyPolCidrKey
	it = e.objs.PolAllowCidr.Iterate()
	for it.Next(&ck, &pv) {
		p := netip.PrefixFrom(netip.AddrFrom4(ck.Peer), int(ck.Prefixlen)-64)
		r.AllowCIDR[CIDRKey{addrOf(ck.Ip), Dir(ck.Dir), p}] = portSetOf(&pv)
	}
	if err := errors.Join(append(errs, it.Err())...); err != nil {
		return nil, fmt.Errorf("read pinned policy maps: %w", err)
	}
	return r, nil
}

// addrKey is an IPv4 address as the programs read it: its bytes in network
// order in a native word.
func addrKey(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

func addrOf(k uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], k)
	return netip.AddrFrom4(b)
}

func epKey(ep Endpoint) policyPolEp {
	return policyPolEp{Ip: addrKey(ep.IP), Dir: uint8(ep.Dir)}
}

func idKey(k IDKey) policyPolIdKey {
	return policyPolIdKey{Ip: addrKey(k.Local), Peer: k.Peer, Dir: uint8(k.Dir)}
}

func cidrKey(k CIDRKey) policyPolCidrKey {
	return policyPolCidrKey{Prefixlen: uint32(64 + k.Peer.Bits()), Ip: addrKey(k.Local), Dir: uint8(k.Dir), Peer: k.Peer.Addr().As4()}
}

func portsValue(s PortSet) policyPolPorts {
	v := policyPolPorts{N: uint32(s.N)}
	for i, r := range s.Ranges() {
		v.R[i] = policyPolRange{Lo: r.Lo, Hi: r.Hi, Proto: r.Proto}
	}
	return v
}

func portSetOf(v *policyPolPorts) PortSet {
	s := PortSet{N: int(min(v.N, MaxRanges))}
	for i := range s.N {
		s.R[i] = PortRange{Proto: v.R[i].Proto, Lo: v.R[i].Lo, Hi: v.R[i].Hi}
	}
	return s
}

// cgroup2Root finds the cgroup v2 mount.
func cgroup2Root() (string, error) {
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p, nil
		}
	}
	return "", errors.New("find the cgroup v2 mount: none at /sys/fs/cgroup or /sys/fs/cgroup/unified")
}

// ensureBPFFS mounts bpffs on /sys/fs/bpf when dir is below it and it is
// not mounted yet, as the dataplane does.
func ensureBPFFS(dir string) error {
	const std = "/sys/fs/bpf"
	var st unix.Statfs_t
	if rel, err := filepath.Rel(std, dir); err == nil && rel != ".." && len(rel) > 0 && rel[0] != '.' {
		if unix.Statfs(std, &st) != nil || st.Type != unix.BPF_FS_MAGIC {
			if err := unix.Mount("bpf", std, "bpf", 0, "mode=0700"); err != nil {
				return fmt.Errorf("mount bpffs on %s: %w", std, err)
			}
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create pin directory %s: %w", dir, err)
	}
	return nil
}
