package dataplane

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestNoIptablesOrNftRules programs ClusterIP, NodePort, externalIP and
// Local-policy Services and then checks that neither iptables nor nftables
// holds a rule for them: not in the node's namespace (which must be empty)
// and not in the host's.
func TestNoIptablesOrNftRules(t *testing.T) {
	for _, tool := range []string{"iptables-save", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (Debian packages iptables and nftables) to inspect the rulesets", tool)
		}
	}
	l := newNPLab(t, "")
	// Traffic first, so that anything created lazily would exist.
	countBackends(t, dialN(l.client, npNodeIP+":30080", 5))
	countBackends(t, dialN(l.client, npNodeIP+":30081", 5))

	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	for _, ns := range []string{l.node.Name, l.client.Name, l.remote.Name, l.pod.Name} {
		for _, cmd := range [][]string{{"iptables-save"}, {"ip6tables-save"}, {"nft", "list", "ruleset"}} {
			out := run(append([]string{"ip", "netns", "exec", ns}, cmd...)...)
			for _, line := range strings.Split(out, "\n") {
				line = strings.TrimSpace(line)
				if line == "" || strings.HasPrefix(line, "#") {
					continue
				}
				t.Errorf("%s in namespace %s is not empty: %q", strings.Join(cmd, " "), ns, line)
			}
		}
	}
	// The host's rulesets belong to others (the pod network's CNI
	// masquerade rules among them, which are not about Services); none of
	// their lines may name our Services' addresses or node ports. Whole
	// words only: CNI chain names carry hex hashes that may contain the
	// digits of a port.
	for _, cmd := range [][]string{{"iptables-save"}, {"nft", "list", "ruleset"}} {
		out := run(cmd...)
		for _, needle := range []*regexp.Regexp{regexp.MustCompile(`\b10\.214\.`), regexp.MustCompile(`\b30080\b`), regexp.MustCompile(`\b30081\b`)} {
			if m := needle.FindString(out); m != "" {
				t.Errorf("host %s mentions %q", strings.Join(cmd, " "), m)
			}
		}
	}
}
