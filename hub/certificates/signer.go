package certificates

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	certlisters "k8s.io/client-go/listers/certificates/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/tether-edge/tether/hub/pki"
	"github.com/tether-edge/tether/hub/registry"
)

// SignerConfig configures a Signer. Client and Authority are required.
type SignerConfig struct {
	// Client reaches the hub's API with rights to read certificate
	// signing requests and write their status.
	Client kubernetes.Interface
	// Authority signs: the hub's CA.
	Authority *pki.Authority
	// MaxTTL bounds the lifetime of issued certificates, as
	// kube-controller-manager's --cluster-signing-duration; a request's
	// spec.expirationSeconds may only shorten it (to no less than 10
	// minutes). Zero means one year.
	MaxTTL time.Duration
	// Workers is the number of requests handled at once; 0 means 2.
	Workers int
	// Logger receives diagnostics; nil means slog.Default().
	Logger *slog.Logger
}

// Signer issues certificates for approved requests to the
// kubernetes.io/kube-apiserver-client signer, as upstream's csrsigning
// controller does: it skips requests that are not approved, are denied,
// have failed or already hold a certificate; it marks Failed (reason
// SignerValidationFailure) a request whose usages are not those of a
// client certificate; otherwise it signs the request's subject and key for
// the requested duration, bounded by MaxTTL.
type Signer struct {
	cfg    SignerConfig
	log    *slog.Logger
	inf    informers.SharedInformerFactory
	lister certlisters.CertificateSigningRequestLister
	synced cache.InformerSynced
	queue  workqueue.TypedRateLimitingInterface[string]
}

// backdate is how far before now issued certificates start, for clocks
// that run behind; upstream's signer uses the same.
const backdate = 5 * time.Minute

// NewSigner checks cfg; nothing runs until Run.
func NewSigner(cfg SignerConfig) (*Signer, error) {
	if cfg.Client == nil || cfg.Authority == nil {
		return nil, errors.New("create signer: client and authority are required")
	}
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = 365 * 24 * time.Hour
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	s := &Signer{cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.inf = informers.NewSharedInformerFactory(cfg.Client, 10*time.Minute)
	csrs := s.inf.Certificates().V1().CertificateSigningRequests()
	s.lister = csrs.Lister()
	s.synced = csrs.Informer().HasSynced
	s.queue = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "csrsigning"})
	_, err := csrs.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.enqueue,
		UpdateFunc: func(_, obj any) { s.enqueue(obj) },
	})
	if err != nil {
		return nil, fmt.Errorf("watch certificate signing requests: %w", err)
	}
	return s, nil
}

func (s *Signer) enqueue(obj any) {
	if csr, ok := obj.(*certificatesv1.CertificateSigningRequest); ok {
		s.queue.Add(csr.Name)
	}
}

// Run signs until ctx ends.
func (s *Signer) Run(ctx context.Context) error {
	defer s.queue.ShutDown()
	s.inf.Start(ctx.Done())
	defer s.inf.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), s.synced) {
		return nil
	}
	done := make(chan struct{})
	for range s.cfg.Workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for s.next(ctx) {
			}
		}()
	}
	<-ctx.Done()
	s.queue.ShutDown()
	for range s.cfg.Workers {
		<-done
	}
	return nil
}

func (s *Signer) next(ctx context.Context) bool {
	name, quit := s.queue.Get()
	if quit {
		return false
	}
	defer s.queue.Done(name)
	if err := s.sync(ctx, name); err != nil {
		s.log.Warn("sign certificate signing request", "name", name, "err", err)
		s.queue.AddRateLimited(name)
		return true
	}
	s.queue.Forget(name)
	return true
}

func (s *Signer) sync(ctx context.Context, name string) error {
	cur, err := s.lister.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if cur.Spec.SignerName != certificatesv1.KubeAPIServerClientSignerName || len(cur.Status.Certificate) > 0 ||
		!approved(cur) || hasCondition(cur, certificatesv1.CertificateFailed) {
		return nil
	}
	csr := cur.DeepCopy()
	req, err := registry.ParseCSR(csr.Spec.Request)
	if err == nil {
		err = clientUsages(csr.Spec.Usages)
	}
	if err != nil {
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type:           certificatesv1.CertificateFailed,
			Status:         corev1.ConditionTrue,
			Reason:         "SignerValidationFailure",
			Message:        err.Error(),
			LastUpdateTime: metav1.Now(),
		})
		if _, err := s.cfg.Client.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("add failure condition: %w", err)
		}
		return nil
	}
	ku := x509.KeyUsage(0)
	for _, u := range csr.Spec.Usages {
		switch u {
		case certificatesv1.UsageDigitalSignature:
			ku |= x509.KeyUsageDigitalSignature
		case certificatesv1.UsageKeyEncipherment:
			ku |= x509.KeyUsageKeyEncipherment
		}
	}
	cert, err := s.cfg.Authority.SignRequest(req, pki.SigningPolicy{
		TTL:         s.duration(csr.Spec.ExpirationSeconds),
		Backdate:    backdate,
		KeyUsage:    ku,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return fmt.Errorf("sign certificate: %w", err)
	}
	csr.Status.Certificate = cert
	if _, err := s.cfg.Client.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, csr, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("store certificate: %w", err)
	}
	s.log.Info("issued client certificate", "name", csr.Name, "user", req.Subject.CommonName, "groups", req.Subject.Organization)
	return nil
}

// duration is the lifetime of a certificate for a request asking for
// expirationSeconds: MaxTTL when unset or longer, at least 10 minutes.
func (s *Signer) duration(expirationSeconds *int32) time.Duration {
	if expirationSeconds == nil {
		return s.cfg.MaxTTL
	}
	const minTTL = 10 * time.Minute
	d := time.Duration(*expirationSeconds) * time.Second
	switch {
	case d > s.cfg.MaxTTL:
		return s.cfg.MaxTTL
	case d < minTTL:
		return minTTL
	}
	return d
}

// clientUsages accepts the usages of a client certificate: client auth,
// with digital signature and key encipherment optional.
func clientUsages(usages []certificatesv1.KeyUsage) error {
	client := false
	for _, u := range usages {
		switch u {
		case certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment:
		case certificatesv1.UsageClientAuth:
			client = true
		default:
			return fmt.Errorf("invalid usage for client certificate: %s", u)
		}
	}
	if !client {
		return fmt.Errorf("missing required usage for client certificate: %s", certificatesv1.UsageClientAuth)
	}
	return nil
}

// approved reports an Approved request that is not also Denied.
func approved(csr *certificatesv1.CertificateSigningRequest) bool {
	return hasCondition(csr, certificatesv1.CertificateApproved) && !hasCondition(csr, certificatesv1.CertificateDenied)
}

func hasCondition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}
