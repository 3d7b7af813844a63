// Command kinebench runs the storebench workload against kine over SQLite
// (or the datastore -endpoint names, e.g. PostgreSQL),
// started in-process with endpoint.Listen and reached through an etcd v3
// client, the way k3s runs its API server on kine. It prints the result as
// JSON on stdout. With -watch-id it is instead one server of the two-writer
// watch workload, driven over standard input and output (see watch.go).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/k3s-io/kine/pkg/drivers/generic"
	"github.com/k3s-io/kine/pkg/drivers/sqlite"
	"github.com/k3s-io/kine/pkg/endpoint"
	"github.com/sirupsen/logrus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/tether-edge/tether/store/storebench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "kinebench:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		cfg     storebench.Config
		writers string
		dir     string
		sync    string
		// datastore: kine's datastore endpoint; empty means SQLite in dir.
		datastore string
		// wcfg: the two-writer watch workload instead of storebench.Run.
		wcfg    storebench.WatchConfig
		prepare bool
	)
	flag.StringVar(&cfg.Name, "name", "", "result name (default kine, or kine-full with -synchronous=FULL)")
	flag.IntVar(&cfg.Objects, "objects", 10000, "pods created and updated per write phase")
	flag.StringVar(&writers, "writers", "1,16,64", "comma-separated writer counts")
	flag.IntVar(&cfg.Lists, "lists", 50, "timed full lists")
	flag.StringVar(&dir, "dir", "", "data directory (default: a new temporary one, removed afterwards)")
	flag.StringVar(&sync, "synchronous", "", "override _synchronous in kine's default DSN (e.g. FULL)")
	flag.StringVar(&datastore, "endpoint", "", "kine's datastore endpoint instead of SQLite in -dir, e.g. postgres://...")
	flag.StringVar(&wcfg.ID, "watch-id", "", "run as one server of the two-writer watch workload under this id (see watch.go)")
	flag.Float64Var(&wcfg.Rate, "watch-rate", 50, "writes per second of this server in the watch workload")
	flag.DurationVar(&wcfg.Duration, "watch-duration", 10*time.Second, "how long this server writes in the watch workload")
	flag.BoolVar(&prepare, "watch-prepare", false, "create the pods every server updates before starting")
	flag.Parse()
	ws, err := storebench.ParseWriters(writers)
	if err != nil {
		return err
	}
	cfg.Writers = ws
	if cfg.Name == "" {
		cfg.Name = "kine"
		if sync != "" {
			cfg.Name = "kine-" + strings.ToLower(sync)
		}
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "kinebench-")
		if err != nil {
			return fmt.Errorf("create data dir: %w", err)
		}
		defer os.RemoveAll(d)
		dir = d
	}
	logrus.SetOutput(io.Discard)

	params := sqlite.DefaultParams
	if sync != "" {
		params = strings.Replace(params, "_synchronous=NORMAL", "_synchronous="+sync, 1)
	}
	dbPath := filepath.Join(dir, "state.db")
	if datastore == "" {
		datastore = "sqlite://" + dbPath + "?" + params
	} else if cfg.Name == "kine" {
		cfg.Name = "kine-" + strings.SplitN(datastore, ":", 2)[0]
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ecfg, err := endpoint.Listen(ctx, endpoint.Config{
		Endpoint: datastore,
		Listener: "unix://" + filepath.Join(dir, "kine.sock"),
		// The defaults of kine's own command line.
		ConnectionPoolConfig: generic.ConnectionPoolConfig{MaxIdle: 20, MaxIdleTime: 2 * time.Minute},
		NotifyInterval:       5 * time.Second,
		EmulatedETCDVersion:  "3.6.11",
		CompactTimeout:       5 * time.Second,
		CompactMinRetain:     1000,
		CompactBatchSize:     1000,
		PollBatchSize:        500,
	})
	if err != nil {
		return fmt.Errorf("start kine: %w", err)
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   ecfg.Endpoints,
		DialTimeout: 10 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return fmt.Errorf("connect to kine: %w", err)
	}
	defer cli.Close()

	t := &target{cli: cli, size: func() (int64, error) {
		return storebench.FilesSize(dbPath, dbPath+"-wal", dbPath+"-shm")
	}}
	if !strings.HasPrefix(datastore, "sqlite://") {
		// kine reports its table's size as the database size.
		t.size = func() (int64, error) {
			st, err := cli.Status(ctx, ecfg.Endpoints[0])
			if err != nil {
				return 0, fmt.Errorf("read kine's size: %w", err)
			}
			return st.DbSize, nil
		}
	}
	if wcfg.ID != "" {
		return serveWatch(ctx, t, wcfg, prepare, os.Stdin, os.Stdout)
	}
	res, err := storebench.Run(ctx, t, cfg)
	if err != nil {
		return fmt.Errorf("run workload: %w", err)
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}
