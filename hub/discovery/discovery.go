// Package discovery serves the API discovery documents kubectl and client-go
// read to learn which groups, versions and resources the hub serves: the
// legacy /api, /apis, /apis/<group> and /apis/<group>/<version> documents and
// the aggregated apidiscovery.k8s.io form of /api and /apis.
package discovery

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"mime"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	apidiscoveryv2beta1 "k8s.io/api/apidiscovery/v2beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"

	"github.com/tether-edge/tether/hub/registry"
)

// DefaultVerbs are the verbs of a resource whose Kind names none.
var DefaultVerbs = []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}

// Subresource describes a subresource served beyond the ones derived from a
// Kind (status, scale, pods/binding, namespaces/finalize), such as pods/log
// or pods/exec.
type Subresource struct {
	// Parent is the resource the subresource belongs to.
	Parent schema.GroupVersionResource
	// Name is the subresource's name, e.g. "log".
	Name string
	// Kind is the kind of the subresource's body; an empty Kind means the
	// parent's kind.
	Kind schema.GroupVersionKind
	// Verbs are the verbs the subresource serves.
	Verbs []string
}

// Config adjusts the documents.
type Config struct {
	// Subresources are extra subresources to list. Those whose parent is not
	// served are ignored. Nil means none.
	Subresources []Subresource
	// ServerAddress is the host:port in serverAddressByClientCIDRs of /api;
	// "" means the Host the request was sent to.
	ServerAddress string
	// Registry, when set, is the source of the kinds instead of New's
	// kinds argument: the documents follow the registry's current kinds,
	// the review kinds (registry.ReviewKinds) added, and are built again
	// when its generation changes, their ETags changing with them.
	Registry *registry.Registry
}

// Content types of aggregated discovery responses.
const (
	ContentTypeV2      = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
	ContentTypeV2Beta1 = "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
)

type subres struct {
	name  string
	gvk   schema.GroupVersionKind
	verbs []string
}

type resource struct {
	kind *registry.Kind
	subs []subres
}

type groupVersion struct {
	gv        schema.GroupVersion
	resources []resource
}

type group struct {
	name     string
	versions []*groupVersion // preferred first
}

// doc is a pre-encoded response.
type doc struct {
	body []byte
	etag string
}

// Handler serves the discovery documents.
type Handler struct {
	cfg Config

	mu  sync.Mutex
	gen uint64 // of the registry, when the documents follow one
	cur *docs
}

// docs are the documents of one set of kinds.
type docs struct {
	core   *group
	groups []*group // named groups: built-in ones in the order of kinds, then custom ones by name

	legacy map[string]doc // by path, except /api whose address depends on the request
	aggV2  [2]doc         // /api, /apis
	aggV2b [2]doc
}

// New returns a handler serving discovery for kinds (or, when
// cfg.Registry is set, for the registry's kinds). It answers /api,
// /api/v1, /apis, /apis/<group> and /apis/<group>/<version>, and 404 for
// anything else below them.
func New(kinds []*registry.Kind, cfg Config) *Handler {
	h := &Handler{cfg: cfg}
	if cfg.Registry == nil {
		h.cur = buildDocs(kinds, cfg)
	}
	return h
}

// current returns the documents of the kinds served now.
func (h *Handler) current() *docs {
	reg := h.cfg.Registry
	if reg == nil {
		return h.cur
	}
	gen := reg.Generation()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == nil || h.gen != gen {
		// The generation is read before the kinds: a change in between
		// only makes the next request build again.
		h.cur = buildDocs(append(registry.Served(reg.Kinds()), registry.ReviewKinds()...), h.cfg)
		h.gen = gen
	}
	return h.cur
}

// custom reports whether k is a custom resource (its objects are not Go
// types of the hub's scheme).
func custom(k *registry.Kind) bool { return k.New != nil }

