package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/internal/fdstore"
)

// Ports of a worker pod.
const (
	WorkerDataPort    = 7100
	WorkerMetricsPort = 8080
)

const (
	// WorkerServiceAccountName is the workers' ServiceAccount, created by the chart in the
	// operator's namespace and bound to no Role: a worker talks to the master, never to the API
	// server.
	WorkerServiceAccountName = "strata-worker"
	// TiersHashAnnotation on the pod template carries a hash of the pool's tiers file, so that a
	// change of tiers (which the pods read from a ConfigMap) rolls the pods.
	TiersHashAnnotation = "strata.dev/tiers-hash"
	// PoliciesHashAnnotation on a running worker pod carries a hash of the policies file the
	// operator last wrote: changing it makes the kubelet sync the pod, and so refresh the
	// ConfigMap's files in it, at once rather than at its next periodic sync (a minute or more).
	// The pod is not restarted: the worker reads the file live.
	PoliciesHashAnnotation = "strata.dev/policies-hash"
	// WorkerTiersKey is the key of the tiers file in the worker's ConfigMap.
	WorkerTiersKey = "tiers.yaml"

	workerContainerName = "worker"
	workerConfigDir     = "/etc/strata"
	workerIndexDir      = "/var/lib/strata-worker/index"
	// workerListingsDir keeps the last good listing of every Dataset the node mounted, for
	// mounts while a source is unreachable; on the host beside the index, so that it survives.
	workerListingsDir = "/var/lib/strata-worker/listings"
	// workerHostIndexRoot holds, on each node, one index directory per pool. It must survive the
	// pod: the index is how a restarted worker finds the blocks still on its non-volatile tiers.
	workerHostIndexRoot = "/var/lib/strata-worker"
	// workerSocketRoot holds, on each node, one directory per pool with the worker's mount
	// socket, which the CSI node plugin dials.
	workerSocketRoot = "/run/strata"
	// workerStartupFailures × workerStartupPeriod is how long a worker may take to start: at
	// start it verifies the blocks its index lists, which on a big NVMe tier takes minutes.
	workerStartupFailures = 180
	workerStartupPeriod   = 10
	// workerTerminationGrace leaves the worker time to finish in-flight transfers and close its
	// index cleanly.
	workerTerminationGrace = 30
)

// WorkerSpec is what the operator runs as the workers of every TierPool, from its flags (the
// chart's worker.* values).
type WorkerSpec struct {
	// Namespace the workers' DaemonSets and ConfigMaps live in: the operator's own.
	Namespace string
	// Image of the worker; empty means the operator deploys no worker.
	Image           string
	ImagePullPolicy corev1.PullPolicy
	// MasterAddresses are the gRPC addresses of the master replicas the workers register with;
	// empty when the operator runs no master, and the workers then run without one.
	MasterAddresses []string
	// TLS is how the workers get their certificates.
	TLS ComponentTLS
}

// WorkerMountsDir is where, on each node, the worker of pool mounts the Datasets it serves; the
// CSI node plugin bind-mounts them from there into pods.
func WorkerMountsDir(pool string) string { return workerHostIndexRoot + "/" + pool + "/mounts" }

// defaultBlockSize is the API's default block size, for a pool that does not set one.
const defaultBlockSize = 64 << 20

func blockSize(pool *datav1alpha1.TierPool) int64 {
	if n := pool.Spec.BlockSize.Value(); n > 0 {
		return n
	}
	return defaultBlockSize
}

// Deployed says whether the operator deploys workers at all.
func (s WorkerSpec) Deployed() bool { return s.Image != "" }

// WorkerName is the name of the DaemonSet and the ConfigMap of a pool's workers.
func WorkerName(pool string) string { return "strata-worker-" + pool }

// workerNameProblem says why a pool's workers cannot be deployed under its name, or "" when they
// can. Pool names are DNS subdomains of up to 253 characters, but the pods are labelled with the
// name and a label value holds at most 63.
func workerNameProblem(pool string) string {
	if errs := validation.IsValidLabelValue(pool); len(errs) > 0 {
		return fmt.Sprintf("the pool's name is %d characters long, but its workers' pods carry it in the label "+
			"app.kubernetes.io/instance (%s): recreate the pool under a shorter name", len(pool), strings.Join(errs, "; "))
	}
	return ""
}

