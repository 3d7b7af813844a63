// Command etcdbench runs the storebench workload against an embedded etcd
// server with default settings, reached through an etcd v3 client over
// loopback. It prints the result as JSON on stdout.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/tether-edge/tether/store/storebench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "etcdbench:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		cfg     storebench.Config
		writers string
		dir     string
	)
	flag.StringVar(&cfg.Name, "name", "etcd", "result name")
	flag.IntVar(&cfg.Objects, "objects", 10000, "pods created and updated per write phase")
	flag.StringVar(&writers, "writers", "1,16,64", "comma-separated writer counts")
	flag.IntVar(&cfg.Lists, "lists", 50, "timed full lists")
	flag.StringVar(&dir, "dir", "", "data directory (default: a new temporary one, removed afterwards)")
	flag.Parse()
	ws, err := storebench.ParseWriters(writers)
	if err != nil {
		return err
	}
	cfg.Writers = ws
	if dir == "" {
		d, err := os.MkdirTemp("", "etcdbench-")
		if err != nil {
			return fmt.Errorf("create data dir: %w", err)
		}
		defer os.RemoveAll(d)
		dir = d
	}

	ecfg := embed.NewConfig()
	ecfg.Dir = filepath.Join(dir, "etcd")
	ecfg.LogLevel = "error"
	// Loopback on ports the kernel picks, so that runs never collide.
	local := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	ecfg.ListenClientUrls = []url.URL{local}
	ecfg.AdvertiseClientUrls = []url.URL{local}
	peer := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	ecfg.ListenPeerUrls = []url.URL{peer}
	ecfg.AdvertisePeerUrls = []url.URL{{Scheme: "http", Host: "127.0.0.1:2380"}}
	ecfg.InitialCluster = ecfg.Name + "=http://127.0.0.1:2380"
	e, err := embed.StartEtcd(ecfg)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		return fmt.Errorf("start etcd: not ready after 30s")
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   []string{e.Clients[0].Addr().String()},
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return fmt.Errorf("connect to etcd: %w", err)
	}
	defer cli.Close()

	t := &target{cli: cli, size: func() (int64, error) { return storebench.DirSize(ecfg.Dir) }}
	res, err := storebench.Run(context.Background(), t, cfg)
	if err != nil {
		return fmt.Errorf("run workload: %w", err)
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}
