package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/go-logr/logr/testr"
	. "github.com/onsi/gomega"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/strata-cache/strata/internal/testenv"
)

// nodeBuilder builds the Node objects of the tests; only the fields podnet reads are set.
type nodeBuilder struct {
	node corev1.Node
}

func makeNode(name string) *nodeBuilder {
	return &nodeBuilder{node: corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}}
}

// podCIDRs sets spec.podCIDRs and, as the API server does, spec.podCIDR to its first entry.
func (b *nodeBuilder) podCIDRs(cidrs ...string) *nodeBuilder {
	b.node.Spec.PodCIDR = cidrs[0]
	b.node.Spec.PodCIDRs = cidrs
	return b
}

// legacyPodCIDR sets only spec.podCIDR, as clusters from before dual-stack did.
func (b *nodeBuilder) legacyPodCIDR(cidr string) *nodeBuilder {
	b.node.Spec.PodCIDR = cidr
	return b
}

func (b *nodeBuilder) address(typ corev1.NodeAddressType, ip string) *nodeBuilder {
	b.node.Status.Addresses = append(b.node.Status.Addresses, corev1.NodeAddress{Type: typ, Address: ip})
	return b
}

func (b *nodeBuilder) internalIP(ip string) *nodeBuilder {
	return b.address(corev1.NodeInternalIP, ip)
}

func (b *nodeBuilder) obj() *corev1.Node {
	return b.node.DeepCopy()
}

// fakeRoutes is an in-memory routeTable that counts the calls that change it.
type fakeRoutes struct {
	mu      sync.Mutex
	routes  map[netip.Prefix]netip.Addr
	changes int
	// failing makes Replace of these destinations fail.
	failing map[netip.Prefix]error
}

func newFakeRoutes(routes map[netip.Prefix]netip.Addr) *fakeRoutes {
	return &fakeRoutes{routes: maps.Clone(routes)}
}

func (f *fakeRoutes) Owned(context.Context) (map[netip.Prefix]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.routes), nil
}

func (f *fakeRoutes) Replace(_ context.Context, dst netip.Prefix, gw netip.Addr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.failing[dst]; err != nil {
		return err
	}
	if f.routes == nil {
		f.routes = make(map[netip.Prefix]netip.Addr)
	}
	f.routes[dst] = gw
	f.changes++
	return nil
}

func (f *fakeRoutes) Delete(_ context.Context, dst netip.Prefix) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.routes, dst)
	f.changes++
	return nil
}

// snapshot returns the table; an empty table is an empty, non-nil map so it compares equal to one.
func (f *fakeRoutes) snapshot() map[netip.Prefix]netip.Addr {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[netip.Prefix]netip.Addr, len(f.routes))
	maps.Copy(out, f.routes)
	return out
}

func (f *fakeRoutes) changeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changes
}

// removeByHand deletes a route behind podnet's back, as an administrator would.
func (f *fakeRoutes) removeByHand(dst netip.Prefix) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.routes, dst)
}

// logSink collects log lines of every verbosity.
type logSink struct {
	mu    sync.Mutex
	lines []string
}

func (s *logSink) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.lines = append(s.lines, prefix+" "+args)
	}, funcr.Options{Verbosity: 10})
}

func (s *logSink) text() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.lines, "\n")
}

func prefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }
func addr(s string) netip.Addr     { return netip.MustParseAddr(s) }

const confList1 = `{
  "cniVersion": "0.4.0",
  "name": "strata-podnet",
  "plugins": [
    {
      "type": "ptp",
      "ipMasq": false,
      "mtu": 1500,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "10.244.1.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {
      "type": "portmap",
      "capabilities": {"portMappings": true}
    }
  ]
}`

