package identity

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/strata-cache/strata/internal/pki"
)

// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create

// Audience is the audience of the tokens components present to the issuer. The API server
// takes no token of this audience, so a stolen one opens nothing but the issuer.
const Audience = "issuer.strata.dev"

// The extra fields the API server puts in the review of a token bound to a pod.
const (
	extraPodName = "authentication.kubernetes.io/pod-name"
	extraPodUID  = "authentication.kubernetes.io/pod-uid"
)

// Component is one kind of pod the issuer certifies: those of its ServiceAccount that carry
// all its labels, for the identity that Identify finds in the pod.
type Component struct {
	ServiceAccount string
	Labels         map[string]string
	Identify       func(pod *corev1.Pod) (pki.Leaf, error)
}

func (c Component) matches(sa string, pod *corev1.Pod) bool {
	if c.ServiceAccount != sa {
		return false
	}
	for k, v := range c.Labels {
		if pod.Labels[k] != v {
			return false
		}
	}
	return true
}

// PodAttester takes a token for a component's when the API server says it is a token of the
// component's ServiceAccount, for the issuer's audience, bound to a running pod of the release
// namespace that is the component's.
type PodAttester struct {
	// Client creates TokenReviews and reads pods (not from a cache: a pod just started may be
	// missing from it, and a deleted one still there).
	Client     client.Client
	Namespace  string
	Components []Component
}

// Attest implements pki.Attester.
func (a *PodAttester) Attest(ctx context.Context, token string) (pki.Leaf, error) {
	if token == "" {
		return pki.Leaf{}, fmt.Errorf("%w: the request carries no token", pki.ErrNotAttested)
	}
	review := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{Audience}}}
	if err := a.Client.Create(ctx, review); err != nil {
		return pki.Leaf{}, fmt.Errorf("reviewing the token: %w", err)
	}
	st := review.Status
	if !st.Authenticated {
		return pki.Leaf{}, fmt.Errorf("%w: the API server does not take the token: %s", pki.ErrNotAttested, st.Error)
	}
	if !slices.Contains(st.Audiences, Audience) {
		return pki.Leaf{}, fmt.Errorf("%w: the token is not for audience %s", pki.ErrNotAttested, Audience)
	}
	ns, sa, ok := strings.Cut(strings.TrimPrefix(st.User.Username, "system:serviceaccount:"), ":")
	if !ok || !strings.HasPrefix(st.User.Username, "system:serviceaccount:") || ns != a.Namespace {
		return pki.Leaf{}, fmt.Errorf("%w: %s is not a ServiceAccount of namespace %s", pki.ErrNotAttested, st.User.Username, a.Namespace)
	}
	podName, podUID := one(st.User.Extra[extraPodName]), one(st.User.Extra[extraPodUID])
	if podName == "" || podUID == "" {
		return pki.Leaf{}, fmt.Errorf("%w: the token of %s is not bound to a pod (mount a projected serviceAccountToken)", pki.ErrNotAttested, st.User.Username)
	}
	var pod corev1.Pod
	if err := a.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: podName}, &pod); err != nil {
		return pki.Leaf{}, fmt.Errorf("%w: reading pod %s/%s: %w", pki.ErrNotAttested, ns, podName, err)
	}
	switch {
	case string(pod.UID) != podUID:
		return pki.Leaf{}, fmt.Errorf("%w: pod %s/%s is not the one the token was made for", pki.ErrNotAttested, ns, podName)
	case pod.DeletionTimestamp != nil:
		return pki.Leaf{}, fmt.Errorf("%w: pod %s/%s is being deleted", pki.ErrNotAttested, ns, podName)
	case pod.Spec.ServiceAccountName != sa:
		return pki.Leaf{}, fmt.Errorf("%w: pod %s/%s does not run as %s", pki.ErrNotAttested, ns, podName, sa)
	}
	for _, c := range a.Components {
		if c.matches(sa, &pod) {
			leaf, err := c.Identify(&pod)
			if err != nil {
				return pki.Leaf{}, fmt.Errorf("%w: pod %s/%s: %w", pki.ErrNotAttested, ns, podName, err)
			}
			return leaf, nil
		}
	}
	return pki.Leaf{}, fmt.Errorf("%w: pod %s/%s (ServiceAccount %s) is no Strata component", pki.ErrNotAttested, ns, podName, sa)
}

