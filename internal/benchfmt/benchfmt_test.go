package benchfmt

import (
	"reflect"
	"testing"
)

func TestFigureRoundTrip(t *testing.T) {
	f := Figure{Name: "tunnel_goodput_loss_1pct", Value: 13.49, Unit: "Mbit/s", Target: "ratio>=1.5",
		Peer: "tcp_tls_cubic", PeerValue: 2.21, Mode: "full", Test: "TestGoodputUnderLoss", Extra: []string{"rtt_ms=50"}}
	line := f.String()
	want := "BENCH name=tunnel_goodput_loss_1pct value=13.49 unit=Mbit/s target=ratio>=1.5 met=yes peer=tcp_tls_cubic peer_value=2.21 mode=full test=TestGoodputUnderLoss rtt_ms=50"
	if line != want {
		t.Errorf("String() = %q, want %q", line, want)
	}
	got, ok := Parse("    bench_test.go:12: " + line)
	if !ok || !reflect.DeepEqual(got, f) {
		t.Errorf("Parse(String()) = %+v, %v; want %+v", got, ok, f)
	}
}

func TestMet(t *testing.T) {
	for _, tc := range []struct {
		f    Figure
		want string
	}{
		{Figure{Value: 19, Target: "<=19.07"}, "yes"},
		{Figure{Value: 32.4, Target: "<=19.07"}, "no"},
		{Figure{Value: 2100, Target: ">=2000"}, "yes"},
		{Figure{Value: 3, Target: "ratio>=1.5", Peer: "p", PeerValue: 2}, "yes"},
		{Figure{Value: 3, Target: "ratio<=1", Peer: "p", PeerValue: 2}, "no"},
		{Figure{Value: 3, Target: "ratio<=1"}, "n/a"},
		{Figure{Value: 13.5, Target: "<=28.61", Unjudged: true}, "n/a"},
		{Figure{Value: 1}, "n/a"},
	} {
		if got := tc.f.Met(); got != tc.want {
			t.Errorf("%+v: Met() = %s, want %s", tc.f, got, tc.want)
		}
	}
}

func TestParseRejects(t *testing.T) {
	for _, line := range []string{
		"=== RUN   TestX",
		"BENCH value=1 unit=x",
		"BENCH name=a value=many unit=x",
		"BENCH name=a unit=x",
	} {
		if f, ok := Parse(line); ok {
			t.Errorf("Parse(%q) = %+v, want no figure", line, f)
		}
	}
	// The footprint benchmark's lower bounds say met=n/a themselves.
	f, ok := Parse("BENCH name=w value=13.5 unit=MiB pods=20 target=<=28.61 met=n/a lower_bound=no_gc")
	if !ok || f.Met() != "n/a" || f.Target != "<=28.61" || !reflect.DeepEqual(f.Extra, []string{"pods=20", "lower_bound=no_gc"}) {
		t.Errorf("Parse = %+v (met %s), %v", f, f.Met(), ok)
	}
}
