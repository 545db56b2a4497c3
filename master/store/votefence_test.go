package store

import (
	"testing"

	"github.com/go-logr/logr"
	"github.com/hashicorp/raft"
)

// TestVoteFenceFloor: a fence refuses every term until a floor is known, then the terms up to
// the highest floor reported; an open fence refuses none, whatever is reported after.
func TestVoteFenceFloor(t *testing.T) {
	for name, tc := range map[string]struct {
		open    bool
		floors  []uint64
		refused map[uint64]bool
	}{
		"no floor yet":                          {refused: map[uint64]bool{1: true, 1000: true}},
		"one floor":                             {floors: []uint64{7}, refused: map[uint64]bool{6: true, 7: true, 8: false}},
		"a lower floor after":                   {floors: []uint64{7, 3}, refused: map[uint64]bool{7: true, 8: false}},
		"open, then a floor":                    {open: true, floors: []uint64{7}, refused: map[uint64]bool{1: false, 7: false}},
		"a floor of 0 (peers that never voted)": {floors: []uint64{0}, refused: map[uint64]bool{1: false}},
	} {
		t.Run(name, func(t *testing.T) {
			_, trans := raft.NewInmemTransport("a")
			f := newVoteFence(trans, logr.Discard())
			defer func() { _ = f.Close() }()
			if tc.open {
				f.Open()
			}
			for _, floor := range tc.floors {
				f.Floor(floor)
			}
			for term, want := range tc.refused {
				if got := f.refuses(term); got != want {
					t.Errorf("term %d refused %v, want %v", term, got, want)
				}
			}
		})
	}
}
