package controllers

import (
	"context"
	"fmt"
	"maps"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
)

// MasterServiceAccountName is the masters' ServiceAccount, created by the chart: the issuer
// certifies as masters only the pods that run as it.
const MasterServiceAccountName = "strata-master"

// Ports of a master replica.
const (
	MasterRaftPort    = 7000
	MasterGRPCPort    = 7001
	MasterMetricsPort = 9090
	// masterDataDir holds the Raft log, the snapshots and the metadata (BadgerDB).
	masterDataDir = "/var/lib/strata-master"
	// masterDataVolume is the volume (an emptyDir, or the claim template's) mounted there.
	masterDataVolume = "data"
)

// MasterSpec is what the operator runs as the master, from its flags (the chart's values).
// There is one master per Strata installation, so it is configuration, not a custom resource.
type MasterSpec struct {
	// Namespace the master runs in: the operator's own.
	Namespace string
	// Name of the StatefulSet; its Services are <Name> (clients) and <Name>-peers (headless).
	Name string
	// Image of the master.
	Image           string
	ImagePullPolicy corev1.PullPolicy
	// Replicas of the Raft group; 3 tolerates the loss of one, 5 of two.
	Replicas int32
	// Resources of each replica.
	Resources corev1.ResourceRequirements
	// TLS is how the replicas get their certificates.
	TLS ComponentTLS
	// StorageSize, when set, gives each replica a PersistentVolumeClaim of that size (of
	// StorageClassName, or the cluster's default class when empty); when zero, an emptyDir, so a
	// rescheduled replica starts empty and rejoins its peers, which send it the state.
	StorageSize      resource.Quantity
	StorageClassName string
	// Tolerations let replicas run on tainted nodes, such as the control plane's: a cluster
	// with few untainted nodes would otherwise put a majority of replicas on one of them.
	Tolerations []corev1.Toleration
	// Owner, when set, is the operator's Deployment: the master is garbage-collected with it, so
	// that uninstalling Strata leaves no master behind.
	Owner *metav1.OwnerReference
}

// PeersServiceName is the headless Service through which replicas find each other.
func (s MasterSpec) PeersServiceName() string { return s.Name + "-peers" }

// Addresses are the gRPC addresses of every replica, in ordinal order, as clients dial them.
func (s MasterSpec) Addresses() []string {
	addrs := make([]string, s.Replicas)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("%s-%d.%s.%s.svc:%d", s.Name, i, s.PeersServiceName(), s.Namespace, MasterGRPCPort)
	}
	return addrs
}

func (s MasterSpec) labels() map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":       "strata-master",
		"app.kubernetes.io/instance":   s.Name,
		"app.kubernetes.io/component":  "master",
		"app.kubernetes.io/part-of":    "strata",
		"app.kubernetes.io/managed-by": "strata-operator",
	}
}

func (s MasterSpec) selector() map[string]string {
	return map[string]string{"app.kubernetes.io/name": "strata-master", "app.kubernetes.io/instance": s.Name}
}

// MasterReconciler deploys the master StatefulSet and its Services, and heals them: a deleted
// object is recreated and a changed one is put back as the spec says.
type MasterReconciler struct {
	Client client.Client
	// APIReader lists the master's pods (the cache holds no pod of the operator's namespace).
	APIReader client.Reader
	// Recorder says on the StatefulSet what a change of the master's storage did or why not.
	Recorder record.EventRecorder
	Spec     MasterSpec
}

// +kubebuilder:rbac:groups=apps,namespace=strata-system,resources=statefulsets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",namespace=strata-system,resources=services,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups="",namespace=strata-system,resources=pods,verbs=delete
// +kubebuilder:rbac:groups=apps,namespace=strata-system,resources=statefulsets,resourceNames=strata-master,verbs=delete
// +kubebuilder:rbac:groups="",namespace=strata-system,resources=persistentvolumeclaims,verbs=patch

