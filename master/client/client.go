package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/master/masterpb"
)

// Options configure a Client. Zero fields take defaults.
type Options struct {
	// DialOptions are added to every connection; the default uses no transport security.
	DialOptions []grpc.DialOption
	// AttemptTimeout bounds one attempt, so that a replica that died mid-call costs at most this
	// much before the client moves on (default 2s).
	AttemptTimeout time.Duration
	// ProbeAfter is how long an attempt waits for its replica's answer before the client asks
	// the other replicas, every ProbeEvery, which leader they know: once one names another, the
	// attempt is abandoned for it. A leader that stops answering without closing its connections
	// (a stopped node, a cut network) then costs about an election, not AttemptTimeout
	// (defaults 250ms and 50ms; the replicas' heartbeat timeout is 150ms).
	ProbeAfter time.Duration
	ProbeEvery time.Duration
	// MinBackoff and MaxBackoff bound the pause between retries that are not redirects
	// (defaults 10ms and 100ms: short, so a client notices a new leader soon after the
	// election, which takes a few hundred milliseconds).
	MinBackoff time.Duration
	MaxBackoff time.Duration
	Logger     logr.Logger
}

func (o *Options) setDefaults() {
	if o.AttemptTimeout == 0 {
		o.AttemptTimeout = 2 * time.Second
	}
	if o.ProbeAfter == 0 {
		o.ProbeAfter = 250 * time.Millisecond
	}
	if o.ProbeEvery == 0 {
		o.ProbeEvery = 50 * time.Millisecond
	}
	if o.MinBackoff == 0 {
		o.MinBackoff = 10 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = 100 * time.Millisecond
	}
	if o.DialOptions == nil {
		o.DialOptions = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
}

// ErrClosed is returned by calls on a closed client.
var ErrClosed = errors.New("master client is closed")

// Client is safe for concurrent use.
type Client struct {
	opts  Options
	seeds []string

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	leader string
	next   int
	closed bool
}

// New returns a client for the replicas at addrs (host:port). It connects lazily.
func New(addrs []string, opts Options) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("master client needs at least one address")
	}
	opts.setDefaults()
	return &Client{opts: opts, seeds: append([]string(nil), addrs...), conns: map[string]*grpc.ClientConn{}}, nil
}

// Close closes every connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for addr, cc := range c.conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing connection to %s: %w", addr, err))
		}
	}
	c.conns = map[string]*grpc.ClientConn{}
	return errors.Join(errs...)
}

// LeaderAddr is the address of the replica that last served a request, usually the leader.
func (c *Client) LeaderAddr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

func (c *Client) stub(addr string) (masterpb.MasterClient, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	cc, ok := c.conns[addr]
	if !ok {
		opts := append([]grpc.DialOption{
			// Reconnect fast: a restarted replica comes back within seconds, and grpc's default
			// backoff (up to two minutes) would keep the client away from it.
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
				MinConnectTimeout: time.Second,
			}),
		}, c.opts.DialOptions...)
		var err error
		if cc, err = grpc.NewClient(addr, opts...); err != nil {
			return nil, fmt.Errorf("connecting to master %s: %w", addr, err)
		}
		c.conns[addr] = cc
	}
	return masterpb.NewMasterClient(cc), nil
}

// target is where the next call starts: the last leader, else the seeds in turn.
func (c *Client) target() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader != "" {
		return c.leader
	}
	return c.seeds[c.next%len(c.seeds)]
}

// rotate forgets a replica that failed and moves to the next seed.
func (c *Client) rotate(failed string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.leader == failed {
		c.leader = ""
	}
	c.next++
	addr := c.seeds[c.next%len(c.seeds)]
	if masterpb.SameReplica(addr, failed) && len(c.seeds) > 1 {
		c.next++
		addr = c.seeds[c.next%len(c.seeds)]
	}
	return addr
}

// canonical is the seed that names the same replica as addr (a replica advertises its fully
// qualified name, the seeds may be shorter), else addr: one name, and one connection, per
// replica.
func (c *Client) canonical(addr string) string {
	for _, seed := range c.seeds {
		if masterpb.SameReplica(seed, addr) {
			return seed
		}
	}
	return addr
}

func (c *Client) setLeader(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.leader = addr
}

// maxRedirects bounds redirects followed without a pause, in case replicas disagree on the
// leader during an election.
const maxRedirects = 3

