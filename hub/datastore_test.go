package hub_test

import (
	"context"
	"os/exec"
	"strconv"
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

// TestMigrateSQLiteToPostgres copies a stopped hub's SQLite store into
// PostgreSQL with `tether store migrate` and runs the hub on it: objects
// and their resourceVersions are kept and new writes continue above them.
func TestMigrateSQLiteToPostgres(t *testing.T) {
	pg := pgtest.Start(t)
	dsn := pg.NewDatabase()
	h := hubtest.Start(t, apiOnly...)
	h.MustRun("create", "namespace", "mig")
	h.MustRun("-n", "mig", "create", "configmap", "a", "--from-literal=k=1")
	h.MustRun("-n", "mig", "create", "secret", "generic", "s", "--from-literal=p=q")
	h.MustRun("-n", "mig", "label", "configmap", "a", "tier=web")
	h.MustRun("-n", "mig", "create", "configmap", "gone", "--from-literal=k=2")
	h.MustRun("-n", "mig", "delete", "configmap", "gone")
	const rvs = `{range .items[*]}{.kind}/{.metadata.name}={.metadata.resourceVersion} {end}`
	before := h.MustRun("-n", "mig", "get", "configmaps,secrets", "-o", "jsonpath="+rvs)
	h.Stop()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	migrate := func() (string, error) {
		b, err := exec.CommandContext(ctx, h.Bin, "store", "migrate", "--from", "sqlite:"+h.DataDir, "--to", dsn).CombinedOutput()
		return string(b), err
	}
	if out, err := migrate(); err != nil || !strings.Contains(out, "copied") {
		t.Fatalf("tether store migrate: %v\n%s", err, out)
	}
	if out, err := migrate(); err == nil || !strings.Contains(out, "import only into an empty one") {
		t.Fatalf("second migrate into the same database: %v\n%s", err, out)
	}

	h.Restart(append(apiOnly, "--datastore", dsn)...)
	after := h.MustRun("-n", "mig", "get", "configmaps,secrets", "-o", "jsonpath="+rvs)
	if after != before {
		t.Fatalf("objects after migration:\n%s\nbefore:\n%s", after, before)
	}
	if out := h.MustRun("-n", "mig", "get", "configmaps", "-l", "tier=web", "-o", "name"); out != "configmap/a\n" {
		t.Fatalf("label selector after migration: %q", out)
	}
	old := h.MustRun("-n", "mig", "get", "configmap", "a", "-o", "jsonpath={.metadata.resourceVersion}")
	h.MustRun("-n", "mig", "label", "configmap", "a", "tier=db", "--overwrite")
	now := h.MustRun("-n", "mig", "get", "configmap", "a", "-o", "jsonpath={.metadata.resourceVersion}")
	o, _ := strconv.ParseInt(old, 10, 64)
	n, _ := strconv.ParseInt(now, 10, 64)
	if n <= o {
		t.Fatalf("resourceVersion after an update on PostgreSQL %d, not above %d", n, o)
	}
}
