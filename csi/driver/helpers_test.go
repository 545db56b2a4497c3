package driver

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	mount "k8s.io/mount-utils"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/csi/internal/testworker"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
)

const (
	testNode      = "node-a"
	testPool      = "fast"
	testNamespace = "team-a"
	testDataset   = "corpus"
	testUID       = "3f2b8c1e-5d4a-4e6f-9a7b-0c1d2e3f4a5b"
)

// nodeEnv is a node as the node plugin sees it: the kubelet's folder, the plugin's state
// folder, the kernel's mount table (a fake mounter) and the pool's worker.
type nodeEnv struct {
	kubeletDir, stateDir, socketDir string
	mounter                         *mount.FakeMounter
	worker                          *testworker.Server
	// ca issues the plugin's and the workers' certificates.
	ca *pkitest.Authority
}

// shortTempDir is a temporary folder with a path short enough for Unix sockets.
func shortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "strata-csi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// newNodeEnv makes a node with the worker of testPool running.
func newNodeEnv(t testing.TB) *nodeEnv {
	t.Helper()
	env := &nodeEnv{
		kubeletDir: t.TempDir(),
		stateDir:   t.TempDir(),
		socketDir:  shortTempDir(t),
		mounter:    mount.NewFakeMounter(nil),
		ca:         pkitest.New(t),
	}
	if err := os.MkdirAll(filepath.Join(env.kubeletDir, "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	env.worker = testworker.Start(t, env.ca, env.socketDir, testPool, testNode)
	return env
}

// node starts a node plugin on env, as a (re)started plugin would.
func (env *nodeEnv) node(t testing.TB) *Node {
	t.Helper()
	return env.nodeWith(t, env.mounter, env.sockets(t, env.socketDir))
}

// sockets are the workers' sockets in dir as the plugin of testNode reaches them, with its
// certificate.
func (env *nodeEnv) sockets(t testing.TB, dir string) WorkerSockets {
	return WorkerSockets{Dir: dir, Node: testNode, Credentials: env.ca.Credentials(t, pki.CSINode(testNode))}
}

func (env *nodeEnv) nodeWith(t testing.TB, m mount.Interface, w Workers) *Node {
	t.Helper()
	var log logr.Logger
	if tt, ok := t.(*testing.T); ok {
		log = testr.New(tt)
	}
	n, err := NewNode(NodeConfig{NodeID: testNode, KubeletDir: env.kubeletDir, StateDir: env.stateDir, Mounter: m, Workers: w, Log: log})
	if err != nil {
		t.Fatalf("NewNode: %v", err)
	}
	return n
}

// target is the target path the kubelet gives a pod's volume.
func (env *nodeEnv) target(pod string) string {
	return filepath.Join(env.kubeletDir, "pods", pod, "volumes", "kubernetes.io~csi", "strata-"+testUID, "mount")
}

// publishRequest is what the kubelet sends to publish the test Dataset into pod, with its
// parent folder created as the kubelet does.
func (env *nodeEnv) publishRequest(t testing.TB, pod string) *csi.NodePublishVolumeRequest {
	t.Helper()
	target := env.target(pod)
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		t.Fatal(err)
	}
	return &csi.NodePublishVolumeRequest{
		VolumeId:   testNamespace + "/" + testDataset + "/" + testUID,
		TargetPath: target,
		VolumeCapability: &csi.VolumeCapability{
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY},
		},
		Readonly: true,
		Secrets:  map[string]string{"accessKeyID": "AKIA", "secretAccessKey": "s3cr3t"},
		VolumeContext: map[string]string{
			datav1alpha1.VolumeAttributeNamespace:      testNamespace,
			datav1alpha1.VolumeAttributeDataset:        testDataset,
			datav1alpha1.VolumeAttributeUID:            testUID,
			datav1alpha1.VolumeAttributePool:           testPool,
			datav1alpha1.VolumeAttributeSourceURI:      "s3://bucket/corpus/",
			datav1alpha1.VolumeAttributeSourceEndpoint: "http://minio.minio:9000",
			datav1alpha1.VolumeAttributeSourceRegion:   "us-east-1",
			contextPodNamespace:                        testNamespace,
			contextPodName:                             pod,
			"csi.storage.k8s.io/pod.uid":               pod,
			"csi.storage.k8s.io/serviceAccount.name":   "default",
		},
	}
}

// mountsOf counts the mount calls the fake mounter served onto target.
func (env *nodeEnv) mountsOf(target string) int {
	n := 0
	for _, a := range env.mounter.GetLog() {
		if a.Action == mount.FakeActionMount && a.Target == target {
			n++
		}
	}
	return n
}
