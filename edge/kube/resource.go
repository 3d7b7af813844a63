package kube

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
)

// Object is an API object a Resource reads and writes.
type Object interface {
	runtime.Object
	GetName() string
}

// Resource is the client of one kind of object T (lists L): of one
// namespace, of all of them (namespace "") or of a cluster-scoped kind.
// Each method sends the request client-go's typed client sends.
type Resource[T Object, L runtime.Object] struct {
	client    *rest.RESTClient
	params    runtime.ParameterCodec
	resource  string
	namespace string
	newObject func() T
	newList   func() L
	// json asks for JSON only (custom resources have no protobuf).
	json bool
}

func newResource[T Object, L runtime.Object](c *Client, rc *rest.RESTClient, resource, namespace string, newObject func() T, newList func() L) *Resource[T, L] {
	return &Resource[T, L]{client: rc, params: c.params, resource: resource, namespace: namespace, newObject: newObject, newList: newList}
}

// request starts a request of verb on the resource, in its namespace.
func (r *Resource[T, L]) request(verb string) *rest.Request {
	req := r.client.Verb(verb)
	if !r.json {
		req = req.UseProtobufAsDefault()
	}
	return req.NamespaceIfScoped(r.namespace, r.namespace != "").
		Resource(r.resource)
}

// Get reads the object name.
func (r *Resource[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	out := r.newObject()
	err := r.request("GET").Name(name).VersionedParams(&opts, r.params).Do(ctx).Into(out)
	return out, err
}

// List lists the objects opts selects.
func (r *Resource[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	out := r.newList()
	err := r.request("GET").VersionedParams(&opts, r.params).Timeout(timeout(opts)).Do(ctx).Into(out)
	return out, err
}

// Watch watches the objects opts selects.
func (r *Resource[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return r.request("GET").VersionedParams(&opts, r.params).Timeout(timeout(opts)).Watch(ctx)
}

// Create creates obj and returns what the server stored.
func (r *Resource[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	out := r.newObject()
	err := r.request("POST").VersionedParams(&opts, r.params).Body(obj).Do(ctx).Into(out)
	return out, err
}

// Update replaces obj (named by its name) and returns what the server
// stored.
func (r *Resource[T, L]) Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	out := r.newObject()
	err := r.request("PUT").Name(obj.GetName()).VersionedParams(&opts, r.params).Body(obj).Do(ctx).Into(out)
	return out, err
}

// UpdateStatus replaces the status subresource of obj.
func (r *Resource[T, L]) UpdateStatus(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error) {
	out := r.newObject()
	err := r.request("PUT").Name(obj.GetName()).SubResource("status").VersionedParams(&opts, r.params).Body(obj).Do(ctx).Into(out)
	return out, err
}

// Patch patches the object name, or its subresource, with data of type
// pt.
func (r *Resource[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (T, error) {
	out := r.newObject()
	req := r.client.Patch(pt)
	if !r.json {
		req = req.UseProtobufAsDefault()
	}
	err := req.NamespaceIfScoped(r.namespace, r.namespace != "").
		Resource(r.resource).
		Name(name).
		SubResource(subresources...).
		VersionedParams(&opts, r.params).
		Body(data).
		Do(ctx).
		Into(out)
	return out, err
}

// Delete deletes the object name.
func (r *Resource[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return r.request("DELETE").Name(name).Body(&opts).Do(ctx).Error()
}

// timeout is the request timeout opts ask for; zero when none.
func timeout(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}
