package fusefs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/strata-cache/strata/cacheworker/objtree"
)

// buildTree lists every object of objects and arranges them in folders (objtree). What the
// tree leaves out is logged, one line per object, saying why.
func buildTree(ctx context.Context, objects Lister, log logr.Logger) (*objtree.Tree, error) {
	t := objtree.New()
	for info, err := range objects.List(ctx, "") {
		if err != nil {
			return nil, fmt.Errorf("listing the objects: %w", err)
		}
		t.Add(info)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing the objects: %w", err)
	}
	t.Done()
	for _, o := range t.LeftOut {
		log.Info("leaving out an object the tree cannot show", "key", o.Key, "reason", o.Reason)
	}
	return t, nil
}

// node is a folder or file of a mounted tree. Its index in the tree's node list is both its
// inode number and its FUSE node id, so that a process taking over a mounted file system
// (Resume) answers the kernel's node ids exactly as the process that mounted it did.
//
// A node is never changed once in the list: a refresh (sync.go) that changes a folder puts a
// copy in its place, and a file whose object changed gets a new node, so that a reader holding
// a node reads one version of one file, whatever refreshes happen meanwhile.
type node struct {
	parent uint64
	name   string
	dir    bool
	size   int64
	mtime  int64 // Unix nanoseconds: a third of a time.Time, for trees of millions of files
	// children are a folder's node ids, in name order.
	children []uint64
	// path is a file's key relative to the Dataset, as the cache names its blocks.
	path string
	// etag is the version of a file the listing gave: every block of it is of that version.
	etag string
	// retired nodes are no longer in the tree (a refresh removed or replaced them) but keep
	// their id, since the kernel may still hold them: files opened before go on reading the
	// version they opened.
	retired bool
}

// flatten numbers the tree's folders and files depth first in name order, the root being
// fuse.FUSE_ROOT_ID (1); index 0 is unused, as node id 0 means none to the kernel.
func flatten(t *objtree.Tree, rootTime time.Time) []*node {
	nodes := []*node{{}, {dir: true, mtime: rootTime.UnixNano(), parent: 1}}
	for _, name := range t.Root.SortedNames() {
		nodes = appendEntry(nodes, 1, name, t.Root.Children[name], "")
	}
	return nodes
}

// appendEntry appends a node for entry e, named name in folder parent whose key prefix is
// prefix, and nodes for everything below it, depth first in name order, and adds it to the
// parent's children. The parent must be a node of its own (not shared with a list readers use),
// and a child's name must sort after its siblings already there.
func appendEntry(nodes []*node, parent uint64, name string, e *objtree.Entry, prefix string) []*node {
	id := uint64(len(nodes))
	nodes[parent].children = append(nodes[parent].children, id)
	n := &node{parent: parent, name: name, dir: e.IsDir(), size: e.Size, mtime: e.MTime.UnixNano(), etag: e.ETag}
	if !n.dir {
		// The name is the end of the path, sharing its bytes.
		n.path = prefix + name
		n.name = n.path[len(prefix):]
	}
	nodes = append(nodes, n)
	if n.dir {
		for _, child := range e.SortedNames() {
			nodes = appendEntry(nodes, id, child, e.Children[child], prefix+name+"/")
		}
	}
	return nodes
}

// snapNode is a node as a handover carries it (see state).
type snapNode struct {
	Parent uint64
	Name   string
	Dir    bool
	Size   int64
	MTime  int64 // Unix nanoseconds
	// ETag is empty in the state (gob) of a worker from before block ids had versions: its blocks
	// are named without one, as before.
	ETag string
	// Retired nodes are kept for their id only (see node); false in the state of a worker
	// from before refreshes.
	Retired bool
}

func snapshotNodes(nodes []*node) []snapNode {
	out := make([]snapNode, len(nodes))
	for i, n := range nodes[1:] {
		out[i+1] = snapNode{Parent: n.parent, Name: n.name, Dir: n.dir, Size: n.size, MTime: n.mtime, ETag: n.etag, Retired: n.retired}
	}
	return out
}

// restoreNodes rebuilds the node list of a snapshot, checking that it is one: every node's
// parent is a folder listed before it, so that ids, paths and children come out as they were.
// A folder's children are in name order whatever their ids (a refresh appends new ones).
func restoreNodes(snap []snapNode) ([]*node, error) {
	if len(snap) < 2 || !snap[1].Dir {
		return nil, errors.New("the snapshot has no root folder")
	}
	nodes := make([]*node, len(snap))
	nodes[0] = &node{}
	for i := 1; i < len(snap); i++ {
		s := snap[i]
		n := &node{parent: s.Parent, name: s.Name, dir: s.Dir, size: s.Size, mtime: s.MTime, etag: s.ETag, retired: s.Retired}
		if i > 1 {
			if s.Parent == 0 || s.Parent >= uint64(i) || !nodes[s.Parent].dir {
				return nil, fmt.Errorf("node %d of the snapshot has parent %d, not a folder before it", i, s.Parent)
			}
			if p := nodes[s.Parent]; !n.retired {
				p.children = append(p.children, uint64(i))
			}
			if !n.dir {
				prefix := folderPath(nodes, s.Parent)
				n.path = prefix + s.Name
				n.name = n.path[len(prefix):]
			}
		}
		nodes[i] = n
	}
	for _, n := range nodes {
		slices.SortFunc(n.children, func(a, b uint64) int { return strings.Compare(nodes[a].name, nodes[b].name) })
	}
	return nodes, nil
}

// folderPath is the key prefix of folder id: "" for the root, "a/b/" below it.
func folderPath(nodes []*node, id uint64) string {
	var parts []string
	for ; id > 1; id = nodes[id].parent {
		parts = append(parts, nodes[id].name)
	}
	slices.Reverse(parts)
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, "/") + "/"
}