func TestBuildConfList(t *testing.T) {
	tests := map[string]struct {
		cidr    netip.Prefix
		want    string
		wantErr error
	}{
		"an IPv4 CIDR gives ptp with host-local over it, then portmap": {
			cidr: prefix("10.244.1.0/24"),
			want: confList1,
		},
		"a CIDR with host bits set is written as its network": {
			cidr: prefix("10.244.1.7/24"),
			want: confList1,
		},
		"an IPv6 CIDR is refused": {
			cidr:    prefix("fd00:10:244:1::/64"),
			wantErr: errIPv6Only,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			got, err := buildConfList(tc.cidr)
			if tc.wantErr != nil {
				g.Expect(err).To(MatchError(tc.wantErr))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(MatchJSON(tc.want))
			g.Expect(string(got)).To(HaveSuffix("}\n"), "a file that ends with a newline")
		})
	}

	t.Run("an unset CIDR is refused", func(t *testing.T) {
		_, err := buildConfList(netip.Prefix{})
		NewWithT(t).Expect(err).To(HaveOccurred())
	})
}

func TestDesiredRoutes(t *testing.T) {
	self := makeNode("node-a").podCIDRs("10.244.0.0/24").internalIP("172.18.0.2").obj()
	tests := map[string]struct {
		nodes       []*corev1.Node
		want        map[netip.Prefix]nodeRoute
		wantSkipped map[string]error
	}{
		"every other node gets a route to its pod CIDR via its InternalIP": {
			nodes: []*corev1.Node{
				self,
				makeNode("node-c").podCIDRs("10.244.2.0/24").internalIP("172.18.0.4").obj(),
				makeNode("node-b").podCIDRs("10.244.1.0/24").
					address(corev1.NodeHostName, "node-b").internalIP("172.18.0.3").obj(),
			},
			want: map[netip.Prefix]nodeRoute{
				prefix("10.244.1.0/24"): {Node: "node-b", Gateway: addr("172.18.0.3")},
				prefix("10.244.2.0/24"): {Node: "node-c", Gateway: addr("172.18.0.4")},
			},
		},
		"the own node never gets a route": {
			nodes: []*corev1.Node{self},
			want:  map[netip.Prefix]nodeRoute{},
		},
		"a node without a pod CIDR is skipped": {
			nodes:       []*corev1.Node{self, makeNode("node-b").internalIP("172.18.0.3").obj()},
			want:        map[netip.Prefix]nodeRoute{},
			wantSkipped: map[string]error{"node-b": errNoPodCIDR},
		},
		"a node without an InternalIP is skipped, even with an ExternalIP": {
			nodes: []*corev1.Node{self, makeNode("node-b").podCIDRs("10.244.1.0/24").
				address(corev1.NodeExternalIP, "203.0.113.3").obj()},
			want:        map[netip.Prefix]nodeRoute{},
			wantSkipped: map[string]error{"node-b": errNoInternalIP},
		},
		"a node with only an IPv6 pod CIDR is skipped": {
			nodes: []*corev1.Node{self, makeNode("node-b").podCIDRs("fd00:10:244:1::/64").
				internalIP("172.18.0.3").obj()},
			want:        map[netip.Prefix]nodeRoute{},
			wantSkipped: map[string]error{"node-b": errIPv6Only},
		},
		"a node with only an IPv6 InternalIP is skipped": {
			nodes: []*corev1.Node{self, makeNode("node-b").podCIDRs("10.244.1.0/24").
				internalIP("fc00:f853:ccd:e793::3").obj()},
			want:        map[netip.Prefix]nodeRoute{},
			wantSkipped: map[string]error{"node-b": errIPv6Only},
		},
		"a dual-stack node is routed by its IPv4 CIDR and address": {
			nodes: []*corev1.Node{self, makeNode("node-b").podCIDRs("fd00:10:244:1::/64", "10.244.1.0/24").
				internalIP("fc00:f853:ccd:e793::3").internalIP("172.18.0.3").obj()},
			want: map[netip.Prefix]nodeRoute{
				prefix("10.244.1.0/24"): {Node: "node-b", Gateway: addr("172.18.0.3")},
			},
		},
		"spec.podCIDR is used when spec.podCIDRs is empty": {
			nodes: []*corev1.Node{self, makeNode("node-b").legacyPodCIDR("10.244.1.0/24").
				internalIP("172.18.0.3").obj()},
			want: map[netip.Prefix]nodeRoute{
				prefix("10.244.1.0/24"): {Node: "node-b", Gateway: addr("172.18.0.3")},
			},
		},
		"of two nodes with overlapping CIDRs the first by name wins": {
			nodes: []*corev1.Node{
				self,
				makeNode("node-c").podCIDRs("10.244.1.0/25").internalIP("172.18.0.4").obj(),
				makeNode("node-b").podCIDRs("10.244.1.0/24").internalIP("172.18.0.3").obj(),
			},
			want: map[netip.Prefix]nodeRoute{
				prefix("10.244.1.0/24"): {Node: "node-b", Gateway: addr("172.18.0.3")},
			},
			wantSkipped: map[string]error{"node-c": errCIDRConflict},
		},
		"a CIDR overlapping the own node's is never routed away": {
			nodes: []*corev1.Node{self, makeNode("node-b").podCIDRs("10.244.0.0/24").
				internalIP("172.18.0.3").obj()},
			want:        map[netip.Prefix]nodeRoute{},
			wantSkipped: map[string]error{"node-b": errCIDRConflict},
		},
		"an unparsable pod CIDR is skipped": {
			nodes: []*corev1.Node{self, makeNode("node-b").podCIDRs("10.244.1.0/33").
				internalIP("172.18.0.3").obj()},
			want:        map[netip.Prefix]nodeRoute{},
			wantSkipped: map[string]error{"node-b": nil},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			got, skipped := desiredRoutes(tc.nodes, "node-a")
			g.Expect(got).To(Equal(tc.want))
			g.Expect(skipped).To(HaveLen(len(tc.wantSkipped)))
			for _, s := range skipped {
				g.Expect(tc.wantSkipped).To(HaveKey(s.Node))
				g.Expect(s.Reason).To(HaveOccurred())
				if want := tc.wantSkipped[s.Node]; want != nil {
					g.Expect(s.Reason).To(MatchError(want))
				}
			}
		})
	}
}

