package apiserver

import (
	"context"
	"net/url"

	"github.com/tether-edge/tether/tunnel"
)

// bulkStream marks the context of a pod stream that moves data in bulk,
// so that the node's tunnel carries it on its BBR lane rather than among
// the interactive streams: port-forward always (it carries whatever the
// user pipes through it), and an exec of tar without a terminal, which is
// how kubectl cp copies files. Any other exec, attach and logs stay on
// the tunnel's QUIC streams, where a keystroke or a log line never waits
// behind a transfer.
func bulkStream(ctx context.Context, subresource string, q url.Values) context.Context {
	bulk := subresource == "portforward"
	if subresource == "exec" {
		cmd := q["command"]
		tty := q.Get("tty")
		bulk = len(cmd) > 0 && cmd[0] == "tar" && tty != "true" && tty != "1"
	}
	if bulk {
		return tunnel.WithBulk(ctx)
	}
	return ctx
}
