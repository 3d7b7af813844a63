// Package sitedigest is the compact account of a site's gossip membership
// that edge agents send the hub: which nodes of the site their peers see
// alive, suspect or dead, and at which incarnation.
//
// A digest goes over a thin uplink only when it changes, so it is a small
// binary encoding of its own (version byte, then uvarint-prefixed strings
// and numbers) rather than JSON or protobuf: a site of twenty nodes fits in
// a few hundred bytes. Decoding validates everything, since the bytes come
// from an edge: a bad digest is an error, never a partial view.
package sitedigest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// State is what a node's site peers conclude about it.
type State uint8

// The states, ordered so that at one incarnation a greater state overrides
// a lesser one, as in the gossip protocol itself. The numbers are part of
// the wire format.
const (
	Alive   State = 1
	Suspect State = 2
	Dead    State = 3
	// Left: the node said goodbye (its agent stopped cleanly).
	Left State = 4
)

func (s State) String() string {
	switch s {
	case Alive:
		return "Alive"
	case Suspect:
		return "Suspect"
	case Dead:
		return "Dead"
	case Left:
		return "Left"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Member is one node as the site sees it.
type Member struct {
	Node        string
	State       State
	Incarnation uint32
}

// Digest is a site's view of its members.
type Digest struct {
	// Site is the value of the members' topology.kubernetes.io/zone label.
	Site string
	// Members are sorted by Node, each node once.
	Members []Member
}

// MaxMembers bounds the members of one digest.
const MaxMembers = 1000

const version = 1

// Normalize sorts the members by node and keeps, for a node listed twice,
// the entry that overrides the other (see Newer).
func (d *Digest) Normalize() {
	slices.SortFunc(d.Members, func(a, b Member) int { return strings.Compare(a.Node, b.Node) })
	out := d.Members[:0]
	for _, m := range d.Members {
		if n := len(out); n > 0 && out[n-1].Node == m.Node {
			if Newer(m, out[n-1]) {
				out[n-1] = m
			}
			continue
		}
		out = append(out, m)
	}
	d.Members = out
}

// Newer reports whether a overrides b for the same node: a higher
// incarnation wins; at the same incarnation the graver state wins.
func Newer(a, b Member) bool {
	if a.Incarnation != b.Incarnation {
		return a.Incarnation > b.Incarnation
	}
	return a.State > b.State
}

// Equal reports whether two digests say the same thing.
func (d Digest) Equal(o Digest) bool {
	return d.Site == o.Site && slices.Equal(d.Members, o.Members)
}

// Marshal encodes a normalized digest.
func (d Digest) Marshal() ([]byte, error) {
	if err := d.validate(); err != nil {
		return nil, err
	}
	b := make([]byte, 0, 8+len(d.Site)+len(d.Members)*24)
	b = append(b, version)
	b = appendString(b, d.Site)
	b = binary.AppendUvarint(b, uint64(len(d.Members)))
	for _, m := range d.Members {
		b = appendString(b, m.Node)
		b = append(b, byte(m.State))
		b = binary.AppendUvarint(b, uint64(m.Incarnation))
	}
	return b, nil
}

// Unmarshal decodes and validates a digest.
func Unmarshal(b []byte) (Digest, error) {
	r := bytes.NewReader(b)
	v, err := r.ReadByte()
	if err != nil {
		return Digest{}, errors.New("decode site digest: empty")
	}
	if v != version {
		return Digest{}, fmt.Errorf("decode site digest: version %d, want %d", v, version)
	}
	var d Digest
	if d.Site, err = readString(r); err != nil {
		return Digest{}, fmt.Errorf("decode site digest: site: %w", err)
	}
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return Digest{}, fmt.Errorf("decode site digest: member count: %w", err)
	}
	if n > MaxMembers {
		return Digest{}, fmt.Errorf("decode site digest: %d members, at most %d", n, MaxMembers)
	}
	d.Members = make([]Member, 0, n)
	for i := uint64(0); i < n; i++ {
		var m Member
		if m.Node, err = readString(r); err != nil {
			return Digest{}, fmt.Errorf("decode site digest: member %d: %w", i, err)
		}
		s, err := r.ReadByte()
		if err != nil {
			return Digest{}, fmt.Errorf("decode site digest: member %d: state: %w", i, err)
		}
		m.State = State(s)
		inc, err := binary.ReadUvarint(r)
		if err != nil || inc > 1<<32-1 {
			return Digest{}, fmt.Errorf("decode site digest: member %d: bad incarnation", i)
		}
		m.Incarnation = uint32(inc)
		d.Members = append(d.Members, m)
	}
	if r.Len() != 0 {
		return Digest{}, fmt.Errorf("decode site digest: %d trailing bytes", r.Len())
	}
	if err := d.validate(); err != nil {
		return Digest{}, err
	}
	return d, nil
}

// validate checks names, states and order.
func (d Digest) validate() error {
	if errs := validation.IsValidLabelValue(d.Site); d.Site == "" || len(errs) > 0 {
		return fmt.Errorf("site digest: site %q is not a label value: %s", d.Site, strings.Join(errs, "; "))
	}
	if len(d.Members) > MaxMembers {
		return fmt.Errorf("site digest: %d members, at most %d", len(d.Members), MaxMembers)
	}
	for i, m := range d.Members {
		if errs := validation.IsDNS1123Subdomain(m.Node); len(errs) > 0 {
			return fmt.Errorf("site digest: member %q: %s", m.Node, strings.Join(errs, "; "))
		}
		if m.State < Alive || m.State > Left {
			return fmt.Errorf("site digest: member %s: unknown state %d", m.Node, m.State)
		}
		if i > 0 && d.Members[i-1].Node >= m.Node {
			return fmt.Errorf("site digest: members not sorted or repeated at %s", m.Node)
		}
	}
	return nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func readString(r *bytes.Reader) (string, error) {
	n, err := binary.ReadUvarint(r)
	if err != nil {
		return "", err
	}
	if n > 253 || int(n) > r.Len() {
		return "", fmt.Errorf("string of %d bytes", n)
	}
	b := make([]byte, n)
	if _, err := r.Read(b); err != nil {
		return "", err
	}
	return string(b), nil
}

// KeySecretNamespace holds the sites' gossip key Secrets.
const KeySecretNamespace = "kube-system"

// KeySecretType is the type of a site's gossip key Secret.
const KeySecretType = "tether.io/site-gossip-keys"

// KeySecretKey is the Secret's data key: the site's gossip keys, 32 bytes
// each, concatenated, the one to encrypt with first.
const KeySecretKey = "keys"

// KeySecretName returns the name of the Secret holding site's gossip keys.
// A site is a label value (upper case, '_' and '.' allowed), a Secret name
// is a lower-case DNS subdomain, so the name carries a hash of the exact
// site besides its readable form.
func KeySecretName(site string) string {
	h := fnv.New32a()
	h.Write([]byte(site))
	clean := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r + ('a' - 'A')
		}
		return '-'
	}, site)
	return fmt.Sprintf("tether-site-gossip-%s-%08x", strings.Trim(clean, "-"), h.Sum32())
}