func workerLabels(pool string) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":       "strata-worker",
		"app.kubernetes.io/instance":   pool,
		"app.kubernetes.io/component":  "worker",
		"app.kubernetes.io/part-of":    "strata",
		"app.kubernetes.io/managed-by": "strata-operator",
	}
}

func workerSelector(pool string) map[string]string {
	return map[string]string{"app.kubernetes.io/name": "strata-worker", "app.kubernetes.io/instance": pool}
}

// workerPodsSelector is the label selector of a pool's worker pods, as kubectl takes it.
func workerPodsSelector(pool string) string {
	return "app.kubernetes.io/name=strata-worker,app.kubernetes.io/instance=" + pool
}

func (s WorkerSpec) objectMeta(pool string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: WorkerName(pool), Namespace: s.Namespace, Labels: workerLabels(pool)}
}

// tiersFile is the tiers file the worker reads (--tiers): the pool's spec.tiers as a YAML list.
func tiersFile(pool *datav1alpha1.TierPool) (string, error) {
	raw, err := yaml.Marshal(pool.Spec.Tiers)
	if err != nil {
		return "", fmt.Errorf("writing the tiers of TierPool %s as YAML: %w", pool.Name, err)
	}
	return string(raw), nil
}

// configMap holds the pool's tiers file and its policies file. Only the tiers are hashed into
// the pods' template: the workers apply policies live.
func (s WorkerSpec) configMap(pool *datav1alpha1.TierPool, tiers, policies string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: s.objectMeta(pool.Name),
		Data:       map[string]string{WorkerTiersKey: tiers, policy.FileName: policies},
	}
}

