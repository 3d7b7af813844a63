package rbac

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/tether-edge/tether/hub/apiserver"
	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/internal/benchfmt"
)

// Sizes of the benchmark's cluster: 500 Roles and 5,000 RoleBindings
// across 50 namespaces, naming 2,000 users, 200 groups and the
// namespaces' service accounts, next to a bootstrap-like set of
// ClusterRoles and ClusterRoleBindings.
const (
	benchNamespaces = 50
	benchRoles      = 500
	benchBindings   = 5000
	benchUsers      = 2000
	benchGroups     = 200
	benchSAs        = 20 // per namespace
)

type benchReq struct {
	u  *auth.User
	at apiserver.Attributes
}

var benchResources = []struct{ group, resource string }{
	{"", "pods"}, {"", "pods/log"}, {"", "configmaps"}, {"", "secrets"}, {"", "services"},
	{"apps", "deployments"}, {"apps", "deployments/scale"}, {"apps", "statefulsets"},
	{"batch", "jobs"}, {"batch", "cronjobs"}, {"networking.k8s.io", "ingresses"},
}

var benchVerbs = []string{"get", "list", "watch", "create", "update", "patch", "delete"}

// benchFixture builds the cluster and a set of requests, about three in
// four of them allowed.
func benchFixture() (*Authorizer, []benchReq) {
	r := rand.New(rand.NewPCG(1, 2))
	a := fixture(
		clusterRole("cluster-admin", rule(l("*"), l("*"), l("*")), urlRule(l("*"), "*")),
		clusterRole("system:discovery", urlRule(l("get"), "/api", "/api/*", "/apis", "/apis/*", "/version", "/openapi", "/openapi/*")),
		clusterRole("system:basic-user", rule(l("create"), l("authorization.k8s.io"), l("selfsubjectaccessreviews", "selfsubjectrulesreviews"))),
		clusterRole("view", rule(l("get", "list", "watch"), l("", "apps", "batch"), l("pods", "configmaps", "services", "deployments", "statefulsets", "jobs", "cronjobs"))),
		clusterRole("edit", rule(l("*"), l("", "apps", "batch"), l("pods", "configmaps", "secrets", "services", "deployments", "deployments/scale", "jobs"))),
		clusterRoleBinding("cluster-admin", ref("ClusterRole", "cluster-admin"), groupSubject("system:masters")),
		clusterRoleBinding("system:discovery", ref("ClusterRole", "system:discovery"), groupSubject("system:authenticated")),
		clusterRoleBinding("system:basic-user", ref("ClusterRole", "system:basic-user"), groupSubject("system:authenticated")),
	)
	for i := range 25 {
		a.idx.set(clusterRoleBinding(fmt.Sprintf("controller-%d", i), ref("ClusterRole", "edit"), saSubject("kube-system", fmt.Sprintf("controller-%d", i))))
	}
	ns := func(i int) string { return fmt.Sprintf("ns-%d", i) }
	for i := range benchRoles {
		var rules []rbacv1.PolicyRule
		for j := range 5 {
			res := benchResources[(i+j)%len(benchResources)]
			verbs := benchVerbs[:1+(i+j)%len(benchVerbs)]
			rules = append(rules, rule(slices.Clone(verbs), l(res.group), l(res.resource)))
		}
		a.idx.set(role(ns(i%benchNamespaces), fmt.Sprintf("role-%d", i/benchNamespaces), rules...))
	}
	perNS := benchRoles / benchNamespaces
	for i := range benchBindings {
		n := i % benchNamespaces
		var rr rbacv1.RoleRef
		switch i % 4 {
		case 0:
			rr = ref("ClusterRole", "view")
		case 1:
			rr = ref("ClusterRole", "edit")
		default:
			rr = ref("Role", fmt.Sprintf("role-%d", r.IntN(perNS)))
		}
		a.idx.set(roleBinding(ns(n), fmt.Sprintf("binding-%d", i), rr,
			userSubject(fmt.Sprintf("user-%d", r.IntN(benchUsers))),
			userSubject(fmt.Sprintf("user-%d", r.IntN(benchUsers))),
			groupSubject(fmt.Sprintf("group-%d", r.IntN(benchGroups))),
			saSubject("", fmt.Sprintf("sa-%d", r.IntN(benchSAs))),
		))
	}
	var reqs []benchReq
	for range 4096 {
		var u *auth.User
		n := r.IntN(benchNamespaces)
		if r.IntN(4) == 0 {
			u = &auth.User{Name: fmt.Sprintf("system:serviceaccount:%s:sa-%d", ns(n), r.IntN(benchSAs)),
				Groups: l("system:serviceaccounts", "system:serviceaccounts:"+ns(n), auth.GroupAuthenticated)}
		} else {
			// A user's groups are the same in each request.
			k := r.IntN(benchUsers)
			u = &auth.User{Name: fmt.Sprintf("user-%d", k),
				Groups: l(fmt.Sprintf("group-%d", k%benchGroups), fmt.Sprintf("group-%d", k*7%benchGroups), auth.GroupAuthenticated)}
		}
		var at apiserver.Attributes
		if r.IntN(20) == 0 {
			at = path("get", "/apis/apps/v1")
		} else {
			res := benchResources[r.IntN(len(benchResources))]
			at = res_(benchVerbs[r.IntN(len(benchVerbs))], res.group, res.resource, ns(n), fmt.Sprintf("obj-%d", r.IntN(100)))
		}
		reqs = append(reqs, benchReq{u, at})
	}
	return a, reqs
}

