package understore

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/internal/miniotest"
)

func TestSTSEndpointDefaults(t *testing.T) {
	cases := map[string]struct {
		given, sourceEndpoint, region string
		want                          string
	}{
		"the one given wins": {"https://sts.example.com", "http://minio:9000", "eu-west-1", "https://sts.example.com"},
		"an S3-compatible server serves STS at its endpoint": {"", "http://minio:9000", "", "http://minio:9000"},
		"AWS in a region uses that region's STS":             {"", "", "eu-west-1", "https://sts.eu-west-1.amazonaws.com"},
		"AWS without a region uses the global STS":           {"", "", "", "https://sts.amazonaws.com"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := stsEndpoint(tc.given, tc.sourceEndpoint, tc.region)
			NewWithT(t).Expect(err).NotTo(HaveOccurred())
			NewWithT(t).Expect(got).To(Equal(tc.want))
		})
	}
}

// TestS3WebIdentityAgainstMinIO reads a bucket as a role that a real MinIO gives for tokens of
// an OpenID provider it trusts, as AWS STS does for a cluster's ServiceAccount tokens.
func TestS3WebIdentityAgainstMinIO(t *testing.T) {
	const (
		issuer   = "https://issuer.test"
		audience = "strata-test-sts"
		subject  = "system:serviceaccount:team-a:reader"
	)
	signer := miniotest.NewTokenSigner(t)
	provider := miniotest.ServeOpenID(t, issuer, signer.JWKS())
	srv := miniotest.Start(t, provider.Env(audience, "readwrite")...)
	srv.MakeBucket(t, "data")
	srv.Put(t, "data", "sets/a.txt", []byte("read as a role"))
	role := miniotest.OpenIDRoleARN(audience)
	ctx := context.Background()

	open := func(t *testing.T, creds map[string]string) Store {
		t.Helper()
		s, err := Open(ctx, Source{URI: "s3://data/sets", Endpoint: "http://" + srv.Endpoint, Credentials: creds})
		NewWithT(t).Expect(err).NotTo(HaveOccurred())
		return s
	}
	identity := func(token, role string) map[string]string {
		return map[string]string{CredentialWebIdentityToken: token, CredentialRoleARN: role}
	}

	// MinIO answers ready before its IAM has loaded the canned policies, and until then refuses
	// every role ("None of the given policies (`readwrite`) are defined"): wait for it to know
	// them, refusals of any other kind ending the wait too (the sub-tests then say what failed).
	NewWithT(t).Eventually(func(g Gomega) {
		_, err := listAll(ctx, open(t, identity(signer.Sign(t, issuer, audience, subject, time.Hour), role)))
		if err != nil {
			g.Expect(err.Error()).NotTo(ContainSubstring("are defined"))
		}
	}).WithTimeout(30*time.Second).WithPolling(50*time.Millisecond).Should(Succeed(), "waiting for MinIO's IAM to load its policies")

	t.Run("a token the provider signed for the audience lists and reads", func(t *testing.T) {
		g := NewWithT(t)
		s := open(t, identity(signer.Sign(t, issuer, audience, subject, time.Hour), role))
		paths, err := listAll(ctx, s)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(paths).To(Equal([]string{"a.txt"}))
		g.Expect(readAll(ctx, s, "a.txt")).To(Equal("read as a role"))
	})

	refused := map[string]struct {
		creds map[string]string
		says  []string
	}{
		"a token for another audience": {
			creds: identity(signer.Sign(t, issuer, "kubernetes", subject, time.Hour), role),
			says:  []string{"assuming role " + role, "trust policy"},
		},
		"an expired token": {
			creds: identity(signer.Sign(t, issuer, audience, subject, -time.Minute), role),
			says:  []string{"assuming role " + role},
		},
		"a token signed by another key": {
			creds: identity(miniotest.NewTokenSigner(t).Sign(t, issuer, audience, subject, time.Hour), role),
			says:  []string{"assuming role " + role},
		},
		"a role the server does not have": {
			creds: identity(signer.Sign(t, issuer, audience, subject, time.Hour), "arn:minio:iam:::role/nobody"),
			says:  []string{"assuming role arn:minio:iam:::role/nobody"},
		},
	}
	for name, tc := range refused {
		t.Run(name+" is refused, naming the role", func(t *testing.T) {
			g := NewWithT(t)
			_, err := open(t, tc.creds).Stat(ctx, "a.txt")
			g.Expect(err).To(MatchError(ErrAccessDenied))
			for _, m := range tc.says {
				g.Expect(err.Error()).To(ContainSubstring(m))
			}
		})
	}

	t.Run("an STS endpoint that does not answer is unreachable, not refused", func(t *testing.T) {
		g := NewWithT(t)
		creds := identity(signer.Sign(t, issuer, audience, subject, time.Hour), role)
		creds[CredentialSTSEndpoint] = "http://" + miniotest.ClosedAddr(t)
		_, err := open(t, creds).Stat(ctx, "a.txt")
		g.Expect(err).To(MatchError(ErrUnreachable))
		g.Expect(err.Error()).To(ContainSubstring("STS endpoint is right and reachable"))
	})
}
