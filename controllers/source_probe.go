package controllers

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/objtree"
	"github.com/strata-cache/strata/cacheworker/understore"
)

// Reasons of a Ready condition that the probe of a Dataset's under-store sets.
const (
	ReasonSourceAccessDenied = "SourceAccessDenied"
	ReasonSourceNotFound     = "SourceNotFound"
	ReasonSourceUnreachable  = "SourceUnreachable"
	ReasonSourceEmpty        = "SourceEmpty"
	ReasonSourceNotListable  = "SourceNotListable"
)

// Bounds of a probe. A probe lists the source to tell a user at once what is wrong with it and
// how much it holds; a source larger than maxProbeObjects, or slower to list than
// probeTimeout, is still served, only its size is not counted.
const (
	probeTimeout    = 15 * time.Second
	maxProbeObjects = 100_000
	// sourceRecheck is how often a Dataset whose source failed its probe is probed again: the
	// endpoint may come up, the bucket be created, the credentials be fixed at the store.
	sourceRecheck = time.Minute
	// claimServerRecheck is how often a pvc:// Dataset whose claim server did not answer is
	// probed again: the server is Strata's own, and a Service whose pod just became ready takes
	// a few seconds to route to it.
	claimServerRecheck = 10 * time.Second
	// secretRecheck is how soon a Dataset whose Secret is missing or incomplete is looked at
	// again: Secrets are not watched, so this bounds how long a user waits after fixing one.
	secretRecheck = 10 * time.Second
	// probeReuse is how long a successful probe stands for the same spec and Secret: a Dataset
	// is reconciled on every change of its TierPool, Secret or the CSI driver, and listing its
	// source each time would cost the store as much as the operator.
	probeReuse = 10 * time.Minute
)

// probeMemo remembers successful probes, by Dataset UID.
type probeMemo struct {
	uidMemo[probeRecord]
}

// probeRecord is a successful probe and what it was made with.
type probeRecord struct {
	generation    int64
	secretVersion string
	at            time.Time
	summary       *sourceSummary
	// reachedAt is when the source last answered, its listing or a reachability check.
	reachedAt time.Time
}

// reachCheck is how often a source whose probe stands is checked to answer at all, so that an
// outage shows in the Dataset's status within about that long.
const reachCheck = time.Minute

func (r *DatasetReconciler) reachCheck() time.Duration {
	if r.ReachCheck > 0 {
		return r.ReachCheck
	}
	return reachCheck
}

// reachCheckDue says whether the source of a Dataset whose probe stands is due a check.
func (m *probeMemo) reachCheckDue(uid types.UID, now time.Time, every time.Duration) bool {
	r, ok := m.load(uid)
	return ok && now.Sub(r.reachedAt) >= every
}

// reached records that the source of a Dataset answered.
func (m *probeMemo) reached(uid types.UID, now time.Time) {
	m.update(uid, func(r *probeRecord) { r.reachedAt = now })
}

// firstObject lists the source until its first object: whether it answers at all.
func firstObject(ctx context.Context, store understore.Store) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, err := range store.List(ctx, "") {
		return err
	}
	return nil
}

func (m *probeMemo) get(uid types.UID, generation int64, secretVersion string, now time.Time) (*sourceSummary, bool) {
	r, ok := m.load(uid)
	if !ok || r.generation != generation || r.secretVersion != secretVersion || now.Sub(r.at) > probeReuse {
		return nil, false
	}
	return r.summary, true
}

// sourceSummary is what a probe found under a Dataset's source, arranged as its mounts show it
// (objtree): the files and bytes of the tree, and the objects it leaves out.
type sourceSummary struct {
	files, bytes int64
	leftOut      []objtree.LeftOut
	// complete is false when the listing stopped at a bound before its end.
	complete bool
}

// maxLeftOutNamed is how many of the objects a tree leaves out the status names.
const maxLeftOutNamed = 5

