package driver

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	mount "k8s.io/mount-utils"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/csi/internal/testworker"
	"github.com/strata-cache/strata/csi/statefile"
)

func TestNodePublishRefusesBeforeDoingAnything(t *testing.T) {
	cases := map[string]struct {
		change   func(t *testing.T, env *nodeEnv, req *csi.NodePublishVolumeRequest)
		code     codes.Code
		contains string
	}{
		"a request without a volume id is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) { req.VolumeId = "" },
			code:   codes.InvalidArgument, contains: "volume id missing",
		},
		"mounts the operator did not write are invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.VolumeContext[datav1alpha1.VolumeAttributeMounts] = `{"path":"/raw"}`
			},
			code: codes.InvalidArgument, contains: "not a JSON list of mounts",
		},
		"a request without a target path is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) { req.TargetPath = "" },
			code:   codes.InvalidArgument, contains: "target path missing",
		},
		"a relative target path is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) { req.TargetPath = "pods/x/mount" },
			code:   codes.InvalidArgument, contains: "clean absolute path",
		},
		"a target path outside the kubelet's pods folder is invalid": {
			change: func(t *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.TargetPath = filepath.Join(t.TempDir(), "etc", "mount")
			},
			code: codes.InvalidArgument, contains: "not under the kubelet's pods folder",
		},
		"a target path that climbs out of the pods folder with dot-dot is invalid": {
			change: func(_ *testing.T, env *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.TargetPath = filepath.Join(env.kubeletDir, "pods") + "/../../etc/mount"
			},
			code: codes.InvalidArgument, contains: "clean absolute path",
		},
		"the kubelet folder itself is not a pod's target": {
			change: func(_ *testing.T, env *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.TargetPath = filepath.Join(env.kubeletDir, "pods")
			},
			code: codes.InvalidArgument, contains: "not under the kubelet's pods folder",
		},
		"a target path that leads out of the pods folder through a symbolic link is invalid": {
			change: func(t *testing.T, env *nodeEnv, req *csi.NodePublishVolumeRequest) {
				link := filepath.Join(env.kubeletDir, "pods", "evil")
				if err := os.Symlink(t.TempDir(), link); err != nil {
					t.Fatal(err)
				}
				req.TargetPath = filepath.Join(link, "mount")
			},
			code: codes.InvalidArgument, contains: "outside the kubelet's pods folder",
		},
		"a target path that is a symbolic link is invalid": {
			change: func(t *testing.T, env *nodeEnv, req *csi.NodePublishVolumeRequest) {
				inside := filepath.Join(env.kubeletDir, "pods", "other")
				if err := os.MkdirAll(inside, 0o750); err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(inside, req.TargetPath); err != nil {
					t.Fatal(err)
				}
			},
			code: codes.InvalidArgument, contains: "symbolic link",
		},
		"a request without a volume capability is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) { req.VolumeCapability = nil },
			code:   codes.InvalidArgument, contains: "capability missing",
		},
		"block access is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.VolumeCapability.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
			},
			code: codes.InvalidArgument, contains: "block access is not supported",
		},
		"a mount flag other than the restricting ones is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.VolumeCapability.GetMount().MountFlags = []string{"ro", "suid", "dev"}
			},
			code: codes.InvalidArgument, contains: "mount flags suid, dev are not supported",
		},
		"a volume id that is not namespace/name/uid is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) { req.VolumeId = "corpus" },
			code:   codes.InvalidArgument, contains: "not a Dataset's <namespace>/<name>/<uid>",
		},
		"a volume id whose uid is a path is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.VolumeId = testNamespace + "/" + testDataset + "/.."
				req.VolumeContext[datav1alpha1.VolumeAttributeUID] = ".."
			},
			code: codes.InvalidArgument, contains: "is not a UID",
		},
		"a volume id whose namespace is no DNS label is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.VolumeId = "Team_A/" + testDataset + "/" + testUID
			},
			code: codes.InvalidArgument, contains: "namespace",
		},
		"a volume id that names another namespace than the attributes is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.VolumeId = "team-b/" + testDataset + "/" + testUID
			},
			code: codes.InvalidArgument, contains: datav1alpha1.VolumeAttributeNamespace,
		},
		"a uid attribute that differs from the volume id is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.VolumeContext[datav1alpha1.VolumeAttributeUID] = "0000"
			},
			code: codes.InvalidArgument, contains: datav1alpha1.VolumeAttributeUID,
		},
		"a missing Dataset attribute is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				delete(req.VolumeContext, datav1alpha1.VolumeAttributeDataset)
			},
			code: codes.InvalidArgument, contains: datav1alpha1.VolumeAttributeDataset,
		},
		"a missing pool attribute is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				delete(req.VolumeContext, datav1alpha1.VolumeAttributePool)
			},
			code: codes.InvalidArgument, contains: datav1alpha1.VolumeAttributePool,
		},
		"a pool attribute that is a path is invalid": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.VolumeContext[datav1alpha1.VolumeAttributePool] = "../../etc"
			},
			code: codes.InvalidArgument, contains: datav1alpha1.VolumeAttributePool,
		},
		"a pod of another namespace is denied": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.VolumeContext[contextPodNamespace] = "team-b"
			},
			code: codes.PermissionDenied, contains: "a pod of namespace team-b may not mount Dataset corpus of namespace team-a",
		},
		"a volume context without the pod's namespace is denied": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				delete(req.VolumeContext, contextPodNamespace)
			},
			code: codes.PermissionDenied, contains: "podInfoOnMount: true",
		},
		"an inline ephemeral volume is denied": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.VolumeContext[contextEphemeral] = "true"
			},
			code: codes.PermissionDenied, contains: "inline (ephemeral) volumes",
		},
		"a provisioned volume is not served yet": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.VolumeId = outputVolumePrefix + "0123456789abcdef0123456789abcdef"
			},
			code: codes.FailedPrecondition, contains: provisionedNotServed,
		},
		"a writable publish of an input Dataset says to mount it read-only": {
			change: func(_ *testing.T, _ *nodeEnv, req *csi.NodePublishVolumeRequest) {
				req.VolumeCapability.AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
				req.Readonly = false
			},
			code: codes.FailedPrecondition, contains: "readOnly: true (only the Datasets a Lineage writes, spec.lineage, are writable)",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			env := newNodeEnv(t)
			req := env.publishRequest(t, "pod-1")
			tc.change(t, env, req)
			_, err := env.node(t).NodePublishVolume(context.Background(), req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.contains) {
				t.Fatalf("NodePublishVolume = %v; want %v with %q", err, tc.code, tc.contains)
			}
			if len(env.worker.Mounts()) != 0 || len(env.mounter.GetLog()) != 0 {
				t.Fatalf("a refused publish reached the worker (%d calls) or the mounter (%v)", len(env.worker.Mounts()), env.mounter.GetLog())
			}
		})
	}
}