// call runs fn against the leader until it succeeds, fails with an error retrying cannot fix,
// or ctx ends. ambiguous reports whether an earlier attempt may have been applied.
func call[Req, Resp any](ctx context.Context, c *Client, method string, req Req,
	fn func(masterpb.MasterClient, context.Context, Req, ...grpc.CallOption) (Resp, error),
) (resp Resp, ambiguous bool, err error) {
	addr := c.target()
	pause := c.opts.MinBackoff
	redirects := 0
	// suspect is the replica that last failed this call (died, or did not answer): the others
	// are asked to name a leader other than it, which they wait for during an election.
	suspect := ""
	for {
		stub, err := c.stub(addr)
		if err != nil {
			return resp, ambiguous, err
		}
		actx, cancel := context.WithTimeout(ctx, c.opts.AttemptTimeout)
		if suspect != "" {
			actx = masterpb.WithSuspectLeader(actx, suspect)
		}
		watch := c.watchLeader(actx, cancel, addr, suspect)
		resp, err = fn(stub, actx, req)
		moved := watch.stop()
		cancel()
		if err == nil {
			c.setLeader(addr)
			return resp, ambiguous, nil
		}
		if ctx.Err() != nil {
			return resp, ambiguous, fmt.Errorf("%s: %w (last error from %s: %w)", method, ctx.Err(), addr, err)
		}
		if moved != "" {
			// addr did not answer, and another replica names a leader other than it: go there
			// at once. addr may have applied the call before it stopped answering.
			c.opts.Logger.V(1).Info("a replica that did not answer is not the leader any more", "method", method, "addr", addr, "leader", moved)
			ambiguous = true
			suspect = addr
			addr = c.canonical(moved)
			c.setLeader(addr)
			continue
		}
		reason, leaderAddr, _ := masterpb.RedirectInfo(err)
		if leaderAddr != "" {
			leaderAddr = c.canonical(leaderAddr)
		}
		code := status.Code(err)
		switch {
		case reason == masterpb.ReasonNotLeader && leaderAddr != "" && redirects < maxRedirects:
			redirects++
			c.setLeader(leaderAddr)
			addr = leaderAddr
			continue
		case reason == masterpb.ReasonNotLeader && leaderAddr != "":
			// Replicas keep pointing at each other (an election is settling): pause first.
			addr = leaderAddr
		case reason == masterpb.ReasonNotLeader, reason == masterpb.ReasonNoLeader:
			// Nothing was proposed. This replica may be cut off from the others; try the next.
			addr = c.rotate(addr)
		case code == codes.Unavailable, code == codes.DeadlineExceeded:
			// The replica died, stepped down mid-commit (LEADERSHIP_LOST) or did not answer in
			// time: the write may have been applied.
			ambiguous = true
			suspect = addr
			addr = c.rotate(addr)
		default:
			return resp, ambiguous, err
		}
		c.opts.Logger.V(1).Info("retrying master call", "method", method, "addr", addr, "error", err.Error())
		redirects = 0
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return resp, ambiguous, fmt.Errorf("%s: %w (last error: %w)", method, ctx.Err(), err)
		case <-t.C:
		}
		pause = min(2*pause, c.opts.MaxBackoff)
	}
}

// leaderWatch asks the other replicas for the leader while an attempt goes unanswered.
type leaderWatch struct {
	timer *time.Timer
	done  chan struct{}
	wg    sync.WaitGroup
	// moved is the leader another replica named; written before wg is done.
	moved string
}

// watchLeader starts asking, after ProbeAfter, the replicas other than addr which leader they
// know, and cancels the attempt when one names another, neither addr nor suspect (the replica
// this call already saw fail, which a follower that has not noticed yet still names). stop ends
// the watch and says the leader found, if any.
func (c *Client) watchLeader(attempt context.Context, cancelAttempt context.CancelFunc, addr, suspect string) *leaderWatch {
	w := &leaderWatch{done: make(chan struct{})}
	w.wg.Add(1)
	w.timer = time.AfterFunc(c.opts.ProbeAfter, func() {
		defer w.wg.Done()
		if moved := c.probeLeader(attempt, w.done, addr, suspect); moved != "" {
			w.moved = moved
			cancelAttempt()
		}
	})
	return w
}

