package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/strata-cache/strata/internal/durable"
)

const (
	// confListName starts with "10-" because the container runtime uses the first configuration in
	// name order, and nothing else in the node image should win over it.
	confListName = "10-strata-podnet.conflist"
	networkName  = "strata-podnet"
	// cniVersion 0.4.0 is understood by containerd 1.6's libcni and by every plugin release Debian
	// ships, which is where the node image's /opt/cni/bin comes from.
	cniVersion = "0.4.0"
	// podMTU matches Kind's Docker bridge; no encapsulation is added, so pods need no smaller MTU.
	podMTU = 1500
	// confListPerm is what CNI configurations usually have: they hold no secrets.
	confListPerm fs.FileMode = 0o644

	// reconcileKey is the only key of the work queue: every reconcile looks at all nodes, so every
	// event means the same thing and a burst of events collapses into one reconcile.
	reconcileKey = "nodes"
)

// DefaultRouteProtocol marks the routes podnet installs (`ip route show proto 147` lists them).
// Ownership is kept in the kernel rather than in memory because the kernel keeps it across restarts of
// the daemon: after a crash or a rolling update, a route to a node deleted in the meantime is still
// recognised as podnet's and removed, while routes of anything else on the node (Docker, the kubelet,
// someone debugging) are never touched. 147 is assigned neither in Linux's rtnetlink.h nor in
// iproute2's rt_protos.
const DefaultRouteProtocol = 147

// Config is the daemon's configuration, validated once at start-up.
type Config struct {
	// NodeName is the node this instance runs on; the DaemonSet passes spec.nodeName.
	NodeName string
	// CNIConfDir is the directory the container runtime loads CNI configurations from.
	CNIConfDir string
	// ResyncPeriod is how often everything is reconciled without a Node event, so a route someone
	// deleted by hand comes back.
	ResyncPeriod time.Duration
	// RouteProtocol marks the routes this daemon owns; see DefaultRouteProtocol.
	RouteProtocol int
	// ControlPlaneEndpoint, as host:port, replaces the in-cluster API server address (the kubernetes
	// Service), which is only reachable once kube-proxy runs. Empty keeps the in-cluster address.
	ControlPlaneEndpoint string
}

// DefaultConfig holds the defaults of every setting.
func DefaultConfig() Config {
	return Config{
		CNIConfDir:    "/etc/cni/net.d",
		ResyncPeriod:  30 * time.Second,
		RouteProtocol: DefaultRouteProtocol,
	}
}

// Validate reports every invalid setting at once.
func (c Config) Validate() error {
	var errs []error
	if c.NodeName == "" {
		errs = append(errs, errors.New("node name is empty: set --node-name or NODE_NAME"))
	}
	if c.CNIConfDir == "" {
		errs = append(errs, errors.New("CNI configuration directory is empty"))
	}
	if c.ResyncPeriod <= 0 {
		errs = append(errs, fmt.Errorf("resync period %s is not positive", c.ResyncPeriod))
	}
	// The kernel interprets the protocols up to RTPROT_STATIC itself; above it they are free labels.
	if c.RouteProtocol <= unix.RTPROT_STATIC || c.RouteProtocol > 255 {
		errs = append(errs, fmt.Errorf("route protocol %d is outside %d..255", c.RouteProtocol, unix.RTPROT_STATIC+1))
	}
	if c.ControlPlaneEndpoint != "" {
		if _, _, err := net.SplitHostPort(c.ControlPlaneEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("control plane endpoint %q is not host:port: %w", c.ControlPlaneEndpoint, err))
		}
	}
	return errors.Join(errs...)
}

// Reasons a node gets no route or no CNI configuration. The first two are normal while a node joins;
// the others are misconfigurations worth a log line at the default verbosity.
var (
	errNoPodCIDR    = errors.New("no pod CIDR assigned yet")
	errNoInternalIP = errors.New("no InternalIP address yet")
	errIPv6Only     = errors.New("only IPv6 is set, and the cluster network is IPv4")
	errCIDRConflict = errors.New("pod CIDR overlaps")
)

