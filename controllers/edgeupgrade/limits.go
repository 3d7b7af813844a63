package edgeupgrade

import (
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/intstr"
)

// limits are how many nodes a rollout may have upgrading at once and how
// many of its nodes may be unavailable (not Ready or upgrading) before
// another starts.
type limits struct {
	batch, maxUnavailable int
}

// limitsFor resolves batchSize and maxUnavailable against the number of
// selected nodes: batchSize rounds a percentage up and defaults to 1;
// maxUnavailable rounds it down and defaults to the batch size; both are
// at least 1. A malformed value (the definition's validation keeps them
// out) counts as its default.
func limitsFor(batchSize, maxUnavailable *intstr.IntOrString, nodes int) limits {
	b := scaled(batchSize, nodes, true, 1)
	return limits{batch: b, maxUnavailable: scaled(maxUnavailable, nodes, false, b)}
}

// scaled is v as a number of nodes out of total, at least 1; def when v
// is absent or malformed.
func scaled(v *intstr.IntOrString, total int, roundUp bool, def int) int {
	if v == nil {
		return max(def, 1)
	}
	n := def
	switch v.Type {
	case intstr.Int:
		n = int(v.IntVal)
	case intstr.String:
		p, err := strconv.Atoi(strings.TrimSuffix(v.StrVal, "%"))
		if err != nil || !strings.HasSuffix(v.StrVal, "%") {
			break
		}
		n = p * total / 100
		if roundUp && p*total%100 != 0 {
			n++
		}
	}
	return max(n, 1)
}
