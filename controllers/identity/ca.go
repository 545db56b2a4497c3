package identity

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/strata-cache/strata/internal/pki"
)

// Keys of the CA Secret (kubernetes.io/tls) and of the bundle ConfigMap.
const (
	BundleKey = "ca.crt"
)

// EnsureCA returns the CA kept in the Secret secretName of namespace, creating both on the
// first start, and writes its certificate into the ConfigMap bundleName that every component
// mounts to trust it. Operator replicas that start together agree: the Secret's creation
// decides, and a replica that loses the race reads the winner's CA.
func EnsureCA(ctx context.Context, c client.Client, namespace, secretName, bundleName string) (*pki.CA, error) {
	ca, err := readOrCreateCA(ctx, c, namespace, secretName)
	if err != nil {
		return nil, err
	}
	return ca, writeBundle(ctx, c, namespace, bundleName, ca)
}

// caPoll is how often WaitForCA looks for the Secret cert-manager is to write.
const caPoll = 5 * time.Second

// WaitForCA returns the CA that another issuer (cert-manager, from the Issuer the chart's
// values name) writes into the Secret secretName of namespace, waiting for it until ctx ends,
// and writes its certificate into the bundle ConfigMap. The operator makes no CA of its own then.
func WaitForCA(ctx context.Context, c client.Client, namespace, secretName, bundleName string, log logr.Logger) (*pki.CA, error) {
	key := client.ObjectKey{Namespace: namespace, Name: secretName}
	for {
		var secret corev1.Secret
		err := c.Get(ctx, key, &secret)
		switch {
		case err == nil && len(secret.Data[corev1.TLSCertKey]) > 0 && len(secret.Data[corev1.TLSPrivateKeyKey]) > 0:
			ca, err := pki.ParseCA(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
			if err != nil {
				return nil, fmt.Errorf("the CA Secret %s that cert-manager wrote: %w (its Certificate needs isCA: true and privateKey.encoding: PKCS8)", key, err)
			}
			return ca, writeBundle(ctx, c, namespace, bundleName, ca)
		case err != nil && !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("reading the CA Secret %s: %w", key, err)
		}
		log.Info("waiting for cert-manager to issue Strata's CA: see the Certificate of the release and its Issuer", "secret", key.String())
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for cert-manager to write the CA Secret %s: %w", key, ctx.Err())
		case <-time.After(caPoll):
		}
	}
}

// writeBundle writes the CA certificate into the ConfigMap bundleName that components mount.
func writeBundle(ctx context.Context, c client.Client, namespace, bundleName string, ca *pki.CA) error {
	bundle := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: bundleName, Namespace: namespace}}
	err := c.Get(ctx, client.ObjectKeyFromObject(bundle), bundle)
	switch {
	case apierrors.IsNotFound(err):
		bundle.Data = map[string]string{BundleKey: string(ca.CertPEM)}
		if err := c.Create(ctx, bundle); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating the CA bundle ConfigMap %s/%s: %w", namespace, bundleName, err)
		}
	case err != nil:
		return fmt.Errorf("reading the CA bundle ConfigMap %s/%s: %w", namespace, bundleName, err)
	case bundle.Data[BundleKey] != string(ca.CertPEM):
		bundle.Data = map[string]string{BundleKey: string(ca.CertPEM)}
		if err := c.Update(ctx, bundle); err != nil {
			return fmt.Errorf("updating the CA bundle ConfigMap %s/%s: %w", namespace, bundleName, err)
		}
	}
	return nil
}

func readOrCreateCA(ctx context.Context, c client.Client, namespace, name string) (*pki.CA, error) {
	key := client.ObjectKey{Namespace: namespace, Name: name}
	var secret corev1.Secret
	err := c.Get(ctx, key, &secret)
	if apierrors.IsNotFound(err) {
		ca, caErr := pki.NewCA("Strata internal CA ("+namespace+")", time.Now())
		if caErr != nil {
			return nil, caErr
		}
		secret = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{
				"app.kubernetes.io/part-of": "strata", "app.kubernetes.io/component": "ca",
			}},
			Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM},
		}
		// Another replica may have made one first: then its CA is the one.
		if err = c.Create(ctx, &secret); err == nil {
			return ca, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating the CA Secret %s: %w", key, err)
		}
		err = c.Get(ctx, key, &secret)
	}
	if err != nil {
		return nil, fmt.Errorf("reading the CA Secret %s: %w", key, err)
	}
	ca, err := pki.ParseCA(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("the CA Secret %s: %w (delete it to have a new CA made, and restart Strata's pods)", key, err)
	}
	return ca, nil
}
