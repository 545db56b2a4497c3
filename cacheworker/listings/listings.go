// Package listings keeps, on each node, the last good listing of the source of every Dataset
// the node mounted, so that a Dataset can still be mounted while its source is unreachable:
// from this node's copy, or from a peer's (a node that never mounted the Dataset asks the
// pool's other workers). A cache must serve what it holds when its store is down; without a
// listing a mount has no tree to serve it in.
//
// The listings also give a Dataset one tree on every node: a node that mounts a Dataset
// another node mounts takes that node's listing instead of listing the source itself (Lister's
// Current), so that both show the same files at the same sizes and versions until the next
// sync, which gives every node one listing again.
//
// A listing is kept per Dataset UID in a file of its own (gob), written whole to a temporary
// file and renamed into place, so that a crash leaves the old listing or the new one, never a
// torn one. Only a listing that ran to its end is kept.
package listings

import (
	"bufio"
	"context"
	"encoding/gob"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/strata-cache/strata/cacheworker/understore"
)

// ErrNotFound means no listing of that Dataset is kept.
var ErrNotFound = errors.New("no listing kept")

// Listing is one complete listing of a Dataset's source.
type Listing struct {
	// Taken is when the listing ended.
	Taken   time.Time
	Objects []understore.ObjectInfo
}

// Store keeps listings in a folder of the node.
type Store struct {
	dir string
}

// Open returns a Store of dir, creating it if need be.
func Open(dir string) (*Store, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("the listings folder must be an absolute path, got %q", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the listings folder: %w", err)
	}
	return &Store{dir: dir}, nil
}

