package endpoint

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	cases := map[string]struct {
		in   string
		want Endpoint
		err  string
	}{
		"a unix URL with three slashes is a socket path": {in: "unix:///var/lib/kubelet/plugins/x/csi.sock",
			want: Endpoint{Network: "unix", Address: "/var/lib/kubelet/plugins/x/csi.sock"}},
		"a unix URL with one slash is a socket path": {in: "unix:/run/csi.sock", want: Endpoint{Network: "unix", Address: "/run/csi.sock"}},
		"a bare absolute path is a socket path":      {in: "/run/csi.sock", want: Endpoint{Network: "unix", Address: "/run/csi.sock"}},
		"a tcp URL is host and port":                 {in: "tcp://0.0.0.0:10000", want: Endpoint{Network: "tcp", Address: "0.0.0.0:10000"}},
		"a relative socket path is refused":          {in: "unix://csi.sock", err: "absolute"},
		"a socket path with dot-dot is refused":      {in: "unix:///run/../csi.sock", err: "clean"},
		"a tcp URL without a port is refused":        {in: "tcp://localhost", err: "host:port"},
		"another scheme is refused":                  {in: "http://localhost:80", err: "want unix"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Parse(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestListenRemovesAStaleSocketAndCreatesTheFolder(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "plugin", "csi.sock")
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	stale, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = stale.Close()

	lis, err := Listen(Endpoint{Network: "unix", Address: path})
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	defer func() { _ = lis.Close() }()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dialing the new socket: %v", err)
	}
	_ = conn.Close()
}

func TestListenNeverRemovesAFileThatIsNotASocket(t *testing.T) {
	path := filepath.Join(t.TempDir(), "csi.sock")
	if err := os.WriteFile(path, []byte("precious"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(Endpoint{Network: "unix", Address: path}); err == nil || !strings.Contains(err.Error(), "a regular file is in the way") {
		t.Fatalf("Listen over a regular file returned %v, want a refusal", err)
	}
	if raw, err := os.ReadFile(path); err != nil || string(raw) != "precious" {
		t.Fatalf("the regular file was touched: %q, %v", raw, err)
	}
}
