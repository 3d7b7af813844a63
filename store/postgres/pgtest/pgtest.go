// Package pgtest starts throw-away PostgreSQL clusters for tests: initdb into
// a fresh directory, a server listening only on a unix socket in it, stopped
// and removed when the test ends. The binaries are Debian's (the postgresql
// package, /usr/lib/postgresql/*/bin) or initdb and pg_ctl on PATH. Run as
// root, the cluster belongs to the postgres user, since PostgreSQL refuses
// to run as root.
package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cluster is one running (or stopped) PostgreSQL cluster.
type Cluster struct {
	t    testing.TB
	bin  string
	dir  string // holds data/ and the socket
	cred *syscall.Credential

	mu      sync.Mutex
	running bool
	dbs     int
}

// port is the port number in the socket's name; nothing listens on TCP.
const port = 5432

// BinDir returns the directory holding initdb and pg_ctl, or "" if there is
// none.
func BinDir() string {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.Atoi(filepath.Base(filepath.Dir(a)))
		vb, _ := strconv.Atoi(filepath.Base(filepath.Dir(b)))
		return vb - va
	})
	for _, d := range dirs {
		if fileExists(filepath.Join(d, "initdb")) && fileExists(filepath.Join(d, "pg_ctl")) {
			return d
		}
	}
	initdb, err := exec.LookPath("initdb")
	if err != nil {
		return ""
	}
	if real, err := filepath.EvalSymlinks(initdb); err == nil {
		initdb = real
	}
	d := filepath.Dir(initdb)
	if !fileExists(filepath.Join(d, "pg_ctl")) {
		return ""
	}
	return d
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Start creates and starts a cluster that is stopped and removed when t
// ends. Without PostgreSQL binaries the test is skipped, or fails when the
// CI environment variable is set.
func Start(t testing.TB) *Cluster {
	t.Helper()
	bin := BinDir()
	if bin == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("PostgreSQL binaries (initdb, pg_ctl) not found; install the postgresql package")
		}
		t.Skip("PostgreSQL binaries (initdb, pg_ctl) not found")
	}
	dir, err := os.MkdirTemp("", "tether-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, bin: bin, dir: dir}
	t.Cleanup(func() {
		c.Stop()
		os.RemoveAll(dir)
	})
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatalf("running as root needs the postgres user to own the cluster: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	c.run("initdb", "-D", c.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	conf := strings.Join([]string{
		"listen_addresses = ''",
		fmt.Sprintf("unix_socket_directories = '%s'", dir),
		fmt.Sprintf("port = %d", port),
		"max_connections = 200",
		// Acknowledged commits survive a killed server (the WAL is
		// written at commit); only a machine crash could lose them.
		"fsync = off",
		"full_page_writes = off",
		"shared_buffers = 32MB",
	}, "\n") + "\n"
	f, err := os.OpenFile(filepath.Join(c.data(), "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(conf); err != nil {
		t.Fatal(err)
	}
	f.Close()
	c.Start()
	return c
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) run(name string, args ...string) {
	c.t.Helper()
	cmd := exec.Command(filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		c.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// Start starts the server again after Stop.
func (c *Cluster) Start() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return
	}
	c.run("pg_ctl", "-D", c.data(), "-l", filepath.Join(c.dir, "server.log"), "-w", "-t", "60", "start")
	c.running = true
}

// Stop stops the server at once, as a crash would (immediate shutdown:
// clients are cut off, recovery replays the WAL at the next start).
func (c *Cluster) Stop() {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return
	}
	c.run("pg_ctl", "-D", c.data(), "-m", "immediate", "-w", "stop")
	c.running = false
}

// DSN returns a postgres:// URL for database db.
func (c *Cluster) DSN(db string) string {
	q := url.Values{}
	q.Set("host", c.dir)
	q.Set("port", strconv.Itoa(port))
	q.Set("sslmode", "disable")
	return (&url.URL{Scheme: "postgres", User: url.User("postgres"), Path: "/" + db, RawQuery: q.Encode()}).String()
}

// NewDatabase creates an empty database and returns its DSN.
func (c *Cluster) NewDatabase() string {
	c.t.Helper()
	c.mu.Lock()
	c.dbs++
	name := fmt.Sprintf("tether%d", c.dbs)
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		c.t.Fatalf("connect to the test cluster: %v", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name+" STRATEGY FILE_COPY"); err != nil {
		c.t.Fatalf("create database %s: %v", name, err)
	}
	return c.DSN(name)
}
