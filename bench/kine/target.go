package main

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/tether-edge/tether/store/storebench"
)

const prefix = "/registry/pods/"

// target drives an etcd v3 endpoint the way the Kubernetes API server's
// etcd3 storage does: guarded transactions for writes, one range for lists.
type target struct {
	cli  *clientv3.Client
	size func() (int64, error)
}

func (t *target) Create(ctx context.Context, ns, name string, value []byte) (int64, error) {
	key := prefix + ns + "/" + name
	resp, err := t.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(value))).
		Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, storebench.ErrConflict
	}
	return resp.Header.Revision, nil
}

func (t *target) Update(ctx context.Context, ns, name string, value []byte, expected int64) (int64, error) {
	key := prefix + ns + "/" + name
	resp, err := t.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", expected)).
		Then(clientv3.OpPut(key, string(value))).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		return 0, storebench.ErrConflict
	}
	return resp.Header.Revision, nil
}

func (t *target) List(ctx context.Context) (int, error) {
	resp, err := t.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	return len(resp.Kvs), nil
}

func (t *target) Size() (int64, error) { return t.size() }

func (t *target) Close() error { return t.cli.Close() }

func (t *target) Get(ctx context.Context, ns, name string) (int64, error) {
	key := prefix + ns + "/" + name
	resp, err := t.cli.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) == 0 {
		return 0, fmt.Errorf("get %s: not found", key)
	}
	return resp.Kvs[0].ModRevision, nil
}

// Watch watches the pods' prefix from the current revision on, as the
// API server's watch cache does.
func (t *target) Watch(ctx context.Context) (<-chan storebench.Change, error) {
	wch := t.cli.Watch(clientv3.WithRequireLeader(ctx), prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	// Writes may start as soon as Watch returns: wait until kine
	// registered the watch.
	select {
	case resp, ok := <-wch:
		if !ok {
			return nil, fmt.Errorf("watch %s: closed before it started", prefix)
		}
		if err := resp.Err(); err != nil {
			return nil, fmt.Errorf("watch %s: %w", prefix, err)
		}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	out := make(chan storebench.Change, 1024)
	go func() {
		defer close(out)
		for resp := range wch {
			if resp.Err() != nil {
				return
			}
			for _, ev := range resp.Events {
				c := storebench.Change{Key: strings.TrimPrefix(string(ev.Kv.Key), prefix), Rev: ev.Kv.ModRevision}
				select {
				case out <- c:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}
