package controllers

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/master/masterpb"
)

// completionIndexLabel carries, on a Job that recomputes one completion index of an Indexed
// Job's template, that index.
const completionIndexLabel = "data.strata.dev/completion-index"

// completionIndexEnv is the variable an Indexed Job's pods find their completion index in.
const completionIndexEnv = "JOB_COMPLETION_INDEX"

// PartitionsMaster is what the Lineage reconciler needs of the master to recompute only the
// lost partitions of an output: which files are lost, the files of a partition, and letting go
// of them in an output that is complete.
type PartitionsMaster interface {
	ListFiles(ctx context.Context, req *masterpb.ListFilesRequest) (*masterpb.ListFilesResponse, error)
	GetFile(ctx context.Context, req *masterpb.GetFileRequest) (*masterpb.File, error)
	DeleteFile(ctx context.Context, path string) (*masterpb.DeleteFileResponse, error)
	ReopenDataset(ctx context.Context, name string) (*masterpb.Dataset, error)
}

// lostPartitions are the completion indexes whose partitions (spec.partitions) hold every lost
// file of the outputs lost, in order, and whether they do: then only those indexes are rerun,
// each as a Job of its own. Not when l is no Indexed Job with partitions, an output lost has no
// partition, or a lost file lies in none: then the whole template reruns.
func (r *LineageReconciler) lostPartitions(ctx context.Context, l *datav1alpha1.Lineage, lost []string) ([]int32, bool, error) {
	spec := l.Spec.Template.Spec
	partitions := partitionsOf(l)
	if len(partitions) == 0 || spec.CompletionMode == nil || *spec.CompletionMode != batchv1.IndexedCompletion || r.Partitions == nil {
		return nil, false, nil
	}
	log := ctrl.LoggerFrom(ctx)
	indexes := map[int32]bool{}
	for _, out := range lost {
		ds := &datav1alpha1.Dataset{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: out}, ds); err != nil {
			return nil, false, client.IgnoreNotFound(err)
		}
		cctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
		usage, err := r.Master.GetDatasetUsage(cctx, &masterpb.GetDatasetUsageRequest{
			Name: datav1alpha1.MasterDatasetName(l.Namespace, out, string(ds.UID)), ListLost: true,
		})
		cancel()
		if err != nil {
			log.Info("cannot list an output's lost files; recomputing the whole Job", "output", out, "error", err.Error())
			return nil, false, nil
		}
		if usage.GetLostFiles() != uint64(len(usage.GetLostPaths())) {
			return nil, false, nil // more than the master lists
		}
		root := datav1alpha1.MasterDatasetRoot(l.Namespace, out, string(ds.UID)) + "/"
		for _, p := range usage.GetLostPaths() {
			index, ok := partitionOf(partitions, out, strings.TrimPrefix(p, root))
			if !ok {
				log.Info("a lost file lies in no partition; recomputing the whole Job", "output", out, "file", p)
				return nil, false, nil
			}
			indexes[index] = true
		}
	}
	out := make([]int32, 0, len(indexes))
	for i := range indexes {
		out = append(out, i)
	}
	slices.Sort(out)
	return out, true, nil
}

// failedIndexes are the completion indexes of the Jobs of a recomputation that failed: their
// partitions, let go of before, are missing.
func failedIndexes(jobs []*batchv1.Job) []int32 {
	var out []int32
	for _, job := range jobs {
		if i, ok := jobIndex(job); ok && jobFinished(job) == batchv1.JobFailed {
			out = append(out, i)
		}
	}
	return out
}

// partitionsOf are the partitions of l's outputs that its completion indexes write: those of
// spec.partitions, or for a Narrow Lineage without them, output i whole for index i.
func partitionsOf(l *datav1alpha1.Lineage) []datav1alpha1.OutputPartition {
	if len(l.Spec.Partitions) > 0 || l.Spec.Dependency != datav1alpha1.DependencyNarrow {
		return l.Spec.Partitions
	}
	whole := make([]datav1alpha1.OutputPartition, len(l.Spec.Outputs))
	for i, out := range l.Spec.Outputs {
		whole[i] = datav1alpha1.OutputPartition{Index: int32(i), Output: out} // no path: all of it
	}
	return whole
}

// neededInputs are the inputs a run that writes outputs reads: for a Narrow Lineage input i of
// each output i, for a Wide one every input.
func neededInputs(l *datav1alpha1.Lineage, outputs []string) []string {
	if l.Spec.Dependency != datav1alpha1.DependencyNarrow {
		return l.Spec.Inputs
	}
	var inputs []string
	for i, out := range l.Spec.Outputs {
		if i < len(l.Spec.Inputs) && slices.Contains(outputs, out) {
			inputs = append(inputs, l.Spec.Inputs[i])
		}
	}
	return inputs
}

// partitionOf is the completion index whose partition of output holds the file rel.
func partitionOf(partitions []datav1alpha1.OutputPartition, output, rel string) (int32, bool) {
	for _, p := range partitions {
		if p.Output == output && (p.Path == "" || rel == p.Path || strings.HasPrefix(rel, strings.TrimSuffix(p.Path, "/")+"/")) {
			return p.Index, true
		}
	}
	return 0, false
}

