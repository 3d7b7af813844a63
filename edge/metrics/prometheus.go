package metrics

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ReadFunc takes a Snapshot of the node now.
type ReadFunc func(ctx context.Context) (Snapshot, error)

// Registries are the Prometheus registries of one node's usage: Resource
// is served at /metrics/resource and Cadvisor at /metrics/cadvisor. Each
// scrape takes a new Snapshot; every sample carries the snapshot's time as
// its timestamp, as the kubelet's do.
type Registries struct {
	Resource, Cadvisor *prometheus.Registry
}

// NewRegistries returns the registries of a node whose usage read gives.
// timeout bounds one read.
func NewRegistries(read ReadFunc, timeout time.Duration) Registries {
	r := Registries{Resource: prometheus.NewRegistry(), Cadvisor: prometheus.NewRegistry()}
	r.Resource.MustRegister(&resourceCollector{read: read, timeout: timeout})
	r.Cadvisor.MustRegister(&cadvisorCollector{read: read, timeout: timeout})
	return r
}

// Handler serves reg in the Prometheus exposition formats.
func Handler(reg *prometheus.Registry, log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, ErrorLog: slogPrinter{log}})
}

type slogPrinter struct{ log *slog.Logger }

func (p slogPrinter) Println(v ...any) {
	if p.log != nil {
		p.log.Warn("serve metrics", "err", v)
	}
}

func snapshot(read ReadFunc, timeout time.Duration) (Snapshot, error) {
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	return read(ctx)
}

func seconds(d time.Duration) float64 { return d.Seconds() }

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// The kubelet's /metrics/resource.
var (
	descNodeCPU = prometheus.NewDesc("node_cpu_usage_seconds_total",
		"CPU time the node has used, in core-seconds.", nil, nil)
	descNodeMem = prometheus.NewDesc("node_memory_working_set_bytes",
		"Working set of the node (usage less inactive file pages), in bytes.", nil, nil)
	descContainerCPU = prometheus.NewDesc("container_cpu_usage_seconds_total",
		"CPU time the container has used, in core-seconds.", []string{"container", "pod", "namespace"}, nil)
	descContainerMem = prometheus.NewDesc("container_memory_working_set_bytes",
		"Working set of the container (usage less inactive file pages), in bytes.", []string{"container", "pod", "namespace"}, nil)
	descContainerStart = prometheus.NewDesc("container_start_time_seconds",
		"When the container started, in seconds since the Unix epoch.", []string{"container", "pod", "namespace"}, nil)
	descPodCPU = prometheus.NewDesc("pod_cpu_usage_seconds_total",
		"CPU time the pod's containers have used, in core-seconds.", []string{"pod", "namespace"}, nil)
	descPodMem = prometheus.NewDesc("pod_memory_working_set_bytes",
		"Working set of the pod's containers, in bytes.", []string{"pod", "namespace"}, nil)
	descScrapeError = prometheus.NewDesc("scrape_error",
		"1 when reading the containers' usage failed for this scrape, else 0.", nil, nil)
	descResourceScrapeError = prometheus.NewDesc("resource_scrape_error",
		"1 when reading the containers' usage failed for this scrape, else 0.", nil, nil)
)

type resourceCollector struct {
	read    ReadFunc
	timeout time.Duration
}

func (c *resourceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descNodeCPU, descNodeMem, descContainerCPU, descContainerMem,
		descContainerStart, descPodCPU, descPodMem, descScrapeError, descResourceScrapeError} {
		ch <- d
	}
}

