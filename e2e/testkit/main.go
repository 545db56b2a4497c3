// Command testkit is the client that end-to-end tests run inside the cluster, from a FROM scratch
// image, to put known data into the under-store and to read it back with a checksum:
//
//	testkit s3 put --endpoint http://minio.minio.svc:9000 --bucket b --key k1,k2 --size 1048576 --seed 7 [--public]
//	testkit s3 get --endpoint http://minio.minio.svc:9000 --bucket b --key k1,k2
//	testkit s3 rm --endpoint http://minio.minio.svc:9000 --bucket b --key k1,k2
//	testkit s3 get --endpoint http://minio.minio.svc:9000 --bucket b --prefix ns/out-c/
//	testkit sum [--rate BYTES_PER_SECOND] [--summary] [--uncached] [--wait 5m --expect-files 3] /data/imagenet
//	testkit copy /data/imagenet /scratch/imagenet
//	testkit hold --wait-for /data/new.txt /data/train.bin
//	testkit master soak --addrs m-0:7001,m-1:7001,m-2:7001 --dataset soak --duration 30s
//	testkit worker put --master m-0:7001 --worker default/node-a --block b1 --size 8388608 --seed 7 --dataset e2e
//	testkit worker get --master m-0:7001 --worker default/node-a --block b1
//	testkit attack --master m-0:7001 --worker default/node-a --worker-addr 10.0.1.5:7100 --block b1 --dataset ns/d
//
// The master and worker commands take --ca-file, --cert-file and --key-file to speak mutual TLS
// with a certificate the test issued, or --forge URI for one from a CA of testkit's own.
//
// Credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY. Each command prints one JSON
// line per object or file, {"bucket":…,"key":…,"bytes":…,"sha256":…}, that the test compares;
// sum names files by their path relative to the folder, so its keys match the object keys below
// a Dataset's prefix.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/internal/miniotest"
)

// result is what every command prints.
type result struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
	// ETag is the version `s3 put` wrote, as Strata names the blocks of it.
	ETag string `json:"etag,omitempty"`
	// Seconds is how long reading (or writing) took.
	Seconds float64 `json:"seconds"`
	// FirstRead, in `sum --summary`, is when the first file had been read whole.
	FirstRead *time.Time `json:"firstRead,omitempty"`
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "testkit:", err)
		os.Exit(1)
	}
}

const usage = "usage: testkit s3 put|get|rm --endpoint URL --bucket NAME --key KEY[,KEY...] [--size BYTES --seed N]" +
	" | testkit sum [--rate N] [--summary] DIR | testkit copy [--rate N] SRC DST | testkit hold --wait-for PATH FILE | testkit master soak --addrs ADDRS --dataset NAME [--duration D]" +
	" | testkit worker put|get --master ADDRS --worker ID --block ID [--size BYTES --seed N --dataset NAME]" +
	" | testkit attack --master ADDRS --worker ID --worker-addr ADDR --block ID --dataset NAME"

