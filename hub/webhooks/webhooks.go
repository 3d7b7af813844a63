// Package webhooks is tether's admission configured through the API:
// admission webhooks (ValidatingWebhookConfiguration,
// MutatingWebhookConfiguration) and ValidatingAdmissionPolicies. It runs
// k8s.io/apiserver's own admission plugins over informers of the hub's
// in-process clients, so matching (rules, selectors, matchPolicy,
// matchConditions), failurePolicy, timeouts, sideEffects with dry-run,
// reinvocation, JSON patches, parallel validating calls, warnings and
// denial messages are upstream's. A webhook Service is reached through
// hub/servicedial, through the tunnel of the node its pod runs on.
package webhooks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/mutating"
	webhookvalidating "k8s.io/apiserver/pkg/admission/plugin/webhook/validating"
	"k8s.io/apiserver/pkg/authentication/user"
	webhookutil "k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	admissionregistrationlisters "k8s.io/client-go/listers/admissionregistration/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/tether-edge/tether/hub/auth"
	"github.com/tether-edge/tether/hub/registry"
	"github.com/tether-edge/tether/hub/servicedial"
	"github.com/tether-edge/tether/hub/storage"
)

// Config configures an Admission.
type Config struct {
	// RestConfig is an in-process client configuration of the hub's own
	// API (apiserver.LocalTransport) with the rights to read namespaces,
	// webhook configurations, policies and their parameters.
	RestConfig *rest.Config
	// Services reaches webhook Services' endpoints.
	Services *servicedial.Dialer
	// Scheme holds the served kinds' types (registry.NewScheme).
	Scheme *runtime.Scheme
	// Kinds returns the served kinds (for their defaults after a
	// webhook's patch).
	Kinds func() []*registry.Kind
	// Authorizer answers ValidatingAdmissionPolicies' authorizer checks;
	// nil denies them.
	Authorizer Authorizer
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
}

// Admission implements storage.ExternalAdmission with upstream's
// admission plugins.
type Admission struct {
	cfg      Config
	log      *slog.Logger
	factory  informers.SharedInformerFactory
	mutating admission.MutationInterface
	// mutatingConfigs and mutatingSynced are the informer of
	// MutatingWebhookConfigurations the mutating plugin reads its
	// webhooks from.
	mutatingConfigs admissionregistrationlisters.MutatingWebhookConfigurationLister
	mutatingSynced  func() bool
	webhooks        *webhookvalidating.Plugin
	policies        *validating.Plugin
	objects         admission.ObjectInterfaces
	stop            chan struct{}
}

var _ storage.ExternalAdmission = (*Admission)(nil)

// New builds the admission plugins; Start starts what they watch.
func New(cfg Config) (*Admission, error) {
	if cfg.RestConfig == nil || cfg.Scheme == nil || cfg.Services == nil {
		return nil, errors.New("create webhook admission: incomplete configuration")
	}
	a := &Admission{cfg: cfg, log: cfg.Logger, stop: make(chan struct{})}
	if a.log == nil {
		a.log = slog.Default()
	}
	rc := rest.CopyConfig(cfg.RestConfig)
	rc.QPS = -1 // in-process: no client-side throttling
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("create webhook admission client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("create webhook admission client: %w", err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("create webhook admission client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	a.factory = informers.NewSharedInformerFactory(kube, 0)
	a.objects = newObjectInterfaces(cfg.Scheme, cfg.Kinds)

	mut, err := mutating.NewMutatingWebhook(nil)
	if err != nil {
		return nil, fmt.Errorf("create mutating webhook admission: %w", err)
	}
	val, err := webhookvalidating.NewValidatingAdmissionWebhook(nil)
	if err != nil {
		return nil, fmt.Errorf("create validating webhook admission: %w", err)
	}
	for _, w := range []interface {
		SetServiceResolver(webhookutil.ServiceResolver)
		SetAuthenticationInfoResolverWrapper(webhookutil.AuthenticationInfoResolverWrapper)
		SetExternalKubeClientSet(kubernetes.Interface)
		SetExternalKubeInformerFactory(informers.SharedInformerFactory)
		SetDrainedNotification(<-chan struct{})
		ValidateInitialization() error
	}{mut, val} {
		w.SetServiceResolver(webhookutil.NewDefaultServiceResolver())
		w.SetAuthenticationInfoResolverWrapper(a.dialServices)
		w.SetExternalKubeClientSet(kube)
		w.SetExternalKubeInformerFactory(a.factory)
		w.SetDrainedNotification(a.stop)
		if err := w.ValidateInitialization(); err != nil {
			return nil, fmt.Errorf("initialize webhook admission: %w", err)
		}
	}
	pol, err := validating.NewPlugin(nil)
	if err != nil {
		return nil, fmt.Errorf("create policy admission: %w", err)
	}
	pol.SetExternalKubeInformerFactory(a.factory)
	pol.SetExternalKubeClientSet(kube)
	pol.SetDynamicClient(dyn)
	pol.SetRESTMapper(mapper)
	pol.SetDrainedNotification(a.stop)
	pol.SetUnconditionalAuthorizer(authorizerAdapter{cfg.Authorizer})
	if err := pol.ValidateInitialization(); err != nil {
		return nil, fmt.Errorf("initialize policy admission: %w", err)
	}
	a.mutating = mut
	configs := a.factory.Admissionregistration().V1().MutatingWebhookConfigurations()
	a.mutatingConfigs, a.mutatingSynced = configs.Lister(), configs.Informer().HasSynced
	a.webhooks, a.policies = val, pol
	return a, nil
}

// dialServices makes webhook clients of a Service dial it through
// servicedial; URL webhooks keep their own dialing.
func (a *Admission) dialServices(delegate webhookutil.AuthenticationInfoResolver) webhookutil.AuthenticationInfoResolver {
	return &webhookutil.AuthenticationInfoResolverDelegator{
		ClientConfigForFunc: delegate.ClientConfigFor,
		ClientConfigForServiceFunc: func(name, namespace string, port int) (*rest.Config, error) {
			rc, err := delegate.ClientConfigForService(name, namespace, port)
			if err != nil {
				return nil, err
			}
			rc.Dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
				return a.cfg.Services.DialService(ctx, namespace, name, int32(port))
			}
			return rc, nil
		},
	}
}

