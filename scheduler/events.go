package scheduler

// eventMask is a set of cluster changes. A pod that failed to schedule
// records the changes that could help it (from the filters that rejected
// it); only those move it out of the unschedulable set.
type eventMask uint32

const (
	evNodeAdd eventMask = 1 << iota
	evNodeAllocatable
	evNodeLabel
	evNodeTaint
	evPodAdd    // an assigned pod appeared
	evPodDelete // an assigned pod went away or finished
	evPodLabel  // an assigned pod's labels changed
	evPVC
	evPV
	evStorageClass
	evNamespace

	evAll eventMask = 1<<32 - 1
)

// plugin names the filter that rejected a node.
type plugin uint8

const (
	plugNone plugin = iota
	plugUnschedulable
	plugNodeName
	plugTaint
	plugNodeAffinity
	plugPorts
	plugFit
	plugVolume
	plugSpread
	plugInterPod
	numPlugins
)

// helpsAfter lists, per filter, the changes that can turn its rejection
// into an acceptance.
var helpsAfter = [numPlugins]eventMask{
	plugNone:          evAll,
	plugUnschedulable: evNodeAdd | evNodeTaint,
	plugNodeName:      evNodeAdd,
	plugTaint:         evNodeAdd | evNodeTaint,
	plugNodeAffinity:  evNodeAdd | evNodeLabel,
	plugPorts:         evNodeAdd | evPodDelete,
	plugFit:           evNodeAdd | evNodeAllocatable | evPodDelete,
	plugVolume:        evNodeAdd | evNodeLabel | evPVC | evPV | evStorageClass,
	plugSpread:        evNodeAdd | evNodeLabel | evNodeTaint | evPodAdd | evPodDelete | evPodLabel,
	plugInterPod:      evNodeAdd | evNodeLabel | evPodAdd | evPodDelete | evPodLabel | evNamespace,
}