// The CNI configuration list, as the CNI specification and the ptp, host-local and portmap plugins
// define it.
type (
	confList struct {
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
		Plugins    []any  `json:"plugins"`
	}
	ptpPlugin struct {
		Type   string        `json:"type"`
		IPMasq bool          `json:"ipMasq"`
		MTU    int           `json:"mtu"`
		IPAM   hostLocalIPAM `json:"ipam"`
	}
	hostLocalIPAM struct {
		Type   string        `json:"type"`
		Ranges [][]ipamRange `json:"ranges"`
		Routes []ipamRoute   `json:"routes"`
	}
	ipamRange struct {
		Subnet string `json:"subnet"`
	}
	ipamRoute struct {
		Dst string `json:"dst"`
	}
	portmapPlugin struct {
		Type         string          `json:"type"`
		Capabilities map[string]bool `json:"capabilities"`
	}
)

// buildConfList returns the CNI configuration list for a node whose pods live in podCIDR: a ptp veth
// per pod with an address from host-local, then portmap for hostPort. There is no masquerading:
// pod-to-pod traffic between nodes is routed, and the e2e clusters have no outside world to reach.
func buildConfList(podCIDR netip.Prefix) ([]byte, error) {
	if !podCIDR.IsValid() {
		return nil, errors.New("building CNI configuration: pod CIDR is not set")
	}
	if !podCIDR.Addr().Is4() {
		return nil, fmt.Errorf("building CNI configuration for %s: %w", podCIDR, errIPv6Only)
	}
	conf := confList{
		CNIVersion: cniVersion,
		Name:       networkName,
		Plugins: []any{
			ptpPlugin{
				Type:   "ptp",
				IPMasq: false,
				MTU:    podMTU,
				IPAM: hostLocalIPAM{
					Type:   "host-local",
					Ranges: [][]ipamRange{{{Subnet: podCIDR.Masked().String()}}},
					Routes: []ipamRoute{{Dst: "0.0.0.0/0"}},
				},
			},
			portmapPlugin{
				Type:         "portmap",
				Capabilities: map[string]bool{"portMappings": true},
			},
		},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding CNI configuration for %s: %w", podCIDR, err)
	}
	return append(data, '\n'), nil
}

// nodePodCIDR returns the node's IPv4 pod CIDR. spec.podCIDRs is preferred because on a dual-stack
// node its IPv4 entry need not be the first, which spec.podCIDR always is.
func nodePodCIDR(node *corev1.Node) (netip.Prefix, error) {
	cidrs := node.Spec.PodCIDRs
	if len(cidrs) == 0 && node.Spec.PodCIDR != "" {
		cidrs = []string{node.Spec.PodCIDR}
	}
	if len(cidrs) == 0 {
		return netip.Prefix{}, errNoPodCIDR
	}
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("parsing pod CIDR %q: %w", s, err)
		}
		if p.Addr().Is4() {
			return p.Masked(), nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("pod CIDRs %s: %w", strings.Join(cidrs, ","), errIPv6Only)
}

// nodeInternalIP returns the node's first IPv4 InternalIP, the address other nodes route its pods via.
func nodeInternalIP(node *corev1.Node) (netip.Addr, error) {
	var ipv6 []string
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("parsing InternalIP %q: %w", a.Address, err)
		}
		if ip.Is4() {
			return ip, nil
		}
		ipv6 = append(ipv6, a.Address)
	}
	if len(ipv6) > 0 {
		return netip.Addr{}, fmt.Errorf("InternalIPs %s: %w", strings.Join(ipv6, ","), errIPv6Only)
	}
	return netip.Addr{}, errNoInternalIP
}

// nodeRoute is the route to one node's pods.
type nodeRoute struct {
	Node    string
	Gateway netip.Addr
}

// skippedNode is a node that gets no route, and why.
type skippedNode struct {
	Node   string
	Reason error
}

