package lineage

import (
	"testing"
	"time"
)

func at(s int) time.Time { return time.Unix(int64(s), 0) }

// chain is a → b → c, each computed from the one before, plus a hot file h read by many.
func chain() []File {
	return []File{
		{ID: "a", Created: at(1)},
		{ID: "b", Parents: []string{"a"}, Created: at(2)},
		{ID: "c", Parents: []string{"b"}, Created: at(3)},
		{ID: "h", Created: at(0), Reads: 7},
		{ID: "h2", Parents: []string{"h"}, Created: at(4)},
	}
}

func TestPlannerPicksTheEdgeThenHotFiles(t *testing.T) {
	cases := map[string]struct {
		files    func() []File
		planner  Planner
		spent    map[Kind]time.Duration
		want     string
		wantKind Kind
	}{
		"the oldest leaf first": {
			files: chain, want: "c", wantKind: Edge,
		},
		"a file consumed outside the graph is no leaf": {
			files: func() []File { f := chain(); f[2].Consumed = true; return f },
			want:  "h2", wantKind: Edge,
		},
		"a checkpointed leaf leaves the next leaf": {
			files: func() []File { f := chain(); f[2].Checkpointed = true; return f },
			want:  "h2", wantKind: Edge,
		},
		"temporary files are never picked": {
			files: func() []File { f := chain(); f[2].Temporary, f[4].Temporary = true, true; return f },
			want:  "h", wantKind: Hot,
		},
		"the edge gets its fraction of the time, hot files the rest": {
			files: chain, planner: Planner{EdgeFraction: 0.5},
			spent: map[Kind]time.Duration{Edge: time.Minute}, want: "h", wantKind: Hot,
		},
		"below its fraction the edge goes first": {
			files: chain, planner: Planner{EdgeFraction: 0.5},
			spent: map[Kind]time.Duration{Edge: time.Minute, Hot: 2 * time.Minute}, want: "c", wantKind: Edge,
		},
		"a file read twice is not hot": {
			files: func() []File {
				f := chain()
				f[3].Reads = 2
				f[2].Checkpointed, f[4].Checkpointed = true, true
				return f
			},
			want: "",
		},
		"the hot threshold is configurable": {
			files: func() []File {
				f := chain()
				f[3].Reads = 2
				f[2].Checkpointed, f[4].Checkpointed = true, true
				return f
			},
			planner: Planner{HotReads: 1}, want: "h", wantKind: Hot,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := tc.planner
			for k, d := range tc.spent {
				p.Done(k, d)
			}
			f, kind := p.Next(NewGraph(tc.files()))
			got := ""
			if f != nil {
				got = f.ID
			}
			if got != tc.want || (f != nil && kind != tc.wantKind) {
				t.Fatalf("Next = %q (%s), want %q (%s)", got, kind, tc.want, tc.wantKind)
			}
		})
	}
}

func TestDepthCountsTheUncheckpointedChain(t *testing.T) {
	files := chain()
	g := NewGraph(files)
	if d := g.Depth("c"); d != 3 {
		t.Fatalf("depth of c = %d, want 3 (a, b and c would be recomputed)", d)
	}
	files[0].Checkpointed = true
	g = NewGraph(files)
	if d := g.Depth("c"); d != 2 {
		t.Fatalf("depth of c with a checkpointed = %d, want 2", d)
	}
	if d := g.MaxDepth(); d != 2 {
		t.Fatalf("max depth = %d, want 2", d)
	}
	cyclic := NewGraph([]File{{ID: "x", Parents: []string{"y"}}, {ID: "y", Parents: []string{"x"}}})
	if d := cyclic.Depth("x"); d != 2 {
		t.Fatalf("depth in a cycle = %d, want 2 without looping", d)
	}
}