// daemonSet runs one worker on each node the pool selects. Every field the API server would
// default is set here, so that the DaemonSet read back compares equal to this one and an
// unchanged pool causes no write.
func (s WorkerSpec) daemonSet(pool *datav1alpha1.TierPool, tiers string) *appsv1.DaemonSet {
	name := pool.Name
	hash := sha256.Sum256([]byte(tiers))
	socketDir := workerSocketRoot + "/" + name
	mountsDir := WorkerMountsDir(name)

	args := []string{
		"--pool=" + name,
		// The kubelet expands $(VAR) from the container's environment.
		"--worker-id=" + name + "/$(NODE_NAME)",
		"--node-name=$(NODE_NAME)",
	}
	if len(s.MasterAddresses) > 0 {
		args = append(args, "--master="+strings.Join(s.MasterAddresses, ","))
	}
	args = append(args,
		"--tiers="+workerConfigDir+"/"+WorkerTiersKey,
		"--policies="+workerConfigDir+"/"+policy.FileName,
		// The checkpoint settings carry tenants' keys: the operator serves them to the pool's
		// workers alone, over mutual TLS, rather than keep them in a Secret.
		"--checkpoints-url="+s.TLS.CheckpointsURL(name),
		"--index-dir="+workerIndexDir,
		"--listings-dir="+workerListingsDir,
		fmt.Sprintf("--data-addr=:%d", WorkerDataPort),
		fmt.Sprintf("--advertise-addr=$(POD_IP):%d", WorkerDataPort),
		fmt.Sprintf("--metrics-addr=:%d", WorkerMetricsPort),
		"--mount-socket="+socketDir+"/mount.sock",
		"--fd-store-socket="+fdstore.SocketPath(workerSocketRoot),
		"--mounts-dir="+mountsDir,
		"--block-size="+strconv.FormatInt(blockSize(pool), 10),
	)
	args = append(args, s.TLS.args()...)
	if len(pool.Spec.FileSourceRoots) > 0 {
		args = append(args, "--file-source-roots="+strings.Join(pool.Spec.FileSourceRoots, ","))
	}

	volumes := []corev1.Volume{
		{Name: "tiers", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: WorkerName(name)},
			DefaultMode:          ptr.To(corev1.ConfigMapVolumeSourceDefaultMode),
		}}},
		hostPathVolume("index", workerHostIndexRoot+"/"+name+"/index"),
		hostPathVolume("listings", workerHostIndexRoot+"/"+name+"/listings"),
		hostPathVolume("socket", socketDir),
		hostPathVolume("fdstore", filepath.Dir(fdstore.SocketPath(workerSocketRoot))),
		hostPathVolume("mounts", mountsDir),
		s.TLS.volume(),
	}
	mounts := []corev1.VolumeMount{
		s.TLS.volumeMount(),
		{Name: "tiers", MountPath: workerConfigDir, ReadOnly: true},
		{Name: "index", MountPath: workerIndexDir},
		{Name: "listings", MountPath: workerListingsDir},
		{Name: "socket", MountPath: socketDir},
		// The CSI node plugin's file descriptor store, which keeps the worker's FUSE mounts up
		// across its restarts.
		{Name: "fdstore", MountPath: filepath.Dir(fdstore.SocketPath(workerSocketRoot))},
		// The worker mounts each Dataset of its node here over FUSE; Bidirectional puts those
		// mounts on the host, where the CSI node plugin bind-mounts them into pods.
		{Name: "mounts", MountPath: mountsDir, MountPropagation: ptr.To(corev1.MountPropagationBidirectional)},
	}
	tierVols, tierMounts := tierVolumes(pool.Spec.Tiers)
	volumes = append(volumes, tierVols...)
	mounts = append(mounts, tierMounts...)
	for i, root := range pool.Spec.FileSourceRoots {
		// file:// Datasets are read from these host folders, and only from them; read-only.
		name := fmt.Sprintf("source-root-%d", i)
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
			Path: root, Type: ptr.To(corev1.HostPathDirectory),
		}}})
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: root, ReadOnly: true,
			MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)})
	}

	labels := workerLabels(name)
	return &appsv1.DaemonSet{
		ObjectMeta: s.objectMeta(name),
		Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: workerSelector(name)},
			// One node at a time, and never two workers on one node: they would share the
			// node's tier directories and index.
			UpdateStrategy: appsv1.DaemonSetUpdateStrategy{
				Type: appsv1.RollingUpdateDaemonSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDaemonSet{
					MaxUnavailable: ptr.To(intstr.FromInt32(1)),
					MaxSurge:       ptr.To(intstr.FromInt32(0)),
				},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels: labels,
					Annotations: map[string]string{
						TiersHashAnnotation:                       hex.EncodeToString(hash[:]),
						"kubectl.kubernetes.io/default-container": workerContainerName,
					},
				},
				Spec: corev1.PodSpec{
					NodeSelector: pool.Spec.NodeSelector,
					Tolerations:  pool.Spec.Tolerations,
					// The workers' own account, with no permission; no API token is mounted, only
					// the token for the operator's issuer (ComponentTLS).
					ServiceAccountName:           WorkerServiceAccountName,
					DeprecatedServiceAccount:     WorkerServiceAccountName,
					AutomountServiceAccountToken: ptr.To(false),
					EnableServiceLinks:           ptr.To(false),
					// The container runs privileged, as root: see its security context.
					SecurityContext: &corev1.PodSecurityContext{},
					// The node's PID namespace: the kernel tells the FUSE server which process
					// writes an output file by its PID in the mounter's namespace (0 for one
					// outside it), and the worker finds its pod from the process's cgroup, so that
					// a killed pod's files and its retry's are told apart (cacheworker/callerpod).
					HostPID:                       true,
					TerminationGracePeriodSeconds: ptr.To[int64](workerTerminationGrace),
					RestartPolicy:                 corev1.RestartPolicyAlways,
					DNSPolicy:                     corev1.DNSClusterFirst,
					SchedulerName:                 corev1.DefaultSchedulerName,
					Containers: []corev1.Container{{
						Name:            workerContainerName,
						Image:           s.Image,
						ImagePullPolicy: s.ImagePullPolicy,
						Args:            args,
						Env: []corev1.EnvVar{
							fieldEnv("NODE_NAME", "spec.nodeName"),
							fieldEnv("POD_IP", "status.podIP"),
							fieldEnv("POD_NAMESPACE", "metadata.namespace"),
						},
						Ports: []corev1.ContainerPort{
							{Name: "data", ContainerPort: WorkerDataPort, Protocol: corev1.ProtocolTCP},
							{Name: "metrics", ContainerPort: WorkerMetricsPort, Protocol: corev1.ProtocolTCP},
						},
						// Liveness and readiness wait for the startup probe, which allows a long
						// verification of the tiers at start.
						StartupProbe:   httpProbe("/healthz", workerStartupPeriod, 1, workerStartupFailures),
						LivenessProbe:  httpProbe("/healthz", 10, 5, 3),
						ReadinessProbe: httpProbe("/readyz", 5, 1, 3),
						Resources:      workerResources(pool),
						// Privileged: the worker mounts a tmpfs on a MEM tier's path (and the mount
						// must propagate to the host, which Bidirectional mounts allow only to
						// privileged containers), and it serves the datasets of its node over FUSE.
						SecurityContext:          &corev1.SecurityContext{Privileged: ptr.To(true)},
						VolumeMounts:             mounts,
						TerminationMessagePath:   corev1.TerminationMessagePathDefault,
						TerminationMessagePolicy: corev1.TerminationMessageReadFile,
					}},
					Volumes: volumes,
				},
			},
		},
	}
}

