package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// aggregated serves a small extension API server for API aggregation
// tests: group/version gv (e.g. "echo.tether.test/v1alpha1") with one
// namespaced resource, echoes (kind Echo), whose objects say who asked.
// It trusts only requests that present a client certificate signed by the
// request-header CA of kube-system/extension-apiserver-authentication
// (read in-cluster) with an allowed name, and takes the caller's identity
// from the front-proxy headers named there. It serves TLS with the
// certificate and key in TLS_CERT and TLS_KEY (PEM), or a self-signed one.
func aggregated(addr, gv string) error {
	group, version, ok := strings.Cut(gv, "/")
	if !ok {
		return fmt.Errorf("group/version %q has no slash", gv)
	}
	trust, err := loadRequestHeader()
	if err != nil {
		return err
	}
	cert, err := servingCertificate()
	if err != nil {
		return err
	}
	a := &echoServer{group: group, version: version, trust: trust, started: metav1.Now()}
	srv := &http.Server{
		Addr:              addr,
		Handler:           a,
		ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.VerifyClientCertIfGiven,
			ClientCAs: trust.pool, MinVersion: tls.VersionTLS12},
	}
	fmt.Printf("aggregated: serving %s on %s\n", gv, addr)
	return srv.ListenAndServeTLS("", "")
}

// requestHeader is what extension-apiserver-authentication says about
// front-proxy requests.
type requestHeader struct {
	pool                   *x509.CertPool
	allowed, users, groups []string
	extraPrefixes          []string
}

func loadRequestHeader() (*requestHeader, error) {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("load in-cluster configuration: %w", err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("create client: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cm, err := c.CoreV1().ConfigMaps("kube-system").Get(ctx, "extension-apiserver-authentication", metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read extension-apiserver-authentication: %w", err)
	}
	rh := &requestHeader{pool: x509.NewCertPool()}
	if !rh.pool.AppendCertsFromPEM([]byte(cm.Data["requestheader-client-ca-file"])) {
		return nil, fmt.Errorf("no requestheader-client-ca-file in extension-apiserver-authentication")
	}
	for key, dst := range map[string]*[]string{"requestheader-allowed-names": &rh.allowed, "requestheader-username-headers": &rh.users,
		"requestheader-group-headers": &rh.groups, "requestheader-extra-headers-prefix": &rh.extraPrefixes} {
		if err := json.Unmarshal([]byte(cm.Data[key]), dst); err != nil {
			return nil, fmt.Errorf("parse %s: %w", key, err)
		}
	}
	return rh, nil
}

func servingCertificate() (tls.Certificate, error) {
	if c, k := os.Getenv("TLS_CERT"), os.Getenv("TLS_KEY"); c != "" && k != "" {
		return tls.X509KeyPair([]byte(c), []byte(k))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "testapp"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

type echoServer struct {
	group, version string
	trust          *requestHeader
	started        metav1.Time
}

// caller returns the identity in r's front-proxy headers, or an error
// when r's client certificate does not entitle it to assert one.
func (e *echoServer) caller(r *http.Request) (string, []string, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
		return "", nil, fmt.Errorf("no client certificate signed by the request-header CA")
	}
	cn := r.TLS.VerifiedChains[0][0].Subject.CommonName
	if len(e.trust.allowed) > 0 && !slices.Contains(e.trust.allowed, cn) {
		return "", nil, fmt.Errorf("client certificate %q is not an allowed front proxy", cn)
	}
	var user string
	for _, h := range e.trust.users {
		if user = r.Header.Get(h); user != "" {
			break
		}
	}
	var groups []string
	for _, h := range e.trust.groups {
		groups = append(groups, r.Header.Values(h)...)
	}
	if user == "" {
		return "", nil, fmt.Errorf("no user in the front-proxy headers")
	}
	return user, groups, nil
}

func (e *echoServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/healthz" || r.URL.Path == "/readyz" || r.URL.Path == "/livez" {
		fmt.Fprint(w, "ok")
		return
	}
	user, groups, err := e.caller(r)
	if err != nil {
		writeJSON(w, http.StatusUnauthorized, status(http.StatusUnauthorized, "Unauthorized", err.Error()))
		return
	}
	gv := e.group + "/" + e.version
	base := "/apis/" + gv
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case path == base:
		writeJSON(w, http.StatusOK, map[string]any{"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
			"resources": []any{map[string]any{"name": "echoes", "singularName": "echo", "namespaced": true, "kind": "Echo", "verbs": []string{"get", "list"}}}})
		return
	case !strings.HasPrefix(path, base+"/"):
		writeJSON(w, http.StatusNotFound, status(http.StatusNotFound, "NotFound", "the server could not find the requested resource"))
		return
	}
	segs := strings.Split(strings.TrimPrefix(path, base+"/"), "/")
	ns, name := "", ""
	switch {
	case len(segs) == 1 && segs[0] == "echoes":
	case len(segs) == 3 && segs[0] == "namespaces" && segs[2] == "echoes":
		ns = segs[1]
	case len(segs) == 4 && segs[0] == "namespaces" && segs[2] == "echoes":
		ns, name = segs[1], segs[3]
	default:
		writeJSON(w, http.StatusNotFound, status(http.StatusNotFound, "NotFound", "the server could not find the requested resource"))
		return
	}
	if r.Method != http.MethodGet {
		writeJSON(w, http.StatusMethodNotAllowed, status(http.StatusMethodNotAllowed, "MethodNotAllowed", r.Method+" is not supported"))
		return
	}
	obj := func(ns, name string) map[string]any {
		return map[string]any{"apiVersion": gv, "kind": "Echo",
			"metadata": map[string]any{"name": name, "namespace": ns, "creationTimestamp": e.started},
			"spec":     map[string]any{"user": user, "groups": groups}}
	}
	if name != "" {
		writeJSON(w, http.StatusOK, obj(ns, name))
		return
	}
	if ns == "" {
		ns = "default"
	}
	items := []map[string]any{obj(ns, "whoami")}
	if strings.Contains(r.Header.Get("Accept"), "as=Table") {
		rows := []any{}
		for _, it := range items {
			m := it["metadata"].(map[string]any)
			rows = append(rows, map[string]any{"cells": []any{m["name"], user, strings.Join(groups, ",")},
				"object": map[string]any{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": m}})
		}
		writeJSON(w, http.StatusOK, map[string]any{"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": map[string]any{},
			"columnDefinitions": []any{
				map[string]any{"name": "Name", "type": "string", "format": "name"},
				map[string]any{"name": "User", "type": "string"},
				map[string]any{"name": "Groups", "type": "string"},
			}, "rows": rows})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"apiVersion": gv, "kind": "EchoList", "metadata": map[string]any{}, "items": items})
}

func status(code int, reason, msg string) map[string]any {
	return map[string]any{"kind": "Status", "apiVersion": "v1", "metadata": map[string]any{}, "status": "Failure",
		"message": msg, "reason": reason, "code": code}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
