package controllers

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/internal/pki"
)

// A pvc:// source is a claim of the Dataset's namespace, which only pods of that namespace can
// mount, and workers run in Strata's. So the operator runs a claim server there: a Deployment
// of one pod that mounts the claim read-only and serves the source's folder over HTTPS with
// client certificates (`worker serve-claim`), a Service in front of it, a Secret with the
// bearer token the workers send, which the Dataset's PersistentVolume hands them at publish
// time, and a Secret with the server's certificate for its Service's name, which the operator
// signs with Strata's CA and renews. All are owned by the Dataset and go with it.

// Reasons of a Dataset whose claim server is not serving.
const (
	ReasonClaimServerNotReady = "ClaimServerNotReady"
	ReasonClaimServerNoImage  = "ClaimServerNotAvailable"
	ReasonObjectInTheWay      = "ObjectInTheWay"
)

const (
	// ClaimServerComponent labels the objects of claim servers; the operator watches only
	// Deployments with it outside its own namespace.
	ClaimServerComponent = "claim-server"
	componentLabel       = "app.kubernetes.io/component"
	// datasetLabel names the Dataset an object was made for.
	datasetLabel = "data.strata.dev/dataset"
	// claimTokenKey is the key of the token in the claim server's Secret: the key the worker's
	// pvc:// store reads from the credentials the kubelet hands over.
	claimTokenKey = understore.CredentialToken
	// templateHashAnnotation records which pod template a claim server's Deployment was made
	// from, so that a changed one (a new worker image) is rolled out.
	templateHashAnnotation = "data.strata.dev/template-hash"
	claimMountPath         = "/claim"
	claimTokenDir          = "/var/run/strata/claim-token"
	claimTLSDir            = "/var/run/strata/claim-tls"
	// claimCertificateValidity is how long a claim server's certificate is valid. The operator
	// renews it with a third left, and the kubelet brings the new one to the pod within a
	// minute or so: ten days in which the operator may be down without a claim server's
	// certificate running out.
	claimCertificateValidity = 30 * 24 * time.Hour
)

// ClaimServerTLS is what puts claim servers on mutual TLS: the CA that certifies them, and the
// TLS configuration the operator probes them with (understore.ClaimClientTLS of its own
// certificate).
type ClaimServerTLS struct {
	CA     *pki.CA
	Client *tls.Config
}

// sourceAccess is how the workers and the operator reach a Dataset's source: the source with
// the credentials they use, and the Secret that holds those credentials.
type sourceAccess struct {
	source understore.Source
	// mounts are the stores of a Dataset with spec.mounts, in place of source.
	mounts []mountAccess
	// secretName is the Secret of the Dataset's namespace the kubelet gives the CSI plugin at
	// publish; empty for none.
	secretName string
	// secretVersion changes when the credentials change, so that a probe is made again.
	secretVersion string
	// renewAt is when a claim server's certificate is to be renewed; zero for other sources.
	renewAt time.Time
}

// claimServerName is the name of the Deployment, Service and Secret of a Dataset's claim
// server, within the 63 characters a Service name may have.
func claimServerName(ds *datav1alpha1.Dataset) string {
	return childName(ds, "-claim-server")
}

// ClaimServerEndpoint is the URL of the claim server Service name of namespace ns, as pods of
// any namespace reach it.
func ClaimServerEndpoint(ns, name string) string {
	return fmt.Sprintf("https://%s:%d", pki.ServiceDNSName(ns, name), understore.ClaimServerPort)
}

