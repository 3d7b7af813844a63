package apiserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/hub/auth"
)

// TestTokenRequest issues tokens through serviceaccounts/token and uses them.
func TestTokenRequest(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	var tokens *auth.ServiceAccountTokens
	var cs *kubernetes.Clientset
	tokens = auth.NewServiceAccountTokens(key, func(ctx context.Context, c auth.Claims) error {
		sa, err := cs.CoreV1().ServiceAccounts(c.Namespace).Get(ctx, c.ServiceAccount, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if string(sa.UID) != c.ServiceAccountUID {
			return apierrors.NewConflict(corev1.Resource("serviceaccounts"), c.ServiceAccount, nil)
		}
		if c.PodName != "" {
			if _, err := cs.CoreV1().Pods(c.Namespace).Get(ctx, c.PodName, metav1.GetOptions{}); err != nil {
				return err
			}
		}
		return nil
	})
	h := newHubWith(t, func(c *Config) {
		c.ServiceAccountTokens = tokens
		c.Authenticator = auth.Union{tokens, tokenAuth{}}
	})
	cs = h.cs
	ctx := context.Background()
	sa, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, "robot", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Status.Token == "" || time.Until(tr.Status.ExpirationTimestamp.Time) < 59*time.Minute {
		t.Fatalf("token %q expiring %v", tr.Status.Token, tr.Status.ExpirationTimestamp)
	}
	as := func(token string) *kubernetes.Clientset {
		c, err := kubernetes.NewForConfig(&rest.Config{Host: h.srv.URL, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	if _, err := as(tr.Status.Token).CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("request with the service account token: %v", err)
	}
	// A token for another audience does not open the API.
	other, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, "robot", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"vault"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := as(other.Status.Token).CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Fatalf("token for audience vault: %v, want 401", err)
	}
	// Bad requests are refused with field causes.
	short := int64(60)
	_, err = cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, "robot", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &short}}, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "less than 10 minutes") {
		t.Fatalf("60s token: %v", err)
	}
	// A pod-bound token dies with the pod.
	pod, err := cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: corev1.PodSpec{ServiceAccountName: "robot", Containers: []corev1.Container{{Name: "c", Image: "i"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bound, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, "robot", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: "p", UID: pod.UID}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := as(bound.Status.Token).CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("pod-bound token: %v", err)
	}
	if err := cs.CoreV1().Pods("default").Delete(ctx, "p", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	if _, err := as(bound.Status.Token).CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Fatalf("token of a deleted pod: %v, want 401", err)
	}
	// Deleting the service account revokes its tokens.
	if err := cs.CoreV1().ServiceAccounts("default").Delete(ctx, sa.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := as(tr.Status.Token).CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Fatalf("token of a deleted service account: %v, want 401", err)
	}
}
