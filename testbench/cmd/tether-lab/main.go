// Command tether-lab builds and drives a tether test lab by hand: network
// namespaces for a hub and NAT'd sites, shaped uplinks and faults.
//
//	tether-lab up -f lab.yaml            build the lab and serve it until down or Ctrl-C
//	tether-lab down                      tear the running lab down
//	tether-lab sweep                     remove leftovers of labs whose owner died
//	tether-lab exec <host> -- cmd...     run a command inside a host
//	tether-lab start <host> <name> -- cmd...   run a supervised process in a host
//	tether-lab signal <name> kill|stop|cont|term|restart
//	tether-lab partition <site> [-dir both|up|down]
//	tether-lab heal <site>
//	tether-lab shape <site> [-rate 1mbit] [-delay 100ms] [-jitter 0] [-loss 0.05] [-dup 0] [-reorder 0]
//	tether-lab rebind <site>
//	tether-lab slowdisk <node> [-delay 20ms] [-bw 4mib]   (no flags: full speed)
//	tether-lab stats [-json]
//	tether-lab hosts
//
// Every command but up and sweep talks to the running "up" through a unix
// socket in the lab's runtime dir; -id picks the lab when several run.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tether-edge/tether/testbench"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "up":
		err = up(args)
	case "sweep":
		var ids []string
		ids, err = testbench.Sweep(nil)
		for _, id := range ids {
			fmt.Println("removed lab", id)
		}
	case "exec":
		err = execIn(args)
	default:
		err = control(cmd, args)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether-lab:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: tether-lab up|down|sweep|exec|start|signal|partition|heal|shape|rebind|slowdisk|stats|hosts ...")
	os.Exit(2)
}

func sockPath(dir string) string { return filepath.Join(dir, "control.sock") }

func up(args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	file := fs.String("f", "lab.yaml", "lab spec (YAML)")
	fs.Parse(args)
	spec, err := testbench.LoadSpec(*file)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	l, err := testbench.Up(ctx, testbench.Config{Spec: spec})
	if err != nil {
		return err
	}
	defer l.Close()
	ln, err := net.Listen("unix", sockPath(l.Dir()))
	if err != nil {
		return fmt.Errorf("listen control socket: %w", err)
	}
	down := make(chan struct{})
	srv := &http.Server{Handler: handler(l, down)}
	go srv.Serve(ln)
	fmt.Printf("lab %s up; hosts:\n", l.ID())
	printHosts(os.Stdout, hostsOf(l))
	select {
	case <-ctx.Done():
	case <-down:
	}
	srv.Close()
	return l.Close()
}

type hostInfo struct {
	Name, Netns, Addr, DataDir string
}

func hostsOf(l *testbench.Lab) []hostInfo {
	var hs []hostInfo
	for _, name := range l.HostNames() {
		h := l.Host(name)
		hs = append(hs, hostInfo{h.Name, h.Netns, h.Addr, h.DataDir})
	}
	return hs
}

func printHosts(w io.Writer, hs []hostInfo) {
	for _, h := range hs {
		fmt.Fprintf(w, "  %-14s %-16s %-22s %s\n", h.Name, h.Addr, h.Netns, h.DataDir)
	}
}

