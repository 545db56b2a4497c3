package understore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/internal/miniotest"
)

// TestS3AgainstMinIO runs the S3 store against a real MinIO server, one server for all cases.
func TestS3AgainstMinIO(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket(t, "data")
	big := make([]byte, 3<<20+123)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	srv.Put(t, "data", "sets/big.bin", big)
	srv.Put(t, "data", "sets/b/c.txt", []byte("sea"))
	srv.Put(t, "data", "other/x.txt", []byte("not in the prefix"))

	open := func(t *testing.T, change func(c *S3Config)) *S3 {
		t.Helper()
		cfg := S3Config{Endpoint: srv.Endpoint, Bucket: "data", Prefix: "sets", AccessKey: miniotest.AccessKey, SecretKey: miniotest.SecretKey}
		if change != nil {
			change(&cfg)
		}
		s, err := NewS3(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ctx := context.Background()

	t.Run("Stat describes an object", func(t *testing.T) {
		g := NewWithT(t)
		info, err := open(t, nil).Stat(ctx, "big.bin")
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(info.Size).To(BeEquivalentTo(len(big)))
		g.Expect(info.ETag).NotTo(BeEmpty())
		g.Expect(info.ModTime).To(BeTemporally("~", time.Now(), time.Hour))
	})

	t.Run("List yields the objects under the store's prefix, relative to it", func(t *testing.T) {
		g := NewWithT(t)
		s := open(t, nil)
		var all, under []string
		for info, err := range s.List(ctx, "") {
			g.Expect(err).NotTo(HaveOccurred())
			all = append(all, info.Path)
		}
		for info, err := range s.List(ctx, "b/") {
			g.Expect(err).NotTo(HaveOccurred())
			under = append(under, info.Path)
		}
		g.Expect(all).To(Equal([]string{"b/c.txt", "big.bin"}))
		g.Expect(under).To(Equal([]string{"b/c.txt"}))
	})

	t.Run("List stops when the caller stops", func(t *testing.T) {
		g := NewWithT(t)
		n := 0
		for _, err := range open(t, nil).List(ctx, "") {
			g.Expect(err).NotTo(HaveOccurred())
			n++
			break
		}
		g.Expect(n).To(Equal(1))
	})

	t.Run("ranged reads return exactly the bytes asked for", func(t *testing.T) {
		cases := map[string]struct {
			off     int64
			size    int
			wantN   int
			wantEOF bool
		}{
			"a range inside the object":              {off: 1000, size: 5000, wantN: 5000},
			"a range running past the end is short":  {off: int64(len(big)) - 10, size: 100, wantN: 10, wantEOF: true},
			"a range starting at the end is empty":   {off: int64(len(big)), size: 100, wantN: 0, wantEOF: true},
			"a range starting past the end is empty": {off: int64(len(big)) + 5000, size: 100, wantN: 0, wantEOF: true},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				g := NewWithT(t)
				buf := make([]byte, tc.size)
				n, err := open(t, nil).ReadAt(ctx, "big.bin", buf, tc.off)
				if tc.wantEOF {
					g.Expect(err).To(MatchError(io.EOF))
				} else {
					g.Expect(err).NotTo(HaveOccurred())
				}
				g.Expect(n).To(Equal(tc.wantN))
				g.Expect(buf[:n]).To(Equal(big[min(tc.off, int64(len(big))):min(tc.off+int64(n), int64(len(big)))]))
			})
		}
	})

	t.Run("parallel ranged reads put the object back together", func(t *testing.T) {
		g := NewWithT(t)
		buf := make([]byte, 4<<20)
		n, err := ParallelReadAt(ctx, open(t, nil), "big.bin", "", buf, 0, ParallelOptions{ChunkSize: 256 << 10, Concurrency: 4})
		g.Expect(err).To(MatchError(io.EOF))
		g.Expect(n).To(Equal(len(big)))
		g.Expect(bytes.Equal(buf[:n], big)).To(BeTrue())
	})

	t.Run("Write stores a checkpoint that reads back", func(t *testing.T) {
		g := NewWithT(t)
		s := open(t, func(c *S3Config) { c.Prefix = "checkpoints/" })
		g.Expect(s.Write(ctx, "run-1/part-0", bytes.NewReader([]byte("output")), 6, Precondition{})).Error().NotTo(HaveOccurred())
		g.Expect(s.Write(ctx, "run-1/part-1", bytes.NewReader([]byte("unknown size")), -1, Precondition{})).Error().NotTo(HaveOccurred())
		for p, want := range map[string]string{"run-1/part-0": "output", "run-1/part-1": "unknown size"} {
			rc, err := s.Open(ctx, p)
			g.Expect(err).NotTo(HaveOccurred())
			b, err := io.ReadAll(rc)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(rc.Close()).To(Succeed())
			g.Expect(string(b)).To(Equal(want))
		}
	})

	t.Run("a conditional Write lands only on the version it expects", func(t *testing.T) {
		s := open(t, func(c *S3Config) { c.Prefix = "conditional/" })
		testConditionalWrites(t, s, "one-part", 1<<10, 1<<10)
		// Unknown and above minio-go's part size: a multipart upload, whose condition the server
		// checks at its completion.
		testConditionalWrites(t, s, "multipart", 17<<20, -1)
	})

	t.Run("a source without credentials reads a public bucket anonymously", func(t *testing.T) {
		g := NewWithT(t)
		srv.MakeBucket(t, "public")
		srv.Put(t, "public", "open/data.txt", []byte("anyone may read this"))
		srv.MakePublic(t, "public")
		public, err := Open(ctx, Source{URI: "s3://public/open/", Endpoint: "http://" + srv.Endpoint})
		g.Expect(err).NotTo(HaveOccurred())
		got, err := collect(public.List(ctx, ""))
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got).To(Equal([]string{"data.txt"}))
		info, err := public.Stat(ctx, "data.txt")
		g.Expect(err).NotTo(HaveOccurred())
		buf := make([]byte, 6)
		n, err := public.ReadVersionAt(ctx, "data.txt", info.ETag, buf, 0)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(buf[:n])).To(Equal("anyone"))

		private, err := Open(ctx, Source{URI: "s3://data/sets/", Endpoint: "http://" + srv.Endpoint})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = collect(private.List(ctx, ""))
		g.Expect(err).To(MatchError(ErrAccessDenied), "a private bucket refuses anonymous access")
	})

	failures := map[string]struct {
		change func(c *S3Config)
		path   string
		kind   error
	}{
		"a missing object is not found": {
			path: "nothing-here.bin", kind: ErrNotFound,
		},
		"a missing bucket is not found": {
			change: func(c *S3Config) { c.Bucket = "no-such-bucket" }, path: "big.bin", kind: ErrNotFound,
		},
		"a wrong secret key is denied": {
			change: func(c *S3Config) { c.SecretKey = "not-the-secret" }, path: "big.bin", kind: ErrAccessDenied,
		},
		"an unknown access key is denied": {
			change: func(c *S3Config) { c.AccessKey = "nobody" }, path: "big.bin", kind: ErrAccessDenied,
		},
		"anonymous access to a private bucket is denied": {
			change: func(c *S3Config) { c.AccessKey, c.SecretKey, c.Anonymous = "", "", true }, path: "big.bin", kind: ErrAccessDenied,
		},
	}
	for name, tc := range failures {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			s := open(t, tc.change)
			_, statErr := s.Stat(ctx, tc.path)
			_, readErr := s.ReadAt(ctx, tc.path, make([]byte, 10), 0)
			_, openErr := s.Open(ctx, tc.path)
			for _, err := range []error{statErr, readErr, openErr} {
				g.Expect(err).To(MatchError(tc.kind))
				var e *Error
				g.Expect(errors.As(err, &e)).To(BeTrue())
				g.Expect(e.Path).To(Equal(tc.path))
				g.Expect(err.Error()).To(ContainSubstring(tc.path), "the message names the object")
			}
			if tc.path != "nothing-here.bin" {
				for _, err := range s.List(ctx, "") {
					g.Expect(err).To(MatchError(tc.kind))
				}
			}
		})
	}
}

