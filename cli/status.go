package cli

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/humanize"
)

// Status shows the cluster's TierPools (their workers and tiers, with use), as far as the
// user may read them, then the Datasets of the namespace with how much of each is cached and
// where.
func (c *CLI) Status(ctx context.Context) error {
	if err := c.pools(ctx); err != nil {
		return err
	}
	c.printf("\n")
	return c.datasets(ctx)
}

func (c *CLI) pools(ctx context.Context) error {
	pools := &datav1alpha1.TierPoolList{}
	err := c.Client.List(ctx, pools)
	switch {
	case apierrors.IsForbidden(err):
		// TierPools are cluster-scoped: a tenant often may not read them, and needs not.
		c.printf("TierPools: you may not list them (they are cluster-scoped; a cluster administrator can)\n")
		return nil
	case err != nil:
		return fmt.Errorf("listing TierPools: %w", err)
	}
	if len(pools.Items) == 0 {
		c.printf("no TierPool: nothing caches yet (the chart makes one named default)\n")
		return nil
	}
	tw := c.table()
	tw.printf("POOL\tWORKERS\tREADY\tTIER\tMEDIUM\tUSED\tCAPACITY\tUSE\n")
	for _, p := range pools.Items {
		ready := "False"
		if cond := meta.FindStatusCondition(p.Status.Conditions, datav1alpha1.ConditionReady); cond != nil {
			ready = string(cond.Status)
		}
		workers := fmt.Sprintf("%d/%d", p.Status.ReadyWorkers, p.Status.Nodes)
		if len(p.Status.Tiers) == 0 {
			tw.printf("%s\t%s\t%s\t-\t-\t-\t-\t-\n", p.Name, workers, ready)
			continue
		}
		for i, t := range p.Status.Tiers {
			name, nodes, rdy := p.Name, workers, ready
			if i > 0 {
				name, nodes, rdy = "", "", ""
			}
			tw.printf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, nodes, rdy, t.Name, t.Medium,
				humanize.Bytes(t.UsedBytes), humanize.Bytes(t.CapacityBytes), humanize.Percent(t.UsedBytes, t.CapacityBytes))
		}
	}
	return tw.flush()
}

func (c *CLI) datasets(ctx context.Context) error {
	list := &datav1alpha1.DatasetList{}
	if err := c.Client.List(ctx, list, client.InNamespace(c.Namespace)); err != nil {
		return fmt.Errorf("listing the Datasets of namespace %s: %w", c.Namespace, err)
	}
	if len(list.Items) == 0 {
		c.printf("no Dataset in namespace %s\n", c.Namespace)
		return nil
	}
	tw := c.table()
	tw.printf("DATASET\tPHASE\tFILES\tSIZE\tCACHED\tNODES\tPOOL\n")
	for _, ds := range list.Items {
		tw.printf("%s\t%s\t%d\t%s\t%s\t%s\t%s\n", ds.Name, orDash(string(ds.Status.Phase)), ds.Status.Files,
			humanize.Bytes(ds.Status.TotalBytes), cachedShare(&ds), nodes(ds.Status.Nodes), ds.Spec.TierPoolName)
	}
	if err := tw.flush(); err != nil {
		return err
	}
	for _, ds := range list.Items {
		if ready := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionReady); ready != nil && ready.Status != metav1.ConditionTrue {
			c.printf("%s is not Ready (%s): %s\n", ds.Name, ready.Reason, ready.Message)
		}
	}
	return nil
}

// nodes writes where a Dataset's cached bytes are, as node=bytes.
func nodes(usage []datav1alpha1.NodeUsage) string {
	if len(usage) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(usage))
	for _, n := range usage {
		parts = append(parts, n.Node+"="+humanize.Bytes(n.Bytes))
	}
	return strings.Join(parts, ",")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
