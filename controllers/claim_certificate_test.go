package controllers

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"

	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
)

func TestAClaimServerCertificateIsRenewedWhenItMustBe(t *testing.T) {
	ca, other := pkitest.New(t), pkitest.New(t)
	r := &DatasetReconciler{ClaimServerTLS: &ClaimServerTLS{CA: ca.CA}}
	leaf := pki.Leaf{
		Identity: pki.ClaimServer("team-a", "raw-claim-server"),
		DNSNames: []string{"raw-claim-server.team-a.svc"},
		Validity: claimCertificateValidity,
	}
	issued := time.Now()
	fresh, err := r.claimCertificate(leaf)
	if err != nil {
		t.Fatal(err)
	}
	with := func(change func(data map[string][]byte)) *corev1.Secret {
		data := map[string][]byte{}
		for k, v := range fresh {
			data[k] = v
		}
		change(data)
		return &corev1.Secret{Data: data}
	}
	// Of another CA, for the same Service: only the signature tells it apart.
	otherCert, otherKey, err := other.CA.IssueKeyPair(leaf, issued)
	if err != nil {
		t.Fatal(err)
	}
	otherName := leaf
	otherName.Identity = pki.ClaimServer("team-b", "raw-claim-server")
	wrongName, err := (&DatasetReconciler{ClaimServerTLS: &ClaimServerTLS{CA: ca.CA}}).claimCertificate(otherName)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		secret *corev1.Secret
		now    time.Time
		why    string
	}{
		"a fresh certificate is kept until two thirds of its life": {secret: with(func(map[string][]byte) {}), now: issued},
		"one two thirds through its life is renewed": {
			secret: with(func(map[string][]byte) {}), now: issued.Add(claimCertificateValidity * 2 / 3).Add(time.Hour), why: "expires",
		},
		"one of another CA is renewed": {
			secret: with(func(d map[string][]byte) { d[corev1.TLSCertKey], d[corev1.TLSPrivateKeyKey] = otherCert, otherKey }),
			now:    issued, why: "not valid from Strata's CA",
		},
		"a Secret that names another CA is renewed": {
			secret: with(func(d map[string][]byte) { d[caCertKey] = other.CA.CertPEM }), now: issued, why: "CA",
		},
		"one for another claim server is renewed": {
			secret: with(func(d map[string][]byte) {
				d[corev1.TLSCertKey], d[corev1.TLSPrivateKeyKey] = wrongName[corev1.TLSCertKey], wrongName[corev1.TLSPrivateKeyKey]
			}),
			now: issued, why: "not for the claim server",
		},
		"a key that does not go with the certificate is renewed": {
			secret: with(func(d map[string][]byte) { d[corev1.TLSPrivateKeyKey] = otherKey }), now: issued, why: "key does not go",
		},
		"an empty Secret is filled": {secret: &corev1.Secret{}, now: issued, why: "CA"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			renewAt, why := r.claimCertificateRenewal(tc.secret, leaf, tc.now)
			if tc.why == "" {
				g.Expect(why).To(BeEmpty())
				g.Expect(renewAt).To(BeTemporally("~", issued.Add(claimCertificateValidity*2/3), time.Hour))
				return
			}
			g.Expect(why).To(ContainSubstring(tc.why))
		})
	}
}
