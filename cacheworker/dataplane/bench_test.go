package dataplane

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	"github.com/minio/minio-go/v7"
	"google.golang.org/grpc"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/authz"
	"github.com/strata-cache/strata/internal/miniotest"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
)

const benchBlockSize = 4 << 20

// BenchmarkPeerRead puts a read from a peer worker (a whole block streamed over gRPC on
// loopback, checked against its CRC-32C on both ends) beside what it replaces and what bounds it,
// in one run:
//
//   - peer/grpc: ReadBlock from another worker's MEM tier on tmpfs, in plaintext;
//   - peer/grpc-mtls: the same over mutual TLS 1.3 with the data plane's authorization, as
//     workers read each other's blocks in a cluster;
//   - local/tier-get: the same block read in-process from the local tier (a hit);
//   - under-store/minio-go: the same bytes as a ranged GetObject from MinIO, what a miss costs
//     when no peer holds the block.
//
// The MinIO case is skipped when there is no MinIO binary (see `make minio`).
func BenchmarkPeerRead(b *testing.B) {
	ctx := context.Background()
	data := payload(benchBlockSize, 9)

	dir, err := os.MkdirTemp("/dev/shm", "strata-bench-peer-")
	if err != nil {
		b.Logf("no /dev/shm (%v): the tier lives on disk, so this measures that disk, not memory", err)
		dir = b.TempDir()
	} else {
		b.Cleanup(func() { _ = os.RemoveAll(dir) })
	}
	store, err := tierstore.Open(ctx, tierstore.Config{
		Tiers:    []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{dir}, Quota: 64 << 20}},
		IndexDir: filepath.Join(b.TempDir(), "index"),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = store.Close() })
	srv := grpc.NewServer()
	workerpb.RegisterWorkerServer(srv, NewServer(store, nil, 0, nil, logr.Discard()))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	b.Cleanup(srv.Stop)
	peers := NewPeers()
	b.Cleanup(func() { _ = peers.Close() })
	if _, err := peers.WriteBlock(ctx, lis.Addr().String(), &workerpb.WriteBlockHeader{BlockId: "blk"}, data); err != nil {
		b.Fatal(err)
	}

	b.Run("peer/grpc", func(b *testing.B) {
		b.SetBytes(benchBlockSize)
		for b.Loop() {
			if _, _, err := peers.ReadBlock(ctx, lis.Addr().String(), "blk"); err != nil {
				b.Fatal(err)
			}
		}
	})
	ca := pkitest.New(b)
	authorizer, err := authz.New("bench", Policy, nil, logr.Discard())
	if err != nil {
		b.Fatal(err)
	}
	tlsSrv := grpc.NewServer(append([]grpc.ServerOption{ca.Credentials(b, pki.Worker("p", "a")).ServerOption()}, authorizer.ServerOptions()...)...)
	workerpb.RegisterWorkerServer(tlsSrv, NewServer(store, nil, 0, nil, logr.Discard()))
	tlsLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = tlsSrv.Serve(tlsLis) }()
	b.Cleanup(tlsSrv.Stop)
	tlsPeers := NewPeers(ca.Credentials(b, pki.Worker("p", "b")).DialOption(pki.RoleWorker))
	b.Cleanup(func() { _ = tlsPeers.Close() })
	b.Run("peer/grpc-mtls", func(b *testing.B) {
		b.SetBytes(benchBlockSize)
		for b.Loop() {
			if _, _, err := tlsPeers.ReadBlock(ctx, tlsLis.Addr().String(), "blk"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("local/tier-get", func(b *testing.B) {
		b.SetBytes(benchBlockSize)
		for b.Loop() {
			if _, _, err := store.Get(ctx, "blk"); err != nil {
				b.Fatal(err)
			}
		}
	})

	if miniotest.Binary() == "" {
		b.Log("no MinIO binary: skipping the under-store case; run `make minio` or set STRATA_MINIO")
		return
	}
	s3 := miniotest.Start(b)
	s3.MakeBucket(b, "bench")
	s3.Put(b, "bench", "blk", data)
	b.Run("under-store/minio-go", func(b *testing.B) {
		buf := make([]byte, benchBlockSize)
		b.SetBytes(benchBlockSize)
		for b.Loop() {
			o, err := s3.Client.GetObject(ctx, "bench", "blk", minio.GetObjectOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(o, buf); err != nil {
				b.Fatal(err)
			}
			_ = o.Close()
		}
	})
}
