package controllers

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/blockreport"
	"github.com/strata-cache/strata/cacheworker/understore"
)

// Reasons of the events of block reports.
const (
	ReasonBlockReportWritten = "BlockReportWritten"
	ReasonBlockReportFailed  = "BlockReportFailed"
)

// blockReportMaxFiles bounds the files one report describes: a few seconds of the master's
// time. A user asks for a folder to see more.
const blockReportMaxFiles = 2000

// blockReportLimit keeps a report, with its ConfigMap's metadata, under the 1 MiB an object of
// the API may weigh.
const blockReportLimit = 900 << 10

// blockReportTimeout bounds the making of one report.
const blockReportTimeout = time.Minute

// errNotListed says that no worker of a Dataset's pool has listed it, so there is no tree to
// report on yet (and nothing of it is cached).
var errNotListed = errors.New("no worker has listed the Dataset")

// BlockReporter makes the block report of a Dataset: where the blocks of the files of dir are.
type BlockReporter interface {
	BlockReport(ctx context.Context, ds *datav1alpha1.Dataset, blockSize int64, dir string, maxFiles int) (*blockreport.Report, error)
}

// DatasetTrees streams into visit the tree of a Dataset that its pool's workers show (see
// WorkerSyncs.Tree); errNotListed when none has listed it.
type DatasetTrees interface {
	Tree(ctx context.Context, pool, uid string, visit func(understore.ObjectInfo)) error
}

// MasterBlockReports is the BlockReporter of a cluster: the master says where blocks are, and
// the workers give the tree of a Dataset read from stores, whose files are reported (an output's
// files are the master's).
type MasterBlockReports struct {
	Master blockreport.Master
	Trees  DatasetTrees
}

// BlockReport implements BlockReporter.
func (m *MasterBlockReports) BlockReport(ctx context.Context, ds *datav1alpha1.Dataset, blockSize int64, dir string, maxFiles int) (*blockreport.Report, error) {
	req := blockreport.Request{
		Dataset:   ds.Namespace + "/" + ds.Name,
		Root:      datav1alpha1.MasterDatasetRoot(ds.Namespace, ds.Name, string(ds.UID)),
		Dir:       dir,
		BlockSize: blockSize,
		MaxFiles:  maxFiles,
	}
	if ds.ReadsStores() {
		req.Tree = func(ctx context.Context, visit func(understore.ObjectInfo)) error {
			return m.Trees.Tree(ctx, ds.Spec.TierPoolName, string(ds.UID), visit)
		}
	}
	return blockreport.Build(ctx, m.Master, req)
}

// NewBlockReportCounter registers the counter of the block reports the operator answered.
func NewBlockReportCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "strata_operator_block_reports_total",
		Help: "Block reports users asked for (kubectl strata ls and du), by result: written (to the Dataset's ConfigMap) or failed (the status says why).",
	}, []string{"result"})
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("registering the block report counter: %w", err)
	}
	return c, nil
}

func (r *DatasetReconciler) countReport(result string) {
	if r.ReportCounter != nil {
		r.ReportCounter.WithLabelValues(result).Inc()
	}
}

// blockReportName is the ConfigMap a Dataset's block report is written to.
func blockReportName(ds *datav1alpha1.Dataset) string { return childName(ds, "-blocks") }

