package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/tether-edge/tether/dataplane/internal/testnet"
)

// The peer of the cost benchmark: the same policies as iptables rules and
// ipsets laid out as kube-router's network policy controller lays them out
// (filter table):
//
//	INPUT/FORWARD/OUTPUT → KUBE-ROUTER-INPUT/-FORWARD/-OUTPUT (dispatch)
//	  the cluster IP range and node ports RETURN first (INPUT);
//	  -d <pod IP> → KUBE-POD-FW-<pod> for each pod an ingress policy selects;
//	  last: -m mark --mark 0x20000/0x20000 → ACCEPT
//	KUBE-POD-FW-<pod>:
//	  conntrack RELATED,ESTABLISHED → ACCEPT
//	  from the node's own addresses (addrtype LOCAL) → ACCEPT
//	  → KUBE-NWPLCY-<policy>, for every policy selecting the pod
//	  not marked 0x10000: NFLOG (rate-limited), then REJECT
//	  clear 0x10000, set 0x20000
//	KUBE-NWPLCY-<policy>, per ingress rule, port and peer set:
//	  -m set --match-set <peers> src -m set --match-set <targets> dst
//	  -p tcp --dport P → MARK 0x10000, and the same → RETURN when marked
//
// with a hash:ip set of each policy's target pods and a hash:net set of
// each rule's ipBlocks. A pod's decision therefore walks every policy
// that selects it, each a constant-time set lookup.
//
// kube-router's dispatch for ingress to a pod sits in FORWARD (pods
// behind a bridge or routed veth) and OUTPUT; the lab's server addresses
// are local to their namespace, whose traffic meets INPUT, so the same
// -d <pod IP> jump is also written into KUBE-ROUTER-INPUT.

// kubeRouterName is a chain or set name: prefix and the first 16
// characters of the base32 SHA-256 of the parts, as kube-router names
// them (so that names fit iptables' 28 and ipset's 31 characters).
func kubeRouterName(prefix string, parts ...string) string {
	var b bytes.Buffer
	for _, p := range parts {
		b.WriteString(p + "\x00")
	}
	h := sha256.Sum256(b.Bytes())
	return prefix + base32.StdEncoding.EncodeToString(h[:])[:16]
}

// kubeRouterPod is one pod on the node and the policies selecting it for
// ingress.
type kubeRouterPod struct {
	namespace, name string
	ip              netip.Addr
	policies        []*networkingv1.NetworkPolicy
}

// kubeRouterRules renders pods and their ingress policies as an `ipset
// restore` input and an `iptables-restore` input for the filter table.
// The policies may hold ingress rules from ipBlocks (without excepts) to
// numeric TCP ports, what the benchmark's policies hold; anything else is
// an error, not a silent gap in the peer.
func kubeRouterRules(pods []kubeRouterPod) (sets, filter []byte, err error) {
	var s, f, chains bytes.Buffer
	top := []struct{ builtin, chain string }{{"INPUT", "KUBE-ROUTER-INPUT"}, {"FORWARD", "KUBE-ROUTER-FORWARD"}, {"OUTPUT", "KUBE-ROUTER-OUTPUT"}}
	for _, c := range top {
		fmt.Fprintf(&chains, ":%s - [0:0]\n", c.chain)
		fmt.Fprintf(&f, "-A %s -m comment --comment \"kube-router netpol\" -j %s\n", c.builtin, c.chain)
	}
	f.WriteString("-A KUBE-ROUTER-INPUT -d 10.96.0.0/12 -m comment --comment \"allow traffic to cluster IP range\" -j RETURN\n")
	for _, p := range []string{"tcp", "udp"} {
		fmt.Fprintf(&f, "-A KUBE-ROUTER-INPUT -p %s -m comment --comment \"allow LOCAL %s traffic to node ports\" -m addrtype --dst-type LOCAL -m multiport --dports 30000:32767 -j RETURN\n", p, p)
	}
	var podRules bytes.Buffer
	for _, pod := range pods {
		if len(pod.policies) == 0 {
			continue
		}
		fw := kubeRouterName("KUBE-POD-FW-", pod.namespace, pod.name)
		fmt.Fprintf(&chains, ":%s - [0:0]\n", fw)
		for _, c := range top {
			fmt.Fprintf(&f, "-A %s -m comment --comment \"rule to jump traffic destined to POD name:%s namespace: %s\" -d %s/32 -j %s\n",
				c.chain, pod.name, pod.namespace, pod.ip, fw)
		}
		fmt.Fprintf(&podRules, "-A %s -m comment --comment \"rule for stateful firewall for pod\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n", fw)
		fmt.Fprintf(&podRules, "-A %s -m comment --comment \"rule to permit the traffic to pods when source is the pod's local node\" -m addrtype --src-type LOCAL -d %s/32 -j ACCEPT\n", fw, pod.ip)
		// kube-router inserts each policy's jump at the top: the last
		// policy is walked first.
		for _, np := range slices.Backward(pod.policies) {
			fmt.Fprintf(&podRules, "-A %s -m comment --comment \"run through nw policy %s\" -j %s\n", fw, np.Name, kubeRouterName("KUBE-NWPLCY-", np.Namespace, np.Name))
		}
		fmt.Fprintf(&podRules, "-A %s -m comment --comment \"rule to log dropped traffic POD name:%s namespace: %s\" -m mark ! --mark 0x10000/0x10000 -j NFLOG --nflog-group 100 -m limit --limit 10/minute --limit-burst 10\n", fw, pod.name, pod.namespace)
		fmt.Fprintf(&podRules, "-A %s -m comment --comment \"rule to REJECT traffic destined for POD name:%s namespace: %s\" -m mark ! --mark 0x10000/0x10000 -j REJECT\n", fw, pod.name, pod.namespace)
		fmt.Fprintf(&podRules, "-A %s -j MARK --set-xmark 0x0/0x10000\n", fw)
		fmt.Fprintf(&podRules, "-A %s -m comment --comment \"set mark to ACCEPT traffic that comply to network policies\" -j MARK --set-xmark 0x20000/0x20000\n", fw)
		for _, np := range pod.policies {
			if err := kubeRouterPolicy(&s, &chains, &podRules, np, pod.ip); err != nil {
				return nil, nil, fmt.Errorf("policy %s/%s: %w", np.Namespace, np.Name, err)
			}
		}
	}
	f.Write(podRules.Bytes())
	for _, c := range top {
		fmt.Fprintf(&f, "-A %s -m comment --comment \"rule to explicitly ACCEPT traffic that comply to network policies\" -m mark --mark 0x20000/0x20000 -j ACCEPT\n", c.chain)
	}
	f.WriteString("COMMIT\n")
	// Chains are declared before the first rule that jumps to them.
	out := append([]byte("*filter\n"), chains.Bytes()...)
	return s.Bytes(), append(out, f.Bytes()...), nil
}

