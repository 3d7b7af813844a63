package main

import (
	"net/netip"
	"os"
	"slices"
	"testing"

	"github.com/tether-edge/tether/edge"
)

// TestEdgeNetFlags checks the dataplane and DNS defaults of `tether edge`
// per runtime, and the explicit choices.
func TestEdgeNetFlags(t *testing.T) {
	parse := func(t *testing.T, args ...string) (edge.Config, error) {
		t.Helper()
		cmd := newEdgeCmd()
		if err := cmd.Flags().Parse(args); err != nil {
			t.Fatal(err)
		}
		f := cmd.Flags()
		get := func(name string) string { v, _ := f.GetString(name); return v }
		port, _ := f.GetUint16("dns-port")
		uplinks, _ := f.GetStringSlice("uplinks")
		var cfg edge.Config
		cfg.WatchServices, _ = f.GetBool("watch-services")
		err := edgeNetFlags(cmd, &cfg, get("runtime"), get("dataplane"), get("dns-addr"), port, uplinks)
		return cfg, err
	}
	dnsDefault := netip.MustParseAddrPort(edge.DefaultDNSAddr + ":53")

	cfg, err := parse(t, "--runtime", "sim")
	if err != nil || cfg.Dataplane != edge.DataplaneNone || cfg.DNSAddr.IsValid() || cfg.Uplinks != nil {
		t.Errorf("sim defaults: %q %v %v, %v", cfg.Dataplane, cfg.DNSAddr, cfg.Uplinks, err)
	}
	cfg, err = parse(t, "--runtime", "containerd")
	wantDP := edge.DataplaneNone
	if os.Geteuid() == 0 {
		wantDP = edge.DataplaneEBPF
	}
	if err != nil || cfg.Dataplane != wantDP || cfg.DNSAddr != dnsDefault {
		t.Errorf("containerd defaults: %q %v, %v", cfg.Dataplane, cfg.DNSAddr, err)
	}
	cfg, err = parse(t, "--runtime", "containerd", "--dataplane", "ebpf")
	if err != nil || !slices.Equal(cfg.Uplinks, []string{edge.UplinkAuto}) {
		t.Errorf("ebpf uplinks default: %v, %v", cfg.Uplinks, err)
	}
	cfg, err = parse(t, "--runtime", "containerd", "--dataplane", "ebpf", "--uplinks", "none", "--dns-addr", "none")
	if err != nil || cfg.Uplinks != nil || cfg.DNSAddr.IsValid() {
		t.Errorf("--uplinks none --dns-addr none: %v %v, %v", cfg.Uplinks, cfg.DNSAddr, err)
	}
	cfg, err = parse(t, "--runtime", "sim", "--dns-addr", "10.42.0.1", "--dns-port", "5353")
	if err != nil || cfg.DNSAddr != netip.MustParseAddrPort("10.42.0.1:5353") {
		t.Errorf("--dns-addr 10.42.0.1 --dns-port 5353: %v, %v", cfg.DNSAddr, err)
	}
	for _, args := range [][]string{
		{"--dataplane", "iptables"},
		{"--dns-addr", "dns.example"},
		{"--runtime", "containerd", "--watch-services=false"},
	} {
		if _, err := parse(t, args...); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
