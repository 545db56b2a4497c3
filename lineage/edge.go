// Package lineage is Strata's one lineage graph, which the operator and the workers both use: the
// pipeline of a namespace's steps (Lineages) and the Datasets they pass on, with its cycles and
// the stages until each Dataset is read next (Pipeline); the graph of output files and the files
// they were computed from, with how deep its uncheckpointed chains are (Graph); and the Edge
// planner that chooses which file to checkpoint next (Tachyon, §4); and the model that predicts a
// step's run time from the share of its input that is cached (RunTimeModel, Kariz §3.3). Every
// walk of either graph goes through one evaluation (walk.go), which meets a cycle once and never
// loops on it.
package lineage

import (
	"cmp"
	"slices"
	"time"
)

// File is an output file as the planner sees it.
type File struct {
	// ID names the file, such as its path at the master.
	ID string
	// Parents are the IDs of the files it was computed from.
	Parents []string
	// Created orders files: of two leaves, the older is checkpointed first.
	Created time.Time
	// Reads counts how often it was read.
	Reads int
	// Checkpointed: a copy is in the under-store.
	Checkpointed bool
	// Temporary files are never checkpointed by the planner: they are deleted before long, and
	// lineage recovers them meanwhile. (When memory runs short the tier store persists them
	// anyway, rather than drop them.)
	Temporary bool
	// Consumed: a file outside the graph was computed from this one, so it is no leaf. A
	// worker plans over the files it holds, whose children may live on other nodes.
	Consumed bool
}

// Graph is a set of files and their lineage.
type Graph struct {
	files    map[string]*File
	children map[string][]string
}

// NewGraph indexes files. Parents that are not among files are inputs from elsewhere (an
// under-store), always available.
func NewGraph(files []File) *Graph {
	g := &Graph{files: make(map[string]*File, len(files)), children: map[string][]string{}}
	for i := range files {
		f := &files[i]
		g.files[f.ID] = f
	}
	for _, f := range g.files {
		for _, p := range f.Parents {
			if _, ok := g.files[p]; ok {
				g.children[p] = append(g.children[p], f.ID)
			}
		}
	}
	return g
}

// Leaves are the files nothing was computed from yet: the edge of the graph, newest data.
func (g *Graph) Leaves() []*File {
	var out []*File
	for id, f := range g.files {
		if len(g.children[id]) == 0 && !f.Consumed {
			out = append(out, f)
		}
	}
	return out
}

// Depth is the length of the longest chain of uncheckpointed files ending at id: how many
// computations a loss of id could take to recover it. A checkpointed file has depth 0.
func (g *Graph) Depth(id string) int {
	return g.depths().of(id)
}

// MaxDepth is the deepest uncheckpointed chain of the graph.
func (g *Graph) MaxDepth() int {
	depths, deepest := g.depths(), 0
	for id := range g.files {
		deepest = max(deepest, depths.of(id))
	}
	return deepest
}

// depths evaluates Depth. A file met again on its own chain counts 0, as a checkpointed one.
func (g *Graph) depths() *evaluation[int] {
	uncheckpointed := func(id string) (*File, bool) {
		f, ok := g.files[id]
		return f, ok && !f.Checkpointed
	}
	parents := func(id string) []string {
		if f, ok := uncheckpointed(id); ok {
			return f.Parents
		}
		return nil
	}
	depth := func(id string, parents []int) int {
		if _, ok := uncheckpointed(id); !ok {
			return 0
		}
		deepest := 0
		for _, d := range parents {
			deepest = max(deepest, d)
		}
		return deepest + 1
	}
	return newEvaluation(parents, depth, 0)
}

// Kind says why a file was picked.
type Kind int

// The reasons to checkpoint a file.
const (
	// Edge: the file is a leaf of the lineage graph.
	Edge Kind = iota
	// Hot: the file is read more than the hot threshold.
	Hot
)

func (k Kind) String() string {
	if k == Hot {
		return "hot"
	}
	return "edge"
}

// Planner is the Edge algorithm: it checkpoints the leaves of the lineage graph, which bounds
// the recomputation of any file to 3·M/c (M the longest time to compute or checkpoint one
// file, c the edge fraction), and spends the rest of the checkpoint time on hot files, most read
// first. It keeps the time spent on each kind, so that over time the edge gets the fraction c.
type Planner struct {
	// EdgeFraction is c, in (0, 1]; 0 means 1.
	EdgeFraction float64
	// HotReads: a file read more than this many times is hot; 0 means 2.
	HotReads int

	spentEdge, spentHot time.Duration
}

// Next returns the file to checkpoint next and why, or nil when nothing needs one.
func (p *Planner) Next(g *Graph) (*File, Kind) {
	edge := p.edgeCandidate(g)
	hot := p.hotCandidate(g)
	switch {
	case edge == nil && hot == nil:
		return nil, Edge
	case hot == nil:
		return edge, Edge
	case edge == nil:
		return hot, Hot
	}
	c := p.EdgeFraction
	if c <= 0 || c > 1 {
		c = 1
	}
	total := p.spentEdge + p.spentHot
	if total == 0 || float64(p.spentEdge) < c*float64(total) {
		return edge, Edge
	}
	return hot, Hot
}

// Done records that checkpointing a file of kind took d.
func (p *Planner) Done(kind Kind, d time.Duration) {
	if kind == Hot {
		p.spentHot += d
	} else {
		p.spentEdge += d
	}
}

func wanted(f *File) bool { return !f.Checkpointed && !f.Temporary }

// edgeCandidate is the oldest leaf that needs a checkpoint.
func (p *Planner) edgeCandidate(g *Graph) *File {
	var best *File
	for _, f := range g.Leaves() {
		if wanted(f) && (best == nil || older(f, best)) {
			best = f
		}
	}
	return best
}

// hotCandidate is the most read hot file that needs a checkpoint.
func (p *Planner) hotCandidate(g *Graph) *File {
	threshold := p.HotReads
	if threshold <= 0 {
		threshold = 2
	}
	var hot []*File
	for _, f := range g.files {
		if wanted(f) && f.Reads > threshold {
			hot = append(hot, f)
		}
	}
	if len(hot) == 0 {
		return nil
	}
	return slices.MinFunc(hot, func(a, b *File) int {
		if c := cmp.Compare(b.Reads, a.Reads); c != 0 {
			return c
		}
		if older(a, b) {
			return -1
		}
		return 1
	})
}

// older orders files by creation, then by ID, so that choices never depend on map order.
func older(a, b *File) bool {
	if !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	return a.ID < b.ID
}
