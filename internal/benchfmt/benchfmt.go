// Package benchfmt writes and reads the figures tether's benchmarks report,
// one line each on the test's standard output:
//
//	BENCH name=NAME value=V unit=U [target=T met=yes|no|n/a] [peer=P peer_value=V] [mode=short|full] [key=value...]
//
// NAME is a stable identifier of the metric (lower case, underscores). A
// target is "<=N" or ">=N" on the value, or "ratio<=N" / "ratio>=N" on
// value / peer_value. The peer is what the benchmark measured side by side
// in the same run (etcd, TCP+TLS with cubic, iptables, ...), named without
// spaces. scripts/bench-report turns a `go test -v` output holding such
// lines into the table at the top of docs/benchmarks.md.
package benchfmt

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Prefix starts every figure's line.
const Prefix = "BENCH "

// Figure is one measured figure.
type Figure struct {
	Name  string
	Value float64
	Unit  string
	// Target is "", "<=N", ">=N", "ratio<=N" or "ratio>=N".
	Target string
	// Peer names what was measured beside tether in the same run; empty
	// when the benchmark has no peer.
	Peer      string
	PeerValue float64
	// Mode is "short" (the CI run) or "full".
	Mode string
	// Test is the top-level test or benchmark that measured the figure;
	// Report fills it in.
	Test string
	// Unjudged says the value cannot be judged against the target (a
	// lower bound, say): Met reports "n/a".
	Unjudged bool
	// Extra holds further key=value fields, in order.
	Extra []string
}

// Ratio returns Value / PeerValue, and false without a peer or with a
// zero peer value.
func (f Figure) Ratio() (float64, bool) {
	if f.Peer == "" || f.PeerValue == 0 {
		return 0, false
	}
	return f.Value / f.PeerValue, true
}

// Met says whether the figure meets its target: "yes", "no", or "n/a"
// without a target or a value to compare.
func (f Figure) Met() string {
	if f.Target == "" || f.Unjudged {
		return "n/a"
	}
	got, t := f.Value, f.Target
	if rest, ok := strings.CutPrefix(t, "ratio"); ok {
		r, ok := f.Ratio()
		if !ok {
			return "n/a"
		}
		got, t = r, rest
	}
	var ok bool
	switch {
	case strings.HasPrefix(t, "<="):
		limit, err := strconv.ParseFloat(t[2:], 64)
		if err != nil {
			return "n/a"
		}
		ok = got <= limit
	case strings.HasPrefix(t, ">="):
		limit, err := strconv.ParseFloat(t[2:], 64)
		if err != nil {
			return "n/a"
		}
		ok = got >= limit
	default:
		return "n/a"
	}
	if ok {
		return "yes"
	}
	return "no"
}

// String formats the figure as its BENCH line, without a newline.
func (f Figure) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%sname=%s value=%s unit=%s", Prefix, f.Name, FormatValue(f.Value), f.Unit)
	if f.Target != "" {
		fmt.Fprintf(&b, " target=%s met=%s", f.Target, f.Met())
	}
	if f.Peer != "" {
		fmt.Fprintf(&b, " peer=%s peer_value=%s", f.Peer, FormatValue(f.PeerValue))
	}
	if f.Mode != "" {
		fmt.Fprintf(&b, " mode=%s", f.Mode)
	}
	if f.Test != "" {
		fmt.Fprintf(&b, " test=%s", f.Test)
	}
	for _, e := range f.Extra {
		b.WriteString(" " + e)
	}
	return b.String()
}

// Fprint writes the figure's BENCH line to w.
func Fprint(w io.Writer, f Figure) {
	fmt.Fprintln(w, f.String())
}

// Print writes the figure's BENCH line to standard output, where `go test
// -v` passes it through unchanged.
func Print(f Figure) {
	Fprint(os.Stdout, f)
}

// Report prints the figure's BENCH line to standard output with the name
// of the top-level test or benchmark t belongs to (a *testing.T or
// *testing.B), so that figures of parallel tests are told apart.
func Report(t interface{ Name() string }, f Figure) {
	f.Test, _, _ = strings.Cut(t.Name(), "/")
	Print(f)
}

// Mode returns "full" when full is set, else "short".
func Mode(full bool) string {
	if full {
		return "full"
	}
	return "short"
}

// FormatValue prints a value with three decimals at most and no trailing
// zeros.
func FormatValue(v float64) string {
	s := strconv.FormatFloat(v, 'f', 3, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// Parse reads a BENCH line; the line may carry a prefix before "BENCH "
// (a test log's file and line). It reports false for any other line or a
// BENCH line without a name or a numeric value. A key given twice takes
// its last value.
func Parse(line string) (Figure, bool) {
	i := strings.Index(line, Prefix+"name=")
	if i < 0 {
		return Figure{}, false
	}
	var f Figure
	var haveValue bool
	for _, field := range strings.Fields(line[i+len(Prefix):]) {
		k, v, ok := strings.Cut(field, "=")
		if !ok {
			continue
		}
		switch k {
		case "name":
			f.Name = v
		case "value":
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return Figure{}, false
			}
			f.Value, haveValue = x, true
		case "unit":
			f.Unit = v
		case "target":
			f.Target = v
		case "met":
			// Derived from the value and the target, unless the
			// benchmark said it cannot be judged.
			f.Unjudged = v == "n/a"
		case "peer":
			f.Peer = v
		case "peer_value":
			x, err := strconv.ParseFloat(v, 64)
			if err == nil {
				f.PeerValue = x
			}
		case "mode":
			f.Mode = v
		case "test":
			f.Test = v
		default:
			f.Extra = append(f.Extra, field)
		}
	}
	if f.Name == "" || !haveValue {
		return Figure{}, false
	}
	return f, true
}
