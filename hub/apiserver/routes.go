package apiserver

import (
	"fmt"
	"sync"
	"sync/atomic"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/hub/registry"
)

// routeTable maps a group-version and a resource to the kind serving it.
type routeTable map[schema.GroupVersion]map[string]*registry.Kind

// routes is the routing table of a server whose kinds follow a registry:
// rebuilt, at most once per change of the registry, by the first request
// that finds it stale. Requests read it without locking.
type routes struct {
	mu  sync.Mutex // serialises rebuilds
	cur atomic.Pointer[generationTable]
}

// generationTable is the routing table of one generation of a registry.
type generationTable struct {
	gen   uint64
	table routeTable
}

// newRouteTable builds the table of kinds, the review kinds added. A kind
// listed earlier wins over a later one of the same group, version and
// resource, so a custom resource never hides a built-in one.
func newRouteTable(kinds []*registry.Kind) routeTable {
	t := routeTable{}
	for _, k := range append(registry.Served(kinds), registry.ReviewKinds()...) {
		gv := k.GVK.GroupVersion()
		if t[gv] == nil {
			t[gv] = map[string]*registry.Kind{}
		}
		if t[gv][k.Resource] == nil {
			t[gv][k.Resource] = k
		}
	}
	return t
}

// checkTypes makes sure every kind without a New of its own has a type
// in the server's scheme.
func (s *Server) checkTypes(kinds []*registry.Kind) error {
	for _, k := range kinds {
		if k.New != nil {
			continue
		}
		if _, err := s.scheme.New(k.GVK); err != nil {
			return fmt.Errorf("register kind %s: %w", k.GVK, err)
		}
	}
	return nil
}

// routing returns the current routing table: the fixed one of
// Config.Kinds, or the registry's as of its current generation.
func (s *Server) routing() routeTable {
	reg := s.cfg.Registry
	if reg == nil {
		return s.kinds
	}
	gen := reg.Generation()
	if cur := s.routes.cur.Load(); cur != nil && cur.gen == gen {
		return cur.table
	}
	s.routes.mu.Lock()
	defer s.routes.mu.Unlock()
	if cur := s.routes.cur.Load(); cur != nil && cur.gen == gen {
		return cur.table
	}
	// The generation is read before the kinds: a change in between makes
	// the next request rebuild again, never serve a stale table.
	cur := &generationTable{gen: gen, table: newRouteTable(reg.Kinds())}
	s.routes.cur.Store(cur)
	return cur.table
}
