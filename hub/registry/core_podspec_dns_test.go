package registry

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func TestValidatePodDNSConfig(t *testing.T) {
	many := func(n int, f func(i int) string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = f(i)
		}
		return out
	}
	long := []string{strings.Repeat("a", 63) + "." + strings.Repeat("b", 63)}
	for len(strings.Join(long, " ")) <= 2048 {
		long = append(long, long[0])
	}
	for _, c := range []struct {
		name   string
		policy corev1.DNSPolicy
		cfg    *corev1.PodDNSConfig
		want   []string // error strings, in order
	}{
		{"cluster first without config", corev1.DNSClusterFirst, nil, nil},
		{"none without config", corev1.DNSNone, nil,
			[]string{"spec.dnsConfig: Required value: must provide `dnsConfig` when `dnsPolicy` is None"}},
		{"none without nameservers", corev1.DNSNone, &corev1.PodDNSConfig{Searches: []string{"a.example"}},
			[]string{"spec.dnsConfig.nameservers: Required value: must provide at least one DNS nameserver when `dnsPolicy` is None"}},
		{"upstream example", corev1.DNSNone, &corev1.PodDNSConfig{
			Nameservers: []string{"192.0.2.1"},
			Searches:    []string{"ns1.svc.cluster-domain.example", "my.dns.search.suffix"},
			Options:     []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptrTo("2")}, {Name: "edns0"}},
		}, nil},
		{"three nameservers and 32 searches", corev1.DNSDefault, &corev1.PodDNSConfig{
			Nameservers: []string{"1.2.3.4", "2001:db8::1", "FE80:0:0:0:0:0:0:0abc"},
			Searches:    many(32, func(i int) string { return fmt.Sprintf("s%d.example.", i) }),
		}, nil},
		{"root and underscore searches", corev1.DNSClusterFirst, &corev1.PodDNSConfig{Searches: []string{".", "_srv.example.com"}}, nil},
		{"four nameservers", corev1.DNSNone, &corev1.PodDNSConfig{Nameservers: []string{"1.2.3.4", "5.6.7.8", "9.8.0.1", "2.3.4.5"}},
			[]string{`spec.dnsConfig.nameservers: Invalid value: ["1.2.3.4","5.6.7.8","9.8.0.1","2.3.4.5"]: must not have more than 3 nameservers`}},
		{"bad nameservers", corev1.DNSClusterFirst, &corev1.PodDNSConfig{Nameservers: []string{"1.2.3.c", "010.1.1.1"}},
			[]string{
				`spec.dnsConfig.nameservers[0]: Invalid value: "1.2.3.c": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)`,
				`spec.dnsConfig.nameservers[1]: Invalid value: "010.1.1.1": must not have leading 0s`,
			}},
		{"33 searches", corev1.DNSClusterFirst, &corev1.PodDNSConfig{Searches: many(33, func(i int) string { return "a" })},
			[]string{`spec.dnsConfig.searches: Invalid value: ["a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a"]: must not have more than 32 search paths`}},
		{"long search list", corev1.DNSClusterFirst, &corev1.PodDNSConfig{Searches: long},
			[]string{"spec.dnsConfig.searches: Invalid value: ", "must not have more than 2048 characters (including spaces) in the search list"}},
		{"bad search and option", corev1.DNSClusterFirst, &corev1.PodDNSConfig{Searches: []string{"Bad!."}, Options: []corev1.PodDNSConfigOption{{Value: ptrTo("1")}}},
			[]string{
				`spec.dnsConfig.searches[0]: Invalid value: "Bad!": a lowercase RFC 1123 subdomain`,
				"spec.dnsConfig.options[0]: Required value: must not be empty",
			}},
	} {
		errs := validatePodDNSConfig(c.cfg, c.policy, field.NewPath("spec", "dnsConfig"))
		if c.name == "long search list" {
			// Both pieces are in the one error; the value is long.
			if len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), c.want[0]) || !strings.HasSuffix(errs[0].Error(), c.want[1]) {
				t.Errorf("%s: got %v", c.name, errs)
			}
			continue
		}
		if len(errs) != len(c.want) {
			t.Errorf("%s: got %d errors %v, want %q", c.name, len(errs), errs, c.want)
			continue
		}
		for i, e := range errs {
			if !strings.HasPrefix(e.Error(), c.want[i]) {
				t.Errorf("%s: error %d is %q, want %q", c.name, i, e.Error(), c.want[i])
			}
		}
	}
}
