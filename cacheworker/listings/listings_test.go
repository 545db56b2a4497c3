package listings

import (
	"context"
	"errors"
	"iter"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/cacheworker/understore"
)

// source lists fixed objects, or fails with err after them.
type source struct {
	objects []understore.ObjectInfo
	err     error
}

func (s source) List(context.Context, string) iter.Seq2[understore.ObjectInfo, error] {
	return func(yield func(understore.ObjectInfo, error) bool) {
		for _, o := range s.objects {
			if !yield(o, nil) {
				return
			}
		}
		if s.err != nil {
			yield(understore.ObjectInfo{}, s.err)
		}
	}
}

// peers keeps one listing, as another node of the pool would, and shows one in a mount.
type peers struct {
	kept  map[string]Listing
	asked int
	// shown are the listings the peers' mounts show; currentErr fails every question of them.
	shown      map[string]Listing
	currentErr error
}

func (p *peers) ListingAt(_ context.Context, addr, uid string) (Listing, error) {
	if addr != "node-c:7100" {
		return Listing{}, ErrNotFound
	}
	l, ok := p.shown[uid]
	if !ok {
		return Listing{}, ErrNotFound
	}
	return l, nil
}

func (p *peers) Current(_ context.Context, uid string) (Listing, string, error) {
	if p.currentErr != nil {
		return Listing{}, "", p.currentErr
	}
	l, ok := p.shown[uid]
	if !ok {
		return Listing{}, "", ErrNotFound
	}
	return l, "pool/node-c", nil
}

func (p *peers) Listing(_ context.Context, uid string) (Listing, string, error) {
	p.asked++
	l, ok := p.kept[uid]
	if !ok {
		return Listing{}, "", ErrNotFound
	}
	return l, "pool/node-b", nil
}

var (
	t0      = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	objects = []understore.ObjectInfo{
		{Path: "a.txt", Size: 3, ModTime: t0, ETag: "e-a"},
		{Path: "dir/b.bin", Size: 1 << 20, ModTime: t0.Add(time.Second), ETag: "e-b"},
	}
	unreachable = &understore.Error{Op: "list", Store: "s3://bucket/", Kind: understore.ErrUnreachable, Err: syscall.ECONNREFUSED}
	denied      = &understore.Error{Op: "list", Store: "s3://bucket/", Kind: understore.ErrAccessDenied, Err: errors.New("AccessDenied")}
)

