package site

import (
	"bytes"
	"fmt"
	"net"
	"reflect"
	"strconv"
	"sync"
	"unsafe"

	"github.com/hashicorp/memberlist"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tether-edge/tether/internal/sitedigest"
)

// meta is what a member gossips about itself in its memberlist node meta:
// a version byte, a flags byte and the member's generation (big-endian
// uint16).
type meta struct {
	connected  bool
	generation uint16
}

const (
	metaVersion   = 1
	metaConnected = 1 << 0
)

func (m meta) encode() []byte {
	var flags byte
	if m.connected {
		flags |= metaConnected
	}
	return []byte{metaVersion, flags, byte(m.generation >> 8), byte(m.generation)}
}

func decodeMeta(b []byte) meta {
	if len(b) < 4 || b[0] != metaVersion {
		return meta{}
	}
	return meta{connected: b[1]&metaConnected != 0, generation: uint16(b[2])<<8 | uint16(b[3])}
}

// incarnation is a member's incarnation in the view: its generation in the
// high 16 bits, memberlist's incarnation (saturated) in the low 16. A
// member that restarts starts memberlist at incarnation 1 again; with the
// generation in front its incarnations keep growing even when the whole
// site restarted and nobody remembers the old ones.
func incarnation(generation uint16, inc uint32) uint32 {
	return uint32(generation)<<16 | min(inc, 0xFFFF)
}

// delegate is the Site seen by memberlist.
type delegate struct{ s *Site }

func (d delegate) NodeMeta(limit int) []byte {
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	return meta{connected: d.s.connected && !d.s.leaving, generation: d.s.cfg.Generation}.encode()
}

func (delegate) NotifyMsg([]byte)                           {}
func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (delegate) LocalState(join bool) []byte                { return nil }
func (delegate) MergeRemoteState(buf []byte, join bool)     {}
func (d delegate) NotifyJoin(*memberlist.Node)              { d.s.kick() }
func (d delegate) NotifyLeave(*memberlist.Node)             { d.s.kick() }
func (d delegate) NotifyUpdate(*memberlist.Node)            { d.s.kick() }

// NotifyAlive refuses nodes that are not at a peer address.
func (d delegate) NotifyAlive(n *memberlist.Node) error {
	if n.Name == d.s.cfg.Node {
		return nil
	}
	addr := net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
	d.s.mu.Lock()
	ok := d.s.peerSet[addr]
	d.s.mu.Unlock()
	if !ok {
		d.s.droppedNonMember.Add(1)
		return fmt.Errorf("node %s at %s is not a peer of site %s", n.Name, addr, d.s.cfg.Site)
	}
	return nil
}

// nodeState is one entry of memberlist's node table.
type nodeState struct {
	name        string
	ip          []byte
	port        uint16
	addr        string // ip and port as host:port
	meta        []byte
	incarnation uint32
	state       memberlist.NodeStateType
}

// nodeTable reads memberlist's node table: every node it knows with its
// state and incarnation. memberlist's API gives only the alive and
// suspect nodes without their state or incarnation (Members), and no
// event for suspicion, so the table is read under memberlist's own lock
// by reflection. The layout is checked once, when the table is made for
// a memberlist; TestNodeTableLayout fails if a memberlist release changes
// the fields read here, and newNodeTable then reports an error rather
// than guess.
//
// The site polls the table several times a second on every node, so a
// read that finds the table as it was last time allocates nothing and
// reports no change.
type nodeTable struct {
	lock  *sync.RWMutex // memberlist's own
	nodes reflect.Value // the []*nodeState slice field
	// Field index paths in memberlist's nodeState (which embeds Node).
	name, addr, port, meta, incarnation, state []int
	last                                       []nodeState
}

func newNodeTable(ml *memberlist.Memberlist) (*nodeTable, error) {
	v := reflect.ValueOf(ml).Elem()
	lockF, nodesF := v.FieldByName("nodeLock"), v.FieldByName("nodes")
	if !lockF.IsValid() || lockF.Type() != reflect.TypeFor[sync.RWMutex]() ||
		!nodesF.IsValid() || nodesF.Kind() != reflect.Slice ||
		nodesF.Type().Elem().Kind() != reflect.Pointer {
		return nil, fmt.Errorf("read memberlist node table: unknown layout of %s", v.Type())
	}
	t := &nodeTable{lock: (*sync.RWMutex)(unsafe.Pointer(lockF.UnsafeAddr())), nodes: nodesF}
	et := nodesF.Type().Elem().Elem()
	for name, f := range map[string]struct {
		kind  reflect.Kind
		index *[]int
	}{"Name": {reflect.String, &t.name}, "Addr": {reflect.Slice, &t.addr}, "Port": {reflect.Uint16, &t.port},
		"Meta": {reflect.Slice, &t.meta}, "Incarnation": {reflect.Uint32, &t.incarnation}, "State": {reflect.Int, &t.state}} {
		sf, ok := et.FieldByName(name)
		if !ok || sf.Type.Kind() != f.kind || !direct(et, sf.Index) {
			return nil, fmt.Errorf("read memberlist node table: unknown layout of %s", et)
		}
		*f.index = sf.Index
	}
	return t, nil
}