func one(values authenticationv1.ExtraValue) string {
	if len(values) != 1 {
		return ""
	}
	return values[0]
}

// podIPs are the pod's addresses, which peers dial it by.
func podIPs(pod *corev1.Pod) ([]net.IP, error) {
	var ips []net.IP
	for _, ip := range pod.Status.PodIPs {
		if parsed := net.ParseIP(ip.IP); parsed != nil {
			ips = append(ips, parsed)
		}
	}
	if len(ips) == 0 {
		if parsed := net.ParseIP(pod.Status.PodIP); parsed != nil {
			ips = append(ips, parsed)
		}
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("the pod has no IP yet; ask again in a moment")
	}
	return ips, nil
}

// Worker is the component of the workers of every TierPool: the pod's pool (its instance
// label) on its node, at its IP, and as the local server the CSI node plugin reaches over the
// worker's Unix socket.
func Worker(serviceAccount string) Component {
	return Component{ServiceAccount: serviceAccount, Labels: map[string]string{"app.kubernetes.io/name": "strata-worker"}, Identify: func(pod *corev1.Pod) (pki.Leaf, error) {
		pool, node := pod.Labels["app.kubernetes.io/instance"], pod.Spec.NodeName
		if pool == "" || node == "" {
			return pki.Leaf{}, fmt.Errorf("a worker pod needs its pool label and a node (pool %q, node %q)", pool, node)
		}
		ips, err := podIPs(pod)
		if err != nil {
			return pki.Leaf{}, err
		}
		return pki.Leaf{Identity: pki.Worker(pool, node), IPs: ips, DNSNames: []string{pki.LocalServerName}}, nil
	}}
}

// Master is the component of the master replicas: the pod, by the names clients dial it
// (pod.subdomain.namespace.svc, which the StatefulSet's headless Service resolves) and by its IP.
func Master(serviceAccount, clientService string) Component {
	return Component{ServiceAccount: serviceAccount, Labels: map[string]string{"app.kubernetes.io/name": "strata-master"}, Identify: func(pod *corev1.Pod) (pki.Leaf, error) {
		if pod.Spec.Subdomain == "" {
			return pki.Leaf{}, fmt.Errorf("a master pod needs the subdomain of its headless Service")
		}
		ips, err := podIPs(pod)
		if err != nil {
			return pki.Leaf{}, err
		}
		host := pod.Name + "." + pod.Spec.Subdomain
		ns := pod.Namespace
		dns := []string{host, host + "." + ns, host + "." + ns + ".svc", host + "." + ns + ".svc.cluster.local"}
		if clientService != "" {
			dns = append(dns, clientService+"."+ns+".svc", clientService+"."+ns+".svc.cluster.local")
		}
		return pki.Leaf{Identity: pki.Master(pod.Name), DNSNames: dns, IPs: ips}, nil
	}}
}

// CSINode is the component of the CSI node plugin: the plugin of the pod's node, a client only
// (it asks the node's workers to mount Datasets).
func CSINode(serviceAccount string) Component {
	return Component{ServiceAccount: serviceAccount, Labels: map[string]string{"app.kubernetes.io/component": "csi-node"}, Identify: func(pod *corev1.Pod) (pki.Leaf, error) {
		if pod.Spec.NodeName == "" {
			return pki.Leaf{}, fmt.Errorf("a CSI node plugin pod needs a node")
		}
		return pki.Leaf{Identity: pki.CSINode(pod.Spec.NodeName)}, nil
	}}
}