// probeable says whether the operator can list every store of ds: s3:// ones with their
// credentials, http(s):// ones from their directory indexes, and a pvc:// source through its
// claim server. Not file://, which names paths on the nodes.
func probeable(ds *datav1alpha1.Dataset) bool {
	refs := datasetStores(ds)
	for _, ref := range refs {
		if strings.HasPrefix(ref.src.URI, "file://") {
			return false
		}
	}
	return len(refs) > 0
}

// probeSource lists a Dataset's stores, if it can (probeable), as its mounts show them: one
// tree, over every mount of spec.mounts. It returns the problem a user must fix, if any, and
// the summary of a source that answered.
func (r *DatasetReconciler) probeSource(ctx context.Context, ds *datav1alpha1.Dataset, access *sourceAccess) (*problem, *sourceSummary, error) {
	if access == nil || !probeable(ds) {
		return nil, nil, nil
	}
	now := time.Now()
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	open := understore.Open
	if r.OpenSource != nil {
		open = r.OpenSource
	}
	if sum, ok := r.probes.get(ds.UID, ds.Generation, access.secretVersion, now); ok {
		if !r.probes.reachCheckDue(ds.UID, now, r.reachCheck()) {
			return nil, sum, nil
		}
		// The full listing stands, but an outage must show within a minute: one request (per
		// mount).
		store, err := access.openStores(ctx, open)
		if err == nil {
			err = firstObject(ctx, store)
		}
		if err != nil {
			return sourceProblem(ds, err), nil, nil
		}
		r.probes.reached(ds.UID, now)
		return nil, sum, nil
	}
	store, err := access.openStores(ctx, open)
	if err != nil {
		return sourceProblem(ds, err), nil, nil
	}
	sum := &sourceSummary{complete: true}
	tree, listed := objtree.New(), 0
	perMount := map[string]int{}
	for obj, err := range store.List(ctx, "") {
		if err != nil {
			if listed > 0 && ctx.Err() != nil {
				// Slow to list, but it answers: serve it, uncounted.
				sum.complete = false
				break
			}
			return sourceProblem(ds, err), nil, nil
		}
		tree.Add(obj)
		perMount[mountOf(ds, obj.Path)]++
		if listed++; listed >= maxProbeObjects {
			sum.complete = false
			break
		}
	}
	sum.files, sum.bytes, sum.leftOut = int64(tree.Files), tree.Bytes, tree.LeftOut
	if p := emptyStore(ds, store, sum, perMount); p != nil {
		return p, nil, nil
	}
	r.probes.put(ds.UID, probeRecord{generation: ds.Generation, secretVersion: access.secretVersion, at: now, summary: sum, reachedAt: now})
	return nil, sum, nil
}

// sourceProblem says what is wrong with a Dataset's source, or with the mount err names, and
// what to fix.
func sourceProblem(ds *datav1alpha1.Dataset, err error) *problem {
	ref := storeOf(ds, err)
	p := storeProblem(ds, ref, err)
	p.message = ref.inMount() + p.message
	return p
}