func listAll(l *Lister) ([]understore.ObjectInfo, error) {
	var out []understore.ObjectInfo
	for o, err := range l.List(context.Background(), "") {
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

func TestAListingIsKeptWholeAndReadBack(t *testing.T) {
	g := NewWithT(t)
	s, err := Open(filepath.Join(t.TempDir(), "listings"))
	g.Expect(err).NotTo(HaveOccurred())
	_, err = s.Load("uid-1")
	g.Expect(err).To(MatchError(ErrNotFound))

	g.Expect(s.Save("uid-1", Listing{Taken: t0, Objects: objects})).To(Succeed())
	got, err := s.Load("uid-1")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(got.Taken.Equal(t0)).To(BeTrue())
	g.Expect(got.Objects).To(HaveLen(2))
	for i := range objects {
		g.Expect(got.Objects[i].Path).To(Equal(objects[i].Path))
		g.Expect(got.Objects[i].ETag).To(Equal(objects[i].ETag))
		g.Expect(got.Objects[i].Size).To(Equal(objects[i].Size))
		g.Expect(got.Objects[i].ModTime.Equal(objects[i].ModTime)).To(BeTrue())
	}
	entries, err := os.ReadDir(s.dir)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(entries).To(HaveLen(1), "no temporary file is left behind")

	g.Expect(s.Save("../escape", Listing{})).To(MatchError(ContainSubstring("not a Dataset UID")))
	_, err = Open("relative/dir")
	g.Expect(err).To(MatchError(ContainSubstring("absolute path")))
}

func TestTheListerFallsBackOnlyWhenTheSourceIsUnreachable(t *testing.T) {
	cases := []struct {
		name     string
		source   source
		fallback bool
		local    bool // this node keeps a listing
		peer     bool // another node keeps one
		want     int  // objects listed, or
		wantErr  string
		asked    int // times the peers were asked
	}{
		{name: "a good listing is served and kept", source: source{objects: objects}, fallback: true, want: 2},
		{name: "an unreachable source, this node's listing", source: source{err: unreachable}, fallback: true, local: true, peer: true, want: 2},
		{name: "an unreachable source, a peer's listing", source: source{err: unreachable}, fallback: true, peer: true, want: 2, asked: 1},
		{name: "an unreachable source and no listing anywhere", source: source{err: unreachable}, fallback: true, wantErr: "no node keeps an earlier listing", asked: 1},
		{name: "a sync never falls back", source: source{err: unreachable}, local: true, wantErr: "connection refused"},
		{name: "access denied is never answered from a listing", source: source{err: denied}, fallback: true, local: true, wantErr: "AccessDenied"},
		{name: "a listing cut short is not kept", source: source{objects: objects[:1], err: denied}, fallback: true, wantErr: "AccessDenied"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			s, err := Open(t.TempDir())
			g.Expect(err).NotTo(HaveOccurred())
			if tc.local {
				g.Expect(s.Save("uid", Listing{Taken: t0, Objects: objects})).To(Succeed())
			}
			p := &peers{kept: map[string]Listing{}}
			if tc.peer {
				p.kept["uid"] = Listing{Taken: t0, Objects: objects}
			}
			l := &Lister{Source: tc.source, UID: "uid", Store: s, Peers: p, Fallback: tc.fallback, Log: logr.Discard()}
			got, err := listAll(l)
			g.Expect(p.asked).To(Equal(tc.asked), "the peers asked")
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				if !tc.local {
					_, err := s.Load("uid")
					g.Expect(err).To(MatchError(ErrNotFound), "nothing kept")
				}
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(HaveLen(tc.want))
			kept, err := s.Load("uid")
			g.Expect(err).NotTo(HaveOccurred(), "the listing served is kept on this node")
			g.Expect(kept.Objects).To(HaveLen(tc.want))
		})
	}
}

func TestANewMountShowsTheTreeAPeersMountShows(t *testing.T) {
	shown := Listing{Taken: t0.Add(-time.Hour), Objects: objects[:1]} // older than the source's state
	cases := []struct {
		name       string
		current    bool
		shown      bool
		currentErr error
		source     source
		want       []understore.ObjectInfo
		wantErr    string
	}{
		{name: "a peer mounts it: its tree, the source untouched", current: true, shown: true, source: source{err: denied}, want: objects[:1]},
		{name: "no peer mounts it: the source's", current: true, source: source{objects: objects}, want: objects},
		{name: "the peers cannot be asked: the source's", current: true, currentErr: errors.New("master down"), source: source{objects: objects}, want: objects},
		{name: "no peer mounts it, and the source refuses", current: true, source: source{err: denied}, wantErr: "AccessDenied"},
		{name: "a sync lists the source even when a peer mounts it", shown: true, source: source{objects: objects}, want: objects},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			s, err := Open(t.TempDir())
			g.Expect(err).NotTo(HaveOccurred())
			p := &peers{kept: map[string]Listing{}, shown: map[string]Listing{}, currentErr: tc.currentErr}
			if tc.shown {
				p.shown["uid"] = shown
			}
			l := &Lister{Source: tc.source, UID: "uid", Store: s, Peers: p, Current: tc.current, Log: logr.Discard()}
			got, err := listAll(l)
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
			kept, err := s.Load("uid")
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(kept.Objects).To(Equal(tc.want), "what the mount shows is kept, for the next node to take")
		})
	}
}

func TestASyncTakesTheListingAnotherWorkerTook(t *testing.T) {
	cases := map[string]struct {
		addr string
		want []understore.ObjectInfo
	}{
		"that worker's listing, though the source has more": {addr: "node-c:7100", want: objects[:1]},
		"that worker keeps none: the source's":              {addr: "node-d:7100", want: objects},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			p := &peers{shown: map[string]Listing{"uid": {Taken: t0, Objects: objects[:1]}}}
			from := FromPeer{Peers: p, Addr: tc.addr, UID: "uid", Source: source{objects: objects}, Log: logr.Discard()}
			got, err := listAll(&Lister{Source: from, UID: "uid", Peers: p, Log: logr.Discard()})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(tc.want))
		})
	}
}
