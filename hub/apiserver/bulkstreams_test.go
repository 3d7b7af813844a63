package apiserver

import (
	"context"
	"net/url"
	"testing"

	"github.com/tether-edge/tether/tunnel"
)

func TestBulkStreamRule(t *testing.T) {
	for _, c := range []struct {
		sub   string
		query string
		bulk  bool
	}{
		{"portforward", "ports=8080", true},
		{"exec", "command=tar&command=cf&command=-&command=/tmp/x&stdout=true", true}, // kubectl cp from a pod
		{"exec", "command=tar&command=xmf&command=-&command=-C&command=/tmp&stdin=true", true},
		{"exec", "command=tar&command=cf&command=-&tty=true&stdin=true", false},
		{"exec", "command=sh&stdin=true&tty=true", false},
		{"attach", "stdin=true", false},
		{"log", "follow=true", false},
	} {
		q, _ := url.ParseQuery(c.query)
		if got := tunnel.IsBulk(bulkStream(context.Background(), c.sub, q)); got != c.bulk {
			t.Errorf("%s?%s: bulk %v, want %v", c.sub, c.query, got, c.bulk)
		}
	}
}