// answerBlockReport answers a new data.strata.dev/block-report-requested annotation, if there is
// one: it writes the report to the Dataset's ConfigMap and says in status.blockReport where, or
// why there is none. notServed is why the Dataset is not served, if it is not. Only a failure
// to write the ConfigMap is an error (the request is answered at the next pass).
func (r *DatasetReconciler) answerBlockReport(ctx context.Context, ds *datav1alpha1.Dataset, pool *datav1alpha1.TierPool, notServed *problem) error {
	want := ds.Annotations[datav1alpha1.AnnotationBlockReportRequested]
	if want == "" || (ds.Status.BlockReport != nil && ds.Status.BlockReport.Request == want) {
		return nil
	}
	answer := &datav1alpha1.DatasetBlockReportStatus{Request: want}
	fail := func(msg string) error {
		r.countReport("failed")
		answer.Message = msg
		ds.Status.BlockReport = answer
		r.Recorder.Event(ds, corev1.EventTypeWarning, ReasonBlockReportFailed, msg)
		return nil
	}
	dir, err := blockreport.CleanDir(ds.Annotations[datav1alpha1.AnnotationBlockReportDir])
	if err != nil {
		return fail(fmt.Sprintf("%v (annotation %s)", err, datav1alpha1.AnnotationBlockReportDir))
	}
	answer.Dir = dir
	switch {
	case notServed != nil:
		return fail("the Dataset is not served, so nothing of it is cached: " + notServed.message)
	case r.Reports == nil:
		return fail("the operator runs without a master, so it cannot tell where blocks are: install Strata with its master (the chart's default)")
	}
	rctx, cancel := context.WithTimeout(ctx, blockReportTimeout)
	defer cancel()
	report, err := r.Reports.BlockReport(rctx, ds, blockSize(pool), dir, blockReportMaxFiles)
	switch {
	case errors.Is(err, errNotListed):
		return fail(fmt.Sprintf("no node has mounted the Dataset yet, so nothing of it is cached: its source is listed when a pod first mounts claim %s", ds.Name))
	case err != nil:
		return fail(fmt.Sprintf("the block report could not be made: %v; set the annotation %s to a new value to ask again", err, datav1alpha1.AnnotationBlockReportRequested))
	}
	data, err := report.EncodeWithin(blockReportLimit)
	if err != nil {
		return fail(fmt.Sprintf("the block report could not be made: %v", err))
	}
	name := blockReportName(ds)
	if taken, err := r.writeBlockReport(ctx, ds, name, data); err != nil {
		return err
	} else if taken {
		return fail(fmt.Sprintf("ConfigMap %s is not this Dataset's, so the block report cannot be written there: rename or delete it", name))
	}
	answer.ConfigMapName = name
	answer.Time = &metav1.Time{Time: report.Generated}
	answer.Files = int64(len(report.Files))
	answer.TotalFiles = report.TotalFiles
	if answer.Files < answer.TotalFiles {
		answer.Message = fmt.Sprintf("the report describes the first %d of the %d files of the folder, as many as one report holds: ask for a folder of it to see the rest",
			answer.Files, answer.TotalFiles)
	}
	ds.Status.BlockReport = answer
	r.countReport("written")
	r.Recorder.Eventf(ds, corev1.EventTypeNormal, ReasonBlockReportWritten, "wrote the block report of %d of %d files to ConfigMap %s",
		answer.Files, answer.TotalFiles, name)
	return nil
}

// writeBlockReport creates or updates the ConfigMap of a Dataset's block report. taken says a
// ConfigMap of that name exists that the Dataset does not own: it is left alone. ConfigMaps are
// read uncached: the operator keeps no copy of every ConfigMap of the cluster for these few.
func (r *DatasetReconciler) writeBlockReport(ctx context.Context, ds *datav1alpha1.Dataset, name, data string) (taken bool, err error) {
	cm := &corev1.ConfigMap{}
	err = r.APIReader.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: name}, cm)
	switch {
	case apierrors.IsNotFound(err):
		labels := datasetLabels(ds)
		labels["app.kubernetes.io/component"] = "block-report"
		cm = &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ds.Namespace, Labels: labels},
			Data:       map[string]string{blockreport.ConfigMapKey: data},
		}
		if err := controllerutil.SetControllerReference(ds, cm, r.Client.Scheme()); err != nil {
			return false, fmt.Errorf("owning ConfigMap %s/%s: %w", ds.Namespace, name, err)
		}
		if err := r.Client.Create(ctx, cm); err != nil {
			return false, fmt.Errorf("creating ConfigMap %s/%s of the block report: %w", ds.Namespace, name, err)
		}
		return false, nil
	case err != nil:
		return false, fmt.Errorf("reading ConfigMap %s/%s of the block report: %w", ds.Namespace, name, err)
	}
	if !metav1.IsControlledBy(cm, ds) {
		return true, nil
	}
	cm.Data = map[string]string{blockreport.ConfigMapKey: data}
	if err := r.Client.Update(ctx, cm); err != nil {
		return false, fmt.Errorf("updating ConfigMap %s/%s of the block report: %w", ds.Namespace, name, err)
	}
	return false, nil
}