// accessSource says how a Dataset's source is reached, making the claim server of a pvc://
// source if need be. It returns the problem the user must fix, if any.
func (r *DatasetReconciler) accessSource(ctx context.Context, ds *datav1alpha1.Dataset) (*sourceAccess, *problem, error) {
	if len(ds.Spec.Mounts) > 0 {
		return r.accessMounts(ctx, ds)
	}
	src := ds.Spec.Source
	if src == nil {
		return nil, nil, nil
	}
	access := &sourceAccess{source: understore.Source{URI: src.URI, Endpoint: src.Endpoint, Region: src.Region, Credentials: map[string]string{}}}
	if strings.HasPrefix(src.URI, "pvc://") {
		secret, renewAt, p, err := r.ensureClaimServer(ctx, ds, claimServerFor(ds, datasetStores(ds)[0]), &access.source)
		if p != nil || err != nil {
			return access, p, err
		}
		access.secretName, access.secretVersion, access.renewAt = secret.Name, secret.ResourceVersion, renewAt
		return access, nil, nil
	}
	if src.WebIdentity != nil {
		return r.accessWebIdentity(ctx, ds, access)
	}
	if src.SecretRef != nil {
		secret := &corev1.Secret{}
		if err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: src.SecretRef.Name}, secret); err != nil {
			return nil, nil, fmt.Errorf("reading Secret %s/%s: %w", ds.Namespace, src.SecretRef.Name, err)
		}
		for k, v := range secret.Data {
			access.source.Credentials[k] = string(v)
		}
		access.secretName, access.secretVersion = secret.Name, secret.ResourceVersion
	}
	return access, nil, nil
}

// accessWebIdentity gives access, the spec.source of ds, the credentials of its web identity,
// kept in webIdentitySecretName for the kubelet to hand to the CSI plugin.
func (r *DatasetReconciler) accessWebIdentity(ctx context.Context, ds *datav1alpha1.Dataset, access *sourceAccess) (*sourceAccess, *problem, error) {
	name := webIdentitySecretName(ds)
	kept, err := r.keptSecret(ctx, ds, name)
	if err != nil {
		return nil, nil, err
	}
	creds, renewAt, p, err := r.webIdentityCredentials(ctx, ds, datasetStores(ds)[0], stringData(kept), time.Now())
	if p != nil || err != nil {
		return nil, p, err
	}
	data := map[string][]byte{}
	for k, v := range creds {
		data[k] = []byte(v)
	}
	secret, p, err := r.ensureKeptSecret(ctx, ds, name, kept, data)
	if p != nil || err != nil {
		return nil, p, err
	}
	access.source.Credentials = creds
	access.secretName, access.secretVersion, access.renewAt = secret.Name, secret.ResourceVersion, renewAt
	return access, nil, nil
}

// claimServerPodDataset maps a claim server's pod to its Dataset, so that a pod that fails or
// becomes ready is reported at once.
func claimServerPodDataset(_ context.Context, obj client.Object) []reconcile.Request {
	labels := obj.GetLabels()
	if labels[componentLabel] != ClaimServerComponent || labels[datasetLabel] == "" {
		return nil
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: obj.GetNamespace(), Name: labels[datasetLabel]}}}
}

// claimServer is the server that reads one pvc:// store of a Dataset: its spec.source, or a
// mount of its spec.mounts.
type claimServer struct {
	// name is its Deployment's, Service's and token Secret's.
	name string
	// claim is the claim it mounts, and subPath the folder of it that it serves.
	claim, subPath string
	// mount is the index of the mount it serves, as a label value; "" for spec.source.
	mount string
}

// claimMountLabel tells apart the pods of the claim servers of one Dataset's mounts.
const claimMountLabel = "data.strata.dev/claim-mount"

// claimServerFor is the claim server of ref, a pvc:// store of ds.
func claimServerFor(ds *datav1alpha1.Dataset, ref storeRef) claimServer {
	claim, subPath := claimAndPath(ref.src.URI)
	if ref.index < 0 {
		return claimServer{name: claimServerName(ds), claim: claim, subPath: subPath}
	}
	return claimServer{
		name:  childName(ds, fmt.Sprintf("-claim-server-%d", ref.index)),
		claim: claim, subPath: subPath, mount: strconv.Itoa(ref.index),
	}
}