// uidPattern is a Kubernetes UID: it names a file, so no "/" or "." gets into a path.
var uidPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9-]{0,127}$`)

func (s *Store) path(uid string) (string, error) {
	if !uidPattern.MatchString(uid) {
		return "", fmt.Errorf("%q is not a Dataset UID", uid)
	}
	return filepath.Join(s.dir, uid+".gob"), nil
}

// Save keeps l as the listing of Dataset uid, replacing the one kept before.
func (s *Store) Save(uid string, l Listing) error {
	p, err := s.path(uid)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(s.dir, uid+".*.tmp")
	if err != nil {
		return fmt.Errorf("keeping the listing of %s: %w", uid, err)
	}
	w := bufio.NewWriter(tmp)
	err = gob.NewEncoder(w).Encode(l)
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("keeping the listing of %s: %w", uid, err)
	}
	return nil
}

// Remove drops the listing kept of Dataset uid, if one is: the Dataset is deleted.
func (s *Store) Remove(uid string) error {
	p, err := s.path(uid)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("dropping the listing of %s: %w", uid, err)
	}
	return nil
}

// Load returns the listing kept of Dataset uid, ErrNotFound if none is.
func (s *Store) Load(uid string) (Listing, error) {
	p, err := s.path(uid)
	if err != nil {
		return Listing{}, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return Listing{}, fmt.Errorf("%w of Dataset %s", ErrNotFound, uid)
	}
	if err != nil {
		return Listing{}, fmt.Errorf("reading the listing of %s: %w", uid, err)
	}
	defer func() { _ = f.Close() }()
	var l Listing
	if err := gob.NewDecoder(bufio.NewReader(f)).Decode(&l); err != nil {
		return Listing{}, fmt.Errorf("reading the listing of %s: %w", uid, err)
	}
	return l, nil
}

// Peers finds the listing of a Dataset that another node keeps.
type Peers interface {
	// Listing returns a listing of Dataset uid that some other worker of the pool keeps, with
	// which worker it came from, or ErrNotFound if none does.
	Listing(ctx context.Context, uid string) (l Listing, from string, err error)
	// Current returns the listing of a mount of Dataset uid that another worker of the pool
	// serves now, with which worker it came from, or ErrNotFound if none mounts it.
	Current(ctx context.Context, uid string) (l Listing, from string, err error)
	// ListingAt returns the listing the worker at addr keeps of Dataset uid, ErrNotFound if
	// it keeps none.
	ListingAt(ctx context.Context, addr, uid string) (Listing, error)
}

// FromPeer is a Source that answers with the listing the worker at Addr keeps of Dataset UID,
// which it took a moment ago, instead of listing the source again: a sync makes every node show
// that one listing. Should the worker keep none, the source is listed after all.
type FromPeer struct {
	Peers  Peers
	Addr   string
	UID    string
	Source Source
	Log    logr.Logger
}

// List implements Source.
func (f FromPeer) List(ctx context.Context, prefix string) iter.Seq2[understore.ObjectInfo, error] {
	return func(yield func(understore.ObjectInfo, error) bool) {
		l, err := f.Peers.ListingAt(ctx, f.Addr, f.UID)
		if err != nil {
			f.Log.Error(err, "taking the listing another worker synced; listing the source instead", "worker", f.Addr)
			for o, err := range f.Source.List(ctx, prefix) {
				if !yield(o, err) {
					return
				}
			}
			return
		}
		for _, o := range l.Objects {
			if strings.HasPrefix(o.Path, prefix) && !yield(o, nil) {
				return
			}
		}
	}
}

// Source is what a Lister lists: the Dataset's under-store.
type Source interface {
	List(ctx context.Context, prefix string) iter.Seq2[understore.ObjectInfo, error]
}

// Lister lists a Dataset's source for its mount, keeping every listing that runs to its end,
// and, with Fallback set, answers with the last good listing (this node's, or a peer's) when the
// source is unreachable, saying so in the log. Other failures (access denied, no such bucket)
// are the store's to report: a cache never serves data its source refuses to vouch for.
type Lister struct {
	Source Source
	UID    string
	// Store keeps the listings on this node; nil keeps none.
	Store *Store
	// Peers, if set, is asked when this node keeps no listing.
	Peers Peers
	// Fallback answers an unreachable source with the last good listing. A sync must not: it
	// would find nothing changed while nothing could be looked at.
	Fallback bool
	// Current takes the listing a peer's mount shows (Peers.Current), when one does, instead of
	// listing the source: a new mount joins the tree the other nodes show. A sync must not: it
	// is there to list the source afresh.
	Current bool
	Log     logr.Logger
}

// List implements the listing a mount and a sync use. The prefix must be "" (a mount lists
// the whole source).
func (l *Lister) List(ctx context.Context, prefix string) iter.Seq2[understore.ObjectInfo, error] {
	return func(yield func(understore.ObjectInfo, error) bool) {
		if prefix != "" {
			yield(understore.ObjectInfo{}, fmt.Errorf("a Dataset's listing is of the whole source, not of %q", prefix))
			return
		}
		objects, err := l.list(ctx)
		if err != nil {
			yield(understore.ObjectInfo{}, err)
			return
		}
		for _, o := range objects {
			if !yield(o, nil) {
				return
			}
		}
	}
}

func (l *Lister) list(ctx context.Context) ([]understore.ObjectInfo, error) {
	if objects, ok := l.current(ctx); ok {
		return objects, nil
	}
	var objects []understore.ObjectInfo
	var listErr error
	for o, err := range l.Source.List(ctx, "") {
		if err != nil {
			listErr = err
			break
		}
		objects = append(objects, o)
	}
	if listErr == nil {
		listErr = ctx.Err()
	}
	if listErr == nil {
		if l.Store != nil {
			if err := l.Store.Save(l.UID, Listing{Taken: time.Now(), Objects: objects}); err != nil {
				// The mount goes on; only a later outage finds no listing here.
				l.Log.Error(err, "keeping the source's listing for outages")
			}
		}
		return objects, nil
	}
	if !l.Fallback || !errors.Is(listErr, understore.ErrUnreachable) {
		return nil, listErr
	}
	kept, from, err := l.lastGood(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w; and no node keeps an earlier listing of it: %w", listErr, err)
	}
	l.Log.Info("the source is unreachable: serving the last good listing, whose files read as far as they are cached",
		"error", listErr.Error(), "listingFrom", from, "listingTaken", kept.Taken, "objects", len(kept.Objects))
	return kept.Objects, nil
}

// current is the listing a peer's mount of the Dataset shows, if Current is set and a peer
// mounts it; kept here as this node's listing.
func (l *Lister) current(ctx context.Context) ([]understore.ObjectInfo, bool) {
	if !l.Current || l.Peers == nil {
		return nil, false
	}
	shown, from, err := l.Peers.Current(ctx, l.UID)
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			// The source is listed instead: a tree of its own, rather than no mount.
			l.Log.Error(err, "asking the pool's other workers for the tree their mounts show; listing the source")
		}
		return nil, false
	}
	if l.Store != nil {
		if err := l.Store.Save(l.UID, shown); err != nil {
			// Without it kept here, a peer mounting later would not find this mount's tree.
			l.Log.Error(err, "keeping the listing of a peer's mount")
		}
	}
	l.Log.Info("showing the tree the pool's other nodes show", "listingFrom", from, "listingTaken", shown.Taken, "objects", len(shown.Objects))
	return shown.Objects, true
}

// lastGood is the listing this node keeps, or else one a peer keeps (kept here from then on).
func (l *Lister) lastGood(ctx context.Context) (Listing, string, error) {
	if l.Store != nil {
		kept, err := l.Store.Load(l.UID)
		if err == nil {
			return kept, "this node", nil
		}
		if !errors.Is(err, ErrNotFound) {
			return Listing{}, "", err
		}
	}
	if l.Peers == nil {
		return Listing{}, "", fmt.Errorf("%w of Dataset %s on this node, and no peer to ask", ErrNotFound, l.UID)
	}
	kept, from, err := l.Peers.Listing(ctx, l.UID)
	if err != nil {
		return Listing{}, "", err
	}
	if l.Store != nil {
		if err := l.Store.Save(l.UID, kept); err != nil {
			l.Log.Error(err, "keeping a peer's listing of the source")
		}
	}
	return kept, "worker " + from, nil
}
