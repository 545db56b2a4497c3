package dataplane_test

import (
	"testing"

	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

func TestPolicyNamesEveryMethodOfTheDataPlane(t *testing.T) {
	if err := dataplane.Policy.Check(workerpb.Worker_ServiceDesc, workerpb.DatasetSync_ServiceDesc); err != nil {
		t.Fatal(err)
	}
}