// tierVolumes returns one hostPath volume and its mount, at the same path inside the container,
// for every path of every tier. The tiers file names host paths, and the worker opens them as
// they are written there.
func tierVolumes(tiers []datav1alpha1.Tier) ([]corev1.Volume, []corev1.VolumeMount) {
	var volumes []corev1.Volume
	var mounts []corev1.VolumeMount
	// A path listed twice is mounted once (two mounts at one path make an invalid pod); the
	// worker refuses such a tiers file and says why, which is where the mistake is fixed.
	mountOf := map[string]int{}
	for ti, tier := range tiers {
		for pi, path := range tier.Paths {
			i, seen := mountOf[path]
			if !seen {
				name := tierVolumeName(ti, tier.Name, pi)
				volumes = append(volumes, hostPathVolume(name, path))
				mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: path})
				i = len(mounts) - 1
				mountOf[path] = i
			}
			if tier.Medium == datav1alpha1.MediumMemory {
				// The worker mounts a tmpfs here when none is; Bidirectional puts that mount on
				// the host, where it outlives the pod, so a restarted worker keeps its memory tier.
				mounts[i].MountPropagation = ptr.To(corev1.MountPropagationBidirectional)
			}
		}
	}
	return volumes, mounts
}

// tierVolumeName names the volume of a tier's path: a DNS label, never derived from the path.
// Tier names are DNS labels themselves; one too long to fit is replaced by the tier's position.
func tierVolumeName(tierIndex int, tier string, pathIndex int) string {
	if name := fmt.Sprintf("tier-%s-%d", tier, pathIndex); len(name) <= validation.DNS1123LabelMaxLength {
		return name
	}
	return fmt.Sprintf("tier%d-%d", tierIndex, pathIndex)
}

// workerResources are the pool's spec.workerResources with each MEM tier's quota added to the
// memory limit: the tmpfs pages the worker writes are charged to its container.
func workerResources(pool *datav1alpha1.TierPool) corev1.ResourceRequirements {
	res := *pool.Spec.WorkerResources.DeepCopy()
	limit, limited := res.Limits[corev1.ResourceMemory]
	if !limited {
		return res
	}
	for _, t := range pool.Spec.Tiers {
		if t.Medium == datav1alpha1.MediumMemory {
			limit.Add(t.Quota)
		}
	}
	res.Limits[corev1.ResourceMemory] = limit
	return res
}

func hostPathVolume(name, path string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
		Path: path,
		Type: ptr.To(corev1.HostPathDirectoryOrCreate),
	}}}
}

func fieldEnv(name, fieldPath string) corev1.EnvVar {
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: fieldPath},
	}}
}

func httpProbe(path string, period, timeout, failures int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: path, Port: intstr.FromString("metrics"), Scheme: corev1.URISchemeHTTP,
		}},
		PeriodSeconds:    period,
		TimeoutSeconds:   timeout,
		SuccessThreshold: 1,
		FailureThreshold: failures,
	}
}
