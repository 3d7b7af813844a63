package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

// namespaceFile is where the service account's namespace is mounted.
const namespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// inCluster lists the pods of all namespaces with the in-cluster
// configuration and prints how many it saw and the pod's namespace.
func inCluster() error {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return fmt.Errorf("load in-cluster configuration: %w", err)
	}
	ns, err := os.ReadFile(namespaceFile)
	if err != nil {
		return fmt.Errorf("read namespace: %w", err)
	}
	c, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pods, err := c.Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("list pods: %w", err)
	}
	fmt.Printf("incluster: listed %d pods\n", len(pods.Items))
	fmt.Printf("incluster: namespace %s\n", strings.TrimSpace(string(ns)))
	return nil
}