// Start starts the informers the plugins read; they stop when ctx ends.
func (a *Admission) Start(ctx context.Context) {
	go func() {
		<-ctx.Done()
		close(a.stop)
	}()
	a.factory.Start(a.stop)
}

// WaitSynced waits until the plugins are ready to admit requests, at most
// until ctx ends.
func (a *Admission) WaitSynced(ctx context.Context) bool {
	for ctx.Err() == nil {
		ok := true
		for typ, synced := range a.factory.WaitForCacheSync(ctx.Done()) {
			if !synced {
				a.log.Debug("webhook admission: informer not synced", "type", typ)
				ok = false
			}
		}
		if ok {
			return true
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false
}

// Mutate implements storage.ExternalAdmission: the mutating webhooks.
func (a *Admission) Mutate(ctx context.Context, r *storage.AdmissionRequest) error {
	if a.noMutatingWebhooks() {
		return nil
	}
	attrs := a.attributes(ctx, r)
	if !a.mutating.Handles(attrs.GetOperation()) {
		return nil
	}
	if err := a.mutating.Admit(ctx, attrs, a.objects); err != nil {
		return err
	}
	// Webhooks with reinvocationPolicy IfNeeded see the changes later
	// webhooks made: the dispatcher says so, and the chain is run again
	// once, as kube-apiserver's admission chain does.
	if rc := attrs.GetReinvocationContext(); rc.ShouldReinvoke() {
		rc.SetIsReinvoke()
		return a.mutating.Admit(ctx, attrs, a.objects)
	}
	return nil
}

// Validate implements storage.ExternalAdmission: the
// ValidatingAdmissionPolicies, then the validating webhooks (called in
// parallel), in kube-apiserver's plugin order.
func (a *Admission) Validate(ctx context.Context, r *storage.AdmissionRequest) error {
	attrs := a.attributes(ctx, r)
	if err := a.policies.Validate(ctx, attrs, a.objects); err != nil {
		return err
	}
	return a.webhooks.Validate(ctx, attrs, a.objects)
}

// attributes builds upstream's admission attributes of a storage write.
// The objects carry their kind's apiVersion and kind, as webhooks receive
// them; the old object, shared with storage's cache, is copied first.
func (a *Admission) attributes(ctx context.Context, r *storage.AdmissionRequest) admission.Attributes {
	gvk := r.Kind.GVK
	obj, old := r.Object, r.OldObject
	if obj != nil && obj.GetObjectKind().GroupVersionKind() != gvk {
		obj.GetObjectKind().SetGroupVersionKind(gvk)
	}
	if old != nil && old.GetObjectKind().GroupVersionKind() != gvk {
		old = old.DeepCopyObject()
		old.GetObjectKind().SetGroupVersionKind(gvk)
	}
	var u user.Info
	if au, ok := auth.UserFrom(ctx); ok && au != nil {
		u = &user.DefaultInfo{Name: au.Name, UID: au.UID, Groups: au.Groups, Extra: au.Extra}
	}
	return admission.NewAttributesRecord(obj, old, gvk, r.Namespace, r.Name, r.Kind.GroupVersionResource(),
		r.Subresource, admission.Operation(r.Operation), r.Options, r.DryRun, u)
}

// noMutatingWebhooks reports that the synced informer holds no mutating
// webhook: the plugin would call none and leave the object as it is, yet
// it copies the object whole to tell whether a later plugin changed it.
func (a *Admission) noMutatingWebhooks() bool {
	if a.mutatingConfigs == nil || !a.mutatingSynced() {
		return false
	}
	configs, err := a.mutatingConfigs.List(labels.Everything())
	if err != nil {
		return false
	}
	for _, c := range configs {
		if len(c.Webhooks) > 0 {
			return false
		}
	}
	return true
}
