package hub_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/store/postgres/pgtest"
)

// TestPostgresDatastore runs a hub on PostgreSQL (--datastore): kubectl
// creates and reads objects, they survive a restart of the hub, an outage
// of the database answers 503 and heals without a restart, and a hub of
// another cluster is refused the same database.
func TestPostgresDatastore(t *testing.T) {
	pg := pgtest.Start(t)
	dsn := pg.NewDatabase()
	h := hubtest.Start(t, append(apiOnly, "--datastore", dsn)...)
	h.MustRun("create", "configmap", "pgconf", "--from-literal=k=v1")
	if out := h.MustRun("get", "configmap", "pgconf", "-o", "jsonpath={.data.k}"); out != "v1" {
		t.Fatalf("configmap data %q, want v1", out)
	}
	h.MustRun("create", "namespace", "pg")
	h.MustRun("-n", "pg", "create", "deployment", "web", "--image=busybox", "--replicas=2")

	h.Restart()
	if out := h.MustRun("get", "configmap", "pgconf", "-o", "jsonpath={.data.k}"); out != "v1" {
		t.Fatalf("configmap after hub restart %q, want v1", out)
	}
	if out := h.MustRun("-n", "pg", "get", "deployment", "web", "-o", "jsonpath={.spec.replicas}"); out != "2" {
		t.Fatalf("deployment after hub restart: replicas %q", out)
	}

	pg.Stop()
	_, err := h.Run("get", "configmap", "pgconf")
	if err == nil || !strings.Contains(err.Error(), "Error from server (ServiceUnavailable): the store's database is unavailable") {
		t.Fatalf("kubectl get during a database outage: %v", err)
	}
	pg.Start()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := h.Run("patch", "configmap", "pgconf", "-p", `{"data":{"k":"v2"}}`)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("hub did not recover from the database outage: %v\n%s\n%s", err, out, h.Logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if out := h.MustRun("get", "configmap", "pgconf", "-o", "jsonpath={.data.k}"); out != "v2" {
		t.Fatalf("configmap after the outage %q, want v2", out)
	}

	// Another hub has another CA, hence another cluster: refused.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.Bin, "hub", "--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--datastore", dsn)
	b, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(b), "refusing to mix their data") {
		t.Fatalf("a second cluster's hub on the same database: %v\n%s", err, b)
	}
	b, err = exec.CommandContext(ctx, h.Bin, "hub", "--data-dir", t.TempDir(), "--datastore", "mysql://u:secret@db/tether").CombinedOutput()
	if err == nil || !strings.Contains(string(b), `datastore "mysql://u:xxxxx@db/tether" is neither empty (SQLite) nor a postgres:// URL`) {
		t.Fatalf("hub with an unknown datastore: %v\n%s", err, b)
	}
}