func TestReconcileRoutes(t *testing.T) {
	self := makeNode("node-a").podCIDRs("10.244.0.0/24").internalIP("172.18.0.2").obj()
	nodeB := makeNode("node-b").podCIDRs("10.244.1.0/24").internalIP("172.18.0.3").obj()
	routeB := map[netip.Prefix]netip.Addr{prefix("10.244.1.0/24"): addr("172.18.0.3")}
	tests := map[string]struct {
		existing map[netip.Prefix]netip.Addr
		nodes    []*corev1.Node
		want     map[netip.Prefix]netip.Addr
		wantLog  []string
	}{
		"a new node adds a route": {
			nodes: []*corev1.Node{self, nodeB},
			want:  routeB,
		},
		"a deleted node's route is removed": {
			existing: map[netip.Prefix]netip.Addr{
				prefix("10.244.1.0/24"): addr("172.18.0.3"),
				prefix("10.244.2.0/24"): addr("172.18.0.4"),
			},
			nodes: []*corev1.Node{self, nodeB},
			want:  routeB,
		},
		"a node whose pod CIDR changed has its old route replaced": {
			existing: map[netip.Prefix]netip.Addr{prefix("10.244.9.0/24"): addr("172.18.0.3")},
			nodes:    []*corev1.Node{self, nodeB},
			want:     routeB,
		},
		"a route via a stale gateway is corrected": {
			existing: map[netip.Prefix]netip.Addr{prefix("10.244.1.0/24"): addr("172.18.0.99")},
			nodes:    []*corev1.Node{self, nodeB},
			want:     routeB,
		},
		"an existing correct route is kept": {
			existing: routeB,
			nodes:    []*corev1.Node{self, nodeB},
			want:     routeB,
		},
		"a node without a pod CIDR or an InternalIP gets no route": {
			nodes: []*corev1.Node{
				self,
				makeNode("node-b").internalIP("172.18.0.3").obj(),
				makeNode("node-c").podCIDRs("10.244.2.0/24").obj(),
			},
			want:    map[netip.Prefix]netip.Addr{},
			wantLog: []string{`"node"="node-b"`, `"node"="node-c"`},
		},
		"the own node never gets a route": {
			nodes: []*corev1.Node{self},
			want:  map[netip.Prefix]netip.Addr{},
		},
		"an IPv6 pod CIDR is skipped with a log line": {
			nodes: []*corev1.Node{self, makeNode("node-b").podCIDRs("fd00:10:244:1::/64").
				internalIP("172.18.0.3").obj()},
			want:    map[netip.Prefix]netip.Addr{},
			wantLog: []string{`"No route to node" "node"="node-b"`, "cluster network is IPv4"},
		},
		"no nodes at all remove every owned route": {
			existing: routeB,
			want:     map[netip.Prefix]netip.Addr{},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			var logs logSink
			ctx := logr.NewContext(context.Background(), logs.logger())
			routes := newFakeRoutes(tc.existing)
			r := &reconciler{nodeName: "node-a", confDir: t.TempDir(), routes: routes}

			g.Expect(r.reconcile(ctx, tc.nodes)).To(Succeed())
			g.Expect(routes.snapshot()).To(Equal(tc.want))
			for _, line := range tc.wantLog {
				g.Expect(logs.text()).To(ContainSubstring(line))
			}

			changes := routes.changeCount()
			g.Expect(r.reconcile(ctx, tc.nodes)).To(Succeed())
			g.Expect(routes.snapshot()).To(Equal(tc.want))
			g.Expect(routes.changeCount()).To(Equal(changes), "a second reconcile that changes nothing")
		})
	}
}

