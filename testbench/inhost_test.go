package testbench

import (
	"net"
	"sync"
	"testing"
	"time"
)

// TestProcessesSurviveInHost: lab processes die with the OS thread that
// started them (their parent-death signal is per thread), so InHost must
// never end a thread. Many InHost calls from many goroutines, as a test's
// parallel dials make, leave a process started before them running.
func TestProcessesSurviveInHost(t *testing.T) {
	l := newLab(t, Spec{Sites: []SiteSpec{{Name: "shop", Nodes: 1}}})
	ln, _ := listenIn(t, l, "hub", "tcp", l.Hub().Addr+":7000")
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	var procs []*Process
	for i := 0; i < 8; i++ {
		p, err := l.Start("shop-n1", "sleeper"+string(rune('a'+i)), "sleep", "1000")
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
		time.Sleep(10 * time.Millisecond) // spread the starts over threads
	}
	var wg sync.WaitGroup
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := l.InHost("hub", func() error {
				c, err := net.DialTimeout("tcp", l.Hub().Addr+":7000", 2*time.Second)
				if err == nil {
					c.Close()
				}
				return err
			})
			if err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	time.Sleep(200 * time.Millisecond)
	for _, p := range procs {
		if !alive(p.PID(), procStart(p.PID())) {
			t.Errorf("process %s (pid %d) died during InHost calls: %v", p.Name, p.PID(), p.Wait())
		}
	}
}
