package testbench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
)

// buildTools returns tether and the pinned kubectl, built once per test
// process (hubtest.Binaries). A missing or broken ./cmd/tether fails the
// test: the lab tests exist to prove the hub works through NAT, and
// skipping would hide that it does not.
func buildTools(t *testing.T) (tether, kubectl string) {
	t.Helper()
	return hubtest.Binaries(t)
}

func TestHubThroughNAT(t *testing.T) {
	requireRoot(t)
	tether, kubectl := buildTools(t)
	l := newLab(t, Spec{Sites: []SiteSpec{{Name: "shop", Nodes: 1, Link: LinkParams{
		Rate: 2_000_000, Delay: Duration(20 * time.Millisecond)}}}})
	data := t.TempDir()
	api := l.Hub().Addr + ":6443"
	hub, err := l.Start("hub", "tether-hub", tether, "hub", "--data-dir", data, "--listen", api)
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Stop(10 * time.Second)
	kubeconfig := filepath.Join(data, "admin.kubeconfig")
	deadline := time.Now().Add(60 * time.Second)
	for {
		if _, err := os.Stat(kubeconfig); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tether hub wrote no %s within 60s; log in %s", kubeconfig, hub.LogPath())
		}
		time.Sleep(100 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"get", "--raw", "/version"},
		{"get", "namespaces"},
	} {
		full := append([]string{kubectl, "--kubeconfig", kubeconfig, "--server", "https://" + api, "--request-timeout", "20s"}, args...)
		var out []byte
		var err error
		for try := 0; try < 20; try++ {
			if out, err = l.Exec(ctx, "shop-n1", full...); err == nil {
				break
			}
			time.Sleep(250 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("kubectl %s from shop-n1: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("kubectl %s from shop-n1:\n%s", strings.Join(args, " "), out)
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
