package registration

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// shortDir is a temporary folder with a path short enough for Unix sockets (108 bytes).
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "strata-reg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func TestTheKubeletRegistersTheDriverThroughTheSocket(t *testing.T) {
	kubeletDir := shortDir(t)
	socket := SocketPath(kubeletDir, "csi.strata.dev")
	if want := filepath.Join(kubeletDir, "plugins_registry", "csi.strata.dev-reg.sock"); socket != want {
		t.Fatalf("SocketPath = %s, want %s", socket, want)
	}

	// A socket left by a plugin that was killed: Serve must replace it.
	if err := os.MkdirAll(filepath.Dir(socket), 0o750); err != nil {
		t.Fatal(err)
	}
	stale, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = stale.Close()

	srv, err := New(Config{DriverName: "csi.strata.dev", Endpoint: "/var/lib/kubelet/plugins/csi.strata.dev/csi.sock", Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, socket) }()

	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	kubelet := registerapi.NewRegistrationClient(conn)
	callCtx, callCancel := context.WithTimeout(ctx, 10*time.Second)
	defer callCancel()

	info, err := kubelet.GetInfo(callCtx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	if info.Type != registerapi.CSIPlugin || info.Name != "csi.strata.dev" ||
		info.Endpoint != "/var/lib/kubelet/plugins/csi.strata.dev/csi.sock" ||
		len(info.SupportedVersions) != 1 || info.SupportedVersions[0] != "1.0.0" {
		t.Fatalf("GetInfo = %+v", info)
	}

	_, err = kubelet.NotifyRegistrationStatus(callCtx, &registerapi.RegistrationStatus{PluginRegistered: false, Error: "version 1.0.0 unsupported"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "version 1.0.0 unsupported") {
		t.Fatalf("NotifyRegistrationStatus(refused) = %v, want FailedPrecondition with the kubelet's error", err)
	}
	if srv.Registered() {
		t.Fatal("Registered() is true after the kubelet refused the driver")
	}
	if _, err := kubelet.NotifyRegistrationStatus(callCtx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatalf("NotifyRegistrationStatus(registered): %v", err)
	}
	if !srv.Registered() {
		t.Fatal("Registered() is false after the kubelet registered the driver")
	}

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	if _, err := os.Lstat(socket); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the registration socket is still there after Serve returned (%v): the kubelet would not deregister the driver", err)
	}
}

func TestNewRefusesARelativeEndpoint(t *testing.T) {
	if _, err := New(Config{DriverName: "csi.strata.dev", Endpoint: "csi.sock"}); err == nil {
		t.Fatal("New accepted a relative CSI socket path")
	}
}
