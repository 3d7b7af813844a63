package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// namespaceFile is where the service account's namespace is mounted.
const namespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// inCluster runs as an in-cluster client. Without checks it lists the pods
// of all namespaces and prints how many it saw and the pod's namespace.
// With checks it tries each (see check) and prints one line per check:
// "incluster: CHECK OK [DETAIL]" when the API allowed it, or
// "incluster: CHECK CODE MESSAGE" with the HTTP status code and the
// Status message the API answered; it fails only when it cannot run at all.
func inCluster(checks []string) error {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return fmt.Errorf("load in-cluster configuration: %w", err)
	}
	b, err := os.ReadFile(namespaceFile)
	if err != nil {
		return fmt.Errorf("read namespace: %w", err)
	}
	ns := strings.TrimSpace(string(b))
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if len(checks) == 0 {
		pods, err := c.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("list pods: %w", err)
		}
		fmt.Printf("incluster: listed %d pods\n", len(pods.Items))
		fmt.Printf("incluster: namespace %s\n", ns)
		return nil
	}
	for _, spec := range checks {
		detail, err := check(ctx, c, ns, spec)
		fmt.Println("incluster:", spec, outcome(detail, err))
	}
	return nil
}

// outcome is how a check's result is printed: OK and its detail, the
// status code and message of an API error, or ERROR and any other error.
func outcome(detail string, err error) string {
	if err == nil {
		return strings.TrimSpace("OK " + detail)
	}
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		s := status.Status()
		return fmt.Sprintf("%d %s", s.Code, s.Message)
	}
	return "ERROR " + err.Error()
}

// check runs one API call. A check is "discovery" (the server's version,
// API groups and the core group's resources) or VERB:RESOURCE[/NAME][@NS]
// with VERB one of get, list or delete, RESOURCE a plural resource name,
// with ".GROUP" for a named group (version v1), and NS the namespace
// ("*" for all namespaces; the pod's own namespace by default). A delete
// of a name that does not exist is how a test asks whether a write is
// authorized without changing anything: 404 means it was.
func check(ctx context.Context, c *kubernetes.Clientset, ownNS, spec string) (string, error) {
	if spec == "discovery" {
		v, err := c.Discovery().ServerVersion()
		if err != nil {
			return "", err
		}
		groups, err := c.Discovery().ServerGroups()
		if err != nil {
			return "", err
		}
		if _, err := c.Discovery().ServerResourcesForGroupVersion("v1"); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s, %d groups", v.GitVersion, len(groups.Groups)), nil
	}
	verb, target, ok := strings.Cut(spec, ":")
	if !ok {
		return "", fmt.Errorf("parse check %q: want VERB:RESOURCE[/NAME][@NS] or discovery", spec)
	}
	target, ns, hasNS := strings.Cut(target, "@")
	if !hasNS {
		ns = ownNS
	}
	if ns == "*" {
		ns = metav1.NamespaceAll
	}
	resource, name, _ := strings.Cut(target, "/")
	resource, group, _ := strings.Cut(resource, ".")
	method := map[string]string{"get": "GET", "list": "GET", "delete": "DELETE"}[verb]
	if method == "" {
		return "", fmt.Errorf("parse check %q: unknown verb %q", spec, verb)
	}
	if (verb == "list") != (name == "") {
		return "", fmt.Errorf("parse check %q: %s takes a name, list does not", spec, verb)
	}
	req := c.CoreV1().RESTClient().Verb(method)
	if group != "" {
		req = req.AbsPath("/apis", group, "v1")
	}
	req = req.NamespaceIfScoped(ns, ns != "").Resource(resource)
	if name != "" {
		req = req.Name(name)
	}
	// Error, unlike Raw, decodes the Status the API answered with.
	res := req.Do(ctx)
	if err := res.Error(); err != nil || verb != "list" {
		return "", err
	}
	body, err := res.Raw()
	if err != nil {
		return "", err
	}
	var list struct{ Items []json.RawMessage }
	if err := json.Unmarshal(body, &list); err != nil {
		return "", fmt.Errorf("decode list: %w", err)
	}
	return fmt.Sprintf("%d items", len(list.Items)), nil
}