func handler(l *testbench.Lab, down chan struct{}) http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any, err error) {
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("POST /down", func(w http.ResponseWriter, r *http.Request) {
		reply(w, "ok", nil)
		close(down)
	})
	mux.HandleFunc("GET /hosts", func(w http.ResponseWriter, r *http.Request) { reply(w, hostsOf(l), nil) })
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, r *http.Request) { reply(w, l.Stats(), nil) })
	mux.HandleFunc("POST /partition/{site}", func(w http.ResponseWriter, r *http.Request) {
		d := map[string]testbench.Direction{"": testbench.Both, "both": testbench.Both,
			"up": testbench.Upstream, "down": testbench.Downstream}
		dir, ok := d[r.FormValue("dir")]
		if !ok {
			reply(w, nil, fmt.Errorf("unknown direction %q", r.FormValue("dir")))
			return
		}
		reply(w, "ok", l.Partition(r.PathValue("site"), dir))
	})
	mux.HandleFunc("POST /heal/{site}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, "ok", l.Heal(r.PathValue("site")))
	})
	mux.HandleFunc("POST /rebind/{site}", func(w http.ResponseWriter, r *http.Request) {
		reply(w, "ok", l.Rebind(r.Context(), r.PathValue("site")))
	})
	mux.HandleFunc("POST /shape/{site}", func(w http.ResponseWriter, r *http.Request) {
		var p testbench.LinkParams
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			reply(w, nil, fmt.Errorf("decode params: %w", err))
			return
		}
		reply(w, "ok", l.Shape(r.PathValue("site"), p))
	})
	mux.HandleFunc("POST /disk/{node}", func(w http.ResponseWriter, r *http.Request) {
		var p testbench.DiskParams
		if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
			reply(w, nil, fmt.Errorf("decode params: %w", err))
			return
		}
		reply(w, "ok", l.ShapeDisk(r.PathValue("node"), p))
	})
	mux.HandleFunc("POST /start", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Host, Name string
			Args       []string
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			reply(w, nil, fmt.Errorf("decode request: %w", err))
			return
		}
		p, err := l.Start(req.Host, req.Name, req.Args...)
		if err != nil {
			reply(w, nil, err)
			return
		}
		reply(w, map[string]any{"pid": p.PID(), "log": p.LogPath()}, nil)
	})
	mux.HandleFunc("POST /signal/{name}/{sig}", func(w http.ResponseWriter, r *http.Request) {
		p := l.Process(r.PathValue("name"))
		if p == nil {
			reply(w, nil, fmt.Errorf("no process %q", r.PathValue("name")))
			return
		}
		var err error
		switch r.PathValue("sig") {
		case "kill":
			err = p.Kill()
		case "stop":
			err = p.Signal(syscall.SIGSTOP)
		case "cont":
			err = p.Signal(syscall.SIGCONT)
		case "term":
			err = p.Stop(10 * time.Second)
		case "restart":
			err = p.Restart()
		default:
			err = fmt.Errorf("unknown signal %q", r.PathValue("sig"))
		}
		reply(w, "ok", err)
	})
	return mux
}

// labDir finds the running lab: the one named by -id, or the only one.
func labDir(id string) (string, error) {
	if id != "" {
		return filepath.Join(testbench.RuntimeRoot, id), nil
	}
	ents, _ := os.ReadDir(testbench.RuntimeRoot)
	var dirs []string
	for _, e := range ents {
		if _, err := os.Stat(sockPath(filepath.Join(testbench.RuntimeRoot, e.Name()))); err == nil {
			dirs = append(dirs, filepath.Join(testbench.RuntimeRoot, e.Name()))
		}
	}
	switch len(dirs) {
	case 0:
		return "", errors.New("no lab is running (start one with tether-lab up)")
	case 1:
		return dirs[0], nil
	}
	return "", fmt.Errorf("%d labs run; pick one with -id", len(dirs))
}

func call(id, method, path string, body any, out any) error {
	dir, err := labDir(id)
	if err != nil {
		return err
	}
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sockPath(dir))
	}}}
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = strings.NewReader(string(b))
	}
	req, _ := http.NewRequest(method, "http://lab"+path, rd)
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("reach lab: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return errors.New(strings.TrimSpace(string(msg)))
	}
	if out != nil {
		return json.NewDecoder(resp.Body).Decode(out)
	}
	return nil
}

func parseRate(s string) (int64, error) {
	s = strings.ToLower(strings.TrimSuffix(strings.ToLower(s), "bit"))
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "k"):
		mult, s = 1000, s[:len(s)-1]
	case strings.HasSuffix(s, "m"):
		mult, s = 1000_000, s[:len(s)-1]
	case strings.HasSuffix(s, "g"):
		mult, s = 1000_000_000, s[:len(s)-1]
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("parse rate: %w", err)
	}
	return int64(v * float64(mult)), nil
}

// parseBytes reads a byte count with an optional binary suffix: k, m or g,
// each optionally followed by "ib" or "b" (4m, 4mib and 4mb are all 4 MiB).
func parseBytes(arg string) (int64, error) {
	s := strings.TrimSuffix(strings.TrimSuffix(strings.ToLower(arg), "b"), "i")
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "k"):
		mult, s = 1<<10, s[:len(s)-1]
	case strings.HasSuffix(s, "m"):
		mult, s = 1<<20, s[:len(s)-1]
	case strings.HasSuffix(s, "g"):
		mult, s = 1<<30, s[:len(s)-1]
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("parse byte rate %q", arg)
	}
	return int64(v * float64(mult)), nil
}