// desiredRoutes returns the route every other node's pods need, keyed by pod CIDR, and the nodes that
// get none. Nodes are taken in name order so that, of two nodes claiming overlapping CIDRs, the same
// one wins on every node and every reconcile; a CIDR overlapping the own node's is never routed away.
func desiredRoutes(nodes []*corev1.Node, self string) (map[netip.Prefix]nodeRoute, []skippedNode) {
	sorted := slices.Clone(nodes)
	slices.SortFunc(sorted, func(a, b *corev1.Node) int { return strings.Compare(a.Name, b.Name) })

	// The own node's CIDR problems are reported where its CNI configuration is written.
	var own netip.Prefix
	if i := slices.IndexFunc(sorted, func(n *corev1.Node) bool { return n.Name == self }); i >= 0 {
		own, _ = nodePodCIDR(sorted[i])
	}

	routes := make(map[netip.Prefix]nodeRoute)
	var skipped []skippedNode
	for _, node := range sorted {
		if node.Name == self {
			continue
		}
		cidr, err := nodePodCIDR(node)
		if err != nil {
			skipped = append(skipped, skippedNode{Node: node.Name, Reason: err})
			continue
		}
		gw, err := nodeInternalIP(node)
		if err != nil {
			skipped = append(skipped, skippedNode{Node: node.Name, Reason: err})
			continue
		}
		if own.IsValid() && own.Overlaps(cidr) {
			skipped = append(skipped, skippedNode{Node: node.Name,
				Reason: fmt.Errorf("%w: %s overlaps %s of this node", errCIDRConflict, cidr, own)})
			continue
		}
		if dst, other, found := overlapping(routes, cidr); found {
			skipped = append(skipped, skippedNode{Node: node.Name,
				Reason: fmt.Errorf("%w: %s overlaps %s of node %s", errCIDRConflict, cidr, dst, other.Node)})
			continue
		}
		routes[cidr] = nodeRoute{Node: node.Name, Gateway: gw}
	}
	return routes, skipped
}

func overlapping(routes map[netip.Prefix]nodeRoute, cidr netip.Prefix) (netip.Prefix, nodeRoute, bool) {
	for dst, r := range routes {
		if dst.Overlaps(cidr) {
			return dst, r, true
		}
	}
	return netip.Prefix{}, nodeRoute{}, false
}

// routeTable is the part of the node's IPv4 main routing table that podnet owns. It is an interface
// so the unit tests can use an in-memory table.
type routeTable interface {
	// Owned returns podnet's routes, destination to gateway.
	Owned(ctx context.Context) (map[netip.Prefix]netip.Addr, error)
	// Replace routes dst via gw, adding the route or changing the one that exists.
	Replace(ctx context.Context, dst netip.Prefix, gw netip.Addr) error
	// Delete removes podnet's route to dst; a route that is already gone is not an error.
	Delete(ctx context.Context, dst netip.Prefix) error
}

// reconciler brings the CNI configuration and the routes in line with the nodes.
type reconciler struct {
	nodeName string
	confDir  string
	routes   routeTable
}

// reconcile does both jobs even when one fails: a node without a CNI configuration still benefits
// from routes to the other nodes, and the other way round.
func (r *reconciler) reconcile(ctx context.Context, nodes []*corev1.Node) error {
	return errors.Join(r.reconcileConfList(ctx, nodes), r.reconcileRoutes(ctx, nodes))
}

func (r *reconciler) reconcileConfList(ctx context.Context, nodes []*corev1.Node) error {
	log := logr.FromContextOrDiscard(ctx).WithValues("node", r.nodeName)
	i := slices.IndexFunc(nodes, func(n *corev1.Node) bool { return n.Name == r.nodeName })
	if i < 0 {
		log.Info("Own node not found; check NODE_NAME")
		return nil
	}
	cidr, err := nodePodCIDR(nodes[i])
	switch {
	case errors.Is(err, errNoPodCIDR):
		log.Info("Waiting for the pod CIDR of this node")
		return nil
	case errors.Is(err, errIPv6Only):
		log.Info("Skipping this node's IPv6 pod CIDR: the cluster network is IPv4", "reason", err.Error())
		return nil
	case err != nil:
		return fmt.Errorf("reading the pod CIDR of node %s: %w", r.nodeName, err)
	}
	data, err := buildConfList(cidr)
	if err != nil {
		return err
	}
	path := filepath.Join(r.confDir, confListName)
	changed, err := writeFileIfChanged(path, data, confListPerm)
	if err != nil {
		return fmt.Errorf("writing the CNI configuration for %s: %w", cidr, err)
	}
	if changed {
		log.Info("Wrote CNI configuration", "path", path, "podCIDR", cidr)
	}
	return nil
}