// res_ is res for the benchmark, whose variable res shadows it.
func res_(verb, group, resource, ns, name string) apiserver.Attributes {
	return res(verb, group, resource, ns, name)
}

// measure decides n requests, timing each, and returns the median, the
// 99th percentile and the share allowed.
func measure(a *Authorizer, reqs []benchReq, n int, durs []time.Duration) (p50, p99 time.Duration, allowed float64) {
	durs = durs[:0]
	ok := 0
	for i := range n {
		q := &reqs[i%len(reqs)]
		start := time.Now()
		err := a.Authorize(q.u, q.at)
		d := time.Since(start)
		if err == nil {
			ok++
		}
		durs = append(durs, d)
	}
	slices.Sort(durs)
	return durs[len(durs)/2], durs[len(durs)*99/100], float64(ok) / float64(n)
}

// BenchmarkAuthorize measures one decision among 5,000 RoleBindings and
// 500 Roles, reporting the median and 99th percentile per decision as
// p50-ns and p99-ns (ns/op also counts timing and sorting them).
func BenchmarkAuthorize(b *testing.B) {
	a, reqs := benchFixture()
	durs := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	p50, p99, allowed := measure(a, reqs, b.N, durs)
	b.StopTimer()
	b.ReportMetric(float64(p50.Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(p99.Nanoseconds()), "p99-ns")
	b.ReportMetric(allowed*100, "%allowed")
	if b.N >= 10000 {
		benchfmt.Report(b, benchfmt.Figure{Name: "rbac_authorize_p99", Value: float64(p99.Nanoseconds()), Unit: "ns",
			Target: "<=2000", Mode: benchfmt.Mode(true), Extra: []string{fmt.Sprintf("p50_ns=%d", p50.Nanoseconds())}})
	}
}

// BenchmarkDenial measures the benchmark's denied requests alone.
func BenchmarkDenial(b *testing.B) {
	a, reqs := benchFixture()
	reqs = slices.DeleteFunc(reqs, func(q benchReq) bool { return a.Authorize(q.u, q.at) == nil })
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		q := &reqs[i%len(reqs)]
		if a.Authorize(q.u, q.at) == nil {
			b.Fatal("allowed")
		}
	}
}

// TestAuthorizeLatency runs the benchmark's decisions briefly and holds
// their 99th percentile to the 2µs target, generously: 3µs on a quiet
// machine, for the noise of a short run. A shared machine (CI, a busy
// host) runs everything slower: the limit grows by how much slower than a
// quiet machine it looks up maps and allocates right now; the race
// detector, which slows everything tenfold, lifts it.
func TestAuthorizeLatency(t *testing.T) {
	a, reqs := benchFixture()
	n := 200000
	if raceEnabled {
		n = 20000
	}
	durs := make([]time.Duration, 0, n)
	var p99, limit time.Duration
	var allowed, slow float64
	// A busy moment may spoil a run; the best of five counts.
	for range 5 {
		slow = slowdown()
		limit = time.Duration(float64(3*time.Microsecond) * slow)
		_, p99, allowed = measure(a, reqs, cap(durs), durs)
		if p99 <= limit || raceEnabled {
			break
		}
	}
	t.Logf("p99 %v per decision (limit %v: machine %.1fx slower than quiet), %.0f%% allowed", p99, limit, slow, allowed*100)
	if allowed < 0.3 || allowed > 0.95 {
		t.Errorf("benchmark requests %.0f%% allowed; want a mix", allowed*100)
	}
	if !raceEnabled && p99 > limit {
		t.Fatalf("p99 %v per decision, want <= %v", p99, limit)
	}
}

// What a map lookup and a small allocation cost on a quiet machine of
// today (about 15ns and 30ns; taken generously).
const (
	quietLookup = 25 * time.Nanosecond
	quietAlloc  = 50 * time.Nanosecond
)

// allocSink keeps slowdown's allocations on the heap.
var allocSink atomic.Pointer[[32]int64]

// slowdown estimates how much slower than a quiet machine this one runs
// now, at least 1: the larger of the slowdowns of random lookups in a map
// as large as the authorizer's and of small allocations, by median.
func slowdown() float64 {
	m := map[string]int{}
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%d", i)
		m[keys[i]] = i
	}
	r := rand.New(rand.NewPCG(3, 4))
	median := func(f func()) time.Duration {
		var batches []time.Duration
		for range 101 {
			start := time.Now()
			for range 1000 {
				f()
			}
			batches = append(batches, time.Since(start)/1000)
		}
		slices.Sort(batches)
		return batches[len(batches)/2]
	}
	sum := 0
	lookup := median(func() { sum += m[keys[r.IntN(len(keys))]] })
	alloc := median(func() { allocSink.Store(new([32]int64)) })
	_ = sum
	return max(1, float64(lookup)/float64(quietLookup), float64(alloc)/float64(quietAlloc))
}
