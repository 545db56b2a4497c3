package driver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/pki"
)

// MountSocketName is the file name of the Mounter socket in each pool's folder of the worker
// socket directory: <socket-dir>/<pool>/mount.sock.
const MountSocketName = "mount.sock"

// ErrWorkerUnreachable is returned, wrapped, when nothing answers on a pool's Mounter socket.
var ErrWorkerUnreachable = errors.New("the worker does not answer")

// probeTimeout bounds how long Probe waits for one worker socket.
const probeTimeout = 2 * time.Second

// WorkerSockets reaches the Mounter service of each pool's cache worker on this node through
// the Unix socket <Dir>/<pool>/mount.sock, over mutual TLS: the plugin shows its certificate and
// accepts only the certificate of that pool's worker on this node. A connection is made per
// call: calls are rare (one per publish) and a worker that restarted is found again without any
// reconnection logic.
type WorkerSockets struct {
	// Dir is the host folder of the workers' sockets, such as /run/strata.
	Dir string
	// Node is this node's name: the workers answering are <pool>/<Node>.
	Node        string
	Credentials *pki.Credentials
}

// Socket is the path of pool's Mounter socket.
func (w WorkerSockets) Socket(pool string) string { return filepath.Join(w.Dir, pool, MountSocketName) }

// MountDataset asks pool's worker to serve a Dataset and returns the worker's answer.
func (w WorkerSockets) MountDataset(ctx context.Context, pool string, req *workerpb.MountDatasetRequest) (*workerpb.MountDatasetResponse, error) {
	var resp *workerpb.MountDatasetResponse
	err := w.call(pool, func(c workerpb.MounterClient) error {
		var err error
		resp, err = c.MountDataset(ctx, req)
		return err
	})
	return resp, err
}

// UnmountDataset asks pool's worker to stop serving the Dataset of uid.
func (w WorkerSockets) UnmountDataset(ctx context.Context, pool, uid string) error {
	return w.call(pool, func(c workerpb.MounterClient) error {
		_, err := c.UnmountDataset(ctx, &workerpb.UnmountDatasetRequest{Uid: uid})
		return err
	})
}

// call runs fn against pool's Mounter. When the socket cannot be dialled the error wraps
// ErrWorkerUnreachable; otherwise it is the worker's own gRPC status.
func (w WorkerSockets) call(pool string, fn func(workerpb.MounterClient) error) error {
	socket := w.Socket(pool)
	var (
		mu      sync.Mutex
		dialErr error
	)
	if w.Credentials == nil {
		return fmt.Errorf("no certificate to speak to the worker on %s with", socket)
	}
	conn, err := grpc.NewClient("passthrough:///"+socket,
		w.Credentials.DialOptionLocal(pki.Worker(pool, w.Node)),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", socket)
			mu.Lock()
			dialErr = err
			mu.Unlock()
			return c, err
		}))
	if err != nil {
		return fmt.Errorf("creating a client for %s: %w", socket, err)
	}
	defer func() { _ = conn.Close() }()
	err = fn(workerpb.NewMounterClient(conn))
	mu.Lock()
	defer mu.Unlock()
	if err != nil && dialErr != nil && status.Code(err) == codes.Unavailable {
		return fmt.Errorf("%w on %s: %w", ErrWorkerUnreachable, socket, dialErr)
	}
	return err
}

// AnyAnswering says whether at least one pool's worker on this node accepts connections on
// its Mounter socket: the node plugin can publish nothing before one does.
func (w WorkerSockets) AnyAnswering(ctx context.Context) bool {
	sockets, err := filepath.Glob(filepath.Join(w.Dir, "*", MountSocketName))
	if err != nil {
		return false
	}
	for _, s := range sockets {
		dctx, cancel := context.WithTimeout(ctx, probeTimeout)
		var d net.Dialer
		c, err := d.DialContext(dctx, "unix", s)
		cancel()
		if err == nil {
			_ = c.Close()
			return true
		}
	}
	return false
}