// direct reports whether the field at index path in struct type t is
// reached without following a pointer, so that reading it allocates
// nothing and cannot meet a nil embedded pointer.
func direct(t reflect.Type, path []int) bool {
	for _, i := range path[:len(path)-1] {
		t = t.Field(i).Type
		if t.Kind() != reflect.Struct {
			return false
		}
	}
	return true
}

// read returns the table, and whether it changed since the last read.
// Not safe for concurrent use; the returned slice is the table's until
// the next read.
func (t *nodeTable) read() ([]nodeState, bool) {
	t.lock.RLock()
	defer t.lock.RUnlock()
	n := t.nodes.Len()
	if n == len(t.last) {
		same := true
		for i := 0; i < n && same; i++ {
			same = t.equal(t.nodes.Index(i).Elem(), &t.last[i])
		}
		if same {
			return t.last, false
		}
	}
	out := make([]nodeState, 0, n)
	for i := range n {
		e := t.nodes.Index(i).Elem()
		ip := bytes.Clone(e.FieldByIndex(t.addr).Bytes())
		port := uint16(e.FieldByIndex(t.port).Uint())
		out = append(out, nodeState{
			name:        e.FieldByIndex(t.name).String(),
			ip:          ip,
			port:        port,
			addr:        net.JoinHostPort(net.IP(ip).String(), strconv.FormatUint(uint64(port), 10)),
			meta:        bytes.Clone(e.FieldByIndex(t.meta).Bytes()),
			incarnation: uint32(e.FieldByIndex(t.incarnation).Uint()),
			state:       memberlist.NodeStateType(e.FieldByIndex(t.state).Int()),
		})
	}
	t.last = out
	return out, true
}

// equal reports whether memberlist's entry e holds what n recorded.
func (t *nodeTable) equal(e reflect.Value, n *nodeState) bool {
	return e.FieldByIndex(t.name).String() == n.name &&
		uint32(e.FieldByIndex(t.incarnation).Uint()) == n.incarnation &&
		memberlist.NodeStateType(e.FieldByIndex(t.state).Int()) == n.state &&
		uint16(e.FieldByIndex(t.port).Uint()) == n.port &&
		bytes.Equal(e.FieldByIndex(t.addr).Bytes(), n.ip) &&
		bytes.Equal(e.FieldByIndex(t.meta).Bytes(), n.meta)
}

func digestState(t memberlist.NodeStateType) sitedigest.State {
	switch t {
	case memberlist.StateSuspect:
		return sitedigest.Suspect
	case memberlist.StateDead:
		return sitedigest.Dead
	case memberlist.StateLeft:
		return sitedigest.Left
	}
	return sitedigest.Alive
}

// refresh reads memberlist's node table into the view and signals a
// change. Members memberlist has forgotten (it drops dead ones after
// GossipToTheDeadTime) stay in the view as last seen while their address
// is a peer's, so a dead node does not turn into an unknown one.
func (s *Site) refresh() {
	s.mu.Lock()
	table := s.table
	s.mu.Unlock()
	if table == nil {
		return
	}
	nodes, changed := table.read()
	s.mu.Lock()
	defer s.mu.Unlock()
	// The view follows from the table and the peer set alone: with
	// neither changed it is what it was.
	if !changed && !s.peersChanged {
		return
	}
	s.peersChanged = false
	d := sitedigest.Digest{Site: s.cfg.Site}
	metas := make(map[string]meta, len(nodes))
	seen := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		if len(validation.IsDNS1123Subdomain(n.name)) > 0 {
			continue // not a Node name: cannot be reported
		}
		seen[n.name] = true
		m := decodeMeta(n.meta)
		metas[n.name] = m
		s.addrs[n.name] = n.addr
		d.Members = append(d.Members, sitedigest.Member{Node: n.name, State: digestState(n.state),
			Incarnation: incarnation(m.generation, n.incarnation)})
	}
	for _, m := range s.view.Members {
		if seen[m.Node] || m.Node == s.cfg.Node || !s.peerSet[s.addrs[m.Node]] {
			continue
		}
		if m.State == sitedigest.Alive || m.State == sitedigest.Suspect {
			m.State = sitedigest.Dead
		}
		d.Members = append(d.Members, m)
		metas[m.Node] = meta{}
	}
	d.Normalize()
	metaChanged := len(metas) != len(s.metas)
	for k, v := range metas {
		if o, ok := s.metas[k]; !ok || o != v {
			metaChanged = true
		}
	}
	s.metas = metas
	if d.Equal(s.view) && !metaChanged {
		return
	}
	s.view = d
	close(s.changed)
	s.changed = make(chan struct{})
}
