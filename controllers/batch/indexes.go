package batch

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// indexSet is a set of completion indexes, written in the API as sorted
// intervals: "0,2-4,7".
type indexSet map[int]bool

// parseIndexes reads an interval list; malformed parts and indexes at or
// beyond limit (when limit > 0) are skipped.
func parseIndexes(s string, limit int) indexSet {
	out := indexSet{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			continue
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				continue
			}
		}
		for i := a; i <= b; i++ {
			if limit > 0 && i >= limit {
				break
			}
			out[i] = true
		}
	}
	return out
}

// String writes the set as an interval list.
func (s indexSet) String() string {
	idx := make([]int, 0, len(s))
	for i := range s {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	var b strings.Builder
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && idx[j+1] == idx[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j == i {
			fmt.Fprintf(&b, "%d", idx[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", idx[i], idx[j])
		}
		i = j + 1
	}
	return b.String()
}

// ptrString returns nil for an empty set, so the field is omitted.
func (s indexSet) ptrString() *string {
	if len(s) == 0 {
		return nil
	}
	v := s.String()
	return &v
}