func TestS3WithoutAServer(t *testing.T) {
	t.Run("an endpoint on a closed port is unreachable", func(t *testing.T) {
		g := NewWithT(t)
		s, err := NewS3(S3Config{Endpoint: miniotest.ClosedAddr(t), Bucket: "data", AccessKey: "a", SecretKey: "b", MaxRetries: 1})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = s.Stat(context.Background(), "big.bin")
		g.Expect(err).To(MatchError(ErrUnreachable))
		g.Expect(err.Error()).To(ContainSubstring("big.bin"))
		_, err = s.ReadAt(context.Background(), "big.bin", make([]byte, 4), 0)
		g.Expect(err).To(MatchError(ErrUnreachable))
	})

	cases := map[string]struct {
		cfg     S3Config
		kind    error
		message string
	}{
		"missing keys are refused before any request": {
			cfg: S3Config{Endpoint: "127.0.0.1:9", Bucket: "data"}, kind: ErrMissingCredentials, message: "accessKey and secretKey empty",
		},
		"a missing secret key is refused before any request": {
			cfg: S3Config{Endpoint: "127.0.0.1:9", Bucket: "data", AccessKey: "a"}, kind: ErrMissingCredentials, message: "secretKey empty",
		},
		"an endpoint with a scheme is refused": {
			cfg: S3Config{Endpoint: "http://127.0.0.1:9", Bucket: "data", Anonymous: true}, kind: ErrInvalidPath, message: "without a scheme",
		},
		"a store without bucket is refused": {
			cfg: S3Config{Endpoint: "127.0.0.1:9", Anonymous: true}, kind: ErrInvalidPath, message: "no bucket",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			_, err := NewS3(tc.cfg)
			g.Expect(err).To(MatchError(tc.kind))
			g.Expect(err.Error()).To(ContainSubstring(tc.message))
		})
	}
}
