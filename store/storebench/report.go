package storebench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/tether-edge/tether/internal/benchfmt"
)

// metric is one row of the comparison table.
type metric struct {
	label string
	// higher says whether a bigger value is better.
	higher bool
	get    func(Result) (float64, bool)
}

func metrics(rs []Result) []metric {
	var ws []int
	for _, r := range rs {
		for _, p := range r.Phases {
			if !slices.Contains(ws, p.Writers) {
				ws = append(ws, p.Writers)
			}
		}
	}
	slices.Sort(ws)
	var ms []metric
	for _, w := range ws {
		ms = append(ms, metric{fmt.Sprintf("creates/s, %d writers", w), true, func(r Result) (float64, bool) {
			p, ok := r.Phase(w)
			return p.CreatesPerSec, ok
		}})
	}
	for _, w := range ws {
		ms = append(ms, metric{fmt.Sprintf("updates/s, %d writers", w), true, func(r Result) (float64, bool) {
			p, ok := r.Phase(w)
			return p.UpdatesPerSec, ok
		}})
	}
	return append(ms,
		metric{"list p50 ms", false, func(r Result) (float64, bool) { return r.ListP50ms, r.ListObjects > 0 }},
		metric{"list p99 ms", false, func(r Result) (float64, bool) { return r.ListP99ms, r.ListObjects > 0 }},
		metric{"size on disk MB", false, func(r Result) (float64, bool) { return float64(r.SizeBytes) / 1e6, r.SizeBytes > 0 }},
	)
}