// ensureClaimServer makes srv, a claim server of ds, gives src what reaching it takes (its
// endpoint, token and TLS) and says whether it serves. It returns the Secret with its token and
// when its certificate is to be renewed.
func (r *DatasetReconciler) ensureClaimServer(ctx context.Context, ds *datav1alpha1.Dataset, srv claimServer, src *understore.Source) (*corev1.Secret, time.Time, *problem, error) {
	if r.WorkerImage.Image == "" {
		return nil, time.Time{}, &problem{ReasonClaimServerNoImage,
			"the operator was started without a worker image (--worker-image), so it cannot serve pvc:// sources: reinstall Strata with its worker image"}, nil
	}
	if r.ClaimServerTLS == nil {
		return nil, time.Time{}, &problem{ReasonClaimServerNoImage,
			"the operator was started without Strata's CA, so it cannot certify claim servers: reinstall Strata with its chart"}, nil
	}
	secret, p, err := r.ensureClaimToken(ctx, ds, srv.name)
	if p != nil || err != nil {
		return nil, time.Time{}, p, err
	}
	renewAt, p, err := r.ensureClaimCertificate(ctx, ds, srv.name)
	if p != nil || err != nil {
		return nil, time.Time{}, p, err
	}
	src.Endpoint = r.claimServerEndpoint(ds.Namespace, srv.name)
	src.Credentials[claimTokenKey] = string(secret.Data[claimTokenKey])
	src.ClaimServerTLS = r.ClaimServerTLS.Client
	src.ClaimServerName = pki.ServiceDNSName(ds.Namespace, srv.name)
	if p, err := r.ensureClaimService(ctx, ds, srv); p != nil || err != nil {
		return nil, time.Time{}, p, err
	}
	deploy, p, err := r.ensureClaimDeployment(ctx, ds, srv)
	if p != nil || err != nil {
		return nil, time.Time{}, p, err
	}
	if deploy.Status.AvailableReplicas > 0 && deploy.Status.ObservedGeneration >= deploy.Generation {
		return secret, renewAt, nil, nil
	}
	why, err := r.claimServerPodState(ctx, ds, srv)
	if err != nil {
		return nil, time.Time{}, nil, err
	}
	return nil, time.Time{}, &problem{ReasonClaimServerNotReady, fmt.Sprintf(
		"the claim server that reads PersistentVolumeClaim %q for Strata is not ready (Deployment %s/%s): %s",
		srv.claim, ds.Namespace, srv.name, why)}, nil
}

func (r *DatasetReconciler) claimServerEndpoint(ns, name string) string {
	if r.ClaimServerEndpoint != nil {
		return r.ClaimServerEndpoint(ns, name)
	}
	return ClaimServerEndpoint(ns, name)
}

// claimAndPath are the claim a pvc:// URI names and the folder of it.
func claimAndPath(uri string) (claim, subPath string) {
	claim, subPath, _ = strings.Cut(strings.TrimPrefix(uri, "pvc://"), "/")
	return claim, strings.Trim(subPath, "/")
}

func claimServerLabels(ds *datav1alpha1.Dataset) map[string]string {
	labels := datasetLabels(ds)
	labels[componentLabel] = ClaimServerComponent
	return labels
}

// claimServerSelector selects the pods of srv, a claim server of ds, by the Dataset's UID so
// that a Dataset deleted and made again never matches the old one's pods, and by the mount it
// serves.
func claimServerSelector(ds *datav1alpha1.Dataset, srv claimServer) map[string]string {
	selector := map[string]string{componentLabel: ClaimServerComponent, "data.strata.dev/dataset-uid": string(ds.UID)}
	if srv.mount != "" {
		selector[claimMountLabel] = srv.mount
	}
	return selector
}

// owned checks that an existing object of a Dataset's is the Dataset's own: a Secret or
// Service of the same name made by someone else must not be used, nor changed.
func owned(ds *datav1alpha1.Dataset, obj client.Object, kind string) *problem {
	if metav1.IsControlledBy(obj, ds) {
		return nil
	}
	return &problem{ReasonObjectInTheWay, fmt.Sprintf(
		"a %s %s/%s that this Dataset does not own is in the way of one Strata makes for it: rename the Dataset or delete the %s",
		kind, obj.GetNamespace(), obj.GetName(), kind)}
}

