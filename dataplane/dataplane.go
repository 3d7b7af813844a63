package dataplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// labelServiceName ties an EndpointSlice to its Service.
const labelServiceName = discoveryv1.LabelServiceName

// Dataplane programs Service load balancing into the kernel. Its methods
// are safe for concurrent use.
type Dataplane struct {
	cfg      Config
	nodeIPs  []netip.Addr // cfg.NodeIPs unmapped, without duplicates and unusable ones
	sockIPs  []netip.Addr // where NodePorts answer the node's sockets: nodeIPs, loopback (sockAddrs)
	log      *slog.Logger
	mapsDir  string
	linksDir string

	mu        sync.Mutex
	objs      *lbObjects
	cgLinks   []link.Link
	tc        []tcAttachment
	rec       *reconciler
	services  map[types.NamespacedName]*corev1.Service
	slices    map[types.NamespacedName]*discoveryv1.EndpointSlice
	bySvc     map[types.NamespacedName]map[string]bool // Service → names of its slices
	hostPorts map[types.UID][]HostPort                 // pods' host ports (hostports.go)
	owned     map[ownerKey][]feKey                     // frontends a Service or pod has programmed
	owner     map[feKey]ownerKey
	synced    bool
	// deferAttach: maps were replaced on load; the programs are attached
	// by the first full Sync, after the new maps are filled.
	deferAttach bool
	dirty       map[ownerKey]bool // failed to apply; retried by Sync
	resync      bool              // state unknown after a failed write: re-adopt on Sync
	closed      bool
	// lastFull is what the last full resync wrote (for tests and logs).
	lastFull struct{ writes, deletes int }
}

// New probes the kernel, loads the BPF programs and attaches them, adopting
// the maps and links a previous agent pinned under cfg.BPFFSPath. Traffic
// that the pinned state carries keeps flowing throughout. Pinned maps this
// build cannot use (another layout or size) are replaced by new ones; the
// programs are then attached by the first Sync instead, once the new maps
// hold the Services.
func New(cfg Config) (*Dataplane, error) {
	cfg.setDefaults()
	if err := probeKernel(); err != nil {
		return nil, err
	}
	if err := checkFS(cfg.CgroupPath, 0x63677270, "cgroup2"); err != nil {
		return nil, err
	}
	d := &Dataplane{
		cfg:       cfg,
		nodeIPs:   nodeAddrs(cfg.NodeIPs),
		log:       cfg.Logger.With("component", "dataplane"),
		mapsDir:   filepath.Join(cfg.BPFFSPath, "maps"),
		linksDir:  filepath.Join(cfg.BPFFSPath, "links"),
		services:  map[types.NamespacedName]*corev1.Service{},
		slices:    map[types.NamespacedName]*discoveryv1.EndpointSlice{},
		bySvc:     map[types.NamespacedName]map[string]bool{},
		hostPorts: map[types.UID][]HostPort{},
		owned:     map[ownerKey][]feKey{},
		owner:     map[feKey]ownerKey{},
		dirty:     map[ownerKey]bool{},
	}
	for _, dir := range []string{d.mapsDir, d.linksDir} {
		if err := ensureBPFFS(dir); err != nil {
			return nil, err
		}
	}
	var cookie uint64
	if err := inNetns(cfg.NetnsPath, func() error { cookie = netnsCookie(); return nil }); err != nil {
		return nil, err
	}
	d.sockIPs = sockAddrs(d.nodeIPs, cookie)
	objs, replaced, err := loadObjects(&d.cfg, d.mapsDir, cookie)
	if err != nil {
		return nil, err
	}
	d.objs = objs
	fast := newFastWriter(objs.FastWrite, objs.LbFeFast.MaxEntries())
	d.rec = newReconciler(&kmaps{frontends: objs.LbFrontends, fast: fast, slots: objs.LbSlots, backends: objs.LbBackends},
		objs.LbSlots.MaxEntries(), uint32(bits.TrailingZeros32(objs.LbFeFast.MaxEntries())))
	if err := d.rec.adopt(); err != nil {
		objs.Close()
		return nil, err
	}
	// The fast table follows the adopted frontends before any program
	// that reads it is attached (it is rebuilt in any case).
	if err := d.rec.commit(&batch{}); err != nil {
		objs.Close()
		return nil, fmt.Errorf("write frontend fast table: %w", err)
	}
	if err := d.writeNodeConfig(); err != nil {
		objs.Close()
		return nil, err
	}
	if len(replaced) > 0 {
		// An upgrade changed the map layouts or sizes: the programs attached now still
		// serve from the old maps. They are swapped for the new ones only
		// once the first Sync has filled the new maps.
		d.log.Warn("pinned maps have an outdated layout or size; replacing them, the new programs take over after the first sync",
			"maps", replaced)
		d.deferAttach = true
	} else if err := d.attach(); err != nil {
		d.closeLocked()
		return nil, err
	}
	d.log.Info("dataplane ready", "cgroup", cfg.CgroupPath, "pins", cfg.BPFFSPath,
		"adoptedFrontends", len(d.rec.fes), "uplinks", cfg.Uplinks, "tc", d.tcMode())
	return d, nil
}

