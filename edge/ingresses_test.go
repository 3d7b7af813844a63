package edge

import (
	"strings"
	"testing"

	"github.com/tether-edge/tether/edge/ingress"
)

// The ingress controller needs the Service watches, and labels the Node
// without touching the caller's labels.
func TestIngressConfig(t *testing.T) {
	base := func() Config {
		return Config{HubURL: "https://hub:6443", DataDir: t.TempDir(), Runtime: nopRuntime{}, Ingress: &ingress.Config{}}
	}
	cfg := base()
	if err := cfg.setDefaults(); err == nil || !strings.Contains(err.Error(), "WatchServices") {
		t.Errorf("ingress without WatchServices: %v", err)
	}
	cfg = base()
	cfg.WatchServices = true
	mine := map[string]string{"a": "b"}
	cfg.Labels = mine
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	if cfg.Labels[ingress.NodeLabel] != "true" || cfg.Labels["a"] != "b" || len(mine) != 1 {
		t.Errorf("labels %v, caller's %v", cfg.Labels, mine)
	}
	cfg = base()
	cfg.Ingress = nil
	if err := cfg.setDefaults(); err != nil || cfg.Labels[ingress.NodeLabel] != "" {
		t.Errorf("without ingress: %v %v", err, cfg.Labels)
	}
}