// createOwned creates obj, controlled by ds. If an object of its name exists already (made by
// an earlier reconcile that the cache has not caught up with, or by someone else, or not
// cached at all), obj becomes that object, read from the API server, and is checked to be the
// Dataset's.
func (r *DatasetReconciler) createOwned(ctx context.Context, ds *datav1alpha1.Dataset, obj client.Object, kind string) (created bool, _ *problem, _ error) {
	if err := controllerutil.SetControllerReference(ds, obj, r.Client.Scheme()); err != nil {
		return false, nil, fmt.Errorf("owning %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
	}
	err := r.Client.Create(ctx, obj)
	switch {
	case err == nil:
		return true, nil, nil
	case !apierrors.IsAlreadyExists(err):
		return false, nil, fmt.Errorf("creating %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
	}
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return false, nil, fmt.Errorf("reading %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
	}
	return false, owned(ds, obj, kind), nil
}

// ensureClaimToken makes the Secret with the token workers send to the claim server, once.
func (r *DatasetReconciler) ensureClaimToken(ctx context.Context, ds *datav1alpha1.Dataset, name string) (*corev1.Secret, *problem, error) {
	secret := &corev1.Secret{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: name}, secret)
	switch {
	case apierrors.IsNotFound(err):
		var raw [32]byte
		if _, err := rand.Read(raw[:]); err != nil {
			return nil, nil, fmt.Errorf("making a token: %w", err)
		}
		secret = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ds.Namespace, Labels: claimServerLabels(ds)},
			Type:       corev1.SecretTypeOpaque,
			Data:       map[string][]byte{claimTokenKey: []byte(hex.EncodeToString(raw[:]))},
		}
		if _, p, err := r.createOwned(ctx, ds, secret, "Secret"); p != nil || err != nil {
			return nil, p, err
		}
	case err != nil:
		return nil, nil, fmt.Errorf("reading Secret %s/%s: %w", ds.Namespace, name, err)
	default:
		if p := owned(ds, secret, "Secret"); p != nil {
			return nil, p, nil
		}
	}
	if len(secret.Data[claimTokenKey]) < 32 {
		return nil, &problem{ReasonObjectInTheWay, fmt.Sprintf(
			"the claim server's Secret %s/%s has lost its %s: delete the Secret and Strata makes a new one", ds.Namespace, name, claimTokenKey)}, nil
	}
	return secret, nil, nil
}

// claimCertificateSecretName is the Secret with a claim server's certificate: apart from the
// token's, since the kubelet hands the token's Secret to the CSI plugin at publish and the
// server's key is for the server alone.
func claimCertificateSecretName(name string) string { return name + "-tls" }

// ensureClaimCertificate makes the Secret with the claim server's certificate and key and
// Strata's CA, and renews the certificate once two thirds of its lifetime have passed, or when
// it is not of the current CA or not for the Service. It returns when to renew it next.
func (r *DatasetReconciler) ensureClaimCertificate(ctx context.Context, ds *datav1alpha1.Dataset, name string) (time.Time, *problem, error) {
	secretName := claimCertificateSecretName(name)
	leaf := pki.Leaf{
		Identity: pki.ClaimServer(ds.Namespace, name),
		DNSNames: []string{pki.ServiceDNSName(ds.Namespace, name)},
		Validity: claimCertificateValidity,
	}
	secret := &corev1.Secret{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: secretName}, secret)
	switch {
	case apierrors.IsNotFound(err):
		secret = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: secretName, Namespace: ds.Namespace, Labels: claimServerLabels(ds)},
			Type:       corev1.SecretTypeTLS,
		}
		if secret.Data, err = r.claimCertificate(leaf); err != nil {
			return time.Time{}, nil, err
		}
		if _, p, err := r.createOwned(ctx, ds, secret, "Secret"); p != nil || err != nil {
			return time.Time{}, p, err
		}
	case err != nil:
		return time.Time{}, nil, fmt.Errorf("reading Secret %s/%s: %w", ds.Namespace, secretName, err)
	default:
		if p := owned(ds, secret, "Secret"); p != nil {
			return time.Time{}, p, nil
		}
	}
	renewAt, why := r.claimCertificateRenewal(secret, leaf, time.Now())
	if why == "" {
		return renewAt, nil, nil
	}
	if secret.Data, err = r.claimCertificate(leaf); err != nil {
		return time.Time{}, nil, err
	}
	if err := r.Client.Update(ctx, secret); err != nil {
		return time.Time{}, nil, fmt.Errorf("renewing the certificate in Secret %s/%s: %w", ds.Namespace, secretName, err)
	}
	r.Recorder.Eventf(ds, corev1.EventTypeNormal, "ClaimServerCertified",
		"issued a new certificate for claim server %s in Secret %s: %s", name, secretName, why)
	renewAt, _ = r.claimCertificateRenewal(secret, leaf, time.Now())
	return renewAt, nil, nil
}