func TestReconcileRoutesReportsAFailureAndAppliesTheRest(t *testing.T) {
	g := NewWithT(t)
	boom := errors.New("network is unreachable")
	routes := newFakeRoutes(map[netip.Prefix]netip.Addr{prefix("10.244.9.0/24"): addr("172.18.0.9")})
	routes.failing = map[netip.Prefix]error{prefix("10.244.1.0/24"): boom}
	r := &reconciler{nodeName: "node-a", confDir: t.TempDir(), routes: routes}
	nodes := []*corev1.Node{
		makeNode("node-b").podCIDRs("10.244.1.0/24").internalIP("172.18.0.3").obj(),
		makeNode("node-c").podCIDRs("10.244.2.0/24").internalIP("172.18.0.4").obj(),
	}

	err := r.reconcile(context.Background(), nodes)
	g.Expect(err).To(MatchError(boom))
	g.Expect(err).To(MatchError(ContainSubstring("node-b")))
	g.Expect(routes.snapshot()).To(Equal(map[netip.Prefix]netip.Addr{
		prefix("10.244.2.0/24"): addr("172.18.0.4"),
	}))
}

func TestReconcileConfList(t *testing.T) {
	tests := map[string]struct {
		nodes    []*corev1.Node
		wantConf string
		wantLog  string
	}{
		"the own node's pod CIDR is written": {
			nodes: []*corev1.Node{
				makeNode("node-a").podCIDRs("10.244.1.0/24").internalIP("172.18.0.2").obj(),
				makeNode("node-b").podCIDRs("10.244.2.0/24").internalIP("172.18.0.3").obj(),
			},
			wantConf: confList1,
		},
		"the IPv4 CIDR of a dual-stack own node is written": {
			nodes:    []*corev1.Node{makeNode("node-a").podCIDRs("fd00:10:244:1::/64", "10.244.1.0/24").obj()},
			wantConf: confList1,
		},
		"nothing is written before the own node has a pod CIDR": {
			nodes:   []*corev1.Node{makeNode("node-a").internalIP("172.18.0.2").obj()},
			wantLog: "Waiting for the pod CIDR of this node",
		},
		"nothing is written for an IPv6-only own node": {
			nodes:   []*corev1.Node{makeNode("node-a").podCIDRs("fd00:10:244:1::/64").obj()},
			wantLog: "Skipping this node's IPv6 pod CIDR",
		},
		"nothing is written while the own node is unknown": {
			nodes:   []*corev1.Node{makeNode("node-b").podCIDRs("10.244.2.0/24").obj()},
			wantLog: "Own node not found",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			var logs logSink
			ctx := logr.NewContext(context.Background(), logs.logger())
			dir := t.TempDir()
			r := &reconciler{nodeName: "node-a", confDir: dir, routes: newFakeRoutes(nil)}

			g.Expect(r.reconcile(ctx, tc.nodes)).To(Succeed())
			got, err := os.ReadFile(filepath.Join(dir, confListName))
			if tc.wantConf == "" {
				g.Expect(err).To(MatchError(fs.ErrNotExist))
			} else {
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(got).To(MatchJSON(tc.wantConf))
			}
			g.Expect(logs.text()).To(ContainSubstring(tc.wantLog))
		})
	}
}