// kubeRouterPolicy writes one policy's chain and sets for the target pod
// at ip.
func kubeRouterPolicy(sets, chains, rules *bytes.Buffer, np *networkingv1.NetworkPolicy, ip netip.Addr) error {
	chain := kubeRouterName("KUBE-NWPLCY-", np.Namespace, np.Name)
	dst := kubeRouterName("KUBE-DST-", np.Namespace, np.Name)
	fmt.Fprintf(chains, ":%s - [0:0]\n", chain)
	fmt.Fprintf(sets, "create %s hash:ip family inet hashsize 1024 maxelem 65536 timeout 0\nadd %s %s timeout 0\n", dst, dst, ip)
	if len(np.Spec.Egress) > 0 {
		return fmt.Errorf("egress rules are not rendered")
	}
	for i, in := range np.Spec.Ingress {
		src := kubeRouterName("KUBE-SRC-", np.Namespace, np.Name, fmt.Sprint(i))
		fmt.Fprintf(sets, "create %s hash:net family inet hashsize 1024 maxelem 65536 timeout 0\n", src)
		for _, peer := range in.From {
			if peer.IPBlock == nil || len(peer.IPBlock.Except) > 0 || peer.PodSelector != nil || peer.NamespaceSelector != nil {
				return fmt.Errorf("ingress rule %d: only ipBlock peers without excepts are rendered", i)
			}
			fmt.Fprintf(sets, "add %s %s timeout 0\n", src, peer.IPBlock.CIDR)
		}
		for _, port := range in.Ports {
			if port.Port == nil || port.Port.IntVal == 0 || port.EndPort != nil || (port.Protocol != nil && *port.Protocol != "TCP") {
				return fmt.Errorf("ingress rule %d: only numeric TCP ports are rendered", i)
			}
			match := fmt.Sprintf("-m set --match-set %s src -m set --match-set %s dst -p tcp --dport %d", src, dst, port.Port.IntVal)
			fmt.Fprintf(rules, "-A %s -m comment --comment \"rule to ACCEPT traffic from specified ipBlocks to dest pods selected by policy name: %s namespace %s\" %s -j MARK --set-xmark 0x10000/0x10000\n",
				chain, np.Name, np.Namespace, match)
			fmt.Fprintf(rules, "-A %s -m comment --comment \"rule to ACCEPT traffic from specified ipBlocks to dest pods selected by policy name: %s namespace %s\" %s -m mark --mark 0x10000/0x10000 -j RETURN\n",
				chain, np.Name, np.Namespace, match)
		}
	}
	return nil
}

// loadKubeRouterRules writes sets and filter rules into the namespace ns
// (never the host's tables) as kube-router's full sync does: `ipset
// restore`, then `iptables-restore` of the filter table. It returns how
// long the two took.
func loadKubeRouterRules(ns *testnet.Netns, sets, filter []byte) (time.Duration, error) {
	start := time.Now()
	for _, c := range []struct {
		args []string
		in   []byte
	}{
		{[]string{"netns", "exec", ns.Name, "ipset", "restore", "-exist"}, sets},
		{[]string{"netns", "exec", ns.Name, "iptables-restore", "-w"}, filter},
	} {
		cmd := exec.Command("ip", c.args...)
		cmd.Stdin = bytes.NewReader(c.in)
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("%s: %w: %s", c.args[3], err, out)
		}
	}
	return time.Since(start), nil
}