// attach attaches the programs, or moves pinned links to them. Maps first,
// then programs: the hooks never run against maps that are still being
// filled in a way they could misread.
func (d *Dataplane) attach() error {
	var err error
	d.cgLinks, err = attachCgroup(d.objs, d.cfg.CgroupPath, d.linksDir)
	if err != nil {
		return err
	}
	if len(d.cfg.Uplinks) > 0 {
		err = inNetns(d.cfg.NetnsPath, func() error {
			var err error
			d.tc, err = attachTC(d.objs, d.cfg.Uplinks, d.cfg.TCAttach, d.linksDir)
			return err
		})
		if err != nil {
			return err
		}
	}
	d.deferAttach = false
	return nil
}

func (d *Dataplane) tcMode() string {
	switch {
	case len(d.tc) == 0:
		return "none"
	case d.tc[0].clsact:
		return "clsact"
	default:
		return "tcx"
	}
}

// writeNodeConfig fills lb_node_ips and lb_config from the configuration,
// and stamps lb_config with this build's layout version.
func (d *Dataplane) writeNodeConfig() error {
	want := map[lbLbAddr]bool{}
	var snat uint32
	for _, a := range d.nodeIPs {
		want[toLbAddr(as16(a))] = true
		if a.Is4() && snat == 0 {
			snat = toLbAddr(as16(a)).W[3]
		}
	}
	var k lbLbAddr
	var v uint32
	var stale []lbLbAddr
	it := d.objs.LbNodeIps.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	for _, k := range stale {
		d.objs.LbNodeIps.Delete(&k)
	}
	for k := range want {
		if err := d.objs.LbNodeIps.Put(&k, uint32(1)); err != nil {
			return fmt.Errorf("write node address: %w", err)
		}
	}
	cfg := lbLbCfg{SnatIp4: snat, SnatPortMin: d.cfg.SNATPortMin, SnatPortMax: d.cfg.SNATPortMax}
	if m := d.cfg.Masquerade; m.IsValid() && m.Addr().Is4() {
		m = m.Masked()
		cfg.MasqNet4 = toLbAddr(as16(m.Addr())).W[3]
		cfg.MasqMask4 = toLbAddr(as16(netip.AddrFrom4(maskBytes4(m.Bits())))).W[3]
	}
	if err := d.objs.LbLayout.Get(&cfg.Layout); err != nil {
		return fmt.Errorf("read lb_layout: %w", err)
	}
	if err := d.objs.LbConfig.Put(uint32(0), &cfg); err != nil {
		return fmt.Errorf("write lb config: %w", err)
	}
	return nil
}

