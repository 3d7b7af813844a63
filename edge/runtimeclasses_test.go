package edge_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edge"
)

// handler asks the runtime's Sources for a class's handler.
func (s *sourcedSim) handler(class string) (string, error) {
	s.mu.Lock()
	src := s.src
	s.mu.Unlock()
	if src == nil {
		return "", edge.ErrSourceNotReady
	}
	return src.RuntimeHandler(class)
}

// TestRuntimeClassesFromHubAndOffline: the agent follows the hub's
// RuntimeClasses for its runtime, and still knows them after a restart
// while the hub is down.
func TestRuntimeClassesFromHubAndOffline(t *testing.T) {
	e := startHub(t)
	cfg := edge.Config{HubURL: e.url, Token: e.token, DataDir: t.TempDir(), NodeName: "edge-rc", NodeIP: netip.MustParseAddr("192.0.2.41")}
	rt := newSourcedSim()
	cfg.Runtime = rt
	a := startAgent(t, cfg)
	waitNodeReady(t, e, "edge-rc")
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "sandboxed"}, Handler: "kata"}
	if _, err := e.client.NodeV1().RuntimeClasses().Create(context.Background(), rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the agent knows the class", func() (bool, string) {
		h, err := rt.handler("sandboxed")
		return h == "kata", h + " " + errString(err)
	})
	if _, err := rt.handler("other"); !errors.Is(err, edge.ErrSourceNotFound) || err.Error() != `runtimeclass.node.k8s.io "other" not found` {
		t.Errorf("unknown class: %v", err)
	}

	a.stop(t)
	e.hub.Stop()
	cfg.Token = ""
	rt = newSourcedSim()
	cfg.Runtime = rt
	startAgent(t, cfg)
	eventually(t, 5*time.Second, "the class from the local state, hub down", func() (bool, string) {
		h, err := rt.handler("sandboxed")
		return h == "kata", h + " " + errString(err)
	})
}
