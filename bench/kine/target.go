package main

import (
	"context"
	"errors"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const prefix = "/registry/pods/"

// target drives an etcd v3 endpoint the way the Kubernetes API server's
// etcd3 storage does: guarded transactions for writes, one range for lists.
type target struct {
	cli  *clientv3.Client
	size func() (int64, error)
}

var errConflict = errors.New("compare failed")

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
		return 0, errConflict
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
		return 0, errConflict
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
