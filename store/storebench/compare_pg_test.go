package storebench_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tether-edge/tether/internal/benchfmt"
	"github.com/tether-edge/tether/store/postgres"
	"github.com/tether-edge/tether/store/postgres/pgtest"
	"github.com/tether-edge/tether/store/storebench"
)

// pgSize is the on-disk size of tether's tables in the database at dsn.
func pgSize(ctx context.Context, dsn string) (int64, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int64
	err = conn.QueryRow(ctx, `SELECT sum(pg_total_relation_size(c))::bigint
		FROM unnest('{tether_log,tether_objects,tether_counter,tether_meta}'::regclass[]) AS c`).Scan(&n)
	return n, err
}

// TestComparePostgres compares tether's PostgreSQL backend with kine over
// PostgreSQL, each on its own databases of one throw-away cluster: the
// storebench workload (Workload) and two servers sharing a database while
// their watches follow each other's writes (TwoWriterWatch, see
// compare_watch_test.go). Short by default; -storebench.full runs the full
// workloads.
func TestComparePostgres(t *testing.T) {
	pg := pgtest.Start(t)
	kineBin := filepath.Join(t.TempDir(), "kinebench")
	buildPeer(t, "kine", kineBin)
	t.Run("Workload", func(t *testing.T) { comparePostgresWorkload(t, pg, kineBin) })
	t.Run("TwoWriterWatch", func(t *testing.T) { compareTwoWriterWatch(t, pg, kineBin) })
}

// comparePostgresWorkload runs the storebench workload against tether's
// PostgreSQL backend and kine and prints the comparison.
func comparePostgresWorkload(t *testing.T, pg *pgtest.Cluster, kineBin string) {
	cfg := storebench.Config{Objects: 1000, Writers: []int{1, 16, 64}, Lists: 5}
	if *full {
		cfg = storebench.Config{Objects: 10000, Writers: []int{1, 16, 64}, Lists: 50}
	}
	ctx := context.Background()
	var teth, kine []storebench.Result
	for range max(1, *runs) {
		dsn := pg.NewDatabase()
		s, err := postgres.Open(ctx, postgres.Config{DSN: dsn})
		if err != nil {
			t.Fatal(err)
		}
		tt := &tetherTarget{s: s, size: func() (int64, error) { return pgSize(ctx, dsn) }}
		c := cfg
		c.Name = "tether-postgres"
		res, err := storebench.Run(ctx, tt, c)
		tt.Close()
		if err != nil {
			t.Fatalf("run tether on postgres: %v", err)
		}
		teth = append(teth, res)
		kine = append(kine, runPeer(t, kineBin, cfg, "-endpoint", pg.NewDatabase()))
	}
	var b bytes.Buffer
	if err := storebench.WriteTable(&b, storebench.Median(teth), storebench.Median(kine)); err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(os.Stdout, "store comparison on PostgreSQL (median of %d run(s)):\n%s", max(1, *runs), b.String())
	for _, f := range storebench.PostgresFigures(storebench.Median(teth), storebench.Median(kine), benchfmt.Mode(*full)) {
		benchfmt.Report(t, f)
	}
}
