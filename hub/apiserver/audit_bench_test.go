package apiserver

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/hub/audit"
	"github.com/tether-edge/tether/hub/auth"
)

// BenchmarkAuditGet measures what the audit hook adds to a GET served
// in-process: nothing configured, the default Metadata policy, and a
// RequestResponse policy (the response body logged too).
func BenchmarkAuditGet(b *testing.B) {
	for _, mode := range []string{"off", "Metadata", "RequestResponse"} {
		b.Run("audit="+mode, func(b *testing.B) {
			var log *audit.Log
			if mode != "off" {
				dir := b.TempDir()
				o := audit.Options{Path: filepath.Join(dir, "audit.log")}
				if mode == "RequestResponse" {
					o.PolicyFile = filepath.Join(dir, "policy.yaml")
					if err := os.WriteFile(o.PolicyFile, []byte("apiVersion: audit.k8s.io/v1\nkind: Policy\nrules:\n- level: RequestResponse\n  omitStages: [RequestReceived]\n"), 0o600); err != nil {
						b.Fatal(err)
					}
				}
				var err error
				if log, err = audit.New(o); err != nil {
					b.Fatal(err)
				}
				defer log.Close()
			}
			h := newHubWith(b, func(c *Config) { c.Audit = log })
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default"}, Data: map[string]string{"k": "v"}}
			if _, err := h.cs.CoreV1().ConfigMaps("default").Create(context.Background(), cm, metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			handler := h.api.Handler()
			u := &auth.User{Name: "bench", Groups: []string{"system:masters", "system:authenticated"}}
			ctx := context.WithValue(context.Background(), localUserKey{}, u)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := processCPU()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/api/v1/namespaces/default/configmaps/c", nil)
					r.Header.Set("Accept", "application/json")
					w := httptest.NewRecorder()
					handler.ServeHTTP(w, r)
					if w.Code != http.StatusOK {
						b.Fatalf("GET: %d %s", w.Code, w.Body)
					}
				}
			})
			if log != nil {
				// The writer's encoding and writes count too.
				_ = log.Close()
			}
			// The machine may be shared: CPU time per request is steadier
			// than the rate.
			b.ReportMetric(float64((processCPU()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
		})
	}
}