func run(args []string) error {
	if len(args) >= 2 && args[0] == "sum" {
		return sumCommand(args[1:], json.NewEncoder(os.Stdout))
	}
	if len(args) >= 3 && args[0] == "copy" {
		return copyCommand(args[1:])
	}
	if len(args) >= 2 && args[0] == "hold" {
		return holdCommand(args[1:], json.NewEncoder(os.Stdout))
	}
	if len(args) >= 2 && args[0] == "master" && args[1] == "soak" {
		return masterSoak(args[2:], json.NewEncoder(os.Stdout))
	}
	if len(args) >= 1 && args[0] == "attack" {
		return attack(args[1:], json.NewEncoder(os.Stdout))
	}
	if len(args) >= 2 && args[0] == "worker" && (args[1] == "put" || args[1] == "get") {
		return workerBlock(args[1], args[2:], json.NewEncoder(os.Stdout))
	}
	if len(args) < 2 || args[0] != "s3" || (args[1] != "put" && args[1] != "get" && args[1] != "rm") {
		return errors.New(usage)
	}
	flags := flag.NewFlagSet("s3 "+args[1], flag.ContinueOnError)
	endpoint := flags.String("endpoint", "", "S3 endpoint URL, such as http://minio.minio.svc:9000")
	bucket := flags.String("bucket", "", "bucket name")
	keys := flags.String("key", "", "object keys, comma-separated")
	prefix := flags.String("prefix", "", "get: every object below this prefix, named by its key without the prefix (none: an empty listing)")
	size := flags.Int64("size", 1<<20, "bytes to put")
	seed := flags.Uint64("seed", 1, "seed of the pseudo-random content to put")
	timeout := flags.Duration("timeout", 5*time.Minute, "give up after this long")
	summary := flags.Bool("summary", false, "print one line with the total bytes and seconds instead of a line per object")
	public := flags.Bool("public", false, "put: let anyone list the bucket and read its objects without credentials, as a public bucket does")
	if err := flags.Parse(args[2:]); err != nil {
		return err
	}
	if *endpoint == "" || *bucket == "" || (*keys == "") == (*prefix == "" || args[1] != "get") {
		return errors.New("--endpoint, --bucket and --key (or, to get, --prefix) are required")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	client, err := newClient(*endpoint)
	if err != nil {
		return err
	}
	if args[1] == "put" {
		// A store a spec has just started is put into before anything else: its Service may
		// be ready at the API server before this node's proxy routes it (connection refused).
		if err := waitReachable(ctx, client.EndpointURL().Host); err != nil {
			return err
		}
	}
	out := json.NewEncoder(os.Stdout)
	if *prefix != "" {
		return getPrefix(ctx, client, *bucket, *prefix, out)
	}
	if *public && args[1] == "put" {
		if err := makePublic(ctx, client, *bucket); err != nil {
			return err
		}
	}
	var total result
	for i, key := range strings.Split(*keys, ",") {
		var res result
		start := time.Now()
		switch args[1] {
		case "put":
			// Each object gets its own content, reproducible from the seed and its position.
			res, err = put(ctx, client, *bucket, key, *size, *seed+uint64(i))
		case "rm":
			res = result{Bucket: *bucket, Key: key}
			err = client.RemoveObject(ctx, *bucket, key, minio.RemoveObjectOptions{})
		default:
			res, err = get(ctx, client, *bucket, key)
		}
		if err != nil {
			return err
		}
		res.Seconds = time.Since(start).Seconds()
		total.Bytes += res.Bytes
		total.Seconds += res.Seconds
		if *summary {
			continue
		}
		if err := out.Encode(res); err != nil {
			return err
		}
	}
	if *summary {
		return out.Encode(total)
	}
	return nil
}

// sumCommand is `testkit sum [--rate BYTES_PER_SECOND] [--summary] DIR`.
func sumCommand(args []string, out *json.Encoder) error {
	flags := flag.NewFlagSet("sum", flag.ContinueOnError)
	rate := flags.Int64("rate", 0, "read at most this many bytes per second (0: as fast as possible), to keep a read going for a while")
	summary := flags.Bool("summary", false, "print one line with the total bytes and seconds instead of a line per file")
	uncached := flags.Bool("uncached", false, "drop each file's pages from the page cache before reading it, so that every byte comes through the file system")
	expect := flags.Int("expect-files", 0, "with --wait: read again until the folder holds at least this many files, all readable")
	wait := flags.Duration("wait", 0, "keep reading again, every two seconds, for this long while a read fails or fewer than --expect-files files are there")
	until := flags.String("until", "", "read the folder again and again, printing every file of every round and each failed read on standard error, until this path exists")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *until != "" && flags.NArg() == 1 {
		return sumUntil(flags.Arg(0), *until, *uncached, out)
	}
	if flags.NArg() != 1 {
		return errors.New("usage: testkit sum [--rate BYTES_PER_SECOND] [--summary] [--uncached] [--wait D --expect-files N] DIR")
	}
	deadline := time.Now().Add(*wait)
	for {
		var results []result
		var total result
		start := time.Now()
		err := sum(flags.Arg(0), *rate, *uncached, func(r result) error {
			if total.FirstRead == nil {
				now := time.Now()
				total.FirstRead = &now
			}
			total.Bytes += r.Bytes
			results = append(results, r)
			return nil
		})
		if err == nil && len(results) < *expect {
			err = fmt.Errorf("%d files, expecting %d", len(results), *expect)
		}
		if err != nil && time.Now().Before(deadline) {
			// Lost data is being recomputed: a reader that waits for it tries again.
			fmt.Fprintln(os.Stderr, "testkit: not there yet:", err)
			time.Sleep(2 * time.Second)
			continue
		}
		if err != nil {
			return err
		}
		if *summary {
			total.Seconds = time.Since(start).Seconds()
			return out.Encode(total)
		}
		for _, r := range results {
			if err := out.Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
}

// sum reports the size, SHA-256 and read time of every regular file below dir, in walk order.
// sumUntil reads dir round after round until the path until exists, printing what each round
// read; a failed read (EIO for a file replaced in the under-store) is said on standard error
// and ends only that round.
func sumUntil(dir, until string, uncached bool, out *json.Encoder) error {
	// A round at most every half second: enough reads to meet every version, few enough lines
	// for the kubelet's log of the pod.
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for round := 1; ; round++ {
		if err := sum(dir, 0, uncached, func(r result) error { return out.Encode(r) }); err != nil {
			fmt.Fprintf(os.Stderr, "testkit: round %d: %v\n", round, err)
		}
		if _, err := os.Stat(until); err == nil {
			return nil
		}
		<-tick.C
	}
}

func sum(dir string, rate int64, uncached bool, report func(result) error) error {
	return filepath.WalkDir(dir, func(path string, entry fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("walking %s: %w", path, err)
		}
		if !entry.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("opening %s: %w", path, err)
		}
		defer func() { _ = f.Close() }()
		if uncached {
			if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
				return fmt.Errorf("dropping the cached pages of %s: %w", path, err)
			}
		}
		start := time.Now()
		hash := sha256.New()
		var r io.Reader = f
		if rate > 0 {
			r = &throttled{r: f, rate: rate, start: start}
		}
		n, err := io.Copy(hash, r)
		if err != nil {
			return fmt.Errorf("reading %s: %w", path, err)
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		return report(result{Key: filepath.ToSlash(rel), Bytes: n, SHA256: hex.EncodeToString(hash.Sum(nil)),
			Seconds: time.Since(start).Seconds()})
	})
}

// throttled reads at most rate bytes per second on average. Each time another progress bytes
// have been read (0: never) it says so on stderr, which a test watching the pod's log takes as
// the sign that a file is part written.
type throttled struct {
	r        io.Reader
	rate     int64
	progress int64
	start    time.Time
	read     int64
}

func (t *throttled) Read(p []byte) (int, error) {
	if max := t.rate / 10; int64(len(p)) > max && max > 0 {
		p = p[:max] // small reads, so the pace is even
	}
	if due := t.start.Add(time.Duration(float64(t.read) / float64(t.rate) * float64(time.Second))); time.Until(due) > 0 {
		time.Sleep(time.Until(due))
	}
	n, err := t.r.Read(p)
	before := t.read
	t.read += int64(n)
	if t.progress > 0 && t.read/t.progress > before/t.progress {
		fmt.Fprintf(os.Stderr, "copied %d bytes\n", t.read/t.progress*t.progress)
	}
	return n, err
}

// copyTree copies every regular file below src to the same relative path below dst.
// copyCommand is `testkit copy [--rate BYTES_PER_SECOND] SRC DST`.
func copyCommand(args []string) error {
	flags := flag.NewFlagSet("copy", flag.ContinueOnError)
	rate := flags.Int64("rate", 0, "read at most this many bytes per second (0: as fast as possible), to keep a write going for a while")
	progress := flags.Int64("progress", 0, "with --rate, print \"copied N bytes\" on stderr each time another this many bytes are copied")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if flags.NArg() != 2 {
		return errors.New("usage: testkit copy [--rate BYTES_PER_SECOND [--progress BYTES]] SRC DST")
	}
	return copyTree(flags.Arg(0), flags.Arg(1), *rate, *progress)
}

// copyTree copies the files and folders under src to dst, each file at most rate bytes per
// second (0: no limit), saying each time another progress bytes of a file are copied.
func copyTree(src, dst string, rate, progress int64) error {
	return filepath.WalkDir(src, func(path string, entry fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("walking %s: %w", path, err)
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if entry.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		if !entry.Type().IsRegular() {
			return nil
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer func() { _ = in.Close() }()
		var r io.Reader = in
		if rate > 0 {
			r = &throttled{r: in, rate: rate, progress: progress, start: time.Now()}
		}
		out, err := os.Create(target)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, r); err != nil {
			_ = out.Close()
			return fmt.Errorf("copying %s: %w", path, err)
		}
		return out.Close()
	})
}

// waitReachable returns once host:port accepts a TCP connection, or ctx ends.
func waitReachable(ctx context.Context, hostPort string) error {
	var dialer net.Dialer
	retry := time.NewTicker(200 * time.Millisecond)
	defer retry.Stop()
	for {
		conn, err := dialer.DialContext(ctx, "tcp", hostPort)
		if err == nil {
			return conn.Close()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never accepted a connection: %w", hostPort, err)
		case <-retry.C:
		}
	}
}

func newClient(endpoint string) (*minio.Client, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("--endpoint %q is not a URL such as http://minio.minio.svc:9000", endpoint)
	}
	access, secret := os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY")
	if access == "" || secret == "" {
		return nil, errors.New("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
	}
	client, err := minio.New(u.Host, &minio.Options{
		Creds:  credentials.NewStaticV4(access, secret, ""),
		Secure: u.Scheme == "https",
	})
	if err != nil {
		return nil, fmt.Errorf("creating S3 client for %s: %w", endpoint, err)
	}
	return client, nil
}

// ensureBucket creates bucket unless it exists.
func ensureBucket(ctx context.Context, client *minio.Client, bucket string) error {
	exists, err := client.BucketExists(ctx, bucket)
	if err != nil {
		return fmt.Errorf("checking bucket %s: %w", bucket, err)
	}
	if !exists {
		if err := client.MakeBucket(ctx, bucket, minio.MakeBucketOptions{}); err != nil {
			return fmt.Errorf("creating bucket %s: %w", bucket, err)
		}
	}
	return nil
}

// makePublic creates bucket if need be and lets anyone list it and read its objects.
func makePublic(ctx context.Context, client *minio.Client, bucket string) error {
	if err := ensureBucket(ctx, client, bucket); err != nil {
		return err
	}
	if err := client.SetBucketPolicy(ctx, bucket, miniotest.PublicPolicy(bucket)); err != nil {
		return fmt.Errorf("making bucket %s public: %w", bucket, err)
	}
	return nil
}

func put(ctx context.Context, client *minio.Client, bucket, key string, size int64, seed uint64) (result, error) {
	if err := ensureBucket(ctx, client, bucket); err != nil {
		return result{}, err
	}
	hash := sha256.New()
	content := io.TeeReader(io.LimitReader(rand.NewChaCha8(seedBytes(seed)), size), hash)
	info, err := client.PutObject(ctx, bucket, key, content, size, minio.PutObjectOptions{})
	if err != nil {
		return result{}, fmt.Errorf("putting s3://%s/%s: %w", bucket, key, err)
	}
	return result{Bucket: bucket, Key: key, Bytes: info.Size, SHA256: hex.EncodeToString(hash.Sum(nil)), ETag: info.ETag}, nil
}

func get(ctx context.Context, client *minio.Client, bucket, key string) (result, error) {
	object, err := client.GetObject(ctx, bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return result{}, fmt.Errorf("getting s3://%s/%s: %w", bucket, key, err)
	}
	defer func() { _ = object.Close() }()
	hash := sha256.New()
	n, err := io.Copy(hash, object)
	if err != nil {
		return result{}, fmt.Errorf("reading s3://%s/%s: %w", bucket, key, err)
	}
	return result{Bucket: bucket, Key: key, Bytes: n, SHA256: hex.EncodeToString(hash.Sum(nil))}, nil
}

// getPrefix prints the sum of every object below prefix, its key without the prefix.
func getPrefix(ctx context.Context, client *minio.Client, bucket, prefix string, out *json.Encoder) error {
	for obj := range client.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return fmt.Errorf("listing s3://%s/%s: %w", bucket, prefix, obj.Err)
		}
		res, err := get(ctx, client, bucket, obj.Key)
		if err != nil {
			return err
		}
		res.Key = strings.TrimPrefix(obj.Key, prefix)
		if err := out.Encode(res); err != nil {
			return err
		}
	}
	return nil
}