func buildDocs(kinds []*registry.Kind, cfg Config) *docs {
	h := &docs{legacy: map[string]doc{}}
	byGroup := map[string]*group{}
	builtin := map[string]bool{}
	for _, k := range kinds {
		if !custom(k) {
			builtin[k.GVK.Group] = true
		}
	}
	seen := map[schema.GroupVersionResource]bool{}
	var customGroups []*group
	for _, k := range kinds {
		if seen[k.GroupVersionResource()] {
			continue // served by the kind listed first, as the API server does
		}
		seen[k.GroupVersionResource()] = true
		g := byGroup[k.GVK.Group]
		if g == nil {
			g = &group{name: k.GVK.Group}
			byGroup[g.name] = g
			switch {
			case g.name == "":
				h.core = g
			case !builtin[g.name]:
				customGroups = append(customGroups, g)
			default:
				h.groups = append(h.groups, g)
			}
		}
		var v *groupVersion
		for _, x := range g.versions {
			if x.gv.Version == k.GVK.Version {
				v = x
			}
		}
		if v == nil {
			v = &groupVersion{gv: k.GVK.GroupVersion()}
			g.versions = append(g.versions, v)
		}
		v.resources = append(v.resources, resource{kind: k, subs: subresources(k, cfg.Subresources)})
	}
	for _, g := range byGroup {
		sort.SliceStable(g.versions, func(i, j int) bool {
			return version.CompareKubeAwareVersionStrings(g.versions[i].gv.Version, g.versions[j].gv.Version) > 0
		})
		for _, v := range g.versions {
			sort.SliceStable(v.resources, func(i, j int) bool {
				return v.resources[i].kind.Resource < v.resources[j].kind.Resource
			})
		}
	}
	// Custom groups follow the built-in ones, by name, as upstream's
	// aggregator orders groups of equal priority; a group a custom
	// resource shares with built-in kinds stays where those are.
	sort.Slice(customGroups, func(i, j int) bool { return customGroups[i].name < customGroups[j].name })
	h.groups = append(h.groups, customGroups...)
	h.build()
	return h
}

func subresources(k *registry.Kind, extra []Subresource) []subres {
	var subs []subres
	core := k.GVK.GroupVersion() == schema.GroupVersion{Version: "v1"}
	if k.HasStatus {
		subs = append(subs, subres{"status", k.GVK, []string{"get", "patch", "update"}})
	}
	if k.Scale != nil {
		subs = append(subs, subres{"scale", schema.GroupVersionKind{Group: "autoscaling", Version: "v1", Kind: "Scale"}, []string{"get", "patch", "update"}})
	}
	if core && k.Resource == "pods" {
		subs = append(subs, subres{"binding", schema.GroupVersionKind{Version: "v1", Kind: "Binding"}, []string{"create"}})
	}
	if core && k.Resource == "namespaces" {
		subs = append(subs, subres{"finalize", k.GVK, []string{"update"}})
	}
	for _, e := range extra {
		if e.Parent != k.GroupVersionResource() || slices.ContainsFunc(subs, func(s subres) bool { return s.name == e.Name }) {
			continue
		}
		gvk := e.Kind
		if gvk.Empty() {
			gvk = k.GVK
		}
		subs = append(subs, subres{e.Name, gvk, slices.Clone(e.Verbs)})
	}
	sort.Slice(subs, func(i, j int) bool { return subs[i].name < subs[j].name })
	return subs
}

func verbsOf(k *registry.Kind) []string {
	if k.Verbs != nil {
		return slices.Clone(k.Verbs)
	}
	return slices.Clone(DefaultVerbs)
}

func newDoc(v any) doc {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("encode discovery document: %v", err))
	}
	b = append(b, '\n')
	sum := sha256.Sum256(b)
	return doc{body: b, etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
}

func (h *docs) build() {
	if h.core != nil {
		for _, v := range h.core.versions {
			h.legacy["/api/"+v.gv.Version] = newDoc(resourceList(v))
		}
	}
	list := metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{}}
	for _, g := range h.groups {
		ag := apiGroup(g)
		list.Groups = append(list.Groups, ag)
		ag.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
		h.legacy["/apis/"+g.name] = newDoc(ag)
		for _, v := range g.versions {
			h.legacy["/apis/"+g.name+"/"+v.gv.Version] = newDoc(resourceList(v))
		}
	}
	h.legacy["/apis"] = newDoc(list)

	var coreGroups []*group
	if h.core != nil {
		coreGroups = []*group{h.core}
	}
	h.aggV2[0] = newDoc(aggregatedV2(coreGroups))
	h.aggV2[1] = newDoc(aggregatedV2(h.groups))
	h.aggV2b[0] = newDoc(aggregatedV2Beta1(coreGroups))
	h.aggV2b[1] = newDoc(aggregatedV2Beta1(h.groups))
}

