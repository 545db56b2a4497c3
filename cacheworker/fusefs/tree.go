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
type node struct {
	parent uint64
	name   string
	dir    bool
	size   int64
	mtime  time.Time
	// children are a folder's node ids, in name order.
	children []uint64
	// path is a file's key relative to the Dataset, as the cache names its blocks.
	path string
	// etag is the version of a file the listing gave: every block of it is of that version.
	etag string
}

// flatten numbers the tree's folders and files depth first in name order, the root being
// fuse.FUSE_ROOT_ID (1); index 0 is unused, as node id 0 means none to the kernel.
func flatten(t *objtree.Tree, rootTime time.Time) []node {
	nodes := []node{{}, {dir: true, mtime: rootTime, parent: 1}}
	var add func(id uint64, dir *objtree.Entry, prefix string)
	add = func(id uint64, dir *objtree.Entry, prefix string) {
		for _, name := range dir.SortedNames() {
			e := dir.Children[name]
			child := uint64(len(nodes))
			nodes[id].children = append(nodes[id].children, child)
			n := node{parent: id, name: name, dir: e.IsDir(), size: e.Size, mtime: e.MTime, etag: e.ETag}
			if !n.dir {
				n.path = prefix + name
			}
			nodes = append(nodes, n)
			if n.dir {
				add(child, e, prefix+name+"/")
			}
		}
	}
	add(1, t.Root, "")
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
}

func snapshotNodes(nodes []node) []snapNode {
	out := make([]snapNode, len(nodes))
	for i, n := range nodes[1:] {
		out[i+1] = snapNode{Parent: n.parent, Name: n.name, Dir: n.dir, Size: n.size, MTime: n.mtime.UnixNano(), ETag: n.etag}
	}
	return out
}

// restoreNodes rebuilds the node list of a snapshot, checking that it is one: every node's
// parent is a folder listed before it, so that ids, paths and children come out as they were.
func restoreNodes(snap []snapNode) ([]node, error) {
	if len(snap) < 2 || !snap[1].Dir {
		return nil, errors.New("the snapshot has no root folder")
	}
	nodes := make([]node, len(snap))
	for i := 1; i < len(snap); i++ {
		s := snap[i]
		n := node{parent: s.Parent, name: s.Name, dir: s.Dir, size: s.Size, mtime: time.Unix(0, s.MTime), etag: s.ETag}
		if i > 1 {
			if s.Parent == 0 || s.Parent >= uint64(i) || !nodes[s.Parent].dir {
				return nil, fmt.Errorf("node %d of the snapshot has parent %d, not a folder before it", i, s.Parent)
			}
			p := &nodes[s.Parent]
			p.children = append(p.children, uint64(i))
			if !n.dir {
				n.path = folderPath(nodes, s.Parent) + s.Name
			}
		}
		nodes[i] = n
	}
	return nodes, nil
}

// folderPath is the key prefix of folder id: "" for the root, "a/b/" below it.
func folderPath(nodes []node, id uint64) string {
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
