package blockreport

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/master/masterpb"
)

// blocksAt is a master that knows the blocks of some files (by master path) and one worker.
type blocksAt map[string][]*masterpb.Block

func (blocksAt) ListFiles(context.Context, *masterpb.ListFilesRequest) (*masterpb.ListFilesResponse, error) {
	return nil, errors.New("the master was asked to list a Dataset read from stores, which its workers list")
}

func (b blocksAt) GetBlockLocations(_ context.Context, req *masterpb.GetBlockLocationsRequest) (*masterpb.GetBlockLocationsResponse, error) {
	blocks, ok := b[req.GetPath()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no file %s", req.GetPath())
	}
	return &masterpb.GetBlockLocationsResponse{Blocks: blocks}, nil
}

func (blocksAt) ListWorkers(context.Context, *masterpb.ListWorkersRequest) (*masterpb.ListWorkersResponse, error) {
	return &masterpb.ListWorkersResponse{Workers: []*masterpb.Worker{{Id: "pool/node-a", Node: "node-a"}}}, nil
}

func TestAReportDescribesTheFirstFilesOfATreeOfAnySizeAndCountsThemAll(t *testing.T) {
	g := NewWithT(t)
	const n = 10_000
	var tree []understore.ObjectInfo
	for i := range n {
		tree = append(tree, understore.ObjectInfo{Path: fmt.Sprintf("images/%05d.jpg", i), Size: 100, ETag: "v1"})
	}
	tree = append(tree, understore.ObjectInfo{Path: "labels/all.csv", Size: 7, ETag: "v1"}) // out of the folder
	rand.Shuffle(len(tree), func(i, j int) { tree[i], tree[j] = tree[j], tree[i] })
	master := blocksAt{
		locations.MasterPath("/datasets/team/images/uid/images/00001.jpg", "v1"): {{Size: 64, Locations: []*masterpb.BlockLocation{
			{Worker: "pool/node-a", Tier: "mem"}, {Worker: "pool/gone", Tier: "ssd", Lost: true},
		}}},
	}
	r, err := Build(context.Background(), master, Request{
		Dataset: "team/images", Root: "/datasets/team/images/uid", Dir: "images", BlockSize: 64, MaxFiles: 3,
		Tree: func(_ context.Context, visit func(understore.ObjectInfo)) error {
			for _, o := range tree {
				visit(o)
			}
			return nil
		},
	})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(r.TotalFiles).To(BeEquivalentTo(n))
	g.Expect(r.TotalBytes).To(BeEquivalentTo(n * 100))
	g.Expect(r.Files).To(Equal([]File{
		{Path: "images/00000.jpg", Size: 100, Blocks: 2},
		{Path: "images/00001.jpg", Size: 100, Blocks: 2, CachedBlocks: 1, CachedBytes: 64,
			Copies: []Copy{{Node: "node-a", Tier: "mem", Blocks: 1, Bytes: 64}}},
		{Path: "images/00002.jpg", Size: 100, Blocks: 2},
	}), "the first files in path order, a lost copy left out")
}