// seedBytes spreads a small seed over the 32 bytes ChaCha8 wants.
func seedBytes(seed uint64) [32]byte {
	var b [32]byte
	for i := range 4 {
		v := seed + uint64(i)*0x9e3779b97f4a7c15
		for j := range 8 {
			b[i*8+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// holdCommand opens a file, reads its first bytes, and keeps it open until another path
// appears (a sync of the Dataset adds it to the mount, live), then reads the rest of the file
// through the same descriptor and prints what it read in all: a file replaced meanwhile must
// read as the version opened, whole, never as a mix. It says on standard error when it holds
// the file, for the test to go on.
func holdCommand(args []string, out *json.Encoder) error {
	flags := flag.NewFlagSet("hold", flag.ContinueOnError)
	waitFor := flags.String("wait-for", "", "the path whose appearance ends the hold")
	first := flags.Int64("first", 1<<20, "bytes read before holding")
	timeout := flags.Duration("timeout", 5*time.Minute, "how long to wait for --wait-for")
	if err := flags.Parse(args); err != nil {
		return err
	}
	if flags.NArg() != 1 || *waitFor == "" {
		return errors.New("usage: testkit hold --wait-for PATH [--first BYTES] [--timeout D] FILE")
	}
	name := flags.Arg(0)
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	h := sha256.New()
	start := time.Now()
	n, err := io.CopyN(h, f, *first)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("reading the first bytes of %s: %w", name, err)
	}
	fmt.Fprintf(os.Stderr, "testkit: holding %s open after %d bytes\n", name, n)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(*timeout)
	for {
		if _, err := os.Stat(*waitFor); err == nil {
			break
		}
		select {
		case <-tick.C:
		case <-deadline:
			return fmt.Errorf("%s did not appear within %s", *waitFor, *timeout)
		}
	}
	rest, err := io.Copy(h, f)
	if err != nil {
		return fmt.Errorf("reading %s on after %s appeared: %w", name, *waitFor, err)
	}
	return out.Encode(result{Key: filepath.Base(name), Bytes: n + rest, SHA256: hex.EncodeToString(h.Sum(nil)), Seconds: time.Since(start).Seconds()})
}
