package controllers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

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
	// index is the mount's in spec.mounts; -1 for spec.source.
	index int
	src   datav1alpha1.DatasetSource
}

// datasetStores are the under-stores ds reads; none for an output.
func datasetStores(ds *datav1alpha1.Dataset) []storeRef {
	if ds.Spec.Source != nil {
		return []storeRef{{field: "spec.source", index: -1, src: *ds.Spec.Source}}
	}
	refs := make([]storeRef, len(ds.Spec.Mounts))
	for i, m := range ds.Spec.Mounts {
		refs[i] = storeRef{path: strings.TrimPrefix(m.Path, "/"), field: fmt.Sprintf("spec.mounts[%d].source", i), index: i, src: m.Source}
	}
	return refs
}

// readsClaims says whether a store of ds is a claim, read through a claim server.
func readsClaims(ds *datav1alpha1.Dataset) bool {
	for _, ref := range datasetStores(ds) {
		if strings.HasPrefix(ref.src.URI, "pvc://") {
			return true
		}
	}
	return false
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
// keys of its Secret, or the credentials of its web identity. The kubelet hands the CSI plugin
// one Secret per volume, so these are kept in one Secret beside the mounts' (mountsSecretName),
// each under its mount's index, and kept in step with them: a rotated Secret, or a renewed
// token, reaches the mounts at the next reconcile.
func (r *DatasetReconciler) accessMounts(ctx context.Context, ds *datav1alpha1.Dataset) (*sourceAccess, *problem, error) {
	access := &sourceAccess{}
	name := mountsSecretName(ds)
	kept, err := r.keptSecret(ctx, ds, name)
	if err != nil {
		return nil, nil, err
	}
	combined := map[string][]byte{}
	for i, ref := range datasetStores(ds) {
		src := understore.Source{URI: ref.src.URI, Endpoint: ref.src.Endpoint, Region: ref.src.Region, Credentials: map[string]string{}}
		switch {
		case strings.HasPrefix(ref.src.URI, "pvc://"):
			_, renewAt, p, err := r.ensureClaimServer(ctx, ds, claimServerFor(ds, ref), &src)
			if p != nil || err != nil {
				return nil, p, err
			}
			access.renewBy(renewAt)
		case ref.src.WebIdentity != nil:
			creds, renewAt, p, err := r.webIdentityCredentials(ctx, ds, ref, datav1alpha1.MountCredentials(stringData(kept), i), time.Now())
			if p != nil || err != nil {
				return nil, p, err
			}
			src.Credentials = creds
			access.renewBy(renewAt)
		case ref.src.SecretRef != nil:
			secret := &corev1.Secret{}
			if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: ref.src.SecretRef.Name}, secret); err != nil {
				return nil, nil, fmt.Errorf("reading Secret %s/%s of %s: %w", ds.Namespace, ref.src.SecretRef.Name, ref.field, err)
			}
			for k, v := range secret.Data {
				src.Credentials[k] = string(v)
			}
		}
		for k, v := range src.Credentials {
			combined[datav1alpha1.MountCredentialKey(i, k)] = []byte(v)
		}
		access.mounts = append(access.mounts, mountAccess{path: ref.path, source: src})
	}
	if len(combined) == 0 {
		return access, nil, nil
	}
	secret, p, err := r.ensureKeptSecret(ctx, ds, name, kept, combined)
	if p != nil || err != nil {
		return nil, p, err
	}
	access.secretName, access.secretVersion = secret.Name, secret.ResourceVersion
	return access, nil, nil
}

// renewBy makes access due to be looked at again at t at the latest: a claim server's
// certificate or a web identity token is to be renewed then.
func (a *sourceAccess) renewBy(t time.Time) {
	if a.renewAt.IsZero() || t.Before(a.renewAt) {
		a.renewAt = t
	}
}

// volumeMounts are the mounts of access as the Dataset's volume names them: each with the
// endpoint it is reached at (a claim server's, for a pvc:// one), without credentials.
func (a *sourceAccess) volumeMounts() []datav1alpha1.VolumeMount {
	out := make([]datav1alpha1.VolumeMount, len(a.mounts))
	for i, m := range a.mounts {
		out[i] = datav1alpha1.VolumeMount{Path: "/" + m.path, URI: m.source.URI, Endpoint: m.source.Endpoint, Region: m.source.Region}
	}
	return out
}

// mountsSecretName is the Secret with the keys of every mount's Secret of a Dataset with
// spec.mounts.
func mountsSecretName(ds *datav1alpha1.Dataset) string {
	return childName(ds, "-mount-credentials")
}

// keptSecret reads the Secret name of ds's namespace that the operator keeps credentials in
// for ds; nil if there is none yet.
func (r *DatasetReconciler) keptSecret(ctx context.Context, ds *datav1alpha1.Dataset, name string) (*corev1.Secret, error) {
	secret := &corev1.Secret{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: name}, secret)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading Secret %s/%s: %w", ds.Namespace, name, err)
	}
	return secret, nil
}

// ensureKeptSecret makes the Secret name, owned by ds, that holds data, or brings kept (the
// Secret as read, nil if none) in step with data.
func (r *DatasetReconciler) ensureKeptSecret(ctx context.Context, ds *datav1alpha1.Dataset, name string, kept *corev1.Secret, data map[string][]byte) (*corev1.Secret, *problem, error) {
	if kept == nil {
		secret := &corev1.Secret{
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
		kept = secret
	} else if p := owned(ds, kept, "Secret"); p != nil {
		return nil, p, nil
	}
	if maps.EqualFunc(kept.Data, data, bytesEqual) {
		return kept, nil, nil
	}
	kept.Data = data
	if err := r.Client.Update(ctx, kept); err != nil {
		return nil, nil, fmt.Errorf("updating Secret %s/%s with the credentials of %s: %w", ds.Namespace, name, describeStores(ds), err)
	}
	return kept, nil, nil
}

// stringData is a Secret's data as strings; none for no Secret.
func stringData(secret *corev1.Secret) map[string]string {
	if secret == nil {
		return nil
	}
	out := make(map[string]string, len(secret.Data))
	for k, v := range secret.Data {
		out[k] = string(v)
	}
	return out
}

func bytesEqual(a, b []byte) bool { return string(a) == string(b) }