// SetMasquerade sets Config.Masquerade, the pod range whose connections
// leaving on an uplink take the node's address; the zero Prefix stops
// masquerading new connections.
func (d *Dataplane) SetMasquerade(p netip.Prefix) error {
	if p.IsValid() && !p.Addr().Is4() {
		return fmt.Errorf("set masquerade range %s: only IPv4 ranges are masqueraded", p)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errors.New("set masquerade range: closed")
	}
	d.cfg.Masquerade = p
	return d.writeNodeConfig()
}

// maskBytes4 returns the IPv4 netmask of a prefix length.
func maskBytes4(bits int) [4]byte {
	var m [4]byte
	v := ^uint32(0) << (32 - bits)
	if bits == 0 {
		v = 0
	}
	m[0], m[1], m[2], m[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
	return m
}

// UpsertService records a Service (created or changed). After the first Sync
// the change is in the kernel when the call returns.
func (d *Dataplane) UpsertService(svc *corev1.Service) {
	key := types.NamespacedName{Namespace: svc.Namespace, Name: svc.Name}
	d.mu.Lock()
	d.services[key] = svc
	d.applyLocked(serviceOwner(key))
	d.mu.Unlock()
	for _, o := range d.cfg.Observers {
		o.UpsertService(svc)
	}
}

// DeleteService forgets a Service and removes its frontends.
func (d *Dataplane) DeleteService(namespace, name string) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	d.mu.Lock()
	delete(d.services, key)
	d.applyLocked(serviceOwner(key))
	d.mu.Unlock()
	for _, o := range d.cfg.Observers {
		o.DeleteService(namespace, name)
	}
}

// UpsertEndpointSlice records an EndpointSlice. Slices are tied to their
// Service by the kubernetes.io/service-name label, so Services without a
// selector work with slices their users manage.
func (d *Dataplane) UpsertEndpointSlice(s *discoveryv1.EndpointSlice) {
	key := types.NamespacedName{Namespace: s.Namespace, Name: s.Name}
	d.mu.Lock()
	old := d.slices[key]
	d.slices[key] = s
	newSvc := sliceService(s)
	if old != nil {
		if oldSvc := sliceService(old); oldSvc != newSvc && oldSvc.Name != "" {
			delete(d.bySvc[oldSvc], s.Name)
			d.applyLocked(serviceOwner(oldSvc))
		}
	}
	if newSvc.Name != "" {
		if d.bySvc[newSvc] == nil {
			d.bySvc[newSvc] = map[string]bool{}
		}
		d.bySvc[newSvc][s.Name] = true
		d.applyLocked(serviceOwner(newSvc))
	}
	d.mu.Unlock()
	for _, o := range d.cfg.Observers {
		o.UpsertEndpointSlice(s)
	}
}

// DeleteEndpointSlice forgets an EndpointSlice.
func (d *Dataplane) DeleteEndpointSlice(namespace, name string) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	d.mu.Lock()
	if old := d.slices[key]; old != nil {
		delete(d.slices, key)
		if svc := sliceService(old); svc.Name != "" {
			delete(d.bySvc[svc], name)
			if len(d.bySvc[svc]) == 0 {
				delete(d.bySvc, svc)
			}
			d.applyLocked(serviceOwner(svc))
		}
	}
	d.mu.Unlock()
	for _, o := range d.cfg.Observers {
		o.DeleteEndpointSlice(namespace, name)
	}
}

func sliceService(s *discoveryv1.EndpointSlice) types.NamespacedName {
	return types.NamespacedName{Namespace: s.Namespace, Name: s.Labels[labelServiceName]}
}

// desiredFor computes the frontends of one owner from the recorded state.
func (d *Dataplane) desiredFor(o ownerKey) []desiredFE {
	if o.pod != "" {
		return desiredHostPorts(d.hostPorts[o.pod], d.sockIPs)
	}
	key := o.svc
	svc := d.services[key]
	if svc == nil {
		return nil
	}
	names := d.bySvc[key]
	eps := make([]*discoveryv1.EndpointSlice, 0, len(names))
	for name := range names {
		if s := d.slices[types.NamespacedName{Namespace: key.Namespace, Name: name}]; s != nil {
			eps = append(eps, s)
		}
	}
	return desiredFrontends(svc, eps, d.cfg.NodeName, d.sockIPs)
}

// plan adds to b what owner key needs and returns the frontends it will
// own afterwards.
func (d *Dataplane) plan(key ownerKey, b *batch) []feKey {
	return d.planDesired(key, d.desiredFor(key), b)
}

// planDesired is plan with the desired frontends already computed.
func (d *Dataplane) planDesired(key ownerKey, want []desiredFE, b *batch) []feKey {
	keys := make([]feKey, 0, len(want))
	for _, fe := range want {
		if o, taken := d.owner[fe.Key]; taken && o != key {
			d.log.Warn("frontend already used by another Service or host port; ignoring it", "for", key,
				"owner", o, "address", fe.Key.IP.Unmap(), "port", fe.Key.Port)
			continue
		}
		if err := d.rec.upsert(fe, b); err != nil {
			d.log.Error("program frontend; keeping its previous backends", "for", key,
				"address", fe.Key.IP.Unmap(), "port", fe.Key.Port, "backends", len(fe.Backends), "err", err)
			if _, ok := d.rec.fes[fe.Key]; !ok {
				continue
			}
		}
		keys = append(keys, fe.Key)
	}
	for _, k := range d.owned[key] {
		if !slices.Contains(keys, k) {
			d.rec.remove(k, b)
		}
	}
	return keys
}

func (d *Dataplane) setOwned(key ownerKey, keys []feKey) {
	for _, k := range d.owned[key] {
		if d.owner[k] == key {
			delete(d.owner, k)
		}
	}
	if len(keys) == 0 {
		delete(d.owned, key)
		return
	}
	d.owned[key] = keys
	for _, k := range keys {
		d.owner[k] = key
	}
}

// applyLocked programs one owner now if the first Sync has happened.
func (d *Dataplane) applyLocked(key ownerKey) {
	if !d.synced || d.closed || d.resync {
		d.dirty[key] = true
		return
	}
	var b batch
	keys := d.plan(key, &b)
	if err := d.rec.commit(&b); err != nil {
		// The kernel may hold part of the batch: re-read it on the next
		// Sync rather than guess.
		d.log.Error("program frontends; will resync", "for", key, "err", err)
		d.resync = true
		d.dirty[key] = true
		return
	}
	d.setOwned(key, keys)
	delete(d.dirty, key)
}