// claimCertificate is a new key and certificate for leaf, as the TLS Secret holds them.
func (r *DatasetReconciler) claimCertificate(leaf pki.Leaf) (map[string][]byte, error) {
	cert, key, err := r.ClaimServerTLS.CA.IssueKeyPair(leaf, time.Now())
	if err != nil {
		return nil, err
	}
	return map[string][]byte{corev1.TLSCertKey: cert, corev1.TLSPrivateKeyKey: key, caCertKey: r.ClaimServerTLS.CA.CertPEM}, nil
}

// caCertKey is where a claim server's TLS Secret holds Strata's CA, which its clients'
// certificates must be of.
const caCertKey = "ca.crt"

// claimCertificateRenewal says when the certificate in secret is to be renewed, or why it must
// be now.
func (r *DatasetReconciler) claimCertificateRenewal(secret *corev1.Secret, leaf pki.Leaf, now time.Time) (time.Time, string) {
	if !bytes.Equal(secret.Data[caCertKey], r.ClaimServerTLS.CA.CertPEM) {
		return time.Time{}, "Strata's CA is not the one the Secret holds"
	}
	// The pair is parsed once: its key must go with its certificate, which must be the CA's.
	pair, err := tls.X509KeyPair(secret.Data[corev1.TLSCertKey], secret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return time.Time{}, fmt.Sprintf("the Secret's key does not go with its certificate: %v", err)
	}
	cert := pair.Leaf
	if _, err := cert.Verify(x509.VerifyOptions{Roots: r.ClaimServerTLS.CA.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, CurrentTime: now}); err != nil {
		return time.Time{}, fmt.Sprintf("the Secret's certificate is not valid from Strata's CA: %v", err)
	}
	if id, err := pki.FromCertificate(cert); err != nil || id != leaf.Identity || !slices.Equal(cert.DNSNames, leaf.DNSNames) {
		return time.Time{}, "the Secret's certificate is not for the claim server's Service"
	}
	renewAt := cert.NotBefore.Add(cert.NotAfter.Sub(cert.NotBefore) * 2 / 3)
	if !now.Before(renewAt) {
		return time.Time{}, fmt.Sprintf("the certificate expires at %s", cert.NotAfter.UTC().Format(time.RFC3339))
	}
	return renewAt, ""
}