func apiGroup(g *group) metav1.APIGroup {
	ag := metav1.APIGroup{Name: g.name}
	for _, v := range g.versions {
		ag.Versions = append(ag.Versions, metav1.GroupVersionForDiscovery{GroupVersion: v.gv.String(), Version: v.gv.Version})
	}
	ag.PreferredVersion = ag.Versions[0]
	return ag
}

func resourceList(v *groupVersion) metav1.APIResourceList {
	l := metav1.APIResourceList{
		TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
		GroupVersion: v.gv.String(),
		APIResources: []metav1.APIResource{},
	}
	for _, r := range v.resources {
		k := r.kind
		l.APIResources = append(l.APIResources, metav1.APIResource{
			Name:         k.Resource,
			SingularName: k.Singular,
			Namespaced:   k.Namespaced,
			Kind:         k.GVK.Kind,
			Verbs:        verbsOf(k),
			ShortNames:   slices.Clone(k.ShortNames),
			Categories:   slices.Clone(k.Categories),

			StorageVersionHash: storageVersionHash(k),
		})
		for _, s := range r.subs {
			ar := metav1.APIResource{
				Name:       k.Resource + "/" + s.name,
				Namespaced: k.Namespaced,
				Kind:       s.gvk.Kind,
				Verbs:      s.verbs,
			}
			if s.gvk.GroupVersion() != v.gv {
				ar.Group, ar.Version = s.gvk.Group, s.gvk.Version
			}
			l.APIResources = append(l.APIResources, ar)
		}
	}
	return l
}

// storageVersionHash is the storageVersionHash upstream's legacy discovery
// gives a resource: the first 8 bytes of the SHA-256 of the group, version
// and kind it is stored as, "group/version/kind", in base64. It changes
// only when the stored form does: events.k8s.io Events are core Events
// and hash as such. The aggregated documents have no such field.
func storageVersionHash(k *registry.Kind) string {
	if k.NotStored {
		return ""
	}
	gvk := k.GVK
	if !k.StoredAs.Empty() {
		gvk = k.StoredAs
	}
	sum := sha256.Sum256([]byte(gvk.Group + "/" + gvk.Version + "/" + gvk.Kind))
	return base64.StdEncoding.EncodeToString(sum[:8])
}

func scopeOf(k *registry.Kind) apidiscoveryv2.ResourceScope {
	if k.Namespaced {
		return apidiscoveryv2.ScopeNamespace
	}
	return apidiscoveryv2.ScopeCluster
}

func aggregatedV2(groups []*group) apidiscoveryv2.APIGroupDiscoveryList {
	l := apidiscoveryv2.APIGroupDiscoveryList{
		TypeMeta: metav1.TypeMeta{Kind: "APIGroupDiscoveryList", APIVersion: "apidiscovery.k8s.io/v2"},
		Items:    []apidiscoveryv2.APIGroupDiscovery{},
	}
	for _, g := range groups {
		item := apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: g.name}}
		for _, v := range g.versions {
			vd := apidiscoveryv2.APIVersionDiscovery{Version: v.gv.Version, Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent,
				Resources: []apidiscoveryv2.APIResourceDiscovery{}}
			for _, r := range v.resources {
				k := r.kind
				rd := apidiscoveryv2.APIResourceDiscovery{
					Resource:         k.Resource,
					SingularResource: k.Singular,
					Scope:            scopeOf(k),
					ResponseKind:     &metav1.GroupVersionKind{Group: k.GVK.Group, Version: k.GVK.Version, Kind: k.GVK.Kind},
					Verbs:            verbsOf(k),
					ShortNames:       slices.Clone(k.ShortNames),
					Categories:       slices.Clone(k.Categories),
				}
				for _, s := range r.subs {
					rd.Subresources = append(rd.Subresources, apidiscoveryv2.APISubresourceDiscovery{
						Subresource:  s.name,
						ResponseKind: &metav1.GroupVersionKind{Group: s.gvk.Group, Version: s.gvk.Version, Kind: s.gvk.Kind},
						Verbs:        s.verbs,
					})
				}
				vd.Resources = append(vd.Resources, rd)
			}
			item.Versions = append(item.Versions, vd)
		}
		l.Items = append(l.Items, item)
	}
	return l
}

