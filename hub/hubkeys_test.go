package hub_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/store/postgres/pgtest"
)

// sharedKeyFiles are the files under pki/ every hub of a cluster holds
// the same.
var sharedKeyFiles = []string{"ca.crt", "ca.key", "front-proxy-ca.crt", "front-proxy-ca.key", "sa.key"}

// storedKeys returns the sealed cluster keys the database holds and the
// revision they were written at; it fails unless there is exactly one set.
func storedKeys(t *testing.T, dsn string) ([]byte, int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT l.value, o.rev FROM tether_objects o JOIN tether_log l ON l.rev = o.rev WHERE o.resource = 'clusterkeys.tether.internal'`)
	if err != nil {
		t.Fatal(err)
	}
	var (
		val []byte
		rev int64
		n   int
	)
	for rows.Next() {
		if err := rows.Scan(&val, &rev); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("the database holds %d sets of cluster keys, want 1", n)
	}
	return val, rev
}

// TestHubsShareKeys starts two hubs at the same moment on one empty
// PostgreSQL database, each with an empty data directory and only the
// datastore and the secret key given: one makes the cluster's keys and
// stores them, the other reads them; both serve, client certificates and
// ServiceAccount tokens one issues are good on the other, an edge joined
// through one is trusted by the other when it moves there, and a hub with
// the wrong secret key refuses to start and changes nothing.
func TestHubsShareKeys(t *testing.T) {
	pg := pgtest.Start(t)
	dsn := pg.NewDatabase()
	secret := hubtest.SecretKeyFile(t)
	hubs := hubtest.StartTogether(t, 2, "--datastore", dsn, "--secret-key-file", secret,
		"--drain-window", "1s", "--disable-scheduler", "--disable-metrics-api", "--controllers=garbagecollector")
	h1, h2 := hubs[0], hubs[1]

	t.Run("one key set", func(t *testing.T) {
		for _, name := range sharedKeyFiles {
			a, errA := os.ReadFile(filepath.Join(h1.DataDir, "pki", name))
			b, errB := os.ReadFile(filepath.Join(h2.DataDir, "pki", name))
			if errA != nil || errB != nil || !bytes.Equal(a, b) {
				t.Errorf("pki/%s differs between the hubs (%v, %v)", name, errA, errB)
			}
		}
		// Each hub has its own serving certificate.
		a, _ := os.ReadFile(filepath.Join(h1.DataDir, "pki", "serving.crt"))
		b, _ := os.ReadFile(filepath.Join(h2.DataDir, "pki", "serving.crt"))
		if len(a) == 0 || bytes.Equal(a, b) {
			t.Errorf("the hubs share a serving certificate")
		}
		stored, read := 0, 0
		for _, h := range hubs {
			if strings.Contains(h.Logs(), "stored the cluster's keys in the datastore") {
				stored++
			}
			if strings.Contains(h.Logs(), "read the cluster's keys from the datastore") {
				read++
			}
		}
		if stored != 1 || read != 1 {
			t.Errorf("%d hubs stored the keys and %d read them, want 1 and 1", stored, read)
		}
		val, _ := storedKeys(t, dsn)
		if bytes.Contains(val, []byte("PRIVATE KEY")) || bytes.Contains(val, []byte("CERTIFICATE")) {
			t.Errorf("the stored keys are in clear: %.200s", val)
		}
		if out := h1.MustRun("api-resources", "-o", "name"); strings.Contains(out, "clusterkeys") {
			t.Errorf("the API serves the cluster's keys:\n%s", out)
		}
	})

	t.Run("client certificate", func(t *testing.T) {
		// Each admin kubeconfig holds a certificate its own hub issued;
		// the other hub accepts it and is trusted by its CA.
		for _, p := range [][2]*hubtest.Hub{{h1, h2}, {h2, h1}} {
			if _, err := p[0].Run("--server", "https://"+p[1].Addr, "get", "namespace", "default"); err != nil {
				t.Errorf("%s's admin certificate on %s: %v", p[0].Addr, p[1].Addr, err)
			}
		}
	})

	t.Run("service account token", func(t *testing.T) {
		h1.MustRun("create", "serviceaccount", "keys")
		tok := strings.TrimSpace(h1.MustRun("create", "token", "keys"))
		ca, _ := os.ReadFile(filepath.Join(h1.DataDir, "pki", "ca.crt"))
		cs, err := kubernetes.NewForConfig(&rest.Config{Host: "https://" + h2.Addr, BearerToken: tok,
			TLSClientConfig: rest.TLSClientConfig{CAData: ca}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("a token %s minted on %s: %v", h1.Addr, h2.Addr, err)
		}
		if u := r.Status.UserInfo.Username; u != "system:serviceaccount:default:keys" {
			t.Fatalf("the token is %q on the other hub", u)
		}
	})

	t.Run("wrong secret key", func(t *testing.T) {
		before, rev := storedKeys(t, dsn)
		wrong := hubtest.SecretKeyFile(t)
		dir := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, h1.Bin, "hub", "--data-dir", dir, "--listen", "127.0.0.1:0",
			"--datastore", dsn, "--secret-key-file", wrong).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "the cluster's keys in the datastore do not decrypt with the secret key in "+wrong) {
			t.Fatalf("a hub with the wrong secret key: %v\n%s", err, out)
		}
		after, rev2 := storedKeys(t, dsn)
		if rev2 != rev || !bytes.Equal(before, after) {
			t.Errorf("the stored keys changed: revision %d, was %d", rev2, rev)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("the refused hub wrote %d files into its data directory, first %s", len(ents), ents[0].Name())
		}
		// Without a secret key at all it says what to give it.
		out, err = exec.CommandContext(ctx, h1.Bin, "hub", "--data-dir", dir, "--datastore", dsn).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "a PostgreSQL datastore needs a secret key file (--secret-key-file)") {
			t.Fatalf("a hub without a secret key: %v\n%s", err, out)
		}
	})

	t.Run("edge moves", func(t *testing.T) {
		out, err := exec.Command(h1.Bin, "token", "create", "--kubeconfig", h1.Kubeconfig).Output()
		if err != nil {
			t.Fatalf("tether token create: %v", err)
		}
		dir := filepath.Join(t.TempDir(), "keys-edge")
		startFleetEdge(t, h1, strings.TrimSpace(string(out)), "keys-edge", dir)
		waitFleet(t, "the edge Ready and knowing both hubs", 60*time.Second, func() bool {
			b, err := os.ReadFile(filepath.Join(dir, "hubs.json"))
			var l struct{ Hubs []struct{ Tunnel string } }
			return err == nil && json.Unmarshal(b, &l) == nil && len(l.Hubs) == 2 && readyNodes(h1) == 1 && sessions(t, h1) == 1
		})
		// The edge's certificate was issued by h1 at join and it knows
		// h1's serving certificate; h2 accepts it and it trusts h2.
		h1.Stop()
		waitFleet(t, "the edge's tunnel on the other hub", 30*time.Second, func() bool {
			return sessions(t, h2) == 1
		})
		waitFleet(t, "the node Ready through the other hub", 20*time.Second, func() bool {
			return readyNodes(h2) == 1 && freshLeases(t, h2) == 1
		})
	})
}
