package controllers

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/humanize"
	"github.com/strata-cache/strata/lineage"
	"github.com/strata-cache/strata/master/masterpb"
)

// What a Job of a Lineage reads, finds cached and is predicted to take, noted on the Job when the
// operator makes it: by the time the Job succeeds, the inputs' cache has changed (the run itself
// cached them).
const (
	inputBytesAnnotation   = "data.strata.dev/input-bytes"
	cachedBytesAnnotation  = "data.strata.dev/cached-input-bytes"
	predictionAnnotation   = "data.strata.dev/predicted-milliseconds"
	underStoreRateFallback = lineage.DefaultUnderStoreRate
)

// inputBytes is the size of l's inputs and how much of it is cached: an output's from the
// master (the step before wrote it a moment ago, and its Dataset's status follows within a
// poll), a source's from its Dataset's status (the master knows only the files cached); false
// when an input's size is not known (a Dataset not listed yet, or not there).
func (r *LineageReconciler) inputBytes(ctx context.Context, l *datav1alpha1.Lineage) (input, cached int64, ok bool) {
	for _, name := range l.Spec.Inputs {
		ds := &datav1alpha1.Dataset{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: l.Namespace, Name: name}, ds); err != nil {
			return 0, 0, false
		}
		total, inCache := ds.Status.TotalBytes, ds.Status.CachedBytes
		if ds.Spec.Lineage != nil && r.Master != nil {
			cctx, cancel := context.WithTimeout(ctx, masterCallTimeout)
			usage, err := r.Master.GetDatasetUsage(cctx, &masterpb.GetDatasetUsageRequest{
				Name: datav1alpha1.MasterDatasetName(l.Namespace, name, string(ds.UID)), StaleOk: true,
			})
			cancel()
			if err == nil {
				total, inCache = usage.GetTotalBytes(), usage.GetCachedBytes()
			}
		}
		input += total
		cached += min(inCache, total)
	}
	return input, cached, input > 0
}

// noteInputs writes on job, about to be made for the whole of l, what it reads, finds cached
// and is predicted to take, for recordRunTime to learn from once it succeeds.
func (r *LineageReconciler) noteInputs(ctx context.Context, l *datav1alpha1.Lineage, job *batchv1.Job) {
	input, cached, ok := r.inputBytes(ctx, l)
	if !ok {
		return
	}
	if job.Annotations == nil {
		job.Annotations = map[string]string{}
	}
	job.Annotations[inputBytesAnnotation] = strconv.FormatInt(input, 10)
	job.Annotations[cachedBytesAnnotation] = strconv.FormatInt(cached, 10)
	model := runTimeModel(l.Status.RunTime)
	job.Annotations[predictionAnnotation] = strconv.FormatInt(milliseconds(model.Predict(input, cached)), 10)
}

// runTimeModel is the model fitted to the runs in st.
func runTimeModel(st *datav1alpha1.LineageRunTime) lineage.RunTimeModel {
	var runs []lineage.Run
	if st != nil {
		for _, run := range st.Runs {
			runs = append(runs, lineage.Run{Seconds: float64(run.Milliseconds) / 1000, InputBytes: run.InputBytes, CachedBytes: run.CachedBytes})
		}
	}
	return lineage.FitRunTime(runs, lineage.Rates{UnderStore: underStoreRateFallback, Cache: lineage.DefaultCacheRate})
}

// recordRunTime adds to l's status the runs of its Jobs that succeeded since it last looked, and
// predicts the next run from the inputs' cache now.
func (r *LineageReconciler) recordRunTime(ctx context.Context, l *datav1alpha1.Lineage) error {
	jobs := &batchv1.JobList{}
	if err := r.Client.List(ctx, jobs, client.InNamespace(l.Namespace), client.MatchingLabels{lineageLabel: l.Name}); err != nil {
		return fmt.Errorf("listing the Jobs of Lineage %s: %w", l.Name, err)
	}
	st := l.Status.RunTime
	if st == nil {
		st = &datav1alpha1.LineageRunTime{}
	}
	recorded := func(name string) bool {
		return slices.ContainsFunc(st.Runs, func(run datav1alpha1.LineageRun) bool { return run.Job == name })
	}
	for i := range jobs.Items {
		job := &jobs.Items[i]
		if !metav1.IsControlledBy(job, l) || recorded(job.Name) {
			continue
		}
		if run, ok := runOf(job); ok {
			st.Runs = append(st.Runs, run)
			ctrl.LoggerFrom(ctx).V(1).Info("learned a run time", "job", job.Name, "milliseconds", run.Milliseconds,
				"inputBytes", run.InputBytes, "cachedBytes", run.CachedBytes, "predictedMilliseconds", run.PredictedMilliseconds)
		}
	}
	slices.SortStableFunc(st.Runs, func(a, b datav1alpha1.LineageRun) int { return a.Finished.Compare(b.Finished.Time) })
	if extra := len(st.Runs) - datav1alpha1.MaxRecordedRuns; extra > 0 {
		st.Runs = slices.Delete(st.Runs, 0, extra)
	}
	if len(st.Runs) == 0 {
		return nil
	}
	last := st.Runs[len(st.Runs)-1]
	st.LastError = ""
	if last.PredictedMilliseconds > 0 {
		st.LastError = fmt.Sprintf("%+.0f%%", 100*float64(last.Milliseconds-last.PredictedMilliseconds)/float64(last.PredictedMilliseconds))
	}
	model := runTimeModel(st)
	st.OwnWorkSeconds = int64(math.Round(model.Fixed))
	st.UnderStoreRate = ""
	if model.UnderStoreScale > 1e-6 {
		st.UnderStoreRate = humanize.Bytes(int64(model.Rates.UnderStore/model.UnderStoreScale)) + "/s"
	}
	st.Predicted, st.PredictedMilliseconds, st.CachedPercentage = "", 0, ""
	if input, cached, ok := r.inputBytes(ctx, l); ok {
		st.PredictedMilliseconds = milliseconds(model.Predict(input, cached))
		st.Predicted = (time.Duration(st.PredictedMilliseconds) * time.Millisecond).Round(time.Second).String()
		st.CachedPercentage = humanize.Percent(cached, input)
	}
	l.Status.RunTime = st
	return nil
}

// runOf is the run a Job made, if it succeeded and noted what it read.
func runOf(job *batchv1.Job) (datav1alpha1.LineageRun, bool) {
	input, err := strconv.ParseInt(job.Annotations[inputBytesAnnotation], 10, 64)
	if err != nil || jobFinished(job) != batchv1.JobComplete || job.Status.StartTime == nil || job.Status.CompletionTime == nil {
		return datav1alpha1.LineageRun{}, false
	}
	cached, _ := strconv.ParseInt(job.Annotations[cachedBytesAnnotation], 10, 64)
	predicted, _ := strconv.ParseInt(job.Annotations[predictionAnnotation], 10, 64)
	return datav1alpha1.LineageRun{
		Job: job.Name, Finished: *job.Status.CompletionTime,
		Milliseconds: job.Status.CompletionTime.Sub(job.Status.StartTime.Time).Milliseconds(),
		InputBytes:   input, CachedBytes: cached, PredictedMilliseconds: predicted,
	}, true
}

func milliseconds(seconds float64) int64 { return int64(math.Round(seconds * 1000)) }
