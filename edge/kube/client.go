package kube

import (
	"context"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/internal/fleetapi"
)

// Client talks to the hub's API for the agent. Its methods are safe for
// concurrent use.
type Client struct {
	scheme *runtime.Scheme
	params runtime.ParameterCodec

	core       *rest.RESTClient // /api/v1
	discovery  *rest.RESTClient // /apis/discovery.k8s.io/v1
	networking *rest.RESTClient // /apis/networking.k8s.io/v1
	node       *rest.RESTClient // /apis/node.k8s.io/v1
	fleet      *rest.RESTClient // /apis/fleet.tether.io/v1alpha1 (JSON only)
}

// New returns a client whose requests follow cfg: host, dialer, user
// agent, content types, QPS and burst (a limiter per API group, as each
// typed client has its own) and transport wrappers. The groups share one
// HTTP client.
func New(cfg *rest.Config) (*Client, error) {
	scheme, err := newScheme()
	if err != nil {
		return nil, fmt.Errorf("build the API scheme: %w", err)
	}
	codecs := rest.CodecFactoryForGeneratedClient(scheme, serializer.NewCodecFactory(scheme)).WithoutConversion()
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("create the API transport: %w", err)
	}
	group := func(apiPath string, gv schema.GroupVersion) (*rest.RESTClient, error) {
		c := rest.CopyConfig(cfg)
		c.APIPath = apiPath
		c.GroupVersion = &gv
		if gv.Group == fleetapi.Group {
			// Custom resources: JSON only.
			c.ContentType, c.AcceptContentTypes = runtime.ContentTypeJSON, runtime.ContentTypeJSON
		}
		c.NegotiatedSerializer = codecs
		if c.UserAgent == "" {
			c.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		rc, err := rest.RESTClientForConfigAndClient(c, httpClient)
		if err != nil {
			return nil, fmt.Errorf("create the client of %s: %w", gv, err)
		}
		return rc, nil
	}
	c := &Client{scheme: scheme, params: runtime.NewParameterCodec(scheme)}
	for _, g := range []struct {
		rc      **rest.RESTClient
		apiPath string
		gv      schema.GroupVersion
	}{
		{&c.core, "/api", corev1.SchemeGroupVersion},
		{&c.discovery, "/apis", discoveryv1.SchemeGroupVersion},
		{&c.networking, "/apis", networkingv1.SchemeGroupVersion},
		{&c.node, "/apis", nodev1.SchemeGroupVersion},
		{&c.fleet, "/apis", schema.GroupVersion{Group: fleetapi.Group, Version: fleetapi.Version}},
	} {
		if *g.rc, err = group(g.apiPath, g.gv); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// newScheme registers the kinds the agent uses, and the options and
// Status of metav1 in each of their versions, as client-go's scheme does.
func newScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, schema.GroupVersion{Version: "v1"})
	for _, add := range []func(*runtime.Scheme) error{
		corev1.AddToScheme,
		discoveryv1.AddToScheme,
		networkingv1.AddToScheme,
		nodev1.AddToScheme,
		authenticationv1.AddToScheme,
		fleetapi.AddImageStagingToScheme,
	} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Scheme holds the kinds the client knows; client-go's event recorder
// takes it.
func (c *Client) Scheme() *runtime.Scheme { return c.scheme }

// core/v1

// Pods is the client of the Pods of namespace (all of them if "").
func (c *Client) Pods(namespace string) *Resource[*corev1.Pod, *corev1.PodList] {
	return newResource(c, c.core, "pods", namespace, func() *corev1.Pod { return &corev1.Pod{} }, func() *corev1.PodList { return &corev1.PodList{} })
}

// Nodes is the client of the Nodes.
func (c *Client) Nodes() *Resource[*corev1.Node, *corev1.NodeList] {
	return newResource(c, c.core, "nodes", "", func() *corev1.Node { return &corev1.Node{} }, func() *corev1.NodeList { return &corev1.NodeList{} })
}

// Namespaces is the client of the Namespaces.
func (c *Client) Namespaces() *Resource[*corev1.Namespace, *corev1.NamespaceList] {
	return newResource(c, c.core, "namespaces", "", func() *corev1.Namespace { return &corev1.Namespace{} }, func() *corev1.NamespaceList { return &corev1.NamespaceList{} })
}

// Services is the client of the Services of namespace (all if "").
func (c *Client) Services(namespace string) *Resource[*corev1.Service, *corev1.ServiceList] {
	return newResource(c, c.core, "services", namespace, func() *corev1.Service { return &corev1.Service{} }, func() *corev1.ServiceList { return &corev1.ServiceList{} })
}

// Secrets is the client of the Secrets of namespace (all if "").
func (c *Client) Secrets(namespace string) *Resource[*corev1.Secret, *corev1.SecretList] {
	return newResource(c, c.core, "secrets", namespace, func() *corev1.Secret { return &corev1.Secret{} }, func() *corev1.SecretList { return &corev1.SecretList{} })
}

// ConfigMaps is the client of the ConfigMaps of namespace (all if "").
func (c *Client) ConfigMaps(namespace string) *Resource[*corev1.ConfigMap, *corev1.ConfigMapList] {
	return newResource(c, c.core, "configmaps", namespace, func() *corev1.ConfigMap { return &corev1.ConfigMap{} }, func() *corev1.ConfigMapList { return &corev1.ConfigMapList{} })
}

// PersistentVolumes is the client of the PersistentVolumes.
func (c *Client) PersistentVolumes() *Resource[*corev1.PersistentVolume, *corev1.PersistentVolumeList] {
	return newResource(c, c.core, "persistentvolumes", "", func() *corev1.PersistentVolume { return &corev1.PersistentVolume{} }, func() *corev1.PersistentVolumeList { return &corev1.PersistentVolumeList{} })
}

// PersistentVolumeClaims is the client of the PersistentVolumeClaims of
// namespace (all if "").
func (c *Client) PersistentVolumeClaims(namespace string) *Resource[*corev1.PersistentVolumeClaim, *corev1.PersistentVolumeClaimList] {
	return newResource(c, c.core, "persistentvolumeclaims", namespace, func() *corev1.PersistentVolumeClaim { return &corev1.PersistentVolumeClaim{} }, func() *corev1.PersistentVolumeClaimList { return &corev1.PersistentVolumeClaimList{} })
}

// CreateToken requests a token of the service account name in namespace
// (the serviceaccounts/token subresource).
func (c *Client) CreateToken(ctx context.Context, namespace, name string, tr *authenticationv1.TokenRequest, opts metav1.CreateOptions) (*authenticationv1.TokenRequest, error) {
	out := &authenticationv1.TokenRequest{}
	err := c.core.Post().
		UseProtobufAsDefault().
		Namespace(namespace).
		Resource("serviceaccounts").
		Name(name).
		SubResource("token").
		VersionedParams(&opts, c.params).
		Body(tr).
		Do(ctx).
		Into(out)
	return out, err
}

// discovery.k8s.io/v1

// EndpointSlices is the client of the EndpointSlices of namespace (all if
// "").
func (c *Client) EndpointSlices(namespace string) *Resource[*discoveryv1.EndpointSlice, *discoveryv1.EndpointSliceList] {
	return newResource(c, c.discovery, "endpointslices", namespace, func() *discoveryv1.EndpointSlice { return &discoveryv1.EndpointSlice{} }, func() *discoveryv1.EndpointSliceList { return &discoveryv1.EndpointSliceList{} })
}

// networking.k8s.io/v1

// Ingresses is the client of the Ingresses of namespace (all if "").
func (c *Client) Ingresses(namespace string) *Resource[*networkingv1.Ingress, *networkingv1.IngressList] {
	return newResource(c, c.networking, "ingresses", namespace, func() *networkingv1.Ingress { return &networkingv1.Ingress{} }, func() *networkingv1.IngressList { return &networkingv1.IngressList{} })
}

// IngressClasses is the client of the IngressClasses.
func (c *Client) IngressClasses() *Resource[*networkingv1.IngressClass, *networkingv1.IngressClassList] {
	return newResource(c, c.networking, "ingressclasses", "", func() *networkingv1.IngressClass { return &networkingv1.IngressClass{} }, func() *networkingv1.IngressClassList { return &networkingv1.IngressClassList{} })
}

// NetworkPolicies is the client of the NetworkPolicies of namespace (all
// if "").
func (c *Client) NetworkPolicies(namespace string) *Resource[*networkingv1.NetworkPolicy, *networkingv1.NetworkPolicyList] {
	return newResource(c, c.networking, "networkpolicies", namespace, func() *networkingv1.NetworkPolicy { return &networkingv1.NetworkPolicy{} }, func() *networkingv1.NetworkPolicyList { return &networkingv1.NetworkPolicyList{} })
}

// node.k8s.io/v1

// RuntimeClasses is the client of the RuntimeClasses.
func (c *Client) RuntimeClasses() *Resource[*nodev1.RuntimeClass, *nodev1.RuntimeClassList] {
	return newResource(c, c.node, "runtimeclasses", "", func() *nodev1.RuntimeClass { return &nodev1.RuntimeClass{} }, func() *nodev1.RuntimeClassList { return &nodev1.RuntimeClassList{} })
}

// fleet.tether.io/v1alpha1

// ImageStagings is the client of the ImageStagings (custom resources:
// JSON only).
func (c *Client) ImageStagings() *Resource[*fleetapi.ImageStaging, *fleetapi.ImageStagingList] {
	r := newResource(c, c.fleet, "imagestagings", "", func() *fleetapi.ImageStaging { return &fleetapi.ImageStaging{} }, func() *fleetapi.ImageStagingList { return &fleetapi.ImageStagingList{} })
	r.json = true
	return r
}