// Reconcile makes the master's objects match the spec. Every request means the same thing.
func (r *MasterReconciler) Reconcile(ctx context.Context, _ ctrl.Request) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx).WithValues("master", r.Spec.Namespace+"/"+r.Spec.Name)
	sts := r.statefulSet()
	updateSts, requeue, err := r.reconcileStorage(ctx, sts)
	if err != nil {
		return ctrl.Result{}, err
	}
	for _, obj := range []client.Object{r.peersService(), r.clientService(), sts} {
		if obj == client.Object(sts) && !updateSts {
			continue
		}
		desired := obj.DeepCopyObject().(client.Object)
		result, err := controllerutil.CreateOrUpdate(ctx, r.Client, obj, func() error {
			return r.mutate(obj, desired)
		})
		if err != nil {
			return ctrl.Result{}, fmt.Errorf("applying %T %s: %w", obj, obj.GetName(), err)
		}
		if result != controllerutil.OperationResultNone {
			log.Info("master object applied", "kind", fmt.Sprintf("%T", obj), "name", obj.GetName(), "operation", result)
		}
	}
	if r.APIReader == nil {
		return ctrl.Result{RequeueAfter: requeue}, nil
	}
	var pods corev1.PodList
	if err := r.APIReader.List(ctx, &pods, client.InNamespace(r.Spec.Namespace), client.MatchingLabels(r.Spec.selector())); err != nil {
		return ctrl.Result{}, fmt.Errorf("listing the master's pods: %w", err)
	}
	if replaced, err := r.replacePlaintextReplicas(ctx, pods.Items); err != nil || replaced {
		return ctrl.Result{RequeueAfter: rolloutRecheck}, err
	}
	rolling, err := r.replaceStalledReplicas(ctx, pods.Items)
	if err != nil {
		return ctrl.Result{}, err
	}
	if rolling && (requeue == 0 || requeue > rolloutRecheck) {
		requeue = rolloutRecheck
	}
	return ctrl.Result{RequeueAfter: requeue}, nil
}

// replacePlaintextReplicas deletes, all at once, the replicas of a version that spoke no TLS
// (an upgrade from before mutual TLS): a replica that speaks it cannot join them, nor they it,
// so a rolling update would stall at its first pod with the rest of the group unable to reach
// it. The StatefulSet (Parallel) starts them again together, on TLS; with persistent storage
// they keep their state, on an emptyDir the workers report their blocks to the new group.
func (r *MasterReconciler) replacePlaintextReplicas(ctx context.Context, pods []corev1.Pod) (replaced bool, err error) {
	var plaintext []*corev1.Pod
	for i := range pods {
		p := &pods[i]
		if p.DeletionTimestamp == nil && !speaksTLS(p) {
			plaintext = append(plaintext, p)
		}
	}
	if len(plaintext) == 0 {
		return false, nil
	}
	log := ctrl.LoggerFrom(ctx)
	for _, p := range plaintext {
		log.Info("replacing a master replica that speaks no TLS, with the others at once", "pod", p.Name)
		if err := r.Client.Delete(ctx, p, client.Preconditions{UID: &p.UID}); client.IgnoreNotFound(err) != nil {
			return true, fmt.Errorf("deleting master pod %s/%s, which speaks no TLS: %w", p.Namespace, p.Name, err)
		}
	}
	return true, nil
}

// speaksTLS says whether a master pod runs with a certificate (the flags of ComponentTLS).
func speaksTLS(p *corev1.Pod) bool {
	for _, c := range p.Spec.Containers {
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--ca-file=") {
				return true
			}
		}
	}
	return false
}

