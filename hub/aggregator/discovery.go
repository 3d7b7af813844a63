package aggregator

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	"k8s.io/kube-aggregator/pkg/apis/apiregistration/v1/helper"
)

// Discovery wraps next, the hub's own discovery handler, so that the
// groups of service-backed APIServices appear in /apis (legacy and
// aggregated) and /apis/<group>, and /apis/<group>/<version> of such a
// group/version is answered by its service, as upstream's aggregator
// does.
func (a *Aggregator) Discovery(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := strings.TrimSuffix(r.URL.Path, "/")
		segs := strings.Split(strings.TrimPrefix(path, "/"), "/")
		if segs[0] != "apis" || (r.Method != http.MethodGet && r.Method != http.MethodHead) {
			next.ServeHTTP(w, r)
			return
		}
		remote := a.remoteGroups()
		switch len(segs) {
		case 1:
			if len(remote) == 0 {
				next.ServeHTTP(w, r)
				return
			}
			a.serveMergedRoot(w, r, next, remote)
		case 2:
			if remote[segs[1]] == nil {
				next.ServeHTTP(w, r)
				return
			}
			a.serveMergedGroup(w, r, next, remote[segs[1]])
		case 3:
			if h := a.ProxyFor(segs[1], segs[2]); h != nil {
				h.ServeHTTP(w, r)
				return
			}
			next.ServeHTTP(w, r)
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// remoteGroup is a group with service-backed versions.
type remoteGroup struct {
	name     string
	services []*apiregistrationv1.APIService // by version priority, preferred first
	docs     map[string][]byte               // version → APIResourceList JSON
}

func (a *Aggregator) remoteGroups() map[string]*remoteGroup {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := map[string]*remoteGroup{}
	for _, e := range a.services {
		if e.svc.Spec.Service == nil || e.svc.Spec.Group == "" {
			continue
		}
		g := out[e.svc.Spec.Group]
		if g == nil {
			g = &remoteGroup{name: e.svc.Spec.Group, docs: map[string][]byte{}}
			out[g.name] = g
		}
		g.services = append(g.services, e.svc)
		if e.discovery != nil && e.available {
			g.docs[e.svc.Spec.Version] = e.discovery
		}
	}
	for _, g := range out {
		sort.Sort(helper.ByVersionPriority(g.services))
	}
	return out
}

// apiGroup is the legacy discovery entry of g.
func (g *remoteGroup) apiGroup() metav1.APIGroup {
	ag := metav1.APIGroup{Name: g.name}
	for _, s := range g.services {
		ag.Versions = append(ag.Versions, metav1.GroupVersionForDiscovery{GroupVersion: g.name + "/" + s.Spec.Version, Version: s.Spec.Version})
	}
	ag.PreferredVersion = ag.Versions[0]
	return ag
}

// aggregated is the aggregated discovery entry of g: the versions whose
// service answered discovery.
func (g *remoteGroup) aggregated() (apidiscoveryv2.APIGroupDiscovery, bool) {
	out := apidiscoveryv2.APIGroupDiscovery{ObjectMeta: metav1.ObjectMeta{Name: g.name}}
	for _, s := range g.services {
		doc := g.docs[s.Spec.Version]
		if doc == nil {
			continue
		}
		var list metav1.APIResourceList
		if err := json.Unmarshal(doc, &list); err != nil {
			continue
		}
		out.Versions = append(out.Versions, versionDiscovery(s.Spec.Group, s.Spec.Version, list))
	}
	return out, len(out.Versions) > 0
}

// versionDiscovery converts a legacy resource list to its aggregated form.
func versionDiscovery(group, version string, list metav1.APIResourceList) apidiscoveryv2.APIVersionDiscovery {
	v := apidiscoveryv2.APIVersionDiscovery{Version: version, Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent, Resources: []apidiscoveryv2.APIResourceDiscovery{}}
	byName := map[string]int{}
	for _, r := range list.APIResources {
		if strings.Contains(r.Name, "/") {
			continue
		}
		scope := apidiscoveryv2.ScopeCluster
		if r.Namespaced {
			scope = apidiscoveryv2.ScopeNamespace
		}
		byName[r.Name] = len(v.Resources)
		v.Resources = append(v.Resources, apidiscoveryv2.APIResourceDiscovery{
			Resource: r.Name, ResponseKind: &metav1.GroupVersionKind{Group: group, Version: version, Kind: r.Kind},
			Scope: scope, SingularResource: r.SingularName, Verbs: r.Verbs, ShortNames: r.ShortNames, Categories: r.Categories,
		})
	}
	for _, r := range list.APIResources {
		parent, sub, ok := strings.Cut(r.Name, "/")
		i, found := byName[parent]
		if !ok || !found {
			continue
		}
		v.Resources[i].Subresources = append(v.Resources[i].Subresources, apidiscoveryv2.APISubresourceDiscovery{
			Subresource: sub, ResponseKind: &metav1.GroupVersionKind{Group: group, Version: version, Kind: r.Kind}, Verbs: r.Verbs,
		})
	}
	return v
}

// serveMergedRoot answers /apis with next's document plus the remote
// groups, in whichever form the client negotiated with next.
func (a *Aggregator) serveMergedRoot(w http.ResponseWriter, r *http.Request, next http.Handler, remote map[string]*remoteGroup) {
	rec := record(next, r)
	if rec.Code != http.StatusOK {
		copyRecorded(w, rec)
		return
	}
	names := make([]string, 0, len(remote))
	for n := range remote {
		names = append(names, n)
	}
	sort.Strings(names)
	ct := rec.Header().Get("Content-Type")
	var body []byte
	if strings.Contains(ct, "apidiscovery.k8s.io") {
		// v2 and v2beta1 share their JSON form.
		var list apidiscoveryv2.APIGroupDiscoveryList
		if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil {
			copyRecorded(w, rec)
			return
		}
		for _, n := range names {
			if local(list.Items, n) {
				continue
			}
			if g, ok := remote[n].aggregated(); ok {
				list.Items = append(list.Items, g)
			}
		}
		body, _ = json.Marshal(list)
	} else {
		var list metav1.APIGroupList
		if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil {
			copyRecorded(w, rec)
			return
		}
		for _, n := range names {
			if !slicesContainsGroup(list.Groups, n) {
				list.Groups = append(list.Groups, remote[n].apiGroup())
			}
		}
		body, _ = json.Marshal(list)
	}
	writeDoc(w, r, ct, append(body, '\n'))
}

// serveMergedGroup answers /apis/<group> for a group with service-backed
// versions.
func (a *Aggregator) serveMergedGroup(w http.ResponseWriter, r *http.Request, next http.Handler, g *remoteGroup) {
	ag := g.apiGroup()
	rec := record(next, r)
	if rec.Code == http.StatusOK {
		var have metav1.APIGroup
		if err := json.Unmarshal(rec.Body.Bytes(), &have); err == nil {
			for _, v := range ag.Versions {
				if !slicesContainsVersion(have.Versions, v.Version) {
					have.Versions = append(have.Versions, v)
				}
			}
			ag = have
		}
	}
	ag.Kind, ag.APIVersion = "APIGroup", "v1"
	body, _ := json.Marshal(ag)
	writeDoc(w, r, "application/json", append(body, '\n'))
}

func local(items []apidiscoveryv2.APIGroupDiscovery, name string) bool {
	for _, g := range items {
		if g.Name == name {
			return true
		}
	}
	return false
}

func slicesContainsGroup(gs []metav1.APIGroup, name string) bool {
	for _, g := range gs {
		if g.Name == name {
			return true
		}
	}
	return false
}

func slicesContainsVersion(vs []metav1.GroupVersionForDiscovery, v string) bool {
	for _, x := range vs {
		if x.Version == v {
			return true
		}
	}
	return false
}

// record runs next for r without conditional headers and keeps its answer.
func record(next http.Handler, r *http.Request) *httptest.ResponseRecorder {
	r2 := r.Clone(r.Context())
	r2.Method = http.MethodGet
	r2.Header.Del("If-None-Match")
	rec := httptest.NewRecorder()
	next.ServeHTTP(rec, r2)
	return rec
}

func copyRecorded(w http.ResponseWriter, rec *httptest.ResponseRecorder) {
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(rec.Body.Bytes())
}

// writeDoc writes a discovery document with an ETag of its content,
// answering 304 when the client has it.
func writeDoc(w http.ResponseWriter, r *http.Request, contentType string, body []byte) {
	sum := sha256.Sum256(body)
	etag := `"` + hex.EncodeToString(sum[:16]) + `"`
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Vary", "Accept")
	w.Header().Set("ETag", etag)
	for _, t := range strings.Split(r.Header.Get("If-None-Match"), ",") {
		if t = strings.TrimPrefix(strings.TrimSpace(t), "W/"); t == etag || t == "*" {
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = bytes.NewReader(body).WriteTo(w)
	}
}
