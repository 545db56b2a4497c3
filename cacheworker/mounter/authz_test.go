package mounter_test

import (
	"testing"

	"github.com/strata-cache/strata/cacheworker/mounter"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

func TestPolicyNamesEveryMethodOfTheMounter(t *testing.T) {
	if err := mounter.Policy.Check(workerpb.Mounter_ServiceDesc); err != nil {
		t.Fatal(err)
	}
}
