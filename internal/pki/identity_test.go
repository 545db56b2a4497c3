package pki

import (
	"net/url"
	"testing"

	. "github.com/onsi/gomega"
)

func TestIdentityURIs(t *testing.T) {
	cases := map[string]struct {
		id   Identity
		uri  string
		self string
	}{
		"the operator names no pod":         {id: Operator(), uri: "spiffe://strata.dev/operator"},
		"a master is its pod, its Raft id":  {id: Master("strata-master-0"), uri: "spiffe://strata.dev/master/strata-master-0", self: "strata-master-0"},
		"a worker is its pool and its node": {id: Worker("fast", "node-a"), uri: "spiffe://strata.dev/worker/fast/node-a", self: "fast/node-a"},
		"a CSI node plugin is its node":     {id: CSINode("node-a"), uri: "spiffe://strata.dev/csi-node/node-a"},
		"a claim server is its namespace and its Service": {
			id: ClaimServer("team-a", "raw-claim-server"), uri: "spiffe://strata.dev/claim-server/team-a/raw-claim-server",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			g.Expect(tc.id.String()).To(Equal(tc.uri))
			g.Expect(tc.id.Self()).To(Equal(tc.self))
			back, err := ParseURI(tc.id.URI())
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(back).To(Equal(tc.id))
		})
	}
}

func TestURIsThatNameNoIdentity(t *testing.T) {
	for name, raw := range map[string]string{
		"another trust domain":                 "spiffe://example.com/operator",
		"another scheme":                       "https://strata.dev/operator",
		"an unknown role":                      "spiffe://strata.dev/admin",
		"a worker without its node":            "spiffe://strata.dev/worker/fast",
		"an operator that names a pod":         "spiffe://strata.dev/operator/x",
		"a name that is no DNS name":           "spiffe://strata.dev/master/Strata_0",
		"a worker with too many parts":         "spiffe://strata.dev/worker/a/b/c",
		"a worker whose name is a path":        "spiffe://strata.dev/worker/fast/..",
		"a claim server without its namespace": "spiffe://strata.dev/claim-server/raw-claim-server",
	} {
		t.Run(name, func(t *testing.T) {
			u, err := url.Parse(raw)
			NewWithT(t).Expect(err).NotTo(HaveOccurred())
			_, err = ParseURI(u)
			NewWithT(t).Expect(err).To(MatchError(ErrNoIdentity))
		})
	}
}
