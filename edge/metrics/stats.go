package metrics

import "time"

// Memory is the memory of a cgroup or node when it was read, in bytes.
type Memory struct {
	// Usage is all the memory charged: memory.current (v2),
	// memory.usage_in_bytes (v1).
	Usage uint64
	// WorkingSet is Usage minus the inactive file pages, at least 0.
	WorkingSet uint64
	// RSS is anonymous memory (anon on v2, total_rss on v1).
	RSS uint64
	// Cache is file-backed memory (file on v2, total_cache on v1).
	Cache uint64
}

// Pressure is a cumulative pressure stall counter pair (the total= fields
// of a PSI file).
type Pressure struct {
	// Some is the time at least one task stalled; Full the time all of
	// them did (always 0 for cpu on older kernels).
	Some, Full time.Duration
}

// Cgroup is what one reading of a cgroup gives.
type Cgroup struct {
	// CPU is the CPU time its tasks used since the cgroup was made.
	CPU time.Duration
	Memory
	// CPUPressure and MemoryPressure are nil when the kernel has none
	// for the cgroup (cgroup v1, or no PSI).
	CPUPressure, MemoryPressure *Pressure
}

// Container is one reading of a running container of a pod.
type Container struct {
	Name string
	// ID names the container's instance: the runtime's "<runtime>://<id>".
	// A new ID is a new instance whose counters start again from zero.
	ID string
	// Image is the image the container runs.
	Image string
	// Cgroup is the container's cgroup path, relative to the hierarchy's
	// root ("/tether/<id>"); empty when there is none (simulated).
	Cgroup string
	// StartTime is when the instance started.
	StartTime time.Time
	Stats     Cgroup
}

// Pod is one reading of the running containers of a pod.
type Pod struct {
	Namespace, Name, UID string
	Containers           []Container
}

// Filesystem is the usage of a file system holding a node's data.
type Filesystem struct {
	// Name says what it holds ("agent", "images"); Path is a directory
	// on it.
	Name, Path string
	// Capacity, Available and Used are in bytes; Inodes and InodesFree
	// count inodes.
	Capacity, Available, Used uint64
	Inodes, InodesFree        uint64
}

// Node is one reading of a node.
type Node struct {
	// CPU is the CPU time all the node's CPUs used since boot.
	CPU time.Duration
	Memory
	CPUPressure, MemoryPressure *Pressure
	Filesystems                 []Filesystem
}

// Snapshot is one reading of a node and of its pods' running containers,
// taken at Time.
type Snapshot struct {
	Time time.Time
	Node Node
	Pods []Pod
}