func (c *resourceCollector) Collect(ch chan<- prometheus.Metric) {
	s, err := snapshot(c.read, c.timeout)
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(descScrapeError, prometheus.GaugeValue, failed)
	ch <- prometheus.MustNewConstMetric(descResourceScrapeError, prometheus.GaugeValue, failed)
	if err != nil {
		return
	}
	at := func(m prometheus.Metric) prometheus.Metric { return prometheus.NewMetricWithTimestamp(s.Time, m) }
	ch <- at(prometheus.MustNewConstMetric(descNodeCPU, prometheus.CounterValue, seconds(s.Node.CPU)))
	ch <- at(prometheus.MustNewConstMetric(descNodeMem, prometheus.GaugeValue, float64(s.Node.WorkingSet)))
	for _, p := range s.Pods {
		if len(p.Containers) == 0 {
			continue
		}
		var cpu time.Duration
		var ws uint64
		for _, k := range p.Containers {
			cpu += k.Stats.CPU
			ws += k.Stats.WorkingSet
			ch <- at(prometheus.MustNewConstMetric(descContainerCPU, prometheus.CounterValue, seconds(k.Stats.CPU), k.Name, p.Name, p.Namespace))
			ch <- at(prometheus.MustNewConstMetric(descContainerMem, prometheus.GaugeValue, float64(k.Stats.WorkingSet), k.Name, p.Name, p.Namespace))
			if !k.StartTime.IsZero() {
				// Stamped with the start itself, as the kubelet does.
				ch <- prometheus.NewMetricWithTimestamp(k.StartTime,
					prometheus.MustNewConstMetric(descContainerStart, prometheus.GaugeValue, unixSeconds(k.StartTime), k.Name, p.Name, p.Namespace))
			}
		}
		ch <- at(prometheus.MustNewConstMetric(descPodCPU, prometheus.CounterValue, seconds(cpu), p.Name, p.Namespace))
		ch <- at(prometheus.MustNewConstMetric(descPodMem, prometheus.GaugeValue, float64(ws), p.Name, p.Namespace))
	}
}

// cAdvisor's /metrics/cadvisor: the node is the root container (id "/").
var (
	cadvisorLabels = []string{"id", "container", "pod", "namespace", "name", "image"}

	descCCPU      = prometheus.NewDesc("container_cpu_usage_seconds_total", "CPU time used, in core-seconds.", cadvisorLabels, nil)
	descCMemUsage = prometheus.NewDesc("container_memory_usage_bytes", "Memory charged to the cgroup, in bytes, page cache included.", cadvisorLabels, nil)
	descCMemWS    = prometheus.NewDesc("container_memory_working_set_bytes", "Working set (usage less inactive file pages), in bytes.", cadvisorLabels, nil)
	descCMemRSS   = prometheus.NewDesc("container_memory_rss", "Anonymous memory, in bytes.", cadvisorLabels, nil)
	descCMemCache = prometheus.NewDesc("container_memory_cache", "Page cache charged to the cgroup, in bytes.", cadvisorLabels, nil)
	descCStart    = prometheus.NewDesc("container_start_time_seconds", "When the container started, in seconds since the Unix epoch.", cadvisorLabels, nil)
	descCCPUWait  = prometheus.NewDesc("container_pressure_cpu_waiting_seconds_total", "Time some of the cgroup's tasks waited for a CPU (PSI some), in seconds.", cadvisorLabels, nil)
	descCCPUStall = prometheus.NewDesc("container_pressure_cpu_stalled_seconds_total", "Time all of the cgroup's tasks waited for a CPU (PSI full), in seconds.", cadvisorLabels, nil)
	descCMemWait  = prometheus.NewDesc("container_pressure_memory_waiting_seconds_total", "Time some of the cgroup's tasks waited for memory (PSI some), in seconds.", cadvisorLabels, nil)
	descCMemStall = prometheus.NewDesc("container_pressure_memory_stalled_seconds_total", "Time all of the cgroup's tasks waited for memory (PSI full), in seconds.", cadvisorLabels, nil)

	fsLabels      = []string{"id", "container", "pod", "namespace", "name", "image", "device"}
	descFSUsage   = prometheus.NewDesc("container_fs_usage_bytes", "Bytes used on the file system.", fsLabels, nil)
	descFSLimit   = prometheus.NewDesc("container_fs_limit_bytes", "Size of the file system, in bytes.", fsLabels, nil)
	descFSInodes  = prometheus.NewDesc("container_fs_inodes_total", "Inodes of the file system.", fsLabels, nil)
	descFSIFree   = prometheus.NewDesc("container_fs_inodes_free", "Free inodes of the file system.", fsLabels, nil)
	descCScrapeOK = prometheus.NewDesc("container_scrape_error", "1 when reading the containers' usage failed for this scrape, else 0.", nil, nil)
)

