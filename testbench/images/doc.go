// Package images builds the container images tether's tests and demo use,
// without a registry and without docker: it compiles small static Go
// programs and packs them, with busybox when the host has a static one, as
// OCI image-layout archives that containerd imports.
package images