// aggregatedV2Beta1 converts the v2 document; the two versions have the same
// shape.
func aggregatedV2Beta1(groups []*group) apidiscoveryv2beta1.APIGroupDiscoveryList {
	b, err := json.Marshal(aggregatedV2(groups))
	if err != nil {
		panic(fmt.Sprintf("encode discovery document: %v", err))
	}
	var l apidiscoveryv2beta1.APIGroupDiscoveryList
	if err := json.Unmarshal(b, &l); err != nil {
		panic(fmt.Sprintf("convert discovery document: %v", err))
	}
	l.APIVersion = "apidiscovery.k8s.io/v2beta1"
	return l
}

// format is a negotiated response format.
type format int

const (
	formatLegacy format = iota
	formatV2
	formatV2Beta1
)

// negotiate picks the first format the Accept header names, by quality and
// then order. Aggregated discovery is chosen only when asked for; anything
// else gets the legacy JSON documents.
func negotiate(accept string) format {
	type cand struct {
		f format
		q float64
		i int
	}
	var cands []cand
	for i, part := range strings.Split(accept, ",") {
		mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
		if err != nil {
			continue
		}
		q := 1.0
		if s, ok := params["q"]; ok {
			if v, err := strconv.ParseFloat(s, 64); err == nil {
				q = v
			}
		}
		if q <= 0 {
			continue
		}
		switch {
		case mt == "application/json" && params["g"] == "apidiscovery.k8s.io" && params["as"] == "APIGroupDiscoveryList":
			switch params["v"] {
			case "v2":
				cands = append(cands, cand{formatV2, q, i})
			case "v2beta1":
				cands = append(cands, cand{formatV2Beta1, q, i})
			}
		case params["g"] != "" || params["as"] != "":
			// Another typed form (protobuf, a table); not served.
		case mt == "application/json" || mt == "*/*" || mt == "application/*":
			cands = append(cands, cand{formatLegacy, q, i})
		}
	}
	if len(cands) == 0 {
		return formatLegacy
	}
	sort.SliceStable(cands, func(a, b int) bool { return cands[a].q > cands[b].q })
	return cands[0].f
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeStatus(w, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed,
			fmt.Sprintf("%s is not supported on %s", r.Method, r.URL.Path))
		return
	}
	path := strings.TrimSuffix(r.URL.Path, "/")
	cur := h.current()
	var d doc
	contentType := "application/json"
	switch path {
	case "/api", "/apis":
		i := 0
		if path == "/apis" {
			i = 1
		}
		switch negotiate(r.Header.Get("Accept")) {
		case formatV2:
			d, contentType = cur.aggV2[i], ContentTypeV2
		case formatV2Beta1:
			d, contentType = cur.aggV2b[i], ContentTypeV2Beta1
		default:
			if path == "/apis" {
				d = cur.legacy[path]
			} else {
				d = newDoc(h.apiVersions(r, cur))
			}
		}
	default:
		var ok bool
		if d, ok = cur.legacy[path]; !ok {
			writeStatus(w, http.StatusNotFound, metav1.StatusReasonNotFound, "the server could not find the requested resource")
			return
		}
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Vary", "Accept")
	w.Header().Set("ETag", d.etag)
	if match := r.Header.Get("If-None-Match"); match != "" && etagMatches(match, d.etag) {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(d.body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		w.Write(d.body)
	}
}

func etagMatches(header, etag string) bool {
	for _, t := range strings.Split(header, ",") {
		t = strings.TrimPrefix(strings.TrimSpace(t), "W/")
		if t == etag || t == "*" {
			return true
		}
	}
	return false
}

func (h *Handler) apiVersions(r *http.Request, cur *docs) metav1.APIVersions {
	addr := h.cfg.ServerAddress
	if addr == "" {
		addr = r.Host
		if _, _, err := net.SplitHostPort(addr); err != nil && addr != "" {
			addr = net.JoinHostPort(strings.Trim(addr, "[]"), "443")
		}
	}
	v := metav1.APIVersions{
		TypeMeta:                   metav1.TypeMeta{Kind: "APIVersions"},
		Versions:                   []string{},
		ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{{ClientCIDR: "0.0.0.0/0", ServerAddress: addr}},
	}
	if cur.core != nil {
		for _, gv := range cur.core.versions {
			v.Versions = append(v.Versions, gv.gv.Version)
		}
	}
	return v
}

func writeStatus(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	st := metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  msg,
		Reason:   reason,
		Details:  &metav1.StatusDetails{},
		Code:     int32(code),
	}
	var buf bytes.Buffer
	json.NewEncoder(&buf).Encode(st)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}
