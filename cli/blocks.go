package cli

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/blockreport"
	"github.com/strata-cache/strata/internal/humanize"
)

// blockReport asks the operator where the blocks of the files of dir of a Dataset are, and
// reads its answer.
func (c *CLI) blockReport(ctx context.Context, name, dir string) (*blockreport.Report, error) {
	dir, err := blockreport.CleanDir(dir)
	if err != nil {
		return nil, err
	}
	ds, err := c.dataset(ctx, name)
	if err != nil {
		return nil, err
	}
	token, err := c.request(ctx, ds, datav1alpha1.AnnotationBlockReportRequested,
		map[string]string{datav1alpha1.AnnotationBlockReportDir: dir})
	if err != nil {
		return nil, err
	}
	ds, err = c.await(ctx, ds, func(d *datav1alpha1.Dataset) (bool, error) {
		return d.Status.BlockReport != nil && d.Status.BlockReport.Request == token, nil
	})
	if err != nil {
		return nil, err
	}
	answer := ds.Status.BlockReport
	if answer.ConfigMapName == "" {
		return nil, fmt.Errorf("no block report of Dataset %s/%s: %s", ds.Namespace, ds.Name, answer.Message)
	}
	cm := &corev1.ConfigMap{}
	err = c.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: answer.ConfigMapName}, cm)
	switch {
	case apierrors.IsForbidden(err):
		return nil, fmt.Errorf("the block report is in ConfigMap %s/%s, which you may not read: ask for `get` on configmaps of the namespace", ds.Namespace, answer.ConfigMapName)
	case err != nil:
		return nil, fmt.Errorf("reading the block report from ConfigMap %s/%s: %w", ds.Namespace, answer.ConfigMapName, err)
	}
	report, err := blockreport.Decode(cm.Data[blockreport.ConfigMapKey])
	if err != nil {
		return nil, err
	}
	if report.Dir != dir {
		// Another request, for another folder, answered in between.
		return nil, errors.New("the block report was replaced by one of another folder while it was read: ask again")
	}
	if answer.Message != "" {
		c.printf("note: %s\n", answer.Message)
	}
	return report, nil
}

// List shows the files of dir of a Dataset, each with how much of it is cached and where
// (node/tier:blocks).
func (c *CLI) List(ctx context.Context, name, dir string) error {
	r, err := c.blockReport(ctx, name, dir)
	if err != nil {
		return err
	}
	tw := c.table()
	tw.printf("PATH\tSIZE\tBLOCKS\tCACHED\tWHERE\n")
	for _, f := range r.Files {
		tw.printf("%s\t%s\t%d\t%s\t%s\n", f.Path, humanize.Bytes(f.Size), f.Blocks,
			humanize.Percent(f.CachedBytes, f.Size), where(f.Copies))
	}
	if err := tw.flush(); err != nil {
		return err
	}
	if int64(len(r.Files)) < r.TotalFiles {
		c.printf("(%d of %d files shown)\n", len(r.Files), r.TotalFiles)
	}
	return nil
}

// where writes the copies of a file's blocks as node/tier:blocks, "-" for none.
func where(copies []blockreport.Copy) string {
	if len(copies) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(copies))
	for _, cp := range copies {
		parts = append(parts, fmt.Sprintf("%s/%s:%d", cp.Node, cp.Tier, cp.Blocks))
	}
	return strings.Join(parts, " ")
}

// DiskUsage shows, for each entry of dir of a Dataset (a file, or a folder summed), its size
// and cached share, then the folder's total and where its cached bytes are, by node and tier.
func (c *CLI) DiskUsage(ctx context.Context, name, dir string) error {
	r, err := c.blockReport(ctx, name, dir)
	if err != nil {
		return err
	}
	tw := c.table()
	tw.printf("SIZE\tCACHED\tFILES\tPATH\n")
	for _, child := range children(r) {
		u := r.Sum(child)
		tw.printf("%s\t%s\t%d\t%s\n", humanize.Bytes(u.Bytes), humanize.Percent(u.CachedBytes, u.Bytes), u.Files, child)
	}
	total := r.Sum(r.Dir)
	label := r.Dir
	if label == "" {
		label = "(all)"
	}
	tw.printf("%s\t%s\t%d\t%s\n", humanize.Bytes(total.Bytes), humanize.Percent(total.CachedBytes, total.Bytes), total.Files, label)
	if err := tw.flush(); err != nil {
		return err
	}
	if int64(len(r.Files)) < r.TotalFiles {
		c.printf("(sums of the %d of %d files the report describes; the folder holds %s in all)\n",
			len(r.Files), r.TotalFiles, humanize.Bytes(r.TotalBytes))
	}
	if len(total.ByPlace) == 0 {
		c.printf("\nnothing of it is cached on any node\n")
		return nil
	}
	c.printf("\n")
	tw = c.table()
	tw.printf("NODE\tTIER\tBLOCKS\tCACHED\n")
	for _, p := range total.ByPlace {
		tw.printf("%s\t%s\t%d\t%s\n", p.Node, p.Tier, p.Blocks, humanize.Bytes(p.Bytes))
	}
	return tw.flush()
}

// children are the entries right below the report's folder that hold its files: files, and
// folders (each summed by Report.Sum), in path order.
func children(r *blockreport.Report) []string {
	var out []string
	for _, f := range r.Files {
		if f.Path == r.Dir {
			// The folder asked for is this file.
			out = append(out, f.Path)
			continue
		}
		rel := f.Path
		if r.Dir != "" {
			rel = strings.TrimPrefix(f.Path, r.Dir+"/")
		}
		first, _, _ := strings.Cut(rel, "/")
		out = append(out, path.Join(r.Dir, first))
	}
	slices.Sort(out)
	return slices.Compact(out)
}
