package fuseconn

import (
	"os"
	"reflect"
	"testing"
)

func TestFitsCountsASlotPerPageAndOneForTheHeader(t *testing.T) {
	const page = pageSize
	for name, tc := range map[string]struct {
		ranges []FileRange
		want   bool
	}{
		"a whole request, page-aligned":          {[]FileRange{{Off: 0, Len: MaxReadRequest}}, true},
		"a whole request across two blocks":      {[]FileRange{{Off: 60 * page, Len: 4 * page}, {Off: 0, Len: MaxReadRequest - 4*page}}, true},
		"a whole request, not page-aligned":      {[]FileRange{{Off: 100, Len: MaxReadRequest}}, false},
		"a MaxRead request (an older mount's)":   {[]FileRange{{Off: 0, Len: MaxRead}}, false},
		"a small read inside a page":             {[]FileRange{{Off: 10, Len: 100}}, true},
		"a small read across a page boundary":    {[]FileRange{{Off: page - 1, Len: 2}}, true},
		"many small ranges each on its own page": {ranges(255, 1), true},
		"one range too many":                     {ranges(256, 1), false},
	} {
		t.Run(name, func(t *testing.T) {
			if got := fits(tc.ranges); got != tc.want {
				t.Errorf("fits = %v, want %v", got, tc.want)
			}
		})
	}
}

func ranges(n, length int) []FileRange {
	out := make([]FileRange, n)
	for i := range out {
		out[i] = FileRange{Off: int64(i) * pageSize, Len: length}
	}
	return out
}

func TestBlockRangesCutsAReadAtTheBlocksEdges(t *testing.T) {
	var files []*os.File
	for range 3 {
		f, err := os.CreateTemp(t.TempDir(), "block-")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		files = append(files, f)
	}
	local := func(missing int64) func(int64) (*os.File, bool) {
		return func(index int64) (*os.File, bool) {
			if index == missing || index >= int64(len(files)) {
				return nil, false
			}
			return files[index], true
		}
	}
	for name, tc := range map[string]struct {
		off, end int64
		missing  int64
		want     []FileRange
		ok       bool
	}{
		"inside a block":          {off: 12, end: 20, missing: -1, ok: true, want: []FileRange{{files[1], 2, 8}}},
		"across two blocks":       {off: 7, end: 13, missing: -1, ok: true, want: []FileRange{{files[0], 7, 3}, {files[1], 0, 3}}},
		"three whole blocks":      {off: 0, end: 30, missing: -1, ok: true, want: []FileRange{{files[0], 0, 10}, {files[1], 0, 10}, {files[2], 0, 10}}},
		"a block not local":       {off: 5, end: 25, missing: 1},
		"the last block not here": {off: 25, end: 35, missing: -1},
	} {
		t.Run(name, func(t *testing.T) {
			got, ok := BlockRanges(tc.off, tc.end, 10, local(tc.missing))
			if ok != tc.ok || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("BlockRanges(%d, %d) = %v, %v; want %v, %v", tc.off, tc.end, got, ok, tc.want, tc.ok)
			}
		})
	}
}
