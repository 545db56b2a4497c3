package understore

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/internal/miniotest"
)

// versionedStore is a store under test and how to replace one of its objects.
type versionedStore struct {
	store     Store
	overwrite func(t *testing.T, p string, data []byte)
}

// TestAReadOfAVersionNeverReturnsAnothers checks, for every kind of store Datasets are listed
// from, that Stat and List name an object's version alike, that a read of that version gets its
// bytes, and that once the object is replaced the read fails with ErrChanged instead of
// returning bytes of the new version, in one piece or in parallel ones.
func TestAReadOfAVersionNeverReturnsAnothers(t *testing.T) {
	ctx := context.Background()
	first := bytes.Repeat([]byte("first version "), 20_000)
	second := bytes.Repeat([]byte("SECOND"), 30_000)

	s3 := miniotest.Start(t)
	s3.MakeBucket(t, "data")
	s3.Put(t, "data", "sets/obj.bin", first)
	s3Store, err := NewS3(S3Config{Endpoint: s3.Endpoint, Bucket: "data", Prefix: "sets/", AccessKey: miniotest.AccessKey, SecretKey: miniotest.SecretKey})
	must(t, err)

	dir := t.TempDir()
	writeFile := func(t *testing.T, p string, data []byte) {
		must(t, os.WriteFile(filepath.Join(dir, p), data, 0o640))
		// A rewrite within the clock's resolution would keep the time; a real one a moment later does not.
		later := time.Now().Add(time.Second)
		must(t, os.Chtimes(filepath.Join(dir, p), later, later))
	}
	must(t, os.WriteFile(filepath.Join(dir, "obj.bin"), first, 0o640))
	local, err := NewLocal(LocalConfig{Dir: dir, AllowedRoots: []string{dir}})
	must(t, err)
	t.Cleanup(func() { _ = local.Close() })
	_, claim := serveClaim(t, nil, local, claimToken)

	for name, vs := range map[string]versionedStore{
		"s3":    {store: s3Store, overwrite: func(t *testing.T, p string, data []byte) { s3.Put(t, "data", "sets/"+p, data) }},
		"file":  {store: local, overwrite: writeFile},
		"claim": {store: claim, overwrite: writeFile},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			vs.overwrite(t, "obj.bin", first)
			info, err := vs.store.Stat(ctx, "obj.bin")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(info.ETag).NotTo(BeEmpty())
			g.Expect(info.ETag).NotTo(HavePrefix(`"`), "ETags are held without quotes")
			var listed ObjectInfo
			for obj, err := range vs.store.List(ctx, "") {
				g.Expect(err).NotTo(HaveOccurred())
				if obj.Path == "obj.bin" {
					listed = obj
				}
			}
			g.Expect(listed.ETag).To(Equal(info.ETag), "a listing and a stat name a version alike")

			buf := make([]byte, len(first))
			n, err := ParallelReadAt(ctx, vs.store, "obj.bin", info.ETag, buf, 0, ParallelOptions{ChunkSize: 64 << 10, Concurrency: 3})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(buf[:n]).To(Equal(first))

			vs.overwrite(t, "obj.bin", second)
			_, err = vs.store.ReadVersionAt(ctx, "obj.bin", info.ETag, buf[:100], 0)
			g.Expect(err).To(MatchError(ErrChanged))
			g.Expect(err.Error()).To(ContainSubstring("obj.bin"))
			_, err = ParallelReadAt(ctx, vs.store, "obj.bin", info.ETag, buf, 0, ParallelOptions{ChunkSize: 64 << 10, Concurrency: 3})
			g.Expect(err).To(MatchError(ErrChanged))

			now, err := vs.store.Stat(ctx, "obj.bin")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(now.ETag).NotTo(Equal(info.ETag))
			n, err = vs.store.ReadVersionAt(ctx, "obj.bin", now.ETag, buf[:6], 0)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(buf[:n]).To(Equal([]byte("SECOND")))
		})
	}
}
