package controllers

import (
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The operator never caches, lists or watches Secrets: it reads, one
// Get at a time, only the Secrets that Datasets name (their source's and their checkpoint
// target's keys), so that a compromise of its cache or of a watch gives no tenant's keys away.
// What follows a Secret's change does so by looking again on an interval instead of a watch.

// SecretClientOptions make the manager's client read Secrets from the API server, never from
// the cache; use them in the manager's Client options.
func SecretClientOptions() *client.CacheOptions {
	return &client.CacheOptions{DisableFor: []client.Object{&corev1.Secret{}}}
}