func TestReconcileWritesConfListOnlyWhenItChanges(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	path := filepath.Join(dir, confListName)
	r := &reconciler{nodeName: "node-a", confDir: dir, routes: newFakeRoutes(nil)}
	node := makeNode("node-a").podCIDRs("10.244.1.0/24").obj()

	g.Expect(r.reconcile(context.Background(), []*corev1.Node{node})).To(Succeed())
	// Backdate the file: a rewrite, even with the same bytes, would move its modification time.
	past := time.Now().Add(-time.Hour).Truncate(time.Second)
	g.Expect(os.Chtimes(path, past, past)).To(Succeed())

	g.Expect(r.reconcile(context.Background(), []*corev1.Node{node})).To(Succeed())
	info, err := os.Stat(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(info.ModTime()).To(BeTemporally("==", past), "an untouched file when nothing changed")

	moved := makeNode("node-a").podCIDRs("10.244.7.0/24").obj()
	g.Expect(r.reconcile(context.Background(), []*corev1.Node{moved})).To(Succeed())
	got, err := os.ReadFile(path)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got).To(MatchJSON(strings.Replace(confList1, "10.244.1.0/24", "10.244.7.0/24", 1)))
}

func TestWriteFileIfChanged(t *testing.T) {
	tests := map[string]struct {
		existing    *string
		data        string
		wantChanged bool
	}{
		"a missing file is written": {
			data:        "new\n",
			wantChanged: true,
		},
		"a file with the same content is left alone": {
			existing: ptr("same\n"),
			data:     "same\n",
		},
		"a file with other content is replaced": {
			existing:    ptr("old\n"),
			data:        "new\n",
			wantChanged: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			dir := t.TempDir()
			path := filepath.Join(dir, "10-test.conflist")
			if tc.existing != nil {
				g.Expect(os.WriteFile(path, []byte(*tc.existing), 0o600)).To(Succeed())
			}

			changed, err := writeFileIfChanged(path, []byte(tc.data), 0o644)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(changed).To(Equal(tc.wantChanged))
			g.Expect(os.ReadFile(path)).To(Equal([]byte(tc.data)))
			entries, err := os.ReadDir(dir)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(entries).To(HaveLen(1), "no temporary file left behind")
			if tc.wantChanged {
				info, err := os.Stat(path)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(info.Mode().Perm()).To(Equal(fs.FileMode(0o644)))
			}
		})
	}

	t.Run("a missing directory is created", func(t *testing.T) {
		g := NewWithT(t)
		path := filepath.Join(t.TempDir(), "etc", "cni", "net.d", "10-test.conflist")
		changed, err := writeFileIfChanged(path, []byte("new\n"), 0o644)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(changed).To(BeTrue())
		g.Expect(os.ReadFile(path)).To(Equal([]byte("new\n")))
	})
}