func (r *reconciler) reconcileRoutes(ctx context.Context, nodes []*corev1.Node) error {
	log := logr.FromContextOrDiscard(ctx)
	desired, skipped := desiredRoutes(nodes, r.nodeName)
	for _, s := range skipped {
		if errors.Is(s.Reason, errNoPodCIDR) || errors.Is(s.Reason, errNoInternalIP) {
			log.V(1).Info("No route to node yet", "node", s.Node, "reason", s.Reason.Error())
			continue
		}
		log.Info("No route to node", "node", s.Node, "reason", s.Reason.Error())
	}

	current, err := r.routes.Owned(ctx)
	if err != nil {
		return fmt.Errorf("listing routes: %w", err)
	}
	var errs []error
	// Stale routes go first, so a CIDR that moved to another node is never routed two ways at once.
	for _, dst := range sortedKeys(current) {
		if _, ok := desired[dst]; ok {
			continue
		}
		if err := r.routes.Delete(ctx, dst); err != nil {
			errs = append(errs, fmt.Errorf("deleting stale route to %s: %w", dst, err))
			continue
		}
		log.Info("Deleted route", "dst", dst, "via", current[dst])
	}
	for _, dst := range sortedKeys(desired) {
		want := desired[dst]
		if gw, ok := current[dst]; ok && gw == want.Gateway {
			continue
		}
		if err := r.routes.Replace(ctx, dst, want.Gateway); err != nil {
			errs = append(errs, fmt.Errorf("routing %s of node %s via %s: %w", dst, want.Node, want.Gateway, err))
			continue
		}
		log.Info("Set route", "node", want.Node, "dst", dst, "via", want.Gateway)
	}
	return errors.Join(errs...)
}

// sortedKeys orders the work so logs and partial failures read the same on every reconcile.
func sortedKeys[V any](m map[netip.Prefix]V) []netip.Prefix {
	keys := make([]netip.Prefix, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return keys
}

// writeFileIfChanged replaces path with data unless it holds exactly data already, and reports whether
// it wrote. Identical content is left alone because the container runtime watches the directory and
// reloads its network configuration on every change. The new content goes to a temporary file in the
// same directory (same file system, so the rename is atomic; named *.tmp, so libcni, which loads only
// *.conf, *.conflist and *.json, never reads it half-written), which is synced and renamed over path:
// a reader sees the old file or the new one, also after a crash.
func writeFileIfChanged(path string, data []byte, perm fs.FileMode) (bool, error) {
	old, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(old, data):
		return false, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return false, fmt.Errorf("reading %s: %w", path, err)
	}

	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("creating %s: %w", dir, err)
	}
	// Named *.tmp until renamed: libcni loads only *.conf, *.conflist and *.json.
	if err := durable.ReplaceFile(path, data, perm); err != nil {
		return false, err
	}
	return true, nil
}

// netlinkRoutes is the routeTable of the network namespace the daemon runs in (the node's, since the
// pod uses the host network): IPv4 routes of the main table marked with protocol.
type netlinkRoutes struct {
	protocol netlink.RouteProtocol
}

func newNetlinkRoutes(protocol int) netlinkRoutes {
	return netlinkRoutes{protocol: netlink.RouteProtocol(protocol)}
}

// Owned lists the routes marked with podnet's protocol. Netlink calls take no context; a cancelled
// context stops the reconcile before the next call instead.
func (n netlinkRoutes) Owned(ctx context.Context) (map[netip.Prefix]netip.Addr, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	filter := &netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: n.protocol}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, filter, netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		// An interrupted dump (netlink.ErrDumpInterrupted) is retried with the whole reconcile.
		return nil, fmt.Errorf("listing IPv4 routes of protocol %d: %w", n.protocol, err)
	}
	owned := make(map[netip.Prefix]netip.Addr, len(routes))
	for _, rt := range routes {
		if rt.Dst == nil {
			continue
		}
		addr, ok := netip.AddrFromSlice(rt.Dst.IP)
		if !ok {
			continue
		}
		ones, _ := rt.Dst.Mask.Size()
		// A route without a single gateway gets the zero address, which differs from every desired
		// gateway, so it is replaced or deleted.
		gw, _ := netip.AddrFromSlice(rt.Gw)
		owned[netip.PrefixFrom(addr.Unmap(), ones)] = gw.Unmap()
	}
	return owned, nil
}