func (w *leaderWatch) stop() string {
	if w.timer.Stop() {
		w.wg.Done()
	}
	close(w.done)
	w.wg.Wait()
	return w.moved
}

// probeLeader asks the replicas other than addr and suspect in turn, every ProbeEvery, for the
// leader they know, until one names a leader that is neither (which it returns), or attempt
// ends, or done is closed.
func (c *Client) probeLeader(attempt context.Context, done <-chan struct{}, addr, suspect string) string {
	var others []string
	for _, seed := range c.seeds {
		if !masterpb.SameReplica(seed, addr) && !masterpb.SameReplica(seed, suspect) {
			others = append(others, seed)
		}
	}
	if len(others) == 0 {
		return ""
	}
	tick := time.NewTicker(c.opts.ProbeEvery)
	defer tick.Stop()
	for i := 0; ; i++ {
		leader := c.askLeader(attempt, others[i%len(others)])
		if leader != "" && !masterpb.SameReplica(leader, addr) && !masterpb.SameReplica(leader, suspect) {
			return leader
		}
		select {
		case <-attempt.Done():
			return ""
		case <-done:
			return ""
		case <-tick.C:
		}
	}
}

// askLeader returns the API address of the leader the replica at addr knows, or "" when it
// knows none or does not answer within two probe periods.
func (c *Client) askLeader(ctx context.Context, addr string) string {
	stub, err := c.stub(addr)
	if err != nil {
		return ""
	}
	pctx, cancel := context.WithTimeout(ctx, 2*c.opts.ProbeEvery)
	defer cancel()
	resp, err := stub.Leader(pctx, &masterpb.LeaderRequest{})
	if err != nil {
		return ""
	}
	return resp.GetLeaderApiAddr()
}

func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms.
	return hex.EncodeToString(b[:])
}

// CreateFile creates a file. A request without a client token gets one, so that retries are
// idempotent.
func (c *Client) CreateFile(ctx context.Context, req *masterpb.CreateFileRequest) (*masterpb.File, error) {
	if req.ClientToken == "" {
		req.ClientToken = newToken()
	}
	f, _, err := call(ctx, c, "CreateFile", req, masterpb.MasterClient.CreateFile)
	return f, err
}

// GetFile returns a file.
func (c *Client) GetFile(ctx context.Context, req *masterpb.GetFileRequest) (*masterpb.File, error) {
	f, _, err := call(ctx, c, "GetFile", req, masterpb.MasterClient.GetFile)
	return f, err
}

// Exists reports whether a file exists.
func (c *Client) Exists(ctx context.Context, path string) (bool, error) {
	resp, _, err := call(ctx, c, "Exists", &masterpb.ExistsRequest{Path: path}, masterpb.MasterClient.Exists)
	if err != nil {
		return false, err
	}
	return resp.Exists, nil
}

// RenameFile renames a file.
func (c *Client) RenameFile(ctx context.Context, from, to string) (*masterpb.File, error) {
	f, _, err := call(ctx, c, "RenameFile", &masterpb.RenameFileRequest{From: from, To: to}, masterpb.MasterClient.RenameFile)
	return f, err
}

// DeleteFile deletes a file. NOT_FOUND after an attempt that may have been applied counts as
// success: the file is gone either way.
func (c *Client) DeleteFile(ctx context.Context, path string) (*masterpb.DeleteFileResponse, error) {
	resp, ambiguous, err := call(ctx, c, "DeleteFile", &masterpb.DeleteFileRequest{Path: path}, masterpb.MasterClient.DeleteFile)
	if ambiguous && status.Code(err) == codes.NotFound {
		return &masterpb.DeleteFileResponse{}, nil
	}
	return resp, err
}

// Lookup says what a path names: a file, a directory, or neither (NotFound). A master older
// than Lookup answers Unimplemented (a rolling upgrade that reached the workers first); the
// two reads it does answer, GetFile and a one-entry ListFiles, then say the same.
func (c *Client) Lookup(ctx context.Context, req *masterpb.LookupRequest) (*masterpb.ListEntry, error) {
	entry, _, err := call(ctx, c, "Lookup", req, masterpb.MasterClient.Lookup)
	if status.Code(err) != codes.Unimplemented {
		return entry, err
	}
	f, err := c.GetFile(ctx, &masterpb.GetFileRequest{Path: req.GetPath(), StaleOk: req.GetStaleOk()})
	if status.Code(err) != codes.NotFound {
		if err != nil {
			return nil, err
		}
		return &masterpb.ListEntry{Path: req.GetPath(), File: f}, nil
	}
	resp, err := c.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: req.GetPath(), Limit: 1, StaleOk: req.GetStaleOk()})
	switch {
	case err != nil:
		return nil, err
	case len(resp.GetEntries()) == 0:
		return nil, status.Errorf(codes.NotFound, "file or directory %s not found", req.GetPath())
	}
	return &masterpb.ListEntry{Path: req.GetPath(), Dir: true}, nil
}

