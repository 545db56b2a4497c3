package store

import (
	"errors"
	"math"
	"sync"

	"github.com/go-logr/logr"
	"github.com/hashicorp/raft"
)

// voteFence keeps a replica that started on an empty disk from giving a vote it may have given
// already. Raft's safety rests on a server voting at most once per term, and the vote is kept
// on disk: a replica whose volume was wiped (a pod rescheduled onto a fresh volume) comes back
// under the same id and address, remembering nothing, and the other replicas' candidates ask
// it again. So, until the replica learns how far the cluster's terms went, it refuses every vote
// (and pre-vote) request; then it refuses those of any term up to its floor, the highest term
// a peer reported when it probed them (cluster.Start) or the term of the first leader it
// follows (a leader may replicate to it before it probes: it has the same id and address as
// before), and lets raft answer the rest. Every vote the wiped replica could have given was in
// a term a peer had reached, the candidate that asked for it; the one gap is a candidate that
// started a term above the floor before the wipe, answered no probe, and still campaigns in
// that term afterwards, which pre-vote and election timeouts make vanishingly rare. A replica
// that resumes from its disk, or bootstraps a new cluster, has nothing to forget: its fence is
// open.
//
// The fence sits between the transport and raft: it reads the transport's RPCs and passes them
// on, answering the refused votes itself.
type voteFence struct {
	raft.Transport
	out  chan raft.RPC
	log  logr.Logger
	done chan struct{}
	once sync.Once

	mu    sync.Mutex
	floor uint64 // votes of terms up to it are refused; math.MaxUint64 until known
}

// errNoPreVote is RequestPreVote over a transport that does not carry pre-votes.
var errNoPreVote = errors.New("the raft transport does not carry pre-votes")

func newVoteFence(t raft.Transport, log logr.Logger) *voteFence {
	f := &voteFence{Transport: t, out: make(chan raft.RPC), log: log, done: make(chan struct{}), floor: math.MaxUint64}
	go f.run(t.Consumer())
	return f
}

// Open lets raft answer every vote: the replica's votes are on its disk, or there were none.
func (f *voteFence) Open() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.floor = 0
}

// Floor raises the highest term whose votes are refused to term, a term a peer reported; it
// never lowers it below one reported before (an open fence stays open).
func (f *voteFence) Floor(term uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch f.floor {
	case 0:
	case math.MaxUint64:
		f.floor = term
	default:
		f.floor = max(f.floor, term)
	}
}

// refuses says whether a vote request of term is answered no by the fence.
func (f *voteFence) refuses(term uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.floor != 0 && term <= f.floor
}

// Consumer is the RPCs the fence lets through.
func (f *voteFence) Consumer() <-chan raft.RPC { return f.out }

func (f *voteFence) run(in <-chan raft.RPC) {
	for {
		var rpc raft.RPC
		select {
		case rpc = <-in:
		case <-f.done:
			return
		}
		if f.answered(rpc) {
			continue
		}
		select {
		case f.out <- rpc:
		case <-f.done:
			return
		}
	}
}

// answered refuses rpc if it asks for a vote the fence holds back.
func (f *voteFence) answered(rpc raft.RPC) bool {
	switch req := rpc.Command.(type) {
	case *raft.RequestVoteRequest:
		if f.refuses(req.Term) {
			f.log.Info("refusing a vote: this replica started on an empty disk, and may have voted in that term before",
				"term", req.Term, "candidate", string(req.ID))
			rpc.Respond(&raft.RequestVoteResponse{Granted: false}, nil)
			return true
		}
	case *raft.RequestPreVoteRequest:
		if f.refuses(req.Term) {
			rpc.Respond(&raft.RequestPreVoteResponse{Granted: false}, nil)
			return true
		}
	}
	return false
}

// RequestPreVote sends a pre-vote, as the transport beneath does (raft asks for pre-votes only
// over a transport that carries them: the store's do).
func (f *voteFence) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	pv, ok := f.Transport.(raft.WithPreVote)
	if !ok {
		return errNoPreVote
	}
	return pv.RequestPreVote(id, target, args, resp)
}

// Close stops the fence and closes the transport beneath.
func (f *voteFence) Close() error {
	var err error
	f.once.Do(func() {
		close(f.done)
		if c, ok := f.Transport.(raft.WithClose); ok {
			err = c.Close()
		}
	})
	return err
}
