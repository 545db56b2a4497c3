package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/minio/minio-go/v7"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"

	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/pki"
)

// startTimeout bounds how long a process may take to serve or a mount to appear.
const startTimeout = 60 * time.Second

// proc is a child process the harness started, and stops.
type proc struct {
	name   string
	cmd    *exec.Cmd
	out    *lockedBuffer
	exited chan struct{}
	err    error // the exit status, once exited is closed
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// tail is the end of the output, for an error message.
func (b *lockedBuffer) tail() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.String()
	if len(s) > 4000 {
		s = "…" + s[len(s)-4000:]
	}
	return s
}

func startProc(name string, env []string, bin string, args ...string) (*proc, error) {
	p := &proc{name: name, cmd: exec.Command(bin, args...), out: &lockedBuffer{}, exited: make(chan struct{})}
	// Every system reaches MinIO over plain HTTP with the keys it is given: a CA bundle or
	// keys of the host's AWS settings (rclone fails on AWS_CA_BUNDLE) would only differ them.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	watch(name, p.cmd.Process.Pid)
	go func() {
		p.err = p.cmd.Wait()
		unwatch(name)
		close(p.exited)
	}()
	return p, nil
}

// stop asks the process to end (SIGTERM) and kills it if it has not within 15 s.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// waitFor polls ready until it holds, the process exits, or startTimeout passes.
func (p *proc) waitFor(what string, ready func() bool) error {
	deadline := time.Now().Add(startTimeout)
	for !ready() {
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited (%w) before %s:\n%s", p.name, p.err, what, p.out.tail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no %s after %s:\n%s", p.name, what, startTimeout, p.out.tail())
		}
	}
	return nil
}

func answers200(url string) func() bool {
	return func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
}

// isMountPoint says whether dir is a mount point of this mount namespace.
func isMountPoint(dir string) bool {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && fields[4] == dir {
			return true
		}
	}
	return false
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String(), nil
}

// mounted is what a reading system serves for one round: the large object and the folder of
// small ones, and how to let go of them.
type mounted struct {
	large, small string
	unmount      func() error
}

// fuseMount runs a FUSE program that mounts the bucket at dir, caching in cache, and unmounts
// it and empties the cache when done.
func fuseMount(name, dir, cache string, bin string, args ...string) (mounted, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return mounted{}, err
	}
	p, err := startProc(name, nil, bin, args...)
	if err != nil {
		return mounted{}, err
	}
	if err := p.waitFor("mount at "+dir, func() bool { return isMountPoint(dir) }); err != nil {
		p.stop()
		return mounted{}, err
	}
	return mounted{
		large: filepath.Join(dir, largeKey), small: filepath.Join(dir, smallPrefix),
		unmount: func() error {
			err := exec.Command("fusermount", "-u", dir).Run()
			p.stop()
			if err != nil {
				return fmt.Errorf("unmounting %s at %s: %w", name, dir, err)
			}
			return os.RemoveAll(cache)
		},
	}, nil
}

// rclone mounts the bucket with a full VFS cache on /dev/shm, empty each round.
func rclone(s *setup, round int) (mounted, error) {
	cache := filepath.Join(s.shm, fmt.Sprintf("rclone-cache-%d", round))
	return fuseMount("rclone", filepath.Join(s.work, fmt.Sprintf("rclone-%d", round)), cache, s.rclone,
		"mount", ":s3:"+bucket, filepath.Join(s.work, fmt.Sprintf("rclone-%d", round)),
		"--s3-provider", "Minio", "--s3-endpoint", "http://"+s.minio.Endpoint, "--s3-region", "us-east-1",
		"--s3-access-key-id", accessKey, "--s3-secret-access-key", secretKey,
		"--vfs-cache-mode", "full", "--cache-dir", cache, "--dir-cache-time", "1h", "--read-only")
}

// s3fs mounts the bucket with its disk cache on /dev/shm, empty each round.
func s3fs(s *setup, round int) (mounted, error) {
	cache := filepath.Join(s.shm, fmt.Sprintf("s3fs-cache-%d", round))
	if err := os.MkdirAll(cache, 0o700); err != nil {
		return mounted{}, err
	}
	dir := filepath.Join(s.work, fmt.Sprintf("s3fs-%d", round))
	return fuseMount("s3fs", dir, cache, s.s3fs, bucket, dir, "-f",
		"-o", "url=http://"+s.minio.Endpoint, "-o", "use_path_request_style", "-o", "endpoint=us-east-1",
		"-o", "passwd_file="+s.s3fsPasswords, "-o", "use_cache="+cache, "-o", "ro")
}

// tmpfsCopy is the objects copied into /dev/shm once: what a hot cache cannot beat.
func tmpfsCopy(s *setup, _ int) (mounted, error) {
	return mounted{large: filepath.Join(s.tmpfs, largeKey), small: filepath.Join(s.tmpfs, smallPrefix), unmount: func() error { return nil }}, nil
}