// mutate copies into current, read from the server, the fields of desired that the operator
// owns. Fields the API server defaults or forbids changing are left alone.
func (r *MasterReconciler) mutate(current, desired client.Object) error {
	labels := current.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, desired.GetLabels())
	current.SetLabels(labels)
	if r.Spec.Owner != nil {
		current.SetOwnerReferences([]metav1.OwnerReference{*r.Spec.Owner})
	}
	switch cur := current.(type) {
	case *corev1.Service:
		want := desired.(*corev1.Service)
		cur.Spec.Selector = want.Spec.Selector
		cur.Spec.Ports = want.Spec.Ports
		cur.Spec.PublishNotReadyAddresses = want.Spec.PublishNotReadyAddresses
		if cur.CreationTimestamp.IsZero() {
			cur.Spec.ClusterIP = want.Spec.ClusterIP
		}
	case *appsv1.StatefulSet:
		want := desired.(*appsv1.StatefulSet)
		cur.Spec.Replicas = want.Spec.Replicas
		cur.Spec.Template = want.Spec.Template
		if cur.CreationTimestamp.IsZero() {
			// Immutable after creation.
			cur.Spec.Selector = want.Spec.Selector
			cur.Spec.ServiceName = want.Spec.ServiceName
			cur.Spec.PodManagementPolicy = want.Spec.PodManagementPolicy
			cur.Spec.VolumeClaimTemplates = want.Spec.VolumeClaimTemplates
		}
	}
	return nil
}

func (r *MasterReconciler) objectMeta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: r.Spec.Namespace, Labels: r.Spec.labels()}
}

// peersService is headless and publishes replicas before they are ready: a replica must find
// its peers to become ready at all.
func (r *MasterReconciler) peersService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: r.objectMeta(r.Spec.PeersServiceName()),
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			PublishNotReadyAddresses: true,
			Selector:                 r.Spec.selector(),
			Ports: []corev1.ServicePort{
				{Name: "raft", Port: MasterRaftPort, TargetPort: intstr.FromString("raft")},
				{Name: "grpc", Port: MasterGRPCPort, TargetPort: intstr.FromString("grpc")},
			},
		},
	}
}

// clientService balances over ready replicas; clients that reach a follower are told the leader.
func (r *MasterReconciler) clientService() *corev1.Service {
	return &corev1.Service{
		ObjectMeta: r.objectMeta(r.Spec.Name),
		Spec: corev1.ServiceSpec{
			Selector: r.Spec.selector(),
			Ports: []corev1.ServicePort{
				{Name: "grpc", Port: MasterGRPCPort, TargetPort: intstr.FromString("grpc")},
				{Name: "metrics", Port: MasterMetricsPort, TargetPort: intstr.FromString("metrics")},
			},
		},
	}
}

