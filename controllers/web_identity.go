package controllers

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/understore"
)

// Reasons of a Dataset whose web identity cannot be had.
const (
	ReasonServiceAccountNotFound = "ServiceAccountNotFound"
	ReasonWebIdentityUnsafe      = "WebIdentityAudienceUnsafe"
)

const (
	// webIdentityTokenTTL is how long a token the operator asks for lives. The API server
	// refuses less than ten minutes; an hour bounds what a leaked Secret gives away.
	webIdentityTokenTTL = time.Hour
	// webIdentityTokenExpiresKey keeps, beside a token in the Secret the operator keeps, when it
	// expires (RFC 3339), so that the next reconcile knows whether to ask for another. The
	// worker ignores it.
	webIdentityTokenExpiresKey = "webIdentityTokenExpires"
)

// webIdentitySecretName is the Secret the operator keeps the web identity token of a Dataset's
// spec.source in (a Dataset with spec.mounts keeps it in mountsSecretName).
func webIdentitySecretName(ds *datav1alpha1.Dataset) string {
	return childName(ds, "-web-identity")
}

// webIdentityRenewAt is when a token that expires at expires is replaced: with a fifth of its
// life left, which leaves the kubelet (it hands the Secret to the CSI plugin again every minute
// or two) and the workers twelve minutes to take the new one.
func webIdentityRenewAt(expires time.Time) time.Time {
	return expires.Add(-webIdentityTokenTTL / 5)
}

// webIdentityCredentials are the credentials of a store of ds read as ref's web identity: the
// role, the STS endpoint and a token of the ServiceAccount. kept are the store's keys in the
// Secret the operator keeps; their token is used again until its renewal time, then a new one
// is asked for. It returns when to renew, or the problem the user must fix.
func (r *DatasetReconciler) webIdentityCredentials(ctx context.Context, ds *datav1alpha1.Dataset, ref storeRef,
	kept map[string]string, now time.Time,
) (map[string]string, time.Time, *problem, error) {
	w := ref.src.WebIdentity
	creds := map[string]string{understore.CredentialRoleARN: w.RoleARN}
	if w.STSEndpoint != "" {
		creds[understore.CredentialSTSEndpoint] = w.STSEndpoint
	}
	if expires, err := time.Parse(time.RFC3339, kept[webIdentityTokenExpiresKey]); err == nil &&
		kept[understore.CredentialWebIdentityToken] != "" && now.Before(webIdentityRenewAt(expires)) {
		creds[understore.CredentialWebIdentityToken] = kept[understore.CredentialWebIdentityToken]
		creds[webIdentityTokenExpiresKey] = kept[webIdentityTokenExpiresKey]
		return creds, webIdentityRenewAt(expires), nil, nil
	}
	token, expires, p, err := r.requestToken(ctx, ds, ref)
	if p != nil || err != nil {
		return nil, time.Time{}, p, err
	}
	creds[understore.CredentialWebIdentityToken] = token
	creds[webIdentityTokenExpiresKey] = expires.UTC().Format(time.RFC3339)
	return creds, webIdentityRenewAt(expires), nil, nil
}

// requestToken asks the API server for a token of ref's ServiceAccount for its audience, and
// makes sure the API server itself would not take it: a token it accepts is a credential to
// the cluster as the ServiceAccount, which must never land in a Secret that whoever may read
// the namespace's Secrets can read.
func (r *DatasetReconciler) requestToken(ctx context.Context, ds *datav1alpha1.Dataset, ref storeRef) (string, time.Time, *problem, error) {
	w := ref.src.WebIdentity
	audience := w.Audience
	if audience == "" {
		audience = "sts.amazonaws.com" // the API's default, for objects written before it
	}
	ttl := int64(webIdentityTokenTTL / time.Second)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ds.Namespace, Name: w.ServiceAccountName}}
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: []string{audience}, ExpirationSeconds: &ttl,
	}}
	if err := r.Client.SubResource("token").Create(ctx, sa, tr); err != nil {
		if apierrors.IsNotFound(err) {
			return "", time.Time{}, &problem{ReasonServiceAccountNotFound, ref.inMount() + fmt.Sprintf(
				"ServiceAccount %q does not exist in namespace %s: create it (the role %s must trust its tokens), or name another in %s.webIdentity.serviceAccountName",
				w.ServiceAccountName, ds.Namespace, w.RoleARN, ref.field)}, nil
		}
		return "", time.Time{}, nil, fmt.Errorf("asking for a token of ServiceAccount %s/%s for %s: %w", ds.Namespace, w.ServiceAccountName, ref.field, err)
	}
	review := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tr.Status.Token}}
	if err := r.Client.Create(ctx, review); err != nil {
		return "", time.Time{}, nil, fmt.Errorf("checking that the API server refuses the web identity token of %s: %w", ref.field, err)
	}
	if review.Status.Authenticated {
		return "", time.Time{}, &problem{ReasonWebIdentityUnsafe, ref.inMount() + fmt.Sprintf(
			"the API server accepts tokens for the audience %q, so a token kept for %s would let whoever reads it act as ServiceAccount %s in the cluster: set %s.webIdentity.audience to the audience the STS endpoint expects (AWS: sts.amazonaws.com)",
			audience, ref.field, w.ServiceAccountName, ref.field)}, nil
	}
	return tr.Status.Token, tr.Status.ExpirationTimestamp.Time, nil, nil
}