// Sync applies everything recorded but not yet in the kernel. The first call
// is the full resync: it writes all Services with batch updates and removes
// whatever pinned state no recorded Service wants any more, so call it once
// the informers have synced. Later calls retry changes that failed.
func (d *Dataplane) Sync(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errors.New("sync dataplane: closed")
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	start := time.Now()
	full := !d.synced || d.resync
	if d.resync {
		if err := d.rec.adopt(); err != nil {
			return fmt.Errorf("sync dataplane: %w", err)
		}
	}
	var b batch
	if full {
		// Every Service, plus every frontend nobody wants. Where two
		// owners want one frontend, the one that held it keeps it;
		// otherwise the order of desiredAll decides, so a full Sync
		// gives the same answer every time.
		keys, wants := d.desiredAll()
		prev := d.owner
		d.owned = map[ownerKey][]feKey{}
		d.owner = make(map[feKey]ownerKey, len(d.rec.fes))
		for i, key := range keys {
			for _, fe := range wants[i] {
				if o, ok := prev[fe.Key]; ok && o == key {
					d.owner[fe.Key] = key
				}
			}
		}
		owned := make(map[ownerKey][]feKey, len(keys))
		for i, key := range keys {
			owned[key] = d.planDesired(key, wants[i], &b)
			for _, k := range owned[key] {
				d.owner[k] = key
			}
		}
		for k := range d.rec.fes {
			if _, ok := d.owner[k]; !ok {
				d.rec.remove(k, &b)
			}
		}
		b.delBE = append(b.delBE, d.rec.garbageBEs...)
		if err := d.rec.commit(&b); err != nil {
			d.resync = true
			return fmt.Errorf("sync dataplane: %w", err)
		}
		d.rec.garbageBEs = nil
		d.owned = owned
		if d.deferAttach {
			if err := d.attach(); err != nil {
				return fmt.Errorf("sync dataplane: %w", err)
			}
		}
		d.synced, d.resync = true, false
		d.dirty = map[ownerKey]bool{}
		d.lastFull.writes = len(b.beKeys) + len(b.slotKeys) + len(b.feKeys)
		d.lastFull.deletes = len(b.delFE) + len(b.delBE)
		d.log.Info("dataplane synced", "services", len(d.services), "hostPortPods", len(d.hostPorts), "frontends", len(d.rec.fes),
			"writes", len(b.beKeys)+len(b.slotKeys)+len(b.feKeys),
			"deletes", len(b.delFE)+len(b.delBE), "took", time.Since(start))
		return nil
	}
	for key := range d.dirty {
		d.applyLocked(key)
	}
	if d.resync {
		return errors.New("sync dataplane: writes failed; state will be re-read on the next Sync")
	}
	return nil
}

// Stats are the dataplane's counters since its maps were created.
type Stats struct {
	SocketTranslations uint64 // connect/sendmsg calls sent to a backend
	SocketRefused      uint64 // refused: Service without usable backends
	SocketRetries      uint64 // lookups that raced with an update and retried
	NodePortFlows      uint64 // new north-south flows
	NodePortSNAT       uint64 // ... of which source-translated
	NodePortReverse    uint64 // reply packets translated back
	NodePortRefused    uint64 // TCP resets for frontends without backends
	NodePortDropped    uint64 // dropped north-south packets
	SocketRevLocal     uint64 // connected sockets whose reverse translation went to socket-local storage (lb_sk_rev entry taken)
	Masqueraded        uint64 // pod connections given the node's address on an uplink
	MasqueradeDropped  uint64 // pod packets dropped for want of a free masquerade port
	Frontends          int    // frontends programmed
	FastResident       int    // socket-scope frontends found in their lb_fe_fast line
	FastSpilled        int    // socket-scope frontends found in lb_frontends after their line
	// FastByChoice splits FastResident by the line a frontend sits in:
	// its first, or the second or third that readers try after it.
	FastByChoice [fastChoices]int
}

// Stats reads the counters.
func (d *Dataplane) Stats() (Stats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return Stats{}, errors.New("read stats: closed")
	}
	var out Stats
	fields := []*uint64{&out.SocketTranslations, &out.SocketRefused, &out.SocketRetries, &out.NodePortFlows,
		&out.NodePortSNAT, &out.NodePortReverse, &out.NodePortRefused, &out.NodePortDropped, &out.SocketRevLocal,
		&out.Masqueraded, &out.MasqueradeDropped}
	for i, f := range fields {
		var per []uint64
		if err := d.objs.LbStats.Lookup(uint32(i), &per); err != nil {
			return out, fmt.Errorf("read stats: %w", err)
		}
		for _, v := range per {
			*f += v
		}
	}
	out.Frontends = len(d.rec.fes)
	out.FastByChoice, out.FastSpilled = d.rec.fast.stats()
	for _, c := range out.FastByChoice {
		out.FastResident += c
	}
	return out, nil
}

