package edge

import (
	"slices"
	"testing"

	"github.com/tether-edge/tether/internal/sitedigest"
)

func TestSteadyView(t *testing.T) {
	m := func(n string, s sitedigest.State, inc uint32) sitedigest.Member {
		return sitedigest.Member{Node: n, State: s, Incarnation: inc}
	}
	last := sitedigest.Digest{Site: "s", Members: []sitedigest.Member{m("a", sitedigest.Alive, 1), m("b", sitedigest.Alive, 2), m("c", sitedigest.Alive, 1)}}
	cur := sitedigest.Digest{Site: "s", Members: []sitedigest.Member{
		m("a", sitedigest.Suspect, 1), // suspected: not news to the hub
		m("b", sitedigest.Alive, 4),   // refuted a suspicion: not news either
		m("c", sitedigest.Dead, 1),    // news
		m("d", sitedigest.Alive, 1),   // a new member: news
	}}
	got := steadyView(last, cur)
	want := []sitedigest.Member{m("a", sitedigest.Alive, 1), m("b", sitedigest.Alive, 2), m("c", sitedigest.Dead, 1), m("d", sitedigest.Alive, 1)}
	if !slices.Equal(got.Members, want) {
		t.Fatalf("steady view %+v, want %+v", got.Members, want)
	}
	// Back from the dead at a higher incarnation: reported as it is.
	back := sitedigest.Digest{Site: "s", Members: []sitedigest.Member{m("c", sitedigest.Alive, 3)}}
	if got := steadyView(got, back); !slices.Equal(got.Members, back.Members) {
		t.Fatalf("steady view %+v, want %+v", got.Members, back.Members)
	}
	// A sender's first report leaves suspect members out: the hub keeps
	// what it knew of them rather than hold them suspect.
	fresh := steadyView(sitedigest.Digest{}, sitedigest.Digest{Site: "s", Members: []sitedigest.Member{m("a", sitedigest.Suspect, 1), m("b", sitedigest.Alive, 2)}})
	if want := []sitedigest.Member{m("b", sitedigest.Alive, 2)}; !slices.Equal(fresh.Members, want) {
		t.Fatalf("first report %+v, want %+v", fresh.Members, want)
	}
	// Another site's report is no reference.
	other := steadyView(sitedigest.Digest{Site: "t", Members: []sitedigest.Member{m("a", sitedigest.Alive, 1)}},
		sitedigest.Digest{Site: "s", Members: []sitedigest.Member{m("a", sitedigest.Suspect, 1)}})
	if other.Site != "s" || len(other.Members) != 0 {
		t.Fatalf("report after a change of site %+v, want site s and no member", other)
	}
	// Nothing but flapping since the last report: the same bytes.
	again := steadyView(last, sitedigest.Digest{Site: "s", Members: []sitedigest.Member{m("a", sitedigest.Alive, 5), m("b", sitedigest.Suspect, 2), m("c", sitedigest.Alive, 3)}})
	if !again.Equal(last) {
		t.Fatalf("flapping reported: %+v", again.Members)
	}
}
