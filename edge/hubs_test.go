package edge

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// TestHubFleetKeepsHubsAbsentFromAnAnswer: a hub answers with the hubs
// alive at that moment; the agent keeps those it was told of before, so
// that it can move to them when they are back, and forgets one only after
// a day without it in any answer. What it keeps survives a restart.
func TestHubFleetKeepsHubsAbsentFromAnAnswer(t *testing.T) {
	dir := t.TempDir()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	entries := func(addrs ...string) []hubEntry {
		var l []hubEntry
		for _, a := range addrs {
			l = append(l, hubEntry{Tunnel: a})
		}
		return l
	}
	f := loadHubFleet(dir)
	f.now = clock
	if err := f.merge(entries("10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443")); err != nil {
		t.Fatal(err)
	}
	all := []string{"10.0.0.1:6443", "10.0.0.2:6443", "10.0.0.3:6443"}
	// Two hubs die: the survivor names only itself.
	now = now.Add(time.Minute)
	if err := f.merge(entries("10.0.0.3:6443")); err != nil {
		t.Fatal(err)
	}
	if got := f.Addrs(); !slices.Equal(got, all) {
		t.Fatalf("after an answer naming one hub: %v, want %v", got, all)
	}

	// A restarted agent reads the same from hubs.json.
	g := loadHubFleet(dir)
	g.now = clock
	if got := g.Addrs(); !slices.Equal(got, all) {
		t.Fatalf("after a restart: %v, want %v", got, all)
	}

	// A day later the two are still absent: they are forgotten, and the
	// file says so.
	now = now.Add(hubsForget + time.Minute)
	if err := g.merge(entries("10.0.0.3:6443")); err != nil {
		t.Fatal(err)
	}
	if got := g.Addrs(); !slices.Equal(got, []string{"10.0.0.3:6443"}) {
		t.Fatalf("a day later: %v, want only the hub still answering", got)
	}
	if got := loadHubFleet(dir).Addrs(); !slices.Equal(got, []string{"10.0.0.3:6443"}) {
		t.Fatalf("hubs.json a day later: %v", got)
	}

	// hubs.json of an agent that kept no times: its hubs are kept.
	if err := os.WriteFile(filepath.Join(dir, hubsFile), []byte(`{"hubs":[{"tunnel":"10.0.0.9:6443"},{"tunnel":"bad"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	h := loadHubFleet(dir)
	h.now = clock
	if err := h.merge(entries("10.0.0.3:6443")); err != nil {
		t.Fatal(err)
	}
	if got := h.Addrs(); !slices.Equal(got, []string{"10.0.0.3:6443", "10.0.0.9:6443"}) {
		t.Fatalf("from an old hubs.json: %v", got)
	}
}

// handlerClient is an http.Client whose every request h answers.
func handlerClient(h http.HandlerFunc) *http.Client {
	return &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		w := httptest.NewRecorder()
		h(w, r)
		return w.Result(), nil
	})}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestHubFleetRefreshFromSingleHub: a hub alone serves no fleet and
// answers the agent's question with 403 (the path is authorized before it
// is routed) or 404; that is no error and changes nothing. A hub of a
// fleet answers with the live hubs.
func TestHubFleetRefreshFromSingleHub(t *testing.T) {
	f := loadHubFleet(t.TempDir())
	for _, code := range []int{http.StatusForbidden, http.StatusNotFound} {
		c := handlerClient(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "no", code) })
		if err := f.refresh(context.Background(), c); err != nil {
			t.Fatalf("answer %d: %v", code, err)
		}
		if got := f.Addrs(); len(got) != 0 {
			t.Fatalf("answer %d left hubs %v", code, got)
		}
	}
	c := handlerClient(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != hubsPath {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(`{"hubs":[{"tunnel":"10.0.0.1:6443"},{"tunnel":"10.0.0.2:6443"}]}`))
	})
	if err := f.refresh(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if got := f.Addrs(); !slices.Equal(got, []string{"10.0.0.1:6443", "10.0.0.2:6443"}) {
		t.Fatalf("after a fleet's answer: %v", got)
	}
	c = handlerClient(func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "down", http.StatusServiceUnavailable) })
	if err := f.refresh(context.Background(), c); err == nil {
		t.Fatal("a 503 is not reported")
	}
}
