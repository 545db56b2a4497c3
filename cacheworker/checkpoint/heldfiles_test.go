package checkpoint

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// heldFiles looks at the blocks not clean only, and finds the clean blocks of a file to
// checkpoint by their ids: a file is found whole whichever of its blocks are clean, and a file
// checkpointed (every block clean) is not looked at at all.
func TestHeldFilesFindsAFileWholeFromItsBlocksNotClean(t *testing.T) {
	settings := settingsOf(t, Dataset{Name: "ns/kept/u1", Root: "/strata/ns/kept", Strategy: "Edge", Target: Target{URI: "s3://bucket/kept"}})
	for _, tc := range []struct {
		name    string
		dataset string
		clean   []int64 // the file's blocks that are clean
		missing []int64 // the file's blocks this node does not hold
		want    []int64 // the blocks of the file found, none if it is not listed
		pending int64
	}{
		{name: "no block clean", dataset: "ns/kept/u1", want: []int64{0, 1, 2}, pending: 3},
		{name: "the first block clean (a round that marked it stopped there)", dataset: "ns/kept/u1", clean: []int64{0}, want: []int64{0, 1, 2}, pending: 2},
		{name: "the middle block clean", dataset: "ns/kept/u1", clean: []int64{1}, want: []int64{0, 1, 2}, pending: 2},
		{name: "every block clean (checkpointed)", dataset: "ns/kept/u1", clean: []int64{0, 1, 2}},
		{name: "copies of the last two blocks only", dataset: "ns/kept/u1", missing: []int64{0}, want: []int64{1, 2}, pending: 2},
		{name: "a Dataset not checkpointed", dataset: "ns/scratch/u2", pending: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := &fakeBlocks{byID: map[string]tierstore.BlockInfo{}}
			// Cached copies of sources: clean, and never looked at.
			for i := range 100 {
				store.byID[fmt.Sprintf("cached-%d", i)] = tierstore.BlockInfo{ID: fmt.Sprintf("cached-%d", i), Clean: true, Size: 1}
			}
			const token = "0123456789abcdef0123456789abcdef"
			for index := range int64(3) {
				if slices.Contains(tc.missing, index) {
					continue
				}
				origin, err := proto.Marshal(&workerpb.BlockOrigin{Path: "/strata/x/part-0", Dataset: tc.dataset, Index: index, FileToken: token})
				if err != nil {
					t.Fatal(err)
				}
				id := blockindex.OutputBlockID(token, index)
				store.byID[id] = tierstore.BlockInfo{ID: id, Size: 1, Origin: origin, Clean: slices.Contains(tc.clean, index)}
			}

			files, pending := heldFiles(store, settings)

			if pending != tc.pending {
				t.Errorf("pending = %d bytes, want %d", pending, tc.pending)
			}
			var got []int64
			if len(files) > 1 {
				t.Fatalf("found %d files, want at most 1", len(files))
			}
			if len(files) == 1 {
				got = files[0].indexes
				for i, b := range files[0].blocks {
					if b.ID != blockindex.OutputBlockID(token, got[i]) {
						t.Errorf("block %d of the file is %s", got[i], b.ID)
					}
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("the file's blocks found = %v, want %v", got, tc.want)
			}
			if store.cachedLookedAt {
				t.Error("a cached block was looked at")
			}
		})
	}
}

// fakeBlocks is a tier store of blocks described only: what heldFiles reads.
type fakeBlocks struct {
	Blocks
	byID           map[string]tierstore.BlockInfo
	cachedLookedAt bool
}

func (s *fakeBlocks) UncleanBlocks() []tierstore.BlockInfo {
	var out []tierstore.BlockInfo
	for _, b := range s.byID {
		if !b.Clean {
			out = append(out, b)
		}
	}
	slices.SortFunc(out, func(a, b tierstore.BlockInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (s *fakeBlocks) Info(id string) (tierstore.BlockInfo, error) {
	b, ok := s.byID[id]
	if !ok {
		return tierstore.BlockInfo{}, tierstore.ErrNotFound
	}
	if len(b.Origin) == 0 {
		s.cachedLookedAt = true
	}
	return b, nil
}

// settingsOf are the settings of datasets, as the operator writes and the worker parses them.
func settingsOf(tb testing.TB, datasets ...Dataset) *Settings {
	tb.Helper()
	raw, err := json.Marshal(File{Datasets: datasets})
	if err != nil {
		tb.Fatal(err)
	}
	settings, err := Parse(raw)
	if err != nil {
		tb.Fatal(err)
	}
	return settings
}
