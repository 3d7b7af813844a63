package main

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/tether-edge/tether/edge/upgrade"
)

// TestAwaitAnnouncement covers `tether edge upgrade` run right after the
// agent restarted: it waits for the new process to announce itself
// instead of refusing, and gives up after the bound when the announcement
// is another process's.
func TestAwaitAnnouncement(t *testing.T) {
	dir := t.TempDir()
	recs := upgrade.Open(dir, slog.New(slog.DiscardHandler))
	if err := recs.Announce(upgrade.Agent{PID: 7, Start: 100, Version: "old"}); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(500 * time.Millisecond)
		if err := recs.Announce(upgrade.Agent{PID: 8, Start: 200, Version: "new"}); err != nil {
			t.Error(err)
		}
	}()
	began := time.Now()
	if ok, err := awaitAnnouncement(context.Background(), recs, 200, 10*time.Second); err != nil || !ok {
		t.Fatalf("announced %v, err %v", ok, err)
	}
	if a, _ := recs.Announced(); a == nil || a.Start != 200 {
		t.Fatalf("returned before the announcement: %+v", a)
	}
	if took := time.Since(began); took > 3*time.Second {
		t.Errorf("took %v to see an announcement made after 500ms", took)
	}

	// Another process's announcement: the wait ends at its bound, and
	// the caller refuses.
	began = time.Now()
	if ok, err := awaitAnnouncement(context.Background(), recs, 300, 600*time.Millisecond); err != nil || ok {
		t.Fatalf("announced %v, err %v", ok, err)
	}
	if took := time.Since(began); took < 600*time.Millisecond {
		t.Errorf("gave up after %v, before the 600ms bound", took)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := awaitAnnouncement(ctx, recs, 300, time.Minute); err == nil {
		t.Error("a cancelled wait returned no error")
	}
}