// ListFiles lists one page of a directory.
func (c *Client) ListFiles(ctx context.Context, req *masterpb.ListFilesRequest) (*masterpb.ListFilesResponse, error) {
	resp, _, err := call(ctx, c, "ListFiles", req, masterpb.MasterClient.ListFiles)
	return resp, err
}

// CheckpointFile records a file's checkpoint state.
func (c *Client) CheckpointFile(ctx context.Context, req *masterpb.CheckpointFileRequest) (*masterpb.File, error) {
	f, _, err := call(ctx, c, "CheckpointFile", req, masterpb.MasterClient.CheckpointFile)
	return f, err
}

// RecordAccess adds reads to a file's statistics.
func (c *Client) RecordAccess(ctx context.Context, req *masterpb.RecordAccessRequest) (*masterpb.File, error) {
	f, _, err := call(ctx, c, "RecordAccess", req, masterpb.MasterClient.RecordAccess)
	return f, err
}

// RegisterDataset registers a dataset (idempotent).
func (c *Client) RegisterDataset(ctx context.Context, req *masterpb.RegisterDatasetRequest) (*masterpb.Dataset, error) {
	ds, _, err := call(ctx, c, "RegisterDataset", req, masterpb.MasterClient.RegisterDataset)
	return ds, err
}

// GetDataset returns a dataset.
func (c *Client) GetDataset(ctx context.Context, req *masterpb.GetDatasetRequest) (*masterpb.Dataset, error) {
	ds, _, err := call(ctx, c, "GetDataset", req, masterpb.MasterClient.GetDataset)
	return ds, err
}

// SealFile creates a file with its blocks committed, in one command (idempotent by the
// request's client token, which it needs).
func (c *Client) SealFile(ctx context.Context, req *masterpb.SealFileRequest) (*masterpb.File, error) {
	f, _, err := call(ctx, c, "SealFile", req, masterpb.MasterClient.SealFile)
	return f, err
}

// ForgetWorker removes a lost worker's record (idempotent); see masterpb.MasterServer.
func (c *Client) ForgetWorker(ctx context.Context, worker string) (*masterpb.ForgetWorkerResponse, error) {
	resp, _, err := call(ctx, c, "ForgetWorker", &masterpb.ForgetWorkerRequest{Worker: worker}, masterpb.MasterClient.ForgetWorker)
	return resp, err
}

// CompleteDataset marks a dataset complete (idempotent): its files no longer change.
func (c *Client) CompleteDataset(ctx context.Context, name string) (*masterpb.Dataset, error) {
	ds, _, err := call(ctx, c, "CompleteDataset", &masterpb.CompleteDatasetRequest{Name: name}, masterpb.MasterClient.CompleteDataset)
	return ds, err
}

// ReopenDataset clears a dataset's complete flag (idempotent): its files may be written again.
func (c *Client) ReopenDataset(ctx context.Context, name string) (*masterpb.Dataset, error) {
	ds, _, err := call(ctx, c, "ReopenDataset", &masterpb.ReopenDatasetRequest{Name: name}, masterpb.MasterClient.ReopenDataset)
	return ds, err
}

// SetDatasetRecovery sets what a read of a dataset's lost files does (idempotent), registering
// the dataset with req.Root if the master does not know it.
func (c *Client) SetDatasetRecovery(ctx context.Context, req *masterpb.SetDatasetRecoveryRequest) (*masterpb.Dataset, error) {
	ds, _, err := call(ctx, c, "SetDatasetRecovery", req, masterpb.MasterClient.SetDatasetRecovery)
	return ds, err
}