// releasePartitions makes the master let go of every file of the partitions of indexes, lost or
// not (the Jobs write each partition whole), opening their outputs for writing again first.
func (r *LineageReconciler) releasePartitions(ctx context.Context, l *datav1alpha1.Lineage, indexes []int32) error {
	if r.Partitions == nil {
		return fmt.Errorf("recomputing partitions of Lineage %s needs the master", l.Name)
	}
	for _, p := range partitionsOf(l) {
		if !slices.Contains(indexes, p.Index) {
			continue
		}
		ds := &datav1alpha1.Dataset{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: p.Output}, ds); err != nil {
			return client.IgnoreNotFound(err)
		}
		name := datav1alpha1.MasterDatasetName(l.Namespace, p.Output, string(ds.UID))
		path := datav1alpha1.MasterDatasetRoot(l.Namespace, p.Output, string(ds.UID))
		if p.Path != "" {
			path += "/" + strings.TrimSuffix(p.Path, "/")
		}
		if err := r.forgetPartition(ctx, name, path); err != nil {
			return fmt.Errorf("letting go of partition %s of %s (index %d): %w", p.Path, p.Output, p.Index, err)
		}
	}
	return nil
}

// forgetPartition reopens the Dataset name and deletes the file at path, or every file below it.
func (r *LineageReconciler) forgetPartition(ctx context.Context, name, path string) error {
	ctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
	defer cancel()
	if _, err := r.Partitions.ReopenDataset(ctx, name); err != nil {
		if status.Code(err) == codes.NotFound {
			return nil // the master forgot the whole output: nothing of the partition is left
		}
		return fmt.Errorf("opening %s again: %w", name, err)
	}
	files := []string{path}
	if _, err := r.Partitions.GetFile(ctx, &masterpb.GetFileRequest{Path: path}); status.Code(err) == codes.NotFound {
		files = nil
		after := ""
		for {
			resp, err := r.Partitions.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: path, Recursive: true, StartAfter: after})
			if status.Code(err) == codes.NotFound {
				break
			}
			if err != nil {
				return fmt.Errorf("listing %s: %w", path, err)
			}
			for _, e := range resp.GetEntries() {
				if !e.GetDir() {
					files = append(files, e.GetPath())
				}
			}
			if after = resp.GetNextStartAfter(); after == "" {
				break
			}
		}
	}
	for _, f := range files {
		if _, err := r.Partitions.DeleteFile(ctx, f); err != nil && status.Code(err) != codes.NotFound {
			return fmt.Errorf("deleting %s: %w", f, err)
		}
	}
	return nil
}

// rewritten are the outputs jobs write: those of the partitions of their indexes, or every
// output of l for a Job of the whole template.
func (r *LineageReconciler) rewritten(l *datav1alpha1.Lineage, jobs []*batchv1.Job) []string {
	if len(jobs) == 0 {
		return nil
	}
	indexes := make([]int32, 0, len(jobs))
	for _, job := range jobs {
		index, ok := jobIndex(job)
		if !ok {
			return l.Spec.Outputs
		}
		indexes = append(indexes, index)
	}
	return outputsOf(l, indexes)
}

// outputsOf are the outputs the completion indexes write part of, or every output of l when
// indexes is empty (the whole template reruns).
func outputsOf(l *datav1alpha1.Lineage, indexes []int32) []string {
	if len(indexes) == 0 {
		return l.Spec.Outputs
	}
	var out []string
	for _, p := range partitionsOf(l) {
		if slices.Contains(indexes, p.Index) && !slices.Contains(out, p.Output) {
			out = append(out, p.Output)
		}
	}
	return out
}

// jobIndex is the completion index a recomputation Job reruns, if it reruns one.
func jobIndex(job *batchv1.Job) (int32, bool) {
	v, ok := job.Labels[completionIndexLabel]
	if !ok {
		return 0, false
	}
	i, err := strconv.ParseInt(v, 10, 32)
	return int32(i), err == nil
}

// onlyIndex makes job, of an Indexed Job's template, run its completion index alone: a Job of
// one completion whose pods find the index where an Indexed Job's do, in JOB_COMPLETION_INDEX
// and the completion-index annotation. Kubernetes cannot run some indexes of an Indexed Job.
func onlyIndex(job *batchv1.Job, index int32) {
	value := strconv.Itoa(int(index))
	job.Labels[completionIndexLabel] = value
	spec := &job.Spec
	spec.CompletionMode = ptr.To(batchv1.NonIndexedCompletion)
	spec.Completions, spec.Parallelism = ptr.To[int32](1), ptr.To[int32](1)
	// Indexed only.
	spec.BackoffLimitPerIndex, spec.MaxFailedIndexes, spec.SuccessPolicy = nil, nil, nil
	if spec.Template.Annotations == nil {
		spec.Template.Annotations = map[string]string{}
	}
	spec.Template.Annotations[batchv1.JobCompletionIndexAnnotation] = value
	setEnv := func(containers []corev1.Container) {
		for i := range containers {
			c := &containers[i]
			c.Env = slices.DeleteFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == completionIndexEnv })
			c.Env = append(c.Env, corev1.EnvVar{Name: completionIndexEnv, Value: value})
		}
	}
	setEnv(spec.Template.Spec.InitContainers)
	setEnv(spec.Template.Spec.Containers)
}
