package imageshare

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strings"
)

// Rank orders members for the blob of digest by rendezvous hashing: each
// member's score is a hash of the member and the digest, highest first
// (ties by name). The first is the blob's owner. Members joining or
// leaving move only the blobs they rank first for.
func Rank(digest string, members []string) []string {
	type scored struct {
		name  string
		score uint64
	}
	s := make([]scored, 0, len(members))
	for _, m := range members {
		h := sha256.Sum256([]byte(m + "\x00" + digest))
		s = append(s, scored{m, binary.BigEndian.Uint64(h[:8])})
	}
	slices.SortFunc(s, func(a, b scored) int {
		if a.score != b.score {
			if a.score > b.score {
				return -1
			}
			return 1
		}
		return strings.Compare(a.name, b.name)
	})
	out := make([]string, len(s))
	for i, x := range s {
		out[i] = x.name
	}
	return out
}