func TestNodePublishBindsTheWorkersMountReadOnlyAndIsIdempotent(t *testing.T) {
	env := newNodeEnv(t)
	n := env.node(t)
	req := env.publishRequest(t, "pod-1")
	req.VolumeCapability.GetMount().MountFlags = []string{"noexec"}
	for i := range 3 {
		if _, err := n.NodePublishVolume(context.Background(), req); err != nil {
			t.Fatalf("NodePublishVolume #%d: %v", i, err)
		}
	}

	// The worker is asked at every publish (a republish hands it the Secret's current keys);
	// the target is bound once.
	mounts := env.worker.Mounts()
	if len(mounts) != 3 {
		t.Fatalf("the worker was asked %d times to mount, want at each of the 3 publishes", len(mounts))
	}
	m := mounts[0]
	if m.GetNamespace() != testNamespace || m.GetName() != testDataset || m.GetUid() != testUID || !m.GetReadOnly() {
		t.Fatalf("MountDataset request = %v", m)
	}
	src := m.GetSource()
	if src.GetUri() != "s3://bucket/corpus/" || src.GetEndpoint() != "http://minio.minio:9000" || src.GetRegion() != "us-east-1" ||
		src.GetCredentials()["accessKeyID"] != "AKIA" || src.GetCredentials()["secretAccessKey"] != "s3cr3t" {
		t.Fatalf("MountDataset source = %v; want the volume's source attributes and the publish secrets", src)
	}

	if got := env.mountsOf(req.TargetPath); got != 1 {
		t.Fatalf("%d mounts onto the target, want 1", got)
	}
	mps, _ := env.mounter.List()
	mp := mps[0]
	if mp.Device != env.worker.Path(testUID) || !contains(mp.Opts, "bind") || !contains(mp.Opts, "ro") || !contains(mp.Opts, "noexec") {
		t.Fatalf("mount point = %+v; want a read-only bind of %s with noexec", mp, env.worker.Path(testUID))
	}
	fi, err := os.Stat(req.TargetPath)
	if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o750 {
		t.Fatalf("target %s: %v, %v; want a 0750 directory", req.TargetPath, fi, err)
	}
	if pubs := savedPublications(t, env); len(pubs) != 1 || pubs[0] != (publication{
		VolumeID: req.VolumeId, Target: req.TargetPath, UID: testUID, Pool: testPool,
	}) {
		t.Fatalf("saved publications = %+v", pubs)
	}
}

