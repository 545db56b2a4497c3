package driver

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/local"
)

// skippedSanitySpecs are the csi-sanity specs that publish a volume made by CreateVolume. Such
// volumes are lineage outputs, which the node plugin refuses with FailedPrecondition until the
// lineage feature serves them; sanity has no way to publish a Dataset volume instead (it only
// publishes what CreateVolume returned). The same steps on Dataset volumes are covered by
// TestNodePublishBindsTheWorkersMountReadOnlyAndIsIdempotent,
// TestNodeUnpublishIsIdempotentAndReleasesTheDatasetOnce and
// TestARestartedNodeUnmountsTheDatasetWhenItsLastTargetGoes. Ginkgo matches these against the
// suite's description, a space and the spec's full text.
var skippedSanitySpecs = []string{
	` Node Service should work$`,
	` Node Service should be idempotent$`,
	` Node Service NodeUnpublishVolume should remove target path$`,
}

// sanityIDs makes ids of the form the driver gives output volumes.
type sanityIDs struct{}

func randomHex() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (sanityIDs) GenerateUniqueValidVolumeID() string { return outputVolumePrefix + randomHex() }
func (sanityIDs) GenerateInvalidVolumeID() string     { return "not-a-strata-volume" }
func (sanityIDs) GenerateUniqueValidNodeID() string   { return "node-" + randomHex() }
func (sanityIDs) GenerateInvalidNodeID() string       { return "not-a-node" }

// TestCSISanity runs csi-sanity against the node plugin (Identity and Node, on one socket)
// and the controller (Identity and Controller, on another), in process, with a fake mounter
// and a real in-process worker Mounter.
func TestCSISanity(t *testing.T) {
	env := newNodeEnv(t)
	socketDir := shortTempDir(t)
	metrics, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	serve := func(name string, register func(*grpc.Server)) string {
		socket := filepath.Join(socketDir, name+".sock")
		lis, err := net.Listen("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		srv := grpc.NewServer(grpc.UnaryInterceptor(metrics.UnaryInterceptor(testr.New(t).WithName(name))))
		register(srv)
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		return "unix://" + socket
	}
	node := env.node(t)
	controller := newController(t, t.TempDir())
	nodeAddr := serve("node", func(s *grpc.Server) {
		csi.RegisterIdentityServer(s, NewIdentity("sanity", env.sockets(t, env.socketDir).AnyAnswering))
		csi.RegisterNodeServer(s, node)
	})
	controllerAddr := serve("controller", func(s *grpc.Server) {
		csi.RegisterIdentityServer(s, NewIdentity("sanity", nil))
		csi.RegisterControllerServer(s, controller)
	})

	cfg := sanity.NewTestConfig()
	// Sanity creates these as its target and staging parents: under the kubelet's pods folder,
	// where the node plugin accepts target paths.
	pods := filepath.Join(env.kubeletDir, "pods")
	cfg.TargetPath = filepath.Join(pods, "sanity-target")
	cfg.StagingPath = filepath.Join(pods, "sanity-staging")
	cfg.IDGen = sanityIDs{}
	cfg.TestVolumeParameters = map[string]string{"csi.storage.k8s.io/pvc/name": "sanity"}
	if err := os.MkdirAll(pods, 0o750); err != nil {
		t.Fatal(err)
	}

	sc := sanity.GinkgoTest(&cfg)
	// The connections are made here rather than by sanity from cfg.Address: its connect helper
	// reads the channel's state only after the first change, so a unix socket that is ready
	// before that first read leaves it waiting a minute for a change that never comes (the
	// suite's first spec then fails with "Connection timed out"). With no address in cfg,
	// sanity reuses these for every spec.
	sc.Conn = dialSanity(t, nodeAddr)
	sc.ControllerConn = dialSanity(t, controllerAddr)
	defer sc.Finalize()
	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, reporter := ginkgo.GinkgoConfiguration()
	suite.SkipStrings = append(suite.SkipStrings, skippedSanitySpecs...)
	ginkgo.RunSpecs(t, "csi-sanity of csi.strata.dev", suite, reporter)
}

// dialSanity opens a lazily connecting client to one of the test's unix sockets, as the
// kubelet's is (local credentials: the socket's file mode is the access control); the first RPC
// connects it.
func dialSanity(t *testing.T, address string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(address, grpc.WithTransportCredentials(local.NewCredentials()))
	if err != nil {
		t.Fatalf("dial %s: %v", address, err)
	}
	return conn
}
