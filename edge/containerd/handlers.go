package containerd

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	runcoptions "github.com/containerd/containerd/api/types/runc/options"
	containerd "github.com/containerd/containerd/v2/client"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/tether-edge/tether/edge"
)

// RuntimeHandler is the containerd runtime configuration a RuntimeClass's
// handler names on this node, as a CRI runtime's handler configurations
// do: pods whose class has the handler run their containers with it.
type RuntimeHandler struct {
	// Type is containerd's runtime type, such as io.containerd.runc.v2
	// or io.containerd.kata.v2.
	Type string
	// BinaryName, for io.containerd.runc.v2 only, is the runc-compatible
	// program the shim runs (for example runsc or crun); empty means runc
	// on containerd's PATH.
	BinaryName string
}

// RuncV2 is containerd's runc runtime type, which pods without a
// RuntimeClass run with.
const RuncV2 = "io.containerd.runc.v2"

// DefaultRuntimeHandler is the handler every node has unless configured
// otherwise: containerd's runc.
const DefaultRuntimeHandler = "runc"

// ParseRuntimeHandler parses NAME=TYPE[:BINARY], the edge agent's
// --runtime-handler syntax: runc-alt=io.containerd.runc.v2:/usr/bin/crun,
// kata=io.containerd.kata.v2. NAME is the handler RuntimeClasses name (a
// DNS label); BINARY, an absolute path, is allowed for runc only.
func ParseRuntimeHandler(s string) (string, RuntimeHandler, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || rest == "" {
		return "", RuntimeHandler{}, fmt.Errorf("parse runtime handler %q: want NAME=TYPE[:BINARY]", s)
	}
	if msgs := validation.IsDNS1123Label(name); len(msgs) > 0 {
		return "", RuntimeHandler{}, fmt.Errorf("parse runtime handler %q: name: %s", s, strings.Join(msgs, "; "))
	}
	typ, bin, _ := strings.Cut(rest, ":")
	if typ == "" {
		return "", RuntimeHandler{}, fmt.Errorf("parse runtime handler %q: no runtime type", s)
	}
	if bin != "" && typ != RuncV2 {
		return "", RuntimeHandler{}, fmt.Errorf("parse runtime handler %q: a binary can only be given for %s", s, RuncV2)
	}
	if bin != "" && !filepath.IsAbs(bin) {
		return "", RuntimeHandler{}, fmt.Errorf("parse runtime handler %q: binary %q is not an absolute path", s, bin)
	}
	return name, RuntimeHandler{Type: typ, BinaryName: bin}, nil
}

// handler returns the configuration of the named handler: the
// configured one, else runc for DefaultRuntimeHandler.
func (r *Runtime) handler(name string) (RuntimeHandler, bool) {
	if h, ok := r.cfg.RuntimeHandlers[name]; ok {
		return h, true
	}
	if name == DefaultRuntimeHandler {
		return RuntimeHandler{Type: RuncV2}, true
	}
	return RuntimeHandler{}, false
}

// podRuntime resolves the runtime a pod's containers run with: nil (the
// client's default, runc) for a pod without a RuntimeClass, else the
// configuration of its class's handler. The errors are the kubelet's and
// containerd's CRI's: a class that does not exist, a handler this node
// has no configuration for.
func (r *Runtime) podRuntime(spec *corev1.Pod) (*RuntimeHandler, error) {
	name := spec.Spec.RuntimeClassName
	if name == nil || *name == "" {
		return nil, nil
	}
	src := r.sources()
	if src == nil {
		return nil, fmt.Errorf("runtime class %s: %w", *name, edge.ErrSourceNotReady)
	}
	handler, err := src.RuntimeHandler(*name)
	if err != nil {
		return nil, err
	}
	h, ok := r.handler(handler)
	if !ok {
		return nil, fmt.Errorf("failed to get sandbox runtime: no runtime for %q is configured", handler)
	}
	return &h, nil
}

// resolveRuntime gives p the runtime of its pod, once: at its sandbox's
// creation, or at the first sync after the runtime restarted. A failure
// is the sandbox's, reported as the kubelet does.
func (r *Runtime) resolveRuntime(p *pod, spec *corev1.Pod) error {
	p.mu.Lock()
	done := p.runtimeSet
	p.mu.Unlock()
	if done {
		return nil
	}
	h, err := r.podRuntime(spec)
	if err != nil {
		if !errors.Is(err, edge.ErrSourceNotReady) {
			r.event(p, nil, true, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
		}
		return err
	}
	p.mu.Lock()
	p.runtime, p.runtimeSet = h, true
	p.mu.Unlock()
	return nil
}

// runtimeOpts returns the container options that select the pod's
// runtime; none for the default.
func (p *pod) runtimeOpts() []containerd.NewContainerOpts {
	p.mu.Lock()
	h := p.runtime
	p.mu.Unlock()
	if h == nil {
		return nil
	}
	var opts any
	if h.BinaryName != "" {
		opts = &runcoptions.Options{BinaryName: h.BinaryName}
	}
	return []containerd.NewContainerOpts{containerd.WithRuntime(h.Type, opts)}
}
