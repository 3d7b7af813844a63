// Package metrics measures what an edge node and the containers of its
// pods use, and exposes it the way the kubelet does.
//
// The readers take the root of the file systems they read (a cgroup
// hierarchy, /proc) as an argument, so that tests can point them at a fake
// tree. They return cumulative counters: CPU time used since the cgroup or
// the node started, and memory in use now. A [Sampler] turns two readings of
// the CPU counters into a rate (nanocores over the window between them),
// which is what the agent reports to the hub every period; the Prometheus
// endpoints expose the counters themselves, as the kubelet's
// /metrics/resource and cAdvisor's /metrics/cadvisor do, and leave rates to
// the scraper.
//
// Memory is reported as the kubelet reports it: the working set is the
// usage minus the inactive file pages (memory.stat inactive_file on cgroup
// v2, total_inactive_file on v1), floored at zero, because inactive page
// cache can be reclaimed at once and would otherwise make every container
// that reads files look like it is running out of memory. The node's
// working set is computed the same way from the root cgroup; on cgroup v2
// the root has no memory.current, so its usage is MemTotal - MemFree of
// /proc/meminfo (what runc and cAdvisor use for the root) and inactive_file
// comes from the root's memory.stat, or from Inactive(file) of
// /proc/meminfo when the kernel has no root memory.stat. MemTotal -
// MemAvailable is not used: it leaves out page cache the kubelet counts.
//
// Node CPU time is read from the cpu line of /proc/stat (every state but
// idle and iowait). Both cgroup v2 (the unified hierarchy) and v1 (the
// cpuacct and memory controllers) are read; pressure stall information
// (cpu.pressure, memory.pressure) exists only on v2 and only with a kernel
// built with PSI, and is left out when absent.
package metrics
