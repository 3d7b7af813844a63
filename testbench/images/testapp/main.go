// Command testapp is the program inside tether's test images. Its first
// argument picks what it does:
//
//	serve [ADDR]      HTTP server (default :8080): / says hello, /healthz
//	                  answers 200 until /fail is hit, /env dumps the
//	                  environment, /file?path=P dumps a file, /remote
//	                  says the client's address and port
//	crash [CODE]      prints a line and exits with CODE (default 1)
//	memhog MIB        allocates and touches MIB mebibytes, then sleeps
//	burn [MILLICORES] burns that much of a core, steadily (default 500,
//	                  or $BURN_MILLICORES), until SIGTERM
//	sleep [SECONDS]   sleeps (forever without an argument); exits 0 on SIGTERM
//	get URL           fetches URL and prints the body (images have no curl)
//	log N             prints N numbered lines, one every 100ms, then sleeps
//	probe EVERY URL...
//	                  fetches each URL ($VARS expanded) over a new
//	                  connection every EVERY (a Go duration), printing
//	                  "probe UNIXMS URL ok FIRST-LINE" or "probe UNIXMS URL
//	                  err ERROR" per attempt, until SIGTERM
//	webhook [ADDR]    admission webhooks over HTTPS (default :8443) with
//	                  $WEBHOOK_CERT and $WEBHOOK_KEY: /mutate labels
//	                  webhook=edge, /validate refuses deny=true (webhook.go)
//	dial ADDR [TIMEOUT]
//	                  opens a TCP connection to ADDR within TIMEOUT (2s),
//	                  prints "connected", exits 1 when it cannot
//	lookup NAME [TIMEOUT]
//	                  resolves NAME through /etc/resolv.conf within TIMEOUT
//	incluster [CHECK...]
//	                  an in-cluster client (the service account's token,
//	                  CA and the KUBERNETES_SERVICE_* variables): without
//	                  checks it lists the pods of all namespaces and prints
//	                  "incluster: listed N pods" and its namespace; with
//	                  checks (discovery, list:pods, list:secrets@other,
//	                  get:pods/NAME, delete:pods/NAME, list:deployments.apps,
//	                  ...) it prints, one line per check, "incluster: CHECK
//	                  OK" or the HTTP status code and message the API
//	                  answered (see incluster.go)
//	aggregated [ADDR] [GROUP/VERSION]
//	                  an extension API server (default :8443,
//	                  echo.tether.test/v1alpha1) trusting the hub's
//	                  front-proxy certificate (see aggregated.go)
//
// It is built static (CGO_ENABLED=0) so that the images need no libc.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		serve(":8080")
		return
	}
	arg := func(i int, def string) string {
		if len(os.Args) > i {
			return os.Args[i]
		}
		return def
	}
	switch os.Args[1] {
	case "serve":
		serve(arg(2, ":8080"))
	case "crash":
		code, _ := strconv.Atoi(arg(2, "1"))
		fmt.Println("crashing with", code)
		os.Exit(code)
	case "memhog":
		mib, _ := strconv.Atoi(arg(2, "256"))
		var keep [][]byte
		for i := 0; i < mib; i++ {
			b := make([]byte, 1<<20)
			for j := range b {
				b[j] = byte(j)
			}
			keep = append(keep, b)
		}
		fmt.Println("allocated", len(keep), "MiB")
		sleep(0)
	case "burn":
		m, err := strconv.Atoi(arg(2, os.Getenv("BURN_MILLICORES")))
		if err != nil || m <= 0 {
			m = 500
		}
		burn(m)
	case "sleep":
		s, _ := strconv.Atoi(arg(2, "0"))
		sleep(time.Duration(s) * time.Second)
	case "get":
		resp, err := http.Get(arg(2, ""))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		io.Copy(os.Stdout, resp.Body)
		if resp.StatusCode != 200 {
			os.Exit(2)
		}
	case "dial":
		d, err := time.ParseDuration(arg(3, "2s"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		c, err := net.DialTimeout("tcp", arg(2, ""), d)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		c.Close()
		fmt.Println("connected")
	case "lookup":
		d, err := time.ParseDuration(arg(3, "2s"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		addrs, err := (&net.Resolver{PreferGo: true}).LookupHost(ctx, arg(2, ""))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(strings.Join(addrs, " "))
	case "incluster":
		if err := inCluster(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "incluster:", err)
			os.Exit(1)
		}
	case "aggregated":
		if err := aggregated(arg(2, ":8443"), arg(3, "echo.tether.test/v1alpha1")); err != nil {
			fmt.Fprintln(os.Stderr, "aggregated:", err)
			os.Exit(1)
		}
	case "webhook":
		webhook(arg(2, ":8443"))
	case "probe":
		every, err := time.ParseDuration(arg(2, "200ms"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		probe(every, os.Args[3:])
	case "log":
		n, _ := strconv.Atoi(arg(2, "10"))
		for i := 1; i <= n; i++ {
			fmt.Printf("line %d\n", i)
			time.Sleep(100 * time.Millisecond)
		}
		sleep(0)
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
}

func sleep(d time.Duration) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	var after <-chan time.Time
	if d > 0 {
		after = time.After(d)
	}
	select {
	case s := <-sig:
		fmt.Println("got", s)
	case <-after:
	}
}

func serve(addr string) {
	var failing atomic.Bool
	mux := http.NewServeMux()
	host, _ := os.Hostname()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from %s\n", host)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			http.Error(w, "failing", http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/fail", func(w http.ResponseWriter, r *http.Request) {
		failing.Store(true)
		fmt.Fprintln(w, "failing from now on")
	})
	mux.HandleFunc("/remote", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, r.RemoteAddr)
	})
	mux.HandleFunc("/env", func(w http.ResponseWriter, r *http.Request) {
		env := os.Environ()
		sort.Strings(env)
		for _, e := range env {
			fmt.Fprintln(w, e)
		}
	})
	mux.HandleFunc("/file", func(w http.ResponseWriter, r *http.Request) {
		b, err := os.ReadFile(r.URL.Query().Get("path"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.Write(b)
	})
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Println("got SIGTERM")
		os.Exit(0)
	}()
	fmt.Println("listening on", addr)
	if err := http.ListenAndServe(addr, mux); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// burn keeps one thread busy for millicores/1000 of every 10ms slice and
// asleep for the rest, so that the process uses a steady fraction of a
// core (whole cores beyond the first run on more goroutines).
func burn(millicores int) {
	fmt.Println("burning", millicores, "millicores")
	const slice = 10 * time.Millisecond
	spin := func(share time.Duration) {
		var x uint64
		for {
			start := time.Now()
			for time.Since(start) < share {
				for i := 0; i < 1000; i++ {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
			if rest := slice - share; rest > 0 {
				time.Sleep(rest)
			}
		}
	}
	for ; millicores >= 1000; millicores -= 1000 {
		go spin(slice)
	}
	if millicores > 0 {
		go spin(slice * time.Duration(millicores) / 1000)
	}
	sleep(0)
}

// probe fetches every URL over a new connection each round, one line of
// output per attempt, until SIGTERM.
func probe(every time.Duration, urls []string) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	c := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for i := range urls {
		urls[i] = os.ExpandEnv(urls[i])
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		for _, u := range urls {
			start := time.Now().UnixMilli()
			resp, err := c.Get(u)
			if err != nil {
				fmt.Printf("probe %d %s err %v\n", start, u, err)
				continue
			}
			b, err := io.ReadAll(io.LimitReader(resp.Body, 512))
			resp.Body.Close()
			line, _, _ := strings.Cut(string(b), "\n")
			switch {
			case err != nil:
				fmt.Printf("probe %d %s err read body: %v\n", start, u, err)
			case resp.StatusCode != http.StatusOK:
				fmt.Printf("probe %d %s err status %d\n", start, u, resp.StatusCode)
			default:
				fmt.Printf("probe %d %s ok %s\n", start, u, line)
			}
		}
		select {
		case s := <-sig:
			fmt.Println("got", s)
			return
		case <-tick.C:
		}
	}
}
