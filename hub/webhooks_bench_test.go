package hub_test

import (
	"encoding/base64"
	"flag"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/hubtest"
	"github.com/tether-edge/tether/internal/benchfmt"
)

var webhookBenchFull = flag.Bool("webhookbench.full", false, "TestWebhookOverhead: measure 10 rounds of 300 creates per side instead of 4 of 200")

// TestWebhookOverhead measures what a mutating webhook on loopback adds to
// an admitted request: ConfigMap creates in a namespace the webhook
// selects (it adds a label by JSON patch) against the same creates in a
// namespace it does not, alternating one by one in the same hub and run.
// It reports the difference of the p99 latencies over every request,
// beside the p99 without the webhook; alternating the two sides one by one
// spreads the machine's noise over both. The difference of the medians and
// of the quietest rounds' p99s are printed beside it as context.
func TestWebhookOverhead(t *testing.T) {
	rounds, perRound := 4, 200
	if *webhookBenchFull {
		rounds, perRound = 10, 300
	}
	h := hubtest.Start(t, apiOnly...)
	url, ca := webhookServer(t)
	cs := clientFor(t, h)
	ctx := t.Context()
	mustKubectl(t, h, "create", "namespace", "plain")
	mustKubectl(t, h, "create", "namespace", "hooked")
	mustKubectl(t, h, "label", "namespace", "hooked", "webhooks=on")
	mustKubectlIn(t, h, fmt.Sprintf(`apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: label-configmaps}
webhooks:
  - name: label.tether.test
    clientConfig: {url: "%s/mutate", caBundle: %s}
    rules:
    - operations: ["CREATE"]
      apiGroups: [""]
      apiVersions: ["v1"]
      resources: ["configmaps"]
    namespaceSelector:
      matchLabels: {webhooks: "on"}
    sideEffects: None
    admissionReviewVersions: ["v1"]
`, url, base64.StdEncoding.EncodeToString(ca)), "apply", "-f", "-")

	create := func(ns string, i int) (time.Duration, *corev1.ConfigMap) {
		start := time.Now()
		cm, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i)},
			Data:       map[string]string{"k": "v"},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create configmap in %s: %v", ns, err)
		}
		return time.Since(start), cm
	}
	waitFor(t, "the webhook to apply", func() bool {
		_, cm := create("hooked", -1-int(time.Now().UnixNano()%1e6))
		return cm.Labels["webhook"] == "added"
	})
	for i := range 50 { // warm up both paths
		create("plain", 100000+i)
		create("hooked", 100000+i)
	}
	p99 := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[len(s)*99/100]) / float64(time.Millisecond)
	}
	p50 := func(ds []time.Duration) float64 {
		s := slices.Clone(ds)
		slices.Sort(s)
		return float64(s[len(s)/2]) / float64(time.Millisecond)
	}
	// Rounds: the quietest round's p99s are printed as context, the row
	// is the p99 of every request, as users see it.
	var allPlain, allHooked []time.Duration
	bestPlain, bestHooked := math.Inf(1), math.Inf(1)
	for r := range rounds {
		var plain, hooked []time.Duration
		for i := range perRound {
			id := r*perRound + i
			d, _ := create("plain", id)
			plain = append(plain, d)
			d, cm := create("hooked", id)
			if cm.Labels["webhook"] != "added" {
				t.Fatalf("configmap %s not labelled by the webhook", cm.Name)
			}
			hooked = append(hooked, d)
		}
		bestPlain, bestHooked = min(bestPlain, p99(plain)), min(bestHooked, p99(hooked))
		allPlain, allHooked = append(allPlain, plain...), append(allHooked, hooked...)
	}
	overhead := p99(allHooked) - p99(allPlain)
	t.Logf("create latency, %d rounds of %d requests each side: without webhook p50 %.2f ms, p99 %.2f ms (quietest round %.2f ms); with webhook p50 %.2f ms, p99 %.2f ms (quietest round %.2f ms)",
		rounds, perRound, p50(allPlain), p99(allPlain), bestPlain, p50(allHooked), p99(allHooked), bestHooked)
	benchfmt.Report(t, benchfmt.Figure{Name: "webhook_overhead_p99", Value: overhead, Unit: "ms", Target: "<=5",
		Peer: "no_webhook_p99", PeerValue: p99(allPlain), Mode: benchfmt.Mode(*webhookBenchFull),
		Extra: []string{fmt.Sprintf("requests=%d", rounds*perRound),
			fmt.Sprintf("p50_overhead_ms=%s", benchfmt.FormatValue(p50(allHooked)-p50(allPlain))),
			fmt.Sprintf("quietest_round_p99_overhead_ms=%s", benchfmt.FormatValue(bestHooked-bestPlain))}})
}
