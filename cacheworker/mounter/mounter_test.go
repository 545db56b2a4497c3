package mounter

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/moby/sys/mountinfo"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/fusetest"
	"github.com/strata-cache/strata/internal/miniotest"
)

const (
	blockSize = 64 << 10
	bucket    = "data"
	uid       = "0b9c2f1e-6f2d-4a57-9c4e-2b1f0a7d3c11"
)

func randomBytes(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// fixture is a Mounter over a real tier store, served over gRPC on a Unix socket, with a
// Dataset in a real MinIO.
// The OpenID provider of every fixture's MinIO, whose tokens it trades for a role's credentials.
const (
	tokenIssuer   = "https://issuer.test"
	tokenAudience = "strata-test-sts"
)

type fixture struct {
	srv *miniotest.Server
	// signer signs the tokens the fixture's MinIO takes (for tokenAudience).
	signer    *miniotest.TokenSigner
	files     map[string][]byte
	mountsDir string
	m         *Mounter
	cfg       Config
	client    workerpb.MounterClient

	mu     sync.Mutex
	stored []tierstore.BlockInfo
}

func newFixture(t *testing.T, change func(*Config)) *fixture {
	t.Helper()
	fusetest.Require(t)
	signer := miniotest.NewTokenSigner(t)
	provider := miniotest.ServeOpenID(t, tokenIssuer, signer.JWKS())
	f := &fixture{srv: miniotest.Start(t, provider.Env(tokenAudience, "readwrite")...), signer: signer, files: map[string][]byte{
		"a.txt":                []byte("hello"),
		"dir/b.bin":            randomBytes(3*blockSize+17, 1),
		"données/été 2024.csv": []byte("jour,température\n"),
	}}
	f.srv.MakeBucket(t, bucket)
	for p, b := range f.files {
		f.srv.Put(t, bucket, "sets/v1/"+p, b)
	}
	root := t.TempDir()
	store, err := tierstore.Open(context.Background(), tierstore.Config{
		IndexDir: filepath.Join(root, "index"),
		Tiers:    []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(root, "mem")}, Quota: 64 << 20}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	f.mountsDir = filepath.Join(root, "mounts")
	cfg := Config{
		MountsDir: f.mountsDir, Store: store, BlockSize: blockSize, Registerer: prometheus.NewRegistry(),
		Stored: func(_ context.Context, info tierstore.BlockInfo) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.stored = append(f.stored, info)
		},
	}
	if change != nil {
		change(&cfg)
	}
	f.cfg = cfg
	if f.m, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.m.Close(); err != nil {
			t.Errorf("closing the mounter: %v", err)
		}
		// Whatever a failed test left mounted must not outlive it.
		mounts, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(f.mountsDir))
		for _, mi := range mounts {
			t.Errorf("%s is still mounted after Close", mi.Mountpoint)
			_ = unix.Unmount(mi.Mountpoint, unix.MNT_DETACH)
		}
	})

	gs := grpc.NewServer()
	workerpb.RegisterMounterServer(gs, f.m)
	sock := filepath.Join(t.TempDir(), "mounter.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = gs.Serve(lis) // ends with Stop
	}()
	t.Cleanup(func() { gs.Stop(); <-served })
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	f.client = workerpb.NewMounterClient(conn)
	return f
}

// request asks for the fixture's Dataset under id.
func (f *fixture) request(id string) *workerpb.MountDatasetRequest {
	return &workerpb.MountDatasetRequest{
		Namespace: "team-a", Name: "images", Uid: id, ReadOnly: true,
		Source: &workerpb.DatasetSource{
			Uri: "s3://" + bucket + "/sets/v1", Endpoint: "http://" + f.srv.Endpoint,
			Credentials: map[string]string{"accessKeyID": miniotest.AccessKey, "secretAccessKey": miniotest.SecretKey},
		},
	}
}

// storedTimes counts the times block id was stored and reported.
func (f *fixture) storedTimes(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, info := range f.stored {
		if info.ID == id {
			n++
		}
	}
	return n
}