func storeProblem(ds *datav1alpha1.Dataset, ref storeRef, err error) *problem {
	src, field := ref.src, ref.field
	secret := fmt.Sprintf("no Secret (%s.secretRef is not set)", field)
	if src.SecretRef != nil {
		secret = fmt.Sprintf("Secret %q", src.SecretRef.Name)
	}
	if strings.HasPrefix(src.URI, "pvc://") {
		// The claim server is Strata's own: what fails here is the claim's content or the network.
		if errors.Is(err, understore.ErrNotFound) {
			return &problem{ReasonSourceNotFound, fmt.Sprintf("%s does not exist in the claim: check %s.uri (%v)", src.URI, field, err)}
		}
		return &problem{ReasonSourceUnreachable, fmt.Sprintf(
			"cannot list %s through its claim server %s: check that pods of this namespace can be reached from Strata's namespace (network policies) (%v)",
			src.URI, claimServerFor(ds, ref).name, err)}
	}
	switch {
	case errors.Is(err, understore.ErrMissingCredentials):
		return &problem{ReasonSecretIncomplete, fmt.Sprintf(
			"%s needs credentials and %s gives none: set %s.secretRef to a Secret with accessKeyID and secretAccessKey (%v)",
			src.URI, secret, field, err)}
	case errors.Is(err, understore.ErrAccessDenied) && src.WebIdentity != nil:
		w := src.WebIdentity
		return &problem{ReasonSourceAccessDenied, fmt.Sprintf(
			"the under-store refuses ServiceAccount %q as role %s: check that the role trusts this cluster's ServiceAccount tokens for the audience %q and the subject system:serviceaccount:%s:%s, and that it may list %s (%v)",
			w.ServiceAccountName, w.RoleARN, w.Audience, ds.Namespace, w.ServiceAccountName, src.URI, err)}
	case errors.Is(err, understore.ErrAccessDenied) && src.SecretRef == nil:
		return &problem{ReasonSourceAccessDenied, fmt.Sprintf(
			"the under-store refuses anonymous access to %s: it is not public, so set %s.secretRef to a Secret with accessKeyID and secretAccessKey that may list it (%v)",
			src.URI, field, err)}
	case errors.Is(err, understore.ErrAccessDenied):
		return &problem{ReasonSourceAccessDenied, fmt.Sprintf(
			"the under-store refuses the credentials of %s: check accessKeyID and secretAccessKey, and that they may list %s (%v)",
			secret, src.URI, err)}
	case errors.Is(err, understore.ErrNotFound):
		return &problem{ReasonSourceNotFound, fmt.Sprintf("%s does not exist: check the bucket in %s.uri (%v)", src.URI, field, err)}
	case errors.Is(err, errors.ErrUnsupported):
		return &problem{ReasonSourceNotListable, fmt.Sprintf(
			"%s cannot be listed: point %s.uri at a folder whose server answers with an HTML directory index, or copy the data to S3 (%v)",
			src.URI, field, err)}
	case errors.Is(err, understore.ErrInvalidPath):
		return &problem{ReasonSourceNotFound, fmt.Sprintf("%s is not usable: %v", field, err)}
	}
	return &problem{ReasonSourceUnreachable, fmt.Sprintf(
		"cannot list %s: check %s.endpoint and that the cluster can reach it (%v)", src.URI, field, err)}
}

// emptyStore is the problem of a listing that found nothing under a store of ds: the whole
// source, or one mount (whose folder would then not even show). listed counts the objects
// listed under each mount's folder; a listing cut short says nothing of the mounts after it.
func emptyStore(ds *datav1alpha1.Dataset, store understore.Store, sum *sourceSummary, listed map[string]int) *problem {
	if sum.files == 0 && len(sum.leftOut) == 0 {
		return &problem{ReasonSourceEmpty, fmt.Sprintf(
			"there are no objects under %s: check the uri of %s (a prefix is a folder: it ends with /)", store, fieldsOf(ds))}
	}
	if !sum.complete {
		return nil
	}
	for _, ref := range datasetStores(ds) {
		if ref.path != "" && listed[ref.path] == 0 {
			return &problem{ReasonSourceEmpty, ref.inMount() + fmt.Sprintf(
				"there are no objects under %s: check %s.uri (a prefix is a folder: it ends with /)", ref.src.URI, ref.field)}
		}
	}
	return nil
}

// fieldsOf names the fields of ds that say what it reads.
func fieldsOf(ds *datav1alpha1.Dataset) string {
	if ds.Spec.Source != nil {
		return "spec.source"
	}
	return "each of spec.mounts"
}

// mountOf is the folder of the mount of ds that holds path: "" for spec.source.
func mountOf(ds *datav1alpha1.Dataset, path string) string {
	for _, m := range ds.Spec.Mounts {
		folder := strings.TrimPrefix(m.Path, "/")
		if strings.HasPrefix(path, folder+"/") {
			return folder
		}
	}
	return ""
}

// ReasonSourceReachable is the reason of a SourceReachable condition that is True.
const ReasonSourceReachable = "SourceReachable"