func (r *MasterReconciler) statefulSet() *appsv1.StatefulSet {
	s := r.Spec
	replicas := s.Replicas
	nonRoot := true
	noEscalation := false
	user := int64(65532)
	sts := &appsv1.StatefulSet{
		ObjectMeta: r.objectMeta(s.Name),
		Spec: appsv1.StatefulSetSpec{
			Replicas:    &replicas,
			ServiceName: s.PeersServiceName(),
			// All replicas start at once: ordinal 0 bootstraps, the others join it; ordered
			// start would keep ordinal 1 waiting for a ready ordinal 0 that waits for a quorum.
			PodManagementPolicy: appsv1.ParallelPodManagement,
			Selector:            &metav1.LabelSelector{MatchLabels: s.selector()},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: s.labels()},
				Spec: corev1.PodSpec{
					// Its own account, with no permission and no API token: only the token for
					// the operator's issuer (ComponentTLS), which certifies it as a master.
					ServiceAccountName:           MasterServiceAccountName,
					DeprecatedServiceAccount:     MasterServiceAccountName,
					AutomountServiceAccountToken: ptr.To(false),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   &nonRoot,
						RunAsUser:      &user,
						RunAsGroup:     &user,
						FSGroup:        &user,
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					// Replicas spread evenly over the nodes they may run on, strictly: with a
					// majority on one node, stopping that node stops the master. Nodes whose
					// taints the replicas do not tolerate (among them a stopped node's) are not
					// counted, so that a cluster with fewer nodes than replicas still runs
					// them all, and a stopped node's replica moves to the others.
					Tolerations: s.Tolerations,
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew:           1,
						TopologyKey:       corev1.LabelHostname,
						WhenUnsatisfiable: corev1.DoNotSchedule,
						LabelSelector:     &metav1.LabelSelector{MatchLabels: s.selector()},
						NodeTaintsPolicy:  ptr.To(corev1.NodeInclusionPolicyHonor),
					}},
					Containers: []corev1.Container{{
						Name:            "master",
						Image:           s.Image,
						ImagePullPolicy: s.ImagePullPolicy,
						// The flags of cmd/master; the namespace and the replica's id come from POD_NAMESPACE
						// and POD_NAME.
						Args: append([]string{
							"--statefulset",
							"--service=" + s.PeersServiceName(),
							fmt.Sprintf("--replicas=%d", s.Replicas),
							"--data-dir=" + masterDataDir,
							fmt.Sprintf("--raft-addr=:%d", MasterRaftPort),
							fmt.Sprintf("--grpc-addr=:%d", MasterGRPCPort),
							fmt.Sprintf("--metrics-addr=:%d", MasterMetricsPort),
						}, s.TLS.args()...),
						Env: []corev1.EnvVar{
							{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
							{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
						},
						Ports: []corev1.ContainerPort{
							{Name: "raft", ContainerPort: MasterRaftPort},
							{Name: "grpc", ContainerPort: MasterGRPCPort},
							{Name: "metrics", ContainerPort: MasterMetricsPort},
						},
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("metrics")}},
							PeriodSeconds: 2,
						},
						LivenessProbe: &corev1.Probe{
							ProbeHandler:     corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("metrics")}},
							PeriodSeconds:    10,
							FailureThreshold: 3,
						},
						Resources: s.Resources,
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: &noEscalation,
							ReadOnlyRootFilesystem:   &nonRoot,
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: masterDataVolume, MountPath: masterDataDir}, s.TLS.volumeMount()},
					}},
				},
			},
		},
	}
	sts.Spec.Template.Spec.Volumes = []corev1.Volume{s.TLS.volume()}
	if s.StorageSize.IsZero() {
		sts.Spec.Template.Spec.Volumes = append(sts.Spec.Template.Spec.Volumes,
			corev1.Volume{Name: masterDataVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	} else {
		claim := corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: masterDataVolume},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: s.StorageSize}},
			},
		}
		if s.StorageClassName != "" {
			claim.Spec.StorageClassName = &s.StorageClassName
		}
		sts.Spec.VolumeClaimTemplates = []corev1.PersistentVolumeClaim{claim}
	}
	return sts
}

// singleton is the event handler of a controller that reconciles one object, key, whatever
// changed (every request names key), and the source that queues a request for it once, when
// the manager starts (obj, empty, gives the source its type).
func singleton(key types.NamespacedName, obj client.Object) (handler.EventHandler, source.Source) {
	toKey := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{{NamespacedName: key}}
	})
	obj.SetNamespace(key.Namespace)
	obj.SetName(key.Name)
	start := make(chan event.GenericEvent, 1)
	start <- event.GenericEvent{Object: obj}
	return toKey, source.Channel(start, toKey)
}

// SetupWithManager runs the reconciler once at start and again whenever one of the master's
// objects changes or disappears.
func (r *MasterReconciler) SetupWithManager(mgr ctrl.Manager) error {
	key := types.NamespacedName{Namespace: r.Spec.Namespace, Name: r.Spec.Name}
	ours := predicate.NewPredicateFuncs(func(obj client.Object) bool {
		return obj.GetNamespace() == r.Spec.Namespace &&
			(obj.GetName() == r.Spec.Name || obj.GetName() == r.Spec.PeersServiceName())
	})
	toKey, start := singleton(key, &appsv1.StatefulSet{})
	return ctrl.NewControllerManagedBy(mgr).
		Named("master").
		WatchesRawSource(start).
		Watches(&appsv1.StatefulSet{}, toKey, builder.WithPredicates(ours)).
		Watches(&corev1.Service{}, toKey, builder.WithPredicates(ours)).
		Complete(r)
}
