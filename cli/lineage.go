package cli

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/humanize"
	"github.com/strata-cache/strata/lineage"
)

// Lineage shows the pipeline of the namespace: its Lineages in the order they run (the level
// is how many steps stand before each on its longest chain of producers), how long each ran
// last and is predicted to run now, what each reads (and from which Lineage) and writes, and
// the state of each output.
func (c *CLI) Lineage(ctx context.Context) error {
	list := &datav1alpha1.LineageList{}
	if err := c.Client.List(ctx, list, client.InNamespace(c.Namespace)); err != nil {
		return fmt.Errorf("listing the Lineages of namespace %s: %w", c.Namespace, err)
	}
	if len(list.Items) == 0 {
		c.printf("no Lineage in namespace %s\n", c.Namespace)
		return nil
	}
	datasets := &datav1alpha1.DatasetList{}
	if err := c.Client.List(ctx, datasets, client.InNamespace(c.Namespace)); err != nil {
		return fmt.Errorf("listing the Datasets of namespace %s: %w", c.Namespace, err)
	}
	byName := map[string]*datav1alpha1.Dataset{}
	for i := range datasets.Items {
		byName[datasets.Items[i].Name] = &datasets.Items[i]
	}
	steps := make([]lineage.Step, 0, len(list.Items))
	for _, l := range list.Items {
		steps = append(steps, lineage.Step{Name: l.Name, Inputs: l.Spec.Inputs, Outputs: l.Spec.Outputs})
	}
	pipeline := lineage.NewPipeline(steps)
	levels := pipeline.Levels()
	items := slices.Clone(list.Items)
	slices.SortStableFunc(items, func(a, b datav1alpha1.Lineage) int {
		la, lb := levels[a.Name], levels[b.Name]
		if la == lineage.LevelCycle || lb == lineage.LevelCycle {
			// Steps caught in a cycle go last.
			return boolOrder(la == lineage.LevelCycle, lb == lineage.LevelCycle)
		}
		return la - lb
	})

	tw := c.table()
	tw.printf("LEVEL\tLINEAGE\tSTATE\tLAST RUN\tPREDICTED\tREADS\tWRITES\n")
	for _, l := range items {
		level := fmt.Sprint(levels[l.Name])
		if levels[l.Name] == lineage.LevelCycle {
			level = "cycle"
		}
		last, predicted := runTimes(&l)
		tw.printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\n", level, l.Name, lineageState(&l), last, predicted,
			reads(pipeline, l.Spec.Inputs), writes(&l, byName))
	}
	if err := tw.flush(); err != nil {
		return err
	}
	for _, l := range items {
		if levels[l.Name] != lineage.LevelCycle {
			continue
		}
		if cycle := pipeline.Cycle(l.Name); cycle != nil {
			c.printf("%s is on a cycle (%s): none of it runs until one of them reads something else\n",
				l.Name, strings.Join(cycle, " <- "))
		}
	}
	return nil
}

func boolOrder(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// lineageState is the reason of a Lineage's Ready condition, and the recomputation that runs.
func lineageState(l *datav1alpha1.Lineage) string {
	state := "-"
	if ready := meta.FindStatusCondition(l.Status.Conditions, datav1alpha1.ConditionReady); ready != nil {
		state = ready.Reason
	}
	if r := l.Status.ActiveRecomputation; r != nil {
		state += " (recomputing: job/" + r.JobName + ")"
	}
	return state
}

// runTimes are how long a Lineage's last run took and the run time it predicts now, "-" for
// what it does not know yet.
func runTimes(l *datav1alpha1.Lineage) (last, predicted string) {
	last, predicted = "-", "-"
	rt := l.Status.RunTime
	if rt == nil {
		return last, predicted
	}
	if n := len(rt.Runs); n > 0 {
		last = (time.Duration(rt.Runs[n-1].Milliseconds) * time.Millisecond).Round(time.Second).String()
	}
	if rt.Predicted != "" {
		predicted = rt.Predicted
	}
	return last, predicted
}

// reads names a Lineage's inputs, each with the Lineage that writes it (name<-producer).
func reads(p *lineage.Pipeline, inputs []string) string {
	if len(inputs) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(inputs))
	for _, in := range inputs {
		if producer, ok := p.Producer(in); ok {
			in += "<-" + producer
		}
		parts = append(parts, in)
	}
	return strings.Join(parts, ", ")
}

// writes names a Lineage's outputs, each with its state and what of it is cached.
func writes(l *datav1alpha1.Lineage, datasets map[string]*datav1alpha1.Dataset) string {
	states := map[string]datav1alpha1.OutputState{}
	for _, o := range l.Status.Outputs {
		states[o.Name] = o.State
	}
	parts := make([]string, 0, len(l.Spec.Outputs))
	for _, out := range l.Spec.Outputs {
		state := states[out]
		if state == "" {
			state = datav1alpha1.OutputPending
		}
		desc := fmt.Sprintf("%s [%s", out, state)
		if ds := datasets[out]; ds == nil {
			desc += ", no Dataset"
		} else if ds.Status.TotalBytes > 0 {
			desc += fmt.Sprintf(", %s, %s cached", humanize.Bytes(ds.Status.TotalBytes), cachedShare(ds))
		}
		parts = append(parts, desc+"]")
	}
	return strings.Join(parts, ", ")
}
