package authz_test

import (
	"testing"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc"

	"github.com/strata-cache/strata/internal/authz"
	"github.com/strata-cache/strata/internal/pki"
)

var service = grpc.ServiceDesc{
	ServiceName: "test.v1.Things",
	Methods:     []grpc.MethodDesc{{MethodName: "Get"}, {MethodName: "Delete"}},
	Streams:     []grpc.StreamDesc{{StreamName: "Watch"}},
}

func TestCheckFindsWhatThePolicyAndTheServiceDisagreeOn(t *testing.T) {
	all := authz.Policy{
		"/test.v1.Things/Get":    authz.Allow(pki.RoleWorker),
		"/test.v1.Things/Delete": authz.Allow(pki.RoleOperator),
		"/test.v1.Things/Watch":  authz.Allow(pki.RoleWorker),
	}
	cases := map[string]struct {
		policy authz.Policy
		err    string
	}{
		"a policy that names every method, streams included": {policy: all},
		"a method the service gained and no rule names": {
			policy: authz.Policy{"/test.v1.Things/Get": all["/test.v1.Things/Get"], "/test.v1.Things/Watch": all["/test.v1.Things/Watch"]},
			err:    "method /test.v1.Things/Delete is in no rule",
		},
		"a rule for a method the service no longer has": {
			policy: authz.Policy{"/test.v1.Things/Get": {}, "/test.v1.Things/Delete": {}, "/test.v1.Things/Watch": {}, "/test.v1.Things/Gone": {}},
			err:    "names /test.v1.Things/Gone, which no service has",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.policy.Check(service)
			if tc.err == "" {
				NewWithT(t).Expect(err).NotTo(HaveOccurred())
				return
			}
			NewWithT(t).Expect(err).To(MatchError(ContainSubstring(tc.err)))
		})
	}
}
