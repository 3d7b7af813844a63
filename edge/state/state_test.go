package state

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

func TestCommitListReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	a := Key{Kind: "pods", Namespace: "default", Name: "web", UID: "u1"}
	b := Key{Kind: "pods", Namespace: "default", Name: "web", UID: "u2"}
	if err := s.Commit([]Op{{Key: a, Value: []byte("one")}}, map[string]string{"pods": "10"}); err != nil {
		t.Fatal(err)
	}
	// The pod is deleted and created again under its name: a tombstone
	// and a live object side by side.
	if err := s.Commit([]Op{{Key: a, Gone: true, Value: []byte("one, gone")}, {Key: b, Value: []byte("two")}}, map[string]string{"pods": "12"}); err != nil {
		t.Fatal(err)
	}
	s.SetLazy("pods", "20")
	s.SetLazy("configmaps/default/c", "15")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("state file: %v, mode %v", err, fi.Mode())
	}

	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rows, err := s.List("pods", "default", "web")
	if err != nil || len(rows) != 2 {
		t.Fatalf("rows %+v, %v", rows, err)
	}
	for _, r := range rows {
		switch r.UID {
		case "u1":
			if !r.Gone || string(r.Value) != "one, gone" {
				t.Errorf("tombstone %+v", r)
			}
		case "u2":
			if r.Gone || string(r.Value) != "two" {
				t.Errorf("live row %+v", r)
			}
		}
	}
	if rv, _ := s.Watch("pods"); rv != "20" {
		t.Errorf("pods watch at %q after Close flushed the lazy version, want 20", rv)
	}
	if err := s.Commit([]Op{{Key: a, Delete: true}}, map[string]string{"configmaps/default/c": ""}); err != nil {
		t.Fatal(err)
	}
	if ws, _ := s.Watches(); len(ws) != 1 || ws["pods"] != "20" {
		t.Errorf("watches %v", ws)
	}
	if keys, _ := s.Keys("pods"); len(keys) != 1 || keys[0] != b {
		t.Errorf("keys %v", keys)
	}

	// Cluster-scoped objects are listed by name with an empty namespace.
	pv1 := Key{Kind: "persistentvolumes", Name: "pv1", UID: "v1"}
	pv2 := Key{Kind: "persistentvolumes", Name: "pv2", UID: "v2"}
	if err := s.Commit([]Op{{Key: pv1, Value: []byte("1")}, {Key: pv2, Value: []byte("2")}}, nil); err != nil {
		t.Fatal(err)
	}
	if rows, err := s.List("persistentvolumes", "", "pv2"); err != nil || len(rows) != 1 || rows[0].Key != pv2 {
		t.Errorf("cluster-scoped pv2: %+v, %v", rows, err)
	}
	if rows, err := s.List("persistentvolumes", "", ""); err != nil || len(rows) != 2 {
		t.Errorf("all volumes: %+v, %v", rows, err)
	}
}

// Concurrent commits share transactions and all land.
func TestGroupCommit(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 20 {
				k := Key{Kind: "configmaps", Namespace: "ns", Name: fmt.Sprintf("c%d-%d", w, i), UID: "u"}
				if err := s.Commit([]Op{{Key: k, Value: []byte("x")}}, map[string]string{fmt.Sprint("w", w): fmt.Sprint(i)}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if keys, _ := s.Keys("configmaps"); len(keys) != 320 {
		t.Errorf("%d objects, want 320", len(keys))
	}
	if ws, _ := s.Watches(); len(ws) != 16 || ws["w3"] != "19" {
		t.Errorf("watches %v", ws)
	}
}