func ptr[T any](v T) *T { return &v }

func TestConfigValidate(t *testing.T) {
	valid := DefaultConfig()
	valid.NodeName = "node-a"
	tests := map[string]struct {
		mutate  func(*Config)
		wantErr string
	}{
		"the defaults with a node name are valid":           {mutate: func(*Config) {}},
		"a control-plane endpoint as host:port is valid":    {mutate: func(c *Config) { c.ControlPlaneEndpoint = "strata-control-plane:6443" }},
		"an empty node name is refused":                     {mutate: func(c *Config) { c.NodeName = "" }, wantErr: "NODE_NAME"},
		"an empty CNI directory is refused":                 {mutate: func(c *Config) { c.CNIConfDir = "" }, wantErr: "CNI configuration directory"},
		"a zero resync period is refused":                   {mutate: func(c *Config) { c.ResyncPeriod = 0 }, wantErr: "resync period"},
		"a route protocol the kernel interprets is refused": {mutate: func(c *Config) { c.RouteProtocol = 4 }, wantErr: "route protocol 4"},
		"a route protocol above 255 is refused":             {mutate: func(c *Config) { c.RouteProtocol = 256 }, wantErr: "route protocol 256"},
		"a control-plane endpoint without a port is refused": {
			mutate:  func(c *Config) { c.ControlPlaneEndpoint = "strata-control-plane" },
			wantErr: "not host:port",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			cfg := valid
			tc.mutate(&cfg)
			err := cfg.Validate()
			if tc.wantErr == "" {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
		})
	}
}

// TestRunFollowsNodeEvents drives the daemon through a fake API server: the informer must turn node
// additions and deletions into routes, and the periodic resync must restore a route deleted by hand.
func TestRunFollowsNodeEvents(t *testing.T) {
	g := NewWithT(t)
	client := fake.NewClientset(
		makeNode("node-a").podCIDRs("10.244.0.0/24").internalIP("172.18.0.2").obj(),
		makeNode("node-b").podCIDRs("10.244.1.0/24").internalIP("172.18.0.3").obj(),
	)
	// The fake API server drops events between the informer's list and its watch, so nodes are
	// changed only once the watch is open.
	watching := make(chan struct{})
	var once sync.Once
	client.PrependWatchReactor("nodes", func(action clienttesting.Action) (bool, watch.Interface, error) {
		w, err := client.Tracker().Watch(action.GetResource(), action.GetNamespace())
		if err != nil {
			return false, nil, err
		}
		once.Do(func() { close(watching) })
		return true, w, nil
	})

	cfg := DefaultConfig()
	cfg.NodeName = "node-a"
	cfg.CNIConfDir = t.TempDir()
	cfg.ResyncPeriod = 20 * time.Millisecond
	routes := newFakeRoutes(map[netip.Prefix]netip.Addr{prefix("10.244.9.0/24"): addr("172.18.0.9")})

	ctx, cancel := context.WithCancel(logr.NewContext(context.Background(), testr.New(t)))
	stopped := make(chan struct{})
	var runErr error
	go func() {
		defer close(stopped)
		runErr = run(ctx, cfg, client, routes)
	}()
	// The logger belongs to t, so run must have returned before the test ends, failed or not.
	t.Cleanup(func() {
		cancel()
		<-stopped
	})

	routeB := prefix("10.244.1.0/24")
	routeC := prefix("10.244.2.0/24")
	g.Eventually(routes.snapshot).WithTimeout(10*time.Second).Should(Equal(map[netip.Prefix]netip.Addr{
		routeB: addr("172.18.0.3"),
	}), "the route to node-b's pods, and the stale route gone")
	g.Eventually(func() ([]byte, error) {
		return os.ReadFile(filepath.Join(cfg.CNIConfDir, confListName))
	}).WithTimeout(10*time.Second).Should(MatchJSON(strings.Replace(confList1, "10.244.1.0/24", "10.244.0.0/24", 1)),
		"the CNI configuration of node-a")
	g.Eventually(watching).WithTimeout(10*time.Second).Should(BeClosed(), "the node watch to open")

	nodeC := makeNode("node-c").podCIDRs("10.244.2.0/24").internalIP("172.18.0.4").obj()
	_, err := client.CoreV1().Nodes().Create(ctx, nodeC, metav1.CreateOptions{})
	g.Expect(err).NotTo(HaveOccurred())
	g.Eventually(routes.snapshot).WithTimeout(10*time.Second).Should(HaveKey(routeC), "the route to the new node-c")

	g.Expect(client.CoreV1().Nodes().Delete(ctx, "node-b", metav1.DeleteOptions{})).To(Succeed())
	g.Eventually(routes.snapshot).WithTimeout(10*time.Second).Should(Equal(map[netip.Prefix]netip.Addr{
		routeC: addr("172.18.0.4"),
	}), "the route to the deleted node-b gone")

	routes.removeByHand(routeC)
	g.Eventually(routes.snapshot).WithTimeout(10*time.Second).Should(HaveKey(routeC), "the resync to restore the route")

	cancel()
	g.Eventually(stopped).WithTimeout(10*time.Second).Should(BeClosed(), "run to return after cancellation")
	g.Expect(runErr).NotTo(HaveOccurred())
}