// strata is the real master and worker, run as in a cluster (mutual TLS, the worker's mounter
// asked over its socket with the CSI node plugin's identity), the worker's tiers on /dev/shm.
type strata struct {
	master, worker *proc
	mounter        workerpb.MounterClient
	conn           *grpc.ClientConn
	// tmpfs is the MEM tier's tmpfs the worker mounted (-worker-tmpfs), which outlives it, as
	// on a node, until unmounted here.
	tmpfs string
}

const (
	strataPool = "bench"
	strataNode = "bench-node"
)

func startStrata(s *setup) (*strata, error) {
	ca, err := pki.NewCA("bench-peers CA", time.Now())
	if err != nil {
		return nil, err
	}
	certs := func(name string, id pki.Identity) (pki.Flags, error) {
		dir := filepath.Join(s.work, "certs", name)
		cert, key, err := ca.IssueKeyPair(pki.Leaf{Identity: id, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}}, time.Now())
		if err != nil {
			return pki.Flags{}, err
		}
		f := pki.Flags{CAFile: filepath.Join(dir, "ca.crt"), CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return pki.Flags{}, err
		}
		for path, b := range map[string][]byte{f.CAFile: ca.CertPEM, f.CertFile: cert, f.KeyFile: key} {
			if err := os.WriteFile(path, b, 0o600); err != nil {
				return pki.Flags{}, err
			}
		}
		return f, nil
	}
	tlsArgs := func(f pki.Flags) []string {
		return []string{"--ca-file", f.CAFile, "--cert-file", f.CertFile, "--key-file", f.KeyFile}
	}
	addrs := make([]string, 5)
	for i := range addrs {
		if addrs[i], err = freeAddr(); err != nil {
			return nil, err
		}
	}
	raftAddr, apiAddr, masterMetrics, dataAddr, workerMetrics := addrs[0], addrs[1], addrs[2], addrs[3], addrs[4]

	masterTLS, err := certs("master", pki.Master("m-0"))
	if err != nil {
		return nil, err
	}
	st := &strata{}
	st.master, err = startProc("strata master", nil, s.masterBin, append([]string{
		"--id", "m-0", "--bootstrap", "--data-dir", filepath.Join(s.work, "master"),
		"--raft-addr", raftAddr, "--raft-advertise", raftAddr, "--grpc-addr", apiAddr, "--grpc-advertise", apiAddr,
		"--metrics-addr", masterMetrics,
	}, tlsArgs(masterTLS)...)...)
	if err != nil {
		return nil, err
	}
	if err := st.master.waitFor("readiness", answers200("http://"+masterMetrics+"/readyz")); err != nil {
		st.stop()
		return nil, err
	}

	workerTLS, err := certs("worker", pki.Worker(strataPool, strataNode))
	if err != nil {
		st.stop()
		return nil, err
	}
	tiers := filepath.Join(s.work, "tiers.yaml")
	tierDir, mountTiers := filepath.Join(s.shm, "strata-mem"), false
	if s.workerTmpfs {
		tierDir, mountTiers = filepath.Join(s.work, "strata-mem"), true
		st.tmpfs = filepath.Join(tierDir, strataPool) // a pool's blocks are in a folder of its name
	}
	if err := os.WriteFile(tiers, fmt.Appendf(nil, "- name: mem\n  medium: MEM\n  paths: [%s]\n  quota: %d\n", tierDir, s.tierQuota), 0o600); err != nil {
		st.stop()
		return nil, err
	}
	socket := filepath.Join(s.work, "run", "mount.sock")
	st.worker, err = startProc("strata worker", nil, s.workerBin, append([]string{
		"--pool", strataPool, "--node-name", strataNode, "--master", apiAddr,
		"--data-addr", dataAddr, "--advertise-addr", dataAddr, "--metrics-addr", workerMetrics,
		"--mount-socket", socket, "--mounts-dir", filepath.Join(s.work, "strata-mounts"),
		"--tiers", tiers, fmt.Sprintf("--mount-memory-tiers=%t", mountTiers), "--index-dir", filepath.Join(s.work, "index"),
		"--listings-dir", filepath.Join(s.work, "listings"), "--block-size", fmt.Sprint(s.blockSize),
	}, tlsArgs(workerTLS)...)...)
	if err != nil {
		st.stop()
		return nil, err
	}
	if err := st.worker.waitFor("readiness", answers200("http://"+workerMetrics+"/readyz")); err != nil {
		st.stop()
		return nil, err
	}

	// The worker's mounter answers the CSI node plugin of its node only.
	trust := x509.NewCertPool()
	trust.AddCert(ca.Cert)
	creds := pki.NewCredentials(trust)
	cert, key, err := ca.IssueKeyPair(pki.Leaf{Identity: pki.CSINode(strataNode)}, time.Now())
	if err == nil {
		err = creds.Set(cert, key)
	}
	if err != nil {
		st.stop()
		return nil, fmt.Errorf("certifying the CSI node plugin's identity: %w", err)
	}
	st.conn, err = grpc.NewClient("unix://"+socket, creds.DialOptionLocal(pki.Worker(strataPool, strataNode)))
	if err != nil {
		st.stop()
		return nil, err
	}
	st.mounter = workerpb.NewMounterClient(st.conn)
	return st, nil
}

