package edgeupgrade

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// window is a parsed fleetapi.MaintenanceWindow.
type window struct {
	hour, minute int
	duration     time.Duration
	loc          *time.Location
	// days are the weekdays it opens on; all false means every day.
	days [7]bool
	any  bool
}

// dayNames are the names spec.window.days takes, by time.Weekday.
var dayNames = [7]string{"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"}

// parseWindow checks w; a nil w parses to a nil window (always open).
func parseWindow(w *fleetapi.MaintenanceWindow) (*window, error) {
	if w == nil {
		return nil, nil
	}
	hh, mm, ok := strings.Cut(w.Start, ":")
	h, err1 := strconv.Atoi(hh)
	m, err2 := strconv.Atoi(mm)
	if !ok || err1 != nil || err2 != nil || len(hh) != 2 || len(mm) != 2 || h < 0 || h > 23 || m < 0 || m > 59 {
		return nil, fmt.Errorf("window start %q: want HH:MM", w.Start)
	}
	d := w.Duration.Duration
	if d <= 0 || d > 24*time.Hour {
		return nil, fmt.Errorf("window duration %v: want more than 0 and at most 24h", d)
	}
	tz := w.TimeZone
	if tz == "" {
		tz = "UTC"
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return nil, fmt.Errorf("window time zone %q: %w", tz, err)
	}
	out := &window{hour: h, minute: m, duration: d, loc: loc}
	for _, day := range w.Days {
		i := -1
		for j, n := range dayNames {
			if strings.EqualFold(day, n) {
				i = j
			}
		}
		if i < 0 {
			return nil, fmt.Errorf("window day %q: want one of Mon, Tue, Wed, Thu, Fri, Sat, Sun", day)
		}
		out.days[i], out.any = true, true
	}
	return out, nil
}

// openingOn is when the window opens on the local calendar day of t
// (in the window's zone), and whether it opens on that day at all. On a
// day whose clocks skip the start time, it opens when the clocks show
// the start time as Go normalizes it (the skipped hour added).
func (w *window) openingOn(t time.Time) (time.Time, bool) {
	t = t.In(w.loc)
	o := time.Date(t.Year(), t.Month(), t.Day(), w.hour, w.minute, 0, 0, w.loc)
	return o, !w.any || w.days[t.Weekday()]
}

// open reports whether the window is open at t, and when it closes if so
// (the end of the opening t falls in).
func (w *window) open(t time.Time) (bool, time.Time) {
	if w == nil {
		return true, time.Time{}
	}
	// An opening lasts at most a day: it began today or yesterday
	// (local days; the day before is found at noon, clear of DST jumps).
	local := t.In(w.loc)
	noon := time.Date(local.Year(), local.Month(), local.Day(), 12, 0, 0, 0, w.loc)
	for _, day := range []time.Time{noon, noon.AddDate(0, 0, -1)} {
		o, ok := w.openingOn(day)
		if ok && !t.Before(o) && t.Before(o.Add(w.duration)) {
			return true, o.Add(w.duration)
		}
	}
	return false, time.Time{}
}

// next returns the first opening after t (t itself excluded).
func (w *window) next(t time.Time) time.Time {
	local := t.In(w.loc)
	noon := time.Date(local.Year(), local.Month(), local.Day(), 12, 0, 0, 0, w.loc)
	for i := range 8 {
		if o, ok := w.openingOn(noon.AddDate(0, 0, i)); ok && o.After(t) {
			return o
		}
	}
	return time.Time{} // not reached: some day of every week opens
}
