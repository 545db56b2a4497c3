package controllers

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/warmup"
)

// annotationJobLoadRequest is the annotation of a preload Job that says which load request
// (the Dataset's load-requested annotation) it answers.
const annotationJobLoadRequest = "data.strata.dev/load-request"

// WorkerImage is the image of the worker binary, which the operator also runs in Datasets'
// namespaces: as `worker preload`, a Job that mounts the Dataset's claim and reads every file,
// so the read goes through the same mount and cache as a user's pod would; and as `worker
// serve-claim`, the claim server of a pvc:// source.
type WorkerImage struct {
	// Image has the worker binary; empty means the operator can neither preload nor serve
	// pvc:// sources.
	Image           string
	ImagePullPolicy corev1.PullPolicy
}

// preloadJobName is the name of a Dataset's preload Job: within the 63 characters a Job's pods
// carry in their job-name label.
func preloadJobName(ds *datav1alpha1.Dataset) string { return childName(ds, "-preload") }

// preloadCondition runs a Dataset's preload and says how it went: once per generation for a
// Dataset with spec.preload, and again for each new value of its load-requested annotation
// (which also loads a Dataset without spec.preload). nil when the Dataset asks for none. It
// is called once the Dataset's claim can be served.
func (r *DatasetReconciler) preloadCondition(ctx context.Context, ds *datav1alpha1.Dataset) (*metav1.Condition, error) {
	request := ds.Annotations[datav1alpha1.AnnotationLoadRequested]
	if !ds.Spec.Preload && request == "" {
		return nil, nil
	}
	cond := &metav1.Condition{Type: datav1alpha1.ConditionPreloaded, Status: metav1.ConditionFalse, ObservedGeneration: ds.Generation}
	if done := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionPreloaded); done != nil &&
		done.Status == metav1.ConditionTrue && done.ObservedGeneration == ds.Generation && ds.Status.LoadRequest == request {
		// Read once already: nothing to do, even if its Job has gone since.
		return done.DeepCopy(), nil
	}
	if r.WorkerImage.Image == "" {
		cond.Reason = datav1alpha1.ReasonPreloadNotAvailable
		cond.Message = "the operator was started without a worker image (--worker-image), so it cannot preload: pods still read the Dataset, cold"
		return cond, nil
	}
	job := &batchv1.Job{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: preloadJobName(ds)}, job)
	switch {
	case apierrors.IsNotFound(err):
		if err := r.createPreloadJob(ctx, ds, request); err != nil {
			return nil, err
		}
		cond.Reason = datav1alpha1.ReasonPreloading
		cond.Message = fmt.Sprintf("reading every file of the Dataset once through its claim: see `kubectl -n %s logs job/%s`", ds.Namespace, preloadJobName(ds))
		return cond, nil
	case err != nil:
		return nil, fmt.Errorf("reading preload Job %s/%s: %w", ds.Namespace, preloadJobName(ds), err)
	}
	if job.Annotations[annotationJobLoadRequest] != request {
		// The Job read the Dataset for an earlier request: a new one starts once it is gone
		// (its deletion brings the Dataset back here).
		if err := r.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return nil, fmt.Errorf("deleting the preload Job %s/%s of an earlier load request: %w", ds.Namespace, job.Name, err)
		}
		cond.Reason = datav1alpha1.ReasonPreloading
		cond.Message = fmt.Sprintf("loading the Dataset again, as asked (%s=%q): the Job of the last load is being replaced", datav1alpha1.AnnotationLoadRequested, request)
		return cond, nil
	}
	for _, c := range job.Status.Conditions {
		if c.Status != corev1.ConditionTrue {
			continue
		}
		switch c.Type {
		case batchv1.JobComplete:
			ds.Status.LoadRequest = request
			cond.Status, cond.Reason = metav1.ConditionTrue, datav1alpha1.ReasonPreloaded
			cond.Message = "every file was read once through the Dataset's claim; the workers hold it (see status.cachedPercentage)"
			return cond, nil
		case batchv1.JobFailed:
			cond.Reason = datav1alpha1.ReasonPreloadFailed
			cond.Message = fmt.Sprintf("the preload Job %s failed (%s: %s): see `kubectl -n %s logs job/%s`; `kubectl strata -n %s load %s` (or deleting the Job) tries again",
				job.Name, c.Reason, c.Message, ds.Namespace, job.Name, ds.Namespace, ds.Name)
			return cond, nil
		}
	}
	cond.Reason = datav1alpha1.ReasonPreloading
	cond.Message = fmt.Sprintf("reading every file of the Dataset once through its claim: see `kubectl -n %s logs job/%s`", ds.Namespace, job.Name)
	return cond, nil
}

// createPreloadJob creates the Job that reads a Dataset once, wherever it is scheduled. The
// request is the load request it answers (empty for spec.preload's).
func (r *DatasetReconciler) createPreloadJob(ctx context.Context, ds *datav1alpha1.Dataset, request string) error {
	labels := datasetLabels(ds)
	labels["app.kubernetes.io/component"] = "preload"
	job := loadJob(r.WorkerImage, ds.Namespace, preloadJobName(ds), ds.Name, labels, nil)
	job.Annotations = map[string]string{annotationJobLoadRequest: request}
	if err := controllerutil.SetControllerReference(ds, job, r.Client.Scheme()); err != nil {
		return fmt.Errorf("owning preload Job %s/%s: %w", job.Namespace, job.Name, err)
	}
	if err := r.Client.Create(ctx, job); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating preload Job %s/%s: %w", job.Namespace, job.Name, err)
	}
	r.Recorder.Eventf(ds, corev1.EventTypeNormal, datav1alpha1.ReasonPreloading, "created Job %s to read the Dataset once", job.Name)
	return nil
}

// loadJob is a Job that runs `worker preload` with args before the mount point, on the
// Dataset's claim: the read that makes the node's worker cache the files. It runs as a tenant's
// pod would: in the Dataset's namespace, with the claim read-only, as a user without
// privileges: the loader's (warmup.LoaderUID), by which the node's worker tells a load's reads
// from a pod's.
func loadJob(image WorkerImage, namespace, name, claim string, labels map[string]string, args []string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](2),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					RestartPolicy:                corev1.RestartPolicyNever,
					AutomountServiceAccountToken: ptr.To(false),
					EnableServiceLinks:           ptr.To(false),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](warmup.LoaderUID), RunAsGroup: ptr.To[int64](warmup.LoaderUID),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:            "preload",
						Image:           image.Image,
						ImagePullPolicy: image.ImagePullPolicy,
						Args:            append(append([]string{"preload"}, args...), "/data"),
						// The worker binary writes why it failed on stderr; this makes it the
						// pod's termination message.
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false),
							ReadOnlyRootFilesystem:   ptr.To(true),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
						PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: true},
					}}},
				},
			},
		},
	}
}