// ensureClaimService makes the Service in front of the claim server, and brings the port of
// one made before claim servers spoke TLS to theirs. Nothing else in it ever changes: it follows
// from the Dataset's name and UID. The operator caches the Services of claim servers only, so
// one of another's of the same name is met as a failed create.
func (r *DatasetReconciler) ensureClaimService(ctx context.Context, ds *datav1alpha1.Dataset, srv claimServer) (*problem, error) {
	name := srv.name
	ports := []corev1.ServicePort{{
		Name: "https", Port: understore.ClaimServerPort, TargetPort: intstr.FromString("https"), Protocol: corev1.ProtocolTCP,
	}}
	existing := &corev1.Service{}
	err := r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: name}, existing)
	switch {
	case err == nil:
		if p := owned(ds, existing, "Service"); p != nil {
			return p, nil
		}
		if len(existing.Spec.Ports) == 1 && existing.Spec.Ports[0].Name == ports[0].Name && existing.Spec.Ports[0].TargetPort == ports[0].TargetPort {
			return nil, nil
		}
		patch := client.MergeFrom(existing.DeepCopy())
		existing.Spec.Ports = ports
		if err := r.Client.Patch(ctx, existing, patch); err != nil {
			return nil, fmt.Errorf("updating the port of Service %s/%s: %w", ds.Namespace, name, err)
		}
		return nil, nil
	case !apierrors.IsNotFound(err):
		return nil, fmt.Errorf("reading Service %s/%s: %w", ds.Namespace, name, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ds.Namespace, Labels: claimServerLabels(ds)},
		Spec:       corev1.ServiceSpec{Selector: claimServerSelector(ds, srv), Ports: ports},
	}
	_, p, err := r.createOwned(ctx, ds, svc, "Service")
	return p, err
}

// ensureClaimDeployment makes the claim server's Deployment, or rolls out a changed template.
func (r *DatasetReconciler) ensureClaimDeployment(ctx context.Context, ds *datav1alpha1.Dataset, srv claimServer) (*appsv1.Deployment, *problem, error) {
	name := srv.name
	template := r.claimServerPod(ds, srv)
	hash, err := templateHash(template)
	if err != nil {
		return nil, nil, err
	}
	deploy := &appsv1.Deployment{}
	err = r.Client.Get(ctx, client.ObjectKey{Namespace: ds.Namespace, Name: name}, deploy)
	switch {
	case apierrors.IsNotFound(err):
		deploy = &appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{
				Name: name, Namespace: ds.Namespace, Labels: claimServerLabels(ds),
				Annotations: map[string]string{templateHashAnnotation: hash},
			},
			Spec: appsv1.DeploymentSpec{
				Replicas: ptr.To[int32](1),
				Selector: &metav1.LabelSelector{MatchLabels: claimServerSelector(ds, srv)},
				// A claim that only one node may attach (ReadWriteOnce) cannot be held by an
				// old and a new pod on different nodes at once.
				Strategy: appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType},
				Template: template,
			},
		}
		created, p, err := r.createOwned(ctx, ds, deploy, "Deployment")
		if p != nil || err != nil {
			return nil, p, err
		}
		if created {
			r.Recorder.Eventf(ds, corev1.EventTypeNormal, "ClaimServerCreated",
				"created Deployment %s to serve PersistentVolumeClaim %s to Strata's workers", name, srv.claim)
			return deploy, nil, nil
		}
	case err != nil:
		return nil, nil, fmt.Errorf("reading Deployment %s/%s: %w", ds.Namespace, name, err)
	default:
		if p := owned(ds, deploy, "Deployment"); p != nil {
			return nil, p, nil
		}
	}
	if deploy.Annotations[templateHashAnnotation] == hash {
		return deploy, nil, nil
	}
	patch := client.MergeFrom(deploy.DeepCopy())
	metav1.SetMetaDataAnnotation(&deploy.ObjectMeta, templateHashAnnotation, hash)
	deploy.Spec.Template = template
	if err := r.Client.Patch(ctx, deploy, patch); err != nil {
		return nil, nil, fmt.Errorf("updating Deployment %s/%s: %w", ds.Namespace, name, err)
	}
	return deploy, nil, nil
}

func templateHash(t corev1.PodTemplateSpec) (string, error) {
	raw, err := json.Marshal(t)
	if err != nil {
		return "", fmt.Errorf("hashing a pod template: %w", err)
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:8]), nil
}

