package checkpoint

import (
	"maps"
	"math"
	"slices"
	"time"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/lineage"
)

// pick is the file the background loop checkpoints next, and why.
type pick struct {
	file   *heldFile
	reason string
	// planner chose it (an Edge Dataset's), and is told how long it took.
	planner *lineage.Planner
	kind    lineage.Kind
}

// plan picks the file to checkpoint next among files, none of which has a checkpoint yet: first
// a file of an Interval Dataset whose tick has come, oldest first; then, each CachePolicy in
// turn, what its Edge planner picks among the files of its Edge Datasets (the oldest leaf of the
// lineage graph, or the most read hot file, so that the leaves get the policy's edge fraction of
// the time). Temporary files and Datasets of strategy None are never picked. Nil means nothing
// is due.
func (c *Checkpointer) plan(files []*heldFile, now time.Time) *pick {
	var due *heldFile
	edge := map[string][]*heldFile{}
	for _, f := range files {
		if f.ds.isTemporary(f.path) {
			continue
		}
		switch f.ds.Strategy {
		case datav1alpha1.CheckpointInterval:
			if !now.Before(f.ds.due(f.created)) && (due == nil || f.created.Before(due.created)) {
				due = f
			}
		case datav1alpha1.CheckpointEdge:
			edge[f.ds.CachePolicy] = append(edge[f.ds.CachePolicy], f)
		}
	}
	if due != nil {
		return &pick{file: due, reason: reasonInterval}
	}
	policies := slices.Sorted(maps.Keys(edge))
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range policies {
		turn := (c.turn + i) % len(policies)
		group := edge[policies[turn]]
		planner := c.plannerLocked(policies[turn], group[0].ds)
		byID := make(map[string]*heldFile, len(group))
		graph := make([]lineage.File, 0, len(group))
		for _, f := range group {
			byID[f.path] = f
			graph = append(graph, lineage.File{
				ID: f.path, Created: f.created, Reads: int(min(f.reads, math.MaxInt32)), Consumed: f.ds.Consumed,
			})
		}
		if f, kind := planner.Next(lineage.NewGraph(graph)); f != nil {
			c.turn = turn + 1
			reason := reasonEdge
			if kind == lineage.Hot {
				reason = reasonHot
			}
			return &pick{file: byID[f.ID], reason: reason, planner: planner, kind: kind}
		}
	}
	return nil
}

// plannerLocked is the Edge planner of a CachePolicy, its settings those of d (every Dataset
// of a policy has the same), keeping the time it has spent on each kind. c.mu is held.
func (c *Checkpointer) plannerLocked(policy string, d *dataset) *lineage.Planner {
	p := c.planners[policy]
	if p == nil {
		p = &lineage.Planner{}
		c.planners[policy] = p
	}
	p.EdgeFraction, p.HotReads = d.EdgeFraction, d.HotReads
	return p
}
