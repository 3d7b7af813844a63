package tunnel

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"
)

// TestPushInOrderOnItsConnection: pushes reach OnPush in order with the
// session of their node; a push for a connection that ended is refused
// without being sent, and the new connection has a new number.
func TestPushInOrderOnItsConnection(t *testing.T) {
	transports(t, func(t *testing.T, tcp bool) {
		p := newPKI(t)
		key := new([32]byte)
		var a1, b1 reports
		a := startHub(t, p, ServerConfig{StatelessResetKey: key, OnPush: a1.add}, 0, nil)
		port := a.port()
		c := startClient(t, p, a.addr, "n1", func(c *ClientConfig) { c.ForceTCP = tcp })
		if err := c.Push(0, []byte("early")); !errors.Is(err, ErrConnChanged) {
			t.Fatalf("push on connection 0: %v, want ErrConnChanged", err)
		}
		waitConnected(t, c, 5*time.Second)
		first := c.Conn()
		if first == 0 {
			t.Fatal("Conn is 0 while connected")
		}
		buf := []byte("p-00")
		for i := range 20 {
			copy(buf, fmt.Sprintf("p-%02d", i))
			if err := c.Push(first, buf); err != nil {
				t.Fatalf("push %d: %v", i, err)
			}
		}
		waitFor(t, 3*time.Second, "20 pushes", func() bool { return len(a1.all()) == 20 })
		for i, got := range a1.all() {
			if want := fmt.Sprintf("n1=p-%02d", i); got != want {
				t.Fatalf("push %d arrived as %q, want %q", i, got, want)
			}
		}
		if st := c.Stats(); st.Pushes != 20 {
			t.Fatalf("stats count %d pushes, want 20", st.Pushes)
		}

		a.stop()
		waitFor(t, 3*time.Second, "disconnect noticed", func() bool { return !c.Connected() })
		startHub(t, p, ServerConfig{StatelessResetKey: key, OnPush: b1.add}, port, nil)
		waitFor(t, 10*time.Second, "reconnect", func() bool { return c.Connected() })
		if err := c.Push(first, []byte("stale")); !errors.Is(err, ErrConnChanged) {
			t.Fatalf("push on the old connection: %v, want ErrConnChanged", err)
		}
		second := c.Conn()
		if second == first {
			t.Fatalf("connection number %d did not change", second)
		}
		if err := c.Push(second, []byte("fresh")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 3*time.Second, "push on the new connection", func() bool { return b1.last() == "n1=fresh" })
		if all := b1.all(); len(all) != 1 {
			t.Fatalf("new hub got %q: pushes are never resent", all)
		}
	})
}

// TestPushTooLarge: a payload over MaxPush is refused; MaxPush fits.
func TestPushTooLarge(t *testing.T) {
	p := newPKI(t)
	var got reports
	h := startHub(t, p, ServerConfig{OnPush: got.add}, 0, nil)
	c := startClient(t, p, h.addr, "n1", nil)
	waitConnected(t, c, 5*time.Second)
	if err := c.Push(c.Conn(), make([]byte, MaxPush+1)); err == nil {
		t.Fatal("push over MaxPush was taken")
	}
	full := bytes.Repeat([]byte{'x'}, MaxPush)
	if err := c.Push(c.Conn(), full); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "full-size push", func() bool { return len(got.last()) == len("n1=")+MaxPush })
	if !c.Connected() || c.Stats().Connects != 1 {
		t.Fatal("the session did not survive")
	}
}
