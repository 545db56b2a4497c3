package fusefs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/strata-cache/strata/cacheworker/objtree"
)

// Changes is what a refresh changed in a mounted tree.
type Changes struct {
	// Added, Removed and Changed count files: new keys, keys gone, and keys whose size,
	// version or modification time differ.
	Added, Removed, Changed int
	// Replaced are the versions of files that were removed or changed: new opens no longer
	// read them, so their blocks are of no more use to this mount.
	Replaced []FileVersion
	// Files and Bytes are the tree's totals after the refresh.
	Files int
	Bytes int64
}

// None reports whether the refresh found nothing changed.
func (c Changes) None() bool { return c.Added == 0 && c.Removed == 0 && c.Changed == 0 }

// FileVersion is one version of one file of the tree.
type FileVersion struct {
	Path, ETag string
	Size       int64
	// Open is set for a replaced version that was open when the tree changed: its readers go
	// on reading it, so its blocks are better left to eviction.
	Open bool

	id uint64
}

// Refresh lists the Dataset's objects again and brings the mounted tree in line with them,
// live: new files appear, removed ones vanish and changed ones show their new size and bytes,
// and the kernel is told, so that the names, attributes and pages it caches for a long time
// (cacheTimeout) are right. Files opened before read on the version they opened (see node).
// A listing that fails changes nothing. Refreshes of one mount take turns.
//
// The tree changes first and the kernel is told after, with no lock held, since the kernel
// takes a folder's lock to drop a name and may be waiting on a lookup in that folder. A new
// Handover is needed to hand the new tree over: one made before knows only the old nodes.
func (s *Server) Refresh(ctx context.Context, objects Lister) (Changes, error) {
	s.refreshMu.Lock()
	defer s.refreshMu.Unlock()
	t, err := buildTree(ctx, objects, s.fsys.log)
	if err != nil {
		return Changes{}, err
	}
	fsys := s.fsys
	fsys.treeMu.RLock()
	u := diffTree(fsys.nodes, t)
	fsys.treeMu.RUnlock()
	if u.changes.None() && len(u.folders) == 0 {
		return u.changes, nil
	}
	// Room for the new nodes' open counts before any lookup can hand them out.
	if err := fsys.opens.grow(len(u.nodes)); err != nil {
		return Changes{}, err
	}
	fsys.treeMu.Lock()
	fsys.nodes = u.nodes
	fsys.files, fsys.bytes = u.changes.Files, u.changes.Bytes
	fsys.treeMu.Unlock()
	open := fsys.openNodes()
	for i := range u.changes.Replaced {
		u.changes.Replaced[i].Open = open[u.changes.Replaced[i].id]
	}
	s.mu.Lock()
	if s.state != nil {
		_ = s.state.Close() // handovers made from it hold their own descriptors
		s.state = nil
	}
	s.mu.Unlock()

	var errs []error
	for _, e := range u.entries {
		errs = append(errs, s.conn.InvalidateEntry(e.parent, e.name))
	}
	for _, id := range u.folders {
		errs = append(errs, s.conn.InvalidateInode(id))
	}
	if err := errors.Join(errs...); err != nil {
		// The tree is right; the kernel may show what it cached of the old one until its
		// timeouts pass. Said, not hidden: the caller counts the refresh as failed.
		return u.changes, fmt.Errorf("the tree of %s was refreshed, but the kernel may still show parts of the old one: %w", s.dir, err)
	}
	return u.changes, nil
}

// treeUpdate is a refreshed node list and what the kernel must be told of it.
type treeUpdate struct {
	nodes   []*node
	changes Changes
	// entries are the names whose node changed, appeared or vanished.
	entries []entryName
	// folders are the folders whose attributes or listings changed.
	folders []uint64
}

type entryName struct {
	parent uint64
	name   string
}

// diffTree compares a mounted node list with a new listing's tree by key, kind, size, version
// and modification time, and returns the node list that shows the new tree: unchanged nodes
// keep their ids, new files and folders get new ids at the end, removed and changed ones are
// retired (kept, for the ids the kernel holds), and changed folders are copies in place of the
// old. The old list is not touched.
func diffTree(old []*node, t *objtree.Tree) treeUpdate {
	u := &treeUpdate{nodes: slices.Clone(old)}
	u.mergeFolder(1, t.Root, "")
	u.changes.Files, u.changes.Bytes = t.Files, t.Bytes
	return *u
}