func control(cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ExitOnError)
	id := fs.String("id", "", "lab id (default: the only running lab)")
	dir := fs.String("dir", "both", "partition direction: both, up (site to hub) or down")
	rate := fs.String("rate", "0", "bandwidth, e.g. 256kbit, 1mbit; 0 is unlimited")
	delay := fs.Duration("delay", 0, "one-way delay; for slowdisk, the delay of each disk operation")
	bw := fs.String("bw", "0", "slowdisk throughput in bytes per second, e.g. 512kib, 4mib; 0 is unlimited")
	jitter := fs.Duration("jitter", 0, "extra random delay up to this much")
	loss := fs.Float64("loss", 0, "loss probability 0..1")
	dup := fs.Float64("dup", 0, "duplication probability 0..1")
	reorder := fs.Float64("reorder", 0, "probability 0..1 that a packet skips the delay")
	asJSON := fs.Bool("json", false, "print stats as JSON")
	pos, rest := splitDash(args)
	// Flags may follow the positional arguments.
	var positional []string
	for len(pos) > 0 {
		fs.Parse(pos)
		if fs.NArg() == 0 {
			break
		}
		positional = append(positional, fs.Arg(0))
		pos = fs.Args()[1:]
	}
	need := func(n int) error {
		if len(positional) != n {
			return fmt.Errorf("%s wants %d arguments, got %d", cmd, n, len(positional))
		}
		return nil
	}
	switch cmd {
	case "down":
		return call(*id, "POST", "/down", nil, nil)
	case "hosts":
		var hs []hostInfo
		if err := call(*id, "GET", "/hosts", nil, &hs); err != nil {
			return err
		}
		printHosts(os.Stdout, hs)
		return nil
	case "stats":
		var s testbench.Stats
		if err := call(*id, "GET", "/stats", nil, &s); err != nil {
			return err
		}
		if *asJSON {
			e := json.NewEncoder(os.Stdout)
			e.SetIndent("", "  ")
			return e.Encode(s)
		}
		s.WriteTable(os.Stdout)
		return nil
	case "partition":
		if err := need(1); err != nil {
			return err
		}
		return call(*id, "POST", "/partition/"+positional[0]+"?dir="+url.QueryEscape(*dir), nil, nil)
	case "heal", "rebind":
		if err := need(1); err != nil {
			return err
		}
		return call(*id, "POST", "/"+cmd+"/"+positional[0], nil, nil)
	case "shape":
		if err := need(1); err != nil {
			return err
		}
		r, err := parseRate(*rate)
		if err != nil {
			return err
		}
		p := testbench.LinkParams{Rate: r, Delay: testbench.Duration(*delay), Jitter: testbench.Duration(*jitter),
			Loss: *loss, Duplicate: *dup, Reorder: *reorder}
		return call(*id, "POST", "/shape/"+positional[0], p, nil)
	case "slowdisk":
		if err := need(1); err != nil {
			return err
		}
		b, err := parseBytes(*bw)
		if err != nil {
			return err
		}
		return call(*id, "POST", "/disk/"+positional[0], testbench.DiskParams{Delay: testbench.Duration(*delay), Rate: b}, nil)
	case "start":
		if err := need(2); err != nil {
			return err
		}
		var out map[string]any
		err := call(*id, "POST", "/start", map[string]any{"Host": positional[0], "Name": positional[1], "Args": rest}, &out)
		if err == nil {
			fmt.Printf("pid %v, log %v\n", out["pid"], out["log"])
		}
		return err
	case "signal":
		if err := need(2); err != nil {
			return err
		}
		return call(*id, "POST", "/signal/"+positional[0]+"/"+positional[1], nil, nil)
	}
	usage()
	return nil
}

// splitDash splits args at "--".
func splitDash(args []string) (before, after []string) {
	for i, a := range args {
		if a == "--" {
			return args[:i], args[i+1:]
		}
	}
	return args, nil
}

func execIn(args []string) error {
	fs := flag.NewFlagSet("exec", flag.ExitOnError)
	id := fs.String("id", "", "lab id (default: the only running lab)")
	pos, rest := splitDash(args)
	fs.Parse(pos)
	if fs.NArg() != 1 || len(rest) == 0 {
		return errors.New("usage: tether-lab exec <host> -- cmd [args...]")
	}
	var hs []hostInfo
	if err := call(*id, "GET", "/hosts", nil, &hs); err != nil {
		return err
	}
	for _, h := range hs {
		if h.Name == fs.Arg(0) {
			cmd := exec.Command("ip", append([]string{"netns", "exec", h.Netns}, rest...)...)
			cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				os.Exit(ee.ExitCode())
			}
			return err
		}
	}
	return fmt.Errorf("no host %q", fs.Arg(0))
}