// TestManifest decodes podnet.yaml strictly, so a misspelt field fails here rather than being dropped
// by the API server, and checks what the daemon depends on.
func TestManifest(t *testing.T) {
	g := NewWithT(t)
	data, err := os.ReadFile("podnet.yaml")
	g.Expect(err).NotTo(HaveOccurred())

	docs := map[string][]byte{}
	reader := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		g.Expect(err).NotTo(HaveOccurred())
		var meta metav1.TypeMeta
		g.Expect(sigsyaml.Unmarshal(doc, &meta)).To(Succeed())
		docs[meta.Kind] = doc
	}
	g.Expect(docs).To(HaveLen(4))

	var sa corev1.ServiceAccount
	g.Expect(sigsyaml.UnmarshalStrict(docs["ServiceAccount"], &sa)).To(Succeed())
	g.Expect(sa.Namespace).To(Equal("kube-system"))

	var role rbacv1.ClusterRole
	g.Expect(sigsyaml.UnmarshalStrict(docs["ClusterRole"], &role)).To(Succeed())
	g.Expect(role.Rules).To(Equal([]rbacv1.PolicyRule{{
		APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"},
	}}), "read access to nodes and nothing else")

	var binding rbacv1.ClusterRoleBinding
	g.Expect(sigsyaml.UnmarshalStrict(docs["ClusterRoleBinding"], &binding)).To(Succeed())
	g.Expect(binding.RoleRef.Name).To(Equal(role.Name))
	g.Expect(binding.Subjects).To(ConsistOf(rbacv1.Subject{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}))

	var ds appsv1.DaemonSet
	g.Expect(sigsyaml.UnmarshalStrict(docs["DaemonSet"], &ds)).To(Succeed())
	g.Expect(ds.Name).To(Equal("strata-podnet"))
	g.Expect(ds.Namespace).To(Equal("kube-system"))
	pod := ds.Spec.Template.Spec
	for k, v := range ds.Spec.Selector.MatchLabels {
		g.Expect(ds.Spec.Template.Labels).To(HaveKeyWithValue(k, v), "a selector that matches its own pods")
	}
	g.Expect(pod.ServiceAccountName).To(Equal(sa.Name))
	g.Expect(pod.HostNetwork).To(BeTrue())
	g.Expect(pod.PriorityClassName).To(Equal("system-node-critical"))
	g.Expect(pod.Tolerations).To(ConsistOf(corev1.Toleration{Operator: corev1.TolerationOpExists}))
	g.Expect(pod.Containers).To(HaveLen(1))
	c := pod.Containers[0]
	g.Expect(c.Image).To(Equal("strata-cache/podnet:e2e"))
	g.Expect(c.ImagePullPolicy).To(Equal(corev1.PullNever))
	g.Expect(c.SecurityContext.Capabilities.Add).To(ContainElement(corev1.Capability("NET_ADMIN")))
	g.Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"},
	}}))
	g.Expect(c.Resources.Requests).NotTo(BeEmpty())
	g.Expect(c.VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "cni-conf", MountPath: "/etc/cni/net.d"}))
	g.Expect(pod.Volumes).To(ContainElement(HaveField("VolumeSource.HostPath.Path", "/etc/cni/net.d")))
}

