package main

import (
	"testing"

	. "github.com/onsi/gomega"
)

// TestMasterSpecStorageSize: the master's claims are given the size asked for, unless it is not
// a quantity or too small for a replica's Raft log and snapshots, which is said plainly.
func TestMasterSpecStorageSize(t *testing.T) {
	for name, tc := range map[string]struct {
		size    string
		wantErr string
		want    string
	}{
		"none: an emptyDir":    {size: ""},
		"10Gi":                 {size: "10Gi", want: "10Gi"},
		"exactly the smallest": {size: "1Gi", want: "1Gi"},
		"too small":            {size: "100Mi", wantErr: "--master-storage-size=100Mi (master.persistence.size) is too small"},
		"not a quantity":       {size: "ten gigs", wantErr: "is not a quantity such as 10Gi"},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			o := options{namespace: "strata-system"}
			o.master.image, o.master.replicas, o.master.pullPolicy = "strata/master:dev", 3, "IfNotPresent"
			o.master.resourcesJSON, o.master.tolerationsJSON, o.master.storageSize = "{}", "[]", tc.size
			spec, err := o.masterSpec()
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			if tc.want == "" {
				g.Expect(spec.StorageSize.IsZero()).To(BeTrue())
				return
			}
			g.Expect(spec.StorageSize.String()).To(Equal(tc.want))
		})
	}
}