func (st *strata) stop() {
	if st.conn != nil {
		_ = st.conn.Close()
	}
	// The worker first: it unmounts its Datasets as it stops.
	for _, p := range []*proc{st.worker, st.master} {
		if p != nil {
			p.stop()
		}
	}
	if st.tmpfs != "" {
		_ = unix.Unmount(st.tmpfs, unix.MNT_DETACH)
	}
}

// mountDataset asks the worker to serve a Dataset whose uid is new each round, so that its
// blocks are cached afresh.
func (st *strata) mountDataset(ctx context.Context, req *workerpb.MountDatasetRequest) (string, func() error, error) {
	resp, err := st.mounter.MountDataset(ctx, req)
	if err != nil {
		return "", nil, fmt.Errorf("mounting Dataset %s: %w", req.GetName(), err)
	}
	return resp.GetPath(), func() error {
		if _, err := st.mounter.UnmountDataset(ctx, &workerpb.UnmountDatasetRequest{Uid: req.GetUid()}); err != nil {
			return fmt.Errorf("unmounting Dataset %s: %w", req.GetName(), err)
		}
		return nil
	}, nil
}

func datasetUID(round int, what string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(what))
	return fmt.Sprintf("00000000-0000-4000-8000-%04d%08x", round, h.Sum32())
}

// reads serves the large object and the small ones as two Datasets of the bucket.
func (st *strata) reads(s *setup, round int) (mounted, error) {
	ctx := context.Background()
	source := func(prefix string) *workerpb.DatasetSource {
		return &workerpb.DatasetSource{Uri: "s3://" + bucket + "/" + prefix, Endpoint: "http://" + s.minio.Endpoint, Region: "us-east-1",
			Credentials: map[string]string{"accessKeyID": accessKey, "secretAccessKey": secretKey}}
	}
	seqPath, unmountSeq, err := st.mountDataset(ctx, &workerpb.MountDatasetRequest{Namespace: "bench", Name: "seq",
		Uid: datasetUID(round, "seq"), Source: source(seqPrefix), ReadOnly: true})
	if err != nil {
		return mounted{}, err
	}
	smallPath, unmountSmall, err := st.mountDataset(ctx, &workerpb.MountDatasetRequest{Namespace: "bench", Name: "small",
		Uid: datasetUID(round, "small"), Source: source(smallPrefix), ReadOnly: true})
	if err != nil {
		return mounted{}, errors.Join(err, unmountSeq())
	}
	return mounted{
		large: filepath.Join(seqPath, strings.TrimPrefix(largeKey, seqPrefix+"/")), small: smallPath,
		unmount: func() error { return errors.Join(unmountSmall(), unmountSeq()) },
	}, nil
}

// output serves a new, empty output Dataset to write into.
func (st *strata) output(round int, what string) (string, func() error, error) {
	return st.mountDataset(context.Background(), &workerpb.MountDatasetRequest{Namespace: "bench", Name: "out-" + what,
		Uid: datasetUID(round, "out-"+what), Output: true})
}

// minioSequential reads the large object with one GET, as a program that reads the store
// directly does.
func minioSequential(ctx context.Context, client *minio.Client) (measure, error) {
	start := time.Now()
	obj, err := client.GetObject(ctx, bucket, largeKey, minio.GetObjectOptions{})
	if err != nil {
		return measure{}, err
	}
	defer func() { _ = obj.Close() }()
	n, err := io.CopyBuffer(io.Discard, onlyReader{obj}, make([]byte, readBuffer))
	if err != nil {
		return measure{}, fmt.Errorf("reading %s from MinIO: %w", largeKey, err)
	}
	return mbps(n, time.Since(start)), nil
}

// minioTree lists the small objects and reads each with a GET, one after the other.
func minioTree(ctx context.Context, client *minio.Client, wantFiles int) (measure, error) {
	buf := make([]byte, readBuffer)
	files := 0
	start := time.Now()
	for info := range client.ListObjects(ctx, bucket, minio.ListObjectsOptions{Prefix: smallPrefix + "/", Recursive: true}) {
		if info.Err != nil {
			return measure{}, fmt.Errorf("listing %s/%s: %w", bucket, smallPrefix, info.Err)
		}
		obj, err := client.GetObject(ctx, bucket, info.Key, minio.GetObjectOptions{})
		if err != nil {
			return measure{}, err
		}
		_, err = io.CopyBuffer(io.Discard, onlyReader{obj}, buf)
		_ = obj.Close()
		if err != nil {
			return measure{}, fmt.Errorf("reading %s: %w", info.Key, err)
		}
		files++
	}
	if files != wantFiles {
		return measure{}, fmt.Errorf("MinIO lists %d small objects, want %d", files, wantFiles)
	}
	return filesPerSecond(files, time.Since(start)), nil
}
