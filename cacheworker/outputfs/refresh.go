package outputfs

import (
	"context"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/master/masterpb"
)

// A mount shows what other nodes seal after it was made, and lets go of what the master
// forgot: a file lost with its node is forgotten when its Lineage recomputes it, and sealed
// again, under a new token, by the recomputation. Reads of the master here may be stale
// (a stale answer costs a retry by the reader, never wrong bytes: blocks are named by token).

var (
	_ fs.NodeLookuper  = (*dirNode)(nil)
	_ fs.NodeReaddirer = (*dirNode)(nil)
)

// rel is the path in the Dataset of name in d.
func (d *dirNode) rel(name string) string { return path.Join(d.Path(nil), name) }

// Lookup finds name in d: a node of this mount, or a file or folder that another node sealed
// since, which is added.
func (d *dirNode) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	child := d.GetChild(name)
	if child == nil && !d.reserved(name) {
		child = d.o.fetch(ctx, d, name)
	}
	if child == nil {
		return nil, syscall.ENOENT
	}
	var attr fuse.AttrOut
	if getter, ok := child.Operations().(fs.NodeGetattrer); ok {
		if errno := getter.Getattr(ctx, nil, &attr); errno != 0 {
			return nil, errno
		}
	}
	out.Attr = attr.Attr
	return child, 0
}

// Readdir lists d, with what other nodes sealed into it since the mount.
func (d *dirNode) Readdir(ctx context.Context) (fs.DirStream, syscall.Errno) {
	d.o.refreshDir(ctx, d)
	children := d.Children()
	names := make([]string, 0, len(children))
	for name := range children {
		names = append(names, name)
	}
	slices.Sort(names)
	entries := make([]fuse.DirEntry, 0, len(names))
	for _, name := range names {
		ch := children[name]
		entries = append(entries, fuse.DirEntry{Name: name, Mode: ch.Mode(), Ino: ch.StableAttr().Ino})
	}
	return fs.NewListDirStream(entries), 0
}

// fetch adds name to d if the master has a file or a folder of that path.
func (o *output) fetch(ctx context.Context, d *dirNode, name string) *fs.Inode {
	mctx, cancel := o.masterContext(ctx)
	defer cancel()
	p := o.masterPath(d.rel(name))
	f, err := o.cfg.Master.GetFile(mctx, &masterpb.GetFileRequest{Path: p, StaleOk: true})
	if err == nil {
		return o.addFile(ctx, d, name, f)
	}
	if status.Code(err) != codes.NotFound {
		o.log.Info("cannot ask the master for a file sealed elsewhere; it stays hidden for now", "file", p, "error", err.Error())
		return nil
	}
	resp, err := o.cfg.Master.ListFiles(mctx, &masterpb.ListFilesRequest{Dir: p, Limit: 1, StaleOk: true})
	if err != nil || len(resp.GetEntries()) == 0 {
		return nil
	}
	return o.addDir(ctx, d, name, time.Now())
}

// refreshDir adds to d what the master lists in it and d lacks.
func (o *output) refreshDir(ctx context.Context, d *dirNode) {
	mctx, cancel := o.masterContext(ctx)
	defer cancel()
	dir := strings.TrimSuffix(o.masterPath(d.Path(nil)), "/")
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
			if d.GetChild(name) != nil || d.reserved(name) {
				continue
			}
			if e.GetDir() {
				o.addDir(ctx, d, name, time.Now())
			} else if e.GetFile() != nil {
				o.addFile(ctx, d, name, e.GetFile())
			}
		}
		if after = resp.GetNextStartAfter(); after == "" {
			return
		}
	}
}

// addDir adds the folder name, sealed files' parent, to d.
func (o *output) addDir(ctx context.Context, d *dirNode, name string, mtime time.Time) *fs.Inode {
	child := d.NewPersistentInode(ctx, &dirNode{o: o, attrs: attrs{mode: 0o755, mtime: mtime}}, fs.StableAttr{Mode: syscall.S_IFDIR})
	d.AddChild(name, child, false)
	return d.GetChild(name)
}

// addFile adds the sealed file name, as the master records f, to d: read-only, owned by root.
func (o *output) addFile(ctx context.Context, d *dirNode, name string, f *masterpb.File) *fs.Inode {
	if !validToken(f.GetClientToken()) {
		return nil
	}
	n := &fileNode{o: o, attrs: attrs{mode: 0o444, mtime: time.Unix(0, f.GetModifiedUnixNano())},
		token: f.GetClientToken(), size: f.GetSize(), sealed: true}
	d.AddChild(name, d.NewPersistentInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG}), false)
	return d.GetChild(name)
}

// check compares a sealed file with the master's record: gone means the master forgot it (it
// was lost, and is being recomputed); changed means another writer sealed it again since, and
// the node now shows that version. n.mu is held.
func (n *fileNode) check(ctx context.Context) (gone, changed bool) {
	mctx, cancel := n.o.masterContext(ctx)
	defer cancel()
	f, err := n.o.cfg.Master.GetFile(mctx, &masterpb.GetFileRequest{Path: n.o.masterPath(n.Path(nil)), StaleOk: true})
	switch {
	case status.Code(err) == codes.NotFound:
		return true, false
	case err != nil:
		return false, false // the master is away: serve what this node knows
	case f.GetClientToken() == n.token || !validToken(f.GetClientToken()):
		return false, false
	}
	n.token, n.size = f.GetClientToken(), f.GetSize()
	n.attrs.mtime = time.Unix(0, f.GetModifiedUnixNano())
	return false, true
}