// MapMemory returns the kernel memory charged to the pinned maps, in bytes.
func (d *Dataplane) MapMemory() (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return 0, errors.New("read map memory: closed")
	}
	var total uint64
	for _, m := range d.objs.maps() {
		info, err := m.Info()
		if err != nil {
			return 0, fmt.Errorf("read map info: %w", err)
		}
		if v, ok := info.Memlock(); ok {
			total += v
		}
	}
	return total, nil
}

// Close releases the agent's handles. Programs stay attached and maps stay
// pinned, so Services keep working until a new Dataplane adopts them.
func (d *Dataplane) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closeLocked()
}

func (d *Dataplane) closeLocked() error {
	if d.closed {
		return nil
	}
	d.closed = true
	closeLinks(d.cgLinks)
	for _, a := range d.tc {
		closeLinks(a.links)
	}
	return d.objs.Close()
}

// Uninstall detaches every program, deletes tc filters and removes the pins:
// Services stop being load-balanced. The Dataplane is closed afterwards.
func (d *Dataplane) Uninstall() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errors.New("uninstall dataplane: closed")
	}
	var errs []error
	for _, l := range d.cgLinks {
		if err := l.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin link: %w", err))
		}
	}
	for _, a := range d.tc {
		for _, l := range a.links {
			if err := l.Unpin(); err != nil {
				errs = append(errs, fmt.Errorf("unpin link: %w", err))
			}
		}
	}
	if err := inNetns(d.cfg.NetnsPath, func() error {
		var errs []error
		for _, a := range d.tc {
			if a.clsact {
				errs = append(errs, detachClsact(a.ifname))
			}
		}
		return errors.Join(errs...)
	}); err != nil {
		errs = append(errs, err)
	}
	for _, m := range d.objs.maps() {
		if err := m.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin map: %w", err))
		}
	}
	errs = append(errs, d.closeLocked())
	// Remove what other builds may have left (stale link pins) and the
	// directories themselves.
	for _, dir := range []string{d.linksDir, d.mapsDir} {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			os.Remove(filepath.Join(dir, e.Name()))
		}
		os.Remove(dir)
	}
	os.Remove(d.cfg.BPFFSPath)
	return errors.Join(errs...)
}

// frontendCount is the number of frontends programmed.
func (d *Dataplane) frontendCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.rec.fes)
}

// maps lists every map of the object, in the order of lb.c.
func (o *lbObjects) maps() []*ebpf.Map {
	return []*ebpf.Map{o.LbFrontends, o.LbFeFast, o.LbFeGen, o.LbSlots, o.LbBackends, o.LbSkRev, o.LbSkRnat, o.LbAffinity,
		o.LbSockRnat, o.LbNodeIps, o.LbCt4, o.LbRct4, o.LbConfig, o.LbStats}
}

// desiredAll computes the frontends of every recorded Service and pod,
// spread over the CPUs (it only reads the recorded objects). Owners come
// in a fixed order: Services by name
// before pods by UID, so that of a NodePort and a host port wanting one
// frontend the Service's is written.
func (d *Dataplane) desiredAll() ([]ownerKey, [][]desiredFE) {
	keys := make([]ownerKey, 0, len(d.services)+len(d.hostPorts))
	for k := range d.services {
		keys = append(keys, serviceOwner(k))
	}
	for uid := range d.hostPorts {
		keys = append(keys, ownerKey{pod: uid})
	}
	slices.SortFunc(keys, func(a, b ownerKey) int {
		if (a.pod == "") != (b.pod == "") {
			if a.pod == "" {
				return -1
			}
			return 1
		}
		if c := strings.Compare(string(a.pod), string(b.pod)); c != 0 {
			return c
		}
		return strings.Compare(a.svc.String(), b.svc.String())
	})
	want := make([][]desiredFE, len(keys))
	workers := min(runtime.GOMAXPROCS(0), len(keys)/256+1)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < len(keys); i += workers {
				want[i] = d.desiredFor(keys[i])
			}
		})
	}
	wg.Wait()
	return keys, want
}