// roleCredentials are the credentials of a web identity: a token signed by signer, and the
// role the fixture's MinIO gives for tokens of its provider.
func (f *fixture) roleCredentials(t *testing.T, signer *miniotest.TokenSigner) map[string]string {
	return map[string]string{
		understore.CredentialWebIdentityToken: signer.Sign(t, tokenIssuer, tokenAudience, "system:serviceaccount:team-a:reader", time.Hour),
		understore.CredentialRoleARN:          miniotest.OpenIDRoleARN(tokenAudience),
	}
}

func (f *fixture) mount(t *testing.T, req *workerpb.MountDatasetRequest) string {
	t.Helper()
	resp, err := f.client.MountDataset(context.Background(), req)
	if err != nil {
		t.Fatalf("mounting %s: %v", req.GetUid(), err)
	}
	return resp.GetPath()
}

func mounted(t *testing.T, p string) bool {
	t.Helper()
	ok, err := isMountPoint(p)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func TestMountDatasetServesTheDatasetAtItsMountPoint(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	var path string

	t.Run("the Dataset is mounted at MountsDir/<uid> and reads as the bucket", func(t *testing.T) {
		g := NewWithT(t)
		path = f.mount(t, f.request(uid))
		g.Expect(path).To(Equal(filepath.Join(f.mountsDir, uid)))
		g.Expect(mounted(t, path)).To(BeTrue())
		for p, want := range f.files {
			got, err := os.ReadFile(filepath.Join(path, p))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(want), p)
		}
	})

	t.Run("blocks read are reported with the Dataset as their origin", func(t *testing.T) {
		g := NewWithT(t)
		g.Eventually(func() int {
			f.mu.Lock()
			defer f.mu.Unlock()
			return len(f.stored)
		}).WithTimeout(10*time.Second).Should(BeNumerically(">=", 6), "a.txt, 4 blocks of dir/b.bin and the csv")
		f.mu.Lock()
		defer f.mu.Unlock()
		var paths []string
		for _, info := range f.stored {
			var origin workerpb.BlockOrigin
			g.Expect(proto.Unmarshal(info.Origin, &origin)).To(Succeed())
			g.Expect(origin.GetDataset()).To(Equal("team-a/images/" + uid))
			g.Expect(origin.GetRoot()).To(Equal("/datasets/team-a/images/" + uid))
			paths = append(paths, origin.GetPath())
		}
		root := "/datasets/team-a/images/" + uid
		g.Expect(paths).To(ContainElements(root+"/a.txt", root+"/dir/b.bin", root+"/données/été 2024.csv"),
			"blocks are reported under a root of the Dataset's UID, so a new Dataset of the same name starts afresh")
	})

	t.Run("mounting again answers the same path, and the next read uses rotated keys or a renewed token", func(t *testing.T) {
		g := NewWithT(t)
		// A block of dir/b.bin that is neither in a tier nor in the page cache: its next read
		// goes to the under-store, with whatever credentials the mount holds then.
		info, err := f.srv.Client.StatObject(ctx, bucket, "sets/v1/dir/b.bin", minio.StatObjectOptions{})
		g.Expect(err).NotTo(HaveOccurred())
		block := cache.BlockID(uid, "dir/b.bin", info.ETag, 1)
		// The cache stores what a read fetched in the background: a block is removed only once
		// the store of the last read that fetched it has happened, or it would come back.
		storedOnce := 1 // by the first subtest's read
		uncache := func() {
			g.Eventually(func() int { return f.storedTimes(block) }).WithTimeout(10*time.Second).Should(BeNumerically(">=", storedOnce),
				"the block a read fetched is stored")
			err := f.m.cfg.Store.Delete(ctx, block)
			g.Expect(err == nil || errors.Is(err, tierstore.ErrNotFound)).To(BeTrue(), "removing the block: %v", err)
			_, err = f.m.cfg.Store.(*tierstore.Store).Info(block)
			g.Expect(err).To(MatchError(tierstore.ErrNotFound))
			file, err := os.Open(filepath.Join(path, "dir/b.bin"))
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { _ = file.Close() }()
			g.Expect(unix.Fadvise(int(file.Fd()), 0, 0, unix.FADV_DONTNEED)).To(Succeed())
		}
		readBlock1 := func() ([]byte, error) {
			file, err := os.Open(filepath.Join(path, "dir/b.bin"))
			g.Expect(err).NotTo(HaveOccurred())
			defer func() { _ = file.Close() }()
			buf := make([]byte, blockSize)
			_, err = file.ReadAt(buf, blockSize)
			return buf, err
		}
		rotations := testutil.ToFloat64(f.m.rotations)

		// The kubelet's republishes, each with the credentials the volume's Secret holds then.
		republishes := []struct {
			what  string
			creds map[string]string
			fails bool
		}{
			{"the Secret's new (wrong) keys", map[string]string{"accessKeyID": miniotest.AccessKey, "secretAccessKey": "not-the-key-any-more"}, true},
			{"the keys put right in the Secret", f.request(uid).Source.Credentials, false},
			{"a web identity token the store does not trust", f.roleCredentials(t, miniotest.NewTokenSigner(t)), true},
			{"a renewed web identity token", f.roleCredentials(t, f.signer), false},
		}
		for _, r := range republishes {
			req := f.request(uid)
			req.Source.Credentials = r.creds
			g.Expect(f.mount(t, req)).To(Equal(path))
			mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(path))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(mounts).To(HaveLen(1), "mounted once")
			uncache()
			stored := f.storedTimes(block)
			got, err := readBlock1()
			if r.fails {
				g.Expect(err).To(MatchError(syscall.EIO), "the read went to MinIO with %s", r.what)
				continue
			}
			g.Expect(err).NotTo(HaveOccurred(), "%s are used by the next read, without a remount", r.what)
			g.Expect(got).To(Equal(f.files["dir/b.bin"][blockSize : 2*blockSize]))
			storedOnce = stored + 1 // this read's fetch, stored in the background
		}
		g.Expect(testutil.ToFloat64(f.m.rotations) - rotations).To(Equal(float64(len(republishes))))
		last := f.request(uid)
		last.Source.Credentials = republishes[len(republishes)-1].creds
		g.Expect(f.mount(t, last)).To(Equal(path))
		g.Expect(testutil.ToFloat64(f.m.rotations)-rotations).To(Equal(float64(len(republishes))), "the same credentials again rotate nothing")
	})

	t.Run("the same uid with another source is refused until unmounted", func(t *testing.T) {
		g := NewWithT(t)
		req := f.request(uid)
		req.Source.Uri = "s3://" + bucket + "/sets/v2"
		_, err := f.client.MountDataset(ctx, req)
		g.Expect(status.Code(err)).To(Equal(codes.FailedPrecondition))
		g.Expect(err.Error()).To(MatchRegexp(`source s3://data/sets/v1 at http://[^ ]+, not s3://data/sets/v2 at http://`))
		g.Expect(err.Error()).To(ContainSubstring("unmount it first"))
	})

	t.Run("concurrent mounts of one new uid all get the one mount", func(t *testing.T) {
		g := NewWithT(t)
		const id = "second-dataset"
		paths := make([]string, 5)
		errs := make([]error, 5)
		var wg sync.WaitGroup
		for i := range paths {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := f.client.MountDataset(ctx, f.request(id))
				paths[i], errs[i] = resp.GetPath(), err
			}()
		}
		wg.Wait()
		for i := range paths {
			g.Expect(errs[i]).NotTo(HaveOccurred())
			g.Expect(paths[i]).To(Equal(filepath.Join(f.mountsDir, id)))
		}
		mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(paths[0]))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(mounts).To(HaveLen(1))
	})

	t.Run("unmounting removes the mount point; unmounting again succeeds", func(t *testing.T) {
		g := NewWithT(t)
		_, err := f.client.UnmountDataset(ctx, &workerpb.UnmountDatasetRequest{Uid: uid})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(mounted(t, path)).To(BeFalse())
		g.Expect(path).NotTo(BeADirectory())
		_, err = f.client.UnmountDataset(ctx, &workerpb.UnmountDatasetRequest{Uid: uid})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = f.client.UnmountDataset(ctx, &workerpb.UnmountDatasetRequest{Uid: "never-mounted"})
		g.Expect(err).NotTo(HaveOccurred())
	})

	t.Run("after unmounting, the uid can be mounted with another source", func(t *testing.T) {
		g := NewWithT(t)
		f.srv.Put(t, bucket, "sets/v2/only-in-v2.txt", []byte("v2"))
		req := f.request(uid)
		req.Source.Uri = "s3://" + bucket + "/sets/v2"
		p := f.mount(t, req)
		got, err := os.ReadFile(filepath.Join(p, "only-in-v2.txt"))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(got)).To(Equal("v2"))
	})
}

