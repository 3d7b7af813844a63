package dns

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// HostResolvConf is the node's own resolver configuration, which pods with
// dnsPolicy Default inherit and ClusterFirst pods extend.
type HostResolvConf struct {
	Nameservers []string
	Searches    []string
	Options     []string // "ndots:2", "edns0", ...
}

// Limits the kubelet enforces on a pod's resolver configuration.
const (
	maxNameservers = 3
	maxSearches    = 32
)

// ResolvConf renders the /etc/resolv.conf of a pod the way the kubelet does:
//
//   - ClusterFirst (the default; a hostNetwork pod falls back to Default) and
//     ClusterFirstWithHostNet: the cluster DNS servers, the search path
//     "<ns>.svc.<domain> svc.<domain> <domain>" followed by the node's search
//     domains, and "options ndots:5";
//   - Default: the node's configuration;
//   - None: only what pod.Spec.DNSConfig says (it must name a nameserver).
//
// pod.Spec.DNSConfig is then merged in: nameservers and searches appended
// without duplicates, options overriding by name.
func ResolvConf(pod *corev1.Pod, clusterDNS []netip.Addr, clusterDomain string, host HostResolvConf) (string, error) {
	if clusterDomain == "" {
		clusterDomain = "cluster.local"
	}
	policy := pod.Spec.DNSPolicy
	if policy == "" {
		policy = corev1.DNSClusterFirst
	}
	if policy == corev1.DNSClusterFirst && pod.Spec.HostNetwork {
		policy = corev1.DNSDefault
	}
	var servers, searches, options []string
	switch policy {
	case corev1.DNSClusterFirst, corev1.DNSClusterFirstWithHostNet:
		if len(clusterDNS) == 0 {
			// Without a cluster DNS the kubelet falls back to the
			// node's resolvers.
			servers, searches, options = host.Nameservers, host.Searches, host.Options
			break
		}
		for _, a := range clusterDNS {
			servers = append(servers, a.String())
		}
		ns := pod.Namespace
		if ns == "" {
			ns = "default"
		}
		searches = append([]string{ns + ".svc." + clusterDomain, "svc." + clusterDomain, clusterDomain}, host.Searches...)
		options = []string{"ndots:5"}
	case corev1.DNSDefault:
		servers, searches, options = host.Nameservers, host.Searches, host.Options
	case corev1.DNSNone:
	default:
		return "", fmt.Errorf("render resolv.conf: unknown dnsPolicy %q", policy)
	}
	if c := pod.Spec.DNSConfig; c != nil {
		servers = append(servers, c.Nameservers...)
		searches = append(searches, c.Searches...)
		for _, o := range c.Options {
			opt := o.Name
			if o.Value != nil {
				opt += ":" + *o.Value
			}
			options = setOption(options, opt)
		}
	}
	servers = dedup(servers)
	searches = dedup(searches)
	if policy == corev1.DNSNone && len(servers) == 0 {
		return "", errors.New("render resolv.conf: dnsPolicy None needs dnsConfig.nameservers")
	}
	if len(servers) > maxNameservers {
		servers = servers[:maxNameservers]
	}
	if len(searches) > maxSearches {
		searches = searches[:maxSearches]
	}
	var b strings.Builder
	if len(searches) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(searches, " "))
	}
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	if len(options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(options, " "))
	}
	return b.String(), nil
}

// setOption adds opt, replacing an option with the same name.
func setOption(opts []string, opt string) []string {
	name, _, _ := strings.Cut(opt, ":")
	for i, o := range opts {
		if n, _, _ := strings.Cut(o, ":"); n == name {
			opts = slices.Clone(opts)
			opts[i] = opt
			return opts
		}
	}
	return append(slices.Clone(opts), opt)
}

func dedup(in []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range in {
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