// mergeFolder brings folder id in line with entry e, whose key prefix is prefix.
func (u *treeUpdate) mergeFolder(id uint64, e *objtree.Entry, prefix string) {
	old := u.nodes[id]
	names := e.SortedNames()
	children := make([]uint64, 0, len(names))
	// added are the new entries, appended once the folder's own copy is in place.
	type addition struct {
		name  string
		entry *objtree.Entry
		// replaces is set for a changed file: counted as changed, not added.
		replaces bool
	}
	var added []addition
	changed := false
	i, j := 0, 0
	for i < len(old.children) || j < len(names) {
		var oldName string
		if i < len(old.children) {
			oldName = u.nodes[old.children[i]].name
		}
		switch {
		case j == len(names) || (i < len(old.children) && oldName < names[j]):
			u.retire(old.children[i], true)
			u.entries = append(u.entries, entryName{id, oldName})
			changed = true
			i++
		case i == len(old.children) || names[j] < oldName:
			added = append(added, addition{name: names[j], entry: e.Children[names[j]]})
			u.entries = append(u.entries, entryName{id, names[j]})
			changed = true
			j++
		default:
			childID, child, entry := old.children[i], u.nodes[old.children[i]], e.Children[names[j]]
			switch {
			case child.dir && entry.IsDir():
				u.mergeFolder(childID, entry, prefix+child.name+"/")
				children = append(children, childID)
			case !child.dir && !entry.IsDir() && sameVersion(child, entry):
				children = append(children, childID)
			default:
				// Another version, or a file that became a folder or the reverse: a new node,
				// so that no open file ever reads two versions.
				bothFiles := !child.dir && !entry.IsDir()
				if bothFiles {
					u.changes.Changed++
					u.retire(childID, false)
					u.replaced(childID, child)
				} else {
					u.retire(childID, true)
				}
				added = append(added, addition{name: names[j], entry: entry, replaces: bothFiles})
				u.entries = append(u.entries, entryName{id, names[j]})
				changed = true
			}
			i++
			j++
		}
	}
	mtime := e.MTime.UnixNano()
	if e.MTime.IsZero() {
		mtime = old.mtime // an empty root has no time of its own
	}
	if !changed && mtime == old.mtime {
		return
	}
	folder := *old
	folder.children = children
	folder.mtime = mtime
	u.nodes[id] = &folder
	u.folders = append(u.folders, id)
	for _, a := range added {
		before := len(u.nodes)
		u.nodes = appendEntry(u.nodes, id, a.name, a.entry, prefix)
		if a.replaces {
			continue
		}
		for _, n := range u.nodes[before:] {
			if !n.dir {
				u.changes.Added++
			}
		}
	}
	slices.SortFunc(folder.children, func(a, b uint64) int { return strings.Compare(u.nodes[a].name, u.nodes[b].name) })
}

// sameVersion reports whether a file node and a listed file are one version of one object.
func sameVersion(n *node, e *objtree.Entry) bool {
	return n.size == e.Size && n.etag == e.ETag && n.mtime == e.MTime.UnixNano()
}

// retire takes node id and everything below it out of the tree, counting the files it held
// as removed if count is set.
func (u *treeUpdate) retire(id uint64, count bool) {
	old := u.nodes[id]
	n := *old
	n.retired = true
	u.nodes[id] = &n
	if !n.dir {
		if count {
			u.changes.Removed++
			u.replaced(id, old)
		}
		return
	}
	for _, child := range old.children {
		u.retire(child, count)
	}
}

// replaced records a file version that new opens no longer read.
func (u *treeUpdate) replaced(id uint64, n *node) {
	u.changes.Replaced = append(u.changes.Replaced, FileVersion{Path: n.path, ETag: n.etag, Size: n.size, id: id})
}

// openNodes are the files this process knows to be open: by handles it made or was read
// through, and by passthrough opens, whichever process made them.
func (fsys *fileSystem) openNodes() map[uint64]bool {
	open := map[uint64]bool{}
	fsys.mu.Lock()
	for _, h := range fsys.handles {
		open[h.node] = true
	}
	fsys.mu.Unlock()
	fsys.opens.mu.RLock()
	for id, c := range fsys.opens.counts {
		if c.passthrough > 0 || c.cached > 0 {
			open[uint64(id)] = true
		}
	}
	fsys.opens.mu.RUnlock()
	return open
}

// FileVersions returns every file the tree shows now: its path relative to the Dataset, its
// version and its size, as the cache names its blocks.
func (s *Server) FileVersions() []FileVersion {
	s.fsys.treeMu.RLock()
	defer s.fsys.treeMu.RUnlock()
	var files []FileVersion
	for i, n := range s.fsys.nodes[1:] {
		if !n.dir && !n.retired {
			files = append(files, FileVersion{Path: n.path, ETag: n.etag, Size: n.size, id: uint64(i + 1)})
		}
	}
	return files
}
