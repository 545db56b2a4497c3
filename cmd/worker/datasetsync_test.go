package main

import (
	"context"
	"testing"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// mountsOf answers for a worker that mounts the Datasets of uids.
type mountsOf struct {
	noMounts
	uids []string
}

func (m mountsOf) Mounted(uid string) bool {
	for _, u := range m.uids {
		if u == uid {
			return true
		}
	}
	return false
}

func (m mountsOf) DescribeDataset(_ context.Context, req *workerpb.DescribeDatasetRequest) (*workerpb.DescribeDatasetResponse, error) {
	return &workerpb.DescribeDatasetResponse{Mounted: m.Mounted(req.GetUid()), Files: 1}, nil
}

// TestTheSyncServiceWaitsForTheMountsToBeTakenOver: until the mounter has taken over what an
// earlier worker left, syncs and descriptions are UNAVAILABLE (the operator asks again) and no
// Dataset counts as mounted, so that no peer takes this node's listing for a mount's tree.
func TestTheSyncServiceWaitsForTheMountsToBeTakenOver(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	d := &datasetSync{}
	_, err := d.SyncDataset(ctx, &workerpb.SyncDatasetRequest{Uid: "u"})
	g.Expect(status.Code(err)).To(Equal(codes.Unavailable))
	_, err = d.DescribeDataset(ctx, &workerpb.DescribeDatasetRequest{Uid: "u"})
	g.Expect(status.Code(err)).To(Equal(codes.Unavailable))
	g.Expect(d.Mounted("u")).To(BeFalse())

	d.serve(mountsOf{uids: []string{"u"}})
	resp, err := d.DescribeDataset(ctx, &workerpb.DescribeDatasetRequest{Uid: "u"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetMounted()).To(BeTrue())
	g.Expect(d.Mounted("u")).To(BeTrue())
	g.Expect(d.Mounted("other")).To(BeFalse())

	d.serve(noMounts{})
	resp, err = d.DescribeDataset(ctx, &workerpb.DescribeDatasetRequest{Uid: "u"})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(resp.GetMounted()).To(BeFalse(), "a worker without mounts mounts nothing")
	g.Expect(d.Mounted("u")).To(BeFalse())
}
