package fusefs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// maxNameLen is the longest name a Linux file system may hold (NAME_MAX).
const maxNameLen = 255

// entry is a node of the tree built from a listing, before it becomes inodes.
type entry struct {
	// children is non-nil for folders.
	children map[string]*entry
	size     int64
	mtime    time.Time
	// etag is a file's version as listed, which its blocks are read from (understore.ObjectInfo).
	etag string
}

func (e *entry) isDir() bool { return e.children != nil }

// tree is a Dataset's folder tree, built once from its listing.
type tree struct {
	root  *entry
	files int
	bytes int64
}

// buildTree lists every object of objects and arranges them in folders by their keys split
// on "/". A key ending in "/" is a folder marker: the folder exists even if empty. Keys that
// cannot be file names (empty, "." or ".." elements, longer than NAME_MAX, a NUL) are left
// out and logged, as is an object whose key is also a folder of other objects ("a" next to
// "a/b"): S3 allows both, a file system cannot show both, and the folder holds more.
func buildTree(ctx context.Context, objects Lister, log logr.Logger) (*tree, error) {
	t := &tree{root: &entry{children: map[string]*entry{}}}
	for info, err := range objects.List(ctx, "") {
		if err != nil {
			return nil, fmt.Errorf("listing the objects: %w", err)
		}
		key, marker := strings.CutSuffix(info.Path, "/")
		if key == "" {
			continue // a marker of the root itself
		}
		parts := strings.Split(key, "/")
		if bad := badName(parts); bad != "" {
			log.Info("leaving out an object whose key is not a valid path", "key", info.Path, "reason", bad)
			continue
		}
		if !marker && info.Size < 0 {
			log.Info("leaving out an object of unknown size", "key", info.Path)
			continue
		}
		dir := t.root
		for _, p := range parts[:len(parts)-1] {
			dir = t.folder(dir, p, key, log)
		}
		name := parts[len(parts)-1]
		if marker {
			d := t.folder(dir, name, key, log)
			d.mtime = later(d.mtime, info.ModTime)
			continue
		}
		if old, ok := dir.children[name]; ok {
			if old.isDir() {
				log.Info("leaving out an object hidden by a folder of the same name", "key", info.Path)
				continue
			}
			t.files--
			t.bytes -= old.size
		}
		dir.children[name] = &entry{size: info.Size, mtime: info.ModTime, etag: info.ETag}
		t.files++
		t.bytes += info.Size
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing the objects: %w", err)
	}
	setFolderTimes(t.root)
	return t, nil
}

// folder returns the folder name in dir, making it if needed. A file of that name gives way.
func (t *tree) folder(dir *entry, name, key string, log logr.Logger) *entry {
	if e, ok := dir.children[name]; ok {
		if e.isDir() {
			return e
		}
		log.Info("an object is hidden by a folder of the same name", "folder", name, "under", key)
		t.files--
		t.bytes -= e.size
	}
	e := &entry{children: map[string]*entry{}}
	dir.children[name] = e
	return e
}

// badName says why a key split into parts cannot be a path, or "" if it can.
func badName(parts []string) string {
	for _, p := range parts {
		switch {
		case p == "":
			return "an empty element (two slashes in a row, or a leading slash)"
		case p == "." || p == "..":
			return "a '.' or '..' element"
		case len(p) > maxNameLen:
			return fmt.Sprintf("an element longer than %d bytes", maxNameLen)
		case strings.ContainsRune(p, 0):
			return "a NUL byte"
		}
	}
	return ""
}

// setFolderTimes gives every folder the newest time of what it holds (or of its marker, if
// newer), so that a folder's mtime says when its content last changed, as it would on disk.
func setFolderTimes(e *entry) time.Time {
	for _, c := range e.children {
		if c.isDir() {
			e.mtime = later(e.mtime, setFolderTimes(c))
		} else {
			e.mtime = later(e.mtime, c.mtime)
		}
	}
	return e.mtime
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// sortedNames returns the names of a folder in order, so that inode numbers are the same
// for the same listing.
func sortedNames(e *entry) []string {
	names := make([]string, 0, len(e.children))
	for n := range e.children {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
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
func (t *tree) flatten(rootTime time.Time) []node {
	nodes := []node{{}, {dir: true, mtime: rootTime, parent: 1}}
	var add func(id uint64, dir *entry, prefix string)
	add = func(id uint64, dir *entry, prefix string) {
		for _, name := range sortedNames(dir) {
			e := dir.children[name]
			child := uint64(len(nodes))
			nodes[id].children = append(nodes[id].children, child)
			n := node{parent: id, name: name, dir: e.isDir(), size: e.size, mtime: e.mtime, etag: e.etag}
			if !n.dir {
				n.path = prefix + name
			}
			nodes = append(nodes, n)
			if n.dir {
				add(child, e, prefix+name+"/")
			}
		}
	}
	add(1, t.root, "")
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
