// Package miniotest runs a real MinIO server for the tests and benchmarks of the worker's
// S3 code: on 127.0.0.1, on free ports, with its data in a test's temporary directory, killed
// when the test ends. It finds the binary through $STRATA_MINIO or bin/minio-* (built by
// `make minio`) and skips the test, saying so, when there is none.
package miniotest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/strata-cache/strata/internal/testenv"
)

// TB is what the helpers need of a test: testing.TB and Ginkgo's GinkgoT() both have it.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Skip(args ...any)
	Cleanup(func())
	TempDir() string
}

// Credentials of the root user of every test server.
const (
	AccessKey = "strata-test"
	SecretKey = "strata-test-secret-key"
)

// readyTimeout bounds the wait for a server to answer /minio/health/ready; on two busy cores
// MinIO takes a few seconds to start.
const readyTimeout = 60 * time.Second

// Server is a running MinIO.
type Server struct {
	// Endpoint is host:port of the S3 API.
	Endpoint string
	// Client is a minio-go client signed as the root user.
	Client *minio.Client
}

// Binary returns the MinIO binary to run, or "" if there is none.
func Binary() string {
	if p := os.Getenv("STRATA_MINIO"); p != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
		return ""
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return ""
	}
	// This file is internal/miniotest/miniotest.go; bin/ is at the repository root.
	matches, _ := filepath.Glob(filepath.Join(filepath.Dir(file), "..", "..", "bin", "minio-*"))
	for i := len(matches) - 1; i >= 0; i-- {
		if st, err := os.Stat(matches[i]); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return matches[i]
		}
	}
	return ""
}

// Start runs a MinIO server for tb, or skips tb if no binary is found. env is added to its
// environment (such as OpenIDProvider.Env).
func Start(tb TB, env ...string) *Server {
	tb.Helper()
	bin := Binary()
	if bin == "" {
		testenv.Lacking(tb, "no MinIO binary: run `make minio` (the rule that builds bin/minio-$(MINIO_VERSION)) or set STRATA_MINIO to a MinIO binary")
	}
	addr, console := freeAddr(tb), freeAddr(tb)
	out := &syncBuffer{}
	cmd := exec.Command(bin, "server", tb.TempDir(), "--address", addr, "--console-address", console, "--quiet")
	cmd.Env = append(os.Environ(),
		"MINIO_ROOT_USER="+AccessKey,
		"MINIO_ROOT_PASSWORD="+SecretKey,
		"MINIO_BROWSER=off",
		"MINIO_UPDATE=off",
	)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting MinIO %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited //nolint:errcheck // killed on purpose: the exit status says nothing
	})

	if err := waitReady(addr, exited); err != nil {
		tb.Fatalf("MinIO on %s: %v\n%s", addr, err, out.String())
	}
	client, err := minio.New(addr, &minio.Options{Creds: credentials.NewStaticV4(AccessKey, SecretKey, ""), Region: "us-east-1"})
	if err != nil {
		tb.Fatal(err)
	}
	return &Server{Endpoint: addr, Client: client}
}

// waitReady polls the readiness endpoint until it answers 200, the process exits, or
// readyTimeout passes.
func waitReady(addr string, exited <-chan error) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	url := "http://" + addr + "/minio/health/ready"
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-exited:
			return fmt.Errorf("exited before it was ready: %w", err)
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s", readyTimeout)
		case <-tick.C:
		}
	}
}

// MakeBucket creates a bucket.
func (s *Server) MakeBucket(tb TB, name string) {
	tb.Helper()
	if err := s.Client.MakeBucket(context.Background(), name, minio.MakeBucketOptions{}); err != nil {
		tb.Fatalf("creating bucket %s: %v", name, err)
	}
}

// MakePublic lets anyone list bucket and read its objects without credentials, as a public
// bucket does.
func (s *Server) MakePublic(tb TB, bucket string) {
	tb.Helper()
	if err := s.Client.SetBucketPolicy(context.Background(), bucket, PublicPolicy(bucket)); err != nil {
		tb.Fatalf("making bucket %s public: %v", bucket, err)
	}
}

// PublicPolicy is the bucket policy that lets anyone list bucket and read its objects.
func PublicPolicy(bucket string) string {
	return fmt.Sprintf(`{"Version":"2012-10-17","Statement":[
		{"Effect":"Allow","Principal":{"AWS":["*"]},"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::%[1]s/*"]},
		{"Effect":"Allow","Principal":{"AWS":["*"]},"Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::%[1]s"]}]}`, bucket)
}

// Put stores an object.
func (s *Server) Put(tb TB, bucket, key string, data []byte) {
	tb.Helper()
	if _, err := s.Client.PutObject(context.Background(), bucket, key, bytes.NewReader(data), int64(len(data)), minio.PutObjectOptions{}); err != nil {
		tb.Fatalf("putting %s/%s: %v", bucket, key, err)
	}
}

// PutMany puts n objects of size bytes, named key(0) to key(n-1), 64 at a time: a bucket of the
// size of a real Dataset, for benchmarks.
func (s *Server) PutMany(tb TB, bucket string, n int, key func(i int) string, size int) {
	tb.Helper()
	var wg sync.WaitGroup
	keys := make(chan int)
	errs := make(chan error, 64)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range keys {
				if _, err := s.Client.PutObject(context.Background(), bucket, key(i), bytes.NewReader(make([]byte, size)), int64(size), minio.PutObjectOptions{}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var failed error
	for i := 0; i < n && failed == nil; i++ {
		select {
		case keys <- i:
		case failed = <-errs:
		}
	}
	close(keys)
	wg.Wait()
	if failed == nil {
		select {
		case failed = <-errs:
		default:
		}
	}
	if failed != nil {
		tb.Fatalf("putting %d objects into %s: %v", n, bucket, failed)
	}
}

// TrainingKey names object i as a training set's shards do: train/shard-0042/sample-0042137.jpg.
func TrainingKey(i int) string { return fmt.Sprintf("train/shard-%04d/sample-%07d.jpg", i/1000, i) }

// freeAddr returns 127.0.0.1:port for a port that was free a moment ago.
func freeAddr(tb TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// ClosedAddr returns 127.0.0.1:port for a port nothing listens on, for unreachable-endpoint tests.
func ClosedAddr(tb TB) string { return freeAddr(tb) }

// syncBuffer collects the server's output for the failure message.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len() > 1<<20 {
		return len(p), nil // enough to diagnose; do not grow without bound
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
