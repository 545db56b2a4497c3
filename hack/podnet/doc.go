// Command podnet is the pod network of Strata's end-to-end Kind clusters.
//
// Kind's own network daemon, kindnet, cannot be built offline, so the e2e clusters run with
// networking.disableDefaultCNI and this daemon takes its place. It runs on every node as a
// DaemonSet in the host network namespace and does two things, both from a Node informer:
//
//   - it writes a CNI configuration for its own node (ptp with host-local IPAM over the node's
//     spec.podCIDR, chained with portmap), so the kubelet can start pods and the node turns Ready;
//   - it keeps one route per other node, to that node's pod CIDR via its InternalIP, so pods on
//     different nodes reach each other. Kind's nodes share one Docker bridge, so the node IPs are
//     directly reachable and no encapsulation is needed.
//
// It is test infrastructure: IPv4 only, no masquerading, no network policy. Services still need
// kube-proxy.
package main
