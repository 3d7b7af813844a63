package testbench

import (
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Stats is a snapshot of a lab's counters.
type Stats struct {
	Links map[string]LinkStats       `json:"links"`
	Procs map[string]ProcessSnapshot `json:"procs"`
}

// LinkStats counts a site uplink in each direction.
type LinkStats struct {
	Up   DirStats `json:"up"`   // site to hub
	Down DirStats `json:"down"` // hub to site
}

// ProcessSnapshot is a process's history of samples.
type ProcessSnapshot struct {
	Host    string   `json:"host"`
	PID     int      `json:"pid"`
	Samples []Sample `json:"samples"`
}

// Stats returns the current counters and every process's samples.
func (l *Lab) Stats() Stats {
	s := Stats{Links: map[string]LinkStats{}, Procs: map[string]ProcessSnapshot{}}
	for n, st := range l.sites {
		s.Links[n] = LinkStats{Up: st.relay.up.stats(), Down: st.relay.down.stats()}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for n, p := range l.procs {
		p.mu.Lock()
		if p.cmd == nil { // Start has reserved the name but not started it
			p.mu.Unlock()
			continue
		}
		s.Procs[n] = ProcessSnapshot{Host: p.Host, PID: p.cmd.Process.Pid, Samples: append([]Sample(nil), p.samples...)}
		p.mu.Unlock()
	}
	return s
}

// WriteTable prints a short human-readable summary of s.
func (s Stats) WriteTable(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "LINK\tUP PKTS\tUP BYTES\tUP DROP\tDOWN PKTS\tDOWN BYTES\tDOWN DROP")
	names := make([]string, 0, len(s.Links))
	for n := range s.Links {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ls := s.Links[n]
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\n", n, ls.Up.Packets, ls.Up.Bytes, ls.Up.Dropped,
			ls.Down.Packets, ls.Down.Bytes, ls.Down.Dropped)
	}
	fmt.Fprintln(tw, "\nPROCESS\tHOST\tPID\tRSS MiB\tCPU\tSTATE")
	names = names[:0]
	for n := range s.Procs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := s.Procs[n]
		var last Sample
		if len(p.Samples) > 0 {
			last = p.Samples[len(p.Samples)-1]
		}
		state := "running"
		if last.Exited {
			state = "exited"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f\t%s\t%s\n", n, p.Host, p.PID, float64(last.RSS)/(1<<20),
			last.CPU.Round(time.Millisecond), state)
	}
	tw.Flush()
}

const maxSamples = 3600

func (l *Lab) sampleLoop() {
	defer l.wg.Done()
	t := time.NewTicker(l.cfg.SampleInterval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case now := <-t.C:
			l.mu.Lock()
			procs := make([]*Process, 0, len(l.procs))
			for _, p := range l.procs {
				procs = append(procs, p)
			}
			l.mu.Unlock()
			for _, p := range procs {
				p.sample(now)
			}
		}
	}
}

var pageSize = int64(os.Getpagesize())

// clkTck is the USER_HZ Linux reports CPU times in; it is 100 on every
// architecture tether supports.
const clkTck = 100

func (p *Process) sample(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		// Start has reserved the name but the command is not running
		// yet: there is nothing to measure.
		return
	}
	s := Sample{Time: now}
	select {
	case <-p.done:
		s.Exited = true
	default:
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
		if err != nil {
			s.Exited = true
			break
		}
		str := string(b)
		f := strings.Fields(str[strings.LastIndexByte(str, ')')+2:])
		if len(f) > 21 {
			ut, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			rss, _ := strconv.ParseInt(f[21], 10, 64)
			s.CPU = time.Duration(ut+st) * time.Second / clkTck
			s.RSS = rss * pageSize
		}
	}
	if len(p.samples) >= maxSamples {
		p.samples = p.samples[1:]
	}
	p.samples = append(p.samples, s)
}
