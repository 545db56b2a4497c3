package mastertest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/internal/authz"
	"github.com/strata-cache/strata/internal/daemon"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/server"
	"github.com/strata-cache/strata/master/store"
)

// Transport chooses how the replicas' Raft traffic travels.
type Transport int

const (
	// Inmem connects replicas through raft.InmemTransport; partitions are possible.
	Inmem Transport = iota
	// TCP connects replicas over loopback TCP, as in production.
	TCP
)

// Options configure a test cluster.
type Options struct {
	Transport Transport
	// GRPC starts a gRPC server for each replica on 127.0.0.1.
	GRPC bool
	// Logger receives the replicas' logs; the default discards them.
	Logger logr.Logger
	// Tune adjusts each replica's store configuration after the test defaults are set.
	Tune func(*store.Config)
	// NoBootstrap starts the replicas without forming a cluster: the test does it (through
	// package cluster, for instance).
	NoBootstrap bool
	// TLS, with GRPC, serves the API as cmd/master does: mutual TLS with a master's certificate
	// of this CA, and the master's authorization policy. Client then speaks as the operator.
	TLS *pkitest.Authority
}

// TestConfig returns store settings for tests: short Raft timeouts (elections in well under a
// second even on a loaded two-core machine) and small Raft log segments.
func TestConfig() store.Config {
	return store.Config{
		HeartbeatTimeout:   400 * time.Millisecond,
		ElectionTimeout:    400 * time.Millisecond,
		LeaderLeaseTimeout: 200 * time.Millisecond,
		CommitTimeout:      5 * time.Millisecond,
		ApplyTimeout:       5 * time.Second,
		LogSegmentSize:     4 << 20,
	}
}

// Node is one replica.
type Node struct {
	ID       string
	Dir      string
	RaftAddr string
	APIAddr  string
	Store    *store.Store

	inmem      *raft.InmemTransport
	grpcServer *grpc.Server
	serveDone  chan struct{}
	alive      bool

	stoppedMu sync.Mutex
	// stopped, while not nil, holds every API call until it is closed (Stop, Resume).
	stopped chan struct{}
}

