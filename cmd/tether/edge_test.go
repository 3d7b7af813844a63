package main

import (
	"math"
	"net/netip"
	"os"
	"reflect"
	"runtime/debug"
	"slices"
	"testing"

	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/containerd"
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

// TestAPIRelayFlag checks --api-relay-addr: by default the DNS server's
// address on port 443, off without a DNS server, and explicit choices.
func TestAPIRelayFlag(t *testing.T) {
	dns := edge.Config{DNSAddr: netip.MustParseAddrPort(edge.DefaultDNSAddr + ":53")}
	for _, c := range []struct {
		cfg  edge.Config
		flag string
		want string // "" for off
	}{
		{dns, "", edge.DefaultDNSAddr + ":443"},
		{edge.Config{}, "", ""},
		{dns, "none", ""},
		{dns, "169.254.20.11", "169.254.20.11:443"},
		{edge.Config{}, "10.42.0.1:8443", "10.42.0.1:8443"},
	} {
		cfg := c.cfg
		if err := apiRelayFlag(&cfg, c.flag); err != nil {
			t.Errorf("%q: %v", c.flag, err)
			continue
		}
		got := ""
		if cfg.APIRelayAddr.IsValid() {
			got = cfg.APIRelayAddr.String()
		}
		if got != c.want {
			t.Errorf("--api-relay-addr %q with DNS %v: %q, want %q", c.flag, c.cfg.DNSAddr, got, c.want)
		}
	}
	cfg := dns
	if err := apiRelayFlag(&cfg, "relay.example:443"); err == nil {
		t.Error("a host name was accepted")
	}
}

// TestAgentGC checks that --gc-percent and --memory-limit apply when given
// and by default, and that GOGC and GOMEMLIMIT win over the defaults.
func TestAgentGC(t *testing.T) {
	gcPercent, memLimit := debug.SetGCPercent(100), debug.SetMemoryLimit(math.MaxInt64)
	t.Cleanup(func() { debug.SetGCPercent(gcPercent); debug.SetMemoryLimit(memLimit) })
	apply := func(t *testing.T, args ...string) (int, int64, error) {
		t.Helper()
		debug.SetGCPercent(100)
		debug.SetMemoryLimit(math.MaxInt64)
		cmd := newEdgeCmd()
		if err := cmd.Flags().Parse(args); err != nil {
			t.Fatal(err)
		}
		p, _ := cmd.Flags().GetInt("gc-percent")
		l, _ := cmd.Flags().GetString("memory-limit")
		err := agentGC(cmd, p, l)
		return debug.SetGCPercent(100), debug.SetMemoryLimit(-1), err
	}
	for _, c := range []struct {
		name    string
		env     map[string]string
		args    []string
		percent int
		limit   int64
		wantErr bool
	}{
		{name: "defaults", percent: 50, limit: 64 << 20},
		{name: "flags", args: []string{"--gc-percent", "80", "--memory-limit", "100Mi"}, percent: 80, limit: 100 << 20},
		{name: "no limit", args: []string{"--memory-limit", "0"}, percent: 50, limit: math.MaxInt64},
		// The runtime read the variables at start: agentGC leaves its
		// settings alone (here, what apply set).
		{name: "environment", env: map[string]string{"GOGC": "200", "GOMEMLIMIT": "1GiB"}, percent: 100, limit: math.MaxInt64},
		{name: "flags over environment", env: map[string]string{"GOGC": "200"}, args: []string{"--gc-percent", "30"}, percent: 30, limit: 64 << 20},
		{name: "bad limit", args: []string{"--memory-limit", "lots"}, wantErr: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("GOGC", "")
			t.Setenv("GOMEMLIMIT", "")
			for k, v := range c.env {
				t.Setenv(k, v)
			}
			percent, limit, err := apply(t, c.args...)
			if c.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil || percent != c.percent || limit != c.limit {
				t.Errorf("GC percent %d, memory limit %d, err %v; want %d, %d", percent, limit, err, c.percent, c.limit)
			}
		})
	}
}

func TestRuntimeHandlerFlags(t *testing.T) {
	got, err := runtimeHandlerFlags([]string{"kata=io.containerd.kata.v2", "crun=io.containerd.runc.v2:/usr/bin/crun"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]containerd.RuntimeHandler{
		"kata": {Type: "io.containerd.kata.v2"},
		"crun": {Type: containerd.RuncV2, BinaryName: "/usr/bin/crun"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("handlers %+v, want %+v", got, want)
	}
	for _, bad := range [][]string{
		{"kata"}, {"Kata=io.containerd.kata.v2"}, {"k="}, {"k=:/bin/x"},
		{"k=io.containerd.kata.v2:/usr/bin/kata"}, {"k=io.containerd.runc.v2:crun"},
		{"a=io.containerd.runc.v2", "a=io.containerd.kata.v2"},
	} {
		if _, err := runtimeHandlerFlags(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