// TestNetlinkRoutes runs the real route table in a private network namespace, where it may change
// routes without touching the machine's. Creating the namespace needs CAP_SYS_ADMIN; without it the
// test is skipped.
func TestNetlinkRoutes(t *testing.T) {
	// The namespace belongs to this thread. It is never unlocked, so Go ends the thread with the test
	// instead of handing it, still in the namespace, to another goroutine.
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		testenv.Lacking(t, fmt.Sprintf("cannot create a network namespace: %v", err))
	}
	g := NewWithT(t)
	lo, err := netlink.LinkByName("lo")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(netlink.LinkSetUp(lo)).To(Succeed())
	// A gateway must be on a connected network; a /16 on lo stands in for Kind's Docker bridge.
	nodeAddr, err := netlink.ParseAddr("172.18.0.2/16")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(netlink.AddrAdd(lo, nodeAddr)).To(Succeed())
	foreign := &netlink.Route{
		Dst:      prefixToIPNet(prefix("10.244.9.0/24")),
		Gw:       net.ParseIP("172.18.0.9"),
		Protocol: unix.RTPROT_STATIC,
	}
	g.Expect(netlink.RouteAdd(foreign)).To(Succeed(), "a route that is not podnet's")

	ctx := context.Background()
	routes := newNetlinkRoutes(DefaultRouteProtocol)
	g.Expect(routes.Replace(ctx, prefix("10.244.1.0/24"), addr("172.18.0.3"))).To(Succeed())
	g.Expect(routes.Replace(ctx, prefix("10.244.2.0/24"), addr("172.18.0.4"))).To(Succeed())
	g.Expect(routes.Replace(ctx, prefix("10.244.2.0/24"), addr("172.18.0.5"))).To(Succeed(), "a changed gateway")
	g.Expect(routes.Owned(ctx)).To(Equal(map[netip.Prefix]netip.Addr{
		prefix("10.244.1.0/24"): addr("172.18.0.3"),
		prefix("10.244.2.0/24"): addr("172.18.0.5"),
	}), "podnet's routes only, the changed one once")

	g.Expect(routes.Delete(ctx, prefix("10.244.1.0/24"))).To(Succeed())
	g.Expect(routes.Delete(ctx, prefix("10.244.1.0/24"))).To(Succeed(), "deleting a route that is gone")
	g.Expect(routes.Delete(ctx, prefix("10.244.9.0/24"))).To(Succeed(), "deleting a route podnet does not own")
	g.Expect(routes.Owned(ctx)).To(Equal(map[netip.Prefix]netip.Addr{
		prefix("10.244.2.0/24"): addr("172.18.0.5"),
	}))
	left, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: foreign.Dst}, netlink.RT_FILTER_DST)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(left).To(HaveLen(1), "the foreign route untouched")

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	g.Expect(routes.Replace(cancelled, prefix("10.244.3.0/24"), addr("172.18.0.6"))).To(MatchError(context.Canceled))
}
