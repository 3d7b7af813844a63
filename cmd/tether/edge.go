package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/tether-edge/tether/deploy"
	"github.com/tether-edge/tether/edge"
	"github.com/tether-edge/tether/edge/containerd"
	"github.com/tether-edge/tether/edge/ingress"
	"github.com/tether-edge/tether/edge/sim"
	"github.com/tether-edge/tether/internal/fleetapi"
)

func newEdgeCmd() *cobra.Command {
	var (
		cfg            edge.Config
		runtime        string
		containerdAddr string
		nodeIP         string
		logLevel       string
		simCfg         sim.Config
		simCPU         string
		simMemory      string
		simPods        string
		ctrdCfg        containerd.Config
		dataplaneMode  string
		dnsAddr        string
		dnsPort        uint16
		apiRelayAddr   string
		uplinks        []string
		manifestPath   string
		gcPercent      int
		memoryLimit    string
		handlers       []string
		ingressOn      bool
		ingressCfg     ingress.Config
	)
	cmd := &cobra.Command{
		Use:   "edge --hub https://HOST:6443 --token TOKEN --data-dir DIR",
		Short: "Run the edge agent: join the hub, register this node and run its pods",
		Long: `Run the edge agent. The first start joins the hub with the join token and
saves the node's key and certificate in the data directory; later starts use
the certificate and need no token. The agent reaches the hub over one tunnel
(QUIC over UDP to the hub's API port, TCP+TLS where UDP is blocked).

Services are load-balanced by eBPF programs (socket-level for ClusterIPs,
tc on the uplinks for NodePorts and externalIPs), never by iptables or
nftables rules; they stay loaded while the agent restarts. The agent serves
cluster DNS on a node-local link-local address (169.254.20.10 by default) that
it puts on a dummy interface, tether-dns; pods reach it through their default
route to the node, and ClusterFirst pods get it as their name server. Both
answer from the agent's watches of Services and EndpointSlices, so they keep
working while the hub is out of reach.

Pods reach the hub's API as in-cluster clients do: the dataplane sends their
connections to the kubernetes Service (10.0.0.1:443) to the agent's API relay
on the same node-local address, port 443 (--api-relay-addr), which pipes each
one over the tunnel to the hub without terminating TLS, so the pod's service
account token authenticates it, behind any NAT. Containers get the kubelet's
Service environment variables (KUBERNETES_SERVICE_HOST and the rest).

A pod's RuntimeClass picks the containerd runtime its containers run with:
the class's handler names one of --runtime-handler NAME=TYPE[:BINARY]
(runc, containerd's io.containerd.runc.v2, is always there).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			logger, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			cfg.Logger = logger
			cfg.Version = version
			if cfg.DataDir != "" {
				unlock, err := lockDataDir(cfg.DataDir)
				if err != nil {
					return err
				}
				defer unlock()
			}
			if err := agentGC(cmd, gcPercent, memoryLimit); err != nil {
				return err
			}
			if nodeIP != "" {
				if cfg.NodeIP, err = netip.ParseAddr(nodeIP); err != nil {
					return fmt.Errorf("parse --node-ip: %w", err)
				}
			}
			if err := edgeNetFlags(cmd, &cfg, runtime, dataplaneMode, dnsAddr, dnsPort, uplinks); err != nil {
				return err
			}
			if err := apiRelayFlag(&cfg, apiRelayAddr); err != nil {
				return err
			}
			if ingressOn {
				cfg.Ingress = &ingressCfg
			}
			switch manifestPath {
			case "":
				cfg.PodManifestPath = filepath.Join(cfg.DataDir, "manifests")
			case "none":
			default:
				cfg.PodManifestPath = manifestPath
			}
			ctrdCfg.ClusterDomain = cfg.ClusterDomain
			if !cmd.Flags().Changed("cluster-dns") && cfg.DNSAddr.IsValid() {
				ctrdCfg.ClusterDNS = []string{cfg.DNSAddr.Addr().String()}
			}
			switch runtime {
			case "sim":
				simCfg.Capacity = corev1.ResourceList{}
				for name, v := range map[corev1.ResourceName]string{
					corev1.ResourceCPU: simCPU, corev1.ResourceMemory: simMemory, corev1.ResourcePods: simPods,
				} {
					if v == "" {
						continue
					}
					q, err := resource.ParseQuantity(v)
					if err != nil {
						return fmt.Errorf("parse --sim-%s: %w", name, err)
					}
					simCfg.Capacity[name] = q
				}
				cfg.Runtime = sim.New(simCfg)
			case "containerd":
				if ctrdCfg.RuntimeHandlers, err = runtimeHandlerFlags(handlers); err != nil {
					return err
				}
				ctrdCfg.DataDir = cfg.DataDir
				ctrdCfg.Address = containerdAddr
				ctrdCfg.Logger = logger
				rt, err := containerd.New(cmd.Context(), ctrdCfg)
				if err != nil {
					return err
				}
				defer rt.Close()
				cfg.Runtime = rt
			default:
				return fmt.Errorf("unknown --runtime %q: want containerd or sim", runtime)
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			upgrades := resumeUpgrades(cfg.DataDir, version, logger)
			fleet := newFleetFollower(upgrades, cfg.DataDir)
			cfg.NodeObserver = fleet.observe
			cfg.Labels = maps.Clone(cfg.Labels)
			if cfg.Labels == nil {
				cfg.Labels = map[string]string{}
			}
			cfg.Labels[fleetapi.LabelBuild] = build
			a, err := edge.New(cfg)
			if err != nil {
				return err
			}
			// Before the node registers, so that its first status
			// carries how the last upgrade went.
			upgrades.publish(a)
			upgrades.run(ctx, a, stop)
			go fleet.run(ctx, a, stop)
			return upgrades.after(a.Run(ctx))
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.HubURL, "hub", "", "the hub's API address, https://HOST:PORT (required)")
	f.StringVar(&cfg.Token, "token", "", "join token from `tether token create`; needed only the first time")
	f.StringVar(&cfg.DataDir, "data-dir", "", "directory for the node's key, certificate and state (required)")
	f.StringVar(&cfg.NodeName, "name", "", "node name (default: the name in the saved certificate, or the host name)")
	f.StringVar(&runtime, "runtime", "containerd", "container runtime: containerd or sim")
	f.StringVar(&containerdAddr, "containerd-address", defaultContainerdAddress, "containerd socket; when nothing answers there the agent starts containerd itself (state under --data-dir)")
	f.StringSliceVar(&ctrdCfg.ClusterDNS, "cluster-dns", nil, "name server addresses of ClusterFirst pods (default: the agent's DNS server, --dns-addr; the node's resolv.conf when it runs none)")
	f.StringVar(&cfg.ClusterDomain, "cluster-domain", "cluster.local", "the cluster's DNS domain")
	f.StringVar(&dataplaneMode, "dataplane", "", "Service load balancing: ebpf (eBPF programs, no iptables; the kernel's features are checked at start) or none (default: ebpf with the containerd runtime as root, none with the sim runtime)")
	f.StringVar(&cfg.DataplaneCgroup, "dataplane-cgroup", "", "cgroup v2 directory whose sockets are load-balanced (default: the cgroup v2 root)")
	f.StringVar(&cfg.DataplaneBPFFS, "bpf-pin-dir", "", "bpffs directory of the dataplane's pinned maps and links (default /sys/fs/bpf/tether)")
	f.StringSliceVar(&uplinks, "uplinks", nil, "interfaces that carry NodePort and externalIP traffic, or none (default: the interface that holds --node-ip)")
	f.StringVar(&dnsAddr, "dns-addr", "", "node-local address of the agent's DNS server, or none; it is put on --dns-interface and pods reach it through their default route (default "+edge.DefaultDNSAddr+" with the containerd runtime, none with the sim runtime)")
	f.Uint16Var(&dnsPort, "dns-port", 53, "port of the agent's DNS server (pods can use only 53)")
	f.StringVar(&cfg.DNSInterface, "dns-interface", edge.DefaultDNSInterface, "interface the agent creates (a dummy) to hold --dns-addr; empty: the address must already be on the node")
	f.StringVar(&apiRelayAddr, "api-relay-addr", "", "node-local IP[:PORT] where the agent relays pods' connections to the kubernetes Service to the hub over the tunnel, or none; it is put on --dns-interface (default: the --dns-addr address, port 443; none without a DNS server)")
	f.IntVar(&cfg.APIRelayMaxConns, "api-relay-max-conns", edge.DefaultAPIRelayMaxConns, "pod connections the API relay carries at once; more are refused")
	f.StringSliceVar(&cfg.DNSUpstreams, "dns-upstream", nil, "resolvers HOST:PORT for names outside the cluster domain (default: the node's resolv.conf)")
	f.StringVar(&ctrdCfg.CNIConfDir, "cni-conf-dir", "", "directory with your own CNI .conflist (default: a bridge network over the node's pod CIDR)")
	f.StringSliceVar(&ctrdCfg.CNIBinDirs, "cni-bin-dir", nil, "directories of CNI plugins (default /usr/lib/cni,/opt/cni/bin)")
	f.StringVar(&ctrdCfg.Bridge, "pod-bridge", "tether0", "bridge of the generated pod network")
	f.StringArrayVar(&handlers, "runtime-handler", nil, "a runtime handler RuntimeClasses may name, NAME=TYPE[:BINARY], repeatable: NAME is the class's handler, TYPE containerd's runtime type, BINARY (runc type only) the runc-compatible program its shim runs, e.g. kata=io.containerd.kata.v2 or crun=io.containerd.runc.v2:/usr/bin/crun; handler runc ("+containerd.RuncV2+") is always there unless given; pods whose class names another handler do not start")
	f.StringVar(&ctrdCfg.Snapshotter, "snapshotter", "", "containerd snapshotter (default: containerd's, overlayfs)")
	f.IntVar(&ctrdCfg.ImageGCHighThresholdPercent, "image-gc-high-threshold", 85, "disk usage percent of the image store above which unused images are removed (above 100: never)")
	f.IntVar(&ctrdCfg.ImageGCLowThresholdPercent, "image-gc-low-threshold", 80, "disk usage percent image garbage collection brings the image store back to")
	f.StringVar(&ctrdCfg.RegistryConfigDir, "registry-config-dir", "/etc/containerd/certs.d", "registry host configuration in containerd's layout (<dir>/<host>/hosts.toml, CA and client certificates)")
	f.StringVar(&manifestPath, "pod-manifest-path", "", "directory (or file) of static pod manifests: the Pods there (YAML or JSON) run without the hub, watched for changes, each shown on the hub as the mirror pod <name>-<node> (default <data-dir>/manifests, created if missing; none: no static pods)")
	f.StringVar(&ctrdCfg.LocalPathRoot, "local-path-root", edge.DefaultLocalPathRoot, "directory of the node's local-path volumes; the agent removes a volume's directory there once the hub deleted the volume (must match the hub's --local-path-root)")
	f.StringVar(&cfg.Zone, "zone", "", "the node's site, set as the topology.kubernetes.io/zone label")
	f.StringVar(&cfg.Zone, "site", "", "the node's site (same as --zone): the nodes of a site gossip their membership on the site's LAN, encrypted with the site key the hub gives them")
	f.IntVar(&cfg.GossipPort, "gossip-port", edge.DefaultGossipPort, "UDP and TCP port of the site gossip, published in the Node's "+edge.AnnotationGossipPort+" annotation; -1: no gossip")
	f.StringVar(&cfg.GossipBind, "gossip-bind", "", "address the site gossip listens on (default: every address; the other nodes reach it at --node-ip)")
	f.IntVar(&cfg.ImageSharePort, "image-share-port", edge.DefaultImageSharePort, "TCP port on which a node with site gossip serves its image blobs to its site's nodes (mutual TLS with node certificates), published in the Node's "+edge.AnnotationImageSharePort+" annotation; 0: no sharing")
	f.DurationVar(&cfg.ImageStagingInterval, "image-staging-interval", time.Minute, "how often the agent checks that it holds the images of the ImageStagings that select its node")
	f.BoolVar(&ingressOn, "ingress", false, "run the built-in ingress controller: serve the Ingresses whose IngressClass names the controller "+ingress.ControllerName+" on this node's ports 80 and 443 (see docs/ingress.md); the Node is labelled "+ingress.NodeLabel+"=true")
	f.StringVar(&ingressCfg.HTTPAddr, "ingress-http-addr", ":80", "address the ingress controller serves HTTP on")
	f.StringVar(&ingressCfg.HTTPSAddr, "ingress-https-addr", ":443", "address the ingress controller serves HTTPS on")
	f.StringToStringVar(&cfg.Labels, "labels", nil, "extra node labels, key=value,...")
	f.StringVar(&nodeIP, "node-ip", "", "the node's InternalIP (default: the address used to reach the hub)")
	f.StringVar(&cfg.TunnelAddr, "tunnel-addr", "", "tunnel address HOST:PORT (default: the --hub host and port)")
	f.DurationVar(&cfg.StatusInterval, "node-status-report-frequency", 5*time.Minute, "longest time between node status reports when nothing changes")
	f.DurationVar(&cfg.MetricsPeriod, "metrics-period", 15*time.Second, "how often the node reports its and its containers' CPU and memory usage to the hub (kubectl top, autoscaling); 0: never")
	f.BoolVar(&cfg.WatchServices, "watch-services", true, "watch Services and EndpointSlices for the data plane")
	f.IntVar(&gcPercent, "gc-percent", 50, "garbage collection target percentage, as GOGC (which applies when this flag is not given): the heap may grow by this much over what is live before a collection; lower keeps the agent smaller for more CPU")
	f.StringVar(&memoryLimit, "memory-limit", "64Mi", "soft limit of the agent's own memory, as GOMEMLIMIT (which applies when this flag is not given): the garbage collector works harder near it; 0: none")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.DurationVar(&simCfg.StartDelay, "sim-start-delay", time.Second, "sim runtime: time a container takes to start")
	f.DurationVar(&simCfg.BackoffBase, "sim-backoff-base", 0, "sim runtime: first crash-loop back-off (0: 10s)")
	f.StringVar(&simCPU, "sim-cpu", "", "sim runtime: cpu capacity (default 4)")
	f.StringVar(&simMemory, "sim-memory", "", "sim runtime: memory capacity (default 8Gi)")
	f.StringVar(&simPods, "sim-pods", "", "sim runtime: pod capacity (default 110)")
	cmd.AddCommand(newEdgeImagesCmd(), newEdgeResetCmd(), newEdgeUpgradeCmd())
	_ = cmd.MarkFlagRequired("hub")
	_ = cmd.MarkFlagRequired("data-dir")
	return withConfigFile(cmd, deploy.Edge)
}

// runtimeHandlerFlags parses the --runtime-handler flags.
func runtimeHandlerFlags(flags []string) (map[string]containerd.RuntimeHandler, error) {
	if len(flags) == 0 {
		return nil, nil
	}
	out := map[string]containerd.RuntimeHandler{}
	for _, f := range flags {
		name, h, err := containerd.ParseRuntimeHandler(f)
		if err != nil {
			return nil, fmt.Errorf("parse --runtime-handler: %w", err)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("parse --runtime-handler: handler %q given twice", name)
		}
		out[name] = h
	}
	return out, nil
}

// agentGC sets the garbage collector of the agent's process from
// --gc-percent and --memory-limit, unless GOGC or GOMEMLIMIT say otherwise
// and the flag was not given. The defaults keep the agent's heap within
// half again what is live (the runtime's default doubles it) and bound it
// well above what a node with a hundred pods needs.
func agentGC(cmd *cobra.Command, gcPercent int, memoryLimit string) error {
	f := cmd.Flags()
	if f.Changed("gc-percent") || os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if f.Changed("memory-limit") || os.Getenv("GOMEMLIMIT") == "" {
		q, err := resource.ParseQuantity(memoryLimit)
		if err != nil {
			return fmt.Errorf("parse --memory-limit: %w", err)
		}
		limit := q.Value()
		if limit <= 0 {
			limit = math.MaxInt64
		}
		debug.SetMemoryLimit(limit)
	}
	return nil
}

// edgeNetFlags fills the dataplane and DNS settings of cfg from the flags,
// choosing the defaults by runtime: a containerd node gets the eBPF
// dataplane (when run as root) and the DNS server on DefaultDNSAddr; a sim
// node, usually one of many hollow nodes on one host, gets neither.
func edgeNetFlags(cmd *cobra.Command, cfg *edge.Config, runtime, mode, dnsAddr string, dnsPort uint16, uplinks []string) error {
	onContainerd := runtime == "containerd"
	switch mode {
	case "":
		cfg.Dataplane = edge.DataplaneNone
		if onContainerd && os.Geteuid() == 0 {
			cfg.Dataplane = edge.DataplaneEBPF
		}
	case edge.DataplaneEBPF, edge.DataplaneNone:
		cfg.Dataplane = mode
	default:
		return fmt.Errorf("unknown --dataplane %q: want ebpf or none", mode)
	}
	switch {
	case cmd.Flags().Changed("uplinks"):
		if !(len(uplinks) == 1 && uplinks[0] == "none") {
			cfg.Uplinks = uplinks
		}
	case cfg.Dataplane == edge.DataplaneEBPF:
		cfg.Uplinks = []string{edge.UplinkAuto}
	}
	if dnsAddr == "" {
		dnsAddr = "none"
		if onContainerd {
			dnsAddr = edge.DefaultDNSAddr
		}
	}
	if dnsAddr != "none" {
		ip, err := netip.ParseAddr(dnsAddr)
		if err != nil {
			return fmt.Errorf("parse --dns-addr: %w", err)
		}
		cfg.DNSAddr = netip.AddrPortFrom(ip, dnsPort)
	}
	if (cfg.Dataplane == edge.DataplaneEBPF || cfg.DNSAddr.IsValid()) && !cfg.WatchServices {
		return errors.New("--watch-services=false leaves the dataplane and the DNS server without Services: add --dataplane none --dns-addr none")
	}
	return nil
}

// apiRelayFlag sets cfg.APIRelayAddr from --api-relay-addr: IP or
// IP:PORT (port 443 when absent), none, or empty for the DNS server's
// address on port 443 (none when the node runs no DNS server).
func apiRelayFlag(cfg *edge.Config, v string) error {
	switch v {
	case "none":
		return nil
	case "":
		if cfg.DNSAddr.IsValid() {
			cfg.APIRelayAddr = netip.AddrPortFrom(cfg.DNSAddr.Addr(), edge.DefaultAPIRelayPort)
		}
		return nil
	}
	if ip, err := netip.ParseAddr(v); err == nil {
		cfg.APIRelayAddr = netip.AddrPortFrom(ip, edge.DefaultAPIRelayPort)
		return nil
	}
	ap, err := netip.ParseAddrPort(v)
	if err != nil {
		return fmt.Errorf("parse --api-relay-addr: want IP, IP:PORT or none: %w", err)
	}
	cfg.APIRelayAddr = ap
	return nil
}
