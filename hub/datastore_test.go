package hub_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/store/postgres/pgtest"
)

// TestPostgresDatastore runs a hub on PostgreSQL (--datastore): kubectl
// creates and reads objects, they survive a restart of the hub, an outage
// of the database answers 503 and heals without a restart, and a hub of
// another cluster is refused the same database.
func TestPostgresDatastore(t *testing.T) {
	pg := pgtest.Start(t)
	dsn := pg.NewDatabase()
	secret := hubtest.SecretKeyFile(t)
	h := hubtest.Start(t, append(apiOnly, "--datastore", dsn, "--secret-key-file", secret)...)
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

	// A hub whose data directory holds another CA is of another
	// cluster: refused.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	other := t.TempDir()
	keys, err := pki.GenerateKeys(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(other, "pki"), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"ca.crt": keys.CACert, "ca.key": keys.CAKey} {
		if err := os.WriteFile(filepath.Join(other, "pki", name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.CommandContext(ctx, h.Bin, "hub", "--data-dir", other, "--listen", "127.0.0.1:0", "--datastore", dsn, "--secret-key-file", secret)
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
	// On SQLite the keys stay in the data directory: a restart keeps them.
	keys := readKeyFiles(t, h.DataDir)
	h.Restart()
	if now := readKeyFiles(t, h.DataDir); now != keys {
		t.Fatal("the SQLite hub's keys changed across a restart")
	}
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

	// On PostgreSQL the hub stores the keys of its data directory, so
	// its CA stays the cluster's: its edges still trust it, and a hub
	// started with an empty data directory gets the same keys.
	secret := hubtest.SecretKeyFile(t)
	h.Restart(append(apiOnly, "--datastore", dsn, "--secret-key-file", secret)...)
	if now := readKeyFiles(t, h.DataDir); now != keys {
		t.Fatal("the hub's keys changed when it moved to PostgreSQL")
	}
	if !strings.Contains(h.Logs(), `msg="stored the cluster's keys in the datastore, sealed with the secret key"`) ||
		!strings.Contains(h.Logs(), `keys="the data directory"`) {
		t.Fatalf("the hub did not store its data directory's keys:\n%s", h.Logs())
	}
	peer := hubtest.Start(t, append(apiOnly, "--datastore", dsn, "--secret-key-file", secret)...)
	if got := readKeyFiles(t, peer.DataDir); got != keys {
		t.Fatal("a second hub on the migrated database has other keys than the first")
	}
	peer.Stop()
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

// readKeyFiles returns the cluster's keys in a hub's data directory, the
// files concatenated.
func readKeyFiles(t *testing.T, dataDir string) string {
	t.Helper()
	var all strings.Builder
	for _, name := range sharedKeyFiles {
		b, err := os.ReadFile(filepath.Join(dataDir, "pki", name))
		if err != nil {
			t.Fatal(err)
		}
		all.Write(b)
	}
	return all.String()
}
