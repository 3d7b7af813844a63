// Package imagestaging is the controller of fleet.tether.io
// ImageStagings' status. Agents pull the images of the stagings that
// select their nodes and report what they hold in their Nodes'
// status.images; the controller counts, per staging, the selected nodes,
// those holding every image and, per image, those holding it, and writes
// the counts, a phase and a Staged condition. It writes nothing else: the
// work is the agents'.
package imagestaging