type cadvisorCollector struct {
	read    ReadFunc
	timeout time.Duration
}

func (c *cadvisorCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descCCPU, descCMemUsage, descCMemWS, descCMemRSS, descCMemCache, descCStart,
		descCCPUWait, descCCPUStall, descCMemWait, descCMemStall, descFSUsage, descFSLimit, descFSInodes, descFSIFree, descCScrapeOK} {
		ch <- d
	}
}

func (c *cadvisorCollector) Collect(ch chan<- prometheus.Metric) {
	s, err := snapshot(c.read, c.timeout)
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(descCScrapeOK, prometheus.GaugeValue, failed)
	if err != nil {
		return
	}
	at := func(m prometheus.Metric) prometheus.Metric { return prometheus.NewMetricWithTimestamp(s.Time, m) }
	emit := func(stats Cgroup, start time.Time, labels ...string) {
		ch <- at(prometheus.MustNewConstMetric(descCCPU, prometheus.CounterValue, seconds(stats.CPU), labels...))
		ch <- at(prometheus.MustNewConstMetric(descCMemUsage, prometheus.GaugeValue, float64(stats.Usage), labels...))
		ch <- at(prometheus.MustNewConstMetric(descCMemWS, prometheus.GaugeValue, float64(stats.WorkingSet), labels...))
		ch <- at(prometheus.MustNewConstMetric(descCMemRSS, prometheus.GaugeValue, float64(stats.RSS), labels...))
		ch <- at(prometheus.MustNewConstMetric(descCMemCache, prometheus.GaugeValue, float64(stats.Cache), labels...))
		if !start.IsZero() {
			ch <- at(prometheus.MustNewConstMetric(descCStart, prometheus.GaugeValue, unixSeconds(start), labels...))
		}
		if p := stats.CPUPressure; p != nil {
			ch <- at(prometheus.MustNewConstMetric(descCCPUWait, prometheus.CounterValue, seconds(p.Some), labels...))
			ch <- at(prometheus.MustNewConstMetric(descCCPUStall, prometheus.CounterValue, seconds(p.Full), labels...))
		}
		if p := stats.MemoryPressure; p != nil {
			ch <- at(prometheus.MustNewConstMetric(descCMemWait, prometheus.CounterValue, seconds(p.Some), labels...))
			ch <- at(prometheus.MustNewConstMetric(descCMemStall, prometheus.CounterValue, seconds(p.Full), labels...))
		}
	}
	n := s.Node
	emit(Cgroup{CPU: n.CPU, Memory: n.Memory, CPUPressure: n.CPUPressure, MemoryPressure: n.MemoryPressure}, time.Time{}, "/", "", "", "", "", "")
	for _, f := range n.Filesystems {
		l := []string{"/", "", "", "", "", "", f.Path}
		ch <- at(prometheus.MustNewConstMetric(descFSUsage, prometheus.GaugeValue, float64(f.Used), l...))
		ch <- at(prometheus.MustNewConstMetric(descFSLimit, prometheus.GaugeValue, float64(f.Capacity), l...))
		ch <- at(prometheus.MustNewConstMetric(descFSInodes, prometheus.GaugeValue, float64(f.Inodes), l...))
		ch <- at(prometheus.MustNewConstMetric(descFSIFree, prometheus.GaugeValue, float64(f.InodesFree), l...))
	}
	for _, p := range s.Pods {
		for _, k := range p.Containers {
			id := k.Cgroup
			if id == "" {
				id = "/" + p.Namespace + "/" + p.Name + "/" + k.Name
			}
			emit(k.Stats, k.StartTime, id, k.Name, p.Name, p.Namespace, containerName(k.ID), k.Image)
		}
	}
}

// containerName is the runtime's id of an instance, without the
// "<runtime>://" prefix.
func containerName(id string) string {
	if _, after, ok := strings.Cut(id, "://"); ok {
		return after
	}
	return id
}
