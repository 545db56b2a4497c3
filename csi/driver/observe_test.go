package driver

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestEveryCallIsCountedByMethodAndCode(t *testing.T) {
	env := newNodeEnv(t)
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(shortTempDir(t), "csi.sock")
	lis, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(m.UnaryInterceptor(testr.New(t))))
	csi.RegisterIdentityServer(srv, NewIdentity("test", nil))
	csi.RegisterNodeServer(srv, env.node(t))
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ctx := context.Background()
	if _, err := csi.NewIdentityClient(conn).GetPluginInfo(ctx, &csi.GetPluginInfoRequest{}); err != nil {
		t.Fatal(err)
	}
	node := csi.NewNodeClient(conn)
	req := env.publishRequest(t, "pod-1")
	if _, err := node.NodePublishVolume(ctx, req); err != nil {
		t.Fatal(err)
	}
	stranger := env.publishRequest(t, "pod-2")
	stranger.VolumeContext[contextPodNamespace] = "team-b"
	_, _ = node.NodePublishVolume(ctx, stranger)
	_, _ = node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: "x"})

	for _, c := range []struct {
		method, code string
		want         float64
	}{
		{"GetPluginInfo", "OK", 1},
		{"NodePublishVolume", "OK", 1},
		{"NodePublishVolume", "PermissionDenied", 1},
		{"NodePublishVolume", "InvalidArgument", 1},
	} {
		if got := testutil.ToFloat64(m.calls.WithLabelValues(c.method, c.code)); got != c.want {
			t.Errorf("strata_csi_calls_total{method=%q,code=%q} = %v, want %v", c.method, c.code, got, c.want)
		}
	}
}
