package fuseconn

import "testing"

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