// holdWhileStopped is a gRPC interceptor that holds a call while its replica is stopped.
func (n *Node) holdWhileStopped(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	n.stoppedMu.Lock()
	stopped := n.stopped
	n.stoppedMu.Unlock()
	if stopped != nil {
		select {
		case <-stopped:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return handler(ctx, req)
}

// Cluster is a set of replicas in this process.
type Cluster struct {
	tb    testing.TB
	opts  Options
	Nodes []*Node

	// mu guards the transports' connections while nodes die and come back.
	mu sync.Mutex
}

// New starts an n-replica cluster: the first replica bootstraps, the others join through it.
// Everything stops when the test ends.
func New(tb testing.TB, n int, opts Options) *Cluster {
	tb.Helper()
	if opts.Logger.GetSink() == nil {
		opts.Logger = logr.Discard()
	}
	c := &Cluster{tb: tb, opts: opts}
	for i := 0; i < n; i++ {
		node := &Node{ID: fmt.Sprintf("master-%d", i), Dir: tb.TempDir()}
		if opts.Transport == Inmem {
			node.RaftAddr = "raft-" + node.ID
		} else {
			node.RaftAddr = "127.0.0.1:0"
		}
		c.Nodes = append(c.Nodes, node)
	}
	// Cleanups run last-registered first: the replicas must stop before their temporary
	// directories are removed.
	tb.Cleanup(c.Close)
	for _, node := range c.Nodes {
		if err := c.start(node); err != nil {
			tb.Fatalf("starting %s: %v", node.ID, err)
		}
	}
	if opts.NoBootstrap {
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Nodes[0].Store.Bootstrap(ctx); err != nil {
		tb.Fatalf("bootstrapping: %v", err)
	}
	for _, node := range c.Nodes[1:] {
		if err := c.Join(ctx, node); err != nil {
			tb.Fatalf("joining %s: %v", node.ID, err)
		}
	}
	if _, err := c.Leader(ctx); err != nil {
		tb.Fatal(err)
	}
	return c
}

// start opens the replica's store (and gRPC server) on its directory and addresses.
func (c *Cluster) start(n *Node) error {
	cfg := TestConfig()
	cfg.ID, cfg.Dir = n.ID, n.Dir
	cfg.Logger = c.opts.Logger.WithName(n.ID)

	var lis net.Listener
	if c.opts.GRPC {
		addr := n.APIAddr
		if addr == "" {
			addr = "127.0.0.1:0"
		}
		var err error
		if lis, err = net.Listen("tcp", addr); err != nil {
			return fmt.Errorf("listening for gRPC: %w", err)
		}
		n.APIAddr = lis.Addr().String()
	} else if n.APIAddr == "" {
		// A name only, never dialled; fully qualified, as replicas on Kubernetes advertise.
		n.APIAddr = net.JoinHostPort("api-"+n.ID+".master.test.svc.cluster.local", "7001")
	}
	cfg.APIAddr = n.APIAddr

	c.mu.Lock()
	if c.opts.Transport == Inmem {
		_, n.inmem = raft.NewInmemTransport(raft.ServerAddress(n.RaftAddr))
		cfg.Transport = n.inmem
		for _, other := range c.Nodes {
			if other != n && other.alive {
				n.inmem.Connect(raft.ServerAddress(other.RaftAddr), other.inmem)
				other.inmem.Connect(raft.ServerAddress(n.RaftAddr), n.inmem)
			}
		}
	} else {
		cfg.RaftBind = n.RaftAddr
	}
	c.mu.Unlock()
	if c.opts.Tune != nil {
		c.opts.Tune(&cfg)
	}

	s, err := store.Open(cfg)
	if err != nil {
		if lis != nil {
			_ = lis.Close()
		}
		return err
	}
	c.mu.Lock()
	n.Store = s
	n.RaftAddr = s.RaftAddr()
	n.alive = true
	c.mu.Unlock()
	if lis != nil {
		opts := daemon.ServerLimits() // as cmd/master serves
		if c.opts.TLS != nil {
			a, err := authz.New("master", server.Policy, nil, cfg.Logger)
			if err != nil {
				return err
			}
			opts = append(append(opts, a.ServerOptions()...), c.opts.TLS.Credentials(c.tb, pki.Master(n.ID)).ServerOption())
		}
		n.grpcServer = grpc.NewServer(append(opts, grpc.ChainUnaryInterceptor(n.holdWhileStopped))...)
		masterpb.RegisterMasterServer(n.grpcServer, server.New(s, cfg.Logger))
		n.serveDone = make(chan struct{})
		go func(gs *grpc.Server, done chan struct{}) {
			defer close(done)
			_ = gs.Serve(lis)
		}(n.grpcServer, n.serveDone)
	}
	return nil
}

// Join adds n to the cluster through the current leader. Join is idempotent, so it is retried
// whatever leadership does meanwhile.
func (c *Cluster) Join(ctx context.Context, n *Node) error {
	return retryOnLeaderChange(ctx, c, true, func(leader *Node) error {
		return leader.Store.Join(ctx, n.ID, n.RaftAddr, n.APIAddr)
	})
}

// leader returns an alive replica other than except that is leader now, or nil.
func (c *Cluster) leader(except *Node) *Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.Nodes {
		if n != except && n.alive && n.Store.IsLeader() {
			return n
		}
	}
	return nil
}

// Leader waits until an alive replica is leader and returns it.
func (c *Cluster) Leader(ctx context.Context) (*Node, error) {
	return c.LeaderExcept(ctx, nil)
}

// LeaderExcept waits until an alive replica other than except is leader and returns it: after
// cutting a leader off, the others elect a successor while the old one may still believe it
// leads until its lease runs out.
func (c *Cluster) LeaderExcept(ctx context.Context, except *Node) (*Node, error) {
	for {
		if n := c.leader(except); n != nil {
			return n, nil
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("waiting for a leader: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// Alive reports whether the replica runs.
func (c *Cluster) Alive(n *Node) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return n.alive
}

// Followers returns the alive replicas that are not the given leader.
func (c *Cluster) Followers(leader *Node) []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*Node
	for _, n := range c.Nodes {
		if n.alive && n != leader {
			out = append(out, n)
		}
	}
	return out
}

// Apply applies a command through whichever replica leads, retrying while leadership moves.
// A command that may have been applied before an error (ErrLeadershipLost, a timeout) is not
// retried: the error is returned.
func (c *Cluster) Apply(ctx context.Context, cmd *masterpb.Command) (proto.Message, error) {
	return c.apply(ctx, cmd, false)
}

// ApplyIdempotent is Apply for a command whose repetition is harmless (a create with a client
// token, a registration, a block commit): it is retried after outcomes that are unknown too, so
// a test setup survives an election on a loaded machine.
func (c *Cluster) ApplyIdempotent(ctx context.Context, cmd *masterpb.Command) (proto.Message, error) {
	return c.apply(ctx, cmd, true)
}

func (c *Cluster) apply(ctx context.Context, cmd *masterpb.Command, idempotent bool) (proto.Message, error) {
	var resp proto.Message
	err := retryOnLeaderChange(ctx, c, idempotent, func(leader *Node) error {
		var err error
		resp, err = leader.Store.Apply(ctx, cmd)
		return err
	})
	return resp, err
}

func retryOnLeaderChange(ctx context.Context, c *Cluster, idempotent bool, fn func(*Node) error) error {
	for {
		leader, err := c.Leader(ctx)
		if err != nil {
			return err
		}
		err = fn(leader)
		retry := errors.Is(err, store.ErrNotLeader) ||
			(idempotent && (errors.Is(err, store.ErrLeadershipLost) || errors.Is(err, store.ErrShutdown)))
		if !retry {
			return err
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last error: %w)", ctx.Err(), err)
		case <-t.C:
		}
	}
}

// Kill stops a replica abruptly: its gRPC server drops connections, its Raft stops and its
// peers can no longer reach it. Its directory stays for Restart.
func (c *Cluster) Kill(n *Node) {
	c.tb.Helper()
	c.mu.Lock()
	if !n.alive {
		c.mu.Unlock()
		return
	}
	n.alive = false
	c.mu.Unlock()
	if n.grpcServer != nil {
		n.grpcServer.Stop()
		<-n.serveDone
		n.grpcServer = nil
	}
	c.mu.Lock()
	for _, other := range c.Nodes {
		if other != n && other.inmem != nil {
			other.inmem.Disconnect(raft.ServerAddress(n.RaftAddr))
		}
	}
	c.mu.Unlock()
	if err := n.Store.Close(); err != nil {
		c.tb.Errorf("closing %s: %v", n.ID, err)
	}
}

// Restart starts a killed replica again from its directory.
func (c *Cluster) Restart(n *Node) {
	c.tb.Helper()
	if err := c.start(n); err != nil {
		c.tb.Fatalf("restarting %s: %v", n.ID, err)
	}
}

// Wipe kills a replica and empties its directory, as when a pod is rescheduled onto a new
// volume.
func (c *Cluster) Wipe(n *Node) {
	c.tb.Helper()
	c.Kill(n)
	entries, err := os.ReadDir(n.Dir)
	if err != nil {
		c.tb.Fatalf("wiping %s: %v", n.ID, err)
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(n.Dir, e.Name())); err != nil {
			c.tb.Fatalf("wiping %s: %v", n.ID, err)
		}
	}
}

// Partition cuts a replica off from all others (in both directions); Inmem transport only.
func (c *Cluster) Partition(n *Node) {
	c.tb.Helper()
	if n.inmem == nil {
		c.tb.Fatal("partitions need the Inmem transport")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n.inmem.DisconnectAll()
	for _, other := range c.Nodes {
		if other != n && other.inmem != nil {
			other.inmem.Disconnect(raft.ServerAddress(n.RaftAddr))
		}
	}
}

// Stop makes a replica stop answering while its process lives on, as a stopped node does (a
// frozen VM, a pulled cable, SIGSTOP): its Raft traffic is cut, and its API calls hang on
// connections that stay open, until Resume. Inmem transport only.
func (c *Cluster) Stop(n *Node) {
	c.tb.Helper()
	c.Partition(n)
	n.stoppedMu.Lock()
	defer n.stoppedMu.Unlock()
	if n.stopped == nil {
		n.stopped = make(chan struct{})
	}
}

// Resume lets a stopped replica answer again and reconnects it.
func (c *Cluster) Resume(n *Node) {
	n.stoppedMu.Lock()
	if n.stopped != nil {
		close(n.stopped)
		n.stopped = nil
	}
	n.stoppedMu.Unlock()
	c.Heal(n)
}

// AskVote sends to's replica a vote request of term as from's candidate, with a log ahead of
// any, and reports whether it was granted; Inmem transport only.
func (c *Cluster) AskVote(from, to *Node, term uint64) (bool, error) {
	if from.inmem == nil {
		return false, errors.New("asking for votes needs the Inmem transport")
	}
	req := &raft.RequestVoteRequest{
		RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte(from.ID), Addr: []byte(from.RaftAddr)},
		Term:      term, LastLogIndex: math.MaxUint32, LastLogTerm: term,
	}
	var resp raft.RequestVoteResponse
	err := from.inmem.RequestVote(raft.ServerID(to.ID), raft.ServerAddress(to.RaftAddr), req, &resp)
	return resp.Granted, err
}

// Heal reconnects a partitioned replica to the alive others.
func (c *Cluster) Heal(n *Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, other := range c.Nodes {
		if other != n && other.alive && other.inmem != nil {
			n.inmem.Connect(raft.ServerAddress(other.RaftAddr), other.inmem)
			other.inmem.Connect(raft.ServerAddress(n.RaftAddr), n.inmem)
		}
	}
}

// WaitConverged waits until every alive replica applied the leader's last applied index.
func (c *Cluster) WaitConverged(ctx context.Context) error {
	// A verified leader's applied index covers everything committed so far. Leadership may move
	// meanwhile on a loaded machine: ask again.
	var leader *Node
	if err := retryOnLeaderChange(ctx, c, true, func(n *Node) error {
		leader = n
		return n.Store.VerifyRead(ctx)
	}); err != nil {
		return err
	}
	idx := leader.Store.AppliedIndex()
	for _, n := range c.Nodes {
		if c.Alive(n) {
			if err := n.Store.WaitForApplied(ctx, idx); err != nil {
				return err
			}
		}
	}
	return nil
}

// APIAddrs returns the gRPC addresses of all replicas, alive or not.
func (c *Cluster) APIAddrs() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.APIAddr)
	}
	return out
}

// Client returns a client of the cluster's gRPC servers, closed when the test ends.
func (c *Cluster) Client() *client.Client {
	c.tb.Helper()
	if !c.opts.GRPC {
		c.tb.Fatal("Client needs Options.GRPC")
	}
	return c.ClientAs(pki.Operator())
}

// ClientAs returns a client that, with Options.TLS, speaks as id; without, in plaintext. The
// client is closed when the test ends.
func (c *Cluster) ClientAs(id pki.Identity) *client.Client {
	c.tb.Helper()
	if !c.opts.GRPC {
		c.tb.Fatal("ClientAs needs Options.GRPC")
	}
	opts := client.Options{AttemptTimeout: time.Second, Logger: c.opts.Logger}
	if c.opts.TLS != nil {
		opts.DialOptions = []grpc.DialOption{c.opts.TLS.Credentials(c.tb, id).DialOption(pki.RoleMaster)}
	}
	cl, err := client.New(c.APIAddrs(), opts)
	if err != nil {
		c.tb.Fatal(err)
	}
	c.tb.Cleanup(func() { _ = cl.Close() })
	return cl
}

// Close stops every replica.
func (c *Cluster) Close() {
	for _, n := range c.Nodes {
		c.Kill(n)
	}
}
