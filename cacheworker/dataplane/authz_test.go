package dataplane_test

import (
	"testing"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/authz"
)

func TestPolicyNamesEveryMethodOfTheDataPlane(t *testing.T) {
	g := NewWithT(t)
	g.Expect(dataplane.Policy.Missing(workerpb.Worker_ServiceDesc)).To(BeEmpty(),
		"a method of the Worker service is in no rule of dataplane.Policy: say who may call it")
	g.Expect(authz.Methods(workerpb.Worker_ServiceDesc)).To(HaveLen(len(dataplane.Policy)))
}
