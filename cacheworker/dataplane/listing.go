package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/cacheworker/listings"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// listingChunk is how many objects one message of a listing carries: about 100 KiB.
const listingChunk = 1000

// ServeListings makes the server answer GetListing with the listings kept in store; mounted
// says whether this worker mounts a Dataset now, for the requests of a mount's listing only
// (nil: it mounts none).
func (s *Server) ServeListings(store *listings.Store, mounted func(uid string) bool) {
	s.listings, s.mounted = store, mounted
}

// GetListing streams the listing this worker keeps of a Dataset's source. The listing of a
// Dataset it mounts is the one its mount shows: every listing the mount takes (at its mount,
// at each sync) is kept before the tree changes to it.
func (s *Server) GetListing(req *workerpb.GetListingRequest, stream workerpb.Worker_GetListingServer) error {
	if s.listings == nil {
		return status.Error(codes.NotFound, "this worker keeps no listings")
	}
	if req.GetMountedOnly() && (s.mounted == nil || !s.mounted(req.GetUid())) {
		return status.Errorf(codes.NotFound, "Dataset %s is not mounted here", req.GetUid())
	}
	l, err := s.listings.Load(req.GetUid())
	switch {
	case errors.Is(err, listings.ErrNotFound):
		return status.Errorf(codes.NotFound, "no listing of Dataset %s kept here", req.GetUid())
	case err != nil:
		return status.Error(codes.Internal, err.Error())
	}
	first := true
	for chunk := range slices.Chunk(l.Objects, listingChunk) {
		msg := &workerpb.GetListingResponse{Objects: make([]*workerpb.ListedObject, len(chunk))}
		if first {
			msg.TakenUnixNano, first = l.Taken.UnixNano(), false
		}
		for i, o := range chunk {
			msg.Objects[i] = &workerpb.ListedObject{Path: o.Path, Size: o.Size, ModTimeUnixNano: o.ModTime.UnixNano(), Etag: o.ETag}
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
	}
	if first { // no object at all: the time alone
		return stream.Send(&workerpb.GetListingResponse{TakenUnixNano: l.Taken.UnixNano()})
	}
	return nil
}

// GetListing fetches the listing the worker at addr keeps of Dataset uid (with mountedOnly,
// only if it mounts the Dataset now); listings.ErrNotFound if it keeps none.
func (p *Peers) GetListing(ctx context.Context, addr, uid string, mountedOnly bool) (listings.Listing, error) {
	var l listings.Listing
	err := p.VisitListing(ctx, addr, uid, mountedOnly, ListingVisitor{
		Taken:  func(t time.Time) bool { l.Taken = t; return true },
		Object: func(o understore.ObjectInfo) { l.Objects = append(l.Objects, o) },
	})
	if err != nil {
		return listings.Listing{}, err
	}
	return l, nil
}

// ListingVisitor takes a listing as it streams in, so that a caller that needs a part of a
// large listing never holds all of it: Taken first, with when the listing was taken (false
// stops the stream there), then Object for each object.
type ListingVisitor struct {
	Taken  func(time.Time) bool
	Object func(understore.ObjectInfo)
}

// VisitListing streams the listing GetListing fetches into v.
func (p *Peers) VisitListing(ctx context.Context, addr, uid string, mountedOnly bool, v ListingVisitor) error {
	stub, err := p.stub(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := stub.GetListing(ctx, &workerpb.GetListingRequest{Uid: uid, MountedOnly: mountedOnly})
	if err != nil {
		return listingError(uid, addr, err)
	}
	for first := true; ; first = false {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if first {
				return fmt.Errorf("the listing of %s from %s is empty, not even its time", uid, addr)
			}
			return nil
		}
		if err != nil {
			return listingError(uid, addr, err)
		}
		if first && v.Taken != nil && !v.Taken(time.Unix(0, msg.GetTakenUnixNano())) {
			return nil
		}
		if v.Object == nil {
			continue
		}
		for _, o := range msg.GetObjects() {
			v.Object(understore.ObjectInfo{Path: o.GetPath(), Size: o.GetSize(), ModTime: time.Unix(0, o.GetModTimeUnixNano()), ETag: o.GetEtag()})
		}
	}
}

func listingError(uid, addr string, err error) error {
	if status.Code(err) == codes.NotFound {
		return fmt.Errorf("worker %s: Dataset %s: %w", addr, uid, listings.ErrNotFound)
	}
	return fmt.Errorf("fetching the listing of %s from %s: %w", uid, addr, err)
}

// PoolListings finds a Dataset's listing at the other workers of a pool (listings.Peers).
type PoolListings struct {
	Peers *Peers
	// Workers returns the data-plane addresses of the pool's other live workers, by id.
	Workers func(ctx context.Context) (map[string]string, error)
}

// workers returns the pool's other live workers: their addresses by id, and the ids in order.
func (p PoolListings) workers(ctx context.Context) (map[string]string, []string, error) {
	workers, err := p.Workers(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("finding the pool's other workers: %w", err)
	}
	ids := make([]string, 0, len(workers))
	for id := range workers {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return workers, ids, nil
}

// Current implements listings.Peers: the listing of a mount of the Dataset that another worker
// serves now. Every mount of the pool shows that one tree, so the first worker that has one
// answers.
func (p PoolListings) Current(ctx context.Context, uid string) (listings.Listing, string, error) {
	workers, ids, err := p.workers(ctx)
	if err != nil {
		return listings.Listing{}, "", err
	}
	var errs []error
	for _, id := range ids {
		l, err := p.Peers.GetListing(ctx, workers[id], uid, true)
		if err == nil {
			return l, id, nil
		}
		if !errors.Is(err, listings.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return listings.Listing{}, "", errors.Join(errs...)
	}
	return listings.Listing{}, "", fmt.Errorf("none of the pool's %d other live worker(s) mounts Dataset %s: %w", len(ids), uid, listings.ErrNotFound)
}

// ListingAt implements listings.Peers.
func (p PoolListings) ListingAt(ctx context.Context, addr, uid string) (listings.Listing, error) {
	return p.Peers.GetListing(ctx, addr, uid, false)
}

// Listing implements listings.Peers: the newest listing any of the workers keeps.
func (p PoolListings) Listing(ctx context.Context, uid string) (listings.Listing, string, error) {
	workers, ids, err := p.workers(ctx)
	if err != nil {
		return listings.Listing{}, "", err
	}
	var (
		best     listings.Listing
		bestFrom string
		errs     []error
	)
	for _, id := range ids {
		l, err := p.Peers.GetListing(ctx, workers[id], uid, false)
		if err != nil {
			if !errors.Is(err, listings.ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		if bestFrom == "" || l.Taken.After(best.Taken) {
			best, bestFrom = l, id
		}
	}
	if bestFrom != "" {
		return best, bestFrom, nil
	}
	if len(errs) > 0 {
		return listings.Listing{}, "", errors.Join(errs...)
	}
	return listings.Listing{}, "", fmt.Errorf("none of the pool's %d other live worker(s) keeps a listing of Dataset %s: %w", len(ids), uid, listings.ErrNotFound)
}