// WriteTable prints the results side by side, one column per result, then
// one ratio column base/peer for every other result. Ratios above 1 mean
// base is ahead for throughput and behind for latency and size; the last
// column of each row says which way is better.
func WriteTable(w io.Writer, base Result, peers ...Result) error {
	all := append([]Result{base}, peers...)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := []string{"metric"}
	for _, r := range all {
		head = append(head, r.Name)
	}
	for _, p := range peers {
		head = append(head, base.Name+"/"+p.Name)
	}
	head = append(head, "better")
	fmt.Fprintln(tw, strings.Join(head, "\t")+"\t")
	for _, m := range metrics(all) {
		row := []string{m.label}
		for _, r := range all {
			v, ok := m.get(r)
			row = append(row, format(v, ok))
		}
		bv, bok := m.get(base)
		for _, p := range peers {
			pv, pok := m.get(p)
			if bok && pok && pv > 0 {
				row = append(row, fmt.Sprintf("%.2f×", bv/pv))
			} else {
				row = append(row, "-")
			}
		}
		if m.higher {
			row = append(row, "higher")
		} else {
			row = append(row, "lower")
		}
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	fmt.Fprintf(tw, "objects per phase: %d, value %d bytes\t\n", base.Objects, base.ValueBytes)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

func format(v float64, ok bool) string {
	switch {
	case !ok:
		return "-"
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// Goal is one target tether's store must meet against a peer.
type Goal struct {
	Name string
	Want float64
	Got  float64
	// Higher says Got must be at least Want; otherwise at most Want.
	Higher bool
}

// Pass reports whether the goal is met.
func (g Goal) Pass() bool {
	if g.Higher {
		return g.Got >= g.Want
	}
	return g.Got <= g.Want
}

func (g Goal) String() string {
	verdict, op := "FAIL", "≤"
	if g.Pass() {
		verdict = "pass"
	}
	if g.Higher {
		op = "≥"
	}
	return fmt.Sprintf("%s  %s: %.2f× (want %s %.2f×)", verdict, g.Name, g.Got, op, g.Want)
}

// Goals returns tether's targets as ratios against etcd and kine with its
// default DSN: at least etcd's creates/s with 1 and 16 writers, at least
// 1.2× etcd and 3× kine with 64 writers, and a list p50 no slower than
// etcd's.
func Goals(tether, etcd, kine Result) []Goal {
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	creates := func(r Result, w int) float64 {
		p, _ := r.Phase(w)
		return p.CreatesPerSec
	}
	var gs []Goal
	for _, w := range []int{1, 16} {
		gs = append(gs, Goal{fmt.Sprintf("creates/s with %d writers vs etcd", w), 1,
			ratio(creates(tether, w), creates(etcd, w)), true})
	}
	return append(gs,
		Goal{"creates/s with 64 writers vs etcd", 1.2, ratio(creates(tether, 64), creates(etcd, 64)), true},
		Goal{"creates/s with 64 writers vs " + kine.Name, 3, ratio(creates(tether, 64), creates(kine, 64)), true},
		Goal{"list p50 vs etcd", 1, ratio(tether.ListP50ms, etcd.ListP50ms), false},
	)
}

// Median returns, metric by metric, the median of several results of the
// same target; the name and shape come from the first.
func Median(rs []Result) Result {
	if len(rs) == 0 {
		return Result{}
	}
	out := rs[0]
	out.Phases = slices.Clone(rs[0].Phases)
	med := func(get func(Result) float64) float64 {
		vs := make([]float64, len(rs))
		for i, r := range rs {
			vs[i] = get(r)
		}
		slices.Sort(vs)
		if len(vs)%2 == 1 {
			return vs[len(vs)/2]
		}
		return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
	}
	for i := range out.Phases {
		w := out.Phases[i].Writers
		out.Phases[i].CreatesPerSec = med(func(r Result) float64 { p, _ := r.Phase(w); return p.CreatesPerSec })
		out.Phases[i].UpdatesPerSec = med(func(r Result) float64 { p, _ := r.Phase(w); return p.UpdatesPerSec })
	}
	out.ListP50ms = med(func(r Result) float64 { return r.ListP50ms })
	out.ListP99ms = med(func(r Result) float64 { return r.ListP99ms })
	out.SizeBytes = int64(med(func(r Result) float64 { return float64(r.SizeBytes) }))
	return out
}

// Figures returns the comparison as benchmark figures (internal/benchfmt),
// tether's value beside etcd's measured in the same run, and kine's for
// the 64-writer creates that have a target against it. The targets are
// Goals'.
func Figures(tether, etcd, kine Result, mode string) []benchfmt.Figure {
	var fs []benchfmt.Figure
	add := func(name string, v, peer float64, peerName, unit, target string) {
		fs = append(fs, benchfmt.Figure{Name: name, Value: v, Unit: unit, Target: target,
			Peer: peerName, PeerValue: peer, Mode: mode,
			Extra: []string{fmt.Sprintf("objects=%d", tether.Objects)}})
	}
	for _, w := range []int{1, 16, 64} {
		tp, ok := tether.Phase(w)
		ep, ok2 := etcd.Phase(w)
		if !ok || !ok2 {
			continue
		}
		target := ">=1"
		if w == 64 {
			target = ">=1.2"
		}
		add(fmt.Sprintf("store_creates_%dw", w), tp.CreatesPerSec, ep.CreatesPerSec, etcd.Name, "creates/s", "ratio"+target)
		add(fmt.Sprintf("store_updates_%dw", w), tp.UpdatesPerSec, ep.UpdatesPerSec, etcd.Name, "updates/s", "")
	}
	if tp, ok := tether.Phase(64); ok {
		if kp, ok := kine.Phase(64); ok {
			add("store_creates_64w_vs_kine", tp.CreatesPerSec, kp.CreatesPerSec, kine.Name, "creates/s", "ratio>=3")
		}
	}
	add("store_list_p50", tether.ListP50ms, etcd.ListP50ms, etcd.Name, "ms", "ratio<=1")
	add("store_list_p99", tether.ListP99ms, etcd.ListP99ms, etcd.Name, "ms", "")
	add("store_size_on_disk", float64(tether.SizeBytes)/1e6, float64(etcd.SizeBytes)/1e6, etcd.Name, "MB", "")
	return fs
}

// PostgresFigures returns the comparison of tether's PostgreSQL backend
// with kine on the same PostgreSQL as benchmark figures, with the targets
// tether's multi-hub store must meet: three times kine's throughput at 64
// writers, half its list p99.
func PostgresFigures(tether, kine Result, mode string) []benchfmt.Figure {
	var fs []benchfmt.Figure
	add := func(name string, v, peer float64, unit, target string) {
		fs = append(fs, benchfmt.Figure{Name: name, Value: v, Unit: unit, Target: target,
			Peer: kine.Name, PeerValue: peer, Mode: mode,
			Extra: []string{fmt.Sprintf("objects=%d", tether.Objects)}})
	}
	for _, w := range []int{1, 16, 64} {
		tp, ok := tether.Phase(w)
		kp, ok2 := kine.Phase(w)
		if !ok || !ok2 {
			continue
		}
		target := ""
		if w == 64 {
			target = "ratio>=3"
		}
		add(fmt.Sprintf("store_pg_creates_%dw", w), tp.CreatesPerSec, kp.CreatesPerSec, "creates/s", target)
		add(fmt.Sprintf("store_pg_updates_%dw", w), tp.UpdatesPerSec, kp.UpdatesPerSec, "updates/s", target)
	}
	add("store_pg_list_p50", tether.ListP50ms, kine.ListP50ms, "ms", "")
	add("store_pg_list_p99", tether.ListP99ms, kine.ListP99ms, "ms", "ratio<=0.5")
	add("store_pg_size_on_disk", float64(tether.SizeBytes)/1e6, float64(kine.SizeBytes)/1e6, "MB", "")
	return fs
}