func TestARepublishHandsTheWorkerTheSecretsCurrentKeys(t *testing.T) {
	env := newNodeEnv(t)
	n := env.node(t)
	req := env.publishRequest(t, "pod-1")
	if _, err := n.NodePublishVolume(context.Background(), req); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	// The kubelet's periodic republish, after the user rotated the Secret.
	req.Secrets = map[string]string{"accessKeyID": "AKIA-NEW", "secretAccessKey": "rotated"}
	if _, err := n.NodePublishVolume(context.Background(), req); err != nil {
		t.Fatalf("republishing: %v", err)
	}
	mounts := env.worker.Mounts()
	if got := mounts[len(mounts)-1].GetSource().GetCredentials(); got["accessKeyID"] != "AKIA-NEW" || got["secretAccessKey"] != "rotated" {
		t.Fatalf("the worker was last given credentials %v, want the rotated ones", got)
	}
	if got := env.mountsOf(req.TargetPath); got != 1 {
		t.Fatalf("%d mounts onto the target, want 1: a republish binds nothing again", got)
	}
}

// TestNodePublishHandsTheWorkerEachMountWithItsOwnKeys publishes a Dataset of several stores:
// the worker gets each mount at its folder, with the keys the operator's combined Secret holds
// for it, and a mount without a Secret gets none (a public bucket).
func TestNodePublishHandsTheWorkerEachMountWithItsOwnKeys(t *testing.T) {
	env := newNodeEnv(t)
	req := env.publishRequest(t, "pod-1")
	for _, k := range []string{datav1alpha1.VolumeAttributeSourceURI, datav1alpha1.VolumeAttributeSourceEndpoint, datav1alpha1.VolumeAttributeSourceRegion} {
		delete(req.VolumeContext, k)
	}
	req.VolumeContext[datav1alpha1.VolumeAttributeMounts] = datav1alpha1.EncodeVolumeMounts([]datav1alpha1.VolumeMount{
		{Path: "/raw", URI: "s3://private/rec/", Endpoint: "http://minio.minio:9000"},
		{Path: "/ref/corpus", URI: "s3://public/corpus/", Region: "eu-west-1"},
	})
	req.Secrets = map[string]string{
		datav1alpha1.MountCredentialKey(0, "accessKeyID"):     "AKIA",
		datav1alpha1.MountCredentialKey(0, "secretAccessKey"): "s3cr3t",
		datav1alpha1.MountCredentialKey(10, "accessKeyID"):    "not mount 1's",
	}
	if _, err := env.node(t).NodePublishVolume(context.Background(), req); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	got := env.worker.Mounts()
	want := &workerpb.MountDatasetRequest{
		Namespace: testNamespace, Name: testDataset, Uid: testUID, ReadOnly: true,
		Mounts: []*workerpb.SourceMount{
			{Path: "raw", Source: &workerpb.DatasetSource{Uri: "s3://private/rec/", Endpoint: "http://minio.minio:9000",
				Credentials: map[string]string{"accessKeyID": "AKIA", "secretAccessKey": "s3cr3t"}}},
			{Path: "ref/corpus", Source: &workerpb.DatasetSource{Uri: "s3://public/corpus/", Region: "eu-west-1", Credentials: map[string]string{}}},
		},
	}
	if len(got) != 1 || !proto.Equal(got[0], want) {
		t.Fatalf("MountDataset requests = %v; want %v", got, want)
	}
}