// Replace installs the route without naming a device: the kernel finds the link from the gateway,
// which on Kind is on the Docker bridge every node shares.
func (n netlinkRoutes) Replace(ctx context.Context, dst netip.Prefix, gw netip.Addr) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	route := &netlink.Route{
		Dst:      prefixToIPNet(dst),
		Gw:       gw.AsSlice(),
		Protocol: n.protocol,
		Table:    unix.RT_TABLE_MAIN,
		Scope:    netlink.SCOPE_UNIVERSE,
	}
	if err := netlink.RouteReplace(route); err != nil {
		return fmt.Errorf("replacing route to %s via %s: %w", dst, gw, err)
	}
	return nil
}

// Delete names the protocol, so the kernel deletes the route only if it is podnet's.
func (n netlinkRoutes) Delete(ctx context.Context, dst netip.Prefix) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	route := &netlink.Route{Dst: prefixToIPNet(dst), Protocol: n.protocol, Table: unix.RT_TABLE_MAIN}
	if err := netlink.RouteDel(route); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("deleting route to %s: %w", dst, err)
	}
	return nil
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// run watches the nodes and reconciles on every Node event and every cfg.ResyncPeriod until ctx is
// cancelled, then returns nil once its goroutines have stopped.
func run(ctx context.Context, cfg Config, client kubernetes.Interface, routes routeTable) error {
	log := logr.FromContextOrDiscard(ctx)
	r := &reconciler{nodeName: cfg.NodeName, confDir: cfg.CNIConfDir, routes: routes}

	// No informer resync: the ticker below re-reconciles from the cache, which is all a resync would do.
	factory := informers.NewSharedInformerFactory(client, 0)
	nodes := factory.Core().V1().Nodes()
	// Failures are retried with the controller rate limiter's backoff, and at the latest by the next
	// tick, since Add queues the key at once even while a delayed retry is pending.
	queue := workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "strata-podnet"},
	)
	enqueue := func() { queue.Add(reconcileKey) }
	if _, err := nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { enqueue() },
		UpdateFunc: func(any, any) { enqueue() },
		DeleteFunc: func(any) { enqueue() },
	}); err != nil {
		queue.ShutDown()
		return fmt.Errorf("registering the node event handler: %w", err)
	}

	factory.Start(ctx.Done())
	// Deferred calls run last first: the ticker goroutine is waited for, then the informers. Both stop
	// because ctx is done, which is the only way out of the worker loop below.
	defer factory.Shutdown()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer queue.ShutDown()
		ticker := time.NewTicker(cfg.ResyncPeriod)
		defer ticker.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
				enqueue()
			}
		}
	}()

	log.Info("Waiting for the node cache to sync", "node", cfg.NodeName)
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
		log.Info("Stopped before the node cache synced")
		return nil
	}
	log.Info("Reconciling", "node", cfg.NodeName, "cniConfDir", cfg.CNIConfDir, "resyncPeriod", cfg.ResyncPeriod)
	// A cluster without nodes sends no event, yet stale routes must still go.
	enqueue()
	for processNext(ctx, queue, nodes.Lister(), r) {
	}
	log.Info("Stopped")
	return nil
}

// processNext reconciles once per queued key and reports false when the queue has shut down.
func processNext(ctx context.Context, queue workqueue.TypedRateLimitingInterface[string], lister corev1listers.NodeLister, r *reconciler) bool {
	key, shutdown := queue.Get()
	if shutdown {
		return false
	}
	defer queue.Done(key)

	nodes, err := lister.List(labels.Everything())
	if err != nil {
		err = fmt.Errorf("listing nodes from the cache: %w", err)
	} else {
		err = r.reconcile(ctx, nodes)
	}
	switch {
	case err == nil:
		queue.Forget(key)
	case ctx.Err() != nil:
		// Shutting down: failures of cancelled calls are expected and nothing will retry them.
	default:
		logr.FromContextOrDiscard(ctx).Error(err, "Reconcile failed; retrying")
		queue.AddRateLimited(key)
	}
	return true
}
