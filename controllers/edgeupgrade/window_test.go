package edgeupgrade

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/fleetapi"
)

func mustWindow(t *testing.T, start string, d time.Duration, tz string, days ...string) *window {
	t.Helper()
	w, err := parseWindow(&fleetapi.MaintenanceWindow{Start: start, Duration: metav1.Duration{Duration: d}, TimeZone: tz, Days: days})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func at(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestWindow: openings on the window's days in its zone, spans across
// midnight (into a day not listed), the next opening, DST days.
func TestWindow(t *testing.T) {
	if w, err := parseWindow(nil); w != nil || err != nil {
		t.Fatalf("nil window: %v %v", w, err)
	}
	var never *window
	if open, _ := never.open(time.Now()); !open {
		t.Fatal("no window must be always open")
	}
	for _, bad := range []fleetapi.MaintenanceWindow{
		{Start: "24:00", Duration: metav1.Duration{Duration: time.Hour}},
		{Start: "2:00", Duration: metav1.Duration{Duration: time.Hour}},
		{Start: "02:00", Duration: metav1.Duration{Duration: 25 * time.Hour}},
		{Start: "02:00", Duration: metav1.Duration{}},
		{Start: "02:00", Duration: metav1.Duration{Duration: time.Hour}, TimeZone: "Mars/Olympus"},
		{Start: "02:00", Duration: metav1.Duration{Duration: time.Hour}, Days: []string{"Someday"}},
	} {
		if _, err := parseWindow(&bad); err == nil {
			t.Errorf("window %+v accepted", bad)
		}
	}

	// 22:00-02:00 Berlin on Fridays and Saturdays. 2026-03-06 is a
	// Friday; Berlin is UTC+1 then.
	w := mustWindow(t, "22:00", 4*time.Hour, "Europe/Berlin", "Fri", "Sat")
	for _, c := range []struct {
		now    string
		open   bool
		closes string // when open
		next   string // when closed
	}{
		{now: "2026-03-06T20:59:59Z", next: "2026-03-06T21:00:00Z"},
		{now: "2026-03-06T21:00:00Z", open: true, closes: "2026-03-07T01:00:00Z"},
		// Past midnight into Saturday: still Friday's opening.
		{now: "2026-03-07T00:30:00Z", open: true, closes: "2026-03-07T01:00:00Z"},
		{now: "2026-03-07T01:00:00Z", next: "2026-03-07T21:00:00Z"},
		// Saturday's opening runs into Sunday, not listed: still open.
		{now: "2026-03-08T00:59:00Z", open: true, closes: "2026-03-08T01:00:00Z"},
		// Sunday night: closed until next Friday.
		{now: "2026-03-08T21:30:00Z", next: "2026-03-13T21:00:00Z"},
	} {
		now := at(t, c.now)
		open, closes := w.open(now)
		if open != c.open {
			t.Errorf("%s: open %v, want %v", c.now, open, c.open)
			continue
		}
		if open && !closes.Equal(at(t, c.closes)) {
			t.Errorf("%s: closes %v, want %s", c.now, closes.UTC(), c.closes)
		}
		if !open {
			if next := w.next(now); !next.Equal(at(t, c.next)) {
				t.Errorf("%s: next opening %v, want %s", c.now, next.UTC(), c.next)
			}
		}
	}

	// New York, every day 01:30 for 1h; on 2026-03-08 clocks go from
	// 02:00 to 03:00 (EST to EDT): the opening is 06:30Z before, 05:30Z
	// after.
	ny := mustWindow(t, "01:30", time.Hour, "America/New_York")
	if next := ny.next(at(t, "2026-03-07T08:00:00Z")); !next.Equal(at(t, "2026-03-08T06:30:00Z")) {
		t.Errorf("NY next before DST: %v", next.UTC())
	}
	if next := ny.next(at(t, "2026-03-08T08:00:00Z")); !next.Equal(at(t, "2026-03-09T05:30:00Z")) {
		t.Errorf("NY next after DST: %v", next.UTC())
	}
	// A start the clocks skip (02:30 on the DST day) still opens.
	skip := mustWindow(t, "02:30", 30*time.Minute, "America/New_York")
	if next := skip.next(at(t, "2026-03-08T05:00:00Z")); next.IsZero() || next.After(at(t, "2026-03-08T08:00:00Z")) {
		t.Errorf("skipped start: next opening %v, want on the DST day", next.UTC())
	}
	// A whole-day window on Mondays: open through Monday, not Tuesday.
	mon := mustWindow(t, "00:00", 24*time.Hour, "", "mon")
	if open, _ := mon.open(at(t, "2026-03-09T23:59:59Z")); !open {
		t.Error("Monday window shut on Monday")
	}
	if open, _ := mon.open(at(t, "2026-03-10T00:00:00Z")); open {
		t.Error("Monday window open on Tuesday")
	}
	// Tokyo (UTC+9): 09:00 local on Wednesday is 00:00Z Wednesday.
	tk := mustWindow(t, "09:00", time.Hour, "Asia/Tokyo", "Wed")
	if next := tk.next(at(t, "2026-03-10T12:00:00Z")); !next.Equal(at(t, "2026-03-11T00:00:00Z")) {
		t.Errorf("Tokyo next: %v", next.UTC())
	}
}

// TestLimits: batch sizes round up, maxUnavailable rounds down, both at
// least 1, maxUnavailable defaults to the batch size.
func TestLimits(t *testing.T) {
	i := intstr.FromInt32
	s := intstr.FromString
	p := func(v intstr.IntOrString) *intstr.IntOrString { return &v }
	for _, c := range []struct {
		batch, unav *intstr.IntOrString
		nodes       int
		want        limits
	}{
		{nil, nil, 10, limits{1, 1}},
		{p(i(3)), nil, 10, limits{3, 3}},
		{p(i(3)), p(i(1)), 10, limits{3, 1}},
		{p(s("25%")), nil, 10, limits{3, 3}},
		{p(s("25%")), p(s("25%")), 10, limits{3, 2}},
		{p(s("10%")), p(s("5%")), 10, limits{1, 1}},
		{p(s("1%")), nil, 0, limits{1, 1}},
		{p(s("100%")), p(s("50%")), 7, limits{7, 3}},
		{p(s("33%")), nil, 300, limits{99, 99}},
		{p(s("bogus")), p(s("x%")), 10, limits{1, 1}},
	} {
		if got := limitsFor(c.batch, c.unav, c.nodes); got != c.want {
			t.Errorf("batch %v unavailable %v of %d: %+v, want %+v", c.batch, c.unav, c.nodes, got, c.want)
		}
	}
}
