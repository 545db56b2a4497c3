package mounter_test

import (
	"testing"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/cacheworker/mounter"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/authz"
)

func TestPolicyNamesEveryMethodOfTheMounter(t *testing.T) {
	g := NewWithT(t)
	g.Expect(mounter.Policy.Missing(workerpb.Mounter_ServiceDesc)).To(BeEmpty(),
		"a method of the Mounter service is in no rule of mounter.Policy: say who may call it")
	g.Expect(authz.Methods(workerpb.Mounter_ServiceDesc)).To(HaveLen(len(mounter.Policy)))
}