// SettleAttempt publishes or discards the files of one attempt of a dataset's writer
// (idempotent: a retry finds none left).
func (c *Client) SettleAttempt(ctx context.Context, req *masterpb.SettleAttemptRequest) (*masterpb.SettleAttemptResponse, error) {
	resp, _, err := call(ctx, c, "SettleAttempt", req, masterpb.MasterClient.SettleAttempt)
	return resp, err
}

// GetDatasetUsage sums what the workers hold of a dataset.
func (c *Client) GetDatasetUsage(ctx context.Context, req *masterpb.GetDatasetUsageRequest) (*masterpb.DatasetUsage, error) {
	u, _, err := call(ctx, c, "GetDatasetUsage", req, masterpb.MasterClient.GetDatasetUsage)
	return u, err
}

// DeleteDataset deletes a dataset and its files.
func (c *Client) DeleteDataset(ctx context.Context, name string) (*masterpb.DeleteDatasetResponse, error) {
	resp, _, err := call(ctx, c, "DeleteDataset", &masterpb.DeleteDatasetRequest{Name: name}, masterpb.MasterClient.DeleteDataset)
	return resp, err
}

// CommitBlock records a block and a copy of it (idempotent for the same copy).
func (c *Client) CommitBlock(ctx context.Context, req *masterpb.CommitBlockRequest) (*masterpb.Block, error) {
	b, _, err := call(ctx, c, "CommitBlock", req, masterpb.MasterClient.CommitBlock)
	return b, err
}

// RemoveBlockCopy forgets a worker's copy of a block (idempotent).
func (c *Client) RemoveBlockCopy(ctx context.Context, req *masterpb.RemoveBlockCopyRequest) (*masterpb.Block, error) {
	b, _, err := call(ctx, c, "RemoveBlockCopy", req, masterpb.MasterClient.RemoveBlockCopy)
	return b, err
}

// GetBlockLocations returns blocks and their copies.
func (c *Client) GetBlockLocations(ctx context.Context, req *masterpb.GetBlockLocationsRequest) (*masterpb.GetBlockLocationsResponse, error) {
	resp, _, err := call(ctx, c, "GetBlockLocations", req, masterpb.MasterClient.GetBlockLocations)
	return resp, err
}

// RegisterWorker registers a worker.
func (c *Client) RegisterWorker(ctx context.Context, req *masterpb.RegisterWorkerRequest) (*masterpb.Worker, error) {
	w, _, err := call(ctx, c, "RegisterWorker", req, masterpb.MasterClient.RegisterWorker)
	return w, err
}

// Heartbeat reports that a worker is alive.
func (c *Client) Heartbeat(ctx context.Context, req *masterpb.HeartbeatRequest) (*masterpb.HeartbeatResponse, error) {
	resp, _, err := call(ctx, c, "Heartbeat", req, masterpb.MasterClient.Heartbeat)
	return resp, err
}

// MarkWorkerLost declares a worker lost.
func (c *Client) MarkWorkerLost(ctx context.Context, worker, reason string) (*masterpb.MarkWorkerLostResponse, error) {
	resp, _, err := call(ctx, c, "MarkWorkerLost", &masterpb.MarkWorkerLostRequest{Worker: worker, Reason: reason}, masterpb.MasterClient.MarkWorkerLost)
	return resp, err
}

// ListWorkers lists the workers.
func (c *Client) ListWorkers(ctx context.Context, req *masterpb.ListWorkersRequest) (*masterpb.ListWorkersResponse, error) {
	resp, _, err := call(ctx, c, "ListWorkers", req, masterpb.MasterClient.ListWorkers)
	return resp, err
}

// Join asks the cluster's leader to add a replica.
func (c *Client) Join(ctx context.Context, req *masterpb.JoinRequest) (*masterpb.JoinResponse, error) {
	resp, _, err := call(ctx, c, "Join", req, masterpb.MasterClient.Join)
	return resp, err
}

// Leader asks one replica, the one at addr, what it knows of the leader. It does not retry:
// bootstrap logic probes each replica in turn.
func (c *Client) Leader(ctx context.Context, addr string) (*masterpb.LeaderResponse, error) {
	stub, err := c.stub(addr)
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithTimeout(ctx, c.opts.AttemptTimeout)
	defer cancel()
	resp, err := stub.Leader(actx, &masterpb.LeaderRequest{})
	if err != nil {
		return nil, fmt.Errorf("asking %s for the leader: %w", addr, err)
	}
	return resp, nil
}
