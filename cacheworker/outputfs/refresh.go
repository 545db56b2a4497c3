package outputfs

import (
	"context"
	"path"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/master/masterpb"
)

// A mount shows what other nodes seal after it was made, and lets go of what the master
// forgot: a file lost with its node is forgotten when its Lineage recomputes it, and sealed
// again, under a new token, by the recomputation. Reads of the master here may be stale
// (a stale answer costs a retry by the reader, never wrong bytes: blocks are named by token).

// fetch adds name to d if the master has a file or a folder of that path. It asks once: a
// name no node made (every file a writer creates is looked up first) costs one read.
func (o *output) fetch(ctx context.Context, t *tree, d *node, name string) *node {
	mctx, cancel := o.masterContext(ctx)
	defer cancel()
	p := o.masterPath(path.Join(t.rel(d), name))
	entry, err := o.cfg.Master.Lookup(mctx, &masterpb.LookupRequest{Path: p, StaleOk: true})
	switch {
	case status.Code(err) == codes.NotFound:
		return nil
	case err != nil:
		o.log.Info("cannot ask the master for a file or folder made elsewhere; it stays hidden for now", "path", p, "error", err.Error())
		return nil
	case entry.GetDir():
		return o.addDir(t, d, name, time.Now())
	case entry.GetFile() != nil:
		return o.addFile(t, d, name, entry.GetFile())
	}
	return nil
}

// refreshDir adds to d what the master lists in it and d lacks.
func (o *output) refreshDir(ctx context.Context, t *tree, d *node) {
	mctx, cancel := o.masterContext(ctx)
	defer cancel()
	dir := strings.TrimSuffix(o.masterPath(t.rel(d)), "/")
	after := ""
	for {
		resp, err := o.cfg.Master.ListFiles(mctx, &masterpb.ListFilesRequest{Dir: dir, StartAfter: after, StaleOk: true})
		if err != nil {
			if status.Code(err) != codes.NotFound {
				o.log.Info("cannot list a folder at the master; showing what this node knows", "dir", dir, "error", err.Error())
			}
			return
		}
		for _, e := range resp.GetEntries() {
			name := path.Base(e.GetPath())
			if t.child(d, name) != nil || reserved(d, name) {
				continue
			}
			if e.GetDir() {
				o.addDir(t, d, name, time.Now())
			} else if e.GetFile() != nil {
				o.addFile(t, d, name, e.GetFile())
			}
		}
		if after = resp.GetNextStartAfter(); after == "" {
			return
		}
	}
}

// addDir adds the folder name, sealed files' parent, to d, and returns what d has of that name.
func (o *output) addDir(t *tree, d *node, name string, mtime time.Time) *node {
	n, _, err := t.add(d, name, true, nodeState{Mode: sealedDirMode, MtimeNs: mtime.UnixNano()}, nil, 0)
	if err != nil {
		o.log.Error(err, "adding a folder sealed elsewhere; it stays hidden for now", "name", name)
		return nil
	}
	return n
}

// addFile adds the sealed file name, as the master records f, to d: read-only, owned by root.
// It returns what d has of that name.
func (o *output) addFile(t *tree, d *node, name string, f *masterpb.File) *node {
	if !validToken(f.GetClientToken()) || f.GetAttempt() != "" {
		return nil // not written through an output mount; or an attempt's, not published yet
	}
	st := nodeState{Mode: sealedMode, MtimeNs: f.GetModifiedUnixNano(), Token: f.GetClientToken(), Size: f.GetSize(), Sealed: true}
	n, _, err := t.add(d, name, false, st, nil, 0)
	if err != nil {
		o.log.Error(err, "adding a file sealed elsewhere; it stays hidden for now", "name", name)
		return nil
	}
	return n
}

// published notes that n's attempt was published: n is the Dataset's now, and if the master
// forgets it, it was lost, not discarded. n.mu is held.
func (fsys *fileSystem) published(n *node) {
	old := n.state
	n.state.Attempt, n.state.Writer = "", ""
	if err := fsys.t.save(n, 0); err != nil {
		n.state = old
		fsys.o.log.Error(err, "recording that a file's attempt was published")
	}
}

// check compares a sealed file with the master's record: gone means the master forgot it (it
// was lost, and is being recomputed); changed means another writer sealed it again since, and
// the node now shows that version. n.mu is held.
func (fsys *fileSystem) check(ctx context.Context, n *node) (gone, changed bool) {
	o := fsys.o
	mctx, cancel := o.masterContext(ctx)
	defer cancel()
	f, err := o.cfg.Master.GetFile(mctx, &masterpb.GetFileRequest{Path: o.masterPath(fsys.t.rel(n)), StaleOk: true})
	switch {
	case status.Code(err) == codes.NotFound:
		return true, false
	case err != nil:
		return false, false // the master is away: serve what this node knows
	case !validToken(f.GetClientToken()):
		return false, false
	case f.GetAttempt() != "" && f.GetClientToken() != n.state.Token:
		// Another attempt's file took the place of n's version (n was an attempt's too),
		// which its attempt's settling discards.
		return true, false
	case n.state.Attempt != "" && f.GetAttempt() == "" && f.GetClientToken() == n.state.Token:
		fsys.published(n)
	}
	return false, fsys.adoptLocked(n, f)
}