// claimServerPod runs `worker serve-claim` over the claim, mounted read-only. It runs as root
// with DAC_OVERRIDE alone, so that it reads files whoever wrote them (the capability is one
// the baseline Pod Security level allows), with nothing else: no privilege escalation, a
// read-only root file system, no service account token.
func (r *DatasetReconciler) claimServerPod(ds *datav1alpha1.Dataset, srv claimServer) corev1.PodTemplateSpec {
	name, claim, subPath := srv.name, srv.claim, srv.subPath
	labels := claimServerLabels(ds)
	for k, v := range claimServerSelector(ds, srv) {
		labels[k] = v
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken: ptr.To(false),
			EnableServiceLinks:           ptr.To(false),
			SecurityContext: &corev1.PodSecurityContext{
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:            "claim-server",
				Image:           r.WorkerImage.Image,
				ImagePullPolicy: r.WorkerImage.ImagePullPolicy,
				Args: []string{"serve-claim", "--claim=" + claimMountPath, "--path=" + subPath,
					"--token-file=" + claimTokenDir + "/" + claimTokenKey, "--tls-dir=" + claimTLSDir},
				Ports: []corev1.ContainerPort{
					{Name: "https", ContainerPort: understore.ClaimServerPort, Protocol: corev1.ProtocolTCP},
					{Name: "health", ContainerPort: understore.ClaimServerHealthPort, Protocol: corev1.ProtocolTCP},
				},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
					Path: "/healthz", Port: intstr.FromString("health"),
				}}, PeriodSeconds: 5},
				// Why the server could not start (the folder is not in the claim) becomes the
				// pod's termination message, which the Dataset's condition repeats.
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				SecurityContext: &corev1.SecurityContext{
					RunAsUser:                ptr.To[int64](0),
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities: &corev1.Capabilities{
						Drop: []corev1.Capability{"ALL"},
						Add:  []corev1.Capability{"DAC_OVERRIDE"},
					},
				},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "claim", MountPath: claimMountPath, ReadOnly: true},
					{Name: "token", MountPath: claimTokenDir, ReadOnly: true},
					{Name: "tls", MountPath: claimTLSDir, ReadOnly: true},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "claim", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: true},
				}},
				{Name: "token", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
					SecretName: name, Items: []corev1.KeyToPath{{Key: claimTokenKey, Path: claimTokenKey}},
				}}},
				// The whole Secret, not items of it by subPath: the kubelet brings renewed
				// certificates only to Secret volumes mounted whole.
				{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
					SecretName: claimCertificateSecretName(name),
				}}},
			},
		},
	}
}

// claimServerPodState says why a claim server is not ready, as its pod shows it: unschedulable,
// waiting to start, or failing with the message it exited with.
func (r *DatasetReconciler) claimServerPodState(ctx context.Context, ds *datav1alpha1.Dataset, srv claimServer) (string, error) {
	ns := ds.Namespace
	pods := &corev1.PodList{}
	if err := r.Client.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels(claimServerSelector(ds, srv))); err != nil {
		return "", fmt.Errorf("listing the pods of claim server %s/%s: %w", ns, srv.name, err)
	}
	for _, pod := range pods.Items {
		if pod.DeletionTimestamp != nil {
			continue
		}
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
				return fmt.Sprintf("pod %s cannot be scheduled: %s", pod.Name, c.Message), nil
			}
		}
		for _, cs := range pod.Status.ContainerStatuses {
			if t := cs.LastTerminationState.Terminated; t != nil && t.Message != "" {
				return fmt.Sprintf("pod %s exited (%d restarts): %s", pod.Name, cs.RestartCount, strings.TrimSpace(t.Message)), nil
			}
			if w := cs.State.Waiting; w != nil {
				return fmt.Sprintf("pod %s is waiting: %s %s", pod.Name, w.Reason, w.Message), nil
			}
		}
		return fmt.Sprintf("pod %s is %s; see `kubectl -n %s describe pod %s`", pod.Name, pod.Status.Phase, ns, pod.Name), nil
	}
	return "its pod does not exist yet", nil
}