func TestNodePublishServesAWriterModeReadOnlyWhenThePodAsksReadOnly(t *testing.T) {
	env := newNodeEnv(t)
	req := env.publishRequest(t, "pod-1")
	req.VolumeCapability.AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
	req.Readonly = true
	if _, err := env.node(t).NodePublishVolume(context.Background(), req); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	if mps, _ := env.mounter.List(); len(mps) != 1 || !contains(mps[0].Opts, "ro") {
		t.Fatalf("mount points = %+v, want one read-only bind", mps)
	}
}

// TestNodePublishesOutputsWritableToWriters publishes a Lineage's output: writers get a
// writable bind, readers a read-only one, and the worker serves it as an output, with no source.
func TestNodePublishesOutputsWritableToWriters(t *testing.T) {
	cases := map[string]struct {
		readonly bool
		wantRO   bool
	}{
		"a writer gets a writable bind":              {readonly: false, wantRO: false},
		"a pod that mounts it readOnly cannot write": {readonly: true, wantRO: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			env := newNodeEnv(t)
			req := env.publishRequest(t, "pod-1")
			req.VolumeContext[datav1alpha1.VolumeAttributeOutput] = "true"
			for _, k := range []string{datav1alpha1.VolumeAttributeSourceURI, datav1alpha1.VolumeAttributeSourceEndpoint, datav1alpha1.VolumeAttributeSourceRegion} {
				delete(req.VolumeContext, k)
			}
			req.VolumeCapability.AccessMode.Mode = csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER
			req.Readonly = tc.readonly
			if _, err := env.node(t).NodePublishVolume(context.Background(), req); err != nil {
				t.Fatalf("NodePublishVolume: %v", err)
			}
			mounts := env.worker.Mounts()
			if len(mounts) != 1 || !mounts[0].GetOutput() || mounts[0].GetSource() != nil || mounts[0].GetReadOnly() != tc.wantRO {
				t.Fatalf("MountDataset requests = %v; want one for an output, with no source, read-only %t", mounts, tc.wantRO)
			}
			mps, _ := env.mounter.List()
			if len(mps) != 1 || !contains(mps[0].Opts, "bind") || contains(mps[0].Opts, "ro") != tc.wantRO {
				t.Fatalf("mount points = %+v; want one bind, read-only %t", mps, tc.wantRO)
			}
		})
	}
}

func TestNodeUnpublishIsIdempotentAndReleasesTheDatasetOnce(t *testing.T) {
	env := newNodeEnv(t)
	n := env.node(t)
	req := env.publishRequest(t, "pod-1")
	if _, err := n.NodePublishVolume(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	unpublish := &csi.NodeUnpublishVolumeRequest{VolumeId: req.VolumeId, TargetPath: req.TargetPath}
	for i := range 3 {
		if _, err := n.NodeUnpublishVolume(context.Background(), unpublish); err != nil {
			t.Fatalf("NodeUnpublishVolume #%d: %v", i, err)
		}
	}
	if _, err := os.Lstat(req.TargetPath); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the target is still there after unpublish: %v", err)
	}
	if mps, _ := env.mounter.List(); len(mps) != 0 {
		t.Fatalf("mount points left: %+v", mps)
	}
	if got := env.worker.Unmounts(); len(got) != 1 || got[0] != testUID {
		t.Fatalf("UnmountDataset calls = %v, want one for %s", got, testUID)
	}
	if pubs := savedPublications(t, env); len(pubs) != 0 {
		t.Fatalf("saved publications after unpublish = %+v", pubs)
	}
}

func TestNodeUnpublishOfWhatIsNotMountedSucceeds(t *testing.T) {
	env := newNodeEnv(t)
	n := env.node(t)
	never := env.target("pod-never")
	if _, err := n.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "team-a/corpus/" + testUID, TargetPath: never}); err != nil {
		t.Fatalf("unpublishing a target that does not exist: %v", err)
	}
	empty := env.target("pod-empty")
	if err := os.MkdirAll(empty, 0o750); err != nil {
		t.Fatal(err)
	}
	if _, err := n.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "team-a/corpus/" + testUID, TargetPath: empty}); err != nil {
		t.Fatalf("unpublishing a target that is not mounted: %v", err)
	}
	if _, err := os.Lstat(empty); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the unmounted target was not removed: %v", err)
	}
	if len(env.worker.Unmounts()) != 0 {
		t.Fatalf("the worker was asked to unmount a Dataset this node never published: %v", env.worker.Unmounts())
	}
}

func TestNodeUnpublishRefusesAPathOutsideThePodsFolder(t *testing.T) {
	env := newNodeEnv(t)
	outside := t.TempDir()
	_, err := env.node(t).NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: "team-a/corpus/" + testUID, TargetPath: outside})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("NodeUnpublishVolume of %s = %v, want InvalidArgument", outside, err)
	}
	if _, err := os.Stat(outside); err != nil {
		t.Fatalf("a folder outside the pods folder was touched: %v", err)
	}
}

func TestARestartedNodeUnmountsTheDatasetWhenItsLastTargetGoes(t *testing.T) {
	env := newNodeEnv(t)
	first := env.node(t)
	req1, req2 := env.publishRequest(t, "pod-1"), env.publishRequest(t, "pod-2")
	for _, req := range []*csi.NodePublishVolumeRequest{req1, req2} {
		if _, err := first.NodePublishVolume(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}

	// The plugin restarts: its memory is gone, the state folder and the mounts are not.
	restarted := env.node(t)
	if _, err := restarted.NodePublishVolume(context.Background(), req1); err != nil {
		t.Fatalf("repeating a publish after a restart: %v", err)
	}
	if got := env.mountsOf(req1.TargetPath); got != 1 {
		t.Fatalf("a repeated publish after a restart mounted again (%d mounts)", got)
	}
	if _, err := restarted.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: req1.VolumeId, TargetPath: req1.TargetPath}); err != nil {
		t.Fatal(err)
	}
	if got := env.worker.Unmounts(); len(got) != 0 {
		t.Fatalf("the worker was asked to unmount while pod-2 still uses the Dataset: %v", got)
	}
	if _, err := restarted.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: req2.VolumeId, TargetPath: req2.TargetPath}); err != nil {
		t.Fatal(err)
	}
	if got := env.worker.Unmounts(); len(got) != 1 || got[0] != testUID {
		t.Fatalf("UnmountDataset calls = %v, want one for %s once its last target went", got, testUID)
	}
}

func TestConcurrentPublishesOfOneTargetMountOnce(t *testing.T) {
	env := newNodeEnv(t)
	n := env.node(t)
	req := env.publishRequest(t, "pod-1")
	entered, release := env.worker.Hold()
	defer release()

	first := make(chan error, 1)
	go func() {
		_, err := n.NodePublishVolume(context.Background(), req)
		first <- err
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the first publish never reached the worker")
	}
	if _, err := n.NodePublishVolume(context.Background(), req); status.Code(err) != codes.Aborted {
		t.Fatalf("a publish of a target under publication = %v, want Aborted", err)
	}
	release()
	if err := <-first; err != nil {
		t.Fatalf("the first publish: %v", err)
	}

	// Many at once: each is Aborted or succeeds, and the target is mounted once.
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := n.NodePublishVolume(context.Background(), req)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil && status.Code(err) != codes.Aborted {
			t.Fatalf("a concurrent publish = %v, want success or Aborted", err)
		}
	}
	if got := env.mountsOf(req.TargetPath); got != 1 {
		t.Fatalf("the target was mounted %d times, want once", got)
	}
}

func TestNodePublishSaysWhichWorkerDoesNotAnswer(t *testing.T) {
	env := newNodeEnv(t)
	n := env.nodeWith(t, env.mounter, env.sockets(t, shortTempDir(t)))
	req := env.publishRequest(t, "pod-1")
	_, err := n.NodePublishVolume(context.Background(), req)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "is the worker of pool fast running on node node-a?") {
		t.Fatalf("NodePublishVolume without a worker = %v, want Unavailable asking whether the worker runs", err)
	}
	if _, err := os.Lstat(req.TargetPath); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the target was created although nothing was mounted: %v", err)
	}
	if pubs := savedPublications(t, env); len(pubs) != 0 {
		t.Fatalf("a failed publish was recorded: %+v", pubs)
	}
}

func TestNodePublishRefusesAWorkerOfAnotherNode(t *testing.T) {
	env := newNodeEnv(t)
	// A server on the pool's socket whose certificate is the worker of another node: a plugin
	// that took it for this node's worker would mount what it serves into the pod.
	dir := shortTempDir(t)
	testworker.Start(t, env.ca, dir, testPool, "node-b")
	_, err := env.nodeWith(t, env.mounter, env.sockets(t, dir)).NodePublishVolume(context.Background(), env.publishRequest(t, "pod-1"))
	if err == nil || !strings.Contains(err.Error(), "not spiffe://strata.dev/worker/fast/node-a") {
		t.Fatalf("NodePublishVolume with another node's worker on the socket = %v, want a refusal naming the worker expected", err)
	}
	if len(env.mounter.GetLog()) != 0 {
		t.Fatalf("something was mounted from a worker of another node: %v", env.mounter.GetLog())
	}
}

func TestNodePublishPassesTheWorkersErrorThrough(t *testing.T) {
	env := newNodeEnv(t)
	env.worker.FailWith(status.Error(codes.PermissionDenied, "s3://bucket/corpus/: access denied"))
	_, err := env.node(t).NodePublishVolume(context.Background(), env.publishRequest(t, "pod-1"))
	if status.Code(err) != codes.PermissionDenied ||
		status.Convert(err).Message() != "the node's worker of pool fast answered: s3://bucket/corpus/: access denied" {
		t.Fatalf("NodePublishVolume = %v, want the worker's PermissionDenied and message", err)
	}
	if len(env.mounter.GetLog()) != 0 {
		t.Fatalf("something was mounted after the worker refused: %v", env.mounter.GetLog())
	}
}

func TestNodeUnpublishSucceedsWhenTheWorkerIsGone(t *testing.T) {
	env := newNodeEnv(t)
	req := env.publishRequest(t, "pod-1")
	if _, err := env.node(t).NodePublishVolume(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	// The plugin restarts while the worker is down.
	n := env.nodeWith(t, env.mounter, env.sockets(t, shortTempDir(t)))
	if _, err := n.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: req.VolumeId, TargetPath: req.TargetPath}); err != nil {
		t.Fatalf("NodeUnpublishVolume with the worker down: %v", err)
	}
	if mps, _ := env.mounter.List(); len(mps) != 0 {
		t.Fatalf("mount points left: %+v", mps)
	}
	if pubs := savedPublications(t, env); len(pubs) != 0 {
		t.Fatalf("saved publications after unpublish = %+v", pubs)
	}
}

func TestNodePublishOfAnotherVolumeOnAPublishedTargetAlreadyExists(t *testing.T) {
	env := newNodeEnv(t)
	n := env.node(t)
	req := env.publishRequest(t, "pod-1")
	if _, err := n.NodePublishVolume(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	other := env.publishRequest(t, "pod-1")
	other.VolumeId = testNamespace + "/other/" + "11111111-2222-3333-4444-555555555555"
	other.VolumeContext[datav1alpha1.VolumeAttributeDataset] = "other"
	other.VolumeContext[datav1alpha1.VolumeAttributeUID] = "11111111-2222-3333-4444-555555555555"
	if _, err := n.NodePublishVolume(context.Background(), other); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("publishing another volume on a published target = %v, want AlreadyExists", err)
	}
	if _, err := n.NodeUnpublishVolume(context.Background(), &csi.NodeUnpublishVolumeRequest{VolumeId: other.VolumeId, TargetPath: other.TargetPath}); status.Code(err) != codes.NotFound {
		t.Fatalf("unpublishing another volume from a published target = %v, want NotFound", err)
	}
}

func TestNodePublishRepairsABrokenMount(t *testing.T) {
	env := newNodeEnv(t)
	n := env.node(t)
	req := env.publishRequest(t, "pod-1")
	if _, err := n.NodePublishVolume(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	// The FUSE server behind the bind mount died: the mount point answers ENOTCONN.
	env.mounter.MountCheckErrors = map[string]error{req.TargetPath: &os.PathError{Op: "stat", Path: req.TargetPath, Err: syscall.ENOTCONN}}
	if _, err := n.NodePublishVolume(context.Background(), req); err != nil {
		t.Fatalf("publishing over a broken mount: %v", err)
	}
	if got := env.mountsOf(req.TargetPath); got != 2 {
		t.Fatalf("%d mounts onto the target, want the first and the repair", got)
	}
	if mps, _ := env.mounter.List(); len(mps) != 1 {
		t.Fatalf("mount points = %+v, want only the repaired one", mps)
	}
}

// failingMounter mounts nothing.
type failingMounter struct{ *mount.FakeMounter }

func (failingMounter) Mount(string, string, string, []string) error {
	return errors.New("mount: permission denied")
}

func TestAFailedBindForgetsTheTargetAndReleasesTheDataset(t *testing.T) {
	env := newNodeEnv(t)
	n := env.nodeWith(t, failingMounter{env.mounter}, env.sockets(t, env.socketDir))
	req := env.publishRequest(t, "pod-1")
	if _, err := n.NodePublishVolume(context.Background(), req); status.Code(err) != codes.Internal {
		t.Fatalf("NodePublishVolume with a failing mount = %v, want Internal", err)
	}
	if pubs := savedPublications(t, env); len(pubs) != 0 {
		t.Fatalf("a failed publish was recorded: %+v", pubs)
	}
	if got := env.worker.Unmounts(); len(got) != 1 || got[0] != testUID {
		t.Fatalf("UnmountDataset calls = %v, want the Dataset released", got)
	}
	if _, err := os.Lstat(req.TargetPath); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the target of a failed publish is left: %v", err)
	}
}

func TestProbeIsReadyWhenAWorkerAnswers(t *testing.T) {
	env := newNodeEnv(t)
	if !(env.sockets(t, env.socketDir)).AnyAnswering(context.Background()) {
		t.Fatal("AnyAnswering is false with a worker serving")
	}
	empty := env.sockets(t, shortTempDir(t))
	resp, err := NewIdentity("v1", empty.AnyAnswering).Probe(context.Background(), &csi.ProbeRequest{})
	if err != nil || resp.GetReady().GetValue() {
		t.Fatalf("Probe with no worker = %v, %v; want not ready", resp, err)
	}
	testworker.Start(t, env.ca, empty.Dir, "slow", testNode)
	resp, err = NewIdentity("v1", empty.AnyAnswering).Probe(context.Background(), &csi.ProbeRequest{})
	if err != nil || !resp.GetReady().GetValue() {
		t.Fatalf("Probe with a worker = %v, %v; want ready", resp, err)
	}
}

func TestNodeInfoAndCapabilities(t *testing.T) {
	env := newNodeEnv(t)
	n := env.node(t)
	info, err := n.NodeGetInfo(context.Background(), &csi.NodeGetInfoRequest{})
	if err != nil || info.GetNodeId() != testNode || info.GetMaxVolumesPerNode() != 0 || info.GetAccessibleTopology() != nil {
		t.Fatalf("NodeGetInfo = %v, %v", info, err)
	}
	caps, err := n.NodeGetCapabilities(context.Background(), &csi.NodeGetCapabilitiesRequest{})
	if err != nil || len(caps.GetCapabilities()) != 0 {
		t.Fatalf("NodeGetCapabilities = %v, %v; want none (no staging)", caps, err)
	}
}

func savedPublications(t *testing.T, env *nodeEnv) []publication {
	t.Helper()
	var st publicationsState
	if err := statefile.Load(filepath.Join(env.stateDir, publicationsFile), &st); err != nil {
		t.Fatal(err)
	}
	return st.Publications
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
