package hub_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/hub/hubtest"
)

// TestWatchTimeouts checks which deadline ends a watch, as with
// kube-apiserver: timeoutSeconds ends it on the server's side, while the
// `timeout` parameter client-go adds for its own request timeout bounds
// only short requests, so a watch carrying it ends by the client's own
// deadline.
func TestWatchTimeouts(t *testing.T) {
	h := hubtest.Start(t, apiOnly...)
	h.MustRun("create", "configmap", "c")
	// A client without a request timeout of its own, which client-go
	// would send as the timeout parameter of every request.
	cfg, err := clientcmd.BuildConfigFromFlags("", h.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rc := cs.CoreV1().RESTClient()
	ctx := context.Background()
	const watchPath = "/api/v1/namespaces/default/configmaps"

	// stream opens a watch with the query parameters and returns how long
	// the hub kept it open, at most limit.
	stream := func(t *testing.T, limit time.Duration, params ...string) (time.Duration, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		req := rc.Get().AbsPath(watchPath).Param("watch", "1")
		for i := 0; i+1 < len(params); i += 2 {
			req = req.Param(params[i], params[i+1])
		}
		start := time.Now()
		body, err := req.Stream(ctx)
		if err != nil {
			return 0, err
		}
		defer body.Close()
		_, err = io.Copy(io.Discard, body)
		return time.Since(start), err
	}

	t.Run("kubectl get -w --request-timeout", func(t *testing.T) {
		// Pinned kubectl sends timeout=1s and sets its HTTP client's
		// timeout to 1s. The hub leaves the watch open; the client's
		// deadline ends it, and `kubectl get -w` ends without an error
		// once its watch closes, as against kube-apiserver.
		start := time.Now()
		cmd := exec.Command(h.Kubectl, "--cache-dir", h.CacheDir, "get", "configmaps", "-w", "--request-timeout=1", "-v=5")
		cmd.Env = append(os.Environ(), "KUBECONFIG="+h.Kubeconfig)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		took := time.Since(start)
		if err != nil || !strings.Contains(out.String(), "c      0") {
			t.Fatalf("kubectl get -w --request-timeout=1: %v\nstdout: %s\nstderr: %s", err, out.String(), errb.String())
		}
		// A stream the server ends is a clean EOF, which client-go does
		// not log; the client's deadline is an error reading the body.
		stderr := errb.String()
		if !strings.Contains(stderr, `"Unable to decode an event from the watch stream"`) ||
			!strings.Contains(stderr, "request canceled (Client.Timeout or context cancellation while reading body)") &&
				!strings.Contains(stderr, "context deadline exceeded") {
			t.Errorf("the watch did not end by kubectl's own deadline; stderr:\n%s", stderr)
		}
		if took > 15*time.Second {
			t.Errorf("kubectl get -w --request-timeout=1 took %v", took)
		}
	})
	t.Run("timeout does not end a watch", func(t *testing.T) {
		took, err := stream(t, 2500*time.Millisecond, "timeout", "1s")
		if !errors.Is(err, context.DeadlineExceeded) || took < 2*time.Second {
			t.Errorf("a watch with timeout=1s ended after %v (%v), want it open until the client gives up", took, err)
		}
	})
	t.Run("timeoutSeconds ends a watch cleanly", func(t *testing.T) {
		took, err := stream(t, 20*time.Second, "timeoutSeconds", "1")
		if err != nil || took < 900*time.Millisecond || took > 5*time.Second {
			t.Errorf("a watch with timeoutSeconds=1 ended after %v (%v), want a clean end after 1s", took, err)
		}
	})
	t.Run("a watch ignores a malformed timeout", func(t *testing.T) {
		took, err := stream(t, 20*time.Second, "timeout", "soon", "timeoutSeconds", "1")
		if err != nil || took > 5*time.Second {
			t.Errorf("a watch with timeout=soon: %v after %v", err, took)
		}
	})
	t.Run("a list's timeout", func(t *testing.T) {
		if _, err := rc.Get().AbsPath(watchPath).Param("timeout", "2s").DoRaw(ctx); err != nil {
			t.Errorf("a list with timeout=2s: %v", err)
		}
		err := rc.Get().AbsPath(watchPath).Param("timeout", "soon").Do(ctx).Error()
		if !apierrors.IsBadRequest(err) || err.Error() != `invalid timeout specified in the request URL - time: invalid duration "soon"` {
			t.Errorf("a list with timeout=soon: %v", err)
		}
	})
}