func TestMountDatasetSaysWhatToFix(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.FileRoots = []string{"/nonexistent-root"} })
	noIndex := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"objects": []}`))
	}))
	t.Cleanup(noIndex.Close)
	type failure struct {
		change func(r *workerpb.MountDatasetRequest)
		code   codes.Code
		says   []string
	}
	cases := map[string]failure{
		"a wrong secret key is access denied, naming the bucket": {
			change: func(r *workerpb.MountDatasetRequest) { r.Source.Credentials["secretAccessKey"] = "wrong" },
			code:   codes.FailedPrecondition,
			says:   []string{"access denied", "s3://data/sets/v1/", "spec.source.secretRef"},
		},
		"a missing key names it": {
			change: func(r *workerpb.MountDatasetRequest) { delete(r.Source.Credentials, "secretAccessKey") },
			code:   codes.InvalidArgument,
			says:   []string{"secretAccessKey", "spec.source.secretRef"},
		},
		"no credentials read a bucket that is not public anonymously, and are refused": {
			change: func(r *workerpb.MountDatasetRequest) { r.Source.Credentials = nil },
			code:   codes.FailedPrecondition,
			says:   []string{"s3://data/sets/v1/", "access denied", "read anonymously, so it must be public"},
		},
		"a missing bucket says so": {
			change: func(r *workerpb.MountDatasetRequest) { r.Source.Uri = "s3://no-such-bucket/x" },
			code:   codes.FailedPrecondition,
			says:   []string{"s3://no-such-bucket/x/", "does not exist"},
		},
		"an unreachable endpoint names it": {
			change: func(r *workerpb.MountDatasetRequest) { r.Source.Endpoint = "http://" + miniotest.ClosedAddr(t) },
			code:   codes.Unavailable,
			says:   []string{"unreachable", "spec.source.endpoint"},
		},
		"an input is never writable": {
			change: func(r *workerpb.MountDatasetRequest) { r.ReadOnly = false },
			code:   codes.FailedPrecondition,
			says:   []string{"mount it read-only", "only Lineage outputs are writable"},
		},
		"an output has no source": {
			change: func(r *workerpb.MountDatasetRequest) { r.Output = true },
			code:   codes.InvalidArgument,
			says:   []string{"is an output", "has no source"},
		},
		"an output needs a worker that records what is written": {
			change: func(r *workerpb.MountDatasetRequest) { r.Output, r.Source = true, nil },
			code:   codes.FailedPrecondition,
			says:   []string{"is an output", "--masters"},
		},
		"a uid that is not a token is refused": {
			change: func(r *workerpb.MountDatasetRequest) { r.Uid = "../x" },
			code:   codes.InvalidArgument,
			says:   []string{`uid "../x"`},
		},
		"a namespace that is not a DNS label is refused": {
			change: func(r *workerpb.MountDatasetRequest) { r.Namespace = "Team_A" },
			code:   codes.InvalidArgument,
			says:   []string{`namespace "Team_A"`},
		},
		"a name that is not a DNS subdomain is refused": {
			change: func(r *workerpb.MountDatasetRequest) { r.Name = "images/../x" },
			code:   codes.InvalidArgument,
			says:   []string{`name "images/../x"`},
		},
		"a Dataset without a source is refused": {
			change: func(r *workerpb.MountDatasetRequest) { r.Source = nil },
			code:   codes.InvalidArgument,
			says:   []string{"has no source"},
		},
		"an unsupported scheme is named": {
			change: func(r *workerpb.MountDatasetRequest) { r.Source = &workerpb.DatasetSource{Uri: "nfs://server/export"} },
			code:   codes.InvalidArgument,
			says:   []string{`unsupported scheme "nfs"`},
		},
		"a pvc source without its claim server says where that comes from": {
			change: func(r *workerpb.MountDatasetRequest) { r.Source = &workerpb.DatasetSource{Uri: "pvc://claim/path"} },
			code:   codes.InvalidArgument,
			says:   []string{"no claim server", "PersistentVolume"},
		},
		"a path outside the TierPool's roots is refused": {
			change: func(r *workerpb.MountDatasetRequest) { r.Source = &workerpb.DatasetSource{Uri: "file:///etc"} },
			code:   codes.FailedPrecondition,
			says:   []string{"file:///etc", "fileSourceRoots"},
		},
		"an HTTP source whose server gives no directory index cannot be listed, so not mounted": {
			change: func(r *workerpb.MountDatasetRequest) { r.Source = &workerpb.DatasetSource{Uri: noIndex.URL + "/api/"} },
			code:   codes.FailedPrecondition,
			says:   []string{"cannot be listed", "HTML directory indexes"},
		},
	}
	// mounts makes req read the fixture's bucket at /raw and, at the given folders, the same
	// bucket with other keys.
	mounts := func(r *workerpb.MountDatasetRequest, keys string, folders ...string) {
		r.Mounts = []*workerpb.SourceMount{{Path: "raw", Source: r.Source}}
		for _, folder := range folders {
			other := proto.Clone(r.Source).(*workerpb.DatasetSource)
			other.Credentials["secretAccessKey"] = keys
			r.Mounts = append(r.Mounts, &workerpb.SourceMount{Path: folder, Source: other})
		}
		r.Source = nil
	}
	cases["a mount whose keys are refused is named"] = failure{
		change: func(r *workerpb.MountDatasetRequest) { mounts(r, "wrong", "private") },
		code:   codes.FailedPrecondition,
		says:   []string{"mount /private: ", "access denied", "the secretRef of the spec.mounts entry at /private"},
	}
	for layout, folders := range map[string][]string{
		"mount /raw/inner is inside mount /raw": {"raw/inner"},
		"two mounts at /raw":                    {"raw"},
		"at the root":                           {""},
	} {
		cases["mounts that would hide objects are refused: "+layout] = failure{
			change: func(r *workerpb.MountDatasetRequest) { mounts(r, miniotest.SecretKey, folders...) },
			code:   codes.InvalidArgument,
			says:   []string{layout},
		}
	}
	cases["a source and mounts at once are refused"] = failure{
		change: func(r *workerpb.MountDatasetRequest) {
			src := r.Source
			mounts(r, miniotest.SecretKey)
			r.Source = src
		},
		code: codes.InvalidArgument,
		says: []string{"names a source and mounts"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			req := f.request("failing-" + fmt.Sprint(len(name)))
			tc.change(req)
			_, err := f.client.MountDataset(context.Background(), req)
			g.Expect(status.Code(err)).To(Equal(tc.code), "%v", err)
			for _, s := range tc.says {
				g.Expect(status.Convert(err).Message()).To(ContainSubstring(s))
			}
			entries, err := os.ReadDir(f.mountsDir)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(entries).To(BeEmpty(), "a failed mount leaves nothing behind")
		})
	}
}

func TestMountDatasetShowsEachMountAtItsFolder(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, nil)
	f.srv.MakeBucket(t, "public")
	f.srv.MakePublic(t, "public")
	open := map[string][]byte{"readme.txt": []byte("anyone may read this"), "ref/genome.fa": randomBytes(blockSize+5, 7)}
	for p, b := range open {
		f.srv.Put(t, "public", "shared/"+p, b)
	}
	// A web server's folder, listed from its index pages (Go's file server writes them).
	web := map[string][]byte{"papers/2024/cache.pdf": randomBytes(2*blockSize+9, 8), "index-notes.txt": []byte("served over HTTP")}
	webRoot := t.TempDir()
	for p, b := range web {
		g.Expect(os.MkdirAll(filepath.Join(webRoot, filepath.Dir(p)), 0o750)).To(Succeed())
		g.Expect(os.WriteFile(filepath.Join(webRoot, p), b, 0o640)).To(Succeed())
	}
	webServer := httptest.NewServer(http.FileServer(http.Dir(webRoot)))
	t.Cleanup(webServer.Close)

	req := f.request(uid)
	req.Mounts = []*workerpb.SourceMount{
		{Path: "private/v1", Source: req.Source},
		{Path: "public", Source: &workerpb.DatasetSource{Uri: "s3://public/shared", Endpoint: req.Source.Endpoint}},
		{Path: "web", Source: &workerpb.DatasetSource{Uri: webServer.URL + "/"}},
	}
	req.Source = nil
	path := f.mount(t, req)

	want := map[string][]byte{}
	for p, b := range f.files {
		want["private/v1/"+p] = b
	}
	for p, b := range open {
		want["public/"+p] = b
	}
	for p, b := range web {
		want["web/"+p] = b
	}
	var got []string
	g.Expect(filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(path, p)
		if err != nil {
			return err
		}
		got = append(got, rel)
		b, err := os.ReadFile(p)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(b).To(Equal(want[rel]), rel)
		return nil
	})).To(Succeed())
	g.Expect(got).To(ConsistOf(slices.Collect(maps.Keys(want))), "every object of both buckets and every file of the web server, each under its mount's folder, and nothing else")

	again := proto.Clone(req).(*workerpb.MountDatasetRequest)
	again.Mounts[1].Source.Uri = "s3://public/other"
	_, err := f.client.MountDataset(context.Background(), again)
	g.Expect(status.Code(err)).To(Equal(codes.FailedPrecondition))
	g.Expect(err.Error()).To(ContainSubstring("/public=s3://public/shared at http://"), "a mount of other stores at the same uid names both")
}

func TestUnmountDatasetOfABusyMountSaysSo(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, nil)
	path := f.mount(t, f.request(uid))
	file, err := os.Open(filepath.Join(path, "dir", "b.bin"))
	g.Expect(err).NotTo(HaveOccurred())
	_, err = f.client.UnmountDataset(context.Background(), &workerpb.UnmountDatasetRequest{Uid: uid})
	g.Expect(status.Code(err)).To(Equal(codes.FailedPrecondition))
	g.Expect(err.Error()).To(ContainSubstring("busy"))
	g.Expect(mounted(t, path)).To(BeTrue(), "still mounted, still served")
	buf := make([]byte, 5)
	_, err = file.ReadAt(buf, 0)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(file.Close()).To(Succeed())
	g.Eventually(func() error {
		_, err := f.client.UnmountDataset(context.Background(), &workerpb.UnmountDatasetRequest{Uid: uid})
		return err
	}).WithTimeout(10 * time.Second).Should(Succeed())
	g.Expect(mounted(t, path)).To(BeFalse())
}

func TestUnmountDatasetLeavesPodsTheirMounts(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, nil)
	path := f.mount(t, f.request(uid))
	pod := filepath.Join(t.TempDir(), "pod-volume")
	g.Expect(os.Mkdir(pod, 0o755)).To(Succeed())
	g.Expect(unix.Mount(path, pod, "", unix.MS_BIND, "")).To(Succeed())
	t.Cleanup(func() { _ = unix.Unmount(pod, unix.MNT_DETACH) })

	_, err := f.client.UnmountDataset(context.Background(), &workerpb.UnmountDatasetRequest{Uid: uid})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(mounted(t, path)).To(BeFalse())
	got, err := os.ReadFile(filepath.Join(pod, "dir", "b.bin"))
	g.Expect(err).NotTo(HaveOccurred(), "the pod still reads its files")
	g.Expect(got).To(Equal(f.files["dir/b.bin"]))

	g.Expect(unix.Unmount(pod, 0)).To(Succeed())
	g.Eventually(func() int {
		f.m.mu.Lock()
		defer f.m.mu.Unlock()
		return len(f.m.draining)
	}).WithTimeout(10*time.Second).Should(BeZero(), "released once the pod's mount is gone")
}

// staleFUSEMount mounts a FUSE file system at dir whose server is gone, as a crashed worker
// leaves it: the /dev/fuse descriptor is closed right after the mount.
func staleFUSEMount(t *testing.T, dir string) {
	t.Helper()
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0", fd)
	err = unix.Mount("strata:old", dir, "fuse.strata", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_RDONLY, opts)
	_ = unix.Close(fd)
	if err != nil {
		t.Fatalf("mounting a FUSE file system at %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != unix.ENOTCONN {
		t.Fatalf("stat of a dead FUSE mount: %v, want ENOTCONN", err)
	}
}

func TestRecoverDetachesWhatAnEarlierWorkerLeft(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, nil)
	stale, tmpfs, empty := filepath.Join(f.mountsDir, uid), filepath.Join(f.mountsDir, "tmpfs-left"), filepath.Join(f.mountsDir, "empty-left")
	for _, d := range []string{stale, tmpfs, empty} {
		g.Expect(os.Mkdir(d, 0o755)).To(Succeed())
	}
	staleFUSEMount(t, stale)
	g.Expect(unix.Mount("tmpfs", tmpfs, "tmpfs", 0, "size=1m")).To(Succeed())
	t.Cleanup(func() { _ = unix.Unmount(tmpfs, unix.MNT_DETACH) })
	keep := filepath.Join(f.mountsDir, "not-ours.txt")
	g.Expect(os.WriteFile(keep, []byte("x"), 0o600)).To(Succeed())

	g.Expect(f.m.Recover(context.Background())).To(Succeed())
	for _, d := range []string{stale, tmpfs, empty} {
		g.Expect(mounted(t, d)).To(BeFalse(), d)
		g.Expect(d).NotTo(BeADirectory(), d)
	}
	g.Expect(keep).To(BeARegularFile(), "what is not a folder is left alone")

	path := f.mount(t, f.request(uid))
	got, err := os.ReadFile(filepath.Join(path, "a.txt"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(got)).To(Equal("hello"))
}

func TestMountDatasetReplacesADeadMountPoint(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, nil)
	stale := filepath.Join(f.mountsDir, uid)
	g.Expect(os.Mkdir(stale, 0o755)).To(Succeed())
	staleFUSEMount(t, stale)
	path := f.mount(t, f.request(uid))
	got, err := os.ReadFile(filepath.Join(path, "a.txt"))
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(got)).To(Equal("hello"))
}

func TestCloseUnmountsEveryDataset(t *testing.T) {
	g := NewWithT(t)
	f := newFixture(t, nil)
	first, second := f.mount(t, f.request(uid)), f.mount(t, f.request("other-uid"))
	busy, err := os.Open(filepath.Join(second, "a.txt"))
	g.Expect(err).NotTo(HaveOccurred())
	defer func() { _ = busy.Close() }()

	g.Expect(f.m.Close()).To(Succeed())
	g.Expect(mounted(t, first)).To(BeFalse())
	g.Expect(mounted(t, second)).To(BeFalse(), "a busy mount is detached")
	_, err = f.client.MountDataset(context.Background(), f.request("third"))
	g.Expect(status.Code(err)).To(Equal(codes.Unavailable))
	g.Expect(err.Error()).To(ContainSubstring("shutting down"))
}
