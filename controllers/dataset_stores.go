package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/understore"
)

// storeRef is one under-store a Dataset reads: its spec.source, or one of its spec.mounts.
type storeRef struct {
	// path is the folder of the tree the store is shown at, relative ("raw"); "" for
	// spec.source, which is the whole tree.
	path string
	// field is where the store is in the spec, for messages: "spec.source" or
	// "spec.mounts[1].source".
	field string
	src   datav1alpha1.DatasetSource
}

// datasetStores are the under-stores ds reads; none for an output.
func datasetStores(ds *datav1alpha1.Dataset) []storeRef {
	if ds.Spec.Source != nil {
		return []storeRef{{field: "spec.source", src: *ds.Spec.Source}}
	}
	refs := make([]storeRef, len(ds.Spec.Mounts))
	for i, m := range ds.Spec.Mounts {
		refs[i] = storeRef{path: strings.TrimPrefix(m.Path, "/"), field: fmt.Sprintf("spec.mounts[%d].source", i), src: m.Source}
	}
	return refs
}

// readsStores says whether ds is read from under-stores (spec.source or spec.mounts), rather
// than written by a Lineage.
func readsStores(ds *datav1alpha1.Dataset) bool {
	return ds.Spec.Source != nil || len(ds.Spec.Mounts) > 0
}

// describeStores names what ds reads, for messages and events: its source's URI, or each
// mount's folder and URI.
func describeStores(ds *datav1alpha1.Dataset) string {
	if ds.Spec.Source != nil {
		return ds.Spec.Source.URI
	}
	parts := make([]string, len(ds.Spec.Mounts))
	for i, m := range ds.Spec.Mounts {
		parts[i] = m.Path + "=" + m.Source.URI
	}
	return strings.Join(parts, ", ")
}

// mountPaths are the folders of ds's spec.mounts, comma-separated.
func mountPaths(ds *datav1alpha1.Dataset) string {
	paths := make([]string, len(ds.Spec.Mounts))
	for i, m := range ds.Spec.Mounts {
		paths[i] = m.Path
	}
	return strings.Join(paths, ",")
}

// inMount says, in front of a message about one store of a Dataset with spec.mounts, which
// mount it is about; nothing for spec.source.
func (s storeRef) inMount() string {
	if s.path == "" {
		return ""
	}
	return fmt.Sprintf("mount /%s (%s): ", s.path, strings.TrimSuffix(s.field, ".source"))
}

// storeOf is the store of ds that err is about: the mount a *understore.MountError names, or
// the only store.
func storeOf(ds *datav1alpha1.Dataset, err error) storeRef {
	refs := datasetStores(ds)
	var me *understore.MountError
	if errors.As(err, &me) {
		for _, r := range refs {
			if r.path == me.Path {
				return r
			}
		}
	}
	return refs[0]
}

// mountAccess is one mount of a Dataset with spec.mounts, with its credentials.
type mountAccess struct {
	path   string
	source understore.Source
}

// openStores opens the stores access reaches: its source, or the Union of its mounts.
func (a *sourceAccess) openStores(ctx context.Context, open func(context.Context, understore.Source) (understore.Store, error)) (understore.Store, error) {
	if len(a.mounts) == 0 {
		return open(ctx, a.source)
	}
	mounted := make([]understore.Mounted, 0, len(a.mounts))
	for _, m := range a.mounts {
		s, err := open(ctx, m.source)
		if err != nil {
			return nil, &understore.MountError{Path: m.path, Err: err}
		}
		mounted = append(mounted, understore.Mounted{Path: m.path, Store: s})
	}
	return understore.NewUnion(mounted)
}

// accessMounts says how the mounts of a Dataset with spec.mounts are reached: each with the
// keys of its Secret. The kubelet hands the CSI plugin one Secret per volume, so the keys of
// every mount's Secret are copied into one the operator keeps beside them (mountsSecretName),
// each under its mount's index, and kept in step with them: a rotated Secret reaches the
// mounts at the next reconcile.
func (r *DatasetReconciler) accessMounts(ctx context.Context, ds *datav1alpha1.Dataset) (*sourceAccess, *problem, error) {
	access := &sourceAccess{}
	combined := map[string][]byte{}
	anySecret := false
	for i, ref := range datasetStores(ds) {
		src := understore.Source{URI: ref.src.URI, Endpoint: ref.src.Endpoint, Region: ref.src.Region, Credentials: map[string]string{}}
		if ref.src.SecretRef != nil {
			anySecret = true
			secret := &corev1.Secret{}
			if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: ref.src.SecretRef.Name}, secret); err != nil {
				return nil, nil, fmt.Errorf("reading Secret %s/%s of %s: %w", ds.Namespace, ref.src.SecretRef.Name, ref.field, err)
			}
			for k, v := range secret.Data {
				src.Credentials[k] = string(v)
				combined[datav1alpha1.MountCredentialKey(i, k)] = v
			}
		}
		access.mounts = append(access.mounts, mountAccess{path: ref.path, source: src})
	}
	if !anySecret {
		return access, nil, nil
	}
	secret, p, err := r.ensureMountsSecret(ctx, ds, combined)
	if p != nil || err != nil {
		return nil, p, err
	}
	access.secretName, access.secretVersion = secret.Name, secret.ResourceVersion
	return access, nil, nil
}

// mountsSecretName is the Secret with the keys of every mount's Secret of a Dataset with
// spec.mounts.
func mountsSecretName(ds *datav1alpha1.Dataset) string {
	return childName(ds, "-mount-credentials")
}

// ensureMountsSecret makes the Secret with the keys of every mount's Secret of ds, or brings it
// in step with data.
func (r *DatasetReconciler) ensureMountsSecret(ctx context.Context, ds *datav1alpha1.Dataset, data map[string][]byte) (*corev1.Secret, *problem, error) {
	name := mountsSecretName(ds)
	secret := &corev1.Secret{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: name}, secret)
	switch {
	case apierrors.IsNotFound(err):
		secret = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ds.Namespace, Labels: datasetLabels(ds)},
			Type:       corev1.SecretTypeOpaque,
			Data:       data,
		}
		_, p, err := r.createOwned(ctx, ds, secret, "Secret")
		if p != nil || err != nil {
			return nil, p, err
		}
		if maps.EqualFunc(secret.Data, data, bytesEqual) {
			return secret, nil, nil
		}
	case err != nil:
		return nil, nil, fmt.Errorf("reading Secret %s/%s: %w", ds.Namespace, name, err)
	default:
		if p := owned(ds, secret, "Secret"); p != nil {
			return nil, p, nil
		}
		if maps.EqualFunc(secret.Data, data, bytesEqual) {
			return secret, nil, nil
		}
	}
	secret.Data = data
	if err := r.Client.Update(ctx, secret); err != nil {
		return nil, nil, fmt.Errorf("updating Secret %s/%s with the keys of the mounts' Secrets: %w", ds.Namespace, name, err)
	}
	return secret, nil, nil
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }
