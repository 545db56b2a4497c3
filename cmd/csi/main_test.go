package main

import (
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
)

func TestResolve(t *testing.T) {
	cases := map[string]struct {
		args []string
		env  string
		err  string
	}{
		"a node plugin with the defaults and a node name": {args: []string{"--mode=node", "--node-name=node-a", "--ca-file=/ca.crt"}},
		"a node plugin takes its name from NODE_NAME":     {args: []string{"--mode=node", "--ca-file=/ca.crt"}, env: "node-a"},
		"a node plugin needs Strata's CA":                 {args: []string{"--mode=node", "--node-name=node-a"}, err: "--ca-file is required"},
		"a controller needs no node name":                 {args: []string{"--mode=controller", "--csi-endpoint=tcp://0.0.0.0:10000"}},
		"the mode is required":                            {args: []string{"--node-name=node-a"}, err: "--mode is required"},
		"an unknown mode is refused":                      {args: []string{"--mode=both"}, err: `--mode="both"`},
		"a node plugin needs its node's name":             {args: []string{"--mode=node"}, err: "--node-name"},
		"a node plugin serves on a Unix socket":           {args: []string{"--mode=node", "--node-name=n", "--csi-endpoint=tcp://:10000"}, err: "Unix socket"},
		"a malformed endpoint is refused":                 {args: []string{"--mode=controller", "--csi-endpoint=csi.sock"}, err: "--csi-endpoint"},
		"a relative kubelet folder is refused":            {args: []string{"--mode=node", "--node-name=n", "--kubelet-dir=var/lib/kubelet"}, err: "--kubelet-dir"},
		"a relative state folder is refused":              {args: []string{"--mode=controller", "--state-dir=state"}, err: "--state-dir"},
		"a worker socket folder with dot-dot is refused":  {args: []string{"--mode=node", "--node-name=n", "--worker-socket-dir=/run/../strata"}, err: "--worker-socket-dir"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Setenv("NODE_NAME", tc.env)
			var o options
			fs := flag.NewFlagSet("csi", flag.ContinueOnError)
			o.bind(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			cfg, err := o.resolve()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("resolve() = %v; want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("resolve(): %v", err)
			}
			if cfg.mode == modeNode && (cfg.registrationPath != "/var/lib/kubelet/plugins/csi.strata.dev/csi.sock" ||
				cfg.registrationSock != "/var/lib/kubelet/plugins_registry/csi.strata.dev-reg.sock" || cfg.nodeName != "node-a") {
				t.Fatalf("resolve() = %+v", cfg)
			}
		})
	}
}

// certificateFlags issues a certificate for id from a CA of the test's and returns the flags
// that name its files.
func certificateFlags(t *testing.T, id pki.Identity) []string {
	t.Helper()
	ca, dir := pkitest.New(t), t.TempDir()
	cert, key := ca.Issue(t, id)
	files := map[string][]byte{"ca.crt": ca.CA.CertPEM, "tls.crt": cert, "tls.key": key}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return []string{"--ca-file=" + filepath.Join(dir, "ca.crt"), "--cert-file=" + filepath.Join(dir, "tls.crt"),
		"--key-file=" + filepath.Join(dir, "tls.key")}
}

func TestRunServesTheNodePluginAndRegistersItWithTheKubelet(t *testing.T) {
	root, err := os.MkdirTemp("", "strata-cmd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	kubeletDir := filepath.Join(root, "kubelet")
	csiSocket := filepath.Join(kubeletDir, "plugins", "csi.strata.dev", "csi.sock")
	var o options
	fs := flag.NewFlagSet("csi", flag.ContinueOnError)
	o.bind(fs)
	if err := fs.Parse(append([]string{
		"--mode=node", "--node-name=node-a", "--kubelet-dir=" + kubeletDir, "--csi-endpoint=unix://" + csiSocket,
		"--worker-socket-dir=" + filepath.Join(root, "run"), "--state-dir=" + filepath.Join(root, "state"),
		"--metrics-addr=127.0.0.1:0", "--vendor-version=v9.9.9",
	}, certificateFlags(t, pki.CSINode("node-a"))...)); err != nil {
		t.Fatal(err)
	}
	cfg, err := o.resolve()
	if err != nil {
		t.Fatal(err)
	}
	// Find a free port for the metrics, so the test can reach them.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.metricsAddr = lis.Addr().String()
	_ = lis.Close()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, cfg, testr.New(t)) }()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("run did not stop after its context ended")
		}
	}()

	callCtx, callCancel := context.WithTimeout(ctx, 10*time.Second)
	defer callCancel()
	csiConn := dial(t, csiSocket)
	info, err := csi.NewIdentityClient(csiConn).GetPluginInfo(callCtx, &csi.GetPluginInfoRequest{}, grpc.WaitForReady(true))
	if err != nil || info.GetName() != "csi.strata.dev" || info.GetVendorVersion() != "v9.9.9" {
		t.Fatalf("GetPluginInfo = %v, %v", info, err)
	}
	node, err := csi.NewNodeClient(csiConn).NodeGetInfo(callCtx, &csi.NodeGetInfoRequest{})
	if err != nil || node.GetNodeId() != "node-a" {
		t.Fatalf("NodeGetInfo = %v, %v", node, err)
	}

	readyz := "http://" + cfg.metricsAddr + "/readyz"
	if code := httpGet(t, readyz); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before the kubelet registered the driver = %d, want 503", code)
	}
	kubelet := registerapi.NewRegistrationClient(dial(t, filepath.Join(kubeletDir, "plugins_registry", "csi.strata.dev-reg.sock")))
	reg, err := kubelet.GetInfo(callCtx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil || reg.GetEndpoint() != csiSocket || reg.GetName() != "csi.strata.dev" {
		t.Fatalf("GetInfo = %v, %v", reg, err)
	}
	if _, err := kubelet.NotifyRegistrationStatus(callCtx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if code := httpGet(t, readyz); code != http.StatusOK {
		t.Fatalf("/readyz after registration = %d, want 200", code)
	}
	resp, err := http.Get("http://" + cfg.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if !strings.Contains(string(body), `strata_csi_calls_total{code="OK",method="NodeGetInfo"} 1`) {
		t.Fatalf("/metrics does not count the NodeGetInfo call:\n%s", body)
	}
}

func dial(t *testing.T, socket string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func httpGet(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}
