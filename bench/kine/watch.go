package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/tether-edge/tether/store/storebench"
)

// serveWatch runs this process's part of the two-writer watch workload:
// several kinebench processes, each with its own kine on one database, as
// several k3s servers run. The driver speaks to each over a line protocol:
//
//	kinebench -> driver: "ready"                 (the watch runs)
//	driver -> kinebench: "start <unix-ns>"       (when to write)
//	kinebench -> driver: "wrote <n>"             (its acknowledged writes)
//	driver -> kinebench: "expect <n> <wait-ns>"  (every server's writes; how long to wait for them)
//	kinebench -> driver: the storebench.ServerLog as JSON
func serveWatch(ctx context.Context, t *target, cfg storebench.WatchConfig, prepare bool, in io.Reader, out io.Writer) error {
	if prepare {
		if err := storebench.PrepareShared(ctx, t); err != nil {
			return err
		}
	}
	rec, err := storebench.StartRecorder(ctx, t)
	if err != nil {
		return err
	}
	lines := bufio.NewScanner(in)
	next := func(format string, args ...any) error {
		if !lines.Scan() {
			return fmt.Errorf("read driver: %v", lines.Err())
		}
		if _, err := fmt.Sscanf(lines.Text(), format, args...); err != nil {
			return fmt.Errorf("read driver line %q: %w", lines.Text(), err)
		}
		return nil
	}
	fmt.Fprintln(out, "ready")
	var start int64
	if err := next("start %d", &start); err != nil {
		return err
	}
	log, err := storebench.WriteAt(ctx, t, cfg, time.Unix(0, start))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "wrote %d\n", len(log.Writes))
	var total int
	var wait int64
	if err := next("expect %d %d", &total, &wait); err != nil {
		return err
	}
	rec.Wait(total, time.Duration(wait))
	rec.Stop(&log)
	return json.NewEncoder(out).Encode(log)
}
