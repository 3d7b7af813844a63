package testbench

import (
	"context"
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// TestCutNodeUplink cuts one node off from the hub while its LAN stays
// up: the node reaches its site peer but not the hub, a connection it had
// open to the hub stops passing data, the peer still reaches the hub, and
// restoring undoes all of it.
func TestCutNodeUplink(t *testing.T) {
	l := newLab(t, Spec{Sites: []SiteSpec{{Name: "shop", Nodes: 2}}})
	ctx := context.Background()
	hubLn, _ := listenIn(t, l, "hub", "tcp", l.Hub().Addr+":7000")
	peerLn, _ := listenIn(t, l, "shop-n2", "tcp", l.Host("shop-n2").Addr+":7001")
	for _, ln := range []net.Listener{hubLn, peerLn} {
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() { io.Copy(c, c); c.Close() }()
			}
		}()
	}
	echo := func(c net.Conn) error {
		c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		_, err := io.ReadFull(c, make([]byte, 4))
		return err
	}
	reach := func(from, addr string) error {
		c, err := dialIn(l, from, "tcp", addr, time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		return echo(c)
	}
	hubAddr, peerAddr := l.Hub().Addr+":7000", l.Host("shop-n2").Addr+":7001"
	open, err := dialIn(l, "shop-n1", "tcp", hubAddr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if err := echo(open); err != nil {
		t.Fatalf("echo through the hub before the cut: %v", err)
	}

	if err := l.CutNodeUplink(ctx, "shop-n1"); err != nil {
		t.Fatal(err)
	}
	if cut, err := l.NodeUplinkCut(ctx, "shop-n1"); err != nil || !cut {
		t.Fatalf("NodeUplinkCut(shop-n1) = %v, %v after the cut", cut, err)
	}
	if cut, _ := l.NodeUplinkCut(ctx, "shop-n2"); cut {
		t.Fatal("NodeUplinkCut(shop-n2) = true; only shop-n1 was cut")
	}
	if err := echo(open); err == nil {
		t.Error("a connection shop-n1 had open to the hub still passes data after the cut")
	}
	if err := reach("shop-n1", hubAddr); err == nil {
		t.Error("shop-n1 reaches the hub with its uplink cut")
	}
	if err := reach("shop-n1", peerAddr); err != nil {
		t.Errorf("shop-n1 does not reach its site peer with only its uplink cut: %v", err)
	}
	if err := reach("shop-n2", hubAddr); err != nil {
		t.Errorf("shop-n2 does not reach the hub while only shop-n1 is cut: %v", err)
	}

	if err := l.RestoreNodeUplink(ctx, "shop-n1"); err != nil {
		t.Fatal(err)
	}
	if err := l.RestoreNodeUplink(ctx, "shop-n1"); err != nil {
		t.Errorf("restoring twice: %v", err)
	}
	if cut, err := l.NodeUplinkCut(ctx, "shop-n1"); err != nil || cut {
		t.Fatalf("NodeUplinkCut(shop-n1) = %v, %v after restoring", cut, err)
	}
	if err := reach("shop-n1", hubAddr); err != nil {
		t.Errorf("shop-n1 does not reach the hub after restoring: %v", err)
	}
}

// TestPowerOff kills every process of a node at once, forked children
// included, and nothing of another node; the node's agent starts again.
func TestPowerOff(t *testing.T) {
	l := newLab(t, Spec{Sites: []SiteSpec{{Name: "shop", Nodes: 2}}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// An "agent" with two "pods" it forked.
	agent, err := l.Start("shop-n1", "agent", "sh", "-c", "sleep 1000 & sleep 1000 & wait")
	if err != nil {
		t.Fatal(err)
	}
	other, err := l.Start("shop-n2", "other", "sleep", "1000")
	if err != nil {
		t.Fatal(err)
	}
	var before []int
	for deadline := time.Now().Add(5 * time.Second); len(before) < 3; {
		if before, err = pidsInNetns(nsPath(l.Host("shop-n1").Netns)); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("want the agent and two children in shop-n1, found %v", before)
		}
		time.Sleep(20 * time.Millisecond)
	}
	killed, err := l.PowerOff(ctx, "shop-n1")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range before {
		if !slices.Contains(killed, p) {
			t.Errorf("pid %d of shop-n1 not among the killed %v", p, killed)
		}
	}
	if left, _ := pidsInNetns(nsPath(l.Host("shop-n1").Netns)); len(left) != 0 {
		t.Errorf("processes left in shop-n1 after power off: %v", left)
	}
	if err := agent.Wait(); err == nil {
		t.Error("the agent exited cleanly; want killed")
	}
	if !alive(other.PID(), procStart(other.PID())) {
		t.Error("powering off shop-n1 killed a process of shop-n2")
	}
	if _, err := l.PowerOff(ctx, "shop-n1"); err != nil {
		t.Errorf("powering off a node that is off: %v", err)
	}
	if err := agent.Restart(); err != nil {
		t.Fatal(err)
	}
	if !alive(agent.PID(), procStart(agent.PID())) {
		t.Error("the agent did not start again after power off")
	}
	// Close kills only the processes the lab started, and waits for
	// their output to end: the children holding it go first.
	if _, err := l.PowerOff(ctx, "shop-n1"); err != nil {
		t.Error(err)
	}
}
